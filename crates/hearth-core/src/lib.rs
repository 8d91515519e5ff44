//! hearth's pure part, a crate of its own so that the compiler keeps it pure: nothing here can
//! reach a file, a clock, a process or a socket, because none of the crates that could is a
//! dependency (see Cargo.toml).
//!
//! - `core`: every decision, as `Node::handle(event, now) -> Vec<Action>`.
//! - `protocol`: the control socket's requests and answers, shared by daemon and clients.
//! - `config`: the configuration's types and the checks the file alone decides (the shell adds
//!   the host's answers through `config::Reach`).
//! - `units`: durations, sizes and the like as the configuration and the protocol write them.
#![forbid(unsafe_code)]

pub mod config;
pub mod core;
pub mod protocol;
pub mod units;
