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
//! - a replica is routed only after a warm-up passed (one this test sent) by its process
//!   identity (its pid), in this run or in the run it was adopted from: the world restarts the
//!   node now and then (`Step::Restart`: a kill -9 or a hand-over, the same configuration or
//!   another) and hands the new node the old one's ledger, as the shell does once containment
//!   has proved each process; a routed replica with a process keeps its place across a restart
//!   of the same configuration, and none that was routed is stopped without a drain;
//! - the routed set a watcher last saw for each model is the one routed now;
//! - the replica table's indexes agree with its replicas;
//!
//! and after each sequence, once the world behaves (spawns succeed, warm-ups pass, signals end
//! processes) for 15 minutes: every model has at least `min` routed unless no replica of it can
//! be placed (no free port, or no GPU room that the GPU table confirms): see `check_min_routed`.
//!
//! `many.rs`: the same, where one event finds hundreds of replicas surplus or departing.
//!
//! Not sent: `Event::Inventory`, whose reordering of the GPU table is the GPU issue's (item 7).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;

mod apply;
mod inputs;
mod many;
mod restart;
mod sleep;
use inputs::{configs, step, Step};

use super::replica::Replica;
use super::*;
use crate::config::Config;
use crate::protocol::{Report, Request, Role, WarmPoolSetting, WatchEvent, WatchedState};

/// The world around the node: a virtual clock, a process table, what this test has told it.
struct World {
    node: Node,
    now: Time,
    configs: Vec<Config>,
    next_pid: u32,
    next_req: u64,
    /// Replicas whose warm-up this test passed, with the pid of their process then (None: a
    /// hostile step answered a warm-up before the process was known; it counts for the process
    /// that then appears). Kept across restarts: the same processes, adopted.
    warmed: BTreeSet<(ReplicaId, Option<u32>)>,
    /// Replicas sent SIGKILL: their process ends whatever the hostile steps did with the
    /// action, and the supervisor reports it (by `behave` at the latest).
    killed: BTreeSet<ReplicaId>,
    /// Spawns asked for and not yet answered: the supervisor always answers one, with a pid
    /// or a failure (by `behave` at the latest).
    unanswered: BTreeSet<ReplicaId>,
    /// The most replicas that can be alive: a port each, and pending ones at most `max` each.
    replica_bound: usize,
    /// The routed set last published for each model, as a watcher sees it.
    routed_seen: BTreeMap<String, Vec<crate::protocol::Endpoint>>,
    /// The most idle replicas (surplus, departing) of one model one event stopped.
    most_idle_stops: usize,
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
                .held
                .replicas()
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
    let ids: Vec<&ReplicaId> = w.node.held.replicas().keys().collect();
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
            routed_seen: BTreeMap::new(),
            most_idle_stops: 0,
        }
    }

    /// One event, and every property that must hold after it.
    fn send(&mut self, ev: Event) -> Vec<Action> {
        if let Event::Spawned { replica, .. } | Event::SpawnFailed { replica, .. } = &ev {
            self.unanswered.remove(replica);
        }
        let before = self.node.held.replicas().len();
        // Pending replicas, and the replicas already stopping.
        let pending_before: Vec<Replica> = self
            .node
            .held
            .replicas()
            .values()
            .filter(|r| r.state == ReplicaState::Pending)
            .cloned()
            .collect();
        let stopping_before: BTreeSet<ReplicaId> = self
            .node
            .held
            .replicas()
            .values()
            .filter(|r| r.state == ReplicaState::Stopping)
            .map(|r| r.id.clone())
            .collect();
        // The replica the event is about, which the event itself may end (a failed spawn of
        // one still pending, an exit): not a stop.
        let subject = match &ev {
            Event::Spawned { replica, .. }
            | Event::SpawnFailed { replica, .. }
            | Event::Exited { replica, .. }
            | Event::Probed { replica, .. }
            | Event::Scraped { replica, .. }
            | Event::Prefetch { replica, .. }
            | Event::PortBusy { replica, .. } => Some(replica.clone()),
            _ => None,
        };
        let is_drain = matches!(
            &ev,
            Event::Request {
                request: crate::protocol::Request::Drain { .. },
                ..
            }
        );
        let out = self.node.handle(ev, self.now);
        let after = self.node.held.replicas().len();
        // Bounded work: nothing a client sent sizes what one event does.
        assert!(
            after <= self.replica_bound,
            "{after} replicas alive; at most {} can be",
            self.replica_bound
        );
        // And what one event starts is a batch, whatever was asked (a `scale` to the whole
        // port range included): replicas created, processes spawned, routed ones unrouted.
        let batch = super::reconcile::STARTS_PER_EVENT as usize;
        let models = self.node.models.len().max(1);
        assert!(
            after.saturating_sub(before) <= batch * models,
            "{} replicas created by one event (batch {batch} × {models} models)",
            after - before
        );
        // And the stops of replicas that serve nothing, per model: surplus ones (a `scale` from
        // the whole range back down) and departing ones (a rollout, an evacuation); pending
        // ones, gone with the event, and the others, which say why they stop.
        let stop_batch = super::reconcile::STOPS_PER_EVENT as usize;
        let mut idle_stops: BTreeMap<&str, usize> = BTreeMap::new();
        let stopped = self
            .node
            .held
            .replicas()
            .values()
            .filter(|r| {
                r.state == ReplicaState::Stopping
                    && (*r.reason == *super::reconcile::SURPLUS
                        || *r.reason == *super::reconcile::DEPARTED)
            })
            .filter(|r| !stopping_before.contains(&r.id));
        let dropped = pending_before
            .iter()
            .filter(|r| !self.node.held.replicas().contains_key(&r.id))
            .filter(|r| subject.as_ref() != Some(&r.id));
        for r in stopped.chain(dropped) {
            *idle_stops.entry(&r.model).or_default() += 1;
        }
        let most = idle_stops.values().copied().max().unwrap_or(0);
        self.most_idle_stops = self.most_idle_stops.max(most);
        if self.node.shutdown.is_none() && !is_drain {
            assert!(
                most <= stop_batch,
                "idle replicas stopped by one event, per model: {idle_stops:?} (batch \
                 {stop_batch})"
            );
        }
        let spawns = out.iter().filter(|a| matches!(a, Action::Spawn(_))).count();
        assert!(
            spawns <= batch,
            "{spawns} spawns for one event (batch {batch})"
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
            let routed: Vec<&String> = match a {
                Action::Publish(WatchEvent::Replica {
                    replica,
                    state: WatchedState::State(ReplicaState::Routed),
                    ..
                }) => vec![replica],
                Action::Publish(WatchEvent::Routed { endpoints, .. }) => {
                    endpoints.iter().map(|e| &e.replica).collect()
                }
                _ => Vec::new(),
            };
            for replica in routed {
                assert!(
                    self.was_warmed(&ReplicaId(replica.clone())),
                    "{replica} routed without a warm-up passed by its process"
                );
            }
        }
        for a in &out {
            if let Action::Publish(WatchEvent::Routed { model, endpoints }) = a {
                self.routed_seen.insert(model.clone(), endpoints.clone());
            }
        }
        // Published only when it changed, and never stale.
        for name in self.node.models.keys() {
            assert_eq!(
                self.routed_seen.get(name),
                Some(&self.node.routed_endpoints(name)),
                "the routed set of {name} watchers saw"
            );
        }
        self.check_books();
        out
    }

    /// A warm-up passed for `id` now: by its process now.
    fn warm_passed(&mut self, id: &ReplicaId) {
        let pid = self.node.held.replicas().get(id).and_then(|r| r.pid);
        self.warmed.insert((id.clone(), pid));
    }

    /// A warm-up passed by `id`'s process (in this run, or in one it was adopted from).
    fn was_warmed(&self, id: &ReplicaId) -> bool {
        let pid = self.node.held.replicas().get(id).and_then(|r| r.pid);
        self.warmed.contains(&(id.clone(), pid)) || self.warmed.contains(&(id.clone(), None))
    }

    /// Ports and GPU reservations are exactly those of the live replicas; the replica table's
    /// indexes (by id, by model) agree with the replicas.
    fn check_books(&self) {
        let n = &self.node;
        if let Err(why) = n.held.check() {
            panic!("the reservations' books: {why}");
        }
        let mut ports = BTreeSet::new();
        for r in n.held.replicas().values() {
            match (r.state, r.port) {
                (ReplicaState::Pending, None) => {}
                (ReplicaState::Pending, Some(p)) => panic!("pending {} holds port {p}", r.id),
                (s, None) => panic!("{s} {} holds no port", r.id),
                (_, Some(p)) => assert!(ports.insert(p), "port {p} twice"),
            }
        }
        assert_eq!(&ports, n.held.ports().in_use(), "the port pool's books");
        for slot in &n.held.gpus().slots {
            let holders: Vec<&Replica> = n
                .held
                .replicas()
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
            // Never over-committed: placement, wakes and evictions keep within the device.
            let shared = holders.iter().all(|r| r.spec.gpu_memory.is_some());
            if shared {
                assert!(
                    slot.reserved <= slot.device.memory_total,
                    "{} reserved on {} of {}: {:?}",
                    slot.reserved,
                    slot.device.uuid,
                    slot.device.memory_total,
                    holders
                        .iter()
                        .map(|r| (r.id.to_string(), r.state, r.gpu_bytes))
                        .collect::<Vec<_>>()
                );
            }
        }
        // And host RAM: what sleeping replicas hold stays within `[daemon] host_memory`.
        if let Some(budget) = n.host_memory_budget() {
            let held = n.host_memory_held();
            assert!(
                held <= budget,
                "sleeping replicas hold {held} of host RAM, over the budget of {budget}"
            );
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

    /// The world behaves for a while: every spawn succeeds, every warm-up and probe passes,
    /// every signal ends its process, scrapes show an idle server, reloads read an error.
    fn behave(&mut self, d: Duration) {
        let end = self.now + d;
        let mut pending: Vec<Action> = Vec::new();
        for replica in std::mem::take(&mut self.unanswered) {
            if self.node.held.replicas().contains_key(&replica) {
                self.next_pid += 1;
                let pid = self.next_pid;
                pending.extend(self.send(Event::Spawned { replica, pid }));
            }
        }
        // SIGKILL cannot be ignored: what was killed in the hostile phase has exited.
        for replica in std::mem::take(&mut self.killed) {
            if self.node.held.replicas().contains_key(&replica) {
                pending.extend(self.send(Event::Exited {
                    replica,
                    status: crate::core::harness::KILLED,
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
                                self.warm_passed(&replica);
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
                            status: crate::core::ExitStatus::Code(0),
                        },
                        Action::Scrape { replica, .. } => Event::Scraped {
                            replica,
                            outcome: Ok(ScrapedQueue::default()),
                        },
                        Action::ReadConfig { .. } => Event::ConfigRead(Err(
                            crate::core::harness::refused("prop.toml", None, "-", "not read"),
                        )),
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
            // With `[model.sleep]`, `min` counts replicas awake or asleep, and the routed ones
            // are at least `routed_min` (none once idle or put to sleep for another model).
            // (A warm one kept awake where host RAM had no room for it to sleep counts too.)
            let asleep = if m.config.sleep.is_some() {
                self.node.count(name, ReplicaState::Sleeping)
                    + self.node.count(name, ReplicaState::Warm)
            } else {
                0
            };
            if routed >= m.routed_min() && routed + asleep >= m.min() {
                continue;
            }
            let spec = m.launch_spec();
            let no_port = self.node.held.ports().free() == 0;
            let no_gpu = m.no_capacity.is_some()
                && self
                    .node
                    .held
                    .gpus()
                    .place(&super::placement::Want::of(spec, &BTreeSet::new()))
                    .is_err();
            let stopping: BTreeSet<String> = self
                .node
                .held
                .replicas()
                .values()
                .filter(|r| {
                    r.state == ReplicaState::Stopping && r.deadline.is_some_and(|d| d > self.now)
                })
                .flat_map(|r| r.gpus.iter().cloned())
                .collect();
            let held = self
                .node
                .held
                .gpus()
                .place(&super::placement::Want::of(spec, &BTreeSet::new()))
                .is_ok_and(|p| p.devices.iter().any(|d| stopping.contains(d)));
            assert!(
                no_port || no_gpu || held,
                "{name}: {routed} routed, min {}, with room (free ports {}, waits for GPUs: {:?}); replicas: {:?}",
                m.min(),
                self.node.held.ports().free(),
                m.no_capacity,
                self.node
                    .held.replicas()
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

/// `steps` from a fresh world of configuration `config`, then the world settles: reloads still
/// out come back (an error), and 15 minutes pass with replicas behaving. Every event on the way
/// is checked (`World::send`); at rest, routed ≥ `min` wherever capacity allows.
fn run_to_rest(config: usize, steps: &[Step]) {
    let mut w = World::new(config);
    w.send(Event::Tick);
    for s in steps {
        w.step(s);
    }
    if w.node.reloads_pending() {
        w.send(Event::ConfigRead(Err(crate::core::harness::refused(
            "prop.toml",
            None,
            "-",
            "gone",
        ))));
    }
    w.behave(Duration::from_secs(15 * 60));
    w.check_min_routed();
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
        run_to_rest(config, &steps);
    }
}
