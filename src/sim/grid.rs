//! `hearth simulate --grid`: every policy on the standard grid of workloads × knobs, with the
//! clairvoyant oracle as yardstick, one row per cell and a summary (`grid_report`).
//!
//! Workloads (37):
//! - the five synthetic scenarios at seeds 1–5;
//! - both Azure traces time-compressed by `--speed` 1, 1.5, 2 and 4;
//! - spliced from the traces (at `--speed 1`): conv and code in 15-minute phases back to back;
//!   conv with a flash crowd cut in at 20 min (+3× its mean rate within 10 s for 8 min, fading
//!   over 5 min); each trace reversed in time.
//!
//! Knobs (18 per workload): cold start 10 s, 60 s, 240 s; slots per replica 1, 8, 32; target
//! wait 0.5 s and 2 s. Every policy runs with only `min` = 1, `max` = 16 and `target_wait` set:
//! hearth with its defaults for everything else, the baselines with their published defaults.
//! The load is scaled with the slots (`--rate-mult slots/8`: the Poisson rate of a synthetic
//! scenario; recorded arrivals thinned or replicated, copies shifted by up to 1 s) so that `max`
//! is the same share of the peak in every cell.
//!
//! Policies: hearth, the five baselines, the oracle, and KPA with its target utilisation set in
//! hindsight to 50, 60, 80, 90 or 100 % (for the comparison "at equal service" only).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::baselines::{kpa::Kpa, secs, BaselineDriver};
use super::report::{self, PolicyReport};
use super::workload::{self, ServiceModel, Workload};
use super::{engine, run_policy, Policy, Setup, SEC};
use crate::config::Config;

pub const COLD_STARTS_S: [u64; 3] = [10, 60, 240];
pub const SLOTS: [u32; 3] = [1, 8, 32];
pub const TARGETS_MS: [u64; 2] = [500, 2000];
pub const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];
pub const SPEEDS: [f64; 4] = [1.0, 1.5, 2.0, 4.0];
pub const MIN: u32 = 1;
pub const MAX: u32 = 16;
/// KPA's target utilisation, tuned in hindsight (its default is 0.7).
pub const KPA_TUNED: [f64; 5] = [0.5, 0.6, 0.8, 0.9, 1.0];
/// The policies of every cell, in the table's order.
pub const POLICIES: [Policy; 7] = [
    Policy::Hearth,
    Policy::HpaUtil,
    Policy::HpaQueue,
    Policy::Kpa,
    Policy::Ray,
    Policy::Cortex,
    Policy::Oracle,
];

pub(super) const SM: ServiceModel = ServiceModel {
    prefill: 0.0002,
    decode: 0.02,
};
pub(super) const PROMOTION: Duration = Duration::from_millis(500);
pub(super) const WARMUP: Duration = Duration::from_secs(300);

/// A workload of the grid, at every slot count (its load scaled to the slots).
pub struct GridWorkload {
    /// `step`, `azure-conv`, `spliced`, …
    pub family: &'static str,
    /// What it is: `step seed 3`, `azure-code --speed 4`, `conv-code phases`, …
    pub label: String,
    /// One per entry of `SLOTS`.
    pub by_slots: Vec<Workload>,
}

/// One cell: a workload and a setting of the knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub workload: usize,
    pub cold_start_s: u64,
    pub slots: u32,
    pub target_ms: u64,
}

/// Every cell, workload by workload.
pub fn cells(workloads: usize) -> Vec<Cell> {
    let mut v = Vec::new();
    for w in 0..workloads {
        for &cold_start_s in &COLD_STARTS_S {
            for &slots in &SLOTS {
                for &target_ms in &TARGETS_MS {
                    v.push(Cell {
                        workload: w,
                        cold_start_s,
                        slots,
                        target_ms,
                    });
                }
            }
        }
    }
    v
}

/// `n` cells that span every workload and every setting of the knobs: cell i takes workload
/// i mod W and knob setting 5i mod 18 (5 and 18 are coprime, so each run of 18 covers them all).
pub fn sample(workloads: usize, n: usize) -> Vec<Cell> {
    sample_of(&cells(1), workloads, n)
}

/// `n` cells over `knobs` (one workload's knob settings): cell i takes workload i mod W and
/// knob setting 5i mod K. 5 must be coprime with K for each run of K to cover every setting.
pub(super) fn sample_of(knobs: &[Cell], workloads: usize, n: usize) -> Vec<Cell> {
    if knobs.is_empty() || workloads == 0 {
        return Vec::new();
    }
    // A sample as large as the grid is the grid, each cell once: past it the rule below
    // would repeat cells, and run as many as were asked for.
    if n >= knobs.len().saturating_mul(workloads) {
        return (0..workloads)
            .flat_map(|w| knobs.iter().map(move |k| Cell { workload: w, ..*k }))
            .collect();
    }
    (0..n)
        .map(|i| Cell {
            workload: i % workloads,
            ..knobs[(5 * i) % knobs.len()]
        })
        .collect()
}

/// The sample's promise, for the tests of both grids: `s` has `n` cells, covers the first
/// min(n, W) workloads and every setting in `knobs`, and every cell is one of `all`.
#[cfg(test)]
pub(super) fn assert_sample_spans(
    s: &[Cell],
    n: usize,
    workloads: usize,
    knobs: &[Cell],
    all: &[Cell],
) {
    assert_eq!(s.len(), n);
    for w in 0..workloads.min(n) {
        assert!(s.iter().any(|c| c.workload == w), "workload {w}");
    }
    for k in knobs {
        assert!(
            s.iter().any(|c| c.cold_start_s == k.cold_start_s
                && c.slots == k.slots
                && c.target_ms == k.target_ms),
            "{} {} {}",
            k.cold_start_s,
            k.slots,
            k.target_ms
        );
    }
    assert!(s.iter().all(|c| all.contains(c)));
}

/// The grid's workloads. Without the Azure traces (no `trace_dir`), only the synthetic ones.
pub fn workloads(
    trace_dir: Option<&Path>,
    jobs: usize,
) -> Result<Vec<GridWorkload>, workload::TraceError> {
    let mut specs: Vec<Spec> = Vec::new();
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
    if let Some(dir) = trace_dir {
        for (name, file) in workload::TRACES {
            let path = dir.join(file);
            for speed in SPEEDS {
                let path = path.clone();
                specs.push((
                    name,
                    format!("{name} --speed {speed}"),
                    Box::new(move |rate| {
                        workload::trace_workload(&path, name, 1, &SM, speed, rate)
                    }),
                ));
            }
        }
        let conv = dir.join(workload::TRACES[0].1);
        let code = dir.join(workload::TRACES[1].1);
        let load = move |p: &Path, name: &str| workload::trace_workload(p, name, 1, &SM, 1.0, 1.0);
        let scaled = |w: Workload, rate: f64| -> Workload {
            if rate == 1.0 {
                return w;
            }
            let mut w2 = Workload {
                requests: workload::multiply_rate(&w.requests, rate, 1),
                ..w
            };
            w2.description.push_str(&format!(
                "; arrivals thinned/replicated ×{rate} (--rate-mult)"
            ));
            w2
        };
        {
            let (conv, code) = (conv.clone(), code.clone());
            specs.push((
                "spliced",
                "conv-code phases".into(),
                Box::new(move |rate| {
                    let (a, b) = (load(&conv, "azure-conv")?, load(&code, "azure-code")?);
                    let m = 60 * SEC;
                    let w = workload::splice(
                        "conv-code",
                        "spliced: the Azure conv and code traces in 15-min phases, conv first",
                        &[(&a, 0, 15 * m), (&b, 15 * m, 30 * m), (&a, 30 * m, 45 * m)]
                            .into_iter()
                            .chain([(&b, 45 * m, b.horizon)])
                            .collect::<Vec<_>>(),
                    );
                    Ok(scaled(w, rate))
                }),
            ));
        }
        {
            let conv = conv.clone();
            specs.push((
                "spliced",
                "conv + flash crowd".into(),
                Box::new(move |rate| {
                    let a = load(&conv, "azure-conv")?;
                    Ok(scaled(
                        workload::with_flash_crowd(&a, 20 * 60 * SEC, 3.0, 1),
                        rate,
                    ))
                }),
            ));
        }
        for (path, name) in [(conv, "azure-conv"), (code, "azure-code")] {
            specs.push((
                "spliced",
                format!("{name} reversed"),
                Box::new(move |rate| Ok(scaled(workload::reversed(&load(&path, name)?), rate))),
            ));
        }
    }
    build(specs, jobs)
}

/// Builds a workload at a rate multiplier (`slots / 8`).
pub type Build = Box<dyn Fn(f64) -> Result<Workload, workload::TraceError> + Send + Sync>;
/// A workload of a grid: family, label, how to build it.
pub type Spec = (&'static str, String, Build);

/// Builds every spec at every slot count, in parallel.
pub fn build(specs: Vec<Spec>, jobs: usize) -> Result<Vec<GridWorkload>, workload::TraceError> {
    // (spec, slots) pairs.
    let n = specs.len() * SLOTS.len();
    let built: Vec<Mutex<Option<Result<Workload, workload::TraceError>>>> =
        (0..n).map(|_| Mutex::new(None)).collect();
    parallel(n, jobs, |i| {
        let (spec, s) = (i / SLOTS.len(), i % SLOTS.len());
        let w = (specs[spec].2)(SLOTS[s] as f64 / 8.0);
        *built[i].lock().expect("not poisoned") = Some(w);
    });
    let mut built = built
        .into_iter()
        .map(|m| m.into_inner().expect("not poisoned").expect("built"));
    specs
        .into_iter()
        .map(|(family, label, _)| {
            let by_slots = (0..SLOTS.len())
                .map(|_| built.next().expect("one per slot count"))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(GridWorkload {
                family,
                label,
                by_slots,
            })
        })
        .collect()
}

/// Runs `f(0..n)` on `jobs` threads, the next index to whichever thread is free.
pub fn parallel(n: usize, jobs: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, n.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i);
            });
        }
    });
}

/// The configuration every policy of a cell runs with: only `min`, `max` and `target_wait`.
pub fn config(target_ms: u64) -> Config {
    let text = format!(
        "[[model]]\nname = \"llm\"\ncommand = [\"true\"]\ngpus = 0\n\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n\
         [model.scaling]\nmin = {MIN}\nmax = {MAX}\ntarget_wait = \"{target_ms}ms\"\n"
    );
    Config::parse(&text, Path::new("grid.toml")).expect("the grid's configuration is valid")
}

/// One policy's figures in a cell.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub policy: String,
    /// Share of requests over the target (0.0123 = 1.23 %).
    pub over_target: f64,
    pub replica_seconds: f64,
    pub killed: u64,
}

impl From<&PolicyReport> for Figures {
    fn from(p: &PolicyReport) -> Figures {
        Figures {
            policy: p.policy.clone(),
            over_target: p.over_target,
            replica_seconds: p.replica_seconds,
            killed: p.killed,
        }
    }
}

/// What one cell measured.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    pub family: String,
    pub workload: String,
    pub cold_start_s: u64,
    pub slots: u32,
    pub target_ms: u64,
    pub requests: u64,
    pub lower_bound_replica_seconds: f64,
    /// `POLICIES`, in order.
    pub policies: Vec<Figures>,
    /// KPA at each of `KPA_TUNED`'s target utilisations.
    pub kpa_tuned: Vec<Figures>,
}

impl CellResult {
    pub fn get(&self, policy: &str) -> &Figures {
        self.policies
            .iter()
            .find(|f| f.policy == policy)
            .expect("every policy ran")
    }
}

/// Runs `policies` (and KPA tuned in hindsight, if `tuned`) on one cell.
pub fn run_cell(gw: &GridWorkload, c: Cell, policies: &[Policy], tuned: bool) -> CellResult {
    let s = SLOTS
        .iter()
        .position(|&x| x == c.slots)
        .expect("a grid slot count");
    let w = &gw.by_slots[s];
    let setup = Setup::new(
        config(c.target_ms),
        "llm",
        c.slots,
        Duration::from_secs(c.cold_start_s),
        PROMOTION,
        WARMUP,
        w,
    )
    .expect("the grid's setup is valid");
    let lb = report::lower_bound(w, &setup.params);
    let policies = policies
        .iter()
        .map(|&p| Figures::from(&run_policy(&setup, w, p).report))
        .collect();
    let kpa_tuned = KPA_TUNED
        .iter()
        .filter(|_| tuned)
        .map(|&u| {
            let rule = Kpa::with_target_utilization(MIN, MAX, c.slots, u);
            let mut d = BaselineDriver::new(rule, secs(300), MIN);
            let out = engine::run(&mut d, w, setup.params);
            let name = format!("kpa@{:.0}%", u * 100.0);
            Figures::from(&report::policy_report(&name, &out, w, &setup.params, lb))
        })
        .collect();
    CellResult {
        family: gw.family.to_string(),
        workload: gw.label.clone(),
        cold_start_s: c.cold_start_s,
        slots: c.slots,
        target_ms: c.target_ms,
        requests: report::measured(w, setup.params.warmup).count() as u64,
        lower_bound_replica_seconds: (lb * 10.0).round() / 10.0,
        policies,
        kpa_tuned,
    }
}

/// Runs `cells` on `jobs` threads, the heaviest first; results in the order of `cells`. Every
/// policy of `POLICIES` and KPA tuned in hindsight, or only `only`.
pub fn run(
    ws: &[GridWorkload],
    cells: &[Cell],
    jobs: usize,
    only: Option<&[Policy]>,
) -> Vec<CellResult> {
    let policies = only.unwrap_or(&POLICIES);
    let weight = |c: &Cell| {
        let s = SLOTS.iter().position(|&x| x == c.slots).unwrap_or(0);
        ws[c.workload].by_slots[s].requests.len()
    };
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(weight(&cells[i])));
    let out: Vec<Mutex<Option<CellResult>>> = cells.iter().map(|_| Mutex::new(None)).collect();
    parallel(cells.len(), jobs, |k| {
        let i = order[k];
        let r = run_cell(&ws[cells[i].workload], cells[i], policies, only.is_none());
        *out[i].lock().expect("not poisoned") = Some(r);
    });
    out.into_iter()
        .map(|m| m.into_inner().expect("not poisoned").expect("ran"))
        .collect()
}

/// What `hearth simulate --grid` was asked for.
pub struct Options {
    pub trace_dir: Option<PathBuf>,
    /// Only this many cells (`sample`).
    pub sample: Option<usize>,
    pub jobs: Option<usize>,
    /// Only these policies: the table without verdicts, no summary.
    pub only: Option<Vec<Policy>>,
    /// The held-out family (`grid_held_out`) instead of the standard workloads.
    pub held_out: bool,
    /// The cells with a sleeping tier (`grid_sleep`) instead of the standard ones.
    pub sleep_cells: bool,
    /// How arrivals reach replicas (`--router`; front-door only with `sleep_cells`).
    pub router: super::Router,
    pub json: bool,
    pub markdown: bool,
}

/// `hearth simulate --grid`.
pub fn main(o: Options) -> std::process::ExitCode {
    let Options {
        trace_dir,
        sample: sample_n,
        jobs,
        only,
        held_out,
        sleep_cells,
        router,
        json,
        markdown,
    } = o;
    let started = Instant::now();
    let jobs = jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let dir = trace_dir.or_else(workload::trace_dir);
    let dir = match dir {
        Some(d)
            if d.join(workload::TRACES[0].1).exists() && d.join(workload::TRACES[1].1).exists() =>
        {
            Some(d)
        }
        Some(d) => {
            eprintln!(
                "hearth simulate: {} does not hold {} and {}",
                d.display(),
                workload::TRACES[0].1,
                workload::TRACES[1].1
            );
            return std::process::ExitCode::from(2);
        }
        None => {
            eprintln!(
                "note: no --trace-dir, HEARTH_TRACE_DIR or ./{}: the Azure trace workloads are \
                 left out; the grid covers the synthetic scenarios only",
                workload::REPO_TRACE_DIR
            );
            None
        }
    };
    let ws = if held_out {
        super::grid_held_out::workloads(jobs)
    } else {
        workloads(dir.as_deref(), jobs)
    };
    let ws = match ws {
        Ok(w) => w,
        Err(e) => {
            eprintln!("hearth simulate: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    if sleep_cells {
        super::grid_sleep::main(&ws, sample_n, jobs, json, router);
        if dir.is_some() {
            eprintln!("traces: {}", workload::AZURE_ATTRIBUTION);
        }
        return std::process::ExitCode::SUCCESS;
    }
    let cells = match sample_n {
        Some(n) => sample(ws.len(), n),
        None => cells(ws.len()),
    };
    let results = run(&ws, &cells, jobs, only.as_deref());
    let elapsed = started.elapsed();
    let traces = dir.is_some() && !held_out;
    if only.is_some() {
        // Verdicts need every policy: the figures only.
        if json {
            println!(
                "{}",
                serde_json::to_string(&serde_json::json!({ "cells": results }))
                    .expect("serialises")
            );
        } else {
            print!("{}", super::grid_report::table(&results));
        }
        return std::process::ExitCode::SUCCESS;
    }
    let summary = super::grid_verdict::summarize(&results);
    if json {
        let doc = super::grid_report::Document {
            cells: &results,
            summary: &summary,
            seconds: (elapsed.as_secs_f64() * 10.0).round() / 10.0,
            jobs,
        };
        println!("{}", serde_json::to_string(&doc).expect("serialises"));
    } else if markdown {
        print!(
            "{}",
            super::grid_report::markdown(&results, &summary, elapsed, jobs, traces)
        );
    } else {
        print!("{}", super::grid_report::table(&results));
        println!();
        print!(
            "{}",
            super::grid_report::summary_text(&summary, elapsed, jobs, traces)
        );
    }
    if traces {
        eprintln!("traces: {}", workload::AZURE_ATTRIBUTION);
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_spans_every_workload_and_knob() {
        let all = cells(37);
        assert_eq!(all.len(), 37 * 18);
        let knobs = cells(1);
        assert_eq!(
            knobs.len(),
            COLD_STARTS_S.len() * SLOTS.len() * TARGETS_MS.len()
        );
        assert_sample_spans(&sample(37, 64), 64, 37, &knobs, &all);
        // Asked for more than there are: every cell once.
        assert_eq!(sample(37, 1_000_000), all);
    }
}
