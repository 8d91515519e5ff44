//! Knative Pod Autoscaler (KPA), concurrency metric, with its defaults.
//!
//! Source: Knative Serving docs, "Configuring the autoscaler", "Configuring targets",
//! "Additional autoscaling configuration for KPA" (stable/panic windows)
//! <https://knative.dev/docs/serving/autoscaling/>, and the code: knative/serving
//! `pkg/autoscaler/scaling/autoscaler.go` (`Scale`, `newAutoscaler`),
//! `pkg/autoscaler/metrics/collector.go` (per-second concurrency buckets, window averages),
//! `config/core/configmaps/autoscaler.yaml` (defaults).
//!
//! Defaults used: tick 2 s (`tickInterval`); concurrency scraped every second; stable window
//! 60 s; panic window 10 % of it (6 s); panic threshold 200 %; `container-concurrency-target-
//! percentage` 70 (target = 70 % of the hard limit `containerConcurrency`, here the replica's
//! slots); `max-scale-up-rate` 1000; `max-scale-down-rate` 2; `scale-to-zero-grace-period` 30 s.
//! `min-scale`/`max-scale` are the model's `min`/`max`.
//!
//! Concurrency per pod is what its queue-proxy reports: the average number of requests inside it
//! (running and queued) over the last second; requests buffered by the activator (here: waiting at
//! the router while no replica is routable) are counted too. The window averages are means of
//! the per-second revision totals. Not modelled: the activator's own load balancing when it sits
//! in the request path (`target-burst-capacity`); every policy shares one router.

use std::collections::{BTreeMap, VecDeque};

use super::{secs, Baseline, Deployment};
use crate::sim::engine::Sim;
use crate::sim::{Us, SEC};

const TICK: Us = secs(2);
const STABLE_WINDOW: Us = secs(60);
const PANIC_WINDOW: Us = secs(6);
const PANIC_THRESHOLD: f64 = 2.0;
const TARGET_UTILIZATION: f64 = 0.70;
const MAX_SCALE_UP_RATE: f64 = 1000.0;
const MAX_SCALE_DOWN_RATE: f64 = 2.0;
const SCALE_TO_ZERO_GRACE: Us = secs(30);

pub struct Kpa {
    min: u32,
    max: u32,
    target: f64,
    /// Per-second revision concurrency totals.
    buckets: VecDeque<(Us, f64)>,
    last_area: BTreeMap<u32, u64>,
    last_router_area: u64,
    last_second: Us,
    panic_time: Option<Us>,
    max_panic_pods: u32,
    started: bool,
    last_nonzero: Us,
}

impl Kpa {
    pub fn new(min: u32, max: u32, concurrency: u32) -> Kpa {
        Kpa::with_target_utilization(min, max, concurrency, TARGET_UTILIZATION)
    }

    /// KPA with `container-concurrency-target-percentage` set to `utilization` × 100 instead of
    /// its default 70: what an operator tuning KPA for a workload would change (the grid's
    /// "KPA tuned in hindsight").
    pub fn with_target_utilization(min: u32, max: u32, concurrency: u32, utilization: f64) -> Kpa {
        Kpa {
            min,
            max,
            target: utilization * concurrency as f64,
            buckets: VecDeque::new(),
            last_area: BTreeMap::new(),
            last_router_area: 0,
            last_second: 0,
            panic_time: None,
            max_panic_pods: 0,
            started: false,
            last_nonzero: 0,
        }
    }

    fn window_average(&self, now: Us, window: Us) -> Option<f64> {
        let mut n = 0usize;
        let mut sum = 0.0;
        for &(t, v) in self.buckets.iter().rev() {
            if t + window <= now {
                break;
            }
            n += 1;
            sum += v;
        }
        (n > 0).then(|| sum / n as f64)
    }
}

impl Baseline for Kpa {
    fn period(&self) -> Us {
        TICK
    }

    fn on_second(&mut self, sim: &Sim, dep: &Deployment) {
        let now = sim.now;
        let dt = now.saturating_sub(self.last_second).max(1) as f64;
        let mut total = 0.0;
        let mut seen = BTreeMap::new();
        for r in dep.ready(sim) {
            let area = sim.cl.in_flight_area(r, now);
            let before = self.last_area.get(&r).copied().unwrap_or_else(|| {
                // First scrape of this pod: its concurrency right now.
                area.saturating_sub(sim.cl.replicas[r as usize].in_flight() * SEC)
            });
            total += area.saturating_sub(before) as f64 / dt;
            seen.insert(r, area);
        }
        let router = sim.cl.router_area(now);
        total += router.saturating_sub(self.last_router_area) as f64 / dt;
        self.last_router_area = router;
        self.last_area = seen;
        self.last_second = now;
        self.buckets.push_back((now, total));
        while self
            .buckets
            .front()
            .is_some_and(|&(t, _)| t + STABLE_WINDOW <= now)
        {
            self.buckets.pop_front();
        }
    }

    fn decide(&mut self, sim: &Sim, dep: &Deployment) -> Option<u32> {
        let now = sim.now;
        let original_ready = dep.ready_count(sim);
        if !self.started {
            // newAutoscaler: start in panic mode when more than one pod is ready, so a restart
            // with no history does not scale down.
            self.started = true;
            if original_ready > 1 {
                self.panic_time = Some(now);
                self.max_panic_pods = original_ready;
            }
        }
        let stable = self.window_average(now, STABLE_WINDOW)?;
        let panic = self.window_average(now, PANIC_WINDOW)?;
        let ready = (original_ready as f64).max(1.0);
        let max_scale_up = (MAX_SCALE_UP_RATE * ready).ceil();
        let max_scale_down = (ready / MAX_SCALE_DOWN_RATE).floor();
        let dspc = (stable / self.target).ceil();
        let dppc = (panic / self.target).ceil();
        let desired_stable = dspc.max(max_scale_down).min(max_scale_up) as u32;
        let desired_panic = dppc.max(max_scale_down).min(max_scale_up) as u32;
        let over_panic = dppc / ready >= PANIC_THRESHOLD;
        match self.panic_time {
            None if over_panic => self.panic_time = Some(now),
            Some(_) if over_panic => self.panic_time = Some(now),
            Some(t) if t + STABLE_WINDOW < now => {
                self.panic_time = None;
                self.max_panic_pods = 0;
            }
            _ => {}
        }
        let mut desired = desired_stable;
        if self.panic_time.is_some() {
            desired = desired.max(desired_panic);
            // No scale-down while panicking.
            if desired > self.max_panic_pods {
                self.max_panic_pods = desired;
            }
            desired = self.max_panic_pods;
        }
        if desired > 0 {
            self.last_nonzero = now;
        }
        // The PodAutoscaler reconciler applies min-scale / max-scale; scale to zero only after
        // the grace period.
        let mut want = desired.clamp(self.min, self.max.max(self.min));
        if want == 0 && now < self.last_nonzero + SCALE_TO_ZERO_GRACE {
            want = dep.desired.max(1);
        }
        Some(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_average_covers_the_available_seconds() {
        let mut k = Kpa::new(1, 10, 8);
        assert!((k.target - 5.6).abs() < 1e-9);
        for s in 1..=100u64 {
            k.buckets
                .push_back((s * SEC, if s > 94 { 100.0 } else { 0.0 }));
        }
        let now = 100 * SEC;
        assert_eq!(k.window_average(now, PANIC_WINDOW), Some(100.0));
        let stable = k.window_average(now, STABLE_WINDOW).unwrap();
        assert!((stable - 10.0).abs() < 1e-9, "{stable}");
    }
}
