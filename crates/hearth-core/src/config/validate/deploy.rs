//! What running the file needs that the file alone decides ([`Checks::Deployment`]): each replica
//! is handed a port of its own and probed there, so the command must pass `{port}` on and every
//! URL must use it; and the `min` replicas must fit the declared static GPUs (and, where models
//! sleep, each one's routed minimum awake beside what the others keep: wake_fit.rs).
//!
//! [`Checks::Deployment`]: crate::config::Checks::Deployment

use super::{fit, At, Cx, Marks, Res};
use crate::config::placeholders::placeholders_in;
use crate::config::raw::join;
use crate::config::{DeviceNaming, GpuBackend, GpusConfig, ModelConfig, StaticDevice};
use crate::units::short_bytes;

/// Beyond this many declared devices the fit is not judged (no host has them; the work stays
/// bounded whatever the file says).
const MAX_JUDGED_DEVICES: usize = 1024;
/// Models named in a message before "and N more".
const LISTED_MODELS: usize = 6;

/// Whether `template` has a `{port}` placeholder.
fn has_port(template: &str) -> bool {
    placeholders_in(template).contains(&"port")
}

/// The address (host and port) of an http:// URL, and the rest of it.
fn authority(url: &str) -> (&str, &str) {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest.split_at(end)
}

impl Cx<'_> {
    pub(super) fn deployment(
        &self,
        gpus: &GpusConfig,
        models: &[ModelConfig],
        marks: &[Marks],
    ) -> Res<()> {
        for (m, mark) in models.iter().zip(marks) {
            self.port_is_passed(m, mark)?;
            for u in &mark.urls {
                self.url_uses_port(&u.key, u.at.clone(), &u.url)?;
            }
        }
        if gpus.backend != GpuBackend::Nvml {
            self.mig_named_by_uuid(&gpus.devices, models, marks)?;
        }
        // With NVML (or `auto`, which may find it) the devices are known only at run time; the
        // daemon reports a model that does not fit as no_capacity.
        if gpus.backend == GpuBackend::Static {
            self.minimums_fit(&gpus.devices, models, marks)?;
        }
        Ok(())
    }

    /// CUDA names a MIG instance only by its UUID: a declared MIG instance (`MIG-…`) and a GPU
    /// model that names its devices by index cannot go together. (With NVML the instances are
    /// known at run time, when such a model is simply not placed on one, and says why.)
    fn mig_named_by_uuid(
        &self,
        devices: &[StaticDevice],
        models: &[ModelConfig],
        marks: &[Marks],
    ) -> Res<()> {
        let Some(mig) = devices.iter().find(|d| d.uuid.starts_with("MIG-")) else {
            return Ok(());
        };
        for (m, mark) in models.iter().zip(marks) {
            if m.launch.gpus == 0 || m.launch.device_naming != DeviceNaming::Index {
                continue;
            }
            return Err(self.err(
                &join(&mark.key, "device_naming"),
                mark.device_naming.clone(),
                format!(
                    "the declared devices include MIG instance {:?}, which CUDA can name only by \
                     UUID, and this model names its devices by index (device_naming = \
                     \"index\", the default); set device_naming = \"uuid\" (a server that \
                     cannot read UUIDs, such as vLLM, cannot run on MIG instances)",
                    mig.uuid
                ),
            ));
        }
        Ok(())
    }

    /// The server must learn its port: `{port}` in the command or `env`, or a command that reads
    /// `$HEARTH_PORT` (a shell line).
    fn port_is_passed(&self, m: &ModelConfig, mark: &Marks) -> Res<()> {
        let passed = m
            .launch
            .command
            .iter()
            .any(|a| has_port(a) || a.contains("HEARTH_PORT"))
            || m.launch.env.values().any(|v| has_port(v));
        if passed {
            return Ok(());
        }
        Err(self.err(
            &join(&mark.key, "command"),
            mark.command.clone(),
            "neither the command nor env mentions {port}: hearth gives each replica a port of \
             its own and routes and probes it at 127.0.0.1:{port}, so a server listening where \
             it chooses would be routed dead, and a second replica would fail with \"Address \
             already in use\"; pass it on, e.g. \"--port\", \"{port}\" (a server that reads \
             $HEARTH_PORT itself: say so with env = { HEARTH_PORT = \"{port}\" })",
        ))
    }

    /// Probes and scrapes go to the replica's own port.
    fn url_uses_port(&self, key: &str, at: At, url: &str) -> Res<()> {
        let (address, path) = authority(url);
        if has_port(address) {
            return Ok(());
        }
        Err(self.err(
            key,
            at,
            format!(
                "{url:?} does not use {{port}} in its address: each replica listens on a port of \
                 its own, and a fixed one would probe some other server (or one replica for \
                 all); write e.g. \"http://127.0.0.1:{{port}}{path}\""
            ),
        ))
    }

    /// Each model's `min` replicas fit the declared devices, alone and all together: a minimum
    /// that cannot would wait in no_capacity for as long as the daemon runs.
    fn minimums_fit(
        &self,
        devices: &[StaticDevice],
        models: &[ModelConfig],
        marks: &[Marks],
    ) -> Res<()> {
        if devices.len() > MAX_JUDGED_DEVICES {
            return Ok(());
        }
        let memory: Vec<u64> = devices.iter().map(|d| d.memory).collect();
        let devices = fit::Devices::new(&memory);
        let never = "the model would wait in no_capacity for as long as the daemon runs";
        let mut asks: Vec<(usize, fit::Demand)> = Vec::new();
        for (i, (m, mark)) in models.iter().zip(marks).enumerate() {
            if m.launch.gpus == 0 || m.scaling.min == 0 {
                continue;
            }
            let d = fit::Demand {
                replicas: m.scaling.min,
                gpus: m.launch.gpus,
                bytes: m.launch.gpu_memory,
            };
            if m.launch.gpus as usize > devices.len() {
                return Err(self.err(
                    &join(&mark.key, "gpus"),
                    mark.gpus.clone(),
                    format!(
                        "each replica needs {} GPUs but {} device(s) are declared ({}); {never}",
                        m.launch.gpus,
                        devices.len(),
                        devices.describe()
                    ),
                ));
            }
            if let Some(b) = m.launch.gpu_memory {
                let large = devices.at_least(b);
                if large < u64::from(m.launch.gpus) {
                    return Err(self.err(
                        &join(&mark.key, "gpu_memory"),
                        mark.gpu_memory.clone(),
                        format!(
                            "each replica needs {} device(s) with {} free; {large} of the \
                             declared devices ({}) are that large; {never}",
                            m.launch.gpus,
                            short_bytes(b),
                            devices.describe()
                        ),
                    ));
                }
            }
            // With `[model.sleep]` on a share of its devices, `min` counts replicas asleep too:
            // one must fit awake, and together they may all be asleep, each holding
            // `gpu_memory_asleep` (a wake takes its room from others: core/reclaim.rs).
            let (d, together) = match (&m.sleep, m.launch.gpu_memory) {
                (Some(_), Some(_)) => (
                    fit::Demand { replicas: 1, ..d },
                    fit::Demand {
                        bytes: super::wake_fit::bytes_asleep(m),
                        ..d
                    },
                ),
                _ => (d, d),
            };
            if !devices.fits_alone(&d) {
                return Err(self.err(
                    &join(&mark.key, "scaling.min"),
                    mark.min.clone(),
                    format!(
                        "min = {}, but the declared devices ({}) hold at most {} replica(s) of \
                         {}; {never}",
                        d.replicas,
                        devices.describe(),
                        devices.most_alone(&d),
                        fit::describe(&d)
                    ),
                ));
            }
            asks.push((i, together));
        }
        let all: Vec<fit::Demand> = asks.iter().map(|(_, d)| *d).collect();
        if devices.together(&all) != fit::Fit::No {
            return self.each_can_wake(&devices, models, marks);
        }
        // Name the model whose minimum no longer fits beside those of the models above it: the
        // shortest prefix that does not fit (adding models only makes it harder), by bisection.
        let (mut lo, mut hi) = (1, all.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if devices.together(&all[..mid]) == fit::Fit::No {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let Some(&(i, _)) = asks.get(lo - 1) else {
            return Ok(());
        };
        let mut listed: Vec<String> = asks[..lo]
            .iter()
            .take(LISTED_MODELS)
            .map(|(j, d)| format!("{:?}: {}", models[*j].name, fit::describe_min(d)))
            .collect();
        if lo > LISTED_MODELS {
            listed.push(format!("and {} more", lo - LISTED_MODELS));
        }
        Err(self.err(
            &join(&marks[i].key, "scaling.min"),
            marks[i].min.clone(),
            format!(
                "the minimums of {} cannot all be placed on the declared devices ({}): one model \
                 would wait in no_capacity for as long as the daemon runs; lower a min or \
                 declare more devices",
                listed.join(", "),
                devices.describe()
            ),
        ))
    }
}
