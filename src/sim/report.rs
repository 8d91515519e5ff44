//! Figures per policy, the `--json` document and the text table.

use serde::Serialize;

use super::cluster::ReqState;
use super::engine::{Outcome, Params};
use super::workload::Workload;
use super::{Us, SEC};

/// One policy's figures, in `--json`'s field order.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicyReport {
    pub policy: String,
    pub requests: u64,
    /// Share of requests whose queue wait exceeded `target_wait` (0.0123 = 1.23 %).
    pub over_target: f64,
    pub p50_wait_ms: f64,
    pub p99_wait_ms: f64,
    pub max_wait_ms: f64,
    pub replica_seconds: f64,
    pub efficiency: f64,
    pub scale_actions: u64,
    pub cold_starts: u64,
    pub killed: u64,
    /// Replica-seconds spent asleep (sleeping tier; charged at `asleep_charge` within
    /// `replica_seconds`), and the host memory they held (GiB·s). Absent without a sleep tier.
    #[serde(skip_serializing_if = "is_zero")]
    pub sleeping_seconds: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub host_memory_gib_seconds: f64,
    /// The most host memory its sleepers held at one instant (GiB): the most replicas asleep at
    /// once × the model's `[model.sleep] host_memory`, what a host-memory budget bounds. Absent
    /// without a sleep tier, like the two above.
    #[serde(skip_serializing_if = "is_zero")]
    pub peak_host_memory_gib: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// The `--json` document.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub scenario: String,
    pub requests: u64,
    pub lower_bound_replica_seconds: f64,
    pub policies: Vec<PolicyReport>,
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// Requests measured: those that arrive at or after the warm-up instant.
pub fn measured(w: &Workload, warmup: Us) -> impl Iterator<Item = &super::workload::Request> {
    w.requests.iter().filter(move |r| r.t >= warmup)
}

/// The work-conserving lower bound: the slot-time the measured requests need, ÷ concurrency,
/// in replica-seconds. No policy can hold fewer replicas for the same work.
pub fn lower_bound(w: &Workload, p: &Params) -> f64 {
    let slot_us: u64 = measured(w, p.warmup).map(|r| r.service).sum();
    slot_us as f64 / SEC as f64 / p.concurrency as f64
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[Us], q: f64) -> Us {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

pub fn policy_report(
    name: &str,
    o: &Outcome,
    w: &Workload,
    p: &Params,
    lower_bound: f64,
) -> PolicyReport {
    let mut waits: Vec<Us> = Vec::new();
    let mut killed = 0u64;
    for q in o.cl.reqs.iter().filter(|q| q.arrival >= p.warmup) {
        // A request killed before it started waited until it was killed — and was not served.
        let wait = match (q.start, q.killed) {
            (Some(s), _) => s - q.arrival,
            (None, Some(k)) => (k - q.arrival).max(p.target_wait + 1),
            (None, None) => o.end.saturating_sub(q.arrival),
        };
        if q.state == ReqState::Killed {
            killed += 1;
        }
        waits.push(wait);
    }
    waits.sort_unstable();
    let n = waits.len() as u64;
    let over = waits.iter().filter(|&&x| x > p.target_wait).count() as f64;
    // From the warm-up instant to the end of the run: the horizon, or later if work queued
    // before it was still being served then.
    let (from, to) = (p.warmup, o.end.max(w.horizon).max(p.warmup));
    let replica_us: u64 =
        o.cl.replicas
            .iter()
            .map(|x| {
                let a = x.spawned.max(from);
                let b = x.exited.unwrap_or(o.end).min(to);
                b.saturating_sub(a)
            })
            .sum();
    let asleep_us = o.cl.asleep_within(from, to);
    // A sleeping replica holds a share of its GPU; falling asleep and waking count in full.
    let asleep_s = asleep_us as f64 / SEC as f64;
    let replica_seconds =
        replica_us as f64 / SEC as f64 - asleep_s * (1.0 - o.cl.asleep_charge.clamp(0.0, 1.0));
    let gib = o.cl.asleep_host_memory as f64 / (1u64 << 30) as f64;
    let host_gib_s = asleep_s * gib;
    let peak_gib = f64::from(o.cl.peak_asleep(from, to)) * gib;
    let ms = |us: Us| round(us as f64 / 1000.0, 1);
    PolicyReport {
        policy: name.to_string(),
        requests: n,
        over_target: if n == 0 {
            0.0
        } else {
            round(over / n as f64, 6)
        },
        p50_wait_ms: ms(percentile(&waits, 0.50)),
        p99_wait_ms: ms(percentile(&waits, 0.99)),
        max_wait_ms: ms(waits.last().copied().unwrap_or(0)),
        replica_seconds: round(replica_seconds, 1),
        efficiency: if replica_seconds > 0.0 {
            round(lower_bound / replica_seconds, 4)
        } else {
            0.0
        },
        scale_actions: o.scale_actions,
        cold_starts: o.cold_starts,
        killed,
        sleeping_seconds: round(asleep_s, 1),
        host_memory_gib_seconds: round(host_gib_s, 1),
        peak_host_memory_gib: round(peak_gib, 1),
    }
}

/// hearth's replica-seconds over the oracle's, when both ran.
pub fn hearth_over_oracle(r: &Report) -> Option<f64> {
    let get = |name: &str| r.policies.iter().find(|p| p.policy == name);
    let (h, o) = (get("hearth")?, get("oracle")?);
    (o.replica_seconds > 0.0).then(|| h.replica_seconds / o.replica_seconds)
}

/// The line under the table that puts hearth against the clairvoyant oracle.
pub fn oracle_line(r: &Report) -> Option<String> {
    let ratio = hearth_over_oracle(r)?;
    Some(format!(
        "hearth's replica-seconds are {ratio:.2}× the oracle's (clairvoyant: knows every \
         arrival; fewest misses within max, then fewest replica-seconds)"
    ))
}

/// The sleep lines after a blank line, each as `{before}{line}{after}`; nothing where no policy
/// slept.
pub fn print_sleep_lines(r: &Report, before: &str, after: &str) {
    let lines = sleep_lines(r);
    if !lines.is_empty() {
        println!();
        for line in lines {
            println!("{before}{line}{after}");
        }
    }
}

/// Under the table, where a policy slept: what its sleepers held in host memory, all run long and
/// at their peak (the table's columns stay those of every run).
pub fn sleep_lines(r: &Report) -> Vec<String> {
    r.policies
        .iter()
        .filter(|p| p.sleeping_seconds > 0.0)
        .map(|p| {
            format!(
                "{} slept {:.0} replica-s; its sleepers held {:.0} GiB·s of host memory, at most \
                 {:.1} GiB at once",
                p.policy, p.sleeping_seconds, p.host_memory_gib_seconds, p.peak_host_memory_gib
            )
        })
        .collect()
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100_000.0 {
        format!("{:.0} s", ms / 1000.0)
    } else if ms >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// The text table: the same figures as `--json`.
pub fn table(r: &Report) -> String {
    let mut out = format!(
        "{:<14} {:>8} {:>11} {:>10} {:>10} {:>10} {:>11} {:>10} {:>7} {:>6} {:>7}\n",
        "POLICY",
        "REQUESTS",
        "OVER TARGET",
        "P50 WAIT",
        "P99 WAIT",
        "MAX WAIT",
        "REPLICA-S",
        "EFFICIENCY",
        "SCALES",
        "COLD",
        "KILLED"
    );
    for p in &r.policies {
        out.push_str(&format!(
            "{:<14} {:>8} {:>10.2}% {:>10} {:>10} {:>10} {:>11.0} {:>9.1}% {:>7} {:>6} {:>7}\n",
            p.policy,
            p.requests,
            p.over_target * 100.0,
            fmt_ms(p.p50_wait_ms),
            fmt_ms(p.p99_wait_ms),
            fmt_ms(p.max_wait_ms),
            p.replica_seconds,
            p.efficiency * 100.0,
            p.scale_actions,
            p.cold_starts,
            p.killed
        ));
    }
    out
}

/// The same table as Markdown (for BENCHMARKS.md).
pub fn markdown(r: &Report) -> String {
    let mut out = String::from(
        "| policy | requests | over target | p50 wait | p99 wait | max wait | replica-s | \
         efficiency | scale actions | cold starts | killed |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for p in &r.policies {
        out.push_str(&format!(
            "| {} | {} | {:.2} % | {} | {} | {} | {:.0} | {:.1} % | {} | {} | {} |\n",
            p.policy,
            p.requests,
            p.over_target * 100.0,
            fmt_ms(p.p50_wait_ms),
            fmt_ms(p.p99_wait_ms),
            fmt_ms(p.max_wait_ms),
            p.replica_seconds,
            p.efficiency * 100.0,
            p.scale_actions,
            p.cold_starts,
            p.killed
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Us> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
