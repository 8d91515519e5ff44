//! The daemon with real toy-server replicas: its process, replica lifecycle, reload, the
//! control socket and its hostile input, metrics, GPU placement through the declared inventory,
//! autoscaling end to end. One binary per area of the integration tests (tests/README.md).

mod autoscale;
mod daemon;
mod gpu;
mod hardening;
mod lifecycle;
mod metrics;
mod reload;
mod sleep;
mod socket;
