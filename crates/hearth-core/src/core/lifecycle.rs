//! Replica lifecycle transitions: spawn results, exits, failures, drains, stops, deadlines.

use std::sync::Arc;
use std::time::Duration;

use super::event::{Action, LogLevel, ProbeKind, StopSignal};
use super::node::{Node, ShutdownState};
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::Time;
use crate::protocol::{WatchEvent, WatchedState};
use crate::units::short_duration as fmt_dur;

/// `stop_grace` for a replica whose model is no longer configured (an earlier run's).
pub(super) const ORPHAN_STOP_GRACE: Duration = Duration::from_secs(10);
/// `drain_timeout` for a replica whose model is no longer configured and that was routed when
/// the earlier run ended: its reports are refused (no such model), so the drain ends here.
pub(super) const ORPHAN_DRAIN: Duration = Duration::from_secs(60);

impl Node {
    pub(super) fn tick(&mut self, now: Time, out: &mut Vec<Action>) {
        // Only replicas with something due: what makes one due is its own state, which
        // handling another replica does not change (a walk copying every id was most of a
        // tick with a thousand replicas).
        let ids: Vec<ReplicaId> = self
            .held
            .replicas()
            .values()
            .filter(|r| tick_may_act(r, now))
            .map(|r| r.id.clone())
            .collect();
        for id in ids {
            let Some(r) = self.held.replicas().get(&id) else {
                continue;
            };
            // Draining and stopping need no model: an earlier run's replica whose model is no
            // longer configured leaves like any other.
            let model = self.models.get(&r.model);
            let m = match (r.state, model) {
                (ReplicaState::Draining | ReplicaState::Stopping, _) => None,
                (_, Some(m)) => Some(m),
                (_, None) => continue,
            };
            match (r.state, m) {
                (ReplicaState::Warm | ReplicaState::Routed, _) if r.reverifying => {
                    self.reverify_deadline(&id, now, out);
                }
                (
                    ReplicaState::FallingAsleep | ReplicaState::Sleeping | ReplicaState::Waking,
                    Some(_),
                ) => self.sleep_tick(&id, now, out),
                (ReplicaState::Starting, Some(m)) => {
                    let limit = m.config_of(&r.spec).launch.warmup.startup_timeout;
                    if let Some(at) = r.spawned_at.filter(|at| now.since(*at) > limit) {
                        let _ = at;
                        let last = if r.last_probe_error.is_empty() {
                            "no answer".to_string()
                        } else {
                            r.last_probe_error.clone()
                        };
                        let why = format!(
                            "warm-up did not pass within {}; last attempt: {last}",
                            fmt_dur(limit)
                        );
                        self.fail(&id, &why, now, out);
                    }
                }
                (ReplicaState::Warm | ReplicaState::Routed, Some(m)) => {
                    let kind = if r.state == ReplicaState::Warm {
                        ProbeKind::Recheck
                    } else {
                        ProbeKind::Liveness
                    };
                    let wanted = kind == ProbeKind::Recheck || m.config.liveness.is_some();
                    // Start to start: the cadence does not stretch by the probe's own time.
                    let interval = match (kind, &m.config.liveness) {
                        (ProbeKind::Liveness, Some(l)) => l.interval,
                        _ => m.config_of(&r.spec).launch.warmup.recheck,
                    };
                    if wanted && !r.probe_in_flight && now >= r.next_probe {
                        if let Some(spec) = self.probe_spec(&id, kind) {
                            let Some(r) = self.held.replicas_mut().get_mut(&id) else {
                                continue;
                            };
                            r.probe_in_flight = true;
                            r.next_probe = now + interval;
                            out.push(Action::Probe {
                                replica: id.clone(),
                                kind,
                                after: Default::default(),
                                spec,
                            });
                        }
                    }
                }
                (ReplicaState::Draining, _) if r.deadline.is_some_and(|d| now >= d) => {
                    self.stop(
                        &id,
                        "drain timeout: stopping with work possibly in flight",
                        false,
                        now,
                        out,
                    );
                }
                (ReplicaState::Stopping, _)
                    if !r.killed && r.deadline.is_some_and(|d| now >= d) =>
                {
                    if let Some(pid) = r.pid {
                        let Some(r) = self.held.replicas_mut().get_mut(&id) else {
                            continue;
                        };
                        r.killed = true;
                        out.push(Action::Signal {
                            replica: id.clone(),
                            pid,
                            signal: StopSignal::Kill,
                        });
                        let model = r.model.clone();
                        self.log(
                            LogLevel::Warn,
                            &model,
                            Some(&id),
                            "did not stop within stop_grace: SIGKILL".into(),
                            out,
                        );
                    }
                }
                _ => {}
            }
        }
        self.held.expire_busy_ports(now);
        // Failures age out of the window even when no new one comes: crash_loop clears by itself.
        for m in self.models.values_mut() {
            m.recent_failures(now);
        }
        self.schedule_scrapes(now, out);
        self.front_doors_tick(now, out);
        let names: Vec<String> = self.models.keys().cloned().collect();
        for name in names {
            self.autoscale(&name, now, out);
        }
        if let Some(sd) = &self.shutdown {
            if now >= sd.deadline {
                self.kill_all(out);
            }
        }
    }

    pub(super) fn spawned(&mut self, id: &ReplicaId, pid: u32, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        // A replica is one process for its whole life: what its warm-up proved is about that
        // process. A second spawn report (which the supervisor never sends) does not replace it.
        if let Some(first) = r.pid.filter(|p| *p != pid) {
            let model = r.model.clone();
            self.log(
                LogLevel::Warn,
                &model,
                Some(id),
                format!("a second process (pid {pid}) reported for it: ignored, it is pid {first}"),
                out,
            );
            return;
        }
        r.pid = Some(pid);
        match r.state {
            ReplicaState::Starting => {
                if let Some(spec) = self.probe_spec(id, ProbeKind::Warmup) {
                    let after = super::probes::WARMUP_RETRY_LOADING;
                    self.send_probe(id, ProbeKind::Warmup, after, spec, out);
                }
            }
            // Asked to stop before the process existed: now it can be told.
            ReplicaState::Stopping => {
                let signal = if r.killed {
                    StopSignal::Kill
                } else {
                    StopSignal::Term
                };
                out.push(Action::Signal {
                    replica: id.clone(),
                    pid,
                    signal,
                });
            }
            _ => {}
        }
        let _ = now;
    }

    /// The process is gone (exited, or never started). Frees its port and GPUs.
    pub(super) fn process_gone(
        &mut self,
        id: &ReplicaId,
        what: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let state = r.state;
        let model = r.model.clone();
        match state {
            ReplicaState::Stopping | ReplicaState::Draining => {
                self.log(
                    LogLevel::Info,
                    &model,
                    Some(id),
                    format!("stopped: {what}"),
                    out,
                );
            }
            _ => {
                let why = format!("{state} replica {what}");
                self.record_failure(&model, id, &why, now, out);
            }
        }
        self.forget(id, what, out);
        self.check_shutdown_complete(out);
    }

    /// Removes a replica from the books, releasing what it held.
    pub(super) fn forget(&mut self, id: &ReplicaId, why: &str, out: &mut Vec<Action>) {
        let Some(r) = self.held.release(id) else {
            return;
        };
        let _ = why;
        out.push(Action::Publish(WatchEvent::Replica {
            model: r.model.clone(),
            replica: id.0.clone(),
            state: WatchedState::GONE,
        }));
        if let Some(m) = self.models.get(&r.model) {
            if m.removed && !self.held.replicas().has_model(&r.model) {
                let name = r.model.clone();
                self.models.remove(&name);
                self.log_global(LogLevel::Info, format!("model {name} removed"), out);
            }
        }
    }

    fn record_failure(
        &mut self,
        model: &str,
        id: &ReplicaId,
        why: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        if let Some(r) = self.held.replicas().get(id) {
            let (spec, ever_warm) = (Arc::clone(&r.spec), r.ever_warm);
            self.rollout_failure(model, &spec, ever_warm, why, out);
        }
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let backoff = m.record_failure(now, why);
        let crash = m.crash_looping();
        let n = m.failures.len();
        let level = if crash {
            LogLevel::Error
        } else {
            LogLevel::Warn
        };
        let msg = format!(
            "failed: {why}; next start in {} ({n} failure(s) in 10 min{})",
            fmt_dur(backoff),
            if crash { ", crash loop" } else { "" }
        );
        self.log(level, model, Some(id), msg, out);
    }

    /// A replica failed (probe, timeout): stop it, count the failure; the reconciler replaces it.
    pub(super) fn fail(&mut self, id: &ReplicaId, why: &str, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let model = r.model.clone();
        self.record_failure(&model, id, why, now, out);
        self.stop(id, why, true, now, out);
    }

    /// Unroutes a replica and lets its in-flight work finish before it stops.
    pub(super) fn begin_drain(
        &mut self,
        id: &ReplicaId,
        why: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let (drain, grace) = self
            .models
            .get(&r.model)
            .map_or((ORPHAN_DRAIN, ORPHAN_STOP_GRACE), |m| {
                (m.config.scaling.drain_timeout, m.config.stop_grace)
            });
        let mut deadline = now + drain;
        if let Some(sd) = &self.shutdown {
            deadline = deadline.min(sd.deadline - grace);
        }
        let model = r.model.clone();
        self.set_state(id, ReplicaState::Draining, now, out);
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        r.deadline = Some(deadline);
        r.reason = why.into();
        self.log(
            LogLevel::Info,
            &model,
            Some(id),
            format!("draining: {why}"),
            out,
        );
    }

    /// Asks the process to stop (SIGTERM, then SIGKILL after `stop_grace`). A pending replica,
    /// which has no process, is simply forgotten.
    pub(super) fn stop(
        &mut self,
        id: &ReplicaId,
        why: &str,
        failed: bool,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        if r.state == ReplicaState::Stopping {
            return;
        }
        if r.state == ReplicaState::Pending {
            self.forget(id, why, out);
            return;
        }
        let grace = self
            .models
            .get(&r.model)
            .map_or(ORPHAN_STOP_GRACE, |m| m.config.stop_grace);
        let mut deadline = now + grace;
        if let Some(sd) = &self.shutdown {
            deadline = deadline.min(sd.deadline);
        }
        let model = r.model.clone();
        self.set_state(id, ReplicaState::Stopping, now, out);
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        r.deadline = Some(deadline);
        r.reason = why.into();
        r.failed = failed;
        if let Some(pid) = r.pid {
            out.push(Action::Signal {
                replica: id.clone(),
                pid,
                signal: StopSignal::Term,
            });
        }
        self.log(
            LogLevel::Info,
            &model,
            Some(id),
            format!("stopping: {why}"),
            out,
        );
    }

    pub(super) fn set_state(
        &mut self,
        id: &ReplicaId,
        state: ReplicaState,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        if r.state == state {
            return;
        }
        r.state = state;
        r.since = now;
        r.since_event = self.events;
        if matches!(state, ReplicaState::Warm | ReplicaState::Routed) {
            // A replica got ready: the model's tries succeed again.
            if let Some(m) = self.models.get_mut(&r.model) {
                m.stalled = None;
            }
        }
        r.probe_failures = 0;
        r.deadline = None;
        if state != ReplicaState::Pending {
            r.reason = Default::default();
        }
        out.push(Action::Publish(WatchEvent::Replica {
            model: r.model.clone(),
            replica: id.0.clone(),
            state: state.into(),
        }));
    }

    pub(super) fn begin_shutdown(&mut self, immediate: bool, now: Time, out: &mut Vec<Action>) {
        if self.shutdown.is_none() {
            let deadline = now + self.config.daemon.shutdown_timeout;
            self.shutdown = Some(ShutdownState { deadline });
            self.refuse_reloads(out);
            self.log_global(
                LogLevel::Info,
                format!(
                    "shutting down: draining, then stopping every replica within {}",
                    fmt_dur(self.config.daemon.shutdown_timeout)
                ),
                out,
            );
        }
        if immediate {
            self.log_global(
                LogLevel::Warn,
                "second stop signal: killing every replica now".into(),
                out,
            );
            self.kill_all(out);
        }
        self.check_shutdown_complete(out);
    }

    fn kill_all(&mut self, out: &mut Vec<Action>) {
        let ids: Vec<ReplicaId> = self.held.replicas().keys().cloned().collect();
        for id in ids {
            let Some(r) = self.held.replicas_mut().get_mut(&id) else {
                continue;
            };
            if r.state == ReplicaState::Pending {
                self.forget(&id, "shutdown", out);
                continue;
            }
            if r.killed {
                continue;
            }
            r.killed = true;
            r.state = ReplicaState::Stopping;
            if let Some(pid) = r.pid {
                out.push(Action::Signal {
                    replica: id.clone(),
                    pid,
                    signal: StopSignal::Kill,
                });
            }
        }
        self.check_shutdown_complete(out);
    }

    pub(super) fn check_shutdown_complete(&mut self, out: &mut Vec<Action>) {
        if self.shutdown.is_some() && self.held.replicas().is_empty() && !self.shutdown_reported {
            self.shutdown_reported = true;
            out.push(Action::ShutdownComplete);
        }
    }

    pub(super) fn log_global(&self, level: LogLevel, message: String, out: &mut Vec<Action>) {
        out.push(Action::Log {
            level,
            model: None,
            replica: None,
            message,
        });
    }
}

/// The tick may have something to do for `r` now: a superset of the replicas its walk acts on
/// (it checks each again in full).
fn tick_may_act(r: &Replica, now: Time) -> bool {
    match r.state {
        ReplicaState::Pending => false,
        ReplicaState::Starting => true,
        ReplicaState::Warm | ReplicaState::Routed => {
            r.reverifying || (!r.probe_in_flight && now >= r.next_probe)
        }
        ReplicaState::Draining => r.deadline.is_some_and(|d| now >= d),
        ReplicaState::Stopping => !r.killed && r.deadline.is_some_and(|d| now >= d),
        ReplicaState::FallingAsleep | ReplicaState::Waking => r.deadline.is_some_and(|d| now >= d),
        ReplicaState::Sleeping => !r.probe_in_flight && now >= r.next_probe,
    }
}
