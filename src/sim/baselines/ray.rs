//! Ray Serve's default autoscaling policy, with its defaults.
//!
//! Source: Ray Serve docs, "Ray Serve Autoscaling" and "Advanced Ray Serve Autoscaling"
//! (autoscaling_config parameters and the metrics pipeline)
//! <https://docs.ray.io/en/latest/serve/advanced-guides/advanced-autoscaling.html>, and the code:
//! ray-project/ray `python/ray/serve/autoscaling_policy.py` (`replica_queue_length_autoscaling_
//! policy`, `_apply_scaling_factors`, `_apply_bounds`, `_apply_delay_logic`,
//! `_get_cold_start_scale_up_replicas`), `python/ray/serve/_private/constants.py`
//! (`CONTROL_LOOP_INTERVAL_S` = 0.1).
//!
//! Defaults used: `target_ongoing_requests` 2 (since Ray 2.32), `upscale_delay_s` 30,
//! `downscale_delay_s` 600, `upscaling_factor` = `downscaling_factor` = 1, `metrics_interval_s`
//! 10 (ongoing requests recorded and pushed to the controller every 10 s), `look_back_period_s` 30
//! (time-weighted mean of the pushed series, as right-continuous steps), aggregation "mean",
//! control loop every 0.1 s. `min_replicas`/`max_replicas` are the model's `min`/`max`.
//!
//! "Ongoing requests" are those running or queued at the replicas plus those queued at the
//! handle (here: waiting at the router). Not modelled: `max_ongoing_requests` (default 5), the
//! per-replica cap at which Ray's router holds requests back; every policy shares one router
//! that commits each request to the least-loaded replica (its slots, then its FIFO queue).

use std::collections::VecDeque;

use super::{Baseline, Deployment};
use crate::sim::engine::Sim;
use crate::sim::{Us, SEC};

const CONTROL_LOOP: Us = SEC / 10;
const TARGET_ONGOING: f64 = 2.0;
const UPSCALE_DELAY_S: f64 = 30.0;
const DOWNSCALE_DELAY_S: f64 = 600.0;
const CONTROL_LOOP_INTERVAL_S: f64 = 0.1;
const UPSCALING_FACTOR: f64 = 1.0;
const DOWNSCALING_FACTOR: f64 = 1.0;
const METRICS_INTERVAL: Us = 10 * SEC;
const LOOK_BACK: Us = 30 * SEC;

pub struct Ray {
    min: u32,
    max: u32,
    samples: VecDeque<(Us, f64)>,
    decision_counter: i64,
}

impl Ray {
    pub fn new(min: u32, max: u32) -> Ray {
        Ray {
            min,
            max,
            samples: VecDeque::new(),
            decision_counter: 0,
        }
    }

    /// Time-weighted mean over the look-back window of the recorded series (each value holds
    /// until the next); 0 with no data.
    fn total_num_requests(&self, now: Us) -> f64 {
        let start = now.saturating_sub(LOOK_BACK);
        let inside: Vec<(Us, f64)> = self
            .samples
            .iter()
            .copied()
            .filter(|&(t, _)| t >= start && t <= now)
            .collect();
        if inside.is_empty() {
            return 0.0;
        }
        let mut weighted = 0.0;
        let mut span = 0u64;
        for (i, &(t, v)) in inside.iter().enumerate() {
            let until = inside.get(i + 1).map_or(now, |n| n.0);
            weighted += v * (until - t) as f64;
            span += until - t;
        }
        if span == 0 {
            inside.iter().map(|s| s.1).sum::<f64>() / inside.len() as f64
        } else {
            weighted / span as f64
        }
    }

    /// `_apply_scaling_factors`.
    fn apply_scaling_factors(desired: f64, current: u32) -> i64 {
        let delta = desired - current as f64;
        let factor = if delta > 0.0 {
            UPSCALING_FACTOR
        } else {
            DOWNSCALING_FACTOR
        };
        let mut scaled = (current as f64 + factor * delta).ceil() as i64;
        if (desired.ceil() as i64) < current as i64 && scaled == current as i64 {
            scaled -= 1;
        }
        scaled
    }

    /// `_apply_delay_logic`.
    fn apply_delay(&mut self, desired: i64, target: u32) -> u32 {
        let target = target as i64;
        let mut decision = target;
        if desired > target {
            if self.decision_counter < 0 {
                self.decision_counter = 0;
            }
            self.decision_counter += 1;
            if self.decision_counter > (UPSCALE_DELAY_S / CONTROL_LOOP_INTERVAL_S) as i64 {
                self.decision_counter = 0;
                decision = desired;
            }
        } else if desired < target {
            if self.decision_counter > 0 {
                self.decision_counter = 0;
            }
            self.decision_counter -= 1;
            let scaling_to_zero = target == 1;
            let desired = if scaling_to_zero {
                desired
            } else {
                desired.max(1)
            };
            if self.decision_counter < -((DOWNSCALE_DELAY_S / CONTROL_LOOP_INTERVAL_S) as i64) {
                self.decision_counter = 0;
                decision = desired;
            }
        } else {
            self.decision_counter = 0;
        }
        decision.max(0) as u32
    }
}

impl Baseline for Ray {
    fn period(&self) -> Us {
        CONTROL_LOOP
    }

    fn on_second(&mut self, sim: &Sim, dep: &Deployment) {
        let now = sim.now;
        if !now.is_multiple_of(METRICS_INTERVAL) {
            return;
        }
        let ongoing: u64 = dep
            .ready(sim)
            .map(|r| sim.cl.replicas[r as usize].in_flight())
            .sum::<u64>()
            + sim.cl.router_queue.len() as u64;
        self.samples.push_back((now, ongoing as f64));
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| t + LOOK_BACK + METRICS_INTERVAL < now)
        {
            self.samples.pop_front();
        }
    }

    fn decide(&mut self, sim: &Sim, dep: &Deployment) -> Option<u32> {
        let running = dep.ready_count(sim);
        let target = dep.desired;
        let total = self.total_num_requests(sim.now);
        // Cold-start fast path: with no running replica, queued work scales up at once.
        if running == 0 {
            return Some(if total > 0.0 {
                (UPSCALING_FACTOR.ceil() as u32).max(target)
            } else {
                target
            });
        }
        // _core_replica_queue_length_policy
        let error_ratio = total / (TARGET_ONGOING * running as f64);
        let desired = running as f64 * error_ratio;
        let scaled = Self::apply_scaling_factors(desired, running);
        let bounded = scaled.clamp(self.min as i64, self.max as i64);
        Some(self.apply_delay(bounded, target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_need_consecutive_decisions() {
        let mut r = Ray::new(1, 10);
        for _ in 0..300 {
            assert_eq!(r.apply_delay(5, 2), 2);
        }
        assert_eq!(r.apply_delay(5, 2), 5);
        // A contrary decision resets the count.
        for _ in 0..6000 {
            assert_eq!(r.apply_delay(1, 5), 5);
        }
        assert_eq!(r.apply_delay(7, 5), 5);
        assert_eq!(r.apply_delay(1, 5), 5);
    }

    #[test]
    fn look_back_is_time_weighted() {
        let mut r = Ray::new(1, 10);
        r.samples
            .extend([(0, 0.0), (10 * SEC, 6.0), (20 * SEC, 3.0)]);
        let v = r.total_num_requests(30 * SEC);
        assert!((v - 3.0).abs() < 1e-9, "{v}");
        assert_eq!(Ray::apply_scaling_factors(3.5, 2), 4);
        assert_eq!(Ray::apply_scaling_factors(0.5, 2), 1);
    }
}
