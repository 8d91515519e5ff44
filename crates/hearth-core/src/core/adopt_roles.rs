//! What adoption does with each replica it takes back or turns away (adopt.rs decides which):
//! handed-over replicas resume their roles, adopted routed ones are re-verified in place, and
//! the ones turned away leave, drained first when they were serving.

use std::time::Duration;

use super::adopt::{ReplicaRecord, REVERIFYING};
use super::event::{Action, LogLevel, ProbeKind, ProbeOutcome, StopSignal};
use super::lifecycle::{ORPHAN_DRAIN, ORPHAN_STOP_GRACE};
use super::node::Node;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::reservations::PortClaim;
use super::Time;
use crate::units::short_duration;

impl Node {
    /// A recorded replica that is not adopted leaves. One that was serving (routed, or
    /// draining) drains first, as any routed replica leaves: it is out of the routed set from
    /// the start, and its in-flight work finishes within the model's `drain_timeout` (a minute
    /// when its model is no longer configured). The others are stopped at once.
    pub(super) fn refuse(
        &mut self,
        mut r: Replica,
        rec: &ReplicaRecord,
        why: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let id = r.id.clone();
        // Its process holds the port, in the range or not: booked until it exits (unless
        // another record claimed it first): `PortClaim::Held`.
        let model = self.models.get(&rec.model);
        let serving = matches!(rec.state, ReplicaState::Routed | ReplicaState::Draining);
        if serving {
            let drain = model.map_or(ORPHAN_DRAIN, |m| m.config.scaling.drain_timeout);
            r.state = ReplicaState::Draining;
            r.deadline = Some(now + drain);
            r.reason = format!("not adopted: {why}; draining before it stops").into();
            self.take_back(r, rec, PortClaim::Held(rec.port));
            self.publish_state(&id, out);
            self.log(
                LogLevel::Warn,
                &rec.model,
                Some(&id),
                format!(
                    "not adopted (pid {}, port {}, was {}): {why}; draining it first (its work in flight finishes, within {})",
                    rec.pid,
                    rec.port,
                    rec.state,
                    short_duration(drain)
                ),
                out,
            );
            return;
        }
        let grace = model.map_or(ORPHAN_STOP_GRACE, |m| m.config.stop_grace);
        r.state = ReplicaState::Stopping;
        r.deadline = Some(now + grace);
        r.reason = format!("not adopted: {why}").into();
        self.take_back(r, rec, PortClaim::Held(rec.port));
        out.push(Action::Signal {
            replica: id.clone(),
            pid: rec.pid,
            signal: StopSignal::Term,
        });
        self.publish_state(&id, out);
        self.log(
            LogLevel::Warn,
            &rec.model,
            Some(&id),
            format!(
                "not adopted (pid {}, port {}): {why}; stopping it",
                rec.pid, rec.port
            ),
            out,
        );
    }

    /// An adopted replica picks up where the previous run left it: a handed-over one in any
    /// role, a found one that was draining goes on draining.
    pub(super) fn resume(
        &mut self,
        id: &ReplicaId,
        state: ReplicaState,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let Some(m) = self.models.get(&r.model) else {
            return;
        };
        let (drain, grace) = (m.config.scaling.drain_timeout, m.config.stop_grace);
        match state {
            ReplicaState::Starting => self.send_warmup(id, out),
            ReplicaState::Draining => {
                if let Some(r) = self.held.replicas_mut().get_mut(id) {
                    r.deadline = Some(now + drain);
                    r.reason = "draining (adopted while it drained)".into();
                }
            }
            ReplicaState::Stopping => {
                if let Some(r) = self.held.replicas_mut().get_mut(id) {
                    r.deadline = Some(now + grace);
                    r.reason = "stopping (handed over)".into();
                    if let Some(pid) = r.pid {
                        out.push(Action::Signal {
                            replica: id.clone(),
                            pid,
                            signal: StopSignal::Term,
                        });
                    }
                }
            }
            ReplicaState::Pending
            | ReplicaState::Warm
            | ReplicaState::Routed
            | ReplicaState::FallingAsleep
            | ReplicaState::Sleeping
            | ReplicaState::Waking => {}
        }
    }

    /// The warm-up of an adopted replica that kept its place (routed, or back in the pool
    /// since) came back. Passed: nothing changes but the reason. Not answered or still
    /// loading (a busy server answers late): again, and it keeps its place meanwhile. A wrong
    /// answer, or an answer from another process than the replica's: it leaves, drained if
    /// routed (its work in flight was sent to it while it kept its place).
    pub(super) fn reverified(
        &mut self,
        id: &ReplicaId,
        o: ProbeOutcome,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        if o.ok {
            r.reverifying = false;
            r.ever_warm = true;
            r.last_probe_error.clear();
            r.reason = Default::default();
            r.next_probe = now;
            let how = if r.state == ReplicaState::Routed {
                "it kept its place throughout"
            } else {
                "back in the pool"
            };
            let model = r.model.clone();
            self.log(
                LogLevel::Info,
                &model,
                Some(id),
                format!("adopted: warm-up passed; {how}"),
                out,
            );
            return;
        }
        r.last_probe_error = o.detail.clone();
        if o.not_ready {
            r.reason = format!("{REVERIFYING}; last attempt: {}", o.detail).into();
            self.send_warmup_after(id, super::probes::WARMUP_RETRY_LOADING, out);
            return;
        }
        let why = format!("adopted, but its warm-up failed: {}", o.detail);
        self.leave_unverified(id, &why, now, out);
    }

    /// An adopted replica that kept its place and did not pass its warm-up within the model's
    /// `startup_timeout` since it was adopted leaves (see `reverified`).
    pub(super) fn reverify_deadline(&mut self, id: &ReplicaId, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let Some(m) = self.models.get(&r.model) else {
            return;
        };
        let limit = m.config_of(&r.spec).launch.warmup.startup_timeout;
        if r.spawned_at.is_none_or(|at| now.since(at) <= limit) {
            return;
        }
        let last = if r.last_probe_error.is_empty() {
            "no answer".to_string()
        } else {
            r.last_probe_error.clone()
        };
        let why = format!(
            "adopted, but its warm-up did not pass within {}; last attempt: {last}",
            short_duration(limit)
        );
        self.leave_unverified(id, &why, now, out);
    }

    /// Out of the routed set: drained when routed, stopped when warm. Not a failure of the
    /// model: it served before.
    fn leave_unverified(&mut self, id: &ReplicaId, why: &str, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        r.reverifying = false;
        match r.state {
            ReplicaState::Routed => self.begin_drain(id, why, now, out),
            ReplicaState::Draining | ReplicaState::Stopping => {}
            _ => self.stop(id, why, false, now, out),
        }
    }

    pub(super) fn send_warmup(&mut self, id: &ReplicaId, out: &mut Vec<Action>) {
        self.send_warmup_after(id, Duration::ZERO, out);
    }

    fn send_warmup_after(&mut self, id: &ReplicaId, after: Duration, out: &mut Vec<Action>) {
        if let Some(spec) = self.probe_spec(id, ProbeKind::Warmup) {
            self.send_probe(id, ProbeKind::Warmup, after, spec, out);
        }
    }

    pub(super) fn publish_state(&self, id: &ReplicaId, out: &mut Vec<Action>) {
        if let Some(r) = self.held.replicas().get(id) {
            out.push(Action::Publish(crate::protocol::WatchEvent::Replica {
                model: r.model.clone(),
                replica: id.0.clone(),
                state: r.state.into(),
            }));
        }
    }
}
