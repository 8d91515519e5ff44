//! Load for tests that must show nothing failed across an event (a panic, an upgrade, a daemon
//! that dies): one request after another on a thread until stopped, counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::wait_until;

/// Requests sent one after the other on a thread until `finish`: answers, failures and what
/// each failure was.
pub struct Load {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Load {
    /// Sends `one` request after another: `Ok` counts an answer, `Err` a failure and why.
    pub fn start(mut one: impl FnMut() -> Result<(), String> + Send + 'static) -> Load {
        let (ok, failed, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (o, f, s) = (ok.clone(), failed.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut errors = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match one() {
                    Ok(()) => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        f.fetch_add(1, Ordering::Relaxed);
                        errors.push(e);
                    }
                }
            }
            errors
        });
        Load {
            ok,
            failed,
            stop,
            thread,
        }
    }

    /// Answers so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Waits (30 s at most) for `n` more answers than now.
    pub fn more(&self, n: u64) {
        let target = self.ok() + n;
        wait_until("answers under load", Duration::from_secs(30), || {
            (self.ok() >= target).then_some(())
        });
    }

    /// Stops it: (answers, failures, what each failure was).
    pub fn finish(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self.thread.join().expect("the load's thread");
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            errors,
        )
    }
}
