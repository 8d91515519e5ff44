//! What status says about the daemon itself (`status.daemon`): facts the shell reports (the
//! configuration file compared after an upgrade, how an upgrade ended) and what a reload shows
//! of the file.

use super::node::Node;
use crate::protocol::{ConfigFileState, ConfigFileView, DaemonView, HostMemoryView, UpgradeView};

impl Node {
    /// The shell compared the file with the running configuration.
    pub(super) fn config_file_is(&mut self, differs: Option<String>) {
        self.config_file.state = match differs {
            None => ConfigFileState::Applied,
            Some(_) => ConfigFileState::Differs,
        };
        self.config_file.reason = differs.unwrap_or_default();
    }

    /// A reload read the file: applied, it is what runs; refused, what runs is not the file.
    pub(super) fn config_file_reloaded(&mut self, refused: Option<&str>) {
        self.config_file_is(refused.map(|e| {
            format!("refused at the last reload ({e}); the configuration before it runs")
        }));
    }

    pub(super) fn upgraded(&mut self, view: UpgradeView) {
        self.upgrade = Some(view);
    }

    pub(super) fn daemon_view(&self) -> DaemonView {
        DaemonView {
            version: self.version.clone(),
            config_file: ConfigFileView {
                path: self.config.path.display().to_string(),
                ..self.config_file.clone()
            },
            upgrade: self.upgrade.clone(),
            sleeping_host_memory: HostMemoryView {
                held_bytes: self.host_memory_held(),
                budget_bytes: self.host_memory_budget(),
            },
        }
    }
}
