//! Report → routed: how long from a queue report over target to the `routed` event that shows
//! the promoted warm replica, on a watch connection (goal: p99 ≤ 5 ms).
//!
//! The daemon (release build) runs 20 toy-server models, each min 1, warm_pool 1, max 2. Each
//! trial picks the next model that is ready (1 routed + 1 warm, nothing starting, and more than
//! the core's 2 s up-step settle time since its last trial), writes a model-wide report over
//! target on a report connection (this program's uid is root or the daemon's: the admin role),
//! and times from just before the write to the arrival of that model's `routed` event with 2
//! endpoints on a separate watch connection (stamped by the watch's reader thread). The 40 toy
//! replicas report every 200 ms meanwhile (≈ 200 reports/s of background), as real ones would.
//!
//! Between its trials a model is reset, while the other models take their turn, in one of two
//! ways (`--reset`):
//! - `calm` (default): a calm model-wide report; the policy scales the model back down after its
//!   `down_stabilization` (1 s here) and the unrouted replica returns to the short warm pool. No
//!   process starts or stops.
//! - `scale`: `scale max 1` (the promoted replica drains and stops) then `scale max 2` (a cold
//!   replica starts to refill the pool): a process starts and one stops for every trial, and
//!   trials run alongside other models' replica starts.
//!
//! Trials are split by whether a replica of any model started (a `starting` event) within 30 ms
//! before the report; and a probe thread sleeps 1 ms at a time and records how late it wakes:
//! the machine's own scheduling delay at the time, which any tail includes.
//!
//! Run: `cargo bench --bench report_to_routed` (`-- --trials N --reset calm|scale`). Without
//! `--bench` (as `cargo test --all-targets` runs it) it is a smoke run: 3 models, 6 trials.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::*;

const GOAL_P99_MS: f64 = 5.0;
/// The core's minimum time between two up-steps of one model, plus a margin.
const SETTLE: Duration = Duration::from_millis(2100);
/// A replica start this close before a trial counts as overlapping it.
const OVERLAP: Duration = Duration::from_millis(30);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn stats(label: &str, v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return format!("{label}: none");
    }
    format!(
        "{label} ({} trials): p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        v.len(),
        percentile(&v, 50.0),
        percentile(&v, 90.0),
        percentile(&v, 99.0),
        v.last().unwrap()
    )
}

fn main() {
    let full = bench_full();
    let (models, trials) = if full {
        (20, bench_arg("--trials").unwrap_or(200))
    } else {
        (3, 6)
    };
    let reset = bench_arg::<String>("--reset").unwrap_or_else(|| "calm".into());
    assert!(
        reset == "calm" || reset == "scale",
        "--reset calm or --reset scale"
    );
    let names: Vec<String> = (0..models).map(|i| format!("m{i:02}")).collect();
    let specs = names.iter().map(|n| {
        let mut s = Model::toy(n, &["--service-time", "10ms"])
            .scale(1, 2, 1)
            .stop_grace("1s");
        s.scaling.down_stabilization = Some("1s".into());
        s.scaling.down_step = Some("1s".into());
        s
    });
    println!(
        "report_to_routed: {models} models (min 1, warm_pool 1, max 2, toy replicas), {trials} \
         trials, reset by {reset}; binary {}",
        hearth().display()
    );
    println!("machine at start: {}", machine_load());
    let d = Daemon::builder()
        .ports((models * 3 + 8) as u16)
        .models(specs)
        .start();
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
    // (model, sent, report → routed ms, report → answer ms)
    let mut samples: Vec<(String, Instant, f64, f64)> = Vec::new();
    let probe_stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = probe_stop.clone();
        std::thread::spawn(move || {
            let mut late = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                // The probe itself: how late does a 1 ms sleep end?
                std::thread::sleep(Duration::from_millis(1));
                late.push(ms(t.elapsed()) - 1.0);
            }
            late
        })
    };
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
        samples.push((
            name.clone(),
            sent,
            ms(ev.at.duration_since(sent)),
            ms(acked),
        ));
        if reset == "calm" {
            // The queue is gone: the policy scales back down after down_stabilization and the
            // replica returns to the pool.
            let calm = json!({"op": "report", "model": name, "oldest_wait_ms": 0,
                              "queue_depth": 0, "in_flight": 0});
            let a = reports.call(&calm).expect("calm report");
            assert_eq!(a["ok"], true, "{a}");
        } else {
            // The promoted replica drains away, a cold one refills the pool.
            for max in [1, 2] {
                let a = control
                    .call(&json!({"op": "scale", "model": name, "max": max}))
                    .expect("scale");
                assert_eq!(a["ok"], true, "{a}");
            }
        }
    }
    let took = started.elapsed();
    probe_stop.store(true, Ordering::Relaxed);
    let mut late = probe.join().unwrap();
    late.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let starts: Vec<Instant> = w
        .events()
        .into_iter()
        .filter(|e| e.v["event"] == "replica" && e.v["state"] == "starting")
        .map(|e| e.at)
        .collect();
    let overlaps = |sent: Instant| {
        starts
            .iter()
            .any(|&s| s <= sent && sent.duration_since(s) <= OVERLAP)
    };
    let lat: Vec<f64> = samples.iter().map(|s| s.2).collect();
    let ack: Vec<f64> = samples.iter().map(|s| s.3).collect();
    let (with, without): (Vec<_>, Vec<_>) = samples.iter().partition(|s| overlaps(s.1));
    let mut sorted = lat.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p99 = percentile(&sorted, 99.0);
    println!(
        "{} trials in {:.1} s ({} replica starts in that time); machine at end: {}",
        samples.len(),
        took.as_secs_f64(),
        starts.iter().filter(|&&s| s >= started).count(),
        machine_load()
    );
    println!(
        "{}, mean {:.3} ms (goal p99 ≤ {GOAL_P99_MS} ms: {})",
        stats("report → routed event", &lat),
        lat.iter().sum::<f64>() / lat.len() as f64,
        if p99 <= GOAL_P99_MS { "met" } else { "NOT met" }
    );
    println!("{}", stats("report → its answer", &ack));
    println!(
        "{}",
        stats(
            "  report → routed, no replica start in the 30 ms before",
            &without.iter().map(|s| s.2).collect::<Vec<_>>()
        )
    );
    println!(
        "{}",
        stats(
            "  report → routed, a replica started in the 30 ms before",
            &with.iter().map(|s| s.2).collect::<Vec<_>>()
        )
    );
    println!(
        "machine: a 1 ms sleep in this process ended late by p50 {:.3} ms, p99 {:.3} ms, max \
         {:.3} ms ({} probes during the trials)",
        percentile(&late, 50.0),
        percentile(&late, 99.0),
        late.last().unwrap(),
        late.len()
    );
    let mut slow = samples.clone();
    slow.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap());
    let slowest: Vec<String> = slow
        .iter()
        .take(5)
        .map(|(m, _, l, _)| format!("{m} {l:.2} ms"))
        .collect();
    println!("slowest trials: {}", slowest.join(", "));
    drop(w);
    drop(d);
}
