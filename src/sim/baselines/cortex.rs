//! Cortex realtime-API autoscaler (request-based: in-flight ÷ target concurrency), with its
//! defaults.
//!
//! Source: Cortex docs, "Autoscaling" (realtime APIs)
//! <https://docs.cortex.dev/workloads/realtime/autoscaling>, and the code: cortexlabs/cortex
//! `pkg/autoscaler/autoscaler.go` (`autoscaleFn`: tolerances, factor caps, stabilization in the
//! direction of the change), `pkg/autoscaler/realtime_scaler.go` (`GetInFlightRequests`: the
//! API-wide in-flight count averaged over the window), `recommendations.go` (`maxSince`,
//! `minSince`), `pkg/operator/resources/realtimeapi/k8s_specs.go`
//! (`_terminationGracePeriodSeconds` 60).
//!
//! Defaults used: tick 10 s (API-wide in-flight is computed every 10 s), `window` 60 s (mean of
//! the last six 10-s values), target in-flight per replica = the replica's concurrency
//! (`target_replica_concurrency` defaults to processes × threads, later `target_in_flight` to
//! `max_concurrency`), `downscale_stabilization_period` 5 min, `upscale_stabilization_period` 1 min,
//! `max_downscale_factor` 0.75, `max_upscale_factor` 1.5, `downscale_tolerance` and
//! `upscale_tolerance` 0.05. `min_replicas`/`max_replicas` are the model's `min`/`max`.
//!
//! In-flight requests are counted per replica as they arrive (running and queued in the
//! replica), summed over the API.

use std::collections::VecDeque;

use super::{secs, Baseline, Deployment};
use crate::sim::engine::Sim;
use crate::sim::Us;

const TICK: Us = secs(10);
const WINDOW: Us = secs(60);
const DOWNSCALE_STABILIZATION: Us = secs(300);
const UPSCALE_STABILIZATION: Us = secs(60);
const MAX_DOWNSCALE_FACTOR: f64 = 0.75;
const MAX_UPSCALE_FACTOR: f64 = 1.5;
const DOWNSCALE_TOLERANCE: f64 = 0.05;
const UPSCALE_TOLERANCE: f64 = 0.05;

pub struct Cortex {
    min: u32,
    max: u32,
    target: f64,
    samples: VecDeque<f64>,
    recs: Vec<(Us, i64)>,
    start: Option<Us>,
}

impl Cortex {
    pub fn new(min: u32, max: u32, concurrency: u32) -> Cortex {
        Cortex {
            min,
            max,
            target: concurrency as f64,
            samples: VecDeque::new(),
            recs: Vec::new(),
            start: None,
        }
    }

    /// One tick of `autoscaleFn`, given the windowed in-flight average.
    fn step(&mut self, now: Us, current: u32, avg_in_flight: f64) -> u32 {
        let start = *self.start.get_or_insert(now);
        let current = current as i64;
        let raw = avg_in_flight / self.target;
        let mut rec = raw.ceil() as i64;
        if raw < current as f64 && raw > current as f64 * (1.0 - DOWNSCALE_TOLERANCE) {
            rec = current;
        }
        if raw > current as f64 && raw < current as f64 * (1.0 + UPSCALE_TOLERANCE) {
            rec = current;
        }
        // Always allow subtracting or adding one.
        let floor = (current - 1).min((current as f64 * MAX_DOWNSCALE_FACTOR).ceil() as i64);
        if rec < floor {
            rec = floor;
        }
        let ceil = (current + 1).max((current as f64 * MAX_UPSCALE_FACTOR).ceil() as i64);
        if rec > ceil {
            rec = ceil;
        }
        rec = rec.max(self.min as i64).min(self.max as i64);
        self.recs.push((now, rec));
        let keep = DOWNSCALE_STABILIZATION.max(UPSCALE_STABILIZATION);
        self.recs.retain(|&(t, _)| now - t <= keep);
        let max_since = |p: Us| {
            self.recs
                .iter()
                .filter(|&&(t, _)| now - t <= p)
                .map(|r| r.1)
                .max()
        };
        let min_since = |p: Us| {
            self.recs
                .iter()
                .filter(|&&(t, _)| now - t <= p)
                .map(|r| r.1)
                .min()
        };
        // Stabilization applies in the direction of the change only.
        let mut request = rec;
        if request < current {
            if now - start < DOWNSCALE_STABILIZATION {
                request = current;
            } else if let Some(f) = max_since(DOWNSCALE_STABILIZATION) {
                request = request.max(f);
            }
        }
        if request > current {
            if now - start < UPSCALE_STABILIZATION {
                request = current;
            } else if let Some(c) = min_since(UPSCALE_STABILIZATION) {
                request = request.min(c);
            }
        }
        request.max(0) as u32
    }
}

impl Baseline for Cortex {
    fn period(&self) -> Us {
        TICK
    }

    fn decide(&mut self, sim: &Sim, dep: &Deployment) -> Option<u32> {
        let in_flight: u64 = dep
            .ready(sim)
            .map(|r| sim.cl.replicas[r as usize].in_flight())
            .sum();
        self.samples.push_back(in_flight as f64);
        let steps = (WINDOW / TICK) as usize;
        while self.samples.len() > steps {
            self.samples.pop_front();
        }
        let avg = self.samples.iter().sum::<f64>() / self.samples.len() as f64;
        Some(self.step(sim.now, dep.desired, avg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_tolerance_and_stabilization() {
        let mut c = Cortex::new(1, 100, 8);
        // First minute: no upscale; first five: no downscale.
        assert_eq!(c.step(0, 4, 80.0), 4);
        assert_eq!(c.step(secs(70), 4, 80.0), 6); // ×1.5 cap, min of the last minute's recs
        let mut c = Cortex::new(1, 100, 8);
        c.start = Some(0);
        // Within 5 % above: hold.
        assert_eq!(c.step(secs(400), 20, 8.0 * 20.9), 20);
        // Large drop: floor at ceil(0.75 × 20) = 15, and the 5-min max holds it at 20.
        assert_eq!(c.step(secs(410), 20, 8.0), 20);
    }
}
