//! The loop's side of `hearth upgrade` (upgrade.rs says how it works): refuse what cannot work,
//! check the new binary off the loop, answer with the attempt, re-execute, and, in the binary
//! that runs after, say how the attempt ended and let the previous binary go.

// The crate denies unsafe code; this file needs it for the environment, changed before the re-exec: each block says why it is sound.
#![allow(unsafe_code)]

use std::time::{Duration, SystemTime};

use super::Shell;
use crate::agent::handover::{self, Attempt};
use crate::agent::ledger::{self, Saved};
use crate::agent::upgrade::{self, UpgradeStep};
use crate::agent::{containment, fault::Faults, upgrade_check};
use crate::core::{Event, ReplicaState, RequestId};
use crate::protocol::{ErrorCode, Failure, Response, UpgradeOutcome, UpgradePlan, UpgradeView};

/// How long the answer to `upgrade` gets to reach its client before the exec closes every
/// connection.
const ANSWER_GRACE: Duration = Duration::from_millis(100);

/// The most replicas `not_kept` names.
const MAX_NOT_KEPT: usize = 32;

impl Shell {
    /// `upgrade`: refused where it cannot work; else the binary at the path is checked off the
    /// loop, and the answer waits for that.
    pub(super) fn upgrade_asked(&mut self, id: RequestId) {
        let refusal = if self.containment.mode() == containment::Mode::Groups {
            Some("replicas have no cgroup here (process groups + PDEATHSIG): they would die with the old binary; restart the daemon instead".to_string())
        } else if self.upgrading {
            Some("an upgrade is under way".to_string())
        } else {
            match &self.reexec {
                None => Some("the daemon's own binary could not be found at start".into()),
                Some(r) => r.check().err().map(|e| format!("cannot execute {e}")),
            }
        };
        if let Some(why) = refusal {
            tracing::warn!("upgrade refused: {why}");
            self.answer(id, Err(Failure::new(ErrorCode::Busy, why)));
            return;
        }
        let Some(exe) = self.reexec.as_ref().map(|r| r.exe.clone()) else {
            return;
        };
        self.upgrading = true;
        let tx = self.upgrade_due.clone();
        self.tracker.spawn(async move {
            let result = upgrade_check::check(&exe).await;
            let _ = tx.send(UpgradeStep::Checked { id, exe, result }).await;
        });
    }

    pub(super) fn upgrade_step(&mut self, step: UpgradeStep) {
        match step {
            UpgradeStep::Checked { id, exe, result } => self.upgrade_checked(id, &exe, result),
            UpgradeStep::Due(attempt) => self.reexecute(attempt),
        }
    }

    fn answer(&mut self, id: RequestId, answer: crate::protocol::Answer) {
        self.fx.apply(crate::core::Action::Reply { id, answer });
    }

    /// The new binary answered its check, or did not: refused, or answered with the attempt;
    /// the re-exec comes once the answer has had a moment to reach its connection.
    fn upgrade_checked(
        &mut self,
        id: RequestId,
        exe: &std::path::Path,
        result: Result<String, upgrade_check::NotHearth>,
    ) {
        let version = match result {
            Err(e) => {
                self.upgrading = false;
                tracing::warn!("upgrade refused: {e}; the running binary carries on");
                let why = format!("not upgrading: {e}; the running binary carries on");
                return self.answer(id, Err(Failure::new(ErrorCode::Busy, why)));
            }
            Ok(_) if self.stopping => {
                self.upgrading = false;
                let why = "shutting down: not upgrading";
                return self.answer(id, Err(Failure::new(ErrorCode::Busy, why)));
            }
            Ok(v) => v,
        };
        let attempt = Attempt {
            id: attempt_id(),
            to_version: version.clone(),
        };
        tracing::info!(
            "upgrade asked: {} answers as hearth {version}; handing every replica over to it (attempt {})",
            exe.display(),
            attempt.id
        );
        let plan = UpgradePlan {
            attempt: attempt.id,
            version,
            binary: exe.display().to_string(),
        };
        self.answer(id, Ok(Response::Upgrading { upgrading: plan }));
        let tx = self.upgrade_due.clone();
        self.tracker.spawn(async move {
            tokio::time::sleep(ANSWER_GRACE).await;
            let _ = tx.send(UpgradeStep::Due(attempt)).await;
        });
    }

    /// Writes the hand-over and replaces this process with the binary on disk. Returns only if
    /// that failed: the old binary then carries on, nothing lost, and status says why.
    fn reexecute(&mut self, attempt: Attempt) {
        self.upgrading = false;
        let Some(reexec) = self.reexec.clone() else {
            return;
        };
        if self.stopping {
            return self.upgrade_failed(&attempt, "a shutdown began before the exec".into());
        }
        let path = ledger::handover_path(&self.node.config().daemon.state_dir);
        let mut saved = Saved::new(self.node.ledger(), self.containment.proofs());
        saved.config = Some(self.running.carried());
        let bytes = serde_json::to_vec(&saved).unwrap_or_default();
        if bytes.len() as u64 > ledger::MAX_BYTES {
            let why = format!(
                "the hand-over would be {} bytes, over the {} a binary reads",
                bytes.len(),
                ledger::MAX_BYTES
            );
            return self.upgrade_failed(&attempt, why);
        }
        if let Err(e) = ledger::write_atomic(&path, &bytes) {
            return self.upgrade_failed(&attempt, format!("writing {}: {e}", path.display()));
        }
        let kept = upgrade::keep_across_exec(self.listener_fd)
            .map_err(|e| format!("keeping the socket open: {e}"))
            .and_then(|()| {
                upgrade::open_own_exe().map_err(|e| format!("opening its own binary: {e}"))
            });
        let own = match kept {
            Ok(fd) => fd,
            Err(why) => {
                let _ = std::fs::remove_file(&path);
                self.close_on_exec_again();
                return self.upgrade_failed(&attempt, why);
            }
        };
        self.notifier.reloading();
        tracing::info!(
            "upgrade: re-executing {} with {} replica(s) handed over",
            reexec.exe.display(),
            self.node.ledger().replicas.len()
        );
        let mut env = vec![
            (upgrade::HANDOVER_ENV, path.display().to_string()),
            (upgrade::LISTEN_FD_ENV, self.listener_fd.to_string()),
            (
                handover::PREVIOUS_EXE_FD_ENV,
                std::os::fd::AsRawFd::as_raw_fd(&own).to_string(),
            ),
            (handover::ATTEMPT_ENV, attempt.env()),
        ];
        env.extend(self.faults.env());
        let err = reexec.exec(&env);
        // Still here: the exec failed. Undo, and keep running the old binary.
        // SAFETY: as in `exec`: nothing else reads these meanwhile.
        unsafe {
            for name in [
                upgrade::HANDOVER_ENV,
                upgrade::LISTEN_FD_ENV,
                handover::PREVIOUS_EXE_FD_ENV,
                handover::ATTEMPT_ENV,
            ]
            .into_iter()
            .chain(Faults::names())
            {
                std::env::remove_var(name);
            }
        }
        drop(own);
        let _ = std::fs::remove_file(&path);
        self.close_on_exec_again();
        let why = format!("exec {}: {err}", reexec.exe.display());
        self.upgrade_failed(&attempt, why);
        let line = self.status_line();
        self.notifier.ready(&line);
    }

    fn close_on_exec_again(&self) {
        // SAFETY: the listener outlives the loop.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.listener_fd) };
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }

    /// The new binary never ran: the old one carries on, and says so in status.
    fn upgrade_failed(&mut self, attempt: &Attempt, why: String) {
        tracing::error!("upgrade failed: {why}; the running binary carries on");
        self.event(Event::Upgraded(UpgradeView {
            attempt: attempt.id,
            outcome: UpgradeOutcome::Failed,
            to_version: attempt.to_version.clone(),
            reason: format!("{why}; the running binary carries on"),
            handed_over: 0,
            kept: 0,
            not_kept: Vec::new(),
        }));
    }

    /// After the adoption, in a binary an upgrade started: what the file on disk is beside the
    /// configuration carried across, how the attempt ended (which replicas kept their process
    /// and role), and the previous binary let go.
    pub(super) fn adopted_handover(&mut self) {
        if let Some(differs) = self.config_differs.take() {
            tracing::warn!(
                "the configuration file {} differs from what runs: {differs}",
                self.running.path.display()
            );
            self.event(Event::ConfigFile {
                differs: Some(differs),
            });
        }
        let Some(incoming) = self.incoming.take() else {
            return;
        };
        if let Some(attempt) = &incoming.attempt {
            let view = self.outcome(attempt, incoming.fell_back.clone());
            match view.outcome {
                UpgradeOutcome::Done if view.not_kept.is_empty() => tracing::info!(
                    "upgrade done: hearth {} runs; {} of {} replica(s) kept their process and role",
                    env!("CARGO_PKG_VERSION"),
                    view.kept,
                    view.handed_over
                ),
                _ => tracing::error!(
                    "upgrade {}: {}; {} of {} replica(s) kept their process and role{}",
                    view.outcome,
                    if view.reason.is_empty() {
                        "replicas lost"
                    } else {
                        &view.reason
                    },
                    view.kept,
                    view.handed_over,
                    if view.not_kept.is_empty() {
                        String::new()
                    } else {
                        format!(" (not: {})", view.not_kept.join("; "))
                    }
                ),
            }
            self.event(Event::Upgraded(view));
        }
        incoming.commit();
    }

    /// Which handed-over replicas run on in the same process and role.
    fn outcome(&self, attempt: &Attempt, fell_back: Option<String>) -> UpgradeView {
        let now = self.node.ledger();
        let mut kept = 0u32;
        let mut not_kept = Vec::new();
        for (id, pid, state) in &self.handed {
            let rec = now.replicas.iter().find(|r| r.replica == *id);
            let lost = match rec {
                // It finished leaving, as it was.
                None if leaving(*state) => None,
                None => Some(format!("{id}: not adopted (see the log)")),
                Some(r) if r.pid != *pid => Some(format!("{id}: pid {pid}, now {}", r.pid)),
                Some(r) if r.state != *state && !leaving(*state) => {
                    Some(format!("{id}: was {state}, now {}", r.state))
                }
                Some(_) => None,
            };
            match lost {
                None => kept += 1,
                Some(why) if not_kept.len() < MAX_NOT_KEPT => not_kept.push(why),
                Some(_) => {}
            }
        }
        let (outcome, reason) = match fell_back {
            Some(why) => (UpgradeOutcome::FellBack, why),
            None => (UpgradeOutcome::Done, String::new()),
        };
        UpgradeView {
            attempt: attempt.id,
            outcome,
            to_version: attempt.to_version.clone(),
            reason,
            handed_over: u32::try_from(self.handed.len()).unwrap_or(u32::MAX),
            kept,
            not_kept,
        }
    }
}

/// A replica that was leaving anyway may have gone on leaving (draining, then stopping).
fn leaving(state: ReplicaState) -> bool {
    matches!(state, ReplicaState::Draining | ReplicaState::Stopping)
}

/// A number no earlier attempt of this host had: the wall clock in nanoseconds.
fn attempt_id() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .max(1)
}
