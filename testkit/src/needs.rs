//! What a test needs from the host it runs on (root, a writable cgroup v2, a program), and what
//! happens when it is missing: the test cannot show what it is for, so it **fails**, saying what
//! is missing and how to get it. No green run checks nothing.
//!
//! `HEARTH_ALLOW_SKIP=1` asks for the other behaviour on purpose (a developer's machine that is
//! known to lack it): the test prints `SKIPPED` with the reason and passes. CI never sets it.
//!
//! ```ignore
//! if !needs_root("connecting as other users") {
//!     return; // only with HEARTH_ALLOW_SKIP=1
//! }
//! ```

use crate::procs::is_root;
use crate::Daemon;

/// The variable that lets a test skip, with a note, what this host cannot run.
pub const ALLOW_SKIP: &str = "HEARTH_ALLOW_SKIP";

/// Whether a skip was asked for on purpose (`HEARTH_ALLOW_SKIP=1`, nothing else).
pub fn skip_allowed() -> bool {
    std::env::var_os(ALLOW_SKIP).is_some_and(|v| v == "1")
}

/// `true` when the host has what the test needs (`ok`). Otherwise the test fails, naming
/// `missing()`, unless `HEARTH_ALLOW_SKIP=1`: then it prints why it skipped and returns `false`,
/// and the caller returns (or leaves out the part that needs it).
pub fn needs(ok: bool, missing: impl FnOnce() -> String) -> bool {
    if ok {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    let missing = missing();
    if skip_allowed() {
        eprintln!("SKIPPED ({ALLOW_SKIP}=1): {test}: this host lacks {missing}");
        return false;
    }
    panic!(
        "{test} cannot run here: this host lacks {missing}. scripts/test.sh as root on a host \
         with a writable cgroup v2 has what every test needs (CI runs it so); set \
         {ALLOW_SKIP}=1 to let such tests pass with a note instead"
    );
}

/// The test runs as root (`why`: what needs it).
pub fn needs_root(why: &str) -> bool {
    needs(is_root(), || format!("root ({why})"))
}

/// The daemon `d` chose a cgroup2 subtree for its replicas (root, and cgroup v2 writable).
pub fn needs_cgroup2(d: &Daemon) -> bool {
    let chosen = d.containment();
    needs(chosen.starts_with("cgroup2 subtree at"), || {
        format!(
            "a writable cgroup v2 for the daemon's replicas (it chose: {chosen}; log: {})",
            d.log_tail(20)
        )
    })
}
