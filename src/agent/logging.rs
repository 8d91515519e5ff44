//! Logs: journald's structured fields when stderr is the journal, readable text otherwise.

use tracing_subscriber::prelude::*;
use tracing_subscriber::EnvFilter;

/// True when systemd connected stderr to the journal: JOURNAL_STREAM names stderr's device and
/// inode.
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

/// `RUST_LOG` wins over the configured level.
pub fn init(default_level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(default_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    if stderr_is_journal() {
        if let Ok(journald) = tracing_journald::layer() {
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(journald)
                .try_init();
            return;
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
}
