//! How the warm pool splits between the tiers when the model has a sleeping tier: a sleeping
//! replica is ready in its measured wake time (seconds) where a stopped one takes a cold start
//! (minutes), so the pool the policy sizes from the way up is held asleep, and only what a wake
//! cannot cover stays awake.

use std::time::Duration;

use super::node::Node;

/// A wake this slow or slower (p99 of the recent wakes) no longer stands in for an awake
/// replica: the pool stays awake.
const WAKE_STANDS_IN: Duration = Duration::from_secs(10);

impl Node {
    /// Of a pool of `pool`, the replicas held awake; the rest are held asleep by the tier.
    pub(super) fn awake_pool(&self, model: &str, pool: u32) -> u32 {
        let Some(m) = self.models.get(model) else {
            return pool;
        };
        if !self.sleepy(model) {
            return pool;
        }
        // Until a wake is measured the tier is taken at its word (the wake_timeout bounds it).
        let slow = m
            .wakes
            .view()
            .p99_ms
            .is_some_and(|ms| Duration::from_millis(ms) >= WAKE_STANDS_IN);
        if slow {
            pool
        } else {
            0
        }
    }

    /// Where a replica that leaves the model's routed set would go to sleep (its pool is held
    /// asleep, and `[daemon] host_memory` has room for one more), how long one takes to be
    /// routed again: the slow case (p99) of its measured wakes, each from the wake request to
    /// the warm-up passed. Nothing until a wake was measured: the policy does not plan on a
    /// tier's word.
    pub(super) fn pool_wake(&self, model: &str) -> Option<Duration> {
        if !self.sleepy(model) || self.awake_pool(model, 1) > 0 || self.sleepers_allowed(model) == 0
        {
            return None;
        }
        let ms = self.models.get(model)?.wakes.view().p99_ms?;
        Some(Duration::from_millis(ms))
    }
}
