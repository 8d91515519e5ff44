//! What status says about the daemon itself rather than its models (issue 24): the binary that
//! runs, whether the configuration file on disk is what runs, and how the last `hearth upgrade`
//! ended. The shell knows these facts; the core holds and shows them.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::wire_name;

/// `status.daemon`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonView {
    /// The version of the binary that runs (as `version` answers).
    pub version: String,
    pub config_file: ConfigFileView,
    /// The last `hearth upgrade` of this process (whichever binary it ran since); None before
    /// one.
    #[serde(default)]
    pub upgrade: Option<UpgradeView>,
    /// What sleeping replicas hold in host RAM, against `[daemon] host_memory`.
    #[serde(default)]
    pub sleeping_host_memory: HostMemoryView,
}

/// `status.daemon.sleeping_host_memory`: the host RAM that replicas asleep, falling asleep or
/// draining to sleep hold (each its model's `[model.sleep] host_memory`), and the budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMemoryView {
    pub held_bytes: u64,
    /// `[daemon] host_memory`; None: not bounded.
    #[serde(default)]
    pub budget_bytes: Option<u64>,
}

/// `status.daemon.config_file`: the configuration file a reload reads, and whether it is what
/// runs. It differs after an upgrade that found the file edited (an upgrade carries the running
/// configuration across and leaves the file to `reload`), and after a reload that refused it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigFileView {
    pub path: String,
    pub state: ConfigFileState,
    /// How it differs and what applies it; empty when applied.
    #[serde(default)]
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigFileState {
    /// The running configuration is the file's, as last read.
    #[default]
    Applied,
    /// The file on disk is not what runs: `hearth reload` applies it (or says why not).
    Differs,
}

impl fmt::Display for ConfigFileState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&wire_name(self))
    }
}

/// `status.daemon.upgrade`: how an upgrade ended, as the binary that runs after it says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradeView {
    /// The attempt the `upgrade` answer named (`upgrading.attempt`).
    pub attempt: u64,
    pub outcome: UpgradeOutcome,
    /// What the new binary said it is (`--version`).
    pub to_version: String,
    /// Why it is not `done`; empty when it is.
    #[serde(default)]
    pub reason: String,
    /// Replicas in the hand-over.
    pub handed_over: u32,
    /// Of them, those that run on in the same process and role.
    pub kept: u32,
    /// The others: "ID: what became of it".
    #[serde(default)]
    pub not_kept: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpgradeOutcome {
    /// The new binary runs and took the hand-over.
    Done,
    /// The new binary failed while adopting; the previous one, kept open, took the hand-over
    /// back.
    FellBack,
    /// The new binary never ran (its exec, or writing the hand-over, failed): the previous one
    /// carries on.
    Failed,
}

impl fmt::Display for UpgradeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&wire_name(self))
    }
}

/// The answer to `upgrade` once the new binary passed its check: `{"ok":true,"upgrading":…}`.
/// The re-exec follows; `status.daemon.upgrade` with this `attempt` says how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradePlan {
    pub attempt: u64,
    /// What the new binary said it is (`--version`).
    pub version: String,
    /// Where it is.
    pub binary: String,
}
