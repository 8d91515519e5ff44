//! Adoption: replicas of an earlier run of the daemon, found alive, taken back (issue 14).
//!
//! The shell proves each one is the process that was started (pid, start time, cgroup) and
//! hands the survivors over as a [`Ledger`]: what the core itself wrote down about them
//! ([`Node::ledger`]). A replica is one process for its whole life, so what its record says
//! about warm-ups (`ever_warm`) was passed by that very process identity. The core decides: a
//! replica whose model is still configured, whose port is in range and free and whose GPUs are
//! known, is adopted; any other leaves (adopt_roles.rs): drained first when it was serving,
//! stopped at once otherwise (SIGTERM, SIGKILL after `stop_grace`), never routed. One made from
//! another launch spec than the configuration's (the file changed while hearth was down; a
//! rollout under way at a hand-over) is adopted as the version a rollout replaces: it keeps
//! serving until a replica of the configured version is routed in its place, then drains.
//!
//! - [`Adoption::HandedOver`]: the daemon re-executed itself (`hearth upgrade`): each replica
//!   keeps its role (routed, warm, draining…) at once, so the routed set never changes.
//! - [`Adoption::Found`]: the daemon died without a hand-over (kill -9, OOM, a crash, a panic).
//!   A replica is routed only after a warm-up passed by its process identity, in this run or in
//!   the run it is adopted from: one that was routed keeps its place in the routed set while
//!   its warm-up re-verifies it (a busy server answers the warm-up behind its work), and leaves
//!   if the check fails; the others are re-verified before they take their roles back. None is
//!   cold-started.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::event::{Action, LogLevel};
use super::model::Rollout;
use super::node::Node;
use super::placement::Placed;
use super::policy::recurrence::Remembered;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::reservations::PortClaim;
use super::Time;
use crate::config::LaunchSpec;

/// What an adopted routed replica says while its warm-up re-verifies it.
pub(super) const REVERIFYING: &str =
    "adopted (was routed): keeps its place while its warm-up re-verifies it";
/// Replica numbers beyond this are not believed (a corrupt ledger): `next_n` stays.
const MAX_N: u64 = 1 << 48;

/// What the core knows about one replica with a process, as persisted between runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub replica: String,
    pub model: String,
    pub n: u64,
    pub state: ReplicaState,
    pub pid: u32,
    pub port: u16,
    /// Device UUIDs.
    #[serde(default)]
    pub gpus: Vec<String>,
    #[serde(default)]
    pub gpu_bytes: u64,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub ever_warm: bool,
    /// The launch spec it was made from, resolved.
    pub spec: LaunchSpec,
}

/// Per model: what the next run must continue from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub next_n: u64,
    pub desired_routed: u32,
    #[serde(default)]
    pub total_restarts: u64,
    /// The bursts its autoscaler has seen (`[model.scaling] forecast`), kept whether or not a
    /// replica is taken back: the period is the model's, not a replica's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bursts: Option<Remembered>,
}

/// The core's side of the persisted state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    #[serde(default)]
    pub models: BTreeMap<String, ModelRecord>,
    #[serde(default)]
    pub replicas: Vec<ReplicaRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// A planned hand-over: roles kept as they are.
    HandedOver,
    /// Found after an unplanned death: warm-up first.
    Found,
}

impl Node {
    /// What the next run needs to adopt this run's replicas: every replica with a process.
    pub fn ledger(&self) -> Ledger {
        let models = self
            .models
            .iter()
            .map(|(name, m)| {
                let rec = ModelRecord {
                    next_n: m.next_n,
                    desired_routed: m.desired_routed,
                    total_restarts: m.total_restarts,
                    bursts: m.autoscaler.remembered_bursts(),
                };
                (name.clone(), rec)
            })
            .collect();
        let replicas = self
            .held
            .replicas()
            .values()
            .filter(|r| r.state != ReplicaState::Pending)
            .filter_map(|r| {
                Some(ReplicaRecord {
                    replica: r.id.0.clone(),
                    model: r.model.clone(),
                    n: r.n,
                    state: r.state,
                    pid: r.pid?,
                    port: r.port?,
                    gpus: r.gpus.clone(),
                    gpu_bytes: r.gpu_bytes,
                    restarts: r.restarts,
                    ever_warm: r.ever_warm,
                    spec: (*r.spec).clone(),
                })
            })
            .collect();
        Ledger { models, replicas }
    }

    pub(super) fn adopt(
        &mut self,
        how: Adoption,
        ledger: Ledger,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        for (name, rec) in &ledger.models {
            if let (Some(m), Some(bursts)) = (self.models.get_mut(name), &rec.bursts) {
                m.autoscaler.restore_bursts(bursts, now);
            }
            // Only where something is taken back: after an orderly stop nothing is, and the
            // model starts afresh from its configuration.
            if !ledger.replicas.iter().any(|r| r.model == *name) {
                continue;
            }
            let Some(m) = self.models.get_mut(name) else {
                continue;
            };
            if rec.next_n <= MAX_N {
                m.next_n = m.next_n.max(rec.next_n);
            }
            m.total_restarts = m.total_restarts.max(rec.total_restarts);
            if !m.removed {
                m.desired_routed = rec.desired_routed.clamp(m.routed_min(), m.max());
            }
        }
        let (mut adopted, mut stopped) = (0usize, 0usize);
        for rec in ledger.replicas {
            if self.adopt_one(how, rec, now, out) {
                adopted += 1;
            } else {
                stopped += 1;
            }
        }
        if adopted + stopped > 0 {
            let how = match how {
                Adoption::HandedOver => "handed over by the previous binary, roles kept",
                Adoption::Found => "found alive after the previous run ended; routed ones keep their places while their warm-ups re-verify them, the others warm up first",
            };
            self.log_global(
                LogLevel::Info,
                format!("adopted {adopted} replica(s), stopping {stopped} ({how})"),
                out,
            );
        }
    }

    /// Why a recorded replica cannot be adopted; None: it can. A launch spec that differs from
    /// the configuration's is no reason: the replica is adopted as a version being rolled away
    /// from (`roll_from`), replaced, and drained once its replacement is routed.
    fn refusal(&self, how: Adoption, rec: &ReplicaRecord) -> Option<String> {
        let Some(m) = self.models.get(&rec.model) else {
            return Some("its model is no longer configured".into());
        };
        if m.removed {
            return Some("its model is being removed".into());
        }
        if ReplicaId::new(&rec.model, rec.n).0 != rec.replica || rec.n > MAX_N {
            return Some("its record does not match its name".into());
        }
        if !self.held.ports().claimable(rec.port) {
            return Some(format!(
                "port {} is outside daemon.ports or taken",
                rec.port
            ));
        }
        if let Some(u) = rec.gpus.iter().find(|u| self.held.gpus().slot(u).is_none()) {
            return Some(format!("its GPU {u} is not in the inventory"));
        }
        if rec.gpus.len() != rec.spec.gpus as usize {
            return Some("its GPUs do not match its launch spec".into());
        }
        match (how, rec.state) {
            (_, ReplicaState::Pending) => Some("it was never started".into()),
            // Half-way: its sleep or wake requests were answered by the previous run, which
            // this one cannot pick up. Stopped and replaced.
            (_, ReplicaState::FallingAsleep | ReplicaState::Waking) => {
                Some("it was on its way to sleep or back".into())
            }
            (_, ReplicaState::Sleeping) if m.config.sleep.is_none() => {
                Some("it was asleep, and its model no longer has [model.sleep]".into())
            }
            (Adoption::Found, ReplicaState::Stopping) => {
                Some("it was being stopped when hearth stopped".into())
            }
            _ => None,
        }
    }

    /// Takes one recorded replica back; false: it leaves instead (drained first if it was
    /// serving).
    fn adopt_one(
        &mut self,
        how: Adoption,
        rec: ReplicaRecord,
        now: Time,
        out: &mut Vec<Action>,
    ) -> bool {
        let id = ReplicaId(rec.replica.clone());
        if self.held.replicas().contains_key(&id) {
            return false;
        }
        let refusal = self.refusal(how, &rec);
        // New replicas are numbered after every one taken over, adopted or not: an id is never
        // given twice.
        if let Some(m) = self.models.get_mut(&rec.model) {
            if rec.n < MAX_N {
                m.next_n = m.next_n.max(rec.n + 1);
            }
        }
        let spec = self.spec_for(&rec.spec);
        let mut r = Replica::new(&rec.model, rec.n, spec, now, rec.restarts);
        r.id = id.clone();
        r.pid = Some(rec.pid);
        r.spawned_at = Some(now);
        r.adopted = true;
        r.ever_warm = rec.ever_warm;
        if let Some(why) = refusal {
            self.refuse(r, &rec, &why, now, out);
            return false;
        }
        if self
            .models
            .get(&rec.model)
            .is_some_and(|m| *m.spec != rec.spec)
        {
            self.roll_from(&rec.model, &r.spec, out);
        }
        let recheck = r.spec.warmup.recheck;
        match how {
            // Asleep, found or handed over: taken back asleep, holding what it held asleep.
            // Its health as a sleeper (its state request, or its liveness) is asked at once,
            // never its warm-up, which would wake it: a process that says it is awake, or does
            // not answer, fails it and it is replaced. The next wake is its warm-up.
            _ if rec.state == ReplicaState::Sleeping => {
                r.state = ReplicaState::Sleeping;
                r.next_probe = now;
                r.reason = "adopted asleep: its state is asked before it counts on it".into();
                self.take_back(r, &rec, PortClaim::Range(rec.port));
            }
            Adoption::HandedOver => {
                r.state = rec.state;
                r.next_probe = now + recheck;
                self.take_back(r, &rec, PortClaim::Range(rec.port));
                self.resume(&id, rec.state, now, out);
            }
            // Routed by a warm-up this very process passed (its pid and start time, which the
            // shell proved before handing the record over): it keeps its place while the
            // same warm-up re-verifies it, so a busy replica is not hidden from the routers
            // while the warm-up waits behind its work.
            Adoption::Found if rec.state == ReplicaState::Routed && rec.ever_warm => {
                r.state = ReplicaState::Routed;
                r.reverifying = true;
                r.reason = REVERIFYING.into();
                r.next_probe = now;
                self.take_back(r, &rec, PortClaim::Range(rec.port));
                self.send_warmup(&id, out);
            }
            Adoption::Found if rec.state == ReplicaState::Draining => {
                r.state = ReplicaState::Draining;
                self.take_back(r, &rec, PortClaim::Range(rec.port));
                self.resume(&id, ReplicaState::Draining, now, out);
            }
            Adoption::Found => {
                r.state = ReplicaState::Starting;
                r.was_routed = rec.state == ReplicaState::Routed;
                r.reason =
                    format!("adopted (was {}): re-verifying with its warm-up", rec.state).into();
                self.take_back(r, &rec, PortClaim::Range(rec.port));
                self.send_warmup(&id, out);
            }
        }
        self.publish_state(&id, out);
        self.log(
            LogLevel::Info,
            &rec.model,
            Some(&id),
            format!(
                "adopted: pid {}, port {}, was {}",
                rec.pid, rec.port, rec.state
            ),
            out,
        );
        true
    }

    /// The spec a recorded replica is made from, shared with the model's when `==`.
    fn spec_for(&self, spec: &LaunchSpec) -> Arc<LaunchSpec> {
        for m in self.models.values() {
            if *m.spec == *spec {
                return Arc::clone(&m.spec);
            }
            if let Some(r) = m.rollout.as_ref().filter(|r| *r.previous_spec == *spec) {
                return Arc::clone(&r.previous_spec);
            }
        }
        Arc::new(spec.clone())
    }

    /// Adds a recorded replica with its port and what it held on the GPUs the record names
    /// (those the inventory knows).
    pub(super) fn take_back(&mut self, r: Replica, rec: &ReplicaRecord, port: PortClaim) {
        let devices: Vec<String> = rec
            .gpus
            .iter()
            .filter(|u| self.held.gpus().slot(u).is_some())
            .cloned()
            .collect();
        let bytes = self.held.gpus().bounded_bytes(&devices, rec.gpu_bytes);
        let placed = Placed { devices, bytes };
        let exclusive = rec.spec.gpu_memory.is_none();
        self.held.adopt(r, port, placed, exclusive);
    }

    /// A replica adopted with a launch spec other than the configuration's (the file changed
    /// while hearth was down, or a rollout was under way when it was handed over) belongs to a
    /// version being rolled away from: replicas of the configured one are started and warmed,
    /// and it drains once one is routed in its place (`departing`), as after a reload.
    fn roll_from(&mut self, model: &str, spec: &Arc<LaunchSpec>, out: &mut Vec<Action>) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        if m.rollout.is_some() {
            return;
        }
        let mut previous = m.config.clone();
        previous.launch = (**spec).clone();
        let msg = format!(
            "its launch spec differs from the configuration's (changed while hearth was down, or a rollout was under way): rolling out version {} from {}: new replicas warm before the adopted ones drain",
            m.config.launch.version, spec.version
        );
        m.rollout = Some(Rollout {
            previous,
            previous_spec: Arc::clone(spec),
            failures: 0,
            halted: None,
        });
        self.log(LogLevel::Info, model, None, msg, out);
    }
}
