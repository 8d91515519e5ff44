//! `hearth simulate --grid --sleep-cells`: the grid's cells with a sleeping tier (issue 30,
//! docs/sleep.md). On every workload of the standard grid, at cold starts of 60 s and 240 s and
//! every slot count and target: hearth without `[model.sleep]`, then hearth and the oracle with
//! it at wakes of 1 s and 5 s. The standard grid (and issue 26's bars) stay without sleep cells.
//!
//! The sleep is vLLM's level 1 as examples/simulate-sleep.toml has it: a sleeping replica holds
//! 600 MiB of its 36 GiB and 17 GiB of host RAM, so it is charged 1.6 % of a replica-second;
//! falling asleep (5 s) and waking are charged in full.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::grid::{self, Cell, Figures, GridWorkload, MAX, MIN, SLOTS, TARGETS_MS};
use super::{run_policy, Policy, Router, Setup};
use crate::config::Config;

pub const COLD_STARTS_S: [u64; 2] = [60, 240];
pub const WAKES_S: [u64; 2] = [1, 5];
const FALL_ASLEEP: Duration = Duration::from_secs(5);
/// The bar of issue 30: sleep ÷ no sleep in replica-seconds at no more misses.
pub const BAR: f64 = 0.7;

/// The knob settings of a sleep cell, workload by workload (cold start, slots, target).
pub fn cells(workloads: usize) -> Vec<Cell> {
    grid::cells(workloads)
        .into_iter()
        .filter(|c| COLD_STARTS_S.contains(&c.cold_start_s))
        .collect()
}

/// `n` cells spanning every workload and knob setting, as `grid::sample` does (5 and 12 are
/// coprime, so each run of 12 covers every setting).
pub fn sample(workloads: usize, n: usize) -> Vec<Cell> {
    grid::sample_of(&cells(1), workloads, n)
}

/// The grid's configuration with vLLM's sleep mode (level 1).
pub fn config(target_ms: u64) -> Config {
    let text = format!(
        "[[model]]\nname = \"llm\"\n\
         command = [\"vllm\", \"serve\", \"/m\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--enable-sleep-mode\"]\n\
         env = {{ VLLM_SERVER_DEV_MODE = \"1\" }}\ngpus = 1\ngpu_memory = \"36GiB\"\n\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n\
         [model.sleep]\nformat = \"vllm\"\nlevel = 1\nhost_memory = \"17GiB\"\ngpu_memory_asleep = \"600MiB\"\n\
         [model.scaling]\nmin = {MIN}\nmax = {MAX}\ntarget_wait = \"{target_ms}ms\"\n"
    );
    Config::parse(&text, std::path::Path::new("grid-sleep.toml"))
        .expect("the sleep grid's configuration is valid")
}

/// One policy with the sleeping tier: its figures, the replica-seconds it slept, the host memory
/// its sleepers held (GiB·s, and at most at once).
#[derive(Debug, Clone, Serialize)]
pub struct Asleep {
    #[serde(flatten)]
    pub figures: Figures,
    pub sleeping_seconds: f64,
    pub host_memory_gib_seconds: f64,
    pub peak_host_memory_gib: f64,
}

/// One wake time's runs in a cell.
#[derive(Debug, Clone, Serialize)]
pub struct AtWake {
    pub wake_s: u64,
    pub hearth: Asleep,
    pub oracle: Asleep,
}

impl AtWake {
    /// hearth with sleep ÷ hearth without, in replica-seconds.
    pub fn ratio(&self, awake: &Figures) -> f64 {
        self.hearth.figures.replica_seconds / awake.replica_seconds.max(1e-9)
    }

    /// Meets the bar: ≤ `BAR`× the replica-seconds at no larger share over target.
    pub fn meets_bar(&self, awake: &Figures) -> bool {
        self.ratio(awake) <= BAR && self.hearth.figures.over_target <= awake.over_target
    }

    /// hearth asleep beats the oracle asleep (as many misses or fewer, fewer replica-seconds):
    /// the oracle would no longer bound it.
    pub fn beats_oracle(&self) -> bool {
        let (h, o) = (&self.hearth.figures, &self.oracle.figures);
        h.over_target <= o.over_target && h.replica_seconds < o.replica_seconds
    }
}

/// What one sleep cell measured.
#[derive(Debug, Clone, Serialize)]
pub struct SleepCellResult {
    pub family: String,
    pub workload: String,
    pub cold_start_s: u64,
    pub slots: u32,
    pub target_ms: u64,
    /// hearth without `[model.sleep]`.
    pub awake: Figures,
    /// `WAKES_S`, in order.
    pub by_wake: Vec<AtWake>,
}

fn setup(
    config: Config,
    w: &super::workload::Workload,
    c: Cell,
    wake: Duration,
    router: Router,
) -> Setup {
    let mut s = Setup::new(
        config,
        "llm",
        c.slots,
        Duration::from_secs(c.cold_start_s),
        grid::PROMOTION,
        grid::WARMUP,
        w,
    )
    .expect("the sleep grid's setup is valid");
    s.params.wake = wake.as_micros() as u64;
    s.params.fall_asleep = FALL_ASLEEP.as_micros() as u64;
    s.params.router = router;
    s
}

fn asleep(s: &Setup, w: &super::workload::Workload, p: Policy) -> Asleep {
    let r = run_policy(s, w, p).report;
    Asleep {
        figures: Figures::from(&r),
        sleeping_seconds: r.sleeping_seconds,
        host_memory_gib_seconds: r.host_memory_gib_seconds,
        peak_host_memory_gib: r.peak_host_memory_gib,
    }
}

/// One cell, every run behind `router` (`--router`: these cells run only hearth and the oracle,
/// which both model the front door too).
pub fn run_cell(gw: &GridWorkload, c: Cell, router: Router) -> SleepCellResult {
    let s = SLOTS
        .iter()
        .position(|&x| x == c.slots)
        .expect("a grid slot count");
    let w = &gw.by_slots[s];
    let plain = setup(grid::config(c.target_ms), w, c, Duration::ZERO, router);
    let awake = Figures::from(&run_policy(&plain, w, Policy::Hearth).report);
    let by_wake = WAKES_S
        .iter()
        .map(|&wake_s| {
            let s = setup(
                config(c.target_ms),
                w,
                c,
                Duration::from_secs(wake_s),
                router,
            );
            AtWake {
                wake_s,
                hearth: asleep(&s, w, Policy::Hearth),
                oracle: asleep(&s, w, Policy::Oracle),
            }
        })
        .collect();
    SleepCellResult {
        family: gw.family.to_string(),
        workload: gw.label.clone(),
        cold_start_s: c.cold_start_s,
        slots: c.slots,
        target_ms: c.target_ms,
        awake,
        by_wake,
    }
}

/// Runs `cells` on `jobs` threads; results in the order of `cells`.
pub fn run(
    ws: &[GridWorkload],
    cells: &[Cell],
    jobs: usize,
    router: Router,
) -> Vec<SleepCellResult> {
    let out: Vec<Mutex<Option<SleepCellResult>>> = cells.iter().map(|_| Mutex::new(None)).collect();
    grid::parallel(cells.len(), jobs, |i| {
        let r = run_cell(&ws[cells[i].workload], cells[i], router);
        *out[i].lock().expect("not poisoned") = Some(r);
    });
    out.into_iter()
        .map(|m| m.into_inner().expect("not poisoned").expect("ran"))
        .collect()
}

/// The summary of one (cold start, wake) pair, or of every cell at one wake.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Group {
    /// None: every cold start.
    pub cold_start_s: Option<u64>,
    pub wake_s: u64,
    pub cells: usize,
    /// Geometric mean of hearth with sleep ÷ hearth without, in replica-seconds.
    pub geomean_ratio: f64,
    /// Cells at ≤ `BAR`× and no more misses.
    pub meet_bar: usize,
    /// Cells where the sleeping tier misses more than without it.
    pub miss_more: usize,
    /// Share over target without and with sleep, over every cell's requests alike.
    pub mean_over_target_awake: f64,
    pub mean_over_target_asleep: f64,
    /// Geometric mean of hearth with sleep ÷ the oracle with sleep, in replica-seconds.
    pub geomean_over_oracle: f64,
    /// Cells where hearth with sleep beats the oracle with sleep (it must bound every policy).
    pub beat_the_oracle: usize,
}

fn geomean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x.max(1e-9).ln(), n + 1));
    if n == 0 {
        return f64::NAN;
    }
    (sum / n as f64).exp()
}

pub fn group(results: &[SleepCellResult], cold_start_s: Option<u64>, wake_s: u64) -> Group {
    let pairs: Vec<(&Figures, &AtWake)> = results
        .iter()
        .filter(|r| cold_start_s.is_none_or(|c| c == r.cold_start_s))
        .filter_map(|r| {
            r.by_wake
                .iter()
                .find(|a| a.wake_s == wake_s)
                .map(|a| (&r.awake, a))
        })
        .collect();
    let n = pairs.len();
    let mean = |f: &dyn Fn(&(&Figures, &AtWake)) -> f64| {
        pairs.iter().map(f).sum::<f64>() / n.max(1) as f64
    };
    Group {
        cold_start_s,
        wake_s,
        cells: n,
        geomean_ratio: geomean(pairs.iter().map(|(f, a)| a.ratio(f))),
        meet_bar: pairs.iter().filter(|(f, a)| a.meets_bar(f)).count(),
        miss_more: pairs
            .iter()
            .filter(|(f, a)| a.hearth.figures.over_target > f.over_target)
            .count(),
        mean_over_target_awake: mean(&|(f, _)| f.over_target),
        mean_over_target_asleep: mean(&|(_, a)| a.hearth.figures.over_target),
        geomean_over_oracle: geomean(pairs.iter().map(|(_, a)| {
            a.hearth.figures.replica_seconds / a.oracle.figures.replica_seconds.max(1e-9)
        })),
        beat_the_oracle: pairs.iter().filter(|(_, a)| a.beats_oracle()).count(),
    }
}

/// Every (cold start, wake) pair, then every wake over all cold starts.
pub fn summarize(results: &[SleepCellResult]) -> Vec<Group> {
    let mut v = Vec::new();
    for wake in WAKES_S {
        for cold in COLD_STARTS_S {
            v.push(group(results, Some(cold), wake));
        }
        v.push(group(results, None, wake));
    }
    v
}

/// The bar's own cells: the conv and code traces at `--speed 1`, 60 s cold start, 1 s wake.
fn bar_cells(results: &[SleepCellResult]) -> impl Iterator<Item = (&SleepCellResult, &AtWake)> {
    results
        .iter()
        .filter(|r| {
            r.cold_start_s == 60
                && (r.workload == "azure-conv --speed 1" || r.workload == "azure-code --speed 1")
        })
        .filter_map(|r| r.by_wake.iter().find(|a| a.wake_s == 1).map(|a| (r, a)))
}

fn pct(x: f64) -> String {
    format!("{:.3} %", x * 100.0)
}

/// Markdown for BENCHMARKS.md: the summary, then the bar's cells.
pub fn markdown(results: &[SleepCellResult], elapsed: Duration, jobs: usize) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{} sleep cells ({} workloads × cold start {:?} s × slots {:?} × target {:?} ms), wake \
         {:?} s, in {:.0} s on {jobs} threads.\n\n",
        results.len(),
        results
            .iter()
            .map(|r| r.workload.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        COLD_STARTS_S,
        SLOTS,
        TARGETS_MS,
        WAKES_S,
        elapsed.as_secs_f64()
    );
    out.push_str(
        "| cold start | wake | cells | sleep ÷ no sleep (geomean) | at ≤ 0.7×, no more misses | \
         miss more | over target, no sleep → sleep | hearth ÷ oracle, both asleep (geomean) | \
         hearth beats the oracle |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for g in summarize(results) {
        let cold = g
            .cold_start_s
            .map_or_else(|| "all".to_string(), |c| format!("{c} s"));
        let _ = writeln!(
            out,
            "| {cold} | {} s | {} | {:.3} | {} | {} | {} → {} | {:.2} | {} |",
            g.wake_s,
            g.cells,
            g.geomean_ratio,
            g.meet_bar,
            g.miss_more,
            pct(g.mean_over_target_awake),
            pct(g.mean_over_target_asleep),
            g.geomean_over_oracle,
            g.beat_the_oracle
        );
    }
    out.push_str(
        "\nThe bar's cells (60 s cold start, 1 s wake):\n\n| workload | slots | target | no sleep: \
         over target, replica-s | sleep: over target, replica-s (asleep s) | ratio | oracle \
         asleep: replica-s |\n|---|---|---|---|---|---|---|\n",
    );
    for (r, a) in bar_cells(results) {
        let h = &a.hearth;
        let _ = writeln!(
            out,
            "| {} | {} | {} ms | {}, {:.0} | {}, {:.0} ({:.0}) | {:.2} | {:.0} |",
            r.workload,
            r.slots,
            r.target_ms,
            pct(r.awake.over_target),
            r.awake.replica_seconds,
            pct(h.figures.over_target),
            h.figures.replica_seconds,
            h.sleeping_seconds,
            a.ratio(&r.awake),
            a.oracle.figures.replica_seconds
        );
    }
    out
}

/// `--grid --sleep-cells --json`.
#[derive(Serialize)]
pub struct Document<'a> {
    pub cells: &'a [SleepCellResult],
    pub summary: Vec<Group>,
    pub seconds: f64,
    pub jobs: usize,
    /// `committed` or `front-door` (`--router`).
    pub router: &'static str,
}

/// Runs the sleep cells (all, or `sample` of them) and prints them.
pub fn main(ws: &[GridWorkload], sample_n: Option<usize>, jobs: usize, json: bool, router: Router) {
    let started = Instant::now();
    let cells = match sample_n {
        Some(n) => sample(ws.len(), n),
        None => cells(ws.len()),
    };
    let results = run(ws, &cells, jobs, router);
    let elapsed = started.elapsed();
    if json {
        let doc = Document {
            cells: &results,
            summary: summarize(&results),
            seconds: (elapsed.as_secs_f64() * 10.0).round() / 10.0,
            jobs,
            router: router.name(),
        };
        println!("{}", serde_json::to_string(&doc).expect("serialises"));
    } else {
        println!("Router: {}.\n", router.name());
        print!("{}", markdown(&results, elapsed, jobs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sleep_cells_are_the_grid_at_the_long_cold_starts() {
        let all = cells(37);
        assert_eq!(all.len(), 37 * 12);
        grid::assert_sample_spans(&sample(37, 24), 24, 37, &cells(1), &all);
    }

    /// A cell on a bursty synthetic workload: the sleeping tier is used, the oracle asleep is
    /// not beaten, and the summary counts what the cell shows.
    #[test]
    fn a_sleep_cell_runs_both_tiers_and_the_oracle_bounds_hearth_asleep() {
        let specs: Vec<grid::Spec> = vec![(
            "burst",
            "burst seed 1".into(),
            Box::new(|rate| {
                let mut w =
                    super::super::workload::synthetic_workload("burst", 1, &grid::SM, 1.0, rate)
                        .expect("a built-in scenario");
                w.truncate(3600 * super::super::SEC);
                Ok(w)
            }),
        )];
        let ws = grid::build(specs, 2).expect("built");
        let c = Cell {
            workload: 0,
            cold_start_s: 60,
            slots: 8,
            target_ms: 2000,
        };
        let r = run_cell(&ws[0], c, Router::Committed);
        assert_eq!(r.by_wake.len(), WAKES_S.len());
        for a in &r.by_wake {
            assert!(a.hearth.sleeping_seconds > 0.0, "{a:?}");
            assert!(a.oracle.sleeping_seconds > 0.0, "{a:?}");
            assert!(!a.beats_oracle(), "{a:?}");
        }
        let g = group(std::slice::from_ref(&r), None, 1);
        assert_eq!(g.cells, 1);
        let a = &r.by_wake[0];
        assert_eq!(g.meet_bar, usize::from(a.meets_bar(&r.awake)));
        assert!((g.geomean_ratio - a.ratio(&r.awake)).abs() < 1e-9);
    }
}
