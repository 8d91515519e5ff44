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
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::Config;
use baselines::{cortex::Cortex, fixed::Fixed, hpa::Hpa, kpa::Kpa, ray::Ray};
use baselines::{BaselineDriver, Targets};
pub use engine::max_asleep;
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

fn parse_dur(s: &str) -> Result<Duration, crate::units::UnitError> {
    crate::units::parse_duration(s)
}

fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?}: expected a positive number")),
    }
}

/// `--host-memory`: a size as the configuration writes one, more than 0 (the file refuses 0 too).
fn parse_host_memory(s: &str) -> Result<u64, String> {
    match crate::units::parse_size(s) {
        Ok(0) => Err(format!("{s:?}: the budget must be more than 0 bytes")),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// `hearth simulate` options.
#[derive(Args, Debug, Clone)]
#[command(
    about = "Replay traffic against hearth's policy and published autoscalers",
    after_help = "Scenarios: step, burst, diurnal, sawtooth, flash-crowd (synthetic, seeded), \
azure-conv, azure-code (the Azure LLM inference traces 2023, CC-BY 4.0: read from \
$HEARTH_TRACE_DIR, else ./data/traces, where a checkout keeps them; or give the CSV with --trace); \
held out of the grid: burst-3m, burst-7m, burst-25m (jittered ±20 %), burst-poisson, multi-day.\n--speed X divides arrival times by X; \
--rate-mult X multiplies the arrival rate (synthetic: the Poisson rate; traces: each arrival \
kept with probability X below 1, replayed ⌊X⌋ or ⌈X⌉ times above 1, copies shifted by up to 1 s).\n\
--grid runs the standard grid instead (every scenario and trace, cold start, slot count and \
target; see BENCHMARKS.md) and needs neither --config nor --model; --grid --sleep-cells runs the cells with a sleeping tier; --grid --family held-out runs \
the held-out family on the same knobs instead."
)]
pub struct SimArgs {
    /// Configuration file: the model's [model.scaling] is what hearth runs with
    #[arg(long, required_unless_present = "grid")]
    pub config: Option<PathBuf>,
    /// The model (from the configuration) to simulate
    #[arg(long, required_unless_present = "grid")]
    pub model: Option<String>,
    /// A built-in scenario
    #[arg(long, required_unless_present_any = ["trace", "grid"])]
    pub scenario: Option<String>,
    /// A CSV trace: Azure format (TIMESTAMP,ContextTokens,GeneratedTokens) or t_seconds[,service_s]
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Time compression of the arrivals
    #[arg(long, default_value = "1", value_parser = parse_positive)]
    pub speed: f64,
    /// Arrival-rate multiplier
    #[arg(long = "rate-mult", default_value = "1", value_parser = parse_positive)]
    pub rate_mult: f64,
    /// Comma-separated: hearth,hearth-nopool,hpa-util,hpa-queue,kpa,ray,cortex,oracle (default:
    /// all); also fixed (min replicas, never scaled)
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// Spawn → warm (ready) time of a replica
    #[arg(long = "cold-start", default_value = "60s", value_parser = parse_dur)]
    pub cold_start: Duration,
    /// Requests a replica serves at once (slots; default: the model's `slots` where the file
    /// sets them, else 8)
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Service time per context token
    #[arg(long = "prefill-per-token", default_value = "0.2ms", value_parser = parse_dur)]
    pub prefill_per_token: Duration,
    /// Service time per generated token
    #[arg(long = "decode-per-token", default_value = "20ms", value_parser = parse_dur)]
    pub decode_per_token: Duration,
    /// A replica added to the routed set receives traffic after this delay
    #[arg(long = "promotion-delay", default_value = "500ms", value_parser = parse_dur)]
    pub promotion_delay: Duration,
    /// A sleeping replica's wake time (models with [model.sleep]: their sleep and wake requests
    /// are answered after these delays)
    #[arg(long = "wake-time", default_value = "1s", value_parser = parse_dur)]
    pub wake_time: Duration,
    /// The time a replica takes to fall asleep
    #[arg(long = "sleep-time", default_value = "5s", value_parser = parse_dur)]
    pub sleep_time: Duration,
    /// What sleeping replicas may hold in host RAM, all together (e.g. 64GiB): overrides the
    /// file's `[daemon] host_memory` for hearth, and keeps at most ⌊SIZE ÷ [model.sleep]
    /// host_memory⌋ of the oracle's replicas asleep at once. Without it the file's `[daemon]
    /// host_memory` bounds both where set; otherwise neither is bounded
    #[arg(long = "host-memory", value_parser = parse_host_memory, conflicts_with = "grid")]
    pub host_memory: Option<u64>,
    /// Initial transient left out of the figures
    #[arg(long, default_value = "5m", value_parser = parse_dur)]
    pub warmup: Duration,
    /// Replay only the first D of the workload
    #[arg(long, value_parser = parse_dur)]
    pub duration: Option<Duration>,
    /// Seed of the synthetic arrivals and of trace thinning/replication
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
    /// Print the setup and the table as Markdown (for BENCHMARKS.md)
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Write an SVG of arrival rate, oldest wait and replicas over time
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print hearth's scale decisions (time, from → to, reason) to stderr as they happen
    #[arg(long)]
    pub decisions: bool,
    /// Run the standard grid: workloads × cold start × slots × target, every policy and the
    /// oracle, one row per cell and a summary (with --json or --markdown as asked); with
    /// --policy, only those policies' figures (no verdicts)
    #[arg(long, conflicts_with_all = ["config", "model", "scenario", "trace", "plot", "decisions", "duration"])]
    pub grid: bool,
    /// With --grid: only this many cells, chosen to span every workload and every knob setting
    #[arg(long, requires = "grid")]
    pub grid_sample: Option<usize>,
    /// With --grid: the folder holding the Azure traces (default $HEARTH_TRACE_DIR, else
    /// ./data/traces where it exists; without any, the grid has only the synthetic workloads)
    #[arg(long, requires = "grid")]
    pub trace_dir: Option<PathBuf>,
    /// With --grid: `held-out` runs the held-out family instead of the standard workloads (the
    /// held-out scenarios and the grid's scenarios at seeds 6–10)
    #[arg(long, requires = "grid", value_parser = ["standard", "held-out"])]
    pub family: Option<String>,
    /// With --grid: the cells with a sleeping tier instead (cold start 60 s and 240 s, wake 1 s
    /// and 5 s): hearth without and with [model.sleep], and the oracle with it
    #[arg(long, requires = "grid", conflicts_with = "policy")]
    pub sleep_cells: bool,
    /// With --grid: threads to run cells on (default: one per core)
    #[arg(long, requires = "grid", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
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

/// `hearth simulate`.
pub fn main(a: SimArgs) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("hearth simulate: {msg}");
        ExitCode::from(2)
    };
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
