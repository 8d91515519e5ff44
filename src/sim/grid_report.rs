//! How the grid's results are printed: the table of cells, the summary's text, Markdown for
//! BENCHMARKS.md, and the `--json` document (the verdicts themselves: grid_verdict.rs).

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::grid::{CellResult, Figures, MAX, MIN, POLICIES};
use super::grid_verdict::{
    label, over_equal_service, over_oracle, verdict, Stats, Summary, Verdict,
};

/// `--grid --json`.
#[derive(Serialize)]
pub struct Document<'a> {
    pub cells: &'a [CellResult],
    pub summary: &'a Summary,
    /// Wall-clock seconds the grid took, and on how many threads.
    pub seconds: f64,
    pub jobs: usize,
}

/// "not beaten", naming the baselines that beat hearth by the strict rules only.
fn not_beaten(v: &Verdict) -> String {
    if v.strictly_beaten_by.is_empty() {
        "not beaten".into()
    } else {
        format!(
            "not beaten (strictly by {})",
            v.strictly_beaten_by.join(",")
        )
    }
}

fn fig(f: &Figures) -> String {
    format!("{:6.2}% {:>7.0}", f.over_target * 100.0, f.replica_seconds)
}

/// One line per cell: each policy's share over target and replica-seconds, hearth over the
/// oracle, the verdict.
pub fn table(results: &[CellResult]) -> String {
    let mut out = format!(
        "{:<26} {:>5} {:>5} {:>6}",
        "WORKLOAD", "COLD", "SLOTS", "TARGET"
    );
    let complete = results
        .first()
        .is_none_or(|c| c.policies.len() == POLICIES.len());
    let names: Vec<&str> = results.first().map_or_else(
        || POLICIES.iter().map(|p| p.name()).collect(),
        |c| c.policies.iter().map(|f| f.policy.as_str()).collect(),
    );
    for p in names {
        let _ = write!(out, " {:>15}", p.to_uppercase());
    }
    out.push_str(if complete {
        "  HEARTH/ORACLE  VERDICT\n"
    } else {
        "\n"
    });
    for c in results {
        let _ = write!(
            out,
            "{:<26} {:>4}s {:>5} {:>5}s",
            c.workload,
            c.cold_start_s,
            c.slots,
            c.target_ms as f64 / 1000.0
        );
        for f in &c.policies {
            let _ = write!(out, " {}", fig(f));
        }
        if !complete {
            out.push('\n');
            continue;
        }
        let v = verdict(c);
        let verdict = if v.beaten() {
            let mut s = format!("beaten by {}", v.beaten_by.join(","));
            if v.over_ceiling {
                s.push_str(" (over KPA's ceiling)");
            }
            s
        } else {
            not_beaten(&v)
        };
        let _ = writeln!(out, "  {:>13.2}  {verdict}", over_oracle(c, "hearth"));
    }
    out
}

fn stats_line(s: &Stats) -> String {
    if s.n == 0 {
        return "no cells".into();
    }
    format!(
        "median {:.2}, geometric mean {:.2}, worst {:.2} ({}) over {} cells",
        s.median, s.geomean, s.worst, s.worst_cell, s.n
    )
}

pub fn summary_text(s: &Summary, elapsed: Duration, jobs: usize, traces: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} cells{} in {:.0} s on {jobs} threads (min {MIN}, max {MAX}; --rate-mult slots/8)",
        s.cells,
        if traces { "" } else { " (synthetic only)" },
        elapsed.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "hearth materially beaten in {} cells ({} over KPA's ceiling; by the strict rules in {}); \
         hearth killed requests in {} cells; the oracle beaten in {} cells",
        s.beaten, s.over_ceiling, s.beaten_strict, s.hearth_killed_cells, s.oracle_beaten
    );
    for c in s.beaten_cells.iter().take(20) {
        let _ = writeln!(o, "  beaten: {c}");
    }
    for c in s.oracle_beaten_cells.iter().take(20) {
        let _ = writeln!(o, "  oracle beaten: {c}");
    }
    let _ = writeln!(
        o,
        "hearth ÷ oracle (replica-s): {}",
        stats_line(&s.hearth_over_oracle)
    );
    let _ = writeln!(
        o,
        "hearth ÷ cheapest baseline missing no more: {} ({} cells have none)",
        stats_line(&s.hearth_over_cheapest_no_worse),
        s.cells_without_baseline_no_worse
    );
    let _ = writeln!(
        o,
        "baselines costing the same (±10 %): {} pairs; hearth misses more in {}; hearth's \
         misses − the baseline's, points: {}",
        s.same_cost_pairs,
        s.same_cost_hearth_misses_more,
        {
            let d = &s.same_cost_miss_difference_points;
            if d.n == 0 {
                "none".to_string()
            } else {
                format!(
                    "median {:+.2}, mean {:+.2}, worst {:+.2} ({})",
                    d.median, d.mean, d.worst, d.worst_cell
                )
            }
        }
    );
    let _ = writeln!(
        o,
        "goal, hearth ÷ cheapest at equal service (≤ hearth's misses + 0.1 point; baselines and \
         KPA tuned in hindsight): {}; {} cells > 1.10; {} cells with no comparator (goal: \
         geometric mean ≤ 0.85, none > 1.10)",
        stats_line(&s.goal_equal_service),
        s.goal_equal_service_over_1_10,
        s.goal_equal_service_undefined
    );
    let _ = writeln!(
        o,
        "goal, hearth ÷ oracle where hearth misses no more than KPA: {}; flash crowds: {}; \
         hearth misses more than KPA in {} cells (goal: geometric mean ≤ 1.30, each ≤ 1.5, \
         flash ≤ 1.8)",
        stats_line(&s.goal_oracle_at_kpa_service),
        stats_line(&s.goal_oracle_flash),
        s.cells_hearth_misses_more_than_kpa
    );
    let _ = writeln!(
        o,
        "for scale: the oracle ÷ cheapest at equal service {}; default KPA ÷ cheapest at equal \
         service {}; KPA ÷ oracle {}",
        stats_line(&s.oracle_equal_service),
        stats_line(&s.kpa_equal_service),
        stats_line(&s.kpa_over_oracle)
    );
    o
}

/// The summary and the worst cells, as Markdown for BENCHMARKS.md.
pub fn markdown(
    results: &[CellResult],
    s: &Summary,
    elapsed: Duration,
    jobs: usize,
    traces: bool,
) -> String {
    let mut o = String::new();
    for line in summary_text(s, elapsed, jobs, traces).lines() {
        let line = line.trim_start();
        let _ = writeln!(o, "- {line}");
    }
    let mut worst: Vec<&CellResult> = results.iter().collect();
    worst.sort_by(|a, b| over_oracle(b, "hearth").total_cmp(&over_oracle(a, "hearth")));
    let head = |o: &mut String, title: &str| {
        let _ = writeln!(o, "\n{title}\n");
        let _ = write!(o, "| cell |");
        for p in POLICIES {
            let _ = write!(o, " {} |", p.name());
        }
        let _ = writeln!(o, " hearth ÷ oracle | verdict |");
        let _ = writeln!(o, "|{}", " --- |".repeat(POLICIES.len() + 3));
    };
    let row = |o: &mut String, c: &CellResult| {
        let _ = write!(o, "| {} |", label(c));
        for f in &c.policies {
            let _ = write!(
                o,
                " {:.2} % / {:.0} |",
                f.over_target * 100.0,
                f.replica_seconds
            );
        }
        let v = verdict(c);
        let verdict = if v.beaten() {
            format!(
                "beaten by {}{}",
                v.beaten_by.join(", "),
                if v.over_ceiling { " (ceiling)" } else { "" }
            )
        } else {
            not_beaten(&v)
        };
        let _ = writeln!(o, " {:.2} | {verdict} |", over_oracle(c, "hearth"));
    };
    let beaten: Vec<&CellResult> = results.iter().filter(|c| verdict(c).beaten()).collect();
    if !beaten.is_empty() {
        head(
            &mut o,
            "Cells where hearth is beaten (share over target / replica-seconds):",
        );
        for c in beaten.iter().take(40) {
            row(&mut o, c);
        }
    }
    head(
        &mut o,
        "The ten cells where hearth costs most over the oracle (share over target / \
         replica-seconds):",
    );
    for c in worst.iter().take(10) {
        row(&mut o, c);
    }
    let mut g: Vec<(&CellResult, f64)> = results
        .iter()
        .filter_map(|c| over_equal_service(c, "hearth").map(|r| (c, r)))
        .collect();
    g.sort_by(|a, b| b.1.total_cmp(&a.1));
    head(
        &mut o,
        "The ten cells where hearth costs most over the cheapest policy at equal service:",
    );
    for (c, _) in g.iter().take(10) {
        row(&mut o, c);
    }
    o
}
