//! hearth: a node-local agent that spawns, warms, pools, routes and autoscales model-server
//! replicas on a GPU host. `core` decides; `agent` performs.
//!
//! `core`, `protocol`, the configuration's types and `units` are the `hearth-core` crate of this
//! workspace (crates/hearth-core), which cannot reach the system; they are re-exported here by
//! the same names. Everything else is the shell.

// Unsafe code only where a file says why it needs it (`#![allow(unsafe_code)]` at its top); the
// modules that need none forbid it.
#![deny(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod client;
pub mod config;
pub use hearth_core::core;
pub mod openmetrics;
pub use hearth_core::protocol;
pub mod route;
pub mod service;
pub mod sim;
pub mod toy_server;
pub use hearth_core::units;
