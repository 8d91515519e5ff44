//! Control requests: roles, reports, drain and scale, answered with protocol types.

use std::collections::BTreeMap;

use super::event::{Action, Peer, RequestId};
use super::model::{ModelState, Overrides};
use super::node::Node;
use super::policy::Decision;
use super::replica::{ReplicaId, ReplicaState};
use super::signal::Sample;
use super::Time;
use crate::protocol::{
    self, Answer, ErrorCode, Failure, Report, Request, Response, Role, WatchEvent,
};

/// The answer of an op that has nothing to say but yes.
const DONE: Response = Response::Done {};

impl Node {
    // ---- control requests ------------------------------------------------------------------

    pub(super) fn request(
        &mut self,
        id: RequestId,
        peer: &Peer,
        req: Request,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let answer = match self.authorize(peer, &req) {
            Err(f) => Err(f),
            // Answered once the file is read (config_read).
            Ok(()) if req == Request::Reload => return self.reload_asked(Some(id), out),
            Ok(()) => self.answer(peer, req, now, out),
        };
        out.push(Action::Reply { id, answer });
    }

    /// Whether the peer's role allows the request.
    fn authorize(&self, peer: &Peer, req: &Request) -> Result<(), Failure> {
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
        Ok(())
    }

    /// The answer to an authorized request.
    fn answer(&mut self, peer: &Peer, req: Request, now: Time, out: &mut Vec<Action>) -> Answer {
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
            Request::Reload => {
                // Taken by `request` before any answer: only a read of the file answers it.
                Err(Failure::new(
                    ErrorCode::BadRequest,
                    "reload is answered once the configuration is read",
                ))
            }
        }
    }

    fn model_mut(&mut self, name: &str) -> Result<&mut ModelState, Failure> {
        self.models
            .get_mut(name)
            .ok_or_else(|| Failure::new(ErrorCode::UnknownModel, format!("no model {name:?}")))
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

    /// The live replica the peer is a process of: the one whose cgroup or scope holds it, as
    /// the shell found it (which covers processes that left the process group), else the one
    /// whose process group it belongs to.
    fn replica_of_peer(&self, peer: &Peer) -> Option<&ReplicaId> {
        if let Some(id) = &peer.replica {
            return self
                .replicas
                .get(id)
                .filter(|r| r.pid.is_some())
                .map(|r| &r.id);
        }
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
                self.model_mut(&report.model)?.model_wide.record(sample);
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

    fn scale_request(
        &mut self,
        model: &str,
        min: Option<u32>,
        max: Option<u32>,
        warm_pool: Option<protocol::WarmPoolSetting>,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        let m = self.model_mut(model)?;
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
        let m = self.model_mut(model)?;
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
}
