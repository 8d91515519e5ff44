//! The front door (`hearth route`) with the real daemon and replicas: its API, its link to the
//! daemon, faults, limits, two front doors, a fleet behind HAProxy, the openai client, a trace
//! replayed. One binary per area of the integration tests (tests/README.md).

mod api;
mod daemon;
mod doors;
mod faults;
mod fleet;
mod limits;
mod link;
mod openai;
mod replay;
mod sleep_switch;
