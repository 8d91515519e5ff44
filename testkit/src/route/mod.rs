//! The front door's harness (`tests/route_*.rs`): the real `hearth daemon` with real replicas
//! (`hearth toy-server`, a streaming stand-in in Python, llama.cpp's server), the real `hearth
//! route` process, and a plain HTTP/1.1 client that reads answers as they arrive. Every process
//! started here is killed on drop, also when a test panics. [`front_door`] is the arrange
//! step most of those tests share: the configuration, the daemon, the router, and the routed
//! replicas waited for.
//!
//! Its own [`Daemon`], [`Model`] and [`Watch`] speak the daemon the way those tests were written
//! (a plain configuration file the router reads too); waiting, ports, /proc and the real model are
//! the crate's.

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

mod fixture;
mod http;
mod watch;

pub use crate::hearth;
pub use crate::procs::{alive, procs_with_env};
pub use crate::real_model::real_model_dir;
pub use crate::wait::{poll as poll_for, wait_until, POLL};
pub use fixture::{front_door, Daemon, Model, Router, Setup};
pub use http::*;
pub use watch::{endpoint_ids, Watch};

// ---- ports ------------------------------------------------------------------------------------

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// `n` consecutive loopback ports, free now, from [`crate::ports`]: the block's locks are held
/// until this test process exits (a port handed to a router may be bound again after a restart),
/// so no other test, here or in another binary, is given them meanwhile.
pub fn free_ports(n: u16) -> (u16, u16) {
    let block = crate::ports::ports(n);
    let first = block.first;
    std::mem::forget(block);
    (first, first + n - 1)
}

// ---- processes ----------------------------------------------------------------------------------

/// Sends signal number `sig` (libc's, as the tests name them) to `pid` (a group when negative);
/// a process already gone is no error here.
pub fn kill(pid: i32, sig: i32) {
    if let Ok(sig) = nix::sys::signal::Signal::try_from(sig) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// A command that dies with the test process (PR_SET_PDEATHSIG) in a group of its own.
fn guarded(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            Ok(())
        });
    }
}

fn tail(path: &Path, n: usize) -> String {
    let log = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---- the real model and the openai client -------------------------------------------------------

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            crate::hearth()
                .parent()
                .and_then(Path::parent)
                .expect("target dir")
                .to_path_buf()
        })
}

/// Runs `prepare` once across test processes (under a file lock), marking `dir` when done.
fn once_in(dir: &Path, lock_name: &str, prepare: impl FnOnce()) {
    fs::create_dir_all(dir).unwrap();
    let lock = fs::File::create(target_dir().join(lock_name)).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("flock");
    let done = dir.join(".setup-done");
    if !done.exists() {
        prepare();
        fs::write(&done, b"ok\n").unwrap();
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Python with the official `openai` package: `HEARTH_OPENAI_PYTHON` (CI sets it), else a
/// virtual environment made once in `TARGET/openai-venv`.
pub fn openai_python() -> PathBuf {
    if let Some(p) = std::env::var_os("HEARTH_OPENAI_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = target_dir().join("openai-venv");
    once_in(&dir, "openai-venv.lock", || {
        run_ok(Command::new("python3").args(["-m", "venv"]).arg(&dir));
        run_ok(Command::new(dir.join("bin/pip")).args([
            "install",
            "-q",
            "--no-cache-dir",
            "openai",
        ]));
    });
    dir.join("bin/python")
}
