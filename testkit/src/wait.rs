//! Waiting for a condition: poll it until a deadline. The harness never sleeps in place of a
//! condition; a test that needs a span of time (a sampling window, pacing) says so where it
//! sleeps.

use std::time::{Duration, Instant};

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `f` every [`POLL`] until it returns Some, or `timeout` passes (None). `f` runs at least
/// once, also with a zero timeout.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

/// [`poll`], and panics naming `what` when the deadline passes.
pub fn wait_until<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll(timeout, f).unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}
