//! The sleeping tier of a model with `[model.sleep]` (docs/sleep.md): how many replicas it
//! keeps awake or asleep, which sleeping ones a scale up wakes, which warm ones go to sleep and
//! which sleeping ones stop; and what it measured of its wakes. The reconciler calls these.
//!
//! `min` counts replicas awake or asleep, and the tier keeps as many as the model needed
//! within the last `idle_to_zero` (its peak), at least `min`, within `max`: a replica that
//! leaves the routed set sleeps while the model holds fewer, else it stops.

use std::collections::VecDeque;
use std::time::Duration;

use super::event::Action;
use super::node::Node;
use super::policy::Decision;
use super::reconcile::{Counts, STOPS_PER_EVENT};
use super::replica::{Replica, ReplicaState};
use super::Time;
use crate::protocol::WakeView;

/// Wakes remembered for the percentiles.
const RECENT_WAKES: usize = 128;
/// Changes of the need remembered; older ones are forgotten first (the peak can only be
/// underestimated by it, and only after this many changes within one `idle_to_zero`).
const PEAKS: usize = 256;

/// What one stop of a sleeping replica the tier no longer needs says.
pub(super) const SLEEP_SURPLUS: &str = "surplus: the sleeping tier holds more than the model needs";

/// A model's wakes: first wake request → warm-up passed.
#[derive(Debug, Clone, Default)]
pub struct WakeTimes {
    recent: VecDeque<Duration>,
    pub wakes: u64,
    pub failed: u64,
    last: Option<Duration>,
}

impl WakeTimes {
    pub fn record(&mut self, d: Duration) {
        self.wakes += 1;
        self.last = Some(d);
        self.recent.push_back(d);
        if self.recent.len() > RECENT_WAKES {
            self.recent.pop_front();
        }
    }

    /// Nearest rank over the recent wakes.
    fn percentile(&self, p: f64) -> Option<Duration> {
        let mut v: Vec<Duration> = self.recent.iter().copied().collect();
        v.sort_unstable();
        let rank = ((p * v.len() as f64).ceil() as usize).max(1);
        v.get(rank - 1).copied()
    }

    /// The median of the recent wakes: what waking one back is expected to cost.
    pub fn p50(&self) -> Option<Duration> {
        self.percentile(0.5)
    }

    pub fn view(&self) -> WakeView {
        let ms = |d: Duration| d.as_millis() as u64;
        WakeView {
            wakes: self.wakes,
            failed: self.failed,
            last_ms: self.last.map(ms),
            p50_ms: self.percentile(0.5).map(ms),
            p99_ms: self.percentile(0.99).map(ms),
        }
    }
}

/// The most a value was within a sliding window: the need as it changed, and when.
#[derive(Debug, Clone, Default)]
pub struct Peaks {
    seen: VecDeque<(Time, u32)>,
}

impl Peaks {
    /// The value is `v` from `now`; what was superseded before `now - window` is forgotten.
    pub fn note(&mut self, now: Time, v: u32, window: Duration) {
        if self.seen.back().map(|s| s.1) != Some(v) {
            self.seen.push_back((now, v));
            if self.seen.len() > PEAKS {
                self.seen.pop_front();
            }
        }
        // The first entry stays while it was in force at the window's start.
        while self
            .seen
            .get(1)
            .is_some_and(|(at, _)| now.since(*at) >= window)
        {
            self.seen.pop_front();
        }
    }

    pub fn peak(&self) -> u32 {
        self.seen.iter().map(|s| s.1).max().unwrap_or(0)
    }
}

impl Node {
    /// The model has a sleeping tier now.
    pub(super) fn sleepy(&self, model: &str) -> bool {
        self.models
            .get(model)
            .is_some_and(|m| m.config.sleep.is_some() && !m.removed)
    }

    /// How many replicas the tier keeps, awake or asleep, with `awake` wanted awake now (noted
    /// for the peak): the most needed within `idle_to_zero`, at least `min`, within `max`.
    pub(super) fn sleep_hold(&mut self, model: &str, awake: u32, now: Time) -> u32 {
        let Some(m) = self.models.get_mut(model) else {
            return 0;
        };
        if m.config.sleep.is_none() || m.removed {
            return 0;
        }
        let window = m.config.scaling.idle_to_zero;
        m.needed.note(now, awake, window);
        m.min().max(m.needed.peak()).min(m.max())
    }

    /// `[model.sleep] idle_to_sleep`: after that long with no work (the signal the policy reads:
    /// reports and the front doors' arrivals, as for `idle_to_zero`), nothing is kept routed or
    /// warm; the replicas leaving drain and sleep as at any scale down (the tier keeps them). The
    /// first sign of work is the policy's "from zero", which wakes one; that ends it.
    pub(super) fn idle_to_sleep(&mut self, model: &str, now: Time, out: &mut Vec<Action>) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let Some(after) = m.config.sleep.as_ref().and_then(|s| s.idle_to_sleep) else {
            return;
        };
        if m.idle_asleep {
            m.idle_asleep = m.desired_routed == 0;
            return;
        }
        if m.removed
            || m.desired_routed == 0
            || m.autoscaler.idle_for(now).is_none_or(|idle| idle < after)
        {
            return;
        }
        m.idle_asleep = true;
        let reason = format!(
            "no work for {}: its replicas go to sleep (idle_to_sleep)",
            crate::units::short_duration(after)
        );
        self.set_desired(model, Decision { to: 0, reason }, now, out);
    }

    /// A sleeping replica that can be woken for the routed set.
    fn wakeable(&self, r: &Replica) -> bool {
        r.state == ReplicaState::Sleeping && !self.departing(r)
    }

    /// Scale up, after the warm replicas were promoted: wakes sleeping replicas for what the
    /// routed set and the pool still lack beyond what is warm or waking (a cold start under way
    /// does not stop a wake: the wake is sooner, and the surplus start is stopped).
    pub(super) fn wake_for(
        &mut self,
        model: &str,
        c: &mut Counts,
        desired: u32,
        fill: u32,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let short = (desired.saturating_sub(c.routed) + fill).saturating_sub(c.warm + c.waking);
        if short == 0 {
            return;
        }
        // Healthy ones first, then the oldest.
        let ids = self.ranked_first(
            model,
            |r| self.wakeable(r),
            |r| (r.probe_failures > 0, r.n),
            short as usize,
        );
        // The first ones are for the routed set, and may take room from other models; the
        // rest refill the pool, which never does.
        let mut for_routed = desired.saturating_sub(c.routed + c.waking);
        for id in ids {
            let reclaim = for_routed > 0;
            for_routed = for_routed.saturating_sub(1);
            self.begin_wake(&id, "scale up: routed replicas wanted", reclaim, now, out);
            c.waking += 1;
            c.sleeping = c.sleeping.saturating_sub(1);
        }
    }

    /// After the surplus stops: warm replicas beyond `keep` (those to promote, and the pool)
    /// go to sleep while the tier holds fewer than `hold`; sleeping ones beyond it stop.
    pub(super) fn sleep_trim(
        &mut self,
        model: &str,
        keep: u32,
        hold: u32,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let c = self.counts(model);
        let awake = c.warm + c.starting + c.pending + c.waking;
        let room = hold.saturating_sub(c.routed + c.sleeping + awake.min(keep));
        let stale_after = self
            .models
            .get(model)
            .map_or(Duration::ZERO, |m| m.config.scaling.stale_after);
        // Within `[daemon] host_memory`: the others stay awake, in the pool (sleep_room.rs).
        let to_sleep = c
            .warm
            .saturating_sub(keep)
            .min(room)
            .min(self.sleepers_allowed(model));
        // Only what serves nothing: a warm replica still finishing work that left the routed
        // set is not put to sleep yet. The newest first, as surplus stops go.
        let ids = self.ranked_first(
            model,
            |r| {
                r.promotable()
                    && !self.departing(r)
                    && !r
                        .signal
                        .fresh(now, stale_after)
                        .is_some_and(|s| s.in_flight > 0 || s.queue_depth > 0)
            },
            |r| std::cmp::Reverse(r.n),
            to_sleep as usize,
        );
        for id in ids {
            self.begin_sleep(&id, "the model needs it less than awake", now, out);
        }
        let total = c.routed + awake + c.sleeping;
        let excess = total
            .saturating_sub(hold.max(c.routed + keep))
            .min(c.sleeping)
            .min(STOPS_PER_EVENT);
        let ids = self.ranked_first(
            model,
            |r| r.state == ReplicaState::Sleeping,
            |r| std::cmp::Reverse(r.n),
            excess as usize,
        );
        for id in ids {
            self.stop(&id, SLEEP_SURPLUS, false, now, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut w = WakeTimes::default();
        assert_eq!(w.view().p50_ms, None);
        for ms in [300, 100, 200, 400] {
            w.record(Duration::from_millis(ms));
        }
        let v = w.view();
        assert_eq!((v.wakes, v.last_ms), (4, Some(400)));
        assert_eq!((v.p50_ms, v.p99_ms), (Some(200), Some(400)));
    }

    #[test]
    fn a_peak_lasts_one_window_after_it_is_superseded() {
        let mut p = Peaks::default();
        let t = Time::from_millis(0);
        let w = Duration::from_secs(10);
        p.note(t, 1, w);
        p.note(t + Duration::from_secs(1), 3, w);
        p.note(t + Duration::from_secs(2), 1, w);
        assert_eq!(p.peak(), 3);
        p.note(t + Duration::from_secs(11), 1, w);
        assert_eq!(p.peak(), 3, "superseded 9 s ago");
        p.note(t + Duration::from_secs(12), 1, w);
        assert_eq!(p.peak(), 1);
    }
}
