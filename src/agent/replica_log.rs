//! Where a replica's stdout and stderr go, without the daemon in the way: a replica must keep
//! printing (and keep running: a closed pipe would kill it with SIGPIPE) while the daemon is
//! upgraded, restarted or dead. Chosen once at start:
//!
//! - **journald** (its stdout stream socket exists): each stream is a connection to
//!   `/run/systemd/journal/stdout`, opened by the daemon and handed to the child, whose
//!   identifier is the replica id (`journalctl -t llama-8b-3`). The stream protocol carries no
//!   fields of its own: MODEL, REPLICA and GPU are on the daemon's own lines about the replica
//!   (spawned, warm, exited…), the replica's lines carry `SYSLOG_IDENTIFIER=REPLICA`.
//! - **files** otherwise: `state_dir/logs/REPLICA.log`, opened for appending and handed to the
//!   child, bounded by the daemon (copy-truncate to `REPLICA.log.1` past [`MAX_FILE`], checked
//!   every sampling interval); logs of replicas that are gone are kept, the newest
//!   [`KEEP_GONE`] of them. While no daemon runs nothing rotates them.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use super::state_files::Dir;

/// A replica's log file is rotated once it is this long.
pub const MAX_FILE: u64 = 16 << 20;
/// Log files of replicas that are gone kept, the newest first.
pub const KEEP_GONE: usize = 32;
const JOURNAL_STDOUT: &str = "/run/systemd/journal/stdout";
/// `journal` or `files` instead of what the host allows.
pub const REPLICA_LOGS_ENV: &str = "HEARTH_REPLICA_LOGS";

#[derive(Debug, Clone)]
pub enum ReplicaLogs {
    Journal,
    /// `dir` for messages; `at`, the directory itself, held open: every file in it is opened
    /// from there without following links (state_files.rs).
    Files {
        dir: PathBuf,
        at: Arc<Dir>,
    },
}

impl ReplicaLogs {
    /// journald when its stream socket is there, files under `state_dir/logs` otherwise (made
    /// 0750 if missing; a link at `logs` is refused, never followed).
    pub fn choose(state_dir: &Path) -> std::io::Result<ReplicaLogs> {
        let journal = match std::env::var(REPLICA_LOGS_ENV).as_deref() {
            Ok("files") => false,
            Ok("journal") => true,
            _ => Path::new(JOURNAL_STDOUT).exists(),
        };
        if journal {
            return Ok(ReplicaLogs::Journal);
        }
        let dir = state_dir.join("logs");
        let at = Dir::open(state_dir)
            .and_then(|s| s.subdir("logs", 0o750))
            .map_err(|e| std::io::Error::other(format!("{}: {e}", dir.display())))?;
        Ok(ReplicaLogs::Files {
            dir,
            at: Arc::new(at),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            ReplicaLogs::Journal => {
                "replica output: journald streams (journalctl -t REPLICA)".into()
            }
            ReplicaLogs::Files { dir, .. } => format!(
                "replica output: {}/REPLICA.log (rotated at {})",
                dir.display(),
                crate::units::short_bytes(MAX_FILE)
            ),
        }
    }

    /// The child's stdout and stderr.
    pub fn open(&self, replica: &str) -> std::io::Result<(Stdio, Stdio)> {
        match self {
            ReplicaLogs::Journal => {
                let out = journal_stream(replica, 6)?;
                let err = journal_stream(replica, 3)?;
                Ok((
                    Stdio::from(std::os::fd::OwnedFd::from(out)),
                    Stdio::from(std::os::fd::OwnedFd::from(err)),
                ))
            }
            ReplicaLogs::Files { at, .. } => {
                let f = at.append(&file_name(replica), 0o640)?;
                let g = f.try_clone()?;
                Ok((Stdio::from(f), Stdio::from(g)))
            }
        }
    }

    /// Where a replica's output is, for the log line that says it started.
    pub fn location(&self, replica: &str) -> String {
        match self {
            ReplicaLogs::Journal => format!("journalctl -t {replica}"),
            ReplicaLogs::Files { dir, .. } => dir.join(file_name(replica)).display().to_string(),
        }
    }

    /// Bounds the files: live replicas' logs past [`MAX_FILE`] are copied to `.1` and
    /// truncated (the child appends, so it carries on at the new end); of the gone replicas'
    /// logs the newest [`KEEP_GONE`] stay. Blocking: off the event loop.
    pub fn rotate(&self, live: &[String]) {
        let ReplicaLogs::Files { dir, at } = self else {
            return;
        };
        let mut gone: Vec<(i64, String)> = Vec::new();
        for (name, len, modified) in at.files() {
            let Some(replica) = name.strip_suffix(".log") else {
                continue;
            };
            if live.iter().any(|r| r == replica) {
                if len > MAX_FILE {
                    if let Err(e) = at.copy_truncate(&name, &format!("{name}.1"), 0o640) {
                        tracing::warn!("rotating {}: {e}", dir.join(&name).display());
                    }
                }
            } else {
                gone.push((modified, name));
            }
        }
        gone.sort_by_key(|g| std::cmp::Reverse(g.0));
        for (_, name) in gone.into_iter().skip(KEEP_GONE) {
            let _ = at.remove(&name);
            let _ = at.remove(&format!("{name}.1"));
        }
    }
}

/// How often the log files are checked for size.
const ROTATE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Bounds the replicas' log files on a thread of its own, for the daemon's life.
pub fn start_rotator(
    logs: ReplicaLogs,
    containment: std::sync::Arc<super::containment::Containment>,
) {
    if matches!(logs, ReplicaLogs::Journal) {
        return;
    }
    let started = std::thread::Builder::new()
        .name("hearth-logs".into())
        .spawn(move || loop {
            std::thread::sleep(ROTATE_EVERY);
            logs.rotate(&containment.live_ids());
        });
    if let Err(e) = started {
        tracing::warn!(
            "could not start the log rotation thread: {e}; replica logs are not bounded"
        );
    }
}

fn file_name(replica: &str) -> String {
    format!("{replica}.log")
}

/// A connection to journald's stdout stream, as systemd makes one for a service's output:
/// identifier, unit (none), priority, level prefix, syslog, kmsg, console.
fn journal_stream(identifier: &str, priority: u8) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(JOURNAL_STDOUT)?;
    s.write_all(format!("{identifier}\n\n{priority}\n0\n0\n0\n0\n").as_bytes())?;
    s.shutdown(std::net::Shutdown::Read)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Read;

    fn files(state_dir: &Path) -> ReplicaLogs {
        let at = Dir::open(state_dir).unwrap().subdir("logs", 0o750).unwrap();
        ReplicaLogs::Files {
            dir: state_dir.join("logs"),
            at: Arc::new(at),
        }
    }

    #[test]
    fn files_are_appended_and_rotated_and_gone_ones_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let logs = files(dir.path());
        let (_out, _err) = logs.open("a-1").unwrap();
        let path = dir.path().join("logs/a-1.log");
        fs::write(&path, vec![b'x'; (MAX_FILE + 10) as usize]).unwrap();
        for i in 0..(KEEP_GONE + 5) {
            fs::write(dir.path().join(format!("logs/b-{i}.log")), b"y").unwrap();
        }
        logs.rotate(&["a-1".to_string()]);
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        let mut old = Vec::new();
        fs::File::open(path.with_extension("log.1"))
            .unwrap()
            .read_to_end(&mut old)
            .unwrap();
        assert_eq!(old.len() as u64, MAX_FILE + 10);
        let left = fs::read_dir(dir.path().join("logs"))
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                n.to_string_lossy().starts_with("b-")
            })
            .count();
        assert_eq!(left, KEEP_GONE);
    }
}
