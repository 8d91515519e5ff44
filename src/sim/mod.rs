//! `hearth simulate`: replays a workload against hearth's real policy (the core's `Node`, driven
//! with virtual time) and against published autoscalers, on one model of replicas and queues.
//!
//! - `workload`: synthetic scenarios and CSV traces, with `--speed` / `--rate-mult`; `load`:
//!   the one the arguments ask for.
//! - `cluster`: replicas with slots and FIFO queues, the least-loaded router.
//! - `engine`: the discrete-event loop and the `Driver` interface.
//! - `hearth`: the core as the daemon's shell would drive it.
//! - `baselines`: Kubernetes HPA (utilisation, queue depth), Knative KPA, Ray Serve, Cortex.
//! - `report`, `plot`: figures, `--json`, the table, the SVG; `header`: what a run says about
//!   itself (slots per replica and where they came from) and the refusal of one that measures
//!   nothing.
#![forbid(unsafe_code)]

mod args;
pub mod baselines;
pub mod cluster;
pub mod engine;
pub mod grid;
pub mod grid_held_out;
pub mod grid_report;
pub mod grid_sleep;
pub mod grid_verdict;
pub mod header;
pub mod hearth;
mod load;
pub mod oracle;
mod oracle_keep;
mod oracle_replay;
pub mod plot;
pub mod report;
pub mod rng;
pub mod workload;

#[cfg(test)]
mod front_door_tests;
#[cfg(test)]
mod tests;

use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;
#[cfg(test)]
use args::parse_host_memory;
pub use args::SimArgs;
use baselines::{cortex::Cortex, fixed::Fixed, hpa::Hpa, kpa::Kpa, ray::Ray};
use baselines::{BaselineDriver, Targets};
pub use engine::max_asleep;
pub use engine::Router;
use engine::{Driver, Params, Point};
pub use load::load_workload;
use report::Report;
use workload::Workload;

/// Virtual time, microseconds.
pub type Us = u64;
pub const SEC: Us = 1_000_000;

fn us(d: Duration) -> Us {
    d.as_micros() as Us
}

/// The policies `--policy` may name. The default set is every one but `fixed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Hearth,
    HearthNoPool,
    HpaUtil,
    HpaQueue,
    Kpa,
    Ray,
    Cortex,
    /// `min` replicas, never scaled: a control for checking the queueing model.
    Fixed,
    /// Clairvoyant: knows every arrival; the yardstick (see `oracle`).
    Oracle,
}

impl Policy {
    pub const DEFAULT: [Policy; 8] = [
        Policy::Hearth,
        Policy::HearthNoPool,
        Policy::HpaUtil,
        Policy::HpaQueue,
        Policy::Kpa,
        Policy::Ray,
        Policy::Cortex,
        Policy::Oracle,
    ];

    /// The published autoscalers hearth is compared with.
    pub const BASELINES: [Policy; 5] = [
        Policy::HpaUtil,
        Policy::HpaQueue,
        Policy::Kpa,
        Policy::Ray,
        Policy::Cortex,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Hearth => "hearth",
            Policy::HearthNoPool => "hearth-nopool",
            Policy::HpaUtil => "hpa-util",
            Policy::HpaQueue => "hpa-queue",
            Policy::Kpa => "kpa",
            Policy::Ray => "ray",
            Policy::Cortex => "cortex",
            Policy::Fixed => "fixed",
            Policy::Oracle => "oracle",
        }
    }

    pub fn parse(s: &str) -> Option<Policy> {
        Policy::DEFAULT
            .iter()
            .chain([Policy::Fixed].iter())
            .copied()
            .find(|p| p.name() == s)
    }
}

/// Why the arguments give nothing to simulate: no workload, or no model to size it for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Trace(#[from] workload::TraceError),
    #[error("scenario {0} is synthetic; --trace goes with azure-conv, azure-code or alone")]
    SyntheticWithTrace(String),
    #[error("unknown scenario {name:?}; built in: {known}")]
    UnknownScenario { name: String, known: String },
    #[error("give --scenario NAME or --trace CSV")]
    NoWorkload,
    #[error("no model {model:?} in {} (models: {models})", path.display())]
    NoModel {
        model: String,
        path: std::path::PathBuf,
        models: String,
    },
    #[error("--concurrency must be at least 1")]
    NoConcurrency,
}

/// Everything a simulation needs besides the workload.
#[derive(Debug, Clone)]
pub struct Setup {
    pub config: Config,
    pub model: String,
    pub params: Params,
    pub targets: Targets,
}

impl Setup {
    /// Reads the model's scaling settings; errors name what is wrong.
    pub fn new(
        config: Config,
        model: &str,
        concurrency: u32,
        cold_start: Duration,
        promotion: Duration,
        warmup: Duration,
        w: &Workload,
    ) -> Result<Setup, SimError> {
        let m = config.model(model).ok_or_else(|| {
            let names: Vec<&str> = config.models.iter().map(|m| m.name.as_str()).collect();
            SimError::NoModel {
                model: model.to_string(),
                path: config.path.clone(),
                models: if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                },
            }
        })?;
        if concurrency == 0 {
            return Err(SimError::NoConcurrency);
        }
        let s = &m.scaling;
        let asleep = hearth::asleep(m);
        let params = Params {
            concurrency,
            cold_start: us(cold_start),
            promotion: us(promotion),
            warmup: us(warmup),
            target_wait: us(s.target_wait),
            min: s.min,
            max: s.max,
            decisions: false,
            wake: 0,
            fall_asleep: 0,
            asleep,
            max_asleep: max_asleep(config.daemon.host_memory, asleep),
            router: Router::Committed,
        };
        let targets = Targets {
            concurrency,
            target_wait_s: s.target_wait.as_secs_f64(),
            mean_service_s: w.mean_service_s(),
        };
        Ok(Setup {
            model: model.to_string(),
            config,
            params,
            targets,
        })
    }

    fn driver(&self, p: Policy) -> Box<dyn Driver> {
        let (min, max) = (self.params.min, self.params.max);
        let c = self.params.concurrency;
        let s = baselines::secs;
        match p {
            Policy::Hearth => Box::new(hearth::HearthDriver::new(
                self.config.clone(),
                &self.model,
                true,
            )),
            Policy::HearthNoPool => Box::new(hearth::HearthDriver::new(
                self.config.clone(),
                &self.model,
                false,
            )),
            Policy::HpaUtil => Box::new(BaselineDriver::new(Hpa::util(min, max), s(30), min)),
            Policy::HpaQueue => Box::new(BaselineDriver::new(
                Hpa::queue(min, max, self.targets.queue_depth_per_replica()),
                s(30),
                min.max(1),
            )),
            Policy::Kpa => Box::new(BaselineDriver::new(Kpa::new(min, max, c), s(300), min)),
            Policy::Ray => Box::new(BaselineDriver::new(Ray::new(min, max), s(20), min)),
            Policy::Cortex => Box::new(BaselineDriver::new(
                Cortex::new(min, max, c),
                s(60),
                min.max(1),
            )),
            Policy::Fixed => Box::new(BaselineDriver::new(Fixed, s(30), min)),
            Policy::Oracle => unreachable!("the oracle runs through oracle::run"),
        }
    }

    /// What each baseline aims at, in its own terms (for the report).
    pub fn target_notes(&self) -> String {
        let c = self.params.concurrency;
        format!(
            "targets: hpa-util GPU utilisation {:.0} %; hpa-queue {:.2} waiting per replica \
             (Little's law: {} slots / {:.2} s mean service × {} target wait); kpa 70 % of {} \
             = {:.1} concurrent; ray 2 ongoing per replica; cortex {} in flight per replica",
            baselines::hpa::UTIL_TARGET,
            self.targets.queue_depth_per_replica(),
            c,
            self.targets.mean_service_s,
            workload::fmt_secs(self.params.target_wait),
            c,
            0.7 * c as f64,
            c
        )
    }
}

/// One policy's run.
pub struct PolicyRun {
    pub report: report::PolicyReport,
    pub series: Vec<Point>,
    /// Slot-seconds of service the replicas delivered, all run long (completed work, and the
    /// served part of killed work).
    pub busy_slot_seconds: f64,
}

/// Runs one policy.
pub fn run_policy(setup: &Setup, w: &Workload, p: Policy) -> PolicyRun {
    let out = if p == Policy::Oracle {
        oracle::run(w, setup.params)
    } else {
        let mut d = setup.driver(p);
        engine::run(d.as_mut(), w, setup.params)
    };
    let lb = report::lower_bound(w, &setup.params);
    PolicyRun {
        report: report::policy_report(p.name(), &out, w, &setup.params, lb),
        busy_slot_seconds: out.cl.busy_slot_done() as f64 / SEC as f64,
        series: out.series,
    }
}

/// Runs every policy on the same arrivals.
pub fn simulate(setup: &Setup, w: &Workload, policies: &[Policy]) -> (Report, Vec<PolicyRun>) {
    let runs: Vec<PolicyRun> = policies.iter().map(|&p| run_policy(setup, w, p)).collect();
    let report = Report {
        scenario: w.name.clone(),
        requests: report::measured(w, setup.params.warmup).count() as u64,
        lower_bound_replica_seconds: (report::lower_bound(w, &setup.params) * 10.0).round() / 10.0,
        policies: runs.iter().map(|r| r.report.clone()).collect(),
    };
    (report, runs)
}

fn parse_policies(names: &[String]) -> Result<Vec<Policy>, String> {
    if names.is_empty() {
        return Ok(Policy::DEFAULT.to_vec());
    }
    let mut out = Vec::new();
    for n in names.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let p = Policy::parse(n).ok_or_else(|| {
            format!(
                "unknown policy {n:?}; expected {} or fixed",
                Policy::DEFAULT.map(|p| p.name()).join(", ")
            )
        })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err("--policy names no policy".into());
    }
    Ok(out)
}

/// Behind the front door: hearth's policies, `fixed` and the oracle (by default all of them);
/// the baselines read per-replica queues that a front door does not keep, so naming one is an
/// error rather than a figure that means nothing.
fn front_door_policies(
    router: Router,
    named: &[String],
    policies: Vec<Policy>,
) -> Result<Vec<Policy>, String> {
    if router == Router::Committed {
        return Ok(policies);
    }
    let fits = |p: &Policy| {
        matches!(
            p,
            Policy::Hearth | Policy::HearthNoPool | Policy::Fixed | Policy::Oracle
        )
    };
    if named.is_empty() {
        return Ok(policies.into_iter().filter(fits).collect());
    }
    match policies.iter().find(|p| !fits(p)) {
        Some(p) => Err(format!(
            "--router front-door runs hearth, hearth-nopool, fixed and oracle; {} scales on \
             per-replica queues, which a front door does not keep",
            p.name()
        )),
        None => Ok(policies),
    }
}

/// `hearth simulate`.
pub fn main(a: SimArgs) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("hearth simulate: {msg}");
        ExitCode::from(2)
    };
    let router = if a.router == "front-door" {
        Router::FrontDoor
    } else {
        Router::Committed
    };
    if a.grid && router == Router::FrontDoor && !a.sleep_cells {
        return usage(
            "--router front-door with --grid needs --sleep-cells: the standard grid's baselines \
             scale on per-replica queues, which a front door does not keep"
                .into(),
        );
    }
    if a.grid {
        let only = if a.policy.is_empty() {
            None
        } else {
            match parse_policies(&a.policy) {
                Ok(p) => Some(p),
                Err(e) => return usage(e),
            }
        };
        return grid::main(grid::Options {
            trace_dir: a.trace_dir,
            sample: a.grid_sample,
            jobs: a.jobs.map(|j| j as usize),
            only,
            held_out: a.family.as_deref() == Some("held-out"),
            sleep_cells: a.sleep_cells,
            router,
            json: a.json,
            markdown: a.markdown,
        });
    }
    let (Some(config_path), Some(model)) = (a.config.clone(), a.model.clone()) else {
        return usage("give --config FILE and --model NAME (or --grid)".into());
    };
    let policies = match parse_policies(&a.policy) {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    let policies = match front_door_policies(router, &a.policy, policies) {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    // The simulator runs no command and binds no port: it reads the file's values only.
    let mut config = match crate::config::load_with(&config_path, crate::config::Checks::Values) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hearth simulate: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(b) = a.host_memory {
        // The simulated hearth's core reads its budget from here, and `Setup` the oracle's.
        config.daemon.host_memory = Some(b);
    }
    let w = match load_workload(&a) {
        Ok(w) => w,
        Err(e) => return usage(e.to_string()),
    };
    let (slots, slots_from) = config
        .model(&model)
        .map(|m| header::slots_per_replica(a.concurrency, m))
        .unwrap_or((header::DEFAULT_SLOTS, header::SlotsFrom::Default));
    let mut setup = match Setup::new(
        config,
        &model,
        slots,
        a.cold_start,
        a.promotion_delay,
        a.warmup,
        &w,
    ) {
        Ok(s) => s,
        Err(e) => return usage(e.to_string()),
    };
    setup.params.decisions = a.decisions;
    setup.params.router = router;
    setup.params.wake = us(a.wake_time);
    setup.params.fall_asleep = us(a.sleep_time);
    if let Some(why) = header::nothing_measured(&w, &setup) {
        return usage(why);
    }
    let started = std::time::Instant::now();
    let (report, runs) = simulate(&setup, &w, &policies);
    let elapsed = started.elapsed();
    let notes = header::notes(&setup, &w, slots_from);
    if let Some(path) = &a.plot {
        let series: Vec<plot::Series> = runs
            .iter()
            .map(|r| plot::Series {
                policy: &r.report.policy,
                points: &r.series,
            })
            .collect();
        let title = format!("hearth simulate — {} ({})", w.name, setup.model);
        let svg = plot::svg(
            &w,
            &series,
            setup.params.target_wait,
            setup.params.warmup,
            setup.params.max,
            &title,
            &notes,
        );
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("hearth simulate: cannot write {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("a report serialises")
        );
        // The header is not part of the JSON: what it says beyond the JSON's fields, on stderr.
        eprintln!("{}", notes[1]);
        if let Some(attr) = &w.attribution {
            eprintln!("trace: {attr}");
        }
    } else if a.markdown {
        println!("### {}\n", w.name);
        for n in &notes {
            println!("- {n}");
        }
        println!(
            "- {} requests measured; work-conserving lower bound {:.0} replica-s\n",
            report.requests, report.lower_bound_replica_seconds
        );
        print!("{}", report::markdown(&report));
        if let Some(line) = report::oracle_line(&report) {
            println!("\n{line}.");
        }
        report::print_sleep_lines(&report, "- ", ".");
    } else {
        for n in &notes {
            println!("{n}");
        }
        println!(
            "{} requests measured; work-conserving lower bound {:.0} replica-s",
            report.requests, report.lower_bound_replica_seconds
        );
        println!();
        print!("{}", report::table(&report));
        if let Some(line) = report::oracle_line(&report) {
            println!("\n{line}");
        }
        report::print_sleep_lines(&report, "", "");
        println!(
            "\n(simulated {} policies in {:.2} s)",
            runs.len(),
            elapsed.as_secs_f64()
        );
    }
    ExitCode::SUCCESS
}
