//! Each model can have its routed minimum awake beside what the others never give up: where
//! models sleep, "all asleep fits" and "one awake alone fits" do not make "one awake while the
//! rest hold what they keep" fit, and the models that keep more are the ones the core never
//! puts to sleep for it (docs/sleep.md, "More models than GPUs"):
//! - a model without `[model.sleep]` holds its `min` awake (reclaim never goes below it);
//! - a model with `[model.sleep]` of higher priority keeps its one routed replica awake (only
//!   `idle_to_sleep` puts it to sleep), its other minimum asleep;
//! - one of equal or lower priority can be put to sleep for it: its minimum, asleep.
//!
//! A model that fails this would wait in no_capacity whenever it is asked for, for as long as
//! the daemon runs; `minimums_fit` (deploy.rs) has already checked what it checks alone.

use super::{fit, Cx, Marks, Res};
use crate::config::raw::join;
use crate::config::ModelConfig;

/// Beyond this many models with GPUs the check is not made: one search per model, each over
/// every model, stays bounded whatever the file says.
const MAX_JUDGED_MODELS: usize = 64;
/// Models named in a message before "and N more".
const LISTED: usize = 6;

/// What one of `m`'s replicas holds on each of its devices asleep: `gpu_memory_asleep` (at least
/// a byte: none would read as whole devices); on whole devices, or without `[model.sleep]`,
/// what it holds awake.
pub(super) fn bytes_asleep(m: &ModelConfig) -> Option<u64> {
    match (&m.sleep, m.launch.gpu_memory) {
        (Some(s), Some(b)) => Some(s.held_asleep(b).max(1)),
        (_, awake) => awake,
    }
}

/// What model `m` holds on the devices with `awake` of its `min` replicas awake, the rest asleep.
fn holds(m: &ModelConfig, awake: u32) -> Vec<fit::Demand> {
    let d = fit::Demand {
        replicas: m.scaling.min,
        gpus: m.launch.gpus,
        bytes: m.launch.gpu_memory,
    };
    let asleep = bytes_asleep(m);
    let awake = awake.min(d.replicas);
    [
        fit::Demand {
            replicas: awake,
            ..d
        },
        fit::Demand {
            replicas: d.replicas - awake,
            bytes: asleep,
            ..d
        },
    ]
    .into_iter()
    .filter(|d| d.replicas > 0)
    .collect()
}

/// How many of `j`'s minimum stay awake while `i` needs its own: see the module's list.
fn kept_awake(j: &ModelConfig, i: &ModelConfig) -> u32 {
    match &j.sleep {
        None => j.scaling.min,
        Some(s) if j.priority > i.priority && s.idle_to_sleep.is_none() => j.scaling.min.min(1),
        Some(_) => 0,
    }
}

impl Cx<'_> {
    pub(super) fn each_can_wake(
        &self,
        devices: &fit::Devices,
        models: &[ModelConfig],
        marks: &[Marks],
    ) -> Res<()> {
        let placed: Vec<(usize, &ModelConfig)> = models
            .iter()
            .enumerate()
            .filter(|(_, m)| m.launch.gpus > 0 && m.scaling.min > 0)
            .collect();
        // Without a sleeping model, everyone's minimum awake together is what deploy.rs checked.
        if placed.len() > MAX_JUDGED_MODELS || placed.iter().all(|(_, m)| m.sleep.is_none()) {
            return Ok(());
        }
        for &(i, mi) in &placed {
            let own = if mi.sleep.is_some() {
                1
            } else {
                mi.scaling.min
            };
            let mut all = holds(mi, own);
            let mut keeping: Vec<String> = Vec::new();
            for &(j, mj) in &placed {
                if j == i {
                    continue;
                }
                let awake = kept_awake(mj, mi);
                if awake > 0 {
                    let why = if mj.sleep.is_some() {
                        format!("priority {} > {}", mj.priority, mi.priority)
                    } else {
                        "no [model.sleep]".to_string()
                    };
                    keeping.push(format!("{:?} ({awake} awake: {why})", mj.name));
                }
                all.extend(holds(mj, awake));
            }
            if devices.together(&all) != fit::Fit::No {
                continue;
            }
            let n = keeping.len();
            let mut listed: Vec<String> = keeping.into_iter().take(LISTED).collect();
            if n > LISTED {
                listed.push(format!("and {} more", n - LISTED));
            }
            let beside = if listed.is_empty() {
                "the other models' minimums asleep".to_string()
            } else {
                format!(
                    "what the models that never give way for it keep awake ({}) and the other \
                     minimums asleep",
                    listed.join(", ")
                )
            };
            return Err(self.err(
                &join(&marks[i].key, "scaling.min"),
                marks[i].min.clone(),
                format!(
                    "{own} replica(s) of {:?} awake ({}) cannot be placed on the declared devices \
                     ({}) beside {beside}: the model would wait in no_capacity whenever it is \
                     asked for; lower a min or gpu_memory, raise its priority, or declare more \
                     devices",
                    mi.name,
                    fit::describe(&fit::Demand {
                        replicas: own,
                        gpus: mi.launch.gpus,
                        bytes: mi.launch.gpu_memory,
                    }),
                    devices.describe()
                ),
            ));
        }
        Ok(())
    }
}
