//! Idle footprint: the daemon's CPU and memory with nothing to do but keep watch (goal: ≤ 0.5 %
//! of one core, ≤ 20 MiB resident).
//!
//! The daemon (release build) runs 3 toy-server models with 8 replicas in all (2 routed + 1 warm,
//! 2 routed + 1 warm, 1 routed + 1 warm), set up like `config.toml.example`: tick 250 ms,
//! warm-up recheck every minute, liveness every 5 s. Every toy reports its (empty) queue every
//! 200 ms: 40 reports/s. Once all are routed or warm, and after a 2 s settle, it samples for 60 s
//! once a second: the daemon's utime + stime (/proc/PID/stat) and VmRSS (/proc/PID/status), and
//! the toys' CPU time, reported separately.
//!
//! Run: `cargo bench --bench idle_footprint` (`-- --seconds N`). Without `--bench` it is a smoke
//! run of 5 s.

use std::time::{Duration, Instant};

use testkit::procs::alive;
use testkit::*;

const GOAL_CPU_PCT: f64 = 0.5;
const GOAL_RSS_MIB: f64 = 20.0;

fn main() {
    let full = bench_full();
    let secs = bench_arg::<f64>("--seconds").unwrap_or(if full { 60.0 } else { 5.0 }) as u64;
    let model = |name: &str, min: u32| {
        Model::toy(name, &["--concurrency", "4", "--service-time", "200ms"])
            .scale(min, min + 2, 1)
            .liveness("5s", "2s", 3)
    };
    let specs = [model("a", 2), model("b", 2), model("c", 1)];
    println!(
        "idle_footprint: 3 models, 8 toy replicas (2+1, 2+1, 1+1 routed+warm), tick 250 ms, \
         liveness 5 s, recheck 1 m; {secs} s sampled once a second; binary {}",
        hearth().display()
    );
    let d = Daemon::builder().ports(12).models(specs).start();
    let pids = wait_until("8 replicas routed or warm", Duration::from_secs(60), || {
        let s = d.status();
        let ms = s["models"].as_array().unwrap();
        let steady = ms
            .iter()
            .all(|m| m["starting"] == 0 && m["pending"] == 0 && m["draining"] == 0);
        let reps: Vec<i32> = ms
            .iter()
            .flat_map(|m| m["replicas"].as_array().unwrap().clone())
            .filter(|r| r["state"] == "routed" || r["state"] == "warm")
            .filter_map(|r| r["pid"].as_i64().map(|p| p as i32))
            .collect();
        (steady && reps.len() == 8).then_some(reps)
    });
    // Settle (part of the protocol, not a wait for a condition): the warm-ups just done.
    std::thread::sleep(Duration::from_secs(2));
    println!("machine at start: {}", machine_load());
    let toy_ticks = |pids: &[i32]| -> u64 { pids.iter().filter_map(|&p| cpu_ticks(p)).sum() };
    let hz = clk_tck();
    let t0 = Instant::now();
    let (d0, toys0) = (cpu_ticks(d.pid()).unwrap(), toy_ticks(&pids));
    let mut rss: Vec<u64> = vec![rss_kib(d.pid()).unwrap()];
    let mut per_10s: Vec<f64> = Vec::new();
    let (mut last_t, mut last_d) = (t0, d0);
    for i in 1..=secs {
        // Sampling cadence (not a wait for a condition).
        let due = t0 + Duration::from_secs(i);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        rss.push(rss_kib(d.pid()).unwrap());
        if i % 10 == 0 {
            let now = cpu_ticks(d.pid()).unwrap();
            per_10s.push(100.0 * (now - last_d) as f64 / hz / last_t.elapsed().as_secs_f64());
            (last_t, last_d) = (Instant::now(), now);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let (d1, toys1) = (cpu_ticks(d.pid()).unwrap(), toy_ticks(&pids));
    let alive = pids.iter().filter(|&&p| alive(p)).count();
    let daemon_pct = 100.0 * (d1 - d0) as f64 / hz / elapsed;
    let toys_pct = 100.0 * (toys1 - toys0) as f64 / hz / elapsed;
    let rss_max = *rss.iter().max().unwrap() as f64 / 1024.0;
    println!("machine at end: {}", machine_load());
    println!(
        "daemon CPU: {:.2} s in {elapsed:.1} s = {daemon_pct:.3} % of one core (goal ≤ \
         {GOAL_CPU_PCT} %: {}); per 10 s: {}",
        (d1 - d0) as f64 / hz,
        if daemon_pct <= GOAL_CPU_PCT {
            "met"
        } else {
            "NOT met"
        },
        per_10s
            .iter()
            .map(|p| format!("{p:.2} %"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "daemon RSS: {:.1} MiB at start, {:.1} MiB at end, max {rss_max:.1} MiB (goal ≤ \
         {GOAL_RSS_MIB} MiB: {})",
        rss[0] as f64 / 1024.0,
        *rss.last().unwrap() as f64 / 1024.0,
        if rss_max <= GOAL_RSS_MIB {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "toy servers ({alive} of 8 alive at the end, each reporting every 200 ms): {:.2} s CPU = \
         {toys_pct:.2} % of one core in all, {:.3} % each",
        (toys1 - toys0) as f64 / hz,
        toys_pct / 8.0
    );
    let restarted = d.status()["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["replicas"].as_array().unwrap().len())
        .sum::<usize>();
    assert_eq!(restarted, 8, "replicas changed during the run");
    drop(d);
}
