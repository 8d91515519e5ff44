//! Fault injection, for tests only: what the core cannot do by construction (panic, hang), made
//! to happen on request so that a test can show what it leads to with the real binary.
//!
//! - `HEARTH_FAULT_INJECT_PANIC_ON_OP=<op>`: the core's loop panics on every request with that
//!   op from an admin (the daemon re-executes and adopts: `tests/processes/panic_reexec.rs`).
//! - `HEARTH_FAULT_INJECT_STALL_ON_OP=<op>`: the core's loop stops, for good, on the first
//!   request with that op from an admin, as a deadlock would stop it: no event is taken again
//!   and no watchdog ping is sent, so the service manager's watchdog is what ends the process
//!   (`tests/under_systemd/`).
//! - `HEARTH_FAULT_INJECT_FAIL_HANDOVER=panic|error`: a daemon started by `hearth upgrade`'s
//!   re-exec fails while it adopts the hand-over (it panics, or its start returns an error), as a
//!   new binary that cannot run would; it then falls back to the previous binary, kept open by
//!   fd (handover.rs), without this fault: it trips once (`tests/processes/upgrade.rs`).
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
/// How a daemon adopting a hand-over fails.
pub const HANDOVER_ENV: &str = "HEARTH_FAULT_INJECT_FAIL_HANDOVER";

/// The faults armed in this daemon; none in production.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    panic: Option<Op>,
    stall: Option<Op>,
    handover: Option<HandoverFault>,
}

/// How the adoption of a hand-over fails (`HEARTH_FAULT_INJECT_FAIL_HANDOVER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoverFault {
    Panic,
    Error,
}

impl HandoverFault {
    fn name(self) -> &'static str {
        match self {
            HandoverFault::Panic => "panic",
            HandoverFault::Error => "error",
        }
    }
}

/// A fault's variable names no value it takes.
#[derive(Debug, thiserror::Error)]
#[error("{name}={value:?} is not {expected}")]
pub struct FaultError {
    name: &'static str,
    value: String,
    expected: String,
}

/// The injected failure of a hand-over's adoption, as an error.
#[derive(Debug, thiserror::Error)]
#[error("fault injected by {HANDOVER_ENV}: the adoption of the hand-over fails")]
pub struct HandoverFailed;

/// Reads and removes `name`: None where it is not set, an error naming the variable where it
/// does not name an op.
fn op_from_env(name: &'static str) -> Result<Option<Op>, FaultError> {
    let Some(text) = take_env(name) else {
        return Ok(None);
    };
    serde_json::from_value(serde_json::Value::String(text.clone()))
        .map(Some)
        .map_err(|e| FaultError {
            name,
            value: text,
            expected: format!("an op: {e}"),
        })
}

/// Reads and removes `name`.
fn take_env(name: &str) -> Option<String> {
    let value = std::env::var_os(name)?;
    // SAFETY: at start, before the runtime's threads exist.
    unsafe { std::env::remove_var(name) };
    Some(value.to_string_lossy().into_owned())
}

impl Faults {
    /// Reads and removes the variables.
    pub fn from_env() -> Result<Faults, FaultError> {
        let handover = match take_env(HANDOVER_ENV).as_deref() {
            None => None,
            Some("panic") => Some(HandoverFault::Panic),
            Some("error") => Some(HandoverFault::Error),
            Some(other) => {
                return Err(FaultError {
                    name: HANDOVER_ENV,
                    value: other.to_string(),
                    expected: "panic or error".into(),
                })
            }
        };
        Ok(Faults {
            panic: op_from_env(PANIC_ENV)?,
            stall: op_from_env(STALL_ENV)?,
            handover,
        })
    }

    pub fn any(&self) -> bool {
        self.panic.is_some() || self.stall.is_some() || self.handover.is_some()
    }

    /// What arms them again in a re-executed daemon.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.fallback_env();
        if let Some(h) = self.handover {
            env.push((HANDOVER_ENV, h.name().to_string()));
        }
        env
    }

    /// What arms them again in the previous binary a failed adoption falls back to: the
    /// hand-over's fault has tripped, and trips once.
    pub fn fallback_env(&self) -> Vec<(&'static str, String)> {
        [(PANIC_ENV, self.panic), (STALL_ENV, self.stall)]
            .into_iter()
            .filter_map(|(name, op)| op.map(|op| (name, op.to_string())))
            .collect()
    }

    /// What a re-exec that failed must take out of this process's environment again.
    pub fn names() -> [&'static str; 3] {
        [PANIC_ENV, STALL_ENV, HANDOVER_ENV]
    }

    /// While a hand-over is adopted: fails it, if armed.
    pub fn check_handover(&self) -> Result<(), HandoverFailed> {
        match self.handover {
            None => Ok(()),
            Some(HandoverFault::Panic) => {
                panic!("fault injected by {HANDOVER_ENV}: the adoption of the hand-over panics")
            }
            Some(HandoverFault::Error) => Err(HandoverFailed),
        }
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
        if let Some(h) = self.handover {
            said.push(format!(
                "fault injection ({HANDOVER_ENV}={}): the adoption of a hand-over fails, once",
                h.name()
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
            ..Faults::default()
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
            stall: Some(Op::Gpus),
            ..Faults::default()
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

    #[test]
    fn the_handover_fault_is_handed_to_an_upgrade_and_not_to_the_fallback() {
        let f = Faults {
            panic: Some(Op::Gpus),
            handover: Some(HandoverFault::Error),
            ..Faults::default()
        };
        assert!(f.env().contains(&(HANDOVER_ENV, "error".to_string())));
        assert_eq!(f.fallback_env(), vec![(PANIC_ENV, "gpus".to_string())]);
        assert!(f.check_handover().is_err());
        assert!(Faults::default().check_handover().is_ok());
        let panics = Faults {
            handover: Some(HandoverFault::Panic),
            ..Faults::default()
        };
        assert!(std::panic::catch_unwind(|| panics.check_handover()).is_err());
    }
}
