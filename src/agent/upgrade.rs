//! Replacing the running daemon without stopping a replica (issue 14): `hearth upgrade`, and the
//! re-exec that ends a panic.
//!
//! The daemon re-executes itself in place: the binary now at the path it was started from, the
//! same arguments, the same pid, so replicas stay its children. First it runs that binary with
//! `--version` (upgrade_check.rs): one that does not answer like hearth within a few seconds is
//! refused, and the old daemon carries on. Then it writes the hand-over (`state_dir/
//! handover.json`: ledger.rs's versioned document with the running configuration's text,
//! fsync'd) and leaves open across the exec the control socket's listening descriptor and its
//! own executable. The new binary reads the hand-over, runs the configuration it carries (not
//! the file on disk: running_config.rs) and adopts every replica in its role at once;
//! connections waiting in the socket's backlog are answered by it, watch clients reconnect to an
//! equal snapshot.
//!
//! What can go wrong falls back without a replica dying: an exec that fails leaves the old
//! binary running; a new binary that fails before it has adopted (it cannot read the hand-over
//! or the configuration, its start fails, it panics) executes the old binary again, kept open
//! (handover.rs); one that does not start at all leaves the replicas serving (they have no
//! PDEATHSIG in a cgroup) until the daemon is started again and adopts them. Each ending is in
//! `status.daemon.upgrade`, which `hearth upgrade` waits for.

// The crate denies unsafe code; this file needs it for the re-exec: the environment and the descriptors kept across it: each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use super::fault::Faults;
use super::ledger::{self, Saved};
use crate::core::Adoption;

/// Set on the re-executed daemon: the hand-over file to read.
pub const HANDOVER_ENV: &str = "HEARTH_HANDOVER";
/// Set on the re-executed daemon: the control socket's listening descriptor.
pub const LISTEN_FD_ENV: &str = "HEARTH_LISTEN_FD";
/// How many times in a row the daemon re-executed itself after a panic.
pub const PANIC_REEXECS_ENV: &str = "HEARTH_PANIC_REEXECS";
/// A daemon that panicked this many times in a row exits instead (its service manager restarts
/// it, and the next run adopts the replicas all the same).
pub const MAX_PANIC_REEXECS: u32 = 3;

/// The steps of `hearth upgrade` that come back to the daemon's loop (daemon/upgrade_flow.rs).
#[derive(Debug)]
pub enum UpgradeStep {
    /// The binary at `exe` answered `--version` (its version), or why not.
    Checked {
        id: crate::core::RequestId,
        exe: PathBuf,
        result: Result<String, super::upgrade_check::NotHearth>,
    },
    /// The answer has had its moment to reach the client: re-execute.
    Due(super::handover::Attempt),
}

/// The state the previous run left: its hand-over (planned: roles kept) when this process is
/// its re-exec and could read it, else the ledger it kept saving (warm-up first).
pub fn saved_state(state_dir: &Path, handover: Option<Saved>) -> (Adoption, Option<Saved>) {
    if let Some(s) = handover {
        tracing::info!(
            "taking over from the previous binary ({}): {} replica(s) handed over",
            s.written_by,
            s.ledger.replicas.len()
        );
        return (Adoption::HandedOver, Some(s));
    }
    let path = ledger::path(state_dir);
    match ledger::read(&path) {
        Ok(s) => (Adoption::Found, s),
        Err(e) => {
            tracing::warn!(
                "cannot use the saved ledger ({e}): what an earlier run left is stopped"
            );
            (Adoption::Found, None)
        }
    }
}

/// The binary and the arguments this process was started with: what a re-exec runs. Taken at
/// start, while /proc/self/exe still names a file (an upgrade replaces it).
#[derive(Debug, Clone)]
pub struct Reexec {
    pub exe: PathBuf,
    pub args: Vec<std::ffi::OsString>,
}

impl Reexec {
    pub fn current() -> Option<Reexec> {
        Some(Reexec {
            exe: path_of_exe(std::env::current_exe().ok()?),
            args: std::env::args_os().collect(),
        })
    }

    /// Replaces this process with the binary now at `exe`, with `env` added. Returns only if
    /// the exec failed (the old binary keeps running).
    pub fn exec(&self, env: &[(&str, String)]) -> std::io::Error {
        exec_with(&self.exe, &self.args, env)
    }

    /// Whether the binary at `exe` can be executed now.
    pub fn check(&self) -> Result<(), NotExecutable> {
        nix::unistd::access(&self.exe, nix::unistd::AccessFlags::X_OK).map_err(|e| NotExecutable {
            exe: self.exe.clone(),
            errno: e,
        })
    }
}

/// The binary at `exe` cannot be executed now.
#[derive(Debug, thiserror::Error)]
#[error("{}: {errno}", exe.display())]
pub struct NotExecutable {
    pub exe: PathBuf,
    pub errno: nix::errno::Errno,
}

/// How many panics in a row led to this process (read once at start, then cleared).
pub fn panic_reexecs() -> u32 {
    let n = std::env::var(PANIC_REEXECS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: at start, before the runtime's threads exist.
    unsafe { std::env::remove_var(PANIC_REEXECS_ENV) };
    n
}

/// A run this long counts as healthy: a panic after it starts the count again.
const HEALTHY_RUN: std::time::Duration = std::time::Duration::from_secs(600);

/// The daemon's task panicked: re-execute (no hand-over: the next run adopts from the saved
/// ledger, warm-up first), with `faults` armed again. Returns if it must not (too many in a
/// row) or could not.
pub fn after_panic(
    reexec: Option<&Reexec>,
    before: u32,
    started: std::time::Instant,
    faults: Faults,
) {
    let n = if started.elapsed() > HEALTHY_RUN {
        1
    } else {
        before + 1
    };
    let Some(r) = reexec else {
        return;
    };
    if n > MAX_PANIC_REEXECS {
        tracing::error!("the daemon panicked {n} times in a row: exiting; its replicas keep serving until the next start adopts them");
        return;
    }
    tracing::error!("the daemon panicked: re-executing to adopt its replicas ({n} of {MAX_PANIC_REEXECS} in a row)");
    let mut env = vec![(PANIC_REEXECS_ENV, n.to_string())];
    env.extend(faults.env());
    let err = r.exec(&env);
    tracing::error!("re-executing after the panic failed: {err}");
}

/// The path a binary was started from. A binary whose file was replaced since (by an upgrade's
/// rename, or a fallback to the previous binary through its descriptor) reads as "PATH
/// (deleted)": the path is where the next upgrade looks.
fn path_of_exe(exe: PathBuf) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = exe.as_os_str().as_bytes();
    match bytes.strip_suffix(b" (deleted)") {
        Some(p) if !exe.exists() => PathBuf::from(std::ffi::OsString::from_vec(p.to_vec())),
        _ => exe,
    }
}

/// Replaces this process with `exe`, given `args` and `env` added. Returns only if the exec
/// failed.
pub fn exec_with(
    exe: &Path,
    args: &[std::ffi::OsString],
    env: &[(&str, String)],
) -> std::io::Error {
    use std::os::unix::ffi::OsStrExt;
    for (k, v) in env {
        // SAFETY: the process is about to be replaced; no other thread reads the environment
        // meanwhile in a way that matters (a failed exec leaves these set, and the supervisor
        // never passes them to replicas).
        unsafe { std::env::set_var(k, v) };
    }
    let cstr = |b: &[u8]| CString::new(b).ok();
    let Some(exe) = cstr(exe.as_os_str().as_bytes()) else {
        return std::io::Error::other("the binary's path has a NUL");
    };
    let args: Option<Vec<CString>> = args.iter().map(|a| cstr(a.as_bytes())).collect();
    let Some(args) = args else {
        return std::io::Error::other("an argument has a NUL");
    };
    match nix::unistd::execv(&exe, &args) {
        Ok(never) => match never {},
        Err(e) => std::io::Error::from(e),
    }
}

/// This process's own executable, open and inherited across an exec: what a new binary that
/// fails falls back to (handover.rs). It is the file this process runs, also once the path
/// names another.
pub fn open_own_exe() -> std::io::Result<std::os::fd::OwnedFd> {
    nix::fcntl::open(
        "/proc/self/exe",
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// Clears close-on-exec on `fd` so that it survives the exec.
pub fn keep_across_exec(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: the fd is owned elsewhere and outlives this call.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::fcntl::fcntl(
        b,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map(|_| ())
    .map_err(std::io::Error::from)
}
