//! The imperative shell: turns the world into events for the core and its actions into effects.

pub mod access;
pub mod control;
pub mod daemon;
pub mod gpu_monitor;
pub mod inventory;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod nvml;
pub mod prefetch;
pub mod probe;
pub mod scrape;
pub mod state;
pub mod supervisor;
