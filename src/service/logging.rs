//! Logs: journald's structured fields when stderr is the journal, readable text otherwise.
//!
//! Under systemd every line becomes a journal entry with `PRIORITY` from its level and the
//! fields `MODEL`, `REPLICA` and `GPU` where they apply (plus `STREAM` for what a replica
//! printed), so `journalctl -u hearth MODEL=llama-8b` finds one model's history. Field names are
//! the tracing field names upper-cased: call sites name them `model`, `replica`, `gpu`.

use tracing_subscriber::prelude::*;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// True when systemd connected stderr to the journal: JOURNAL_STREAM names stderr's device and
/// inode (systemd.exec(5)). A service whose stderr was redirected elsewhere keeps the variable
/// but not the inode, and gets text.
fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

/// Changes the log level of a running daemon (on reload).
pub struct LogControl {
    handle: Option<reload::Handle<EnvFilter, Registry>>,
    /// RUST_LOG was set: it wins over the configuration, at start and on every reload.
    from_env: bool,
    current: String,
}

impl LogControl {
    /// For a daemon run inside another program (tests): no filter of its own to change.
    pub fn detached(level: &str) -> LogControl {
        LogControl {
            handle: None,
            from_env: false,
            current: level.to_string(),
        }
    }

    /// Applies `daemon.log_level` from a reloaded configuration. Says what it did in the log;
    /// returns a warning when the level could not be applied.
    pub fn set_level(&mut self, level: &str) -> Option<String> {
        if level == self.current {
            return None;
        }
        if self.from_env {
            self.current = level.to_string();
            return Some(format!(
                "daemon.log_level = {level:?} not applied: RUST_LOG is set and takes precedence"
            ));
        }
        let handle = self.handle.as_ref()?;
        let filter = match EnvFilter::try_new(level) {
            Ok(f) => f,
            Err(e) => return Some(format!("daemon.log_level = {level:?} not applied: {e}")),
        };
        // Said before the change: a quieter level would hide the line that announces it.
        tracing::info!("log level {:?} → {level:?}", self.current);
        match handle.reload(filter) {
            Ok(()) => {
                self.current = level.to_string();
                None
            }
            Err(e) => Some(format!("daemon.log_level = {level:?} not applied: {e}")),
        }
    }
}

/// Installs the global subscriber. `RUST_LOG` wins over the configured level.
pub fn init(default_level: &str) -> LogControl {
    let from_env = std::env::var_os("RUST_LOG").is_some_and(|v| !v.is_empty());
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(default_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let control = LogControl {
        handle: Some(handle),
        from_env,
        current: default_level.to_string(),
    };
    if stderr_is_journal() {
        if let Ok(journald) = tracing_journald::layer() {
            // No "F_" prefix: `model` becomes MODEL, not F_MODEL. The fields hearth logs
            // (model, replica, gpu, stream, port, pid) clash with none of journald's
            // own (those that matter start with "_", and MESSAGE, PRIORITY, TARGET and CODE_*
            // are set by the layer).
            let journald = journald
                .with_field_prefix(None)
                .with_priority_mappings(priorities());
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(journald)
                .try_init();
            return control;
        }
    }
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours only for a person at a terminal: a log file, a pipe or a container's
                // log collector would keep the escape codes as text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .try_init();
    control
}

/// syslog's meaning of each level: the crate's default maps INFO to notice (5), which would make
/// every routine line stand out in `journalctl -p notice`.
fn priorities() -> tracing_journald::PriorityMappings {
    use tracing_journald::{Priority, PriorityMappings};
    PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    }
}

/// The error that ends the process, said once: through the log where it takes errors (it goes
/// to stderr or to the journal, stderr's own destination under systemd, so a second copy on
/// stderr would print it twice), on stderr with `prefix` where the log would drop it (`RUST_LOG`
/// off, or no subscriber installed).
pub fn fatal(prefix: &str, error: &dyn std::fmt::Display) {
    if tracing::enabled!(tracing::Level::ERROR) {
        tracing::error!("{error}");
    } else {
        eprintln!("{prefix}: {error}");
    }
}
