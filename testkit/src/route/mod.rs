//! The front door's tests (`tests/route/`): the real `hearth route` process ([`Router`]) on
//! the crate's [`Daemon`]'s own configuration file (its `[route]` table,
//! [`DaemonBuilder::route`]), replicas that take seconds or stream ([`Model::front_toy`],
//! [`Model::streaming`]), and a plain HTTP/1.1 client that reads answers as they arrive.
//! [`front_door`] is the arrange step most of those tests share: the daemon, the router, and
//! the router's address. The router carries the daemon's mark, so the daemon's cleanup finds it
//! too; the router is also killed when its handle drops, also when a test panics.
//!
//! `use testkit::route::*;` brings what those tests use of the crate along.

mod fixture;
pub mod fleet;
mod http;

pub use crate::procs::signal;
pub use crate::{
    endpoint_ids, hearth, openai_python, ports, real_model_dir, wait_until, Daemon, DaemonBuilder,
    Ev, Home, Model, Signal, Watch,
};
pub use fixture::{front_door, front_door_daemon, Router};
pub use http::*;
