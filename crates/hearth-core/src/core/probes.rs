//! Probe results: a warm-up that passes makes a replica warm; rechecks and liveness probes
//! that keep failing replace it.

use std::time::Duration;

use super::event::{Action, LogLevel, ProbeKind, ProbeOutcome, ProbeSpec, Readiness};
use super::node::Node;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::Time;
use crate::units::short_duration;

/// A starting replica that refused the connection or answered 503 is still loading: try again
/// soon, so that readiness is noticed within tens of milliseconds.
pub(super) const WARMUP_RETRY_LOADING: Duration = Duration::from_millis(50);
/// A replica that answered the warm-up wrongly: try again, but don't hammer a real model.
pub(super) const WARMUP_RETRY_WRONG: Duration = Duration::from_secs(1);
/// A warm replica whose recheck failed is rechecked this soon.
pub(super) const RECHECK_RETRY: Duration = Duration::from_secs(1);
/// Rechecks that fail in a row before a warm replica is replaced, when no liveness section says.
pub(super) const DEFAULT_PROBE_FAILURES: u32 = 3;

impl Node {
    // ---- probes ------------------------------------------------------------------------------

    pub(super) fn probed(
        &mut self,
        id: &ReplicaId,
        kind: ProbeKind,
        o: ProbeOutcome,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        r.probe_in_flight = false;
        if kind == ProbeKind::Warmup
            && r.reverifying
            && matches!(r.state, ReplicaState::Warm | ReplicaState::Routed)
        {
            return self.reverified(id, o, now, out);
        }
        if self.sleep_probed(id, kind, &o, now, out) {
            return;
        }
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        let Some(m) = self.models.get(&r.model) else {
            return;
        };
        let threshold = m
            .config
            .liveness
            .as_ref()
            .map_or(DEFAULT_PROBE_FAILURES, |l| l.failures);
        match (kind, r.state) {
            (ProbeKind::Warmup, ReplicaState::Starting) => {
                if o.ok && r.adopted {
                    // Adopted, not started: its warm-up proves it still serves, and says
                    // nothing about how long this model takes to start.
                    r.next_probe = now + m.config_of(&r.spec).launch.warmup.recheck;
                    r.ever_warm = true;
                    r.last_probe_error.clear();
                    let rid = r.id.clone();
                    let model = r.model.clone();
                    self.set_state(&rid, ReplicaState::Warm, now, out);
                    self.log(
                        LogLevel::Info,
                        &model,
                        Some(&rid),
                        "adopted: warm-up passed".into(),
                        out,
                    );
                } else if !o.ok && r.adopted && !o.not_ready {
                    // It served before; a wrong answer now (or a stranger on its port) is not a
                    // server still loading: it is not taken back.
                    let why = format!("adopted, but its warm-up failed: {}", o.detail);
                    let rid = r.id.clone();
                    self.stop(&rid, &why, false, now, out);
                } else if o.ok {
                    let spawned = r.spawned_at.unwrap_or(r.created);
                    let ttr = now.since(spawned);
                    r.next_probe = now + m.config_of(&r.spec).launch.warmup.recheck;
                    r.ever_warm = true;
                    r.last_probe_error.clear();
                    let rid = r.id.clone();
                    let model = r.model.clone();
                    self.set_state(&rid, ReplicaState::Warm, now, out);
                    self.log(
                        LogLevel::Info,
                        &model,
                        Some(&rid),
                        format!("warm after {}", short_duration(ttr)),
                        out,
                    );
                    if let Some(m) = self.models.get_mut(&model) {
                        m.time_to_ready = Some(ttr);
                        m.autoscaler.observe_time_to_ready(ttr);
                    }
                    out.push(Action::Ready {
                        model,
                        replica: rid,
                        how: Readiness::Cold(ttr),
                    });
                } else {
                    r.last_probe_error = o.detail;
                    r.reason = format!("warm-up: {}", r.last_probe_error).into();
                    let after = if o.not_ready {
                        WARMUP_RETRY_LOADING
                    } else {
                        WARMUP_RETRY_WRONG
                    };
                    if let Some(spec) = self.probe_spec(id, ProbeKind::Warmup) {
                        self.send_probe(id, ProbeKind::Warmup, after, spec, out);
                    }
                }
            }
            (
                ProbeKind::Recheck | ProbeKind::Liveness,
                ReplicaState::Warm | ReplicaState::Routed,
            ) => {
                if o.ok {
                    r.probe_failures = 0;
                    r.last_probe_error.clear();
                    return;
                }
                r.probe_failures += 1;
                r.last_probe_error = o.detail.clone();
                let n = r.probe_failures;
                if kind == ProbeKind::Recheck {
                    // A warm replica under suspicion is not promotable: settle it soon.
                    let recheck = m.config_of(&r.spec).launch.warmup.recheck;
                    r.next_probe = now + RECHECK_RETRY.min(recheck);
                }
                let what = if kind == ProbeKind::Recheck {
                    "recheck"
                } else {
                    "liveness"
                };
                let rid = r.id.clone();
                let model = r.model.clone();
                if n >= threshold {
                    let why = format!("{what} failed {n} times in a row: {}", o.detail);
                    self.fail(&rid, &why, now, out);
                } else {
                    self.log(
                        LogLevel::Warn,
                        &model,
                        Some(&rid),
                        format!("{what} failed ({n}/{threshold}): {}", o.detail),
                        out,
                    );
                }
            }
            _ => {} // a late answer for a replica that has moved on
        }
    }

    /// Sends a probe for a replica, which has one in flight until its answer comes.
    pub(super) fn send_probe(
        &mut self,
        id: &ReplicaId,
        kind: ProbeKind,
        after: Duration,
        spec: ProbeSpec,
        out: &mut Vec<Action>,
    ) {
        if let Some(r) = self.held.replicas_mut().get_mut(id) {
            r.probe_in_flight = true;
        }
        out.push(Action::Probe {
            replica: id.clone(),
            kind,
            after,
            spec,
        });
    }

    pub(super) fn probe_spec(&self, id: &ReplicaId, kind: ProbeKind) -> Option<ProbeSpec> {
        let r = self.held.replicas().get(id)?;
        let m = self.models.get(&r.model)?;
        let vars = self.placeholders(r);
        let w = &m.config_of(&r.spec).launch.warmup;
        let expand = |s: &str| crate::config::expand(s, &vars);
        Some(match (kind, &m.config.liveness) {
            (ProbeKind::Liveness, Some(l)) => ProbeSpec {
                method: "GET".into(),
                url: expand(&l.url),
                headers: Vec::new(),
                body: None,
                expect_status: 200,
                accept_2xx: false,
                expect_body: None,
                timeout: l.timeout,
                verify_owner: false,
            },
            _ => ProbeSpec {
                method: w.method.clone(),
                url: expand(&w.url),
                headers: w
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
                body: w.body.as_deref().map(expand),
                expect_status: w.expect_status,
                accept_2xx: false,
                expect_body: w.expect_body.clone(),
                timeout: w.timeout,
                // Warm-ups and rechecks decide whether a replica may take traffic: the answer
                // must come from the replica's own process.
                verify_owner: true,
            },
        })
    }

    pub(super) fn placeholders(&self, r: &Replica) -> crate::config::Placeholders {
        crate::config::Placeholders {
            port: r.port.unwrap_or(0),
            replica: r.id.0.clone(),
            model: r.model.clone(),
            gpus: r.gpus.join(","),
        }
    }
}
