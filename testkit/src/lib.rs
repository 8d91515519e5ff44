//! hearth's test harness, shared by `tests/` and `benches/`: runs the real `hearth` binary as a
//! daemon in a temporary directory, with replicas on a port block of its own, and talks to it
//! the way users and routers do (its Unix socket, its CLI, HTTP).
//!
//! - [`Daemon::builder`]: the configuration ([`Model`], GPUs, metrics, log level, `[route]`, raw
//!   TOML), the launch (environment, notify socket, watchdog, a wrapper command), then `start`
//!   (waits for the socket) or `spawn` (does not); [`Home`] is the directory, ports and cleanup
//!   before any process runs (for an in-process daemon, or a test that plays the daemon).
//! - [`poll`] and [`wait_until`]: the one way to wait for a condition, with a deadline.
//! - [`Conn`]: a control-socket client; [`Watch`]: a watch connection recorded on a thread.
//! - [`ports`]: a block of loopback ports no other test on this machine holds.
//! - [`procs`]: /proc, signals, and the [`Reaper`] that kills every process a test started.
//! - [`http()`], [`complete`], [`llama_complete`]: HTTP/1.1 to replicas.
//! - [`NotifyRecorder`]: the service manager's end of `NOTIFY_SOCKET`.
//! - [`needs`]: what a test needs from the host; missing, the test fails saying so (unless
//!   `HEARTH_ALLOW_SKIP=1`).
//! - [`FreshAccounts`]: a root daemon on a machine without hearth's accounts (a private /etc),
//!   and [`Checkout`]: the README's quick start run from a fresh clone.
//! - [`route`]: the front door's tests: `hearth route` on a daemon's file ([`route::Router`],
//!   [`DaemonBuilder::route`]), HTTP that streams, and [`route::front_door`], the arrange step
//!   they share.
//!
//! Cleanup, also when a test panics: every process the harness starts carries one mark in its
//! environment, `HEARTH_TESTKIT_MARK=<its daemon's directory>`: the daemon (and so every replica
//! it forks, and theirs), each rendered model's `env` (for servers started without the daemon's
//! environment, and for an in-process daemon), every CLI run, and every router. Dropping a
//! [`Daemon`] or a [`Home`] SIGKILLs the daemon and reaps it, then kills every live process with
//! the mark and its process group until none is left, then kills and removes the daemon's
//! replica cgroups ([`cgroups`]: a process that dropped the mark is still found there), and fails
//! the test if one survives. The daemon and routers also get PR_SET_PDEATHSIG, so a test binary
//! killed from outside takes them along, and the daemons their replicas.

mod builder;
mod burst;
pub mod cgroups;
mod config;
mod conn;
mod daemon;
mod fresh;
mod http;
mod load;
mod measure;
pub mod needs;
mod notify;
pub mod nspawn;
pub mod ports;
pub mod procs;
mod real_model;
pub mod route;
pub mod status;
mod wait;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use builder::DaemonBuilder;
pub use burst::{Answer, Burst};
pub use config::{Config, Liveness, Model};
pub use conn::{ask_on, connect_as, request, Conn};
pub use daemon::{run, CliOutput, Daemon, Home, Launch};
pub use fresh::{Checkout, FreshAccounts};
pub use http::{complete, http, llama_complete, tokens_for, HttpReply};
pub use load::Load;
pub use measure::{
    bench_arg, bench_full, clk_tck, cpu_ticks, machine_load, monotonic_usec, percentile, rss_kib,
};
pub use needs::{needs, needs_cgroup2, needs_root};
pub use nix::sys::signal::Signal;
pub use notify::NotifyRecorder;
pub use procs::Reaper;
pub use real_model::{genuine_llama_server, openai_python, real_model_dir, repo_dir};
pub use serde_json::{json, Value};
pub use wait::{poll, wait_until, POLL};
pub use watch::{endpoint_ids, endpoints, replica_event, Ev, Watch};

/// The `hearth` binary cargo built beside the test or bench that runs: test and bench binaries
/// live in `target/<profile>/deps/`, the binary in `target/<profile>/`. (`tests/cli/harness.rs`
/// checks that this is `CARGO_BIN_EXE_hearth`.)
pub fn hearth() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the path of this test binary");
        let dir = exe.parent().expect("the test binary's directory");
        let dir = if dir.ends_with("deps") {
            dir.parent().expect("the profile directory")
        } else {
            dir
        };
        let bin = dir.join("hearth");
        assert!(
            bin.is_file(),
            "no hearth binary at {} (beside {}): run tests and benches through cargo",
            bin.display(),
            exe.display()
        );
        bin
    })
}

/// A temporary directory for a daemon: socket, state, config and logs. Searchable by everyone
/// (0755): a daemon running as root runs replicas as an unprivileged account, which must reach
/// the socket in it to report.
pub fn temp_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("hearth-it-")
        .tempdir()
        .expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the temporary directory");
    dir
}
