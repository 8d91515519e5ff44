//! `hearth route`, the front door: an OpenAI-compatible HTTP entry point that holds each model's
//! queue, sends a request to a routed replica only when it has a free slot, and reports the
//! queue to the daemon so that what hearth scales on is exact.
//!
//! It is a separate process and a client of the daemon (it follows `watch` and sends `report`s
//! like any reporter); the daemon never spawns it, and it can restart without touching a
//! replica.
//!
//! - `settings`, `paths`: what it runs with (from the `[route]` table that `config` checks).
//! - `queue`: the decisions (FIFO, slots, choice of replica, reports), pure.
//! - `router`: the queue shared by request tasks, and leases on slots.
//! - `server`, `conns`, `api`, `body`, `model_field`, `errors`: the HTTP side; `proxies`: the
//!   addresses of `trusted_proxies`.
//! - `proxy`, `upstream`, `pool`, `relay`: a request's way to a replica (on a pooled connection)
//!   and its answer's way back.
//! - `link`: the daemon's watch and the reports.
//! - `agent`, `fleet`, `agent_listen`: HAProxy's agent checks (the answer, pure; what the
//!   answers and the drains are made of, pure; the listener), docs/fleet.md.
//! - `metrics`: `hearth_route_*`.
//! - `cmd`: the process.

pub mod agent;
pub mod agent_listen;
pub mod api;
pub mod body;
pub mod cmd;
pub mod conns;
pub mod errors;
pub mod fleet;
pub mod link;
pub mod metrics;
pub mod model_field;
pub mod pool;
pub mod proxy;
pub mod queue;
pub mod relay;
pub mod router;
pub mod server;
pub mod upstream;

// What it runs with are types of the configuration (hearth_core::config::route), used here by
// these names.
pub use crate::config::route::{paths, proxies, settings};
