//! Placing pending replicas: a port and GPUs for each, oldest first (higher priority first),
//! once its model's restart back-off has passed; at most a batch of starts per event.
//!
//! This runs after every event and looks at every pending replica, and a `scale` to the whole
//! port range leaves up to a thousand of them waiting for ports that draining replicas still
//! hold: the pass costs O(pending + replicas) with small constants — what it learns of a model
//! (its place in the pass, what its starts wait for, why it has no capacity) is kept per model,
//! not per replica, and a replica's reason is rewritten only when it changed.

use std::collections::{BTreeMap, BTreeSet};

use super::event::{Action, SpawnSpec};
use super::node::Node;
use super::placement::Want;
use super::reconcile::STARTS_PER_EVENT;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::reservations::Handle;
use super::Time;
use crate::config::DeviceNaming;

/// A pending replica's reason when every port of the range is handed out or passed over.
const NO_PORT: &str = "no free port in daemon.ports";

/// What one pass learnt of a model.
#[derive(Default)]
struct ModelPass {
    /// The pass looked at one of its pending replicas: what it says about capacity is new.
    reached: bool,
    /// Why GPUs cannot take its replicas, if they cannot.
    blocked: Option<String>,
    /// One of its replicas found no free port.
    no_port: bool,
    /// What its starts wait for (`held_for`, a walk over every replica), taken once per pass
    /// and again only after the pass changed it (a start placed on devices, a replica
    /// reclaimed).
    held: Option<BTreeMap<String, String>>,
    /// How many more of its pending replicas may start, while its surplus stops are unfinished
    /// (see `ModelState::placeable_pending`).
    placeable: Option<u32>,
}

impl Node {
    /// Gives pending replicas a port and GPUs, oldest first, once their back-off has passed.
    pub(super) fn place_pending(&mut self, now: Time, out: &mut Vec<Action>) {
        // The models in name order; a pending replica carries its model's place here.
        let names: Vec<String> = self.models.keys().cloned().collect();
        let mut pass: Vec<ModelPass> = names
            .iter()
            .map(|n| ModelPass {
                placeable: self.models.get(n).and_then(|m| m.placeable_pending),
                ..ModelPass::default()
            })
            .collect();
        // Higher priority first, then oldest: a model that reclaimed GPUs gets them. (A replica
        // of a model no longer configured is never placed.) Held by handle: most stay pending,
        // and their ids are not copied for it.
        let mut pending: Vec<(i32, Time, u64, Handle, usize)> = self
            .held
            .replicas()
            .unordered()
            .filter(|(_, r)| r.state == ReplicaState::Pending)
            // Departing: stopped by the next events (`reconcile_model`), never started.
            .filter(|(_, r)| !self.departing(r))
            .filter_map(|(h, r)| {
                let ix = names
                    .binary_search_by(|n| n.as_str().cmp(r.model.as_str()))
                    .ok()?;
                // Every one left is surplus the next events stop: not even sorted.
                if pass.get(ix).is_some_and(|p| p.placeable == Some(0)) {
                    return None;
                }
                let prio = self.models.get(&r.model).map_or(0, |m| m.config.priority);
                Some((-prio, r.created, r.n, h, ix))
            })
            .collect();
        // Ties (replicas of two models made at once with the same number) go by id.
        let id_of = |h: Handle| self.held.replicas().at(h).map(|r| &r.id);
        pending.sort_unstable_by(|a, b| {
            (a.0, a.1, a.2)
                .cmp(&(b.0, b.1, b.2))
                .then_with(|| id_of(a.3).cmp(&id_of(b.3)))
        });
        // Once the pool has no port, it has none for the rest of this pass (nothing is given
        // back here): the others are not scanned for one, so a pass costs O(pending), not
        // O(pending × ports).
        let mut ports_left = true;
        // Starts placed in this pass: at most a batch (see `STARTS_PER_EVENT`); the rest stay
        // pending, oldest first, for the next event.
        let mut placed_now = 0;
        for (_, _, _, h, ix) in pending {
            if placed_now >= STARTS_PER_EVENT {
                break;
            }
            let (Some(model), Some(this)) = (names.get(ix), pass.get_mut(ix)) else {
                continue;
            };
            if self.held.replicas().at(h).is_none() || this.placeable == Some(0) {
                continue;
            }
            this.reached = true;
            let Some(m) = self.models.get(model) else {
                continue;
            };
            if now < m.backoff_until {
                let wait = m.backoff_until.since(now);
                let why = format!(
                    "restart back-off: starts in {}",
                    crate::units::short_duration(wait)
                );
                if let Some(r) = self.held.replicas_mut().at_mut(h) {
                    set_reason(r, &why);
                }
                continue;
            }
            let launch = m.launch_spec();
            let exclusive = launch.gpu_memory.is_none();
            // Placed as if nothing were held; a device that is held (a start under way on it,
            // or the first memory readings pending) is then waited for, never swapped for
            // another: `pack` still fills one device, and a multi-GPU set is never split.
            let nothing = BTreeSet::new();
            let placed = match self.held.gpus().place(&Want::of(launch, &nothing)) {
                Ok(p) => {
                    let wait = if p.devices.is_empty() {
                        None
                    } else {
                        let held = match &mut this.held {
                            Some(held) => held,
                            none => none.insert(self.held_for(model, now)),
                        };
                        p.devices.iter().find_map(|u| held.get(u)).cloned()
                    };
                    if let Some(wait) = wait {
                        if let Some(r) = self.held.replicas_mut().at_mut(h) {
                            set_reason(r, &wait);
                        }
                        continue;
                    }
                    p
                }
                Err(why) => {
                    let Some(id) = self.held.replicas().at(h).map(|r| r.id.clone()) else {
                        continue;
                    };
                    let why = match self.reclaim_start(&id, now, out) {
                        Some(victim) => {
                            pass.iter_mut().for_each(|p| p.held = None);
                            format!("{why}; reclaiming the GPU of {victim}")
                        }
                        None => why.to_string(),
                    };
                    if let Some(r) = self.held.replicas_mut().get_mut(&id) {
                        set_reason(r, &why);
                    }
                    if let Some(this) = pass.get_mut(ix) {
                        this.blocked = Some(why);
                    }
                    continue;
                }
            };
            self.note_unread(&placed.devices, out);
            if self.held.replicas().at(h).is_none() {
                continue;
            }
            let port = ports_left
                .then(|| self.held.place(h, &placed, exclusive))
                .flatten();
            let Some(r) = self.held.replicas_mut().at_mut(h) else {
                continue;
            };
            if port.is_none() {
                ports_left = false;
                set_reason(r, NO_PORT);
                if let Some(this) = pass.get_mut(ix) {
                    this.no_port = true;
                }
                continue;
            }
            r.spawned_at = Some(now);
            let id = r.id.clone();
            if !placed.devices.is_empty() {
                pass.iter_mut().for_each(|p| p.held = None);
            }
            placed_now += 1;
            if let Some(this) = pass.get_mut(ix) {
                this.placeable = this.placeable.map(|n| n.saturating_sub(1));
            }
            self.set_state(&id, ReplicaState::Starting, now, out);
            if let Some(spec) = self.spawn_spec(&id) {
                out.push(Action::Spawn(spec));
            }
        }
        for (model, this) in names.iter().zip(pass) {
            if placed_now >= STARTS_PER_EVENT && !this.reached {
                continue;
            }
            if let Some(m) = self.models.get_mut(model) {
                m.no_capacity = this.blocked;
                if this.no_port {
                    m.stalled = Some(NO_PORT.to_string());
                }
            }
        }
    }
}

/// Says why `r` waits, writing only a reason that changed (most passes find the same one: a
/// copy per pending replica per event was most of what a pass cost).
fn set_reason(r: &mut Replica, why: &str) {
    if *r.reason != *why {
        r.reason = why.into();
    }
}

impl Node {
    /// What the shell runs for a placed replica: its command with the placeholders expanded,
    /// and the environment that names its devices, its socket and itself.
    pub(super) fn spawn_spec(&self, id: &ReplicaId) -> Option<SpawnSpec> {
        let r = self.held.replicas().get(id)?;
        // The configuration the replica was made from: during a rollout, old or new.
        let model_config = self.models.get(&r.model)?.config_of(&r.spec);
        let c = &model_config.launch;
        let vars = self.placeholders(r);
        let expand = |s: &str| crate::config::expand(s, &vars);
        let mut env: Vec<(String, String)> =
            c.env.iter().map(|(k, v)| (k.clone(), expand(v))).collect();
        let uuids = r.gpus.clone();
        // hearth's placement wins over anything else naming devices (validation refuses these
        // in `env`; the order here makes sure of it).
        match c.device_naming {
            DeviceNaming::Uuid => env.push(("CUDA_VISIBLE_DEVICES".into(), uuids.join(","))),
            DeviceNaming::Index => {
                let indices: Vec<String> = self
                    .held
                    .gpus()
                    .indices(&uuids)
                    .iter()
                    .map(u32::to_string)
                    .collect();
                env.push(("CUDA_VISIBLE_DEVICES".into(), indices.join(",")));
                // NVML numbers devices in PCI bus order; CUDA, by default, fastest first.
                env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
            }
        }
        // "void" is the container runtime's word for no GPU; empty would mean all.
        let nvidia = if uuids.is_empty() {
            "void".to_string()
        } else {
            uuids.join(",")
        };
        env.push(("NVIDIA_VISIBLE_DEVICES".into(), nvidia));
        env.push((
            "HEARTH_SOCKET".into(),
            self.config.daemon.socket.display().to_string(),
        ));
        env.push(("HEARTH_MODEL".into(), r.model.clone()));
        env.push(("HEARTH_REPLICA".into(), r.id.0.clone()));
        env.push(("HEARTH_PORT".into(), r.port.unwrap_or(0).to_string()));
        Some(SpawnSpec {
            replica: id.clone(),
            model: r.model.clone(),
            command: c.command.iter().map(|s| expand(s)).collect(),
            env,
            user: c.user.clone(),
            port: r.port.unwrap_or(0),
            gpus: uuids,
            stop_grace: model_config.stop_grace,
        })
    }
}
