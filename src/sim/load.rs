//! The workload `hearth simulate`'s arguments ask for: a scenario, a named trace or a CSV file,
//! with its seed, speed, rate multiplier and length.

use super::workload::{self, ServiceModel, Workload};
use super::{us, SimArgs, SimError};

/// Builds the workload the arguments ask for.
pub fn load_workload(a: &SimArgs) -> Result<Workload, SimError> {
    let sm = ServiceModel {
        prefill: a.prefill_per_token.as_secs_f64(),
        decode: a.decode_per_token.as_secs_f64(),
    };
    let mut w = match (&a.scenario, &a.trace) {
        (Some(name), trace) if workload::SYNTHETIC.contains(&name.as_str()) => {
            if trace.is_some() {
                return Err(SimError::SyntheticWithTrace(name.clone()));
            }
            workload::synthetic_workload(name, a.seed, &sm, a.speed, a.rate_mult)
                .expect("known scenario")
        }
        (Some(name), trace) if workload::HELD_OUT.contains(&name.as_str()) => {
            if trace.is_some() {
                return Err(SimError::SyntheticWithTrace(name.clone()));
            }
            workload::held_out_workload(name, a.seed, &sm, a.speed, a.rate_mult)
                .expect("known scenario")
        }
        (Some(name), trace) if workload::TRACES.iter().any(|(n, _)| n == name) => {
            let path = workload::trace_path(name, trace.as_deref())?;
            workload::trace_workload(&path, name, a.seed, &sm, a.speed, a.rate_mult)?
        }
        (Some(name), _) => {
            return Err(SimError::UnknownScenario {
                name: name.clone(),
                known: workload::scenario_names().join(", "),
            })
        }
        (None, Some(path)) => {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "trace".into());
            workload::trace_workload(path, &name, a.seed, &sm, a.speed, a.rate_mult)?
        }
        (None, None) => return Err(SimError::NoWorkload),
    };
    if let Some(d) = a.duration {
        w.truncate(us(d));
    }
    Ok(w)
}
