//! Arbitration when GPUs are full: a model that needs routed capacity, and must start a replica
//! or wake one where other models' replicas hold the devices, takes room from them.
//!
//! Who gives way, and how (docs/gpus.md "Reclaim", docs/sleep.md "Eviction"):
//! - never a replica of a pinned model, nor one of a model of higher priority;
//! - warm replicas first, then routed ones; a routed one of a model with `[model.sleep]` only
//!   while its model has nothing queued or in flight, and any other routed one only for a
//!   model of strictly higher priority and above its model's `min`;
//! - a replica of a model with `[model.sleep]` (on a share of its devices, within `[daemon]
//!   host_memory`) is put to sleep, drained first when routed: it comes back in a wake. Any
//!   other is stopped, drained first when routed: it comes back only in a cold start;
//! - so, in order: warm before routed, then those that sleep before those that stop, then the
//!   lower priority, then the quickest to get back (the measured wake, or the cold start),
//!   then the newest;
//! - as few as make it fit: the first in that order until the need fits, then each one that
//!   the rest make unnecessary is spared.

use std::collections::BTreeMap;
use std::time::Duration;

use super::event::{Action, LogLevel};
use super::gpu::GpuTable;
use super::model::ScaleRecord;
use super::node::Node;
use super::placement::Want;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::Time;
use crate::protocol::WatchEvent;

/// The most candidates one pass weighs: a pass runs on every event while a need waits, so its
/// cost is bounded whatever the number of replicas.
const CANDIDATES: usize = 64;

/// A routed replica is put to sleep for another model only once it has been routed this long:
/// long enough for the front doors' reports (every 100 ms) made after its routing to show the
/// work sent to it, so that one just woken for its queue is not taken before that queue reached
/// it. (Each switch waits this long: it is kept short.)
const ROUTED_SETTLE: Duration = Duration::from_millis(250);

/// What needs the room.
pub(super) enum Need<'a> {
    /// A cold start of this launch, wherever placement would put it.
    Start(&'a crate::config::LaunchSpec),
    /// A wake: `more` bytes on each of these devices.
    Wake { devices: &'a [String], more: u64 },
}

impl Need<'_> {
    fn fits(&self, t: &GpuTable) -> bool {
        match self {
            Need::Start(launch) => {
                let none = std::collections::BTreeSet::new();
                t.place(&Want::of(launch, &none)).is_ok()
            }
            Need::Wake { devices, more } => devices
                .iter()
                .all(|u| t.slot(u).is_some_and(|s| s.free() >= *more)),
        }
    }

    /// The replica's reservation bears on the need at all.
    fn touches(&self, r: &Replica) -> bool {
        match self {
            Need::Start(_) => true,
            Need::Wake { devices, .. } => r.gpus.iter().any(|u| devices.contains(u)),
        }
    }
}

/// How a victim gives way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum GiveWay {
    /// Put to sleep (drained first if routed): back in a wake.
    Sleep,
    /// Stopped (drained first if routed): back in a cold start.
    Stop,
}

struct Candidate {
    id: ReplicaId,
    /// Its number: the newest goes first among equals.
    n: u64,
    model: String,
    priority: i32,
    routed: bool,
    way: GiveWay,
    /// How long getting it back takes: its model's median wake, or its cold start.
    back: Duration,
    /// What it holds on each of its devices once it gave way.
    after: u64,
    host_memory: u64,
}

impl Candidate {
    /// The order of giving way (the module's comment).
    fn order(&self) -> (bool, GiveWay, i32, u128, std::cmp::Reverse<u64>) {
        (
            self.routed,
            self.way,
            self.priority,
            self.back.as_millis(),
            std::cmp::Reverse(self.n),
        )
    }
}

impl Node {
    /// Room for the pending replica `id` that placement cannot fit. Only a scale-up reclaims:
    /// refilling a warm pool or a sleeping tier never takes from others.
    pub(super) fn reclaim_start(
        &mut self,
        id: &ReplicaId,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Option<ReplicaId> {
        let model = self.held.replicas().get(id)?.model.clone();
        let c = self.counts(&model);
        let m = self.models.get(&model)?;
        if m.desired_routed <= c.routed + c.leaving + c.warm + c.starting + c.waking {
            return None;
        }
        let launch = m.launch_spec().clone();
        self.reclaim_for(id, Need::Start(&launch), now, out)
    }

    /// Starts freeing room for `id` (a pending replica to start, or a sleeping one to wake, as
    /// `need` says) from other models' replicas. Returns one of the replicas giving way for
    /// its model (also when they were chosen before and are still on their way); None: no set
    /// of them would make it fit.
    pub(super) fn reclaim_for(
        &mut self,
        id: &ReplicaId,
        need: Need<'_>,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Option<ReplicaId> {
        let r = self.held.replicas().get(id)?;
        let model = r.model.clone();
        let prio = self.models.get(&model)?.config.priority;
        if let Some(v) = self
            .held
            .replicas()
            .values()
            .find(|v| v.reclaimed_for.as_deref() == Some(model.as_str()))
        {
            return Some(v.id.clone());
        }
        let chosen = self.victims(&model, prio, &need, now)?;
        let first = chosen.first().map(|c| c.id.clone());
        let what = match need {
            Need::Start(_) => "a start",
            Need::Wake { .. } => "a wake",
        };
        for c in chosen {
            let why = match c.way {
                GiveWay::Sleep => {
                    format!("put to sleep for {what} of model {model} (priority {prio})")
                }
                GiveWay::Stop => format!("GPU reclaimed by model {model} (priority {prio})"),
            };
            self.give_way(c, &model, &why, now, out);
        }
        first
    }

    /// The fewest candidates, in order, whose giving way makes `need` fit; None: all of them
    /// would not.
    fn victims(
        &self,
        model: &str,
        prio: i32,
        need: &Need<'_>,
        now: Time,
    ) -> Option<Vec<Candidate>> {
        let mut chosen: Vec<Candidate> = Vec::new();
        let mut changes: Vec<(ReplicaId, u64)> = Vec::new();
        let mut host_room = self.host_memory_room();
        // Routed replicas taken per model, against its `min` and its last routed one.
        let mut taken: BTreeMap<String, u32> = BTreeMap::new();
        let mut fits = false;
        for mut c in self.reclaim_candidates(model, prio, need, now) {
            if c.way == GiveWay::Sleep {
                if let Some(room) = host_room.as_mut() {
                    if c.host_memory > *room {
                        // No host RAM to sleep in: stopped, where a stop is allowed.
                        if c.routed && c.priority >= prio {
                            continue;
                        }
                        c.way = GiveWay::Stop;
                        c.after = 0;
                        c.host_memory = 0;
                    }
                    *room -= c.host_memory;
                }
            }
            if c.routed && c.way == GiveWay::Stop {
                let Some(m) = self.models.get(&c.model) else {
                    continue;
                };
                let t = taken.get(&c.model).copied().unwrap_or(0);
                if self.count(&c.model, ReplicaState::Routed).saturating_sub(t) <= m.routed_min() {
                    continue;
                }
            }
            if c.routed {
                *taken.entry(c.model.clone()).or_default() += 1;
            }
            changes.push((c.id.clone(), c.after));
            chosen.push(c);
            if need.fits(&self.held.gpus_after(&changes)) {
                fits = true;
                break;
            }
        }
        if !fits {
            return None;
        }
        // Spare each one the later ones make unnecessary, the last chosen kept (it made it fit).
        let mut i = chosen.len().saturating_sub(1);
        while i > 0 {
            i -= 1;
            let mut without = changes.clone();
            without.remove(i);
            if need.fits(&self.held.gpus_after(&without)) {
                changes = without;
                chosen.remove(i);
            }
        }
        Some(chosen)
    }

    /// Replicas of other models that `model` (priority `prio`) may take room from, in the
    /// order they give way (the module's comment), at most `CANDIDATES`.
    fn reclaim_candidates(
        &self,
        model: &str,
        prio: i32,
        need: &Need<'_>,
        now: Time,
    ) -> Vec<Candidate> {
        let mut v: Vec<Candidate> = Vec::new();
        // Whether a model with a sleeping tier shows nothing queued or in flight, per model.
        let mut quiet: BTreeMap<&str, bool> = BTreeMap::new();
        for r in self.held.replicas().values() {
            if r.model == model || r.gpus.is_empty() || r.reclaimed_for.is_some() {
                continue;
            }
            if !need.touches(r) || self.departing(r) {
                continue;
            }
            let Some(m) = self.models.get(&r.model) else {
                continue;
            };
            // `pin = true`: never reclaimed nor put to sleep for another model.
            let p = m.config.priority;
            if m.config.pin || m.removed || p > prio {
                continue;
            }
            let routed = match r.state {
                ReplicaState::Warm => false,
                ReplicaState::Routed => true,
                _ => continue,
            };
            // Asleep it still holds `gpu_memory_asleep` of a shared device; on whole devices
            // sleep frees nothing.
            let asleep = self
                .awake_asleep(&r.id)
                .map(|(_, a)| a)
                .filter(|a| *a < r.gpu_bytes);
            let way = match asleep {
                Some(_) if !routed => GiveWay::Sleep,
                Some(_) => {
                    let q = *quiet.entry(r.model.as_str()).or_insert_with(|| {
                        self.model_signal(&r.model, now)
                            .is_some_and(|s| !s.holds_work())
                    });
                    if q && now.since(r.since) >= ROUTED_SETTLE {
                        GiveWay::Sleep
                    } else if p < prio {
                        GiveWay::Stop
                    } else {
                        continue;
                    }
                }
                None if routed && p >= prio => continue,
                None => GiveWay::Stop,
            };
            v.push(Candidate {
                id: r.id.clone(),
                n: r.n,
                model: r.model.clone(),
                priority: p,
                routed,
                way,
                back: match way {
                    GiveWay::Sleep => m.wakes.p50().unwrap_or_default(),
                    GiveWay::Stop => m.time_to_ready.unwrap_or(Duration::MAX),
                },
                after: match way {
                    GiveWay::Sleep => asleep.unwrap_or(0),
                    GiveWay::Stop => 0,
                },
                host_memory: match way {
                    GiveWay::Sleep => self.host_memory_of(&r.model),
                    GiveWay::Stop => 0,
                },
            });
        }
        let by = |a: &Candidate, b: &Candidate| a.order().cmp(&b.order()).then(a.id.cmp(&b.id));
        if v.len() > CANDIDATES {
            v.select_nth_unstable_by(CANDIDATES - 1, by);
            v.truncate(CANDIDATES);
        }
        v.sort_by(by);
        v
    }

    /// The victim leaves the routed set (its model gives up one routed replica), or the pool,
    /// and sleeps or stops.
    fn give_way(&mut self, c: Candidate, model: &str, why: &str, now: Time, out: &mut Vec<Action>) {
        let Some(v) = self.held.replicas_mut().get_mut(&c.id) else {
            return;
        };
        v.reclaimed_for = Some(model.to_string());
        if let Some(vm) = self.models.get_mut(&c.model) {
            vm.gave_way += 1;
            vm.last_gave_way = Some(format!("{}: {why}", c.id));
        }
        self.log(LogLevel::Info, &c.model, Some(&c.id), why.to_string(), out);
        if c.routed {
            // The victim's model gives up one routed replica: its autoscaler owns the count, and
            // must not relaunch what was just taken.
            if let Some(vm) = self.models.get_mut(&c.model) {
                let from = vm.desired_routed;
                let mut to = from.saturating_sub(1).max(vm.routed_min());
                if c.way == GiveWay::Sleep && from <= 1 {
                    // Its last one: it stays at zero until a request waits for it.
                    vm.idle_asleep = true;
                    vm.evicted = true;
                    to = 0;
                }
                vm.desired_routed = to;
                vm.last_scale = Some(ScaleRecord {
                    at: now,
                    from,
                    to,
                    reason: why.to_string(),
                });
                out.push(Action::Publish(WatchEvent::Scale {
                    model: c.model.clone(),
                    from,
                    to,
                    reason: why.to_string(),
                }));
            }
            self.begin_drain(&c.id, why, now, out);
            if c.way == GiveWay::Sleep {
                if let Some(v) = self.held.replicas_mut().get_mut(&c.id) {
                    v.then_sleep = true;
                }
            }
        } else if c.way == GiveWay::Sleep {
            self.begin_sleep(&c.id, why, now, out);
        } else {
            self.stop(&c.id, why, false, now, out);
        }
    }
}
