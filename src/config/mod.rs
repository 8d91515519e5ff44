//! The configuration as the shell reads it. Its types and every check the file alone decides
//! are `hearth_core::config`, re-exported here whole; this module adds what needs the host:
//! reading the file (`file`), and finding each model's program as the spawn will (`lookup`),
//! which the core's checks ask for through [`Reach`] at [`Checks::Host`]. The replicas'
//! accounts are `agent::reach`'s.
#![forbid(unsafe_code)]

mod file;
mod lookup;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use file::{read_file, MAX_FILE_BYTES};
pub use hearth_core::config::*;
pub use lookup::{program_lookup, DaemonLookup};

/// Read the configuration file at `path` and check everything `hearth daemon` needs to run it on
/// this host ([`Checks::Host`]), as far as the daemon's own lookup can tell.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, Checks::Host)
}

/// Read the configuration file at `path` and check it to depth `checks` (at [`Checks::Host`],
/// with the daemon's own lookup of each program).
pub fn load_with(path: &Path, checks: Checks) -> Result<Config, ConfigError> {
    load_on(path, checks, &DaemonLookup)
}

/// Read the configuration file at `path` and check it to depth `checks`; at [`Checks::Host`],
/// ask `reach` whether each model's program is there and its replicas can reach it and the
/// control socket.
pub fn load_on(path: &Path, checks: Checks, reach: &dyn Reach) -> Result<Config, ConfigError> {
    let text = read_file(path)?;
    Config::parse_on(&text, path, checks, reach)
}
