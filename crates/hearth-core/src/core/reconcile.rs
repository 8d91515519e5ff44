//! The reconciler: after every event, move each model toward its desired routed count and warm
//! pool — promote first, launch behind, trim surplus — and place pending replicas on GPUs.

use std::sync::Arc;
use std::time::Duration;

use super::event::{Action, LogLevel, Readiness};
use super::node::Node;
use super::replica::{Replica, ReplicaId, ReplicaState};
use super::Time;
use crate::config::WarmPool;

/// How many of each state a model has now.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    /// Routed on healthy devices: the capacity that stays.
    pub routed: u32,
    /// Routed on a device being left; drained once replacements are routed.
    pub leaving: u32,
    pub warm: u32,
    pub starting: u32,
    pub pending: u32,
    /// Asleep, falling asleep, or draining to sleep (`[model.sleep]`).
    pub sleeping: u32,
    pub waking: u32,
}

/// Replicas one event may create for a model, and starts it may place: the work one event
/// asks of the loop (and of the spawner) is bounded whatever a `scale` asked for. Far above
/// what a GPU host starts at once; a thousand CPU replicas take about 30 events (each start's
/// `Spawned` is one), not one event of tens of milliseconds.
pub const STARTS_PER_EVENT: u32 = 32;

/// Routed replicas one event may unroute for a scale down (to the pool or to a drain): the
/// rest follow with the next events, as starts do.
pub const DRAINS_PER_EVENT: u32 = 32;

/// Surplus replicas (pending, starting, warm) one event may stop for a model: a `scale` from a
/// thousand back to two stops them over about 30 events, not in one (a thousand stops were a
/// millisecond of the loop). The rest follow with the next events: every event, the tick
/// included, reconciles every model again, and a stopped process answers with its exit.
pub const STOPS_PER_EVENT: u32 = 32;

/// What one surplus stop says.
pub(super) const SURPLUS: &str = "surplus: more than the model needs";

/// What the stop of an idle departing replica says.
pub(super) const DEPARTED: &str = "replaced: its GPU is being evacuated or its version rolled out";

/// Idle departing replicas are stopped pending first, then starting, then warm; the newest first.
fn stop_order(r: &Replica) -> (u8, std::cmp::Reverse<u64>) {
    let state = match r.state {
        ReplicaState::Pending => 0,
        ReplicaState::Starting => 1,
        _ => 2,
    };
    (state, std::cmp::Reverse(r.n))
}

impl Node {
    pub(super) fn reconcile(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.shutdown.is_some() {
            self.reconcile_shutdown(now, out);
            return;
        }
        let names: Vec<String> = self.models.keys().cloned().collect();
        for name in &names {
            self.reconcile_model(name, now, out);
            self.rollout_progress(name, out);
        }
        self.place_pending(now, out);
    }

    pub(super) fn counts(&self, model: &str) -> Counts {
        let mut c = Counts::default();
        for r in self.held.replicas().of_model(model) {
            match r.state {
                ReplicaState::Routed if self.departing(r) => c.leaving += 1,
                // Stopped within a few events (`reconcile_model`): no capacity, none coming.
                ReplicaState::Warm
                | ReplicaState::Starting
                | ReplicaState::Pending
                | ReplicaState::FallingAsleep
                | ReplicaState::Sleeping
                | ReplicaState::Waking
                    if self.departing(r) => {}
                ReplicaState::Routed => c.routed += 1,
                ReplicaState::Warm => c.warm += 1,
                ReplicaState::Starting => c.starting += 1,
                ReplicaState::Pending => c.pending += 1,
                ReplicaState::Sleeping | ReplicaState::FallingAsleep => c.sleeping += 1,
                ReplicaState::Draining if r.then_sleep => c.sleeping += 1,
                ReplicaState::Waking => c.waking += 1,
                ReplicaState::Draining | ReplicaState::Stopping => {}
            }
        }
        c
    }

    /// The pool the setting asks for, before `max` bounds it.
    fn pool_setting(&self, model: &str) -> u32 {
        let Some(m) = self.models.get(model) else {
            return 0;
        };
        if m.removed || m.idle_asleep {
            return 0;
        }
        match m.warm_pool_setting() {
            WarmPool::Fixed(n) => n,
            WarmPool::Auto => m.autoscaler.auto_pool(),
        }
    }

    /// The warm pool the model should hold next to `desired_routed` routed replicas.
    pub(super) fn desired_warm(&self, model: &str) -> u32 {
        let Some(m) = self.models.get(model) else {
            return 0;
        };
        self.pool_setting(model)
            .min(m.max().saturating_sub(m.desired_routed))
    }

    /// The pool to fill (by launches and by unrouting): smaller than `desired_warm` while
    /// routed replicas beyond the recent need already serve as headroom. Warm replicas above it
    /// are kept, not stopped: a dip in load must not turn into cold starts when it ends.
    pub(super) fn pool_to_fill(&self, model: &str) -> u32 {
        let Some(m) = self.models.get(model) else {
            return 0;
        };
        // Headroom first, then `max`: while routed replicas step down one by one, each goes
        // back to the pool as soon as the routed ones left no longer cover it.
        self.pool_setting(model)
            .saturating_sub(m.autoscaler.spare_routed(m.desired_routed))
            .min(m.max().saturating_sub(m.desired_routed))
    }

    fn reconcile_model(&mut self, name: &str, now: Time, out: &mut Vec<Action>) {
        if let Some(m) = self.models.get_mut(name) {
            m.placeable_pending = None;
        }
        let Some(m) = self.models.get(name) else {
            return;
        };
        let desired = if m.removed {
            0
        } else {
            m.desired_routed.clamp(m.routed_min(), m.max())
        };
        let max = if m.removed { 0 } else { m.max() };
        let (min, m_removed) = (m.routed_min(), m.removed);
        // With `[model.sleep]`, `min` counts replicas awake or asleep.
        let tier_min = m.min();
        let pool_all = self.desired_warm(name);
        let pool = self.awake_pool(name, pool_all);
        let fill_all = self.pool_to_fill(name);
        let fill = self.awake_pool(name, fill_all);
        let recheck = m.config.launch.warmup.recheck;

        // Departing replicas (on a device being left, or of a version being rolled away from)
        // that serve nothing go at once; routed ones wait for their replacement (below). At
        // most a batch per event, from the stops the surplus below may make: a rollout over a
        // thousand replicas stops them over about 30 events, as a scale down does. The rest
        // follow with the next events (every event, the tick included, reconciles every
        // model); meanwhile they are counted as nothing (`counts`), promoted never, and the
        // pending ones are not started (`place_pending`). Pending ones first: stopping one
        // costs nothing.
        let mut budget = STOPS_PER_EVENT;
        let idle_departing = self.ranked_first(
            name,
            |r| self.idle_departing(r),
            stop_order,
            budget as usize,
        );
        for id in idle_departing {
            self.stop(&id, DEPARTED, false, now, out);
            budget -= 1;
        }

        // Promote warm replicas first: milliseconds, not a cold start. Adopted replicas that
        // were routed before the daemon died keep their places while they re-verify: they are
        // routed again, not the pool.
        let mut c = self.counts(name);
        let verifying = self
            .held
            .replicas()
            .of_model(name)
            .filter(|r| r.state == ReplicaState::Starting && r.was_routed)
            .count() as u32;
        // Those that were routed before the daemon died first, then the oldest. Ranked once:
        // promoting one changes no other's rank (a walk over every replica per promotion made
        // a scale to a thousand cost O(n²)).
        let mut promotable = if c.routed + verifying < desired {
            self.ranked(
                name,
                |r| r.promotable() && !self.departing(r),
                |r| (!r.was_routed, r.n),
            )
        } else {
            Vec::new()
        }
        .into_iter();
        while c.routed + verifying < desired {
            let Some(id) = promotable.next() else {
                break;
            };
            let warm_before = self
                .held
                .replicas()
                .get(&id)
                .is_some_and(|r| r.since_event < self.events);
            self.set_state(&id, ReplicaState::Routed, now, out);
            if let Some(r) = self.held.replicas_mut().get_mut(&id) {
                r.next_probe = now;
            }
            c.routed += 1;
            c.warm = c.warm.saturating_sub(1);
            self.log(
                LogLevel::Info,
                name,
                Some(&id),
                format!("promoted: routed {} of {desired}", c.routed),
                out,
            );
            if warm_before {
                out.push(Action::Ready {
                    model: name.to_string(),
                    replica: id,
                    how: Readiness::Promoted,
                });
            }
        }

        // Routed replicas an operator asked to drain drain once the others keep `min` routed.
        let min = if m_removed { 0 } else { min };
        while c.leaving > 0 && c.routed >= min {
            let Some(id) = self.pick(
                name,
                |r| r.state == ReplicaState::Routed && r.drain_asked,
                false,
            ) else {
                break;
            };
            self.begin_drain(
                &id,
                "drained by operator: its replacement is routed",
                now,
                out,
            );
            c.leaving -= 1;
        }

        // Routed replicas on a device being left drain once the healthy ones cover `desired`;
        // until then they keep serving, so routed capacity never drops for an evacuation.
        while c.leaving > 0 && c.routed >= desired {
            let Some(id) = self.pick(
                name,
                |r| r.state == ReplicaState::Routed && self.departing(r),
                false,
            ) else {
                break;
            };
            self.begin_drain(&id, "replaced: its replacement is routed", now, out);
            c.leaving -= 1;
        }

        // A sleeping tier wakes what promotion could not cover, and keeps `hold` replicas.
        let sleepy = self.sleepy(name);
        if sleepy {
            self.wake_for(name, &mut c, desired, fill, now, out);
        }
        let hold = self.sleep_hold(name, desired + pool_all, now);

        // Too many routed: back to the pool if it is short (what it holds it finishes there),
        // else to sleep while the tier holds fewer than it keeps, else drain.
        // The least busy first, the newest among equals; ranked once, as above.
        // (Only as many as this event may unroute are ranked and copied.)
        let mut least_busy = self
            .ranked_first(
                name,
                |r| r.state == ReplicaState::Routed,
                |r| {
                    let busy = r.signal.last().map_or(0, |s| s.in_flight + s.queue_depth);
                    (busy, std::cmp::Reverse(r.n))
                },
                c.routed.saturating_sub(desired).min(DRAINS_PER_EVENT) as usize,
            )
            .into_iter();
        let mut scaled_down = 0;
        while c.routed > desired && scaled_down < DRAINS_PER_EVENT {
            scaled_down += 1;
            let Some(id) = least_busy.next() else {
                break;
            };
            if c.warm < fill {
                self.set_state(&id, ReplicaState::Warm, now, out);
                if let Some(r) = self.held.replicas_mut().get_mut(&id) {
                    r.next_probe = now + recheck;
                }
                c.warm += 1;
                self.log(
                    LogLevel::Info,
                    name,
                    Some(&id),
                    "unrouted: back to the warm pool".into(),
                    out,
                );
            } else if hold > c.routed - 1 + c.warm + c.starting + c.pending + c.waking + c.sleeping
                && self.sleepers_allowed(name) > 0
            {
                self.begin_drain(&id, "scale down: to sleep once drained", now, out);
                if let Some(r) = self.held.replicas_mut().get_mut(&id) {
                    r.then_sleep = true;
                }
                c.sleeping += 1;
            } else {
                self.begin_drain(&id, "scale down", now, out);
            }
            c.routed -= 1;
        }

        // Replicas on their way (warm, starting, pending) should cover the routed deficit plus
        // the pool, within max.
        let coming = c.warm + c.starting + c.pending + c.waking;
        let mut need = desired.saturating_sub(c.routed) + fill;
        let awake_keep = desired.saturating_sub(c.routed) + pool;
        let mut keep = awake_keep;
        if sleepy {
            // `min` counts replicas awake or asleep, and the pool the policy sizes is held
            // asleep where wakes stand in for it: cold starts fill the tier up to both (they
            // warm, then sleep), and replicas on their way that fill it are not surplus.
            let all = c.routed + coming + c.sleeping;
            let tier = tier_min.max(desired + fill_all).min(max);
            need = need.max(coming + tier.saturating_sub(all));
            keep = keep.max(hold.saturating_sub(c.routed + c.sleeping));
        }
        if coming < need {
            let room = max.saturating_sub(c.routed + coming + c.sleeping);
            // At most a batch per event: the rest come with the events that follow (every
            // start answers with one), so `scale` to a thousand costs the loop no more than
            // any other event.
            for _ in 0..(need - coming).min(room).min(STARTS_PER_EVENT) {
                self.create_pending(name, now, out);
            }
        } else if coming > keep {
            let mut surplus = coming - keep;
            let stale_after = self
                .models
                .get(name)
                .map_or(Duration::ZERO, |m| m.config.scaling.stale_after);
            // A warm replica that left the routed set may still be finishing work: while its
            // reports say so, it is not surplus yet.
            let finishing = |r: &Replica| {
                r.state == ReplicaState::Warm
                    && r.signal
                        .fresh(now, stale_after)
                        .is_some_and(|s| s.in_flight > 0 || s.queue_depth > 0)
            };
            // Pending ones first (stopping one costs nothing), at most a batch per event (less
            // the departing ones stopped above).
            let mut pending_left = c.pending;
            for state in [
                ReplicaState::Pending,
                ReplicaState::Starting,
                ReplicaState::Warm,
            ] {
                if surplus == 0 || budget == 0 {
                    break;
                }
                // Adopted replicas re-verifying their warm-up are not surplus: they are the
                // capacity being taken back. The newest first; ranked once, as above, and only
                // as many as this event may stop.
                // Departing ones are not either: they are stopped above, as such.
                let surplus_of = |r: &Replica| {
                    r.state == state
                        && !(finishing(r)
                            || self.departing(r)
                            || (r.adopted && r.state == ReplicaState::Starting))
                };
                let take = surplus.min(budget) as usize;
                let newest = self.ranked_first(name, surplus_of, |r| std::cmp::Reverse(r.n), take);
                for id in newest {
                    self.stop(&id, SURPLUS, false, now, out);
                    surplus -= 1;
                    budget -= 1;
                    if state == ReplicaState::Pending {
                        pending_left = pending_left.saturating_sub(1);
                    }
                }
            }
            // Stops left for the next events: the pending replicas they will stop (the newest)
            // must not be started meanwhile.
            if surplus > 0 {
                if let Some(m) = self.models.get_mut(name) {
                    m.placeable_pending = Some(pending_left.saturating_sub(surplus));
                }
            }
        }
        // Also once the tier is gone (the model removed, or its `[model.sleep]`): its sleeping
        // replicas stop.
        if sleepy || c.sleeping > 0 {
            self.sleep_trim(name, awake_keep, hold, now, out);
        }
    }

    /// Departing and serving nothing: stopped (a batch per event) rather than drained.
    pub(super) fn idle_departing(&self, r: &Replica) -> bool {
        matches!(
            r.state,
            ReplicaState::Warm
                | ReplicaState::Starting
                | ReplicaState::Pending
                | ReplicaState::Sleeping
                | ReplicaState::FallingAsleep
        ) && self.departing(r)
    }

    /// On its way out: on a device being left, or made from a configuration being rolled away
    /// from.
    pub(super) fn departing(&self, r: &Replica) -> bool {
        r.drain_asked
            || self.held.gpus().leaving(&r.gpus)
            || self
                .models
                .get(&r.model)
                .is_some_and(|m| r.spec != *m.launch_spec())
    }

    /// The oldest (or newest) replica of the model that matches.
    fn pick(&self, model: &str, f: impl Fn(&Replica) -> bool, newest: bool) -> Option<ReplicaId> {
        let it = self.held.replicas().of_model(model).filter(|r| f(r));
        let r = if newest {
            it.max_by_key(|r| r.n)
        } else {
            it.min_by_key(|r| r.n)
        };
        r.map(|r| r.id.clone())
    }

    /// The replicas of the model that match, in `key`'s order: for a loop that takes several
    /// in turn, one walk and a sort instead of a walk per pick.
    fn ranked<K: Ord>(
        &self,
        model: &str,
        f: impl Fn(&Replica) -> bool,
        key: impl Fn(&Replica) -> K,
    ) -> Vec<ReplicaId> {
        let mut v: Vec<(K, ReplicaId)> = self
            .held
            .replicas()
            .of_model(model)
            .filter(|r| f(r))
            .map(|r| (key(r), r.id.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().map(|(_, id)| id).collect()
    }

    /// The first `k` of [`Self::ranked`], copying only their ids: a loop that may take a batch
    /// of a thousand candidates pays a partial selection, not a sort and a copy of all.
    pub(super) fn ranked_first<K: Ord>(
        &self,
        model: &str,
        f: impl Fn(&Replica) -> bool,
        key: impl Fn(&Replica) -> K,
        k: usize,
    ) -> Vec<ReplicaId> {
        if k == 0 {
            return Vec::new();
        }
        // The walk's position breaks ties, as `ranked`'s stable sort does.
        let mut v: Vec<(K, usize, &ReplicaId)> = self
            .held
            .replicas()
            .of_model(model)
            .filter(|r| f(r))
            .enumerate()
            .map(|(i, r)| (key(r), i, &r.id))
            .collect();
        let by = |a: &(K, usize, &ReplicaId), b: &(K, usize, &ReplicaId)| {
            a.0.cmp(&b.0).then(a.1.cmp(&b.1))
        };
        if v.len() > k {
            v.select_nth_unstable_by(k - 1, by);
            v.truncate(k);
        }
        v.sort_unstable_by(by);
        v.into_iter().map(|(_, _, id)| id.clone()).collect()
    }

    fn create_pending(&mut self, model: &str, now: Time, out: &mut Vec<Action>) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let mut n = m.next_n;
        // Never an id in use (an adopted replica's whose record said little).
        while self.held.replicas().contains_key(&ReplicaId::new(model, n)) {
            n += 1;
        }
        m.next_n = n + 1;
        let restarts = m.failures.len() as u32;
        let spec = Arc::clone(m.launch_spec());
        let globs = spec.prefetch.clone();
        let r = Replica::new(model, n, spec, now, restarts);
        let id = r.id.clone();
        self.held.add(r);
        if !globs.is_empty() {
            out.push(Action::Prefetch {
                replica: id.clone(),
                model: model.to_string(),
                globs,
            });
        }
        out.push(Action::Publish(crate::protocol::WatchEvent::Replica {
            model: model.to_string(),
            replica: id.0,
            state: ReplicaState::Pending.into(),
        }));
    }

    fn reconcile_shutdown(&mut self, now: Time, out: &mut Vec<Action>) {
        let Some(deadline) = self.shutdown.as_ref().map(|s| s.deadline) else {
            return;
        };
        let ids: Vec<ReplicaId> = self.held.replicas().keys().cloned().collect();
        for id in ids {
            let Some(r) = self.held.replicas().get(&id) else {
                continue;
            };
            match r.state {
                ReplicaState::Routed => self.begin_drain(&id, "shutdown", now, out),
                ReplicaState::Warm
                | ReplicaState::Starting
                | ReplicaState::Pending
                | ReplicaState::FallingAsleep
                | ReplicaState::Sleeping
                | ReplicaState::Waking => self.stop(&id, "shutdown", false, now, out),
                ReplicaState::Draining => {
                    let grace = self
                        .models
                        .get(&r.model)
                        .map(|m| m.config.stop_grace)
                        .unwrap_or_default();
                    let limit = deadline - grace;
                    if let Some(r) = self.held.replicas_mut().get_mut(&id) {
                        r.deadline = r.deadline.map(|d| d.min(limit));
                    }
                }
                ReplicaState::Stopping => {}
            }
        }
        self.check_shutdown_complete(out);
    }
}
