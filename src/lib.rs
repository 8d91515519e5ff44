//! hearth: a node-local agent that spawns, warms, pools, routes and autoscales model-server
//! replicas on a GPU host. `core` decides; `agent` performs.

pub mod agent;
pub mod cli;
pub mod client;
pub mod config;
pub mod core;
pub mod openmetrics;
pub mod protocol;
pub mod route;
pub mod sim;
pub mod toy_server;
pub mod units;
