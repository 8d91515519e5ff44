//! `Node`: all state, and `handle(event, now) -> Vec<Action>`, the one entry point.

use std::collections::BTreeMap;
use std::time::Duration;

use super::event::{Action, Event, LogLevel, Peer, ProbeKind, ProbeOutcome, RequestId};
use super::gpu::{GpuDevice, GpuTable};
use super::model::{ModelState, Overrides};
use super::policy::{Decision, Inputs};
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::signal::{ModelSignal, Sample};
use super::Time;
use crate::config::{Config, PortRange};
use crate::protocol::{
    self, Answer, Endpoint, ErrorCode, Failure, Report, Request, Response, Role, WatchEvent,
};

/// The answer of an op that has nothing to say but yes.
const DONE: Response = Response::Done {};
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

#[derive(Debug, Clone)]
pub(super) struct ShutdownState {
    pub deadline: Time,
}

pub struct Node {
    pub(super) config: Config,
    pub(super) models: BTreeMap<String, ModelState>,
    pub(super) replicas: BTreeMap<ReplicaId, Replica>,
    pub(super) gpus: GpuTable,
    pub(super) ports: PortPool,
    pub(super) shutdown: Option<ShutdownState>,
    pub(super) shutdown_reported: bool,
    /// The routed set last published per model, to publish only changes.
    published: BTreeMap<String, Vec<Endpoint>>,
    pub(super) version: String,
}

impl Node {
    /// A node for `config`, with the GPUs the inventory found and the saved scale overrides.
    pub fn new(
        config: Config,
        devices: Vec<GpuDevice>,
        overrides: BTreeMap<String, Overrides>,
        now: Time,
    ) -> Node {
        let models = config
            .models
            .iter()
            .map(|m| {
                let o = overrides.get(&m.name).cloned().unwrap_or_default();
                (m.name.clone(), ModelState::new(m.clone(), o, now))
            })
            .collect();
        Node {
            ports: PortPool::new(config.daemon.ports),
            config,
            models,
            replicas: BTreeMap::new(),
            gpus: GpuTable::new(devices),
            shutdown: None,
            shutdown_reported: false,
            published: BTreeMap::new(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    pub fn handle(&mut self, event: Event, now: Time) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Tick => self.tick(now, &mut out),
            Event::Spawned { replica, pid } => self.spawned(&replica, pid, now, &mut out),
            Event::SpawnFailed { replica, error } => self.process_gone(
                &replica,
                &format!("could not start: {error}"),
                now,
                &mut out,
            ),
            Event::Exited { replica, status } => {
                self.process_gone(&replica, &format!("exited ({status})"), now, &mut out)
            }
            Event::Probed {
                replica,
                kind,
                outcome,
            } => self.probed(&replica, kind, outcome, now, &mut out),
            Event::Scraped { replica, outcome } => self.scraped(&replica, outcome, now, &mut out),
            Event::Request { id, peer, request } => self.request(id, &peer, request, now, &mut out),
            Event::Reload { id, config } => self.reload(id, *config, now, &mut out),
            Event::Inventory(devices) => self.gpus.update(devices),
            Event::GpuXid { uuid, xid } => self.xid(&uuid, xid, now, &mut out),
            Event::GpuMemory {
                uuid,
                used,
                by_group,
            } => self.gpu_memory(&uuid, used, &by_group, &mut out),
            Event::Prefetch {
                replica,
                done_bytes,
                total_bytes,
                missing,
            } => self.prefetch_progress(&replica, done_bytes, total_bytes, &missing),
            Event::Shutdown { immediate } => self.begin_shutdown(immediate, now, &mut out),
        }
        self.reconcile(now, &mut out);
        self.publish_routed(&mut out);
        out
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    // ---- control requests ------------------------------------------------------------------

    fn request(
        &mut self,
        id: RequestId,
        peer: &Peer,
        req: Request,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let answer = self.answer(peer, req, now, out);
        out.push(Action::Reply { id, answer });
    }

    fn answer(&mut self, peer: &Peer, req: Request, now: Time, out: &mut Vec<Action>) -> Answer {
        let needed = req.required_role();
        // A replica's own processes may report for that replica without the reporter role.
        let own_report = matches!(req, Request::Report(_)) && self.replica_of_peer(peer).is_some();
        if peer.role < needed && !own_report {
            return Err(Failure::new(
                ErrorCode::Forbidden,
                format!(
                    "op \"{}\" needs the {needed} role; uid {} has {}",
                    req.op(),
                    peer.uid,
                    peer.role
                ),
            ));
        }
        match req {
            Request::Version => Ok(Response::Version {
                version: self.version.clone(),
                protocol: protocol::PROTOCOL_VERSION,
            }),
            Request::Status { model } => {
                if let Some(m) = &model {
                    self.model_known(m)?;
                }
                Ok(Response::Status {
                    status: self.status(model.as_deref(), now),
                })
            }
            Request::Gpus => Ok(Response::Gpus {
                gpus: self.gpus.views(),
            }),
            Request::Watch { model } => {
                if let Some(m) = &model {
                    self.model_known(m)?;
                }
                let snapshot: Vec<WatchEvent> = self
                    .models
                    .keys()
                    .filter(|name| model.as_deref().is_none_or(|m| m == name.as_str()))
                    .map(|name| WatchEvent::Routed {
                        model: name.clone(),
                        endpoints: self.routed_endpoints(name),
                    })
                    .collect();
                Ok(Response::Watching { snapshot })
            }
            Request::Report(report) => self.report(peer, report, now, out).map(|_| DONE),
            Request::Drain { replica } => self.drain_request(&replica, now, out).map(|_| DONE),
            Request::Scale {
                model,
                min,
                max,
                warm_pool,
            } => self
                .scale_request(&model, min, max, warm_pool, now, out)
                .map(|_| DONE),
            Request::Cordon {
                gpu,
                reason,
                evacuate,
            } => self.cordon(&gpu, true, reason, evacuate, out).map(|_| DONE),
            Request::Uncordon { gpu } => self.cordon(&gpu, false, None, false, out).map(|_| DONE),
            Request::Reload => Err(Failure::new(
                ErrorCode::BadRequest,
                "reload is read by the daemon's shell; it never reaches the core",
            )),
        }
    }

    fn model_known(&self, name: &str) -> Result<(), Failure> {
        if self.models.contains_key(name) {
            Ok(())
        } else {
            Err(Failure::new(
                ErrorCode::UnknownModel,
                format!("no model {name:?}"),
            ))
        }
    }

    /// The live replica whose process group the peer belongs to.
    fn replica_of_peer(&self, peer: &Peer) -> Option<&ReplicaId> {
        let pgid = peer.pgid?;
        self.replicas
            .values()
            .find(|r| r.pid == Some(pgid))
            .map(|r| &r.id)
    }

    fn report(
        &mut self,
        peer: &Peer,
        report: Report,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        self.model_known(&report.model)?;
        let own = self.replica_of_peer(peer).cloned();
        let is_reporter = peer.role >= Role::Reporter;
        let target = match (&report.replica, &own) {
            (Some(r), _) => Some(ReplicaId(r.clone())),
            // A replica's process that names no replica reports for itself.
            (None, Some(own)) if !is_reporter => Some(own.clone()),
            (None, _) => None,
        };
        if !is_reporter && target.as_ref() != own.as_ref() {
            return Err(Failure::new(
                ErrorCode::Forbidden,
                "a replica may only report for itself; model-wide reports need the reporter role",
            ));
        }
        for v in [report.oldest_wait_ms].into_iter().flatten() {
            if !v.is_finite() || v < 0.0 {
                return Err(Failure::new(
                    ErrorCode::BadRequest,
                    "oldest_wait_ms must be a finite number ≥ 0",
                ));
            }
        }
        let sample = Sample::from_report(&report, now);
        match target {
            Some(rid) => {
                let r = self.replicas.get_mut(&rid).ok_or_else(|| {
                    Failure::new(ErrorCode::UnknownReplica, format!("no replica {rid}"))
                })?;
                if r.model != report.model {
                    return Err(Failure::new(
                        ErrorCode::UnknownReplica,
                        format!("replica {rid} belongs to model {:?}", r.model),
                    ));
                }
                self.record_replica_sample(&rid, sample, now, out);
            }
            None => {
                let m = self.models.get_mut(&report.model).expect("checked");
                m.model_wide.record(sample);
            }
        }
        self.autoscale(&report.model, now, out);
        Ok(())
    }

    /// Stores a replica's queue sample; a draining replica with no work left is stopped.
    pub(super) fn record_replica_sample(
        &mut self,
        id: &ReplicaId,
        sample: Sample,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.replicas.get_mut(id) else {
            return;
        };
        let served = r.signal.record(sample);
        if let Some(m) = self.models.get_mut(&r.model) {
            m.autoscaler
                .observe_replica(sample.queue_depth, sample.in_flight);
            if let Some((done, busy)) = served {
                m.autoscaler.observe_served(now, done, busy);
            }
        }
        let Some(r) = self.replicas.get(id) else {
            return;
        };
        if r.state == ReplicaState::Draining && sample.in_flight == 0 && sample.queue_depth == 0 {
            self.stop(id, "drained: no work in flight", false, now, out);
        }
    }

    fn drain_request(&mut self, id: &str, now: Time, out: &mut Vec<Action>) -> Result<(), Failure> {
        let rid = ReplicaId(id.to_string());
        let Some(r) = self.replicas.get(&rid) else {
            return Err(Failure::new(
                ErrorCode::UnknownReplica,
                format!("no replica {id:?}"),
            ));
        };
        match r.state {
            ReplicaState::Routed => self.begin_drain(&rid, "drained by operator", now, out),
            ReplicaState::Pending => {
                self.forget(&rid, "removed by operator", out);
            }
            ReplicaState::Starting | ReplicaState::Warm => {
                // Nothing is routed to it: there is no work to wait for.
                self.stop(&rid, "drained by operator", false, now, out)
            }
            ReplicaState::Draining | ReplicaState::Stopping => {}
        }
        Ok(())
    }

    // ---- scaling -----------------------------------------------------------------------------

    /// Runs the model's autoscaler and applies its decision to `desired_routed`.
    pub(super) fn autoscale(&mut self, model: &str, now: Time, out: &mut Vec<Action>) {
        if self.shutdown.is_some() {
            return;
        }
        let routed = self.count(model, ReplicaState::Routed);
        let warm = self
            .replicas
            .values()
            .filter(|r| r.model == model && r.promotable())
            .count() as u32;
        let signal = self.model_signal(model, now);
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        if m.removed {
            return;
        }
        let inputs = Inputs {
            now,
            scaling: &m.config.scaling,
            min: m.min(),
            max: m.max(),
            signal,
            routed,
            desired: m.desired_routed,
            warm,
        };
        if let Some(decision) = m.autoscaler.evaluate(&inputs) {
            self.set_desired(model, decision, now, out);
        }
    }

    pub(super) fn set_desired(
        &mut self,
        model: &str,
        d: Decision,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let from = m.desired_routed;
        if from == d.to {
            return;
        }
        m.desired_routed = d.to;
        m.last_scale = Some(super::model::ScaleRecord {
            at: now,
            from,
            to: d.to,
            reason: d.reason.clone(),
        });
        out.push(Action::Log {
            level: LogLevel::Info,
            model: Some(model.to_string()),
            replica: None,
            message: format!("scale {from} → {}: {}", d.to, d.reason),
        });
        out.push(Action::Publish(WatchEvent::Scale {
            model: model.to_string(),
            from,
            to: d.to,
            reason: d.reason,
        }));
    }

    fn scale_request(
        &mut self,
        model: &str,
        min: Option<u32>,
        max: Option<u32>,
        warm_pool: Option<protocol::WarmPoolSetting>,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        self.model_known(model)?;
        let m = self.models.get_mut(model).expect("checked");
        let mut o = m.overrides.clone();
        if min.is_some() {
            o.min = min;
        }
        if max.is_some() {
            o.max = max;
        }
        if warm_pool.is_some() {
            o.warm_pool = warm_pool;
        }
        let new_min = o.min.unwrap_or(m.config.scaling.min);
        let new_max = o.max.unwrap_or(m.config.scaling.max);
        if new_min > new_max {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                format!("min {new_min} > max {new_max}"),
            ));
        }
        if new_max == 0 {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                "max must be at least 1",
            ));
        }
        let ports_needed: u32 = self
            .models
            .values()
            .map(|x| if x.name() == model { new_max } else { x.max() })
            .sum();
        if ports_needed as usize > self.ports.capacity() {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                format!(
                    "max {new_max} needs {ports_needed} ports in all; daemon.ports has {}",
                    self.ports.capacity()
                ),
            ));
        }
        let m = self.models.get_mut(model).expect("checked");
        m.overrides = o;
        let (lo, hi) = (m.min(), m.max());
        let reason = format!("operator set min {lo}, max {hi}");
        let clamped = m.desired_routed.clamp(lo, hi);
        out.push(Action::PersistOverrides(self.overrides()));
        self.set_desired(
            model,
            Decision {
                to: clamped,
                reason,
            },
            now,
            out,
        );
        Ok(())
    }

    /// Every model's scale overrides, for models that have any.
    pub(super) fn overrides(&self) -> BTreeMap<String, Overrides> {
        self.models
            .iter()
            .filter(|(_, m)| !m.overrides.is_empty())
            .map(|(k, m)| (k.clone(), m.overrides.clone()))
            .collect()
    }

    // ---- signal ------------------------------------------------------------------------------

    pub(super) fn model_signal(&self, model: &str, now: Time) -> Option<ModelSignal> {
        let m = self.models.get(model)?;
        let routed = self
            .replicas
            .values()
            .filter(|r| r.model == model && r.state == ReplicaState::Routed)
            .map(|r| &r.signal);
        ModelSignal::combine(&m.model_wide, routed, now, m.config.scaling.stale_after)
    }

    // ---- routed set --------------------------------------------------------------------------

    pub(super) fn routed_endpoints(&self, model: &str) -> Vec<Endpoint> {
        self.replicas
            .values()
            .filter(|r| r.model == model && r.state == ReplicaState::Routed)
            .filter_map(|r| {
                Some(Endpoint {
                    replica: r.id.0.clone(),
                    addr: r.addr()?,
                })
            })
            .collect()
    }

    fn publish_routed(&mut self, out: &mut Vec<Action>) {
        let names: Vec<String> = self.models.keys().cloned().collect();
        for name in names {
            let now = self.routed_endpoints(&name);
            if self.published.get(&name) != Some(&now) {
                self.published.insert(name.clone(), now.clone());
                out.push(Action::Publish(WatchEvent::Routed {
                    model: name,
                    endpoints: now,
                }));
            }
        }
    }

    pub(super) fn count(&self, model: &str, state: ReplicaState) -> u32 {
        self.replicas
            .values()
            .filter(|r| r.model == model && r.state == state)
            .count() as u32
    }

    // ---- probes ------------------------------------------------------------------------------

    fn probed(
        &mut self,
        id: &ReplicaId,
        kind: ProbeKind,
        o: ProbeOutcome,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.replicas.get_mut(id) else {
            return;
        };
        r.probe_in_flight = false;
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
                if o.ok {
                    let spawned = r.spawned_at.unwrap_or(r.created);
                    let ttr = now.since(spawned);
                    r.next_probe = now + m.config_of(r.spec).warmup.recheck;
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
                } else {
                    r.last_probe_error = o.detail;
                    r.reason = format!("warm-up: {}", r.last_probe_error);
                    let after = if o.not_ready {
                        WARMUP_RETRY_LOADING
                    } else {
                        WARMUP_RETRY_WRONG
                    };
                    let spec = self.probe_spec(id, ProbeKind::Warmup);
                    if let (Some(spec), Some(r)) = (spec, self.replicas.get_mut(id)) {
                        r.probe_in_flight = true;
                        out.push(Action::Probe {
                            replica: id.clone(),
                            kind: ProbeKind::Warmup,
                            after,
                            spec,
                        });
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
                    let recheck = m.config_of(r.spec).warmup.recheck;
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

    pub(super) fn probe_spec(
        &self,
        id: &ReplicaId,
        kind: ProbeKind,
    ) -> Option<super::event::ProbeSpec> {
        let r = self.replicas.get(id)?;
        let m = self.models.get(&r.model)?;
        let vars = self.placeholders(r);
        let w = &m.config_of(r.spec).warmup;
        let expand = |s: &str| crate::config::expand(s, &vars);
        Some(match (kind, &m.config.liveness) {
            (ProbeKind::Liveness, Some(l)) => super::event::ProbeSpec {
                method: "GET".into(),
                url: expand(&l.url),
                headers: Vec::new(),
                body: None,
                expect_status: 200,
                expect_body: None,
                timeout: l.timeout,
            },
            _ => super::event::ProbeSpec {
                method: w.method.clone(),
                url: expand(&w.url),
                headers: w
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
                body: w.body.as_deref().map(expand),
                expect_status: w.expect_status,
                expect_body: w.expect_body.clone(),
                timeout: w.timeout,
            },
        })
    }

    pub(super) fn placeholders(&self, r: &Replica) -> crate::config::Placeholders {
        crate::config::Placeholders {
            port: r.port.unwrap_or(0),
            replica: r.id.0.clone(),
            model: r.model.clone(),
            gpus: self.gpus.uuids(&r.gpus).join(","),
        }
    }

    pub(super) fn log(
        &self,
        level: LogLevel,
        model: &str,
        replica: Option<&ReplicaId>,
        message: String,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Log {
            level,
            model: Some(model.to_string()),
            replica: replica.cloned(),
            message,
        });
    }
}

/// Ports from `daemon.ports`, handed out round-robin so a port just freed (maybe still in
/// TIME_WAIT, or held by a straggler) is the last to be reused.
#[derive(Debug, Clone)]
pub(super) struct PortPool {
    range: PortRange,
    next: u16,
    in_use: std::collections::BTreeSet<u16>,
}

impl PortPool {
    fn new(range: PortRange) -> Self {
        PortPool {
            range,
            next: range.first,
            in_use: Default::default(),
        }
    }
    pub fn capacity(&self) -> usize {
        (self.range.last - self.range.first) as usize + 1
    }
    pub fn take(&mut self) -> Option<u16> {
        for _ in 0..self.capacity() {
            let p = self.next;
            self.next = if p >= self.range.last {
                self.range.first
            } else {
                p + 1
            };
            if self.in_use.insert(p) {
                return Some(p);
            }
        }
        None
    }
    pub fn give_back(&mut self, p: u16) {
        self.in_use.remove(&p);
    }
    pub fn set_range(&mut self, range: PortRange) {
        self.range = range;
        if !(range.first..=range.last).contains(&self.next) {
            self.next = range.first;
        }
    }
}
