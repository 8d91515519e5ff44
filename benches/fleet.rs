//! The fleet bench (docs/fleet.md; `scripts/fleet-bench.sh`): three hosts on 127.0.0.2, .3 and
//! .4 from `examples/fleet/hearth.toml` (toy replicas, 4 slots each, `max` 6, target wait
//! 500 ms) behind HAProxy, with one host hot: `--hot` clients (default 40) send long requests
//! (1.1 s of service) straight to host 1's front door, which holds its replicas at `max` with a
//! queue, while hosts 2 and 3 only get what HAProxy sends them. Then, for each policy in turn,
//! `--clients` (default 8) clients send short requests (300 ms of service) through HAProxy for
//! `--seconds` (default 30; 3 with `--smoke`, or without `--bench`):
//!
//! - `agent`: `examples/fleet/haproxy.cfg` as it ships, `leastconn` with the hosts' agent
//!   weights;
//! - `roundrobin` and `leastconn`: the same file without agent checks (health checks kept),
//!   every host at its configured weight.
//!
//! Printed per policy: requests, those whose wait (latency less the service time) was over the
//! target, p50 and p99 wait, failures (any answer but 200, or none). Goal: agent weights have
//! fewer requests over target than `leastconn` and `roundrobin`, with no more failures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::route::fleet::Fleet;
use testkit::route::*;
use testkit::{bench_arg, bench_full, machine_load, percentile};

const TARGET_MS: f64 = 500.0;
/// The example's toy: 100 ms a request and 10 ms a token.
const SHORT_TOKENS: u32 = 20;
const SHORT_SERVICE_MS: f64 = 100.0 + 10.0 * SHORT_TOKENS as f64;
const HOT_TOKENS: u32 = 100;

/// The example's file without agent checks, balanced by `balance`.
fn plain(cfg: &str, balance: &str) -> String {
    cfg.lines()
        .map(|l| {
            let l = match l.find(" agent-check") {
                Some(i) if l.trim_start().starts_with("default-server") => &l[..i],
                _ => l,
            };
            let l = match l.find(" agent-port") {
                Some(i) => l[..i].to_string(),
                None => l.to_string(),
            };
            if l.trim_start().starts_with("balance ") {
                format!("    balance {balance}")
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

struct Run {
    waits: Vec<f64>,
    failed: usize,
}

fn measure(frontend: std::net::SocketAddr, clients: usize, length: Duration) -> Run {
    let end = Instant::now() + length;
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut waits, mut failed) = (Vec::new(), 0);
                let body = json!({"model": "toy", "prompt": "Hello", "max_tokens": SHORT_TOKENS});
                while Instant::now() < end {
                    let t = Instant::now();
                    match post(frontend, "/v1/completions", &body, Duration::from_secs(120)) {
                        Ok(r) if r.status == 200 => {
                            let ms = t.elapsed().as_secs_f64() * 1000.0;
                            waits.push((ms - SHORT_SERVICE_MS).max(0.0));
                        }
                        _ => failed += 1,
                    }
                }
                (waits, failed)
            })
        })
        .collect();
    let mut run = Run {
        waits: Vec::new(),
        failed: 0,
    };
    for t in threads {
        let (w, f) = t.join().unwrap();
        run.waits.extend(w);
        run.failed += f;
    }
    run.waits.sort_by(f64::total_cmp);
    run
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke") || !bench_full();
    let seconds: u64 = bench_arg("--seconds").unwrap_or(if smoke { 3 } else { 30 });
    let clients: usize = bench_arg("--clients").unwrap_or(8);
    let hot: usize = bench_arg("--hot").unwrap_or(40);
    let mut fleet = Fleet::start(3);
    let stop = Arc::new(AtomicBool::new(false));
    let h1 = fleet.hosts[0].listen;
    let flood: Vec<_> = (0..hot)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let body = json!({"model": "toy", "prompt": "x", "max_tokens": HOT_TOKENS});
                while !stop.load(Ordering::Relaxed) {
                    let _ = post(h1, "/v1/completions", &body, Duration::from_secs(120));
                }
            })
        })
        .collect();
    if !smoke {
        // Host 1 at max, its queue never empty.
        wait_until("host 1 at max", Duration::from_secs(120), || {
            (fleet.hosts[0].model("toy")["routed"].as_u64()? == 6).then_some(())
        });
    }
    let agent_cfg = fleet.haproxy_cfg();
    println!(
        "fleet bench: 3 hosts, host 1 hot ({hot} clients straight to it, {HOT_TOKENS}-token \
         requests); {clients} clients through HAProxy, {SHORT_TOKENS}-token requests \
         ({SHORT_SERVICE_MS:.0} ms of service), {seconds} s per policy, target wait \
         {TARGET_MS:.0} ms; {}",
        machine_load()
    );
    println!(
        "{:<11} {:>8} {:>12} {:>9} {:>9} {:>8}  host 1 routed",
        "policy", "requests", "over target", "p50 ms", "p99 ms", "failed"
    );
    for (name, cfg) in [
        ("agent", agent_cfg.clone()),
        ("roundrobin", plain(&agent_cfg, "roundrobin")),
        ("leastconn", plain(&agent_cfg, "leastconn")),
    ] {
        fleet.start_haproxy(&cfg);
        if name == "agent" {
            // The agents' first answers in force.
            std::thread::sleep(Duration::from_secs(2));
        }
        let run = measure(fleet.frontend, clients, Duration::from_secs(seconds));
        let over = run.waits.iter().filter(|w| **w > TARGET_MS).count();
        let n = run.waits.len() + run.failed;
        println!(
            "{name:<11} {n:>8} {over:>6} {:>4.1} % {:>9.0} {:>9.0} {:>8}  {}",
            100.0 * over as f64 / n.max(1) as f64,
            percentile(&run.waits, 50.0),
            percentile(&run.waits, 99.0),
            run.failed,
            fleet.hosts[0].model("toy")["routed"]
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        let _ = t.join();
    }
}
