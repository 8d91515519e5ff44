//! Adoption: replicas of an earlier run of the daemon, found alive, taken back (issue 14).
//!
//! The shell proves each one is the process that was started (pid, start time, cgroup) and
//! hands the survivors over as a [`Ledger`]: what the core itself wrote down about them
//! ([`Node::ledger`]). The core decides: a replica whose model is still configured with a
//! launch spec `==` to the one it was made from (compared field by field; a field added since,
//! at its default, is equal), whose port is in range and free and whose GPUs are known, is
//! adopted; any other is stopped (SIGTERM, SIGKILL after `stop_grace`), never routed.
//!
//! - [`Adoption::HandedOver`]: the daemon re-executed itself (`hearth upgrade`, or a panic with a
//!   hand-over written): each replica keeps its role (routed, warm, draining…) at once, so the
//!   routed set never changes.
//! - [`Adoption::Found`]: the daemon died without a hand-over (kill -9, OOM, a crash). Each
//!   replica is re-verified with its warm-up request before it is routed again, then goes back
//!   to the role the restored routed count gives it; none is cold-started.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::event::{Action, LogLevel, ProbeKind, StopSignal};
use super::node::Node;
use super::placement::Placed;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::Time;
use crate::config::LaunchSpec;

/// `stop_grace` for a replica whose model is no longer configured.
const ORPHAN_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
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
                };
                (name.clone(), rec)
            })
            .collect();
        let replicas = self
            .replicas
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
                m.desired_routed = rec.desired_routed.clamp(m.min(), m.max());
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
                Adoption::Found => "found alive after the previous run ended; warm-up first",
            };
            self.log_global(
                LogLevel::Info,
                format!("adopted {adopted} replica(s), stopping {stopped} ({how})"),
                out,
            );
        }
    }

    /// Why a recorded replica cannot be adopted; None: it can.
    fn refusal(&self, how: Adoption, rec: &ReplicaRecord) -> Option<String> {
        let Some(m) = self.models.get(&rec.model) else {
            return Some("its model is no longer configured".into());
        };
        if m.removed {
            return Some("its model is being removed".into());
        }
        if *m.spec != rec.spec {
            return Some(
                "its launch spec differs from the configuration's (changed while hearth was down)"
                    .into(),
            );
        }
        if ReplicaId::new(&rec.model, rec.n).0 != rec.replica || rec.n > MAX_N {
            return Some("its record does not match its name".into());
        }
        if !self.ports.claimable(rec.port) {
            return Some(format!(
                "port {} is outside daemon.ports or taken",
                rec.port
            ));
        }
        if let Some(u) = rec.gpus.iter().find(|u| self.gpus.slot(u).is_none()) {
            return Some(format!("its GPU {u} is not in the inventory"));
        }
        if rec.gpus.len() != m.spec.gpus as usize {
            return Some("its GPUs do not match its launch spec".into());
        }
        match (how, rec.state) {
            (_, ReplicaState::Pending) => Some("it was never started".into()),
            (Adoption::Found, ReplicaState::Draining | ReplicaState::Stopping) => {
                Some("it was leaving when hearth stopped".into())
            }
            _ => None,
        }
    }

    /// Takes one recorded replica back; false: it is being stopped instead.
    fn adopt_one(
        &mut self,
        how: Adoption,
        rec: ReplicaRecord,
        now: Time,
        out: &mut Vec<Action>,
    ) -> bool {
        let id = ReplicaId(rec.replica.clone());
        if self.replicas.contains_key(&id) {
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
        let spec = match self.models.get(&rec.model) {
            Some(m) if *m.spec == rec.spec => Arc::clone(&m.spec),
            _ => Arc::new(rec.spec.clone()),
        };
        let mut r = Replica::new(&rec.model, rec.n, spec, now, rec.restarts);
        r.id = id.clone();
        r.pid = Some(rec.pid);
        r.spawned_at = Some(now);
        r.adopted = true;
        if let Some(why) = refusal {
            if self.ports.claim(rec.port) {
                r.set_port(Some(rec.port));
            }
            let grace = self
                .models
                .get(&rec.model)
                .map_or(ORPHAN_STOP_GRACE, |m| m.config.stop_grace);
            r.state = ReplicaState::Stopping;
            r.deadline = Some(now + grace);
            r.reason = format!("not adopted: {why}").into();
            self.replicas.insert(r);
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
            return false;
        }
        self.ports.claim(rec.port);
        r.set_port(Some(rec.port));
        let devices: Vec<String> = rec
            .gpus
            .iter()
            .filter(|u| self.gpus.slot(u).is_some())
            .cloned()
            .collect();
        let bytes = self.gpus.bounded_bytes(&devices, rec.gpu_bytes);
        let placed = Placed { devices, bytes };
        let exclusive = rec.spec.gpu_memory.is_none();
        self.gpus
            .reserve(&id, &placed.devices, placed.bytes, exclusive);
        r.gpus = placed.devices;
        r.gpu_bytes = placed.bytes;
        let recheck = r.spec.warmup.recheck;
        match how {
            Adoption::HandedOver => {
                r.state = rec.state;
                r.ever_warm = rec.ever_warm;
                r.next_probe = now + recheck;
                self.replicas.insert(r);
                self.resume(&id, rec.state, now, out);
            }
            Adoption::Found => {
                r.state = ReplicaState::Starting;
                r.ever_warm = rec.ever_warm;
                r.was_routed = rec.state == ReplicaState::Routed;
                r.reason =
                    format!("adopted (was {}): re-verifying with its warm-up", rec.state).into();
                self.replicas.insert(r);
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

    /// A handed-over replica picks up where the previous binary left it.
    fn resume(&mut self, id: &ReplicaId, state: ReplicaState, now: Time, out: &mut Vec<Action>) {
        let Some(r) = self.replicas.get(id) else {
            return;
        };
        let Some(m) = self.models.get(&r.model) else {
            return;
        };
        let (drain, grace) = (m.config.scaling.drain_timeout, m.config.stop_grace);
        match state {
            ReplicaState::Starting => self.send_warmup(id, out),
            ReplicaState::Draining => {
                if let Some(r) = self.replicas.get_mut(id) {
                    r.deadline = Some(now + drain);
                    r.reason = "draining (handed over)".into();
                }
            }
            ReplicaState::Stopping => {
                if let Some(r) = self.replicas.get_mut(id) {
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
            ReplicaState::Pending | ReplicaState::Warm | ReplicaState::Routed => {}
        }
    }

    fn send_warmup(&mut self, id: &ReplicaId, out: &mut Vec<Action>) {
        let Some(spec) = self.probe_spec(id, ProbeKind::Warmup) else {
            return;
        };
        let Some(r) = self.replicas.get_mut(id) else {
            return;
        };
        r.probe_in_flight = true;
        out.push(Action::Probe {
            replica: id.clone(),
            kind: ProbeKind::Warmup,
            after: Default::default(),
            spec,
        });
    }

    fn publish_state(&self, id: &ReplicaId, out: &mut Vec<Action>) {
        if let Some(r) = self.replicas.get(id) {
            out.push(Action::Publish(crate::protocol::WatchEvent::Replica {
                model: r.model.clone(),
                replica: id.0.clone(),
                state: r.state.into(),
            }));
        }
    }
}
