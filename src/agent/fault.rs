//! Fault injection, for tests only: what the core cannot do by construction (panic, hang), made
//! to happen on request so that a test can show what it leads to with the real binary.
//!
//! - `HEARTH_FAULT_INJECT_PANIC_ON_OP=<op>`: the core's loop panics on every request with that
//!   op from an admin (the daemon re-executes and adopts: `tests/panic_reexec.rs`).
//! - `HEARTH_FAULT_INJECT_STALL_ON_OP=<op>`: the core's loop stops, for good, on the first
//!   request with that op from an admin, as a deadlock would stop it: no event is taken again
//!   and no watchdog ping is sent, so the service manager's watchdog is what ends the process
//!   (`tests/under_systemd/`).
//!
//! Only whoever starts the daemon sets its environment (root, the service manager), who can end
//! it anyway; a socket client can only send the op, and only an admin's request (who can
//! `upgrade` or drain everything already) trips it. Both are read once at start and removed from
//! the environment, so no replica inherits them, and handed on to the daemon's own
//! re-executions (after a panic, `hearth upgrade`), so every run of that daemon trips again and
//! a test decides by its requests when.

// The crate denies unsafe code; this file needs it for the environment, read and cleared at start: each block says why it is sound.
#![allow(unsafe_code)]

use std::time::Duration;

use crate::core::Peer;
use crate::protocol::{Op, Request, Role};

/// The op whose requests make the loop panic.
pub const PANIC_ENV: &str = "HEARTH_FAULT_INJECT_PANIC_ON_OP";
/// The op whose requests make the loop stall for good.
pub const STALL_ENV: &str = "HEARTH_FAULT_INJECT_STALL_ON_OP";

/// The faults armed in this daemon; none in production.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    panic: Option<Op>,
    stall: Option<Op>,
}

/// Reads and removes `name`: None where it is not set, an error naming the variable where it
/// does not name an op.
fn op_from_env(name: &str) -> Result<Option<Op>, String> {
    let Some(value) = std::env::var_os(name) else {
        return Ok(None);
    };
    // SAFETY: at start, before the runtime's threads exist.
    unsafe { std::env::remove_var(name) };
    let text = value.to_string_lossy();
    serde_json::from_value(serde_json::Value::String(text.to_string()))
        .map(Some)
        .map_err(|e| format!("{name}={text:?} is not an op: {e}"))
}

impl Faults {
    /// Reads and removes both variables.
    pub fn from_env() -> Result<Faults, String> {
        Ok(Faults {
            panic: op_from_env(PANIC_ENV)?,
            stall: op_from_env(STALL_ENV)?,
        })
    }

    pub fn any(&self) -> bool {
        self.panic.is_some() || self.stall.is_some()
    }

    /// What arms them again in a re-executed daemon.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        [(PANIC_ENV, self.panic), (STALL_ENV, self.stall)]
            .into_iter()
            .filter_map(|(name, op)| op.map(|op| (name, op.to_string())))
            .collect()
    }

    /// What a re-exec that failed must take out of this process's environment again.
    pub fn names() -> [&'static str; 2] {
        [PANIC_ENV, STALL_ENV]
    }

    /// Panics, or stalls for good, on the core's thread, if `request` from `peer` trips a fault.
    pub fn check(&self, request: &Request, peer: &Peer) {
        if peer.role != Role::Admin {
            return;
        }
        let op = request.op();
        if self.panic == Some(op) {
            panic!("fault injected by {PANIC_ENV}: a `{op}` request");
        }
        if self.stall == Some(op) {
            tracing::error!("fault injected by {STALL_ENV}: a `{op}` request; the event loop stops here for good");
            // What a deadlock looks like from outside: the thread is alive and never returns.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}

impl std::fmt::Display for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut said = Vec::new();
        if let Some(op) = self.panic {
            said.push(format!(
                "fault injection ({PANIC_ENV}): the daemon panics on every `{op}` request from an admin"
            ));
        }
        if let Some(op) = self.stall {
            said.push(format!(
                "fault injection ({STALL_ENV}): the daemon's event loop stalls for good on a `{op}` request from an admin"
            ));
        }
        write!(f, "{}; for tests only", said.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trips(faults: Faults, request: Request, role: Role) -> bool {
        let peer = Peer {
            role,
            ..Peer::trusted()
        };
        std::panic::catch_unwind(|| faults.check(&request, &peer)).is_err()
    }

    #[test]
    fn the_panic_trips_on_its_op_from_an_admin_only() {
        let f = Faults {
            panic: Some(Op::Version),
            stall: None,
        };
        assert!(trips(f, Request::Version {}, Role::Admin));
        assert!(!trips(f, Request::Gpus {}, Role::Admin));
        for role in [Role::None, Role::Reader, Role::Reporter] {
            assert!(!trips(f, Request::Version {}, role), "{role}");
        }
        assert_eq!(
            f.env(),
            vec![(PANIC_ENV, "version".to_string())],
            "what a re-exec is given"
        );
    }

    #[test]
    fn the_stall_holds_the_thread_on_its_op_from_an_admin_only() {
        let f = Faults {
            panic: None,
            stall: Some(Op::Gpus),
        };
        // Requests that do not trip it return at once.
        assert!(!trips(f, Request::Version {}, Role::Admin));
        assert!(!trips(f, Request::Gpus {}, Role::Reader));
        // One that trips it never returns: the thread is still inside after a while.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let peer = Peer {
                role: Role::Admin,
                ..Peer::trusted()
            };
            f.check(&Request::Gpus {}, &peer);
            let _ = tx.send(());
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout),
            "a stalled loop does not come back"
        );
        assert_eq!(
            f.env(),
            vec![(STALL_ENV, "gpus".to_string())],
            "what a re-exec is given"
        );
        assert_eq!(Faults::default().env(), Vec::new());
        assert!(!Faults::default().any());
    }
}
