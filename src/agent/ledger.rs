//! What outlives a run of the daemon: `state_dir/replicas.json`, the core's [`Ledger`] of every
//! replica with a process, plus the shell's proof of each process (pid, start time, cgroup).
//! Rewritten (atomically, fsync'd, off the event loop) whenever a replica's process or state
//! changes, so that after a `kill -9`, an OOM kill or a crash the next run can find, prove and
//! adopt the replicas (issue 14). A planned hand-over (`hearth upgrade`, or a panic) writes the
//! same document, synchronously, to `state_dir/handover.json` just before the re-exec.
//!
//! The document is versioned ([`FORMAT`]). A reader that does not know the version adopts
//! nothing from it: what it found alive is stopped, never taken on trust.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use serde::{Deserialize, Serialize};

use super::running_config::CarriedConfig;
use super::state_files::Dir;
use crate::core::Ledger;

/// The version of the document this binary writes and reads.
pub const FORMAT: u32 = 1;
const FILE: &str = "replicas.json";
const HANDOVER: &str = "handover.json";
/// Larger files are not read: 32 replicas take about 40 KiB, a hand-over adds the configuration's
/// text (at most 4 MiB, twice where a reload applied another since the start; JSON escapes can
/// double it). A hand-over that would be larger is not written: the upgrade fails.
pub const MAX_BYTES: u64 = 24 << 20;

/// The shell's proof that a replica's leader is the process that was started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    pub pid: u32,
    /// Its start time, in clock ticks since boot (/proc/PID/stat field 22): a reused pid has
    /// another.
    pub start_ticks: u64,
    /// Its cgroup directory (or the scope's).
    pub cgroup: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub format: u32,
    /// The binary that wrote it (`hearth version`), for the log.
    #[serde(default)]
    pub written_by: String,
    #[serde(default)]
    pub ledger: Ledger,
    /// By replica id.
    #[serde(default)]
    pub proofs: BTreeMap<String, Proof>,
    /// In a hand-over: the configuration that runs, which the new binary runs in its turn
    /// (running_config.rs). Not in `replicas.json`: a start reads the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<CarriedConfig>,
}

impl Saved {
    pub fn new(ledger: Ledger, proofs: BTreeMap<String, Proof>) -> Saved {
        Saved {
            format: FORMAT,
            written_by: env!("CARGO_PKG_VERSION").to_string(),
            ledger,
            proofs,
            config: None,
        }
    }
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

pub fn handover_path(state_dir: &Path) -> PathBuf {
    state_dir.join(HANDOVER)
}

/// Why a saved document cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("unreadable: {0}")]
    Unreadable(String),
    #[error("format {found} (this binary reads format {reads})")]
    OtherFormat { found: u32, reads: u32 },
    /// The file could not be read (the OS's words).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: String },
    /// The file was read, and its text is what is wrong.
    #[error("{}: {error}", path.display())]
    In {
        path: PathBuf,
        error: Box<LedgerError>,
    },
}

/// Reads a saved document: None if there is none; an error says why one cannot be used. Not
/// through a link, and only a regular file of sane size (state_files.rs).
pub fn read(path: &Path) -> Result<Option<Saved>, LedgerError> {
    let text = match Dir::of_file(path).and_then(|(dir, name)| dir.read(name, MAX_BYTES)) {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(LedgerError::Io {
                path: path.to_path_buf(),
                error: e.to_string(),
            })
        }
    };
    parse(&text).map(Some).map_err(|e| LedgerError::In {
        path: path.to_path_buf(),
        error: Box::new(e),
    })
}

/// The version first, so that a document of another version says so rather than failing on
/// some field.
pub fn parse(text: &str) -> Result<Saved, LedgerError> {
    #[derive(Deserialize)]
    struct Head {
        format: u32,
    }
    let unreadable = |e: serde_json::Error| LedgerError::Unreadable(e.to_string());
    let head: Head = serde_json::from_str(text).map_err(unreadable)?;
    if head.format != FORMAT {
        return Err(LedgerError::OtherFormat {
            found: head.format,
            reads: FORMAT,
        });
    }
    serde_json::from_str(text).map_err(unreadable)
}

/// Writes `bytes` to `path` so that a crash at any moment leaves the old file or the new one,
/// never through a link (state_files.rs). The launch specs hold the models' environment
/// (tokens, keys): the file is the daemon's alone (0600).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (dir, name) = Dir::of_file(path)?;
    dir.write_atomic(name, bytes, 0o600)
}

/// Writes the ledger off the event loop: the loop hands over the latest document and goes on;
/// a writer thread writes the newest it has (older ones it never got to are skipped).
#[derive(Clone)]
pub struct Persister {
    slot: Arc<(Mutex<Option<Vec<u8>>>, Condvar)>,
}

impl Persister {
    pub fn start(state_dir: &Path) -> Persister {
        let slot: Arc<(Mutex<Option<Vec<u8>>>, Condvar)> = Arc::default();
        let (s, p) = (slot.clone(), path(state_dir));
        let started = std::thread::Builder::new()
            .name("hearth-ledger".into())
            .spawn(move || loop {
                let bytes = {
                    let (lock, cv) = &*s;
                    let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        if let Some(b) = g.take() {
                            break b;
                        }
                        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                };
                if let Err(e) = write_atomic(&p, &bytes) {
                    tracing::error!(
                        "saving {}: {e}; a restart could not adopt what changed",
                        p.display()
                    );
                }
            });
        if let Err(e) = started {
            tracing::error!("could not start the ledger writer: {e}");
        }
        Persister { slot }
    }

    pub fn save(&self, bytes: Vec<u8>) {
        let (lock, cv) = &*self.slot;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
        cv.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn another_format_is_refused_by_name_and_a_round_trip_is_equal() {
        let saved = Saved::new(Ledger::default(), BTreeMap::new());
        let text = serde_json::to_string(&saved).unwrap();
        assert_eq!(parse(&text).unwrap(), saved);
        let newer = text.replace("\"format\":1", "\"format\":2");
        let e = parse(&newer).unwrap_err().to_string();
        assert!(e.contains("format 2"), "{e}");
        assert!(parse("{").unwrap_err().to_string().contains("unreadable"));
        assert!(parse("[]").is_err());
    }

    #[test]
    fn an_atomic_write_replaces_the_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert!(!p.with_extension("json.tmp").exists());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
