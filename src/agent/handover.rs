//! The daemon that `hearth upgrade` re-executes: what the binary before it handed over (the
//! hand-over document, the listening socket, the previous binary kept open, the attempt), and
//! the way back to that binary when this one fails before it has adopted the hand-over
//! (issue 24, item 2).
//!
//! The binary before keeps its own executable open (`/proc/self/exe`, not close-on-exec) and
//! names the descriptor in `HEARTH_PREVIOUS_EXE_FD`. Until the new binary has adopted every
//! replica ([`Incoming::commit`]), any failure of its start (an error, a panic, a configuration
//! it refuses, a hand-over it cannot read) executes `/proc/self/fd/N` instead: the previous
//! binary, whatever is at the path now, with the same hand-over and socket, and why in
//! `HEARTH_UPGRADE_FELL_BACK`. It takes the replicas back in their roles and says, in
//! `status.daemon.upgrade`, that the upgrade fell back and why. A new binary killed outright
//! (SIGKILL, a crash of the process) cannot fall back: its replicas keep serving until the
//! daemon is started again and adopts them from `replicas.json`.

// The crate denies unsafe code; this file needs it for the descriptors kept across the exec (taken by number) and the environment, cleared at start: each block says why it is sound.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::ledger::{self, Saved};
use super::upgrade::{self, HANDOVER_ENV, LISTEN_FD_ENV};

/// Set on the new binary: the descriptor of the previous binary's executable.
pub const PREVIOUS_EXE_FD_ENV: &str = "HEARTH_PREVIOUS_EXE_FD";
/// Set on the new binary, and on the previous one it falls back to: `ATTEMPT VERSION`, the
/// attempt the `upgrade` answer named and the version the new binary said it is.
pub const ATTEMPT_ENV: &str = "HEARTH_UPGRADE_ATTEMPT";
/// Set on the previous binary a failed adoption falls back to: why it failed.
pub const FELL_BACK_ENV: &str = "HEARTH_UPGRADE_FELL_BACK";
/// The most of a reason the fallback passes on (bytes).
const MAX_REASON: usize = 1024;

/// One `hearth upgrade`: what its answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub id: u64,
    /// What the new binary said it is (`--version`).
    pub to_version: String,
}

impl Attempt {
    pub fn env(&self) -> String {
        format!("{} {}", self.id, self.to_version)
    }

    fn parse(s: &str) -> Option<Attempt> {
        let (id, version) = s.split_once(' ')?;
        Some(Attempt {
            id: id.parse().ok()?,
            to_version: version.chars().take(64).collect(),
        })
    }
}

/// Why a hand-over cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("the hand-over {0} is missing")]
    Missing(PathBuf),
    #[error("cannot use the hand-over: {0}")]
    Unreadable(super::ledger::LedgerError),
}

/// Why a fallback did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FallbackError {
    #[error("no previous binary to fall back to (this one is not a new binary's start)")]
    NoPrevious,
    #[error("executing the previous binary: {0}")]
    Exec(std::io::Error),
}

/// What this process got from the binary that executed it with a hand-over.
pub struct Incoming {
    pub path: PathBuf,
    pub attempt: Option<Attempt>,
    /// This process is the previous binary again, after the new one failed: why it failed.
    pub fell_back: Option<String>,
    listener: Mutex<Option<UnixListener>>,
    /// A second descriptor of the listening socket, for the fallback: the first may be closed
    /// by then.
    spare: Mutex<Option<OwnedFd>>,
    previous: Mutex<Option<OwnedFd>>,
    committed: AtomicBool,
}

/// Reads and removes `name`.
fn take_env(name: &str) -> Option<String> {
    let v = std::env::var(name).ok();
    // SAFETY: at start, before any thread of ours reads the environment.
    unsafe { std::env::remove_var(name) };
    v
}

/// The descriptor named in `name`, if it is open and `ok` accepts it; made close-on-exec, so
/// that no replica inherits it.
fn fd_from_env(name: &str, ok: impl Fn(RawFd) -> bool) -> Option<OwnedFd> {
    let fd: RawFd = take_env(name)?.parse().ok()?;
    if fd < 3 || !ok(fd) {
        return None;
    }
    // SAFETY: checked open and of the kind expected; nothing else in this process owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    Some(owned)
}

fn borrowed(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: only for the checks below, while the descriptor is open.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

fn is_listener(fd: RawFd) -> bool {
    nix::sys::socket::getsockopt(&borrowed(fd), nix::sys::socket::sockopt::AcceptConn)
        .unwrap_or(false)
}

fn is_file(fd: RawFd) -> bool {
    nix::sys::stat::fstat(borrowed(fd)).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

impl Incoming {
    /// What the previous binary handed over, if this process is its re-exec (read from the
    /// environment, which is cleared of it), and the hand-over document.
    pub fn take() -> Option<(Incoming, Result<Saved, HandoverError>)> {
        let path = PathBuf::from(take_env(HANDOVER_ENV)?);
        let listener = fd_from_env(LISTEN_FD_ENV, is_listener).map(UnixListener::from);
        let spare = listener
            .as_ref()
            .and_then(|l| nix::unistd::dup(l.as_fd()).ok());
        if let Some(s) = &spare {
            let _ = nix::fcntl::fcntl(
                s,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
        }
        let previous = fd_from_env(PREVIOUS_EXE_FD_ENV, is_file);
        let attempt = take_env(ATTEMPT_ENV).and_then(|a| Attempt::parse(&a));
        let fell_back = take_env(FELL_BACK_ENV).map(|r| bounded(&r));
        let saved = match ledger::read(&path) {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(HandoverError::Missing(path.clone())),
            Err(e) => Err(HandoverError::Unreadable(e)),
        };
        let incoming = Incoming {
            path,
            attempt,
            fell_back,
            listener: Mutex::new(listener),
            spare: Mutex::new(spare),
            previous: Mutex::new(previous),
            committed: AtomicBool::new(false),
        };
        Some((incoming, saved))
    }

    /// The listening socket the previous binary kept open (once).
    pub fn take_listener(&self) -> Option<UnixListener> {
        self.listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether a failure now can go back to the previous binary.
    pub fn can_fall_back(&self) -> bool {
        !self.committed.load(Ordering::SeqCst)
            && self
                .previous
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
    }

    /// Every replica is adopted: this binary stays. The previous binary is let go and the
    /// hand-over removed.
    pub fn commit(&self) {
        self.committed.store(true, Ordering::SeqCst);
        self.previous
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _ = std::fs::remove_file(&self.path);
    }

    /// Executes the previous binary with the same hand-over, socket and attempt, and `reason`;
    /// `faults` are the test faults to arm in it. Returns only if it could not.
    pub fn fall_back(&self, reason: &str, faults: &[(&'static str, String)]) -> FallbackError {
        if self.committed.load(Ordering::SeqCst) {
            return FallbackError::NoPrevious;
        }
        let previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        let Some(exe) = previous.as_ref() else {
            return FallbackError::NoPrevious;
        };
        let mut env = vec![
            (HANDOVER_ENV, self.path.display().to_string()),
            (FELL_BACK_ENV, bounded(reason)),
        ];
        if let Some(a) = &self.attempt {
            env.push((ATTEMPT_ENV, a.env()));
        }
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = spare.as_ref() {
            if upgrade::keep_across_exec(s.as_raw_fd()).is_ok() {
                env.push((LISTEN_FD_ENV, s.as_raw_fd().to_string()));
            }
        }
        env.extend(faults.iter().cloned());
        // The kernel opens the file through the link before it closes this close-on-exec
        // descriptor.
        let exe = Path::new("/proc/self/fd").join(exe.as_raw_fd().to_string());
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        FallbackError::Exec(upgrade::exec_with(&exe, &args, &env))
    }
}

/// What the previous binary is told when this one fails before it adopted: which binary failed,
/// and `why`.
pub fn failure(why: &str) -> String {
    let exe = std::env::current_exe().map_or_else(|_| "?".into(), |p| p.display().to_string());
    format!(
        "the new binary (hearth {} at {exe}) failed before it had adopted the hand-over: {why}",
        env!("CARGO_PKG_VERSION")
    )
}

/// `reason` cut to `MAX_REASON` bytes at a character boundary, without NULs.
fn bounded(reason: &str) -> String {
    let mut out = String::new();
    for c in reason.chars().filter(|c| *c != '\0') {
        if out.len() + c.len_utf8() > MAX_REASON {
            out.push('…');
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_reads_back_and_a_reason_is_bounded() {
        let a = Attempt {
            id: 42,
            to_version: "0.2.0".into(),
        };
        assert_eq!(Attempt::parse(&a.env()), Some(a));
        assert_eq!(Attempt::parse("x 1"), None);
        assert_eq!(Attempt::parse("7"), None);
        let long = "é".repeat(MAX_REASON);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_REASON + '…'.len_utf8(), "{}", cut.len());
        assert_eq!(bounded("a\0b"), "ab");
    }
}
