//! The core under random sequences of hostile events (proptest): process exits and spawn
//! results for replicas that exist and that do not, probe and scrape results, reports and
//! operator requests from every kind of peer with absurd numbers, reloads (good, bad, narrowing,
//! rolling over), GPU XIDs and memory readings, prefetch progress, shutdowns; time jumping ahead.
//! After every event:
//!
//! - no panic;
//! - bounded work: the actions of one event, and the replicas alive, are bounded by what the
//!   port range can hold, and an answer's size by the replicas and models, never by a number or
//!   a string a client sent;
//! - ports and GPU reservations match the live replicas exactly;
//! - a replica is routed only after a warm-up passed (one this test sent);
//!
//! and after each sequence, once the world behaves (spawns succeed, warm-ups pass, signals end
//! processes) for 15 minutes: every model has at least `min` routed unless no replica of it can
//! be placed (no free port, or no GPU room that the GPU table confirms): see `check_min_routed`.
//!
//! Not sent: `Event::Inventory`, whose reordering of the GPU table is the GPU issue's (item 7).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;

use super::replica::Replica;
use super::*;
use crate::config::Config;
use crate::protocol::{Report, Request, Role, WarmPoolSetting, WatchEvent, WatchedState};

const DEVICES: &str = r#"
[gpus]
backend = "static"
[[gpus.device]]
uuid = "GPU-a"
memory = "80GiB"
[[gpus.device]]
uuid = "GPU-b"
memory = "80GiB"
"#;

fn model(name: &str, extra: &str, scaling: &str) -> String {
    format!(
        r#"
[[model]]
name = "{name}"
command = ["server", "--port", "{{port}}"]
stop_grace = "5s"
{extra}
[model.warmup]
url = "http://127.0.0.1:{{port}}/v1/completions"
startup_timeout = "10s"
recheck = "1m"
[model.liveness]
url = "http://127.0.0.1:{{port}}/health"
interval = "2s"
failures = 2
[model.scaling]
drain_timeout = "30s"
{scaling}
"#
    )
}

/// The configurations a sequence may run and reload: a CPU model with a pool, a shared-GPU model,
/// a whole-device model that scrapes and outranks the others; then variants: scaling changed,
/// a new version (a rollout), a model removed, one added, the ports narrowed, absurd durations.
fn configs() -> Vec<String> {
    let a = |scaling: &str, version: &str| {
        model("a", &format!("gpus = 0\nversion = \"{version}\""), scaling)
    };
    let b = model(
        "b",
        "gpus = 1\ngpu_memory = \"30GiB\"",
        "min = 1\nmax = 3\nwarm_pool = \"auto\"",
    );
    let c = model(
        "c",
        "gpus = 1\npriority = 5",
        "min = 0\nmax = 2\nwarm_pool = 1\n[model.signal]\nscrape = \"http://127.0.0.1:{port}/metrics\"\nformat = \"vllm\"",
    );
    let d = model("d", "gpus = 0", "min = 2\nmax = 2");
    let head = |ports: &str| {
        format!("[daemon]\nsocket = \"/tmp/hearth-prop.sock\"\nports = \"{ports}\"\nshutdown_timeout = \"20s\"\n{DEVICES}")
    };
    let base = head("30000-30031");
    vec![
        format!("{base}{}{b}{c}", a("min = 1\nmax = 4\nwarm_pool = 1", "1")),
        format!("{base}{}{b}{c}", a("min = 2\nmax = 6\nwarm_pool = 2", "1")),
        format!("{base}{}{b}{c}", a("min = 1\nmax = 4\nwarm_pool = 1", "2")),
        format!("{base}{}{b}", a("min = 1\nmax = 4\nwarm_pool = 0", "1")),
        format!("{base}{}{b}{c}{d}", a("min = 1\nmax = 4\nwarm_pool = 1", "1")),
        format!("{}{}{b}{c}", head("30000-30009"), a("min = 1\nmax = 4", "1")),
        format!(
            "{base}{}{b}{c}",
            a(
                "min = 0\nmax = 4\nwarm_pool = 1\nidle_to_zero = \"1s\"\ndown_stabilization = \"1s\"\ndown_step = \"1s\"",
                "1"
            )
        )
        .replace("drain_timeout = \"30s\"", "drain_timeout = \"5124095576030431h\"")
        .replace("stop_grace = \"5s\"", "stop_grace = \"5124095576030431h\""),
    ]
}

/// Numbers as a hostile client picks them: the edges, the bounds, anything.
fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..20,
        1 => Just(u64::MAX),
        1 => Just(1u64 << 32),
        1 => Just(crate::protocol::MAX_QUEUE),
        1 => Just(crate::protocol::MAX_COUNTER),
        1 => any::<u64>(),
    ]
}

fn hostile_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..10,
        1 => Just(u32::MAX),
        1 => Just(100_000u32),
        1 => 10u32..64,
        1 => any::<u32>(),
    ]
}

fn hostile_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.0f64..3000.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(-1.0),
        1 => Just(1e19),
        1 => Just(crate::protocol::MAX_WAIT_MS),
        1 => any::<f64>(),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    /// Time passes (ms), then a tick.
    Advance(u64),
    Spawned(u8),
    SpawnFailed(u8),
    Exited(u8),
    Probe {
        replica: u8,
        kind: u8,
        ok: bool,
        not_ready: bool,
    },
    Scraped {
        replica: u8,
        ok: bool,
        depth: u64,
        in_flight: u64,
        wait: Option<f64>,
        counter: Option<u64>,
    },
    Report {
        model: u8,
        replica: Option<u8>,
        wait: Option<f64>,
        depth: Option<u64>,
        in_flight: Option<u64>,
        arrived: Option<u64>,
        completed: Option<u64>,
        peer: u8,
    },
    Scale {
        model: u8,
        min: Option<u32>,
        max: Option<u32>,
        warm: Option<Option<u32>>,
        reset: bool,
        peer: u8,
    },
    Drain {
        replica: u8,
        force: bool,
        peer: u8,
    },
    Cordon {
        gpu: u8,
        on: bool,
        evacuate: bool,
    },
    Xid(u8, u64),
    Memory(u8, u64, Vec<(u32, u64)>),
    Prefetch(u8, u64, u64),
    ReloadAsk(bool),
    /// The shell's read comes back: a configuration (by index), or an error.
    ConfigRead(u8),
    Read(u8, u8),
    Shutdown(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop_oneof![4 => 0u64..3000, 1 => 3000u64..120_000, 1 => Just(3_600_000u64)]
            .prop_map(Step::Advance),
        4 => any::<u8>().prop_map(Step::Spawned),
        1 => any::<u8>().prop_map(Step::SpawnFailed),
        2 => any::<u8>().prop_map(Step::Exited),
        5 => (any::<u8>(), 0u8..3, prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(replica, kind, ok, not_ready)| Step::Probe { replica, kind, ok, not_ready }),
        1 => (any::<u8>(), any::<bool>(), hostile_u64(), hostile_u64(), prop::option::of(hostile_f64()), prop::option::of(hostile_u64()))
            .prop_map(|(replica, ok, depth, in_flight, wait, counter)| Step::Scraped { replica, ok, depth, in_flight, wait, counter }),
        5 => (any::<u8>(), prop::option::of(any::<u8>()), prop::option::of(hostile_f64()), prop::option::of(hostile_u64()),
              prop::option::of(hostile_u64()), prop::option::of(hostile_u64()), prop::option::of(hostile_u64()), any::<u8>())
            .prop_map(|(model, replica, wait, depth, in_flight, arrived, completed, peer)| Step::Report { model, replica, wait, depth, in_flight, arrived, completed, peer }),
        2 => (any::<u8>(), prop::option::of(hostile_u32()), prop::option::of(hostile_u32()), prop::option::of(prop::option::of(hostile_u32())), prop::bool::weighted(0.2), any::<u8>())
            .prop_map(|(model, min, max, warm, reset, peer)| Step::Scale { model, min, max, warm, reset, peer }),
        2 => (any::<u8>(), any::<bool>(), any::<u8>()).prop_map(|(replica, force, peer)| Step::Drain { replica, force, peer }),
        1 => (0u8..4, any::<bool>(), any::<bool>()).prop_map(|(gpu, on, evacuate)| Step::Cordon { gpu, on, evacuate }),
        1 => (0u8..3, prop_oneof![Just(79u64), Just(13u64), any::<u64>()]).prop_map(|(g, x)| Step::Xid(g, x)),
        1 => (0u8..3, hostile_u64(), prop::collection::vec((any::<u32>(), hostile_u64()), 0..4))
            .prop_map(|(g, used, by)| Step::Memory(g, used, by)),
        1 => (any::<u8>(), hostile_u64(), hostile_u64()).prop_map(|(r, d, t)| Step::Prefetch(r, d, t)),
        1 => any::<bool>().prop_map(Step::ReloadAsk),
        1 => any::<u8>().prop_map(Step::ConfigRead),
        2 => (0u8..4, any::<u8>()).prop_map(|(op, m)| Step::Read(op, m)),
        1 => prop::bool::weighted(0.3).prop_map(Step::Shutdown),
    ]
}

/// The world around the node: a virtual clock, a process table, what this test has told it.
struct World {
    node: Node,
    now: Time,
    configs: Vec<Config>,
    next_pid: u32,
    next_req: u64,
    /// Replicas whose warm-up this test passed.
    warmed: BTreeSet<ReplicaId>,
    /// Replicas sent SIGKILL: their process ends whatever the hostile steps did with the
    /// action, and the supervisor reports it (by `behave` at the latest).
    killed: BTreeSet<ReplicaId>,
    /// Spawns asked for and not yet answered: the supervisor always answers one, with a pid
    /// or a failure (by `behave` at the latest).
    unanswered: BTreeSet<ReplicaId>,
    /// The most replicas that can be alive: a port each, and pending ones at most `max` each.
    replica_bound: usize,
}

/// The peer a number picks: an admin, a reader, a process of a live replica, or nobody.
fn peer(w: &World, p: u8) -> Peer {
    let role = match p % 4 {
        0 => Role::Admin,
        1 => Role::Reader,
        2 => Role::Reporter,
        _ => Role::None,
    };
    let pgid = p
        .is_multiple_of(3)
        .then(|| {
            w.node
                .replicas
                .values()
                .filter_map(|r| r.pid)
                .nth(usize::from(p) / 4)
        })
        .flatten();
    // A process in a replica's cgroup (as the shell's containment would say), or a stranger's
    // name for one.
    let replica = p.is_multiple_of(5).then(|| replica(w, p / 5));
    Peer {
        uid: 1000,
        pid: pgid,
        pgid,
        replica,
        role,
    }
}

fn model_name(w: &World, m: u8) -> String {
    let names: Vec<&String> = w.node.models.keys().collect();
    match names.get(usize::from(m) % (names.len() + 1)) {
        Some(n) => (*n).clone(),
        // A name as long as a request line can carry: its answer must not echo it.
        None if m == u8::MAX => "m".repeat(60_000),
        None => format!("nope-{m}"),
    }
}

/// A live replica by number, or (past them) one that does not exist.
fn replica(w: &World, i: u8) -> ReplicaId {
    let ids: Vec<&ReplicaId> = w.node.replicas.keys().collect();
    if i == u8::MAX {
        return ReplicaId("r".repeat(60_000));
    }
    if ids.is_empty() || i >= 240 {
        return ReplicaId(format!("a-{}", 900 + u32::from(i)));
    }
    ids[usize::from(i) % ids.len()].clone()
}

impl World {
    fn new(config: usize) -> World {
        static PARSED: std::sync::OnceLock<Vec<Config>> = std::sync::OnceLock::new();
        let configs = PARSED
            .get_or_init(|| {
                configs()
                    .iter()
                    .map(|t| {
                        Config::parse(t, Path::new("prop.toml")).expect("a test configuration")
                    })
                    .collect()
            })
            .clone();
        let c = configs[config % configs.len()].clone();
        let devices = GpuDevice::declared(&c.gpus);
        let now = Time::from_millis(1_000_000);
        let bound = configs
            .iter()
            .map(|c| {
                let ports = super::overrides::port_capacity(c.daemon.ports) as usize;
                2 * ports + 2 * c.models.len()
            })
            .max()
            .unwrap_or(0);
        World {
            node: Node::new(c, devices, BTreeMap::new(), now),
            now,
            configs,
            next_pid: 100,
            next_req: 1,
            warmed: BTreeSet::new(),
            killed: BTreeSet::new(),
            unanswered: BTreeSet::new(),
            replica_bound: bound,
        }
    }

    /// One event, and every property that must hold after it.
    fn send(&mut self, ev: Event) -> Vec<Action> {
        if let Event::Spawned { replica, .. } | Event::SpawnFailed { replica, .. } = &ev {
            self.unanswered.remove(replica);
        }
        let before = self.node.replicas.len();
        let out = self.node.handle(ev, self.now);
        let after = self.node.replicas.len();
        // Bounded work: nothing a client sent sizes what one event does.
        assert!(
            after <= self.replica_bound,
            "{after} replicas alive; at most {} can be",
            self.replica_bound
        );
        let work_bound = 64 + 24 * (before + after + self.node.models.len());
        assert!(
            out.len() <= work_bound,
            "{} actions for one event (bound {work_bound})",
            out.len()
        );
        // What goes back on the socket: sized by the replicas and models (a status lists
        // them), never by what the request carried.
        let reply_bound = 4096 + 1024 * (after + self.node.models.len());
        for a in &out {
            if let Action::Reply { answer, .. } = a {
                let line = crate::protocol::encode_answer(answer).len();
                assert!(
                    line <= reply_bound,
                    "a {line}-byte answer (bound {reply_bound})"
                );
            }
        }
        for a in &out {
            if let Action::Spawn(spec) = a {
                self.unanswered.insert(spec.replica.clone());
            }
            if let Action::Signal {
                replica,
                signal: StopSignal::Kill,
                ..
            } = a
            {
                self.killed.insert(replica.clone());
            }
        }
        for a in &out {
            if let Action::Publish(WatchEvent::Replica {
                replica,
                state: WatchedState::State(ReplicaState::Routed),
                ..
            }) = a
            {
                assert!(
                    self.warmed.contains(&ReplicaId(replica.clone())),
                    "{replica} routed without a warm-up passed"
                );
            }
        }
        self.check_books();
        out
    }

    /// Ports and GPU reservations are exactly those of the live replicas.
    fn check_books(&self) {
        let n = &self.node;
        let mut ports = BTreeSet::new();
        for r in n.replicas.values() {
            match (r.state, r.port) {
                (ReplicaState::Pending, None) => {}
                (ReplicaState::Pending, Some(p)) => panic!("pending {} holds port {p}", r.id),
                (s, None) => panic!("{s} {} holds no port", r.id),
                (_, Some(p)) => assert!(ports.insert(p), "port {p} twice"),
            }
        }
        assert_eq!(&ports, n.ports.in_use(), "the port pool's books");
        for slot in &n.gpus.slots {
            let holders: Vec<&Replica> = n
                .replicas
                .values()
                .filter(|r| r.gpus.contains(&slot.device.uuid))
                .collect();
            let mut want: Vec<&ReplicaId> = holders.iter().map(|r| &r.id).collect();
            let mut have: Vec<&ReplicaId> = slot.replicas.iter().collect();
            want.sort();
            have.sort();
            assert_eq!(have, want, "replicas on {}", slot.device.uuid);
            let bytes: u64 = holders.iter().map(|r| r.gpu_bytes).sum();
            assert_eq!(
                slot.reserved, bytes,
                "bytes reserved on {}",
                slot.device.uuid
            );
            for r in &holders {
                assert_ne!(r.state, ReplicaState::Pending, "{} pending on a GPU", r.id);
            }
        }
    }

    fn request(&mut self, peer: Peer, request: Request) -> Vec<Action> {
        let id = self.next_req;
        self.next_req += 1;
        let out = self.send(Event::Request { id, peer, request });
        let answered = out
            .iter()
            .filter(|a| matches!(a, Action::Reply { id: i, .. } if *i == id))
            .count();
        let reload = out.iter().any(|a| matches!(a, Action::ReadConfig { .. }));
        // Every request is answered once, at once; a reload once its file is read.
        assert!(
            answered == 1 || (answered == 0 && self.node.reloads_pending()),
            "{answered} answers, read asked: {reload}"
        );
        out
    }

    fn step(&mut self, s: &Step) {
        match s.clone() {
            Step::Advance(ms) => {
                self.now = self.now + Duration::from_millis(ms);
                self.send(Event::Tick);
            }
            Step::Spawned(i) => {
                let r = replica(self, i);
                self.next_pid += 1;
                let pid = self.next_pid;
                self.send(Event::Spawned { replica: r, pid });
            }
            Step::SpawnFailed(i) => {
                let r = replica(self, i);
                self.send(Event::SpawnFailed {
                    replica: r,
                    error: "no such file".into(),
                });
            }
            Step::Exited(i) => {
                let r = replica(self, i);
                self.send(Event::Exited {
                    replica: r,
                    status: "exit status 1".into(),
                });
            }
            Step::Probe {
                replica: i,
                kind,
                ok,
                not_ready,
            } => {
                let r = replica(self, i);
                let kind = [ProbeKind::Warmup, ProbeKind::Recheck, ProbeKind::Liveness]
                    [usize::from(kind) % 3];
                if ok && kind == ProbeKind::Warmup {
                    self.warmed.insert(r.clone());
                }
                self.send(Event::Probed {
                    replica: r,
                    kind,
                    outcome: ProbeOutcome {
                        ok,
                        not_ready: !ok && not_ready,
                        detail: "x".into(),
                    },
                });
            }
            Step::Scraped {
                replica: i,
                ok,
                depth,
                in_flight,
                wait,
                counter,
            } => {
                let r = replica(self, i);
                let outcome = if ok {
                    Ok(ScrapedQueue {
                        queue_depth: depth,
                        in_flight,
                        oldest_wait_ms: wait,
                        queue_time: counter.map(|c| QueueTime {
                            total_ms: wait.unwrap_or(1.0) * c as f64,
                            count: c,
                        }),
                        arrived: counter,
                        completed: counter.map(|c| c / 2),
                    })
                } else {
                    Err("refused".into())
                };
                self.send(Event::Scraped {
                    replica: r,
                    outcome,
                });
            }
            Step::Report {
                model,
                replica: rep,
                wait,
                depth,
                in_flight,
                arrived,
                completed,
                peer: p,
            } => {
                let report = Report {
                    model: model_name(self, model),
                    replica: rep.map(|i| replica(self, i).0),
                    oldest_wait_ms: wait,
                    queue_depth: depth,
                    in_flight,
                    arrived,
                    completed,
                    // Now and then a front door's report, sometimes with a hostile name.
                    router: match p % 7 {
                        0 => Some("door".into()),
                        1 => Some("d\u{7}".repeat(100)),
                        _ => None,
                    },
                };
                let who = peer(self, p);
                self.request(who, Request::Report(report));
            }
            Step::Scale {
                model,
                min,
                max,
                warm,
                reset,
                peer: p,
            } => {
                let req = Request::Scale {
                    model: model_name(self, model),
                    min,
                    max,
                    warm_pool: warm
                        .map(|w| w.map_or(WarmPoolSetting::AUTO, WarmPoolSetting::Count)),
                    reset,
                };
                let who = peer(self, p);
                self.request(who, req);
            }
            Step::Drain {
                replica: i,
                force,
                peer: p,
            } => {
                let r = replica(self, i);
                let who = peer(self, p);
                self.request(
                    who,
                    Request::Drain {
                        replica: r.0,
                        force,
                    },
                );
            }
            Step::Cordon { gpu, on, evacuate } => {
                let gpu = gpu.to_string();
                let req = if on {
                    Request::Cordon {
                        gpu,
                        reason: None,
                        evacuate,
                    }
                } else {
                    Request::Uncordon { gpu }
                };
                self.request(Peer::trusted(), req);
            }
            Step::Xid(g, xid) => {
                let uuid = ["GPU-a", "GPU-b", "GPU-zz"][usize::from(g) % 3].to_string();
                // Hostile recovery actions too: unknown raw values and none at all.
                let recovery = (xid % 3 != 0).then(|| RecoveryAction::from_raw((xid % 11) as u32));
                self.send(Event::GpuXid {
                    uuid,
                    xid,
                    recovery,
                });
            }
            Step::Memory(g, used, by_group) => {
                let uuid = ["GPU-a", "GPU-b", "GPU-zz"][usize::from(g) % 3].to_string();
                // Processes the driver names, some with "Unavailable" memory (None).
                let processes = by_group
                    .into_iter()
                    .map(|(pid, bytes)| GpuProcess {
                        pid,
                        bytes: (bytes % 5 != 0).then_some(bytes),
                        replica: None,
                        leaders: vec![pid],
                    })
                    .collect();
                self.send(Event::GpuReading(GpuReading {
                    uuid,
                    used,
                    driver_reserved: used / 16,
                    processes,
                    recovery: None,
                }));
            }
            Step::Prefetch(i, done, total) => {
                let r = replica(self, i);
                self.send(Event::Prefetch {
                    replica: r,
                    done_bytes: done,
                    total_bytes: total,
                    missing: vec!["w*.bin".into()],
                });
            }
            Step::ReloadAsk(signal) => {
                if signal {
                    self.send(Event::ReloadSignal);
                } else {
                    self.request(Peer::trusted(), Request::Reload {});
                }
            }
            Step::ConfigRead(i) => {
                let n = self.configs.len();
                let read = match self.configs.get(usize::from(i) % (n + 1)) {
                    Some(c) => Ok(Box::new(NewConfig {
                        config: c.clone(),
                        warnings: vec![],
                    })),
                    None => Err("prop.toml:1: x: bad".to_string()),
                };
                self.send(Event::ConfigRead(read));
            }
            Step::Read(op, m) => {
                let model = (m % 2 == 0).then(|| model_name(self, m));
                let req = match op {
                    0 => Request::Status { model },
                    1 => Request::Version {},
                    2 => Request::Gpus {},
                    _ => Request::Watch { model },
                };
                let who = peer(self, m);
                self.request(who, req);
            }
            Step::Shutdown(immediate) => {
                self.send(Event::Shutdown { immediate });
            }
        }
    }

    /// The world behaves for a while: every spawn succeeds, every warm-up and probe passes,
    /// every signal ends its process, scrapes show an idle server, reloads read an error.
    fn behave(&mut self, d: Duration) {
        let end = self.now + d;
        let mut pending: Vec<Action> = Vec::new();
        for replica in std::mem::take(&mut self.unanswered) {
            if self.node.replicas.contains_key(&replica) {
                self.next_pid += 1;
                let pid = self.next_pid;
                pending.extend(self.send(Event::Spawned { replica, pid }));
            }
        }
        // SIGKILL cannot be ignored: what was killed in the hostile phase has exited.
        for replica in std::mem::take(&mut self.killed) {
            if self.node.replicas.contains_key(&replica) {
                pending.extend(self.send(Event::Exited {
                    replica,
                    status: "signal: 9 (SIGKILL)".into(),
                }));
            }
        }
        while self.now < end {
            let step = if self.now.since(end - d) < Duration::from_secs(60) {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(5)
            };
            self.now = self.now + step;
            pending.extend(self.send(Event::Tick));
            let mut rounds = 0;
            while !pending.is_empty() && rounds < 50 {
                rounds += 1;
                let todo = std::mem::take(&mut pending);
                for a in todo {
                    let ev = match a {
                        Action::Spawn(spec) => {
                            self.next_pid += 1;
                            Event::Spawned {
                                replica: spec.replica,
                                pid: self.next_pid,
                            }
                        }
                        Action::Probe { replica, kind, .. } => {
                            if kind == ProbeKind::Warmup {
                                self.warmed.insert(replica.clone());
                            }
                            Event::Probed {
                                replica,
                                kind,
                                outcome: ProbeOutcome {
                                    ok: true,
                                    not_ready: false,
                                    detail: "HTTP 200".into(),
                                },
                            }
                        }
                        Action::Signal { replica, .. } => Event::Exited {
                            replica,
                            status: "exit status 0".into(),
                        },
                        Action::Scrape { replica, .. } => Event::Scraped {
                            replica,
                            outcome: Ok(ScrapedQueue::default()),
                        },
                        Action::ReadConfig { .. } => {
                            Event::ConfigRead(Err("prop.toml: -: not read".into()))
                        }
                        _ => continue,
                    };
                    pending.extend(self.send(ev));
                }
            }
        }
    }

    /// Routed ≥ min whenever capacity allows. Precisely: after the world has behaved for 15
    /// minutes, every model that is not removed (and the node not shutting down) has
    /// `routed >= min`, unless there is no room for one more replica of it: no free port in
    /// `daemon.ports` (replicas that ignore SIGTERM under a long `stop_grace`, or drain under a
    /// long `drain_timeout`, hold theirs), or the model says it waits for GPU room and the GPU
    /// table indeed cannot place one (cordons, other models' reservations), or the device the
    /// table places it on is still held by a replica stopping within its `stop_grace` (one start
    /// per device: a process that has not exited still holds its GPU memory).
    fn check_min_routed(&self) {
        if self.node.shutdown.is_some() {
            return;
        }
        for (name, m) in &self.node.models {
            if m.removed {
                continue;
            }
            let routed = self.node.count(name, ReplicaState::Routed);
            if routed >= m.min() {
                continue;
            }
            let spec = m.launch_spec();
            let no_port = self.node.ports.free() == 0;
            let no_gpu = m.no_capacity.is_some()
                && self
                    .node
                    .gpus
                    .place(&super::placement::Want::of(spec, &BTreeSet::new()))
                    .is_err();
            let stopping: BTreeSet<String> = self
                .node
                .replicas
                .values()
                .filter(|r| {
                    r.state == ReplicaState::Stopping && r.deadline.is_some_and(|d| d > self.now)
                })
                .flat_map(|r| r.gpus.iter().cloned())
                .collect();
            let held = self
                .node
                .gpus
                .place(&super::placement::Want::of(spec, &BTreeSet::new()))
                .is_ok_and(|p| p.devices.iter().any(|d| stopping.contains(d)));
            assert!(
                no_port || no_gpu || held,
                "{name}: {routed} routed, min {}, with room (free ports {}, waits for GPUs: {:?}); replicas: {:?}",
                m.min(),
                self.node.ports.free(),
                m.no_capacity,
                self.node
                    .replicas
                    .values()
                    .filter(|r| &r.model == name)
                    .map(|r| (r.id.to_string(), r.state, r.reason.clone()))
                    .collect::<Vec<_>>()
            );
        }
    }
}

fn cases() -> u32 {
    std::env::var("HEARTH_PROP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_core_keeps_its_books_and_its_promises_under_hostile_sequences(
        config in 0usize..7,
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let mut w = World::new(config);
        w.send(Event::Tick);
        for s in &steps {
            w.step(s);
        }
        // Reloads still out come back (an error), so the world can settle.
        if w.node.reloads_pending() {
            w.send(Event::ConfigRead(Err("prop.toml: -: gone".into())));
        }
        w.behave(Duration::from_secs(15 * 60));
        w.check_min_routed();
    }
}
