//! What one queue report costs in the core alone: `Node::handle` on a report, with virtual time
//! and no I/O, as a function of the report rate (a diagnostic for `report_throughput`).
//!
//! One model with 2 routed replicas. For each rate R, reports arrive evenly spaced in virtual
//! time (1/R apart) for 12 virtual seconds — longer than the core's 10 s rate window, so the
//! sample history of each source (the model-wide one and each replica) reaches its steady size —
//! alternating model-wide and per-replica, with calm values, as `report_throughput` sends them.
//! Printed: the mean wall time of one `handle` call over the last 2,000 reports of each rate
//! (the last half at 100/s), and, for comparison, a `version` request (no autoscaling: what
//! `handle`'s reconcile and routed-set check cost on every event). Before them, what parsing a
//! report's line costs (`protocol::parse_request`), which the socket layer does for each.
//!
//! Run: `cargo bench --bench report_core`. Without `--bench`, rates up to 1,000/s only. A rate
//! whose run would take over a minute at the cost seen so far is skipped.

use std::path::Path;
use std::time::{Duration, Instant};

use hearth::config::Config;
use hearth::core::{Action, Event, Node, Peer, ProbeKind, ProbeOutcome, Time};
use hearth::protocol::{Report, Request};
use testkit::bench_full;

const CONFIG: &str = r#"
[daemon]
socket = "/tmp/hearth-bench.sock"
ports = "30000-30099"

[gpus]
backend = "auto"

[[model]]
name = "m"
command = ["server", "--port", "{port}"]
gpus = 0
[model.warmup]
url = "http://127.0.0.1:{port}/v1/completions"
[model.scaling]
min = 2
max = 2
"#;

struct Core {
    node: Node,
    now: Time,
    next_id: u64,
}

impl Core {
    fn new() -> Core {
        let config = Config::parse(CONFIG, Path::new("bench.toml")).expect("config");
        let now = Time::from_millis(1_000_000);
        let mut c = Core {
            node: Node::new(config, Vec::new(), Default::default(), now),
            now,
            next_id: 1,
        };
        // Spawn and warm what the node asks for: 2 routed replicas.
        let mut actions = c.node.handle(Event::Tick, now);
        let mut pid = 1000;
        for _ in 0..5 {
            let spawned: Vec<_> = actions
                .iter()
                .filter_map(|a| match a {
                    Action::Spawn(s) => Some(s.replica.clone()),
                    _ => None,
                })
                .collect();
            actions = Vec::new();
            for r in spawned {
                pid += 1;
                c.node.handle(
                    Event::Spawned {
                        replica: r.clone(),
                        pid,
                    },
                    now,
                );
                actions.extend(c.node.handle(
                    Event::Probed {
                        replica: r,
                        kind: ProbeKind::Warmup,
                        outcome: ProbeOutcome {
                            ok: true,
                            not_ready: false,
                            detail: "HTTP 200".into(),
                        },
                    },
                    now,
                ));
            }
        }
        c
    }

    fn request(&mut self, request: Request) -> Vec<Action> {
        self.next_id += 1;
        self.node.handle(
            Event::Request {
                id: self.next_id,
                peer: Peer::trusted(),
                request,
            },
            self.now,
        )
    }
}

fn report(replica: Option<&str>) -> Request {
    Request::Report(Report {
        model: "m".into(),
        replica: replica.map(String::from),
        oldest_wait_ms: Some(12.0),
        queue_depth: Some(0),
        in_flight: Some(1),
        arrived: None,
        completed: None,
        router: None,
    })
}

fn main() {
    let full = bench_full();
    let rates: &[u64] = if full {
        &[100, 1_000, 3_000, 10_000, 30_000, 100_000]
    } else {
        &[100, 1_000]
    };
    println!("report_core: Node::handle per report, 1 model, 2 routed replicas, virtual time");
    // What the socket layer does with a report's line before the core sees it.
    let lines = [
        r#"{"op":"report","model":"m","oldest_wait_ms":12,"queue_depth":0,"in_flight":1}"#,
        r#"{"op":"report","model":"m","replica":"m-1","oldest_wait_ms":12,"queue_depth":0,"in_flight":1}"#,
    ];
    let n = 200_000;
    let t = Instant::now();
    for i in 0..n {
        let r = hearth::protocol::parse_request(lines[i % 2]);
        std::hint::black_box(r.is_ok());
    }
    println!(
        "  parsing a report's line (protocol::parse_request): {:.3} µs per line",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let mut core = Core::new();
    let routed: Vec<String> = ["m-1", "m-2"].iter().map(|s| s.to_string()).collect();
    // Fixed cost of any event.
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        core.request(Request::Version {});
    }
    println!(
        "  version request (reconcile + routed-set check only): {:.2} µs per event",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let mut last: Option<(u64, f64)> = None;
    for &rate in rates {
        // A cost that grows with the window makes the next rate's run quadratic: estimate it
        // (cost per report ∝ rate) and skip runs that would take more than a minute.
        if let Some((r0, per0)) = last {
            let est_s = per0 * (rate as f64 / r0 as f64) * 0.6 * (rate * 12) as f64 / 1e6;
            if est_s > 60.0 {
                println!(
                    "  {rate:>7} reports/s: skipped (≈ {est_s:.0} s to run at the cost seen so far)"
                );
                continue;
            }
        }
        let mut core = Core::new();
        let step = Duration::from_nanos(1_000_000_000 / rate);
        let total = rate * 12;
        let tail = (total / 2).min(2_000);
        let mut t_tail = None;
        for i in 0..total {
            if i == total - tail {
                t_tail = Some(Instant::now());
            }
            core.now = core.now + step;
            let replica = match i % 4 {
                1 => Some(routed[0].as_str()),
                3 => Some(routed[1].as_str()),
                _ => None,
            };
            let out = core.request(report(replica));
            debug_assert!(out.iter().any(|a| matches!(a, Action::Reply { .. })));
        }
        let per = t_tail.unwrap().elapsed().as_secs_f64() * 1e6 / tail as f64;
        last = Some((rate, per));
        println!(
            "  {rate:>7} reports/s (≈ {:>7} reports in the 10 s window): {per:>8.2} µs per report \
             → at most {:.0} reports/s on one core",
            rate * 10,
            1e6 / per
        );
    }
}
