//! The synthetic scenarios: seeded non-homogeneous Poisson arrivals (thinning) whose requests
//! draw token counts.

use super::{push_transform, Request, ServiceModel, Workload};
use crate::sim::rng::Rng;
use crate::sim::{Us, SEC};

/// Token counts of synthetic requests: exponential, means 1024 context and 200 generated tokens
/// (close to the Azure conversation trace's 1155 / 211). With the default 0.2 ms and 20 ms per
/// token a request holds a slot 4.2 s on average, so a replica with 8 slots completes ≈ 1.9
/// requests/s.
pub const SYNTH_MEAN_CONTEXT: f64 = 1024.0;
pub const SYNTH_MEAN_GENERATED: f64 = 200.0;

pub(super) fn synth_service(rng: &mut Rng, sm: &ServiceModel) -> Us {
    let ctx = rng.exp(SYNTH_MEAN_CONTEXT).ceil().max(1.0) as u64;
    let gen = rng.exp(SYNTH_MEAN_GENERATED).ceil().max(1.0) as u64;
    sm.service(ctx, gen)
}

/// The synthetic scenarios: name, length, one-line description, rate (req/s) at `t` seconds.
/// Sized so that with 8 slots per replica and the default per-token costs the peak needs about
/// 9–11 busy replicas (more with headroom), while the base load needs two or three.
pub const SYNTHETIC: [&str; 5] = ["step", "burst", "diurnal", "sawtooth", "flash-crowd"];

struct Synthetic {
    length_s: f64,
    peak: f64,
    about: &'static str,
    rate: fn(f64) -> f64,
}

fn synthetic(name: &str) -> Option<Synthetic> {
    Some(match name {
        "step" => Synthetic {
            length_s: 3600.0,
            peak: 16.0,
            about: "4 req/s, a step to 16 req/s at 15 min, back to 4 at 40 min",
            rate: |t| {
                if (900.0..2400.0).contains(&t) {
                    16.0
                } else {
                    4.0
                }
            },
        },
        "burst" => Synthetic {
            length_s: 3600.0,
            peak: 20.0,
            about: "4 req/s with 90 s bursts of 20 req/s every 10 min from 10 min",
            rate: |t| {
                let in_burst = t >= 600.0 && (t - 600.0) % 600.0 < 90.0;
                if in_burst {
                    20.0
                } else {
                    4.0
                }
            },
        },
        "diurnal" => Synthetic {
            length_s: 3600.0,
            peak: 16.0,
            about: "a day compressed into an hour: 2 req/s rising as a cosine to 16 at 30 min",
            rate: |t| 2.0 + 14.0 * (1.0 - (2.0 * std::f64::consts::PI * t / 3600.0).cos()) / 2.0,
        },
        "sawtooth" => Synthetic {
            length_s: 3600.0,
            peak: 18.0,
            about: "ramps from 2 to 18 req/s over 12 min, then drops back to 2; five teeth",
            rate: |t| 2.0 + 16.0 * (t % 720.0) / 720.0,
        },
        "flash-crowd" => Synthetic {
            length_s: 3600.0,
            peak: 16.0,
            about: "4 req/s; at 20 min a 4x crowd arrives within 10 s, stays 8 min, \
                    then fades (time constant 5 min)",
            rate: |t| {
                let t0 = 1200.0;
                if t < t0 {
                    4.0
                } else if t < t0 + 10.0 {
                    4.0 + 12.0 * (t - t0) / 10.0
                } else if t < t0 + 480.0 {
                    16.0
                } else {
                    4.0 + 12.0 * (-(t - t0 - 480.0) / 300.0).exp()
                }
            },
        },
        _ => return None,
    })
}

/// The arrivals of a synthetic scenario: a seeded non-homogeneous Poisson process (thinning),
/// rates multiplied by `rate_mult` and time compressed by `speed`.
pub fn synthetic_workload(
    name: &str,
    seed: u64,
    sm: &ServiceModel,
    speed: f64,
    rate_mult: f64,
) -> Option<Workload> {
    let s = synthetic(name)?;
    let mut rng = Rng::new(seed);
    let lmax = s.peak * rate_mult * speed;
    let length = s.length_s / speed;
    let mut requests = Vec::new();
    let mut t = 0.0;
    if lmax > 0.0 {
        loop {
            t += rng.exp(1.0 / lmax);
            if t >= length {
                break;
            }
            let lambda = (s.rate)(t * speed) * rate_mult * speed;
            let accept = rng.uniform() * lmax < lambda;
            // Draw the service time either way so a request's size does not depend on whether
            // its neighbours were kept.
            let service = synth_service(&mut rng, sm);
            if accept {
                requests.push(Request {
                    t: (t * SEC as f64) as Us,
                    service,
                });
            }
        }
    }
    let mut description = format!(
        "synthetic {name}: {}; seeded Poisson arrivals (seed {seed}); tokens ~ Exp(mean {}) \
         context, Exp(mean {}) generated",
        s.about, SYNTH_MEAN_CONTEXT, SYNTH_MEAN_GENERATED
    );
    push_transform(&mut description, speed, rate_mult, "rates multiplied");
    Some(Workload {
        name: name.to_string(),
        requests,
        horizon: (length * SEC as f64).round() as Us,
        description,
        attribution: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM: ServiceModel = ServiceModel {
        prefill: 0.0002,
        decode: 0.02,
    };

    #[test]
    fn synthetic_scenarios_have_the_planned_rates() {
        for name in SYNTHETIC {
            let w = synthetic_workload(name, 1, &SM, 1.0, 1.0).unwrap();
            assert_eq!(w.horizon, 3600 * SEC);
            assert!(w.requests.windows(2).all(|x| x[0].t <= x[1].t));
            let rate = w.requests.len() as f64 / 3600.0;
            assert!(rate > 3.0 && rate < 12.0, "{name}: {rate}");
        }
        let w = synthetic_workload("step", 1, &SM, 1.0, 1.0).unwrap();
        let in_step = w
            .requests
            .iter()
            .filter(|r| r.t >= 1000 * SEC && r.t < 2000 * SEC)
            .count();
        assert!((in_step as f64 / 1000.0 - 16.0).abs() < 1.0);
        assert!(
            (w.mean_service_s() - 4.2).abs() < 0.15,
            "{}",
            w.mean_service_s()
        );
    }
}
