//! The shell's part of a reload. The core decides whether to reload and when (see
//! core/reload.rs); the shell reads and validates the file when asked, off the event loop, keeps
//! what cannot change without a restart at its running values, and applies the settings it owns
//! (log level, access, tick) once the core has applied the rest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::access::Access;
use super::inbox::EventSink;
use crate::config::{Checks, Config, ConfigError, DaemonConfig, GpusConfig};
use crate::core::{ConfigReadError, Event, NewConfig, ReloadCause};
use crate::service::logging::LogControl;

/// The longest a read of the configuration file may take. A file that does not come within this
/// (a hung network filesystem) fails the reload; the daemon goes on meanwhile.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What a reload may not change without a restart: the socket and the metrics listener are
/// bound, the state directory was read, the inventory was opened at start.
#[derive(Debug)]
pub struct RestartOnly {
    daemon: DaemonConfig,
    gpus: GpusConfig,
}

impl RestartOnly {
    pub fn new(running: &Config) -> RestartOnly {
        RestartOnly {
            daemon: running.daemon.clone(),
            gpus: running.gpus.clone(),
        }
    }

    /// Keeps the running values of what cannot change live in `cfg`, so the core goes on
    /// telling replicas the socket that really listens; returns a warning for each that changed.
    pub fn pin(&self, cfg: &mut Config) -> Vec<String> {
        let mut warnings = Vec::new();
        let d = &mut cfg.daemon;
        let mut check = |key: &str, changed: bool, was: String, now: String| {
            if changed {
                warnings.push(format!(
                    "{key} changed from {was} to {now}: not applied, takes a restart (systemctl restart hearth)"
                ));
            }
        };
        check(
            "daemon.socket",
            d.socket != self.daemon.socket,
            format!("{:?}", self.daemon.socket),
            format!("{:?}", d.socket),
        );
        check(
            "daemon.metrics",
            d.metrics != self.daemon.metrics,
            opt_addr(self.daemon.metrics),
            opt_addr(d.metrics),
        );
        check(
            "daemon.state_dir",
            d.state_dir != self.daemon.state_dir,
            format!("{:?}", self.daemon.state_dir),
            format!("{:?}", d.state_dir),
        );
        check(
            "[gpus]",
            cfg.gpus != self.gpus,
            "the running inventory".into(),
            "another".into(),
        );
        let d = &mut cfg.daemon;
        d.socket = self.daemon.socket.clone();
        d.metrics = self.daemon.metrics;
        d.state_dir = self.daemon.state_dir.clone();
        cfg.gpus = self.gpus.clone();
        warnings
    }
}

fn opt_addr(a: Option<std::net::SocketAddr>) -> String {
    a.map_or_else(|| "none".to_string(), |a| a.to_string())
}

/// Reads the configuration file for the core (`Action::ReadConfig`): on a blocking thread, with
/// a deadline, so that neither a slow filesystem nor a FIFO at the path stalls the event loop.
/// The result comes back as `Event::ConfigRead`.
pub fn start_read(
    path: PathBuf,
    restart_only: Arc<RestartOnly>,
    cause: ReloadCause,
    events: EventSink,
    tracker: &TaskTracker,
) {
    tracker.spawn(async move {
        let reading = tokio::task::spawn_blocking({
            let path = path.clone();
            let socket = restart_only.daemon.socket.clone();
            move || {
                let (config, text) = read(&path).map_err(ConfigReadError::Invalid)?;
                // A model without `user` new in this file: its account is made now (once made,
                // the socket gets its group, as at start), or the reload fails.
                let accounts = super::account::Accounts::lookup();
                if let Some(made) = accounts
                    .ensure_for(&config)
                    .map_err(|e| ConfigReadError::Account(e.to_string()))?
                {
                    tracing::info!("{made}");
                    accounts.open_socket_to_replicas(&socket);
                }
                Ok((config, text))
            }
        });
        let read = match tokio::time::timeout(READ_TIMEOUT, reading).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => Err(ConfigReadError::Failed {
                path: path.clone(),
                error: e.to_string(),
            }),
            Err(_) => Err(ConfigReadError::TimedOut {
                path: path.clone(),
                after: READ_TIMEOUT,
            }),
        };
        let read = read.map(|(mut config, text)| {
            tracing::info!("{cause}: reloading {}", path.display());
            let warnings = restart_only.pin(&mut config);
            Box::new(NewConfig {
                config,
                warnings,
                text: text.into(),
            })
        });
        events.send(Event::ConfigRead(read)).await;
    });
}

/// Reads and validates the file as `hearth daemon` does at start (`reach::load`: a FIFO or
/// anything but a regular file refused at once, the size bounded, every check down to what the
/// replicas' accounts can reach); errors name the file (and the line and key, when the text is
/// at fault), and the text it was read from.
pub fn read(path: &Path) -> Result<(Config, String), ConfigError> {
    super::reach::load_text(path, Checks::Host)
}

/// The daemon settings the shell owns, applied when the core says a reload is in force.
pub struct Settings {
    pub log: LogControl,
    pub access: Arc<Access>,
}

impl Settings {
    /// Applies the log level and the access lists of `cfg`; returns the new tick period if it
    /// changed (the event loop owns the timer).
    pub fn apply(&mut self, cause: ReloadCause, cfg: &Config, tick: Duration) -> Option<Duration> {
        if let Some(warning) = self.log.set_level(&cfg.daemon.log_level) {
            tracing::warn!("{cause}: {warning}");
        }
        self.access.set_config(cfg.access.clone());
        (cfg.daemon.tick != tick).then(|| {
            tracing::info!(
                "{cause}: daemon.tick {}ms → {}ms",
                tick.as_millis(),
                cfg.daemon.tick.as_millis()
            );
            cfg.daemon.tick
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MAX_FILE_BYTES;

    #[test]
    fn a_fifo_or_a_directory_at_the_path_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        let err = read(&fifo).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(
            err.starts_with(&format!("{}: ", fifo.display())),
            "names the file: {err}"
        );
        // No writer ever comes: a blocking open would never return.
        assert!(started.elapsed() < READ_TIMEOUT);
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let err = read(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read configuration file"), "{err}");
    }

    #[test]
    fn a_file_too_large_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("config.toml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        let err = read(&big).unwrap_err().to_string();
        assert!(err.contains("at most"), "{err}");
    }
}
