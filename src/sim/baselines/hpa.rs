//! Kubernetes Horizontal Pod Autoscaler, `autoscaling/v2`, with its defaults.
//!
//! Source: "Horizontal Pod Autoscaling", Algorithm details and Default Behavior,
//! <https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/>; and the
//! controller, kubernetes/kubernetes `pkg/controller/podautoscaler/horizontal.go`
//! (`reconcileAutoscaler`, `stabilizeRecommendationWithBehaviors`,
//! `convertDesiredReplicasWithBehaviorRate`, `calculateScaleUpLimitWithScalingRules`,
//! `calculateScaleDownLimitWithBehaviors`, `maybeInitScaleDownStabilizationWindow`) and
//! `replica_calculator.go` (`calcPlainMetricReplicas`, `groupPods`).
//!
//! Defaults used: sync period 15 s (`--horizontal-pod-autoscaler-sync-period`), tolerance 0.1
//! (`--horizontal-pod-autoscaler-tolerance`), and the default `behavior`:
//! scale-up stabilization 0 s with policies {Percent 100 per 15 s, Pods 4 per 15 s}, selectPolicy
//! Max; scale-down stabilization 300 s with policy {Percent 100 per 15 s}.
//!
//! Two metrics, both `type: Pods` with an `AverageValue` target (custom metrics through an
//! adapter):
//! - `hpa-util`: GPU utilisation as DCGM reports it (`DCGM_FI_DEV_GPU_UTIL`, 0–100: the share of
//!   time any kernel runs), modelled as the share of time the replica had at least one request in
//!   service over the last sync period. Target 80. The signal saturates at 100 as soon as a
//!   replica is never idle, so any target below that behaves alike: there is no published
//!   default for GPU utilisation, and 80 is a common choice in vendor examples.
//! - `hpa-queue`: requests waiting per replica (vLLM `vllm:num_requests_waiting`), target
//!   AverageValue = μ × target_wait from Little's law (see `Targets::queue_depth_per_replica`).
//!
//! The metrics pipeline is idealised: the controller sees the value as of the sync. A pod whose
//! server is still loading exports no metric: `calcPlainMetricReplicas` counts it as missing
//! (0 on a scale-up, the target on a scale-down) and holds the count if that reverses the
//! direction; terminating pods are ignored.

use super::{secs, Baseline, Deployment};
use crate::sim::engine::Sim;
use crate::sim::Us;

const SYNC: Us = secs(15);
const TOLERANCE: f64 = 0.1;
const UP_STABILIZATION: Us = secs(0);
const DOWN_STABILIZATION: Us = secs(300);
const POLICY_PERIOD: Us = secs(15);
const UP_PERCENT: f64 = 100.0;
const UP_PODS: i64 = 4;
const DOWN_PERCENT: f64 = 100.0;
/// `hpa-util`'s target, percent.
pub const UTIL_TARGET: f64 = 80.0;

#[derive(Debug, Clone, Copy)]
pub enum Metric {
    /// Percent of time with any request in service.
    GpuUtil,
    /// Requests waiting.
    QueueDepth,
}

pub struct Hpa {
    metric: Metric,
    target: f64,
    min: u32,
    max: u32,
    /// Unstabilised recommendations, for the stabilization windows.
    recommendations: Vec<(Us, u32)>,
    up_events: Vec<(Us, i64)>,
    down_events: Vec<(Us, i64)>,
    /// Busy-time counter of each replica at the previous sync (for utilisation).
    last_busy: std::collections::BTreeMap<u32, (Us, u64)>,
}

impl Hpa {
    pub fn util(min: u32, max: u32) -> Hpa {
        Hpa::new(Metric::GpuUtil, UTIL_TARGET, min, max)
    }

    pub fn queue(min: u32, max: u32, target_depth: f64) -> Hpa {
        Hpa::new(Metric::QueueDepth, target_depth, min, max)
    }

    fn new(metric: Metric, target: f64, min: u32, max: u32) -> Hpa {
        Hpa {
            metric,
            target,
            min: min.max(1), // minReplicas ≥ 1 (0 needs the HPAScaleToZero alpha gate)
            max,
            recommendations: Vec::new(),
            up_events: Vec::new(),
            down_events: Vec::new(),
            last_busy: Default::default(),
        }
    }

    pub fn target(&self) -> f64 {
        self.target
    }

    /// Per-pod metric values of ready pods, and how many live pods have none yet.
    fn metrics(&mut self, sim: &Sim, dep: &Deployment) -> (Vec<f64>, usize) {
        let now = sim.now;
        let mut values = Vec::new();
        let mut missing = 0;
        let mut seen = std::collections::BTreeMap::new();
        for &r in &dep.live {
            let x = &sim.cl.replicas[r as usize];
            let Some(ready) = x.ready else {
                missing += 1;
                continue;
            };
            match self.metric {
                Metric::QueueDepth => values.push(x.waiting.len() as f64),
                Metric::GpuUtil => {
                    let busy = sim.cl.any_busy_area(r, now);
                    let (t0, b0) = self.last_busy.get(&r).copied().unwrap_or((ready, 0));
                    let t0 = t0.max(ready);
                    seen.insert(r, (now, busy));
                    if now > t0 {
                        values.push(100.0 * (busy - b0.min(busy)) as f64 / (now - t0) as f64);
                    } else {
                        missing += 1;
                    }
                }
            }
        }
        if matches!(self.metric, Metric::GpuUtil) {
            self.last_busy = seen;
        }
        (values, missing)
    }

    /// `calcPlainMetricReplicas`; None when no pod has a metric (the controller then errors
    /// and does not scale).
    fn plain_metric_replicas(&self, values: &[f64], missing: usize, current: u32) -> Option<u32> {
        if values.is_empty() {
            return None;
        }
        let ready = values.len();
        let sum: f64 = values.iter().sum();
        let usage_ratio = (sum / ready as f64) / self.target;
        if missing == 0 {
            if (1.0 - usage_ratio).abs() <= TOLERANCE {
                return Some(current);
            }
            return Some((usage_ratio * ready as f64).ceil() as u32);
        }
        // Missing pods: the target on a scale-down, 0 on a scale-up.
        let fill = if usage_ratio < 1.0 { self.target } else { 0.0 };
        let n = ready + missing;
        let new_ratio = ((sum + fill * missing as f64) / n as f64) / self.target;
        if (1.0 - new_ratio).abs() <= TOLERANCE
            || (usage_ratio < 1.0 && new_ratio > 1.0)
            || (usage_ratio > 1.0 && new_ratio < 1.0)
        {
            return Some(current);
        }
        let new_replicas = (new_ratio * n as f64).ceil() as u32;
        if (new_ratio < 1.0 && new_replicas > current)
            || (new_ratio > 1.0 && new_replicas < current)
        {
            return Some(current);
        }
        Some(new_replicas)
    }

    /// `stabilizeRecommendationWithBehaviors`.
    fn stabilize(&mut self, now: Us, current: u32, desired: u32) -> u32 {
        // A recommendation counts while it is younger than the window (`After(cutoff)`).
        let mut up = desired;
        let mut down = desired;
        for &(t, rec) in &self.recommendations {
            if t + UP_STABILIZATION > now {
                up = up.min(rec);
            }
            if t + DOWN_STABILIZATION > now {
                down = down.max(rec);
            }
        }
        let mut rec = current;
        if rec < up {
            rec = up;
        }
        if rec > down {
            rec = down;
        }
        self.recommendations
            .retain(|&(t, _)| t + UP_STABILIZATION >= now || t + DOWN_STABILIZATION >= now);
        self.recommendations.push((now, desired));
        rec
    }

    fn change_in_period(events: &[(Us, i64)], now: Us) -> i64 {
        events
            .iter()
            .filter(|(t, _)| t + POLICY_PERIOD > now)
            .map(|e| e.1)
            .sum()
    }

    /// `convertDesiredReplicasWithBehaviorRate` with the default policies.
    fn rate_limit(&self, now: Us, current: u32, desired: u32) -> u32 {
        let added = Self::change_in_period(&self.up_events, now);
        let deleted = Self::change_in_period(&self.down_events, now);
        let start = current as i64 - added + deleted;
        if desired > current {
            let by_percent = (start as f64 * (1.0 + UP_PERCENT / 100.0)).ceil() as i64;
            let by_pods = start + UP_PODS;
            let limit = by_percent.max(by_pods).max(current as i64);
            let allowed = (self.max as i64).min(limit) as u32;
            desired.min(allowed)
        } else if desired < current {
            // int32(float64(start) × (1 − 100/100)): truncation, not rounding.
            let limit = ((start as f64) * (1.0 - DOWN_PERCENT / 100.0)) as i64;
            let limit = limit.min(current as i64);
            let allowed = (self.min as i64).max(limit) as u32;
            desired.max(allowed)
        } else {
            desired
        }
    }
}

impl Baseline for Hpa {
    fn period(&self) -> Us {
        SYNC
    }

    fn decide(&mut self, sim: &Sim, dep: &Deployment) -> Option<u32> {
        let now = sim.now;
        let current = dep.desired;
        let desired = if current > self.max {
            self.max
        } else if current < self.min {
            self.min
        } else {
            let (values, missing) = self.metrics(sim, dep);
            let metric_desired = self.plain_metric_replicas(&values, missing, current)?;
            // maybeInitScaleDownStabilizationWindow
            if self.recommendations.is_empty() {
                self.recommendations.push((now, current));
            }
            let stabilized = self.stabilize(now, current, metric_desired);
            self.rate_limit(now, current, stabilized)
        };
        if desired > current {
            self.up_events.push((now, (desired - current) as i64));
        } else if desired < current {
            self.down_events.push((now, (current - desired) as i64));
        }
        self.up_events.retain(|e| e.0 + POLICY_PERIOD > now);
        self.down_events.retain(|e| e.0 + POLICY_PERIOD > now);
        Some(desired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_metric_replicas_follows_the_controller() {
        let h = Hpa::queue(1, 20, 4.0);
        // Within tolerance: hold.
        assert_eq!(h.plain_metric_replicas(&[4.2, 3.9], 0, 2), Some(2));
        // ceil(ratio × ready).
        assert_eq!(h.plain_metric_replicas(&[12.0, 8.0], 0, 2), Some(5));
        assert_eq!(h.plain_metric_replicas(&[0.0, 0.0], 0, 2), Some(0));
        // A starting pod counts 0 on a scale-up: ceil(20 / 4) = 5 still.
        assert_eq!(h.plain_metric_replicas(&[12.0, 8.0], 1, 3), Some(5));
        // ... but if counting it at 0 reverses the direction, hold.
        assert_eq!(h.plain_metric_replicas(&[5.0], 1, 2), Some(2));
        assert_eq!(h.plain_metric_replicas(&[], 2, 2), None);
    }

    #[test]
    fn default_behavior_limits_and_stabilizes() {
        let mut h = Hpa::queue(1, 100, 4.0);
        // Up: max(current + 4, 2 × current) per 15 s.
        assert_eq!(h.rate_limit(0, 2, 50), 6);
        assert_eq!(h.rate_limit(0, 10, 50), 20);
        h.up_events.push((0, 4));
        assert_eq!(h.rate_limit(secs(10), 6, 50), 6); // the period already added 4 to 2
        assert_eq!(h.rate_limit(secs(16), 6, 50), 12);
        // Down: stabilised to the highest recommendation of the last 5 min.
        let mut h = Hpa::queue(1, 100, 4.0);
        h.stabilize(0, 8, 8);
        assert_eq!(h.stabilize(secs(100), 8, 2), 8);
        assert_eq!(h.stabilize(secs(301), 8, 2), 2);
    }
}
