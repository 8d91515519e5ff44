//! The imperative shell: turns the world into events for the core and its actions into effects.

pub mod access;
pub mod account;
pub mod conn;
pub mod containment;
pub mod control;
pub mod daemon;
mod effects;
pub mod gpu_monitor;
pub mod gpu_owner;
pub mod inbox;
pub mod inventory;
pub mod ledger;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod nvml;
pub mod paths;
pub mod prefetch;
pub mod probe;
mod reload;
pub mod replica_log;
pub mod scrape;
pub mod state;
mod status_line;
pub mod supervisor;
pub mod upgrade;
mod wake;
