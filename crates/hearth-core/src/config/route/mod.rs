//! What `hearth route`, the front door, runs with: its settings as the `[route]` table gives
//! them, the path rules of `[route.model.NAME] paths`, and the addresses of `trusted_proxies`.
//! They are types of the configuration (the daemon checks `[route]` too), so they live here and
//! not with the front door's process.

pub mod paths;
pub mod proxies;
pub mod settings;
