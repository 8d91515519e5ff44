//! Report → routed: how long from a queue report over target to the `routed` event that shows
//! the promoted warm replica, on a watch connection (goal: p99 ≤ 5 ms).
//!
//! The daemon (release build) runs 20 toy-server models, each min 1, warm_pool 1, max 2. Each
//! trial picks the next model that is ready (1 routed + 1 warm, nothing starting, and more than
//! the core's 2 s up-step settle time since its last trial), writes a model-wide report over
//! target on a report connection (this program's uid is root or the daemon's: the admin role),
//! and times from just before the write to the arrival of that model's `routed` event with 2
//! endpoints on a separate watch connection (stamped by the watch's reader thread). The model is
//! then reset with `scale max 1` (the promoted replica drains away) and `scale max 2` (the pool
//! refills with a cold start) while other models take their turn. The 40 toy replicas report
//! every 200 ms meanwhile (≈ 200 reports/s of background), as real ones would.
//!
//! Run: `cargo bench --bench report_to_routed` (`-- --trials N`). Without `--bench` (as
//! `cargo test --all-targets` runs it) it is a smoke run: 3 models, 6 trials.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const GOAL_P99_MS: f64 = 5.0;
/// The core's minimum time between two up-steps of one model, plus a margin.
const SETTLE: Duration = Duration::from_millis(2100);

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (models, trials) = if full {
        (20, arg("--trials").unwrap_or(200))
    } else {
        (3, 6)
    };
    let names: Vec<String> = (0..models).map(|i| format!("m{i:02}")).collect();
    let specs: Vec<ModelSpec> = names
        .iter()
        .map(|n| {
            let mut s = ModelSpec::toy(n, &["--service-time", "10ms"]).scale(1, 2, 1);
            s.stop_grace = "1s";
            s
        })
        .collect();
    println!(
        "report_to_routed: {models} models (min 1, warm_pool 1, max 2, toy replicas), {trials} \
         trials; binary {HEARTH}"
    );
    println!("machine at start: {}", machine_load());
    let d = Daemon::start_with(
        DaemonOpts {
            ports: (models * 3 + 8) as u16,
            ..Default::default()
        },
        &specs,
    );
    let ready = |m: &serde_json::Value| {
        m["routed"] == 1 && m["warm"] == 1 && m["starting"] == 0 && m["pending"] == 0
    };
    wait_until(
        "every model at 1 routed + 1 warm",
        Duration::from_secs(120),
        || {
            let s = d.status();
            s["models"]
                .as_array()
                .unwrap()
                .iter()
                .all(ready)
                .then_some(())
        },
    );
    let w = d.watch(None);
    let mut reports = Conn::connect(&d.socket).expect("report connection");
    let mut control = Conn::connect(&d.socket).expect("control connection");
    let mut last: Vec<Option<Instant>> = vec![None; models];
    let mut next = 0usize;
    let mut samples: Vec<(String, f64, f64)> = Vec::new();
    let started = Instant::now();
    let mut depth = 10u64;
    while samples.len() < trials {
        // The next model (round-robin) that is ready for a trial.
        let i = wait_until("a model ready for a trial", Duration::from_secs(60), || {
            (0..models).map(|k| (next + k) % models).find(|&k| {
                last[k].is_none_or(|t| t.elapsed() >= SETTLE) && {
                    let a = control
                        .call(&json!({"op": "status", "model": names[k]}))
                        .expect("status");
                    ready(&a["status"]["models"][0])
                }
            })
        });
        next = i + 1;
        let name = &names[i];
        depth += 1;
        let line = format!(
            "{}\n",
            json!({"op": "report", "model": name, "oldest_wait_ms": 10_000,
                   "queue_depth": depth, "in_flight": depth + 1})
        );
        let mark = w.len();
        let sent = Instant::now();
        reports.send_raw(line.as_bytes()).expect("write report");
        let ack = reports.read().expect("report answer");
        let acked = sent.elapsed();
        assert_eq!(ack["ok"], true, "{ack}");
        let (_, ev) = w
            .wait_for(mark, Duration::from_secs(10), |v| {
                v["event"] == "routed" && v["model"] == name.as_str() && endpoint_ids(v).len() == 2
            })
            .unwrap_or_else(|| panic!("no routed event with 2 endpoints for {name}"));
        last[i] = Some(Instant::now());
        samples.push((name.clone(), ms(ev.at.duration_since(sent)), ms(acked)));
        // Reset: the promoted replica drains away, a cold one refills the pool.
        for max in [1, 2] {
            let a = control
                .call(&json!({"op": "scale", "model": name, "max": max}))
                .expect("scale");
            assert_eq!(a["ok"], true, "{a}");
        }
    }
    let took = started.elapsed();
    let mut lat: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let mut ack: Vec<f64> = samples.iter().map(|s| s.2).collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    ack.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = lat.iter().sum::<f64>() / lat.len() as f64;
    println!(
        "{} trials in {:.1} s; machine at end: {}",
        samples.len(),
        took.as_secs_f64(),
        machine_load()
    );
    println!(
        "report → routed event: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms, \
         mean {mean:.3} ms (goal p99 ≤ {GOAL_P99_MS} ms: {})",
        percentile(&lat, 50.0),
        percentile(&lat, 90.0),
        percentile(&lat, 99.0),
        lat.last().unwrap(),
        if percentile(&lat, 99.0) <= GOAL_P99_MS {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "report → its answer (same trials):  p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        percentile(&ack, 50.0),
        percentile(&ack, 99.0),
        ack.last().unwrap()
    );
    let slowest: Vec<String> = {
        let mut s = samples.clone();
        s.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        s.iter()
            .take(5)
            .map(|(m, l, _)| format!("{m} {l:.2} ms"))
            .collect()
    };
    println!("slowest trials: {}", slowest.join(", "));
    drop(w);
    drop(d);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
