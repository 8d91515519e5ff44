//! `hearth simulate --grid --family held-out`: workloads the standard grid does not hold, on
//! the same knobs and with the same verdicts, to judge a change on what it was not tuned to.
//!
//! Workloads (46): the held-out scenarios (`workload::HELD_OUT`: bursts every 3, 7 and 25
//! minutes with ±20 % jitter, bursts at Poisson-timed intervals) at seeds 6–10; three days with
//! a daily peak (seed 6: one is enough for a period of a day, and it is the longest to run);
//! the grid's five synthetic scenarios at seeds 6–10.

use super::grid::{build, GridWorkload, Spec};
use super::workload::{self, ServiceModel};

/// Seeds no test or grid cell of the standard grid uses.
pub const SEEDS: [u64; 5] = [6, 7, 8, 9, 10];

const SM: ServiceModel = ServiceModel {
    prefill: 0.0002,
    decode: 0.02,
};

/// The held-out family's workloads.
pub fn workloads(jobs: usize) -> Result<Vec<GridWorkload>, workload::TraceError> {
    let mut specs: Vec<Spec> = Vec::new();
    for name in workload::HELD_OUT {
        let seeds: &[u64] = if name == "multi-day" {
            &SEEDS[..1]
        } else {
            &SEEDS
        };
        for &seed in seeds {
            specs.push((
                name,
                format!("{name} seed {seed}"),
                Box::new(move |rate| {
                    Ok(workload::held_out_workload(name, seed, &SM, 1.0, rate)
                        .expect("a held-out scenario"))
                }),
            ));
        }
    }
    for name in workload::SYNTHETIC {
        for seed in SEEDS {
            specs.push((
                name,
                format!("{name} seed {seed}"),
                Box::new(move |rate| {
                    Ok(workload::synthetic_workload(name, seed, &SM, 1.0, rate)
                        .expect("a built-in scenario"))
                }),
            ));
        }
    }
    build(specs, jobs)
}
