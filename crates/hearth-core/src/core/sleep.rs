//! Putting a replica to sleep and waking it (`[model.sleep]`, docs/sleep.md): the requests in
//! order, each answered before the next goes; the state request until it says asleep; on
//! waking, the real warm-up after the wake requests. Each phase has its deadline
//! (`sleep_timeout`, `wake_timeout`); a request that fails, or a deadline that passes, stops
//! the replica and says why. A sleeping replica's health is its state request (or its liveness
//! probe), never the warm-up, which would wake it.
//!
//! The requests go out as probes (`ProbeKind::Sleep`, `Wake`, `SleepState`): the shell runs
//! them as it runs warm-ups, with their timeouts and bounded answers.

use std::time::Duration;

use super::event::{Action, LogLevel, ProbeKind, ProbeOutcome, ProbeSpec, Readiness};
use super::node::Node;
use super::probes::{DEFAULT_PROBE_FAILURES, WARMUP_RETRY_LOADING, WARMUP_RETRY_WRONG};
use super::replica::{ReplicaId, ReplicaState};
use super::Time;
use crate::config::sleep::{SleepConfig, SleepRequest};
use crate::units::short_duration;

/// While a replica falls asleep, its state request is asked again this often until it says
/// asleep (a server that falls asleep on its own takes a while).
pub(super) const SLEEP_POLL: Duration = Duration::from_millis(250);
/// The shortest timeout a request gets when its phase's deadline is nearly up.
const LEAST_TIMEOUT: Duration = Duration::from_millis(10);

impl Node {
    fn sleep_config(&self, id: &ReplicaId) -> Option<&SleepConfig> {
        let r = self.held.replicas().get(id)?;
        self.models.get(&r.model)?.config.sleep.as_ref()
    }

    /// The probe for one sleep, wake or state request, within what is left of the phase.
    fn sleep_spec(
        &self,
        id: &ReplicaId,
        req: &SleepRequest,
        expect_body: Option<String>,
        now: Time,
    ) -> Option<ProbeSpec> {
        let r = self.held.replicas().get(id)?;
        let vars = self.placeholders(r);
        let left = r.deadline.map_or(LEAST_TIMEOUT, |d| d.since(now));
        Some(ProbeSpec {
            method: req.method.clone(),
            url: crate::config::expand(&req.url, &vars),
            headers: Vec::new(),
            body: req.body.as_deref().map(|b| crate::config::expand(b, &vars)),
            expect_status: 200,
            // A state request must say 200 and hold its text; sleep and wake requests, any 2xx.
            accept_2xx: expect_body.is_none(),
            expect_body,
            timeout: left.max(LEAST_TIMEOUT),
            verify_owner: false,
        })
    }

    /// Puts a replica that serves nothing (warm, or drained) to sleep.
    pub(super) fn begin_sleep(
        &mut self,
        id: &ReplicaId,
        why: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(timeout) = self.sleep_config(id).map(|s| s.sleep_timeout) else {
            return;
        };
        if let Err(full) = self.host_room_for(id) {
            // A drained replica serves nothing and is out of the routed set: it stops, as a
            // drain without a sleeping tier ends. A warm one stays in the pool.
            let drained = self
                .held
                .replicas()
                .get(id)
                .is_some_and(|r| r.state == ReplicaState::Draining);
            let full = full.to_string();
            if drained {
                self.stop(id, &full, false, now, out);
            } else if let Some(r) = self.held.replicas_mut().get_mut(id) {
                r.reason = full.into();
            }
            return;
        }
        if self.enter_phase(id, ReplicaState::FallingAsleep, timeout, why, now, out) {
            if let Some(r) = self.held.replicas_mut().get_mut(id) {
                r.then_sleep = false;
            }
            self.log_replica(id, format!("falling asleep: {why}"), out);
            self.sleep_next(id, Duration::ZERO, now, out);
        }
    }

    /// The start of falling asleep or waking: the state, its first request, its deadline and
    /// reason. False: no such replica.
    fn enter_phase(
        &mut self,
        id: &ReplicaId,
        state: ReplicaState,
        timeout: Duration,
        why: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) -> bool {
        if !self.held.replicas().contains_key(id) {
            return false;
        }
        self.set_state(id, state, now, out);
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return false;
        };
        r.sleep_step = 0;
        r.deadline = Some(now + timeout);
        r.reason = why.into();
        true
    }

    fn log_replica(&self, id: &ReplicaId, line: String, out: &mut Vec<Action>) {
        if let Some(r) = self.held.replicas().get(id) {
            self.log(LogLevel::Info, &r.model, Some(id), line, out);
        }
    }

    /// A replica's warm-up recheck interval: when a woken or sleeping one is next looked at.
    fn recheck_of(&self, id: &ReplicaId) -> Duration {
        self.held
            .replicas()
            .get(id)
            .and_then(|r| {
                let m = self.models.get(&r.model)?;
                Some(m.config_of(&r.spec).launch.warmup.recheck)
            })
            .unwrap_or_default()
    }

    /// The next sleep request, or the state request once they are all answered, or asleep.
    fn sleep_next(&mut self, id: &ReplicaId, after: Duration, now: Time, out: &mut Vec<Action>) {
        let Some(s) = self.sleep_config(id) else {
            return;
        };
        let step = self.held.replicas().get(id).map_or(0, |r| r.sleep_step);
        if let Some(req) = s.sleep.get(step).cloned() {
            if let Some(spec) = self.sleep_spec(id, &req, None, now) {
                self.send_probe(id, ProbeKind::Sleep, after, spec, out);
            }
        } else if let Some(st) = s.state.clone() {
            if let Some(spec) = self.sleep_spec(id, &st.request, Some(st.asleep), now) {
                self.send_probe(id, ProbeKind::SleepState, after, spec, out);
            }
        } else {
            self.asleep(id, now, out);
        }
    }

    fn asleep(&mut self, id: &ReplicaId, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let (model, took) = (r.model.clone(), now.since(r.since));
        let recheck = self.recheck_of(id);
        self.set_state(id, ReplicaState::Sleeping, now, out);
        self.shrink_asleep(id);
        if let Some(r) = self.held.replicas_mut().get_mut(id) {
            r.next_probe = now + recheck;
            // Asleep, it has given way: the model it slept for may now wake or start.
            r.reclaimed_for = None;
        }
        self.log(
            LogLevel::Info,
            &model,
            Some(id),
            format!("asleep after {}", short_duration(took)),
            out,
        );
    }

    /// Wakes a sleeping replica: the wake requests, then the warm-up. Without room on its
    /// devices it waits asleep; `reclaim` (a wake for the routed set, not for the pool): other
    /// models' idle replicas there are put to sleep for it (reclaim.rs).
    pub(super) fn begin_wake(
        &mut self,
        id: &ReplicaId,
        why: &str,
        reclaim: bool,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(timeout) = self.sleep_config(id).map(|s| s.wake_timeout) else {
            return;
        };
        if let Err(no_room) = self.grow_to_wake(id) {
            let devices = self
                .held
                .replicas()
                .get(id)
                .map(|r| r.gpus.clone())
                .unwrap_or_default();
            let need = super::reclaim::Need::Wake {
                devices: &devices,
                more: no_room.needs,
            };
            let why = match reclaim.then(|| self.reclaim_for(id, need, now, out)) {
                Some(Some(v)) => {
                    if let Some(r) = self.held.replicas_mut().get_mut(id) {
                        r.no_room_since = None;
                    }
                    format!("{no_room}; {v} gives way")
                }
                Some(None) => {
                    if self.stuck_asleep(id, &no_room, now, out) {
                        return;
                    }
                    no_room.to_string()
                }
                None => no_room.to_string(),
            };
            if let Some(r) = self.held.replicas_mut().get_mut(id) {
                r.reason = why.into();
            }
            return;
        }
        if let Some(r) = self.held.replicas_mut().get_mut(id) {
            r.no_room_since = None;
        }
        if self.enter_phase(id, ReplicaState::Waking, timeout, why, now, out) {
            if let Some(r) = self.held.replicas_mut().get_mut(id) {
                r.wake_started = Some(now);
            }
            self.log_replica(id, format!("waking: {why}"), out);
            self.wake_next(id, Duration::ZERO, now, out);
        }
    }

    /// A wake for the routed set that finds no room on the replica's devices, and nothing
    /// there that may give way (pinned or higher-priority models, work in flight): it waits
    /// asleep, but no longer than a cold start would take (the model's last, else its
    /// `startup_timeout`). Past that the wait costs more than a cold start, which may find
    /// room on other devices: the replica is stopped (not a failure) and the reconciler starts
    /// one in its place. True: stopped.
    fn stuck_asleep(
        &mut self,
        id: &ReplicaId,
        no_room: &super::sleep_room::NoRoomToWake,
        now: Time,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(r) = self.held.replicas().get(id) else {
            return false;
        };
        let Some(m) = self.models.get(&r.model) else {
            return false;
        };
        let cold = m
            .time_to_ready
            .unwrap_or(m.config_of(&r.spec).launch.warmup.startup_timeout);
        let since = r.no_room_since.unwrap_or(now);
        if now.since(since) < cold {
            if let Some(r) = self.held.replicas_mut().get_mut(id) {
                r.no_room_since = Some(since);
            }
            return false;
        }
        let why = format!(
            "{no_room} for {}, longer than a cold start ({}): replaced by a start where there \
             is room",
            short_duration(now.since(since)),
            short_duration(cold)
        );
        self.stop(id, &why, false, now, out);
        true
    }

    /// The next wake request, or the warm-up once they are all answered.
    fn wake_next(&mut self, id: &ReplicaId, after: Duration, now: Time, out: &mut Vec<Action>) {
        let Some(s) = self.sleep_config(id) else {
            return;
        };
        let step = self.held.replicas().get(id).map_or(0, |r| r.sleep_step);
        if let Some(req) = s.wake.get(step).cloned() {
            if let Some(spec) = self.sleep_spec(id, &req, None, now) {
                self.send_probe(id, ProbeKind::Wake, after, spec, out);
            }
        } else if let Some(spec) = self.probe_spec(id, ProbeKind::Warmup) {
            self.send_probe(id, ProbeKind::Warmup, after, spec, out);
        }
    }

    /// A probe answer that belongs to sleeping or waking; false: not one (probes.rs has it).
    pub(super) fn sleep_probed(
        &mut self,
        id: &ReplicaId,
        kind: ProbeKind,
        o: &ProbeOutcome,
        now: Time,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(r) = self.held.replicas().get(id) else {
            return false;
        };
        let (state, step) = (r.state, r.sleep_step);
        match (kind, state) {
            (ProbeKind::Sleep, ReplicaState::FallingAsleep) => {
                if o.ok {
                    self.next_step(id);
                    self.sleep_next(id, Duration::ZERO, now, out);
                } else {
                    let url = self.step_url(id, step, true);
                    let why = format!("sleep request {} ({url}) failed: {}", step + 1, o.detail);
                    self.fail(id, &why, now, out);
                }
            }
            (ProbeKind::SleepState, ReplicaState::FallingAsleep) => {
                if o.ok {
                    self.asleep(id, now, out);
                } else {
                    if let Some(r) = self.held.replicas_mut().get_mut(id) {
                        r.last_probe_error = o.detail.clone();
                    }
                    self.sleep_next(id, SLEEP_POLL, now, out);
                }
            }
            (ProbeKind::Wake, ReplicaState::Waking) => {
                if o.ok {
                    self.next_step(id);
                    self.wake_next(id, Duration::ZERO, now, out);
                } else {
                    let url = self.step_url(id, step, false);
                    let why = format!("wake request {} ({url}) failed: {}", step + 1, o.detail);
                    self.wake_failed(id, &why, now, out);
                }
            }
            (ProbeKind::Warmup, ReplicaState::Waking) => {
                if o.ok {
                    self.woken(id, now, out);
                } else {
                    if let Some(r) = self.held.replicas_mut().get_mut(id) {
                        r.last_probe_error = o.detail.clone();
                        r.reason = format!("waking: warm-up: {}", o.detail).into();
                    }
                    let after = if o.not_ready {
                        WARMUP_RETRY_LOADING
                    } else {
                        WARMUP_RETRY_WRONG
                    };
                    self.wake_next(id, after, now, out);
                }
            }
            (ProbeKind::SleepState | ProbeKind::Liveness, ReplicaState::Sleeping) => {
                self.sleeping_checked(id, kind, o, now, out);
            }
            (ProbeKind::Sleep | ProbeKind::Wake | ProbeKind::SleepState, _) => {
                // A late answer for a replica that has moved on.
            }
            _ => return false,
        }
        true
    }

    fn next_step(&mut self, id: &ReplicaId) {
        if let Some(r) = self.held.replicas_mut().get_mut(id) {
            r.sleep_step += 1;
            r.last_probe_error.clear();
        }
    }

    fn step_url(&self, id: &ReplicaId, step: usize, sleeping: bool) -> String {
        let Some(s) = self.sleep_config(id) else {
            return String::new();
        };
        let list = if sleeping { &s.sleep } else { &s.wake };
        list.get(step)
            .map(|q| format!("{} {}", q.method, q.url))
            .unwrap_or_default()
    }

    fn woken(&mut self, id: &ReplicaId, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let model = r.model.clone();
        let took = now.since(r.wake_started.unwrap_or(r.since));
        let recheck = self.recheck_of(id);
        self.set_state(id, ReplicaState::Warm, now, out);
        if let Some(r) = self.held.replicas_mut().get_mut(id) {
            r.next_probe = now + recheck;
            r.wake_started = None;
            r.last_probe_error.clear();
        }
        if let Some(m) = self.models.get_mut(&model) {
            m.wakes.record(took);
        }
        self.log(
            LogLevel::Info,
            &model,
            Some(id),
            format!("awake and warm after {}", short_duration(took)),
            out,
        );
        out.push(Action::Ready {
            model,
            replica: id.clone(),
            how: Readiness::Woken(took),
        });
    }

    fn wake_failed(&mut self, id: &ReplicaId, why: &str, now: Time, out: &mut Vec<Action>) {
        if let Some(m) = self
            .held
            .replicas()
            .get(id)
            .map(|r| r.model.clone())
            .and_then(|name| self.models.get_mut(&name))
        {
            m.wakes.failed += 1;
        }
        self.fail(id, why, now, out);
    }

    /// A sleeping replica's health check came back: `failures` misses in a row replace it.
    fn sleeping_checked(
        &mut self,
        id: &ReplicaId,
        kind: ProbeKind,
        o: &ProbeOutcome,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let threshold = self
            .models
            .get(&r.model)
            .and_then(|m| m.config.liveness.as_ref())
            .map_or(DEFAULT_PROBE_FAILURES, |l| l.failures);
        let model = r.model.clone();
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        if o.ok {
            r.probe_failures = 0;
            r.last_probe_error.clear();
            return;
        }
        r.probe_failures += 1;
        r.last_probe_error = o.detail.clone();
        let n = r.probe_failures;
        let what = if kind == ProbeKind::SleepState {
            "asleep, but its state request"
        } else {
            "asleep, but its liveness probe"
        };
        if n >= threshold {
            let why = format!("{what} failed {n} times in a row: {}", o.detail);
            self.fail(id, &why, now, out);
        } else {
            self.log(
                LogLevel::Warn,
                &model,
                Some(id),
                format!("{what} failed ({n}/{threshold}): {}", o.detail),
                out,
            );
        }
    }

    /// The tick's part for a replica falling asleep, asleep, or waking: its deadline, or its
    /// health check when due.
    pub(super) fn sleep_tick(&mut self, id: &ReplicaId, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        let Some(m) = self.models.get(&r.model) else {
            return;
        };
        let late = r.deadline.is_some_and(|d| now >= d);
        let last = if r.last_probe_error.is_empty() {
            "no answer".to_string()
        } else {
            r.last_probe_error.clone()
        };
        match r.state {
            ReplicaState::FallingAsleep if late => {
                let limit = m.config.sleep.as_ref().map(|s| s.sleep_timeout);
                let why = format!(
                    "did not fall asleep within sleep_timeout ({}); last: {last}",
                    limit.map(short_duration).unwrap_or_default()
                );
                self.fail(id, &why, now, out);
            }
            ReplicaState::Waking if late => {
                let limit = m.config.sleep.as_ref().map(|s| s.wake_timeout);
                let why = format!(
                    "did not wake and pass its warm-up within wake_timeout ({}); last: {last}",
                    limit.map(short_duration).unwrap_or_default()
                );
                self.wake_failed(id, &why, now, out);
            }
            ReplicaState::Sleeping if !r.probe_in_flight && now >= r.next_probe => {
                let recheck = m.config_of(&r.spec).launch.warmup.recheck;
                let state = m.config.sleep.as_ref().and_then(|s| s.state.clone());
                let liveness = m.config.liveness.as_ref().map(|l| l.interval);
                let (kind, spec, every) = match (state, liveness) {
                    (Some(st), _) => {
                        let spec = self.sleep_spec(id, &st.request, Some(st.asleep), now);
                        // No phase deadline while asleep: the warm-up's timeout bounds it.
                        let timeout = self.warmup_timeout(id);
                        let spec = spec.map(|s| ProbeSpec { timeout, ..s });
                        (ProbeKind::SleepState, spec, recheck)
                    }
                    (None, Some(every)) => (
                        ProbeKind::Liveness,
                        self.probe_spec(id, ProbeKind::Liveness),
                        every,
                    ),
                    (None, None) => return,
                };
                let Some(spec) = spec else {
                    return;
                };
                if let Some(r) = self.held.replicas_mut().get_mut(id) {
                    r.next_probe = now + every;
                }
                self.send_probe(id, kind, Duration::ZERO, spec, out);
            }
            _ => {}
        }
    }

    fn warmup_timeout(&self, id: &ReplicaId) -> Duration {
        self.held
            .replicas()
            .get(id)
            .and_then(|r| {
                let m = self.models.get(&r.model)?;
                Some(m.config_of(&r.spec).launch.warmup.timeout)
            })
            .unwrap_or(LEAST_TIMEOUT)
    }
}
