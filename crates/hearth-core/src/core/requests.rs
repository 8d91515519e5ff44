//! Control requests: roles, reports, drain and scale, answered with protocol types.

use std::collections::BTreeMap;

use super::event::LogLevel;
use super::event::{Action, Peer, RequestId};
use super::front_door::Admitted;
use super::model::{ModelState, Overrides};
use super::node::Node;
use super::policy::Decision;
use super::queue_signal::Sample;
use super::replica::{ReplicaId, ReplicaState};
use super::Time;
use crate::protocol::{
    self, quote, Answer, ErrorCode, Failure, Report, Request, Response, Role, WatchEvent,
    MAX_REASON,
};

/// The answer of an op that has nothing to say but yes.
const DONE: Response = Response::Done {};

/// What a `scale` request asks for.
struct ScaleAsk {
    min: Option<u32>,
    max: Option<u32>,
    warm_pool: Option<protocol::WarmPoolSetting>,
    reset: bool,
}

fn no_model(name: &str) -> Failure {
    Failure::new(ErrorCode::UnknownModel, format!("no model {}", quote(name)))
}

fn no_replica(id: &str) -> Failure {
    Failure::new(
        ErrorCode::UnknownReplica,
        format!("no replica {}", quote(id)),
    )
}

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
            Ok(()) if req == (Request::Reload {}) => return self.reload_asked(Some(id), out),
            // Answered by the shell, which alone knows whether it can re-execute itself.
            Ok(()) if req == (Request::Upgrade {}) && self.shutdown.is_none() => {
                self.log_global(
                    super::event::LogLevel::Info,
                    "upgrade asked: handing every replica over to the binary on disk".into(),
                    out,
                );
                return out.push(Action::Upgrade { id });
            }
            Ok(()) if req == (Request::Upgrade {}) => Err(Failure::new(
                ErrorCode::Busy,
                "shutting down: replicas are being stopped, not handed over",
            )),
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
            Request::Version {} => Ok(Response::Version {
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
            Request::Gpus {} => Ok(Response::Gpus {
                gpus: self.gpu_views(),
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
                    .chain(
                        self.models
                            .keys()
                            .filter(|name| model.as_deref().is_none_or(|m| m == name.as_str()))
                            .filter_map(|name| self.capacity_event(name)),
                    )
                    .collect();
                Ok(Response::Watching { snapshot })
            }
            Request::Report(report) => self.report(peer, report, now, out),
            Request::Drain {
                replica,
                model,
                force,
            } => match (replica, model) {
                (Some(replica), None) => {
                    self.drain_request(&replica, force, now, out).map(|_| DONE)
                }
                (None, Some(model)) => self.set_drained(&model, true, out).map(|_| DONE),
                _ => Err(Failure::new(
                    ErrorCode::BadRequest,
                    "drain takes either \"replica\" or \"model\"",
                )),
            },
            Request::Undrain { model } => self.set_drained(&model, false, out).map(|_| DONE),
            Request::Scale {
                model,
                min,
                max,
                warm_pool,
                reset,
            } => {
                let ask = ScaleAsk {
                    min,
                    max,
                    warm_pool,
                    reset,
                };
                self.scale_request(&model, ask, now, out).map(|_| DONE)
            }
            Request::Cordon {
                gpu,
                reason,
                evacuate,
            } => {
                if let Some(r) = reason.as_ref().filter(|r| r.chars().count() > MAX_REASON) {
                    return Err(Failure::new(
                        ErrorCode::BadRequest,
                        format!(
                            "reason is at most {MAX_REASON} characters ({} given)",
                            r.chars().count()
                        ),
                    ));
                }
                self.cordon(&gpu, true, reason, evacuate, out).map(|_| DONE)
            }
            Request::Uncordon { gpu } => self.cordon(&gpu, false, None, false, out).map(|_| DONE),
            Request::Upgrade {} => Err(Failure::new(
                ErrorCode::BadRequest,
                "upgrade is answered by the daemon's shell",
            )),
            Request::Reload {} => {
                // Taken by `request` before any answer: only a read of the file answers it.
                Err(Failure::new(
                    ErrorCode::BadRequest,
                    "reload is answered once the configuration is read",
                ))
            }
        }
    }

    pub(super) fn model_mut(&mut self, name: &str) -> Result<&mut ModelState, Failure> {
        self.models.get_mut(name).ok_or_else(|| no_model(name))
    }

    fn model_known(&self, name: &str) -> Result<(), Failure> {
        if self.models.contains_key(name) {
            Ok(())
        } else {
            Err(no_model(name))
        }
    }

    /// The live replica the peer is a process of: the one whose cgroup or scope holds it, as
    /// the shell found it (which covers processes that left the process group), else the one
    /// whose process group it belongs to.
    fn replica_of_peer(&self, peer: &Peer) -> Option<&ReplicaId> {
        if let Some(id) = &peer.replica {
            return self
                .held
                .replicas()
                .get(id)
                .filter(|r| r.pid.is_some())
                .map(|r| &r.id);
        }
        let pgid = peer.pgid?;
        self.held
            .replicas()
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
    ) -> Result<Response, Failure> {
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
        report.check()?;
        if let Some(name) = &report.router {
            if !is_reporter {
                return Err(Failure::new(
                    ErrorCode::Forbidden,
                    "a front door's reports (`router`) need the reporter role",
                ));
            }
            if name.is_empty()
                || name.len() > protocol::MAX_ROUTER_NAME
                || name.chars().any(char::is_control)
            {
                return Err(Failure::new(
                    ErrorCode::BadRequest,
                    format!(
                        "router must be a name of 1 to {} printable characters",
                        protocol::MAX_ROUTER_NAME
                    ),
                ));
            }
            self.front_door_room(&report.model, name, now)?;
        }
        if let Some(rid) = &target {
            let r = self
                .held
                .replicas()
                .get(rid)
                .ok_or_else(|| no_replica(rid.as_str()))?;
            if r.model != report.model {
                return Err(Failure::new(
                    ErrorCode::UnknownReplica,
                    format!("replica {rid} belongs to model {}", quote(&r.model)),
                ));
            }
        }
        // Answered either way; recorded only from the sources that are the model's signal now.
        let sample = Sample::from_report(&report, now);
        let door = report
            .router
            .as_deref()
            .map(|name| (name, target.as_ref(), sample));
        let sample = match self.admit_signal(&report.model, door, now, out) {
            Admitted::Own => sample,
            Admitted::Combined(combined) => combined,
            Admitted::Superseded(doors) => {
                return Ok(Response::Superseded {
                    superseded_by: doors,
                })
            }
        };
        match target {
            Some(rid) => self.record_replica_sample(&rid, sample, now, out),
            None => {
                self.model_mut(&report.model)?.model_wide.record(sample);
            }
        }
        self.autoscale(&report.model, now, out);
        Ok(DONE)
    }

    /// Stores a replica's queue sample; a draining replica with no work left is stopped.
    pub(super) fn record_replica_sample(
        &mut self,
        id: &ReplicaId,
        sample: Sample,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
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
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        if r.state == ReplicaState::Draining && sample.in_flight == 0 && sample.queue_depth == 0 {
            if r.then_sleep && self.shutdown.is_none() && self.sleepy(&r.model) {
                self.begin_sleep(id, "drained: no work in flight", now, out);
            } else {
                self.stop(id, "drained: no work in flight", false, now, out);
            }
        }
    }

    /// `drain`: unroute, let work finish, stop. Routed stays at `min` or above: where draining
    /// would take it below, a warm replica is promoted in the same event or a replacement is
    /// started, and the replica drains once the replacement is routed (the reconciler's
    /// `departing` path, as for rollouts and evacuations). Only when no replacement fits beside
    /// the replicas running now is it refused, and `force` drains it all the same.
    fn drain_request(
        &mut self,
        id: &str,
        force: bool,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        let rid = ReplicaId(id.to_string());
        let Some(r) = self.held.replicas().get(&rid) else {
            return Err(no_replica(id));
        };
        match r.state {
            ReplicaState::Routed => {
                let model = r.model.clone();
                let min = self
                    .models
                    .get(&model)
                    .filter(|m| !m.removed)
                    .map_or(0, |m| m.routed_min());
                // Routed replicas that stay: not this one, nor others already on their way out.
                let staying = self
                    .held
                    .replicas()
                    .of_model(&model)
                    .filter(|x| x.state == ReplicaState::Routed)
                    .filter(|x| x.id != rid && !self.departing(x))
                    .count() as u32;
                if force || staying >= min {
                    self.begin_drain(&rid, "drained by operator", now, out);
                } else if let Err(why) = self.replacement_possible(&model) {
                    return Err(Failure::new(
                        ErrorCode::BadRequest,
                        format!(
                            "draining {rid} would leave {staying} routed, below min {min}, and \
                             no replacement can be placed: {why}; `hearth drain --force` \
                             drains it anyway"
                        ),
                    ));
                } else if let Some(r) = self.held.replicas_mut().get_mut(&rid) {
                    r.drain_asked = true;
                    r.reason =
                        format!("drain asked: drains once a replacement is routed (min {min})")
                            .into();
                    self.log(
                        LogLevel::Info,
                        &model,
                        Some(&rid),
                        format!("drain asked: a replacement is routed first, to keep min {min}"),
                        out,
                    );
                }
            }
            ReplicaState::Pending => {
                self.forget(&rid, "removed by operator", out);
            }
            ReplicaState::Starting
            | ReplicaState::Warm
            | ReplicaState::FallingAsleep
            | ReplicaState::Sleeping
            | ReplicaState::Waking => {
                // Nothing is routed to it: there is no work to wait for.
                self.stop(&rid, "drained by operator", false, now, out)
            }
            ReplicaState::Draining | ReplicaState::Stopping => {}
        }
        Ok(())
    }

    /// Whether a replica of `model` can take a routed one's place: a warm one to promote, one
    /// already starting, or room for a new one (GPUs and a port) beside the replicas running now.
    fn replacement_possible(&self, model: &str) -> Result<(), String> {
        let ready_or_coming =
            self.held.replicas().of_model(model).any(|r| {
                !self.departing(r) && (r.promotable() || r.state == ReplicaState::Starting)
            });
        if ready_or_coming {
            return Ok(());
        }
        let Some(m) = self.models.get(model) else {
            return Err("the model is gone".into());
        };
        if self.held.ports().free() == 0 {
            return Err("no free port in daemon.ports".into());
        }
        let nothing = std::collections::BTreeSet::new();
        self.held
            .gpus()
            .place(&super::placement::Want::of(m.launch_spec(), &nothing))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn scale_request(
        &mut self,
        model: &str,
        ask: ScaleAsk,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        let m = self.model_mut(model)?;
        let mut o = if ask.reset {
            // A drain of the model is not a scale override: `undrain` ends it.
            Overrides {
                drained: m.overrides.drained,
                ..Overrides::default()
            }
        } else {
            m.overrides.clone()
        };
        if ask.min.is_some() {
            o.min = ask.min;
        }
        if ask.max.is_some() {
            o.max = ask.max;
        }
        if ask.warm_pool.is_some() {
            o.warm_pool = ask.warm_pool;
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
        // Every replica takes a port: the models' max together must fit daemon.ports. Counted
        // in u64, as the configuration's own check is.
        let ports = super::overrides::port_capacity(self.config.daemon.ports);
        let others: u64 = self
            .models
            .values()
            .filter(|x| x.name() != model && !x.removed)
            .map(|x| u64::from(x.max()))
            .sum();
        let needed = others + u64::from(new_max);
        if needed > ports {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                format!(
                    "max {new_max} needs {needed} ports in all; daemon.ports has {ports} \
                     (at most {} for this model)",
                    ports.saturating_sub(others)
                ),
            ));
        }
        let m = self.model_mut(model)?;
        m.overrides = o;
        let (lo, hi) = (m.min(), m.max());
        let reason = if ask.reset {
            format!("operator cleared the overrides: min {lo}, max {hi}")
        } else {
            format!("operator set min {lo}, max {hi}")
        };
        let clamped = m.desired_routed.clamp(m.routed_min(), hi);
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
