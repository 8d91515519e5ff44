//! hearth itself: the real `core::Node`, driven as the daemon's shell drives it, with virtual
//! time. The simulator carries no copy of the policy; what is measured is what runs.
//!
//! The shell's part, simulated:
//! - `Spawn` → the process exists at once (`Spawned`); its warm-up request succeeds once the cold
//!   start has elapsed since the spawn (the first warm-up probe is answered then — a real shell
//!   would see refusals until then, which only cost events).
//! - `Probe` (recheck, liveness) → succeeds after its `after`.
//! - `Signal` (TERM or KILL) → the process exits now (`Exited`); whatever it still had in flight
//!   is killed and counted. The core sends TERM to a draining replica only once its reports show
//!   no work, so a drain kills nothing unless `drain_timeout` runs out.
//! - `Publish(Routed)` → the router's routed set; a replica added to it receives traffic after
//!   the promotion delay, one removed from it receives nothing more at once.
//! - Every second, each routed and draining replica — and a warm one while it finishes work it
//!   held when it was unrouted — reports its own queue (`oldest_wait_ms`,
//!   `queue_depth` = waiting, `in_flight` = waiting + running, monotonic `arrived`/`completed`)
//!   through `Event::Request`, as a replica's server would on the socket. While no replica is
//!   routable and requests wait at the router, the router reports them model-wide. Behind
//!   `--router front-door` every report is the front door's, as `hearth route` sends them: each
//!   second the model's FIFO (oldest wait, depth, what runs, the counters) and, per replica,
//!   what it runs with no queue of its own, all marked with the door's name.
//! - `Event::Tick` every `daemon.tick`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::config::{Config, WarmPool};
use crate::core::{Action, Event, Node, Peer, ProbeKind, ProbeOutcome, ReplicaId, Time};
use crate::protocol::{ReplicaState, Report, Request, WatchEvent, WatchedState};

use super::engine::{Asleep, Driver, Ev, Router, Sim};
use super::Us;

/// The name the simulated front door reports under (`--router front-door`).
const FRONT_DOOR: &str = "sim-front-door";

pub struct HearthDriver {
    node: Node,
    model: String,
    tick: Us,
    by_id: BTreeMap<String, u32>,
    /// The core's last published state of each replica, by sim index.
    state: BTreeMap<u32, WatchedState>,
    routed: BTreeSet<u32>,
    /// Spawned while building the initial fleet: warm at once.
    prewarmed: BTreeSet<u32>,
    init: bool,
    next_request: u64,
    next_pid: u32,
    scale_actions: u64,
    /// `hearth` or `hearth-nopool`, for `--decisions`.
    label: &'static str,
    /// Warm replicas still finishing work they held when unrouted (they report until done).
    finishing: BTreeSet<u32>,
    /// Sleeping tier: replicas whose first sleep (or wake) request is still to be answered
    /// (it is answered after `fall_asleep` or `wake`; the later steps at once).
    to_fall_asleep: BTreeSet<u32>,
    to_wake: BTreeSet<u32>,
    /// `gpu_memory_asleep` ÷ `gpu_memory`, and `host_memory`, of the model's `[model.sleep]`.
    asleep_charge: f64,
    asleep_host_memory: u64,
}

/// The GPU memory a replica is taken to hold when its model does not say (an 80 GiB device).
const DEFAULT_GPU_MEMORY: u64 = 80 << 30;

/// What a sleeping replica of `m` costs. None: the model has no `[model.sleep]`.
pub(super) fn asleep(m: &crate::config::ModelConfig) -> Option<Asleep> {
    let s = m.sleep.as_ref()?;
    let whole = m.launch.gpu_memory.unwrap_or(DEFAULT_GPU_MEMORY).max(1);
    Some(Asleep {
        charge: (s.gpu_memory_asleep as f64 / whole as f64).min(1.0),
        host_memory: s.host_memory,
    })
}

/// A replica reports its queue every second, as a real server would while it serves (routed)
/// or finishes its work (draining), and a warm one while it finishes what it held when it left
/// the routed set (and once more when it has finished).
fn reports(s: &WatchedState, x: &super::cluster::Replica, finishing: bool) -> bool {
    x.alive()
        && match s {
            WatchedState::State(ReplicaState::Routed | ReplicaState::Draining) => true,
            WatchedState::State(ReplicaState::Warm) => x.in_flight() > 0 || finishing,
            _ => false,
        }
}

fn time(us: Us) -> Time {
    Time(Duration::from_micros(us))
}

impl HearthDriver {
    /// `config` holds the simulated model; `pool` false forces `warm_pool = 0` (hearth-nopool).
    pub fn new(mut config: Config, model: &str, pool: bool) -> HearthDriver {
        // The simulated host has room for every replica: placement is not what is measured.
        config.models.retain(|m| m.name == model);
        let (asleep_charge, asleep_host_memory) = config
            .models
            .first()
            .and_then(asleep)
            .map_or((1.0, 0), |a| (a.charge, a.host_memory));
        for m in &mut config.models {
            m.launch.gpus = 0;
            m.launch.gpu_memory = None;
            if !pool {
                m.scaling.warm_pool = WarmPool::Fixed(0);
            }
        }
        let tick = config.daemon.tick.as_micros().max(1) as Us;
        HearthDriver {
            node: Node::new(config, Vec::new(), BTreeMap::new(), Time::ZERO),
            model: model.to_string(),
            tick,
            by_id: BTreeMap::new(),
            state: BTreeMap::new(),
            routed: BTreeSet::new(),
            prewarmed: BTreeSet::new(),
            init: false,
            next_request: 1,
            next_pid: 1000,
            scale_actions: 0,
            label: if pool { "hearth" } else { "hearth-nopool" },
            finishing: BTreeSet::new(),
            to_fall_asleep: BTreeSet::new(),
            to_wake: BTreeSet::new(),
            asleep_charge,
            asleep_host_memory,
        }
    }

    /// Hands one event to the core and carries out what it asks, including the events that
    /// follow at the same instant.
    fn feed(&mut self, sim: &mut Sim, event: Event) {
        let mut queue = VecDeque::from([event]);
        while let Some(e) = queue.pop_front() {
            let actions = self.node.handle(e, time(sim.now));
            for a in actions {
                self.apply(sim, a, &mut queue);
            }
        }
    }

    fn ok() -> ProbeOutcome {
        ProbeOutcome {
            ok: true,
            not_ready: false,
            detail: "200 OK".into(),
        }
    }

    fn apply(&mut self, sim: &mut Sim, action: Action, queue: &mut VecDeque<Event>) {
        match action {
            Action::Spawn(spec) => {
                let r = sim.spawn(spec.replica.0.clone(), self.init);
                if self.init {
                    self.prewarmed.insert(r);
                }
                self.by_id.insert(spec.replica.0.clone(), r);
                self.next_pid += 1;
                queue.push_back(Event::Spawned {
                    replica: spec.replica,
                    pid: self.next_pid,
                });
            }
            Action::Probe {
                replica,
                kind,
                after,
                ..
            } => {
                let Some(&r) = self.by_id.get(&replica.0) else {
                    return;
                };
                let after = after.as_micros() as Us;
                let at = match kind {
                    ProbeKind::Warmup if self.prewarmed.contains(&r) => sim.now,
                    ProbeKind::Warmup => {
                        let ready = sim.cl.replicas[r as usize].spawned + sim.p.cold_start;
                        (sim.now + after).max(ready)
                    }
                    ProbeKind::Sleep if self.to_fall_asleep.remove(&r) => {
                        sim.now + after + sim.p.fall_asleep
                    }
                    ProbeKind::Wake if self.to_wake.remove(&r) => sim.now + after + sim.p.wake,
                    ProbeKind::Recheck
                    | ProbeKind::Liveness
                    | ProbeKind::Sleep
                    | ProbeKind::Wake
                    | ProbeKind::SleepState => sim.now + after,
                };
                if at == sim.now {
                    if kind == ProbeKind::Warmup {
                        sim.cl.replicas[r as usize].ready = Some(sim.now);
                    }
                    queue.push_back(Event::Probed {
                        replica,
                        kind,
                        outcome: Self::ok(),
                    });
                } else {
                    let k = match kind {
                        ProbeKind::Warmup => 0,
                        ProbeKind::Recheck => 1,
                        ProbeKind::Liveness => 2,
                        ProbeKind::Sleep => 3,
                        ProbeKind::Wake => 4,
                        ProbeKind::SleepState => 5,
                    };
                    sim.at(
                        at,
                        Ev::Probe {
                            replica: r,
                            kind: k,
                        },
                    );
                }
            }
            Action::Signal { replica, .. } => {
                let Some(&r) = self.by_id.get(&replica.0) else {
                    return;
                };
                if sim.cl.replicas[r as usize].alive() {
                    self.routed.remove(&r);
                    sim.exit(r);
                    queue.push_back(Event::Exited {
                        replica,
                        status: crate::core::ExitStatus::Code(0),
                    });
                }
            }
            Action::Publish(WatchEvent::Routed { endpoints, .. }) => {
                let now: BTreeSet<u32> = endpoints
                    .iter()
                    .filter_map(|e| self.by_id.get(&e.replica).copied())
                    .collect();
                for r in self.routed.difference(&now) {
                    sim.unroute(*r);
                }
                for r in now.difference(&self.routed) {
                    sim.route(*r, self.init);
                }
                self.routed = now;
            }
            Action::Publish(WatchEvent::Scale {
                from, to, reason, ..
            }) => {
                if sim.p.decisions {
                    eprintln!(
                        "{:>9.1} s  {:<14} {from} → {to}: {reason}",
                        sim.now as f64 / 1e6,
                        self.label
                    );
                }
                if sim.now >= sim.p.warmup {
                    self.scale_actions += 1;
                }
            }
            Action::Publish(WatchEvent::Replica { replica, state, .. }) => {
                if let Some(&r) = self.by_id.get(&replica) {
                    if matches!(
                        state,
                        WatchedState::State(ReplicaState::Draining | ReplicaState::Stopping)
                    ) {
                        sim.cl.replicas[r as usize].draining = true;
                    }
                    match state {
                        WatchedState::State(ReplicaState::FallingAsleep) => {
                            self.to_fall_asleep.insert(r);
                        }
                        WatchedState::State(ReplicaState::Waking) => {
                            self.to_wake.insert(r);
                        }
                        _ => {}
                    }
                    let asleep = state == WatchedState::State(ReplicaState::Sleeping);
                    sim.cl.set_asleep(r, asleep, sim.now);
                    self.state.insert(r, state);
                }
            }
            _ => {}
        }
    }

    fn report(&mut self, sim: &Sim, r: Option<u32>) -> Event {
        let now = sim.now;
        let (oldest, depth, in_flight, arrived, completed, replica) = match r {
            Some(r) => {
                let x = &sim.cl.replicas[r as usize];
                let oldest = x
                    .waiting
                    .front()
                    .map_or(0, |&q| now - sim.cl.reqs[q as usize].arrival);
                (
                    oldest,
                    x.waiting.len() as u64,
                    x.in_flight(),
                    Some(x.arrived),
                    Some(x.completed),
                    Some(x.name.clone()),
                )
            }
            None => {
                let q = &sim.cl.router_queue;
                let oldest = q
                    .front()
                    .map_or(0, |&q| now - sim.cl.reqs[q as usize].arrival);
                let depth = q.len() as u64;
                match sim.cl.router {
                    Router::Committed => (oldest, depth, depth, None, None, None),
                    // As `hearth route` reports: the model's whole queue, what it runs, and
                    // its counters.
                    Router::FrontDoor => {
                        let x = &sim.cl.replicas;
                        let running: u64 = x.iter().map(|x| x.running.len() as u64).sum();
                        let done: u64 = x.iter().map(|x| x.completed).sum();
                        let arrived = sim.cl.reqs.len() as u64;
                        (
                            oldest,
                            depth,
                            depth + running,
                            Some(arrived),
                            Some(done),
                            None,
                        )
                    }
                }
            }
        };
        let door = sim.cl.router == Router::FrontDoor;
        let model_wide = replica.is_none();
        self.next_request += 1;
        Event::Request {
            id: self.next_request,
            peer: Peer::trusted(),
            request: Request::Report(Report {
                model: self.model.clone(),
                replica,
                // A front door keeps no queue per replica: its replica reports carry none.
                oldest_wait_ms: (!door || model_wide).then(|| oldest as f64 / 1000.0),
                queue_depth: Some(depth),
                in_flight: Some(in_flight),
                arrived,
                completed,
                // Committed: replicas' own reports and a plain model-wide queue report, none a
                // front door's. FrontDoor: all of them are the door's, as `hearth route` marks
                // them, so they supersede everything else for the model.
                router: door.then(|| FRONT_DOOR.to_string()),
            }),
        }
    }
}

impl Driver for HearthDriver {
    fn init(&mut self, sim: &mut Sim) {
        sim.cl.asleep_charge = self.asleep_charge;
        sim.cl.asleep_host_memory = self.asleep_host_memory;
        self.init = true;
        self.feed(sim, Event::Tick);
        self.init = false;
    }

    fn tick_period(&self) -> Option<Us> {
        Some(self.tick)
    }

    fn on_tick(&mut self, sim: &mut Sim) {
        self.feed(sim, Event::Tick);
    }

    fn on_second(&mut self, sim: &mut Sim) {
        let reporting: Vec<u32> = self
            .state
            .iter()
            .filter(|(r, s)| {
                reports(
                    s,
                    &sim.cl.replicas[**r as usize],
                    self.finishing.contains(r),
                )
            })
            .map(|(r, _)| *r)
            .collect();
        for r in reporting {
            // An earlier report this second may have stopped it.
            let x = &sim.cl.replicas[r as usize];
            let still = self
                .state
                .get(&r)
                .is_some_and(|s| reports(s, x, self.finishing.contains(&r)));
            if x.in_flight() > 0
                && self
                    .state
                    .get(&r)
                    .is_some_and(|s| *s == WatchedState::State(ReplicaState::Warm))
            {
                self.finishing.insert(r);
            } else {
                self.finishing.remove(&r);
            }
            if still {
                let ev = self.report(sim, Some(r));
                self.feed(sim, ev);
            }
        }
        let none_routable = !sim.cl.replicas.iter().any(|x| x.routable && x.alive());
        let door = sim.cl.router == Router::FrontDoor;
        if door || (none_routable && !sim.cl.router_queue.is_empty()) {
            let ev = self.report(sim, None);
            self.feed(sim, ev);
        }
    }

    fn on_event(&mut self, sim: &mut Sim, ev: Ev) {
        if let Ev::Probe { replica, kind } = ev {
            let x = &sim.cl.replicas[replica as usize];
            if !x.alive() {
                return;
            }
            let kind = match kind {
                0 => ProbeKind::Warmup,
                1 => ProbeKind::Recheck,
                3 => ProbeKind::Sleep,
                4 => ProbeKind::Wake,
                5 => ProbeKind::SleepState,
                _ => ProbeKind::Liveness,
            };
            if kind == ProbeKind::Warmup {
                sim.cl.replicas[replica as usize].ready = Some(sim.now);
            }
            let id = ReplicaId(sim.cl.replicas[replica as usize].name.clone());
            self.feed(
                sim,
                Event::Probed {
                    replica: id,
                    kind,
                    outcome: Self::ok(),
                },
            );
        }
    }

    fn on_idle(&mut self, _sim: &mut Sim, _r: u32) {
        // The core learns it from the replica's next report, as the daemon would.
    }

    fn scale_actions(&self) -> u64 {
        self.scale_actions
    }
}
