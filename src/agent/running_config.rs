//! The configuration that runs, as text, so that `hearth upgrade` carries it across (issue 24,
//! item 1). The new binary runs what the old one ran, not the file on disk: a file edited and
//! not reloaded is left for `reload`, and status says it differs. Comparing the replicas'
//! launch specs with an edited file instead would stop or roll every changed replica at the
//! hand-over.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::reload::RestartOnly;
use crate::config::{read_file, Checks, Config, ConfigError};

/// What the hand-over document carries of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedConfig {
    /// The file a reload reads.
    pub path: PathBuf,
    /// The text the running configuration was read from: at start, or at the last reload that
    /// applied.
    pub text: String,
    /// The text read at start, where a reload applied another since: what only a restart
    /// changes (socket, metrics, state_dir, `[gpus]`) keeps its values, as after that reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
}

/// The shell's copy: the texts behind the running configuration.
#[derive(Debug, Clone)]
pub struct RunningConfig {
    pub path: PathBuf,
    pub text: Arc<str>,
    /// Set once a reload applied another text than the one read at start.
    started: Option<Arc<str>>,
}

impl RunningConfig {
    /// Read from `path` at start.
    pub fn read_at_start(path: &Path, text: String) -> RunningConfig {
        RunningConfig {
            path: path.to_path_buf(),
            text: text.into(),
            started: None,
        }
    }

    /// A reload applied `text`.
    pub fn applied(&mut self, text: Arc<str>) {
        if self.started.is_none() && text != self.text {
            self.started = Some(self.text.clone());
        }
        if self.started.as_ref() == Some(&text) {
            self.started = None;
        }
        self.text = text;
    }

    pub fn carried(&self) -> CarriedConfig {
        CarriedConfig {
            path: self.path.clone(),
            text: self.text.to_string(),
            started: self.started.as_deref().map(str::to_string),
        }
    }

    /// How the file at the path differs from what runs, read now; None: the same text.
    pub fn differs_on_disk(&self) -> Option<String> {
        match read_file(&self.path) {
            Ok(text) if *text == *self.text => None,
            Ok(_) => Some(
                "edited since the running configuration was read from it, and not reloaded: the \
                 upgrade carried the running configuration across; `hearth reload` applies the \
                 file"
                    .into(),
            ),
            Err(e) => Some(format!(
                "{e}; the upgrade carried the running configuration across"
            )),
        }
    }
}

impl CarriedConfig {
    /// The configuration the previous binary ran, as this binary reads it. Checked to
    /// [`Checks::Deployment`]: what the host provides was checked when the text was read, and
    /// the replicas made from it run; what the text decides is checked again, by this binary's
    /// rules.
    pub fn load(&self) -> Result<(Config, RunningConfig), ConfigError> {
        let parse = |text: &str| -> Result<Config, ConfigError> {
            let mut c = Config::parse_with(text, &self.path, Checks::Deployment)?;
            c.daemon.socket = std::path::absolute(&c.daemon.socket).unwrap_or(c.daemon.socket);
            Ok(c)
        };
        let mut config = parse(&self.text)?;
        if let Some(started) = &self.started {
            RestartOnly::new(&parse(started)?).pin(&mut config);
        }
        let running = RunningConfig {
            path: self.path.clone(),
            text: self.text.as_str().into(),
            started: self.started.as_deref().map(Into::into),
        };
        Ok((config, running))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("config.toml");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn text(socket: &str, max: u32) -> String {
        format!(
            "[daemon]\nsocket = \"{socket}\"\nports = \"21000-21009\"\n\n[[model]]\nname = \"a\"\n\
             command = [\"/bin/sleep\", \"{{port}}\"]\n[model.warmup]\n\
             url = \"http://127.0.0.1:{{port}}/w\"\n[model.scaling]\nmin = 1\nmax = {max}\n"
        )
    }

    #[test]
    fn a_reload_is_carried_with_what_only_a_restart_changes_kept() {
        let dir = tempfile::tempdir().unwrap();
        let sock = |n: &str| dir.path().join(n).display().to_string();
        let path = file(dir.path(), &text(&sock("one.sock"), 2));
        let mut running = RunningConfig::read_at_start(&path, text(&sock("one.sock"), 2));
        // A reload applied a file that also moved the socket (pinned, not applied).
        running.applied(text(&sock("two.sock"), 3).into());
        let carried = running.carried();
        assert!(carried.started.is_some());
        let (config, again) = carried.load().unwrap();
        assert_eq!(config.models[0].scaling.max, 3, "the reloaded text runs");
        assert_eq!(
            config.daemon.socket,
            dir.path().join("one.sock"),
            "the socket that listens"
        );
        assert_eq!(again.carried(), carried, "carried on unchanged");
        // Back to the text read at start: nothing pinned is left to carry.
        running.applied(text(&sock("one.sock"), 2).into());
        assert_eq!(running.carried().started, None);
    }

    #[test]
    fn the_file_on_disk_is_compared_with_what_runs() {
        let dir = tempfile::tempdir().unwrap();
        let t = text(&dir.path().join("s.sock").display().to_string(), 2);
        let path = file(dir.path(), &t);
        let running = RunningConfig::read_at_start(&path, t.clone());
        assert_eq!(running.differs_on_disk(), None);
        std::fs::write(&path, t.replace("max = 2", "max = 4")).unwrap();
        let why = running.differs_on_disk().unwrap();
        assert!(why.contains("hearth reload"), "{why}");
        std::fs::remove_file(&path).unwrap();
        let why = running.differs_on_disk().unwrap();
        assert!(why.contains("cannot read"), "{why}");
    }
}
