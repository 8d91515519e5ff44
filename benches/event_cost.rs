//! The worst cost of one event on the daemon's loop, under hostile input: `Node::handle` (every
//! decision the loop makes), with virtual time and no I/O, timed per event in wall-clock and in
//! the thread's CPU time (goal: none over 1 ms of work). Encoding the answers, which the daemon
//! does on each connection's task rather than on the loop, is timed apart.
//!
//! One model whose `max` is as large as its 1,000 ports allow, 2 replicas routed. The events, in
//! rounds, 150 virtual ms apart:
//! - reports at their bounds: `in_flight` 1,000,000 over `queue_depth` 1 (a slot count of a
//!   million), arrival and completion counters climbing by 2^40 (rates in the trillions), waits
//!   of a day; model-wide and for a replica;
//! - the same with absurd values the core must refuse (u64::MAX, NaN, infinity);
//! - `scale` to min = max = 1,000 (every port) and back to 2, then `--reset`;
//! - `status` with up to a thousand replicas; `version`; `drain` of a routed replica;
//! - reloads: a signal, then the file read back (the same configuration, or `max` changed);
//! - a tick; spawns, warm-ups and exits for whatever the node started and stopped.
//!
//! Printed per kind of event: count, p50, p99 and the worst, in µs; then the worst of all.
//!
//! The sequence is deterministic (virtual time, no I/O), so it is run `--repeat` times (3 with
//! `--bench`) and each event's least CPU time over the runs is its work: on a shared VM a
//! thread's CPU clock also counts page faults and time the hypervisor took, which lands on one
//! event in one run (a `status` that costs 0.7 ms in four runs and 3.7 ms in the fifth). The
//! first run's figures are printed too, as they came.
//!
//! Run: `cargo bench --bench event_cost` (`-- --rounds N --repeat K`). Without `--bench`, 200
//! rounds, once.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use hearth::config::Config;
use hearth::core::{Action, Event, NewConfig, Node, Peer, ProbeKind, ProbeOutcome, Time};
use hearth::protocol::{encode_answer, Report, Request, MAX_QUEUE, MAX_WAIT_MS};
use testkit::{bench_arg, bench_full, percentile};

fn config(max: u32) -> String {
    format!(
        r#"
[daemon]
socket = "/tmp/hearth-bench.sock"
ports = "30000-30999"

[gpus]
backend = "auto"

[[model]]
name = "m"
command = ["server", "--port", "{{port}}"]
gpus = 0
[model.warmup]
url = "http://127.0.0.1:{{port}}/v1/completions"
[model.scaling]
min = 2
max = {max}
"#
    )
}

struct Bench {
    node: Node,
    now: Time,
    next_id: u64,
    next_pid: u32,
    costs: BTreeMap<&'static str, Vec<f64>>,
    /// The same events' CPU time on this thread: the work itself, without the time the
    /// machine's other processes took this thread's CPU (wall-clock times on a loaded 2-core
    /// machine carry preemptions of several ms).
    cpu: BTreeMap<&'static str, Vec<f64>>,
    configs: Vec<Config>,
    /// Replicas spawned and not exited, oldest first.
    live: Vec<String>,
}

/// Answers written out as JSON: the connection's work, not the loop's.
const ENCODING: &str = "(answer encoding, off the loop)";

impl Bench {
    fn record(&mut self, kind: &'static str, t: Instant, cpu: Duration) {
        let us = t.elapsed().as_secs_f64() * 1e6;
        let cpu_us = thread_cpu().saturating_sub(cpu).as_secs_f64() * 1e6;
        self.costs.entry(kind).or_default().push(us);
        self.cpu.entry(kind).or_default().push(cpu_us);
    }

    /// One event, timed with the encoding of its answers; the actions it asked for that the
    /// world would answer at once (spawns, warm-ups, signals) are answered, each timed too.
    fn send(&mut self, kind: &'static str, ev: Event) {
        let (t, cpu) = (Instant::now(), thread_cpu());
        let out = self.node.handle(ev, self.now);
        self.record(kind, t, cpu);
        // The daemon writes answers out on the connection's task, off the loop (a status on
        // the blocking pool): timed apart.
        let (t, cpu) = (Instant::now(), thread_cpu());
        let mut bytes = 0;
        for a in &out {
            if let Action::Reply { answer, .. } = a {
                bytes += encode_answer(answer).len();
            }
        }
        std::hint::black_box(bytes);
        if bytes > 0 {
            self.record(ENCODING, t, cpu);
        }
        for a in out {
            match a {
                Action::Spawn(s) => {
                    self.live.push(s.replica.0.clone());
                    self.next_pid += 1;
                    let pid = self.next_pid;
                    self.send(
                        "spawned",
                        Event::Spawned {
                            replica: s.replica,
                            pid,
                        },
                    );
                }
                Action::Probe {
                    replica,
                    kind: ProbeKind::Warmup,
                    ..
                } => self.send(
                    "warm-up passed",
                    Event::Probed {
                        replica,
                        kind: ProbeKind::Warmup,
                        outcome: ProbeOutcome {
                            ok: true,
                            not_ready: false,
                            detail: "HTTP 200".into(),
                        },
                    },
                ),
                Action::Signal { replica, .. } => {
                    self.live.retain(|r| *r != replica.0);
                    self.send(
                        "exited",
                        Event::Exited {
                            replica,
                            status: hearth::core::ExitStatus::Code(0),
                        },
                    )
                }
                _ => {}
            }
        }
    }

    fn request(&mut self, kind: &'static str, request: Request) {
        self.next_id += 1;
        let ev = Event::Request {
            id: self.next_id,
            peer: Peer::trusted(),
            request,
        };
        self.send(kind, ev);
    }
}

fn report(replica: Option<String>, wait: f64, depth: u64, in_flight: u64, counter: u64) -> Request {
    Request::Report(Report {
        model: "m".into(),
        replica,
        oldest_wait_ms: Some(wait),
        queue_depth: Some(depth),
        in_flight: Some(in_flight),
        arrived: Some(counter),
        completed: Some(counter / 2),
        router: None,
    })
}

fn main() {
    let rounds =
        bench_arg::<f64>("--rounds").unwrap_or(if bench_full() { 2000.0 } else { 200.0 }) as u64;
    let repeat = bench_arg::<f64>("--repeat")
        .unwrap_or(if bench_full() { 3.0 } else { 1.0 })
        .clamp(1.0, 20.0) as usize;
    println!(
        "event_cost: Node::handle + answer encoding per event, 1 model (max 1,000, ports \
         30000-30999), {rounds} rounds of hostile events, virtual time, {repeat} run(s)"
    );
    let total = Instant::now();
    let mut runs: Vec<Bench> = (0..repeat).map(|_| run(rounds)).collect();
    let wall = total.elapsed().as_secs_f64() / repeat as f64;
    let live = runs[0].live.len();
    // Each event's least CPU time over the runs: the same event, since the sequence is the same.
    let least: BTreeMap<&'static str, Vec<f64>> = runs[0]
        .cpu
        .iter()
        .map(|(kind, first)| {
            let mut least = first.clone();
            for other in &runs[1..] {
                let theirs = &other.cpu[kind];
                assert_eq!(theirs.len(), least.len(), "{kind}: the runs differ");
                for (l, t) in least.iter_mut().zip(theirs) {
                    *l = l.min(*t);
                }
            }
            (*kind, least)
        })
        .collect();
    let first = &mut runs[0];
    println!("  the first run: wall clock per event, then CPU time of the event on its thread:");
    print_kinds(&mut first.costs, &mut first.cpu, wall, live);
    if repeat > 1 {
        println!("  the least CPU time of each event over the {repeat} runs (its work), per kind:");
        let mut least_wall = least.clone();
        let mut least_cpu = least;
        print_kinds(&mut least_wall, &mut least_cpu, wall, live);
    }
}

/// One run of the sequence.
fn run(rounds: u64) -> Bench {
    let configs: Vec<Config> = [1000, 500]
        .iter()
        .map(|&m| Config::parse(&config(m), Path::new("bench.toml")).expect("config"))
        .collect();
    let now = Time::from_millis(1_000_000);
    let mut b = Bench {
        node: Node::new(configs[0].clone(), Vec::new(), Default::default(), now),
        now,
        next_id: 0,
        next_pid: 1000,
        costs: BTreeMap::new(),
        cpu: BTreeMap::new(),
        configs,
        live: Vec::new(),
    };
    b.send("tick", Event::Tick);
    for round in 0..rounds {
        b.now = b.now + Duration::from_millis(150);
        let counter = (round + 1) << 40;
        let routed: Option<String> = b.live.first().cloned();
        b.request(
            "report at bounds",
            report(None, MAX_WAIT_MS, 1, MAX_QUEUE, counter),
        );
        b.request(
            "report at bounds",
            report(routed.clone(), MAX_WAIT_MS, 1, MAX_QUEUE, counter),
        );
        b.request(
            "report refused",
            report(None, f64::NAN, u64::MAX, u64::MAX, u64::MAX),
        );
        b.request(
            "report refused",
            report(routed.clone(), f64::INFINITY, 0, u64::MAX, 0),
        );
        match round % 10 {
            0 => b.request(
                "scale",
                Request::Scale {
                    model: "m".into(),
                    min: Some(1000),
                    max: Some(1000),
                    warm_pool: None,
                    reset: false,
                },
            ),
            3 => b.request(
                "scale",
                Request::Scale {
                    model: "m".into(),
                    min: Some(u32::MAX),
                    max: Some(u32::MAX),
                    warm_pool: None,
                    reset: false,
                },
            ),
            5 => b.request(
                "scale",
                Request::Scale {
                    model: "m".into(),
                    min: Some(2),
                    max: Some(4),
                    warm_pool: None,
                    reset: false,
                },
            ),
            7 => b.request(
                "scale",
                Request::Scale {
                    model: "m".into(),
                    min: None,
                    max: None,
                    warm_pool: None,
                    reset: true,
                },
            ),
            _ => {}
        }
        b.request("status", Request::Status { model: None });
        b.request("version", Request::Version {});
        if let (Some(r), true) = (routed, round % 7 == 0) {
            b.request(
                "drain",
                Request::Drain {
                    replica: Some(r),
                    model: None,
                    force: true,
                },
            );
        }
        if round % 13 == 0 {
            b.send("reload signal", Event::ReloadSignal);
            let c = b.configs[(round / 13) as usize % 2].clone();
            b.send(
                "reload read",
                Event::ConfigRead(Ok(Box::new(NewConfig {
                    config: c,
                    warnings: vec![],
                    text: "".into(),
                }))),
            );
        }
        b.send("tick", Event::Tick);
    }
    b
}

/// Per kind: count, p50, p99 and worst of `costs` (wall) and of `cpu`; then the worst of all.
fn print_kinds(
    costs: &mut BTreeMap<&'static str, Vec<f64>>,
    cpu_by_kind: &mut BTreeMap<&'static str, Vec<f64>>,
    wall: f64,
    live: usize,
) {
    let mut worst = (0.0, "");
    let mut worst_cpu = (0.0, "");
    let mut events = 0;
    for (kind, costs) in costs.iter_mut() {
        costs.sort_by(f64::total_cmp);
        let max = costs.last().copied().unwrap_or(0.0);
        if *kind != ENCODING {
            events += costs.len();
        }
        let on_loop = *kind != ENCODING;
        if on_loop && max > worst.0 {
            worst = (max, kind);
        }
        let cpu = cpu_by_kind
            .get_mut(kind)
            .map(std::mem::take)
            .unwrap_or_default();
        let mut cpu = cpu;
        cpu.sort_by(f64::total_cmp);
        let cpu_max = cpu.last().copied().unwrap_or(0.0);
        if on_loop && cpu_max > worst_cpu.0 {
            worst_cpu = (cpu_max, kind);
        }
        println!(
            "  {kind:>16}: {:>7} events, p50 {:>8.1} µs, p99 {:>8.1} µs, worst {:>8.1} µs | cpu \
             p50 {:>7.1} µs, p99 {:>7.1} µs, worst {:>7.1} µs",
            costs.len(),
            percentile(costs, 50.0),
            percentile(costs, 99.0),
            max,
            percentile(&cpu, 50.0),
            percentile(&cpu, 99.0),
            cpu_max
        );
    }
    println!(
        "  {events} events in {wall:.2} s; the worst: {:.1} µs wall ({}), {:.1} µs CPU ({}); goal \
         ≤ 1,000 µs of work: {}; {} replicas alive at the end",
        worst.0,
        worst.1,
        worst_cpu.0,
        worst_cpu.1,
        if worst_cpu.0 <= 1000.0 {
            "met"
        } else {
            "MISSED"
        },
        live
    );
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}
