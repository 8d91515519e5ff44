//! The discrete-event engine: virtual time in microseconds, one event queue, the arrivals of the
//! workload, and a `Driver` — hearth's real core, or a baseline — that decides capacity.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub use super::cluster::Router;
use super::cluster::{Cluster, Starts};
use super::workload::Workload;
use super::{Us, SEC};

/// What may happen at an instant, besides arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ev {
    /// A request's service ends.
    Complete { req: u32 },
    /// The promotion delay of a routed replica has passed: the router may use it.
    Routable { replica: u32, epoch: u32 },
    /// A cold start finished (baselines: the pod turns ready).
    Ready { replica: u32 },
    /// A probe the core asked for answers (hearth): 0 warm-up, 1 recheck, 2 liveness.
    Probe { replica: u32, kind: u8 },
    /// A terminating replica's grace period ends (baselines).
    GraceEnd { replica: u32 },
    /// The driver's own periodic timer (hearth: `daemon.tick`; a baseline: its sync period).
    Tick,
    /// Every virtual second: reports, metric samples, the time series.
    Second,
    /// A driver's own timer (the oracle's schedule), by the driver's index.
    Timer { id: u32 },
}

/// Added to the order of every event but those `Sim::at` takes first at their instant.
const LATER: u64 = 1 << 63;

/// Fixed parameters of a run.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub concurrency: u32,
    pub cold_start: Us,
    pub promotion: Us,
    pub warmup: Us,
    pub target_wait: Us,
    pub min: u32,
    pub max: u32,
    /// Print hearth's scale decisions (time, from → to, reason) to stderr as they happen.
    pub decisions: bool,
    /// A sleeping replica's wake: first wake request → answered (models with `[model.sleep]`).
    pub wake: Us,
    /// Falling asleep: first sleep request → answered.
    pub fall_asleep: Us,
    /// What a sleeping replica costs, where the model has `[model.sleep]`: the oracle may then
    /// keep replicas asleep between uses, as hearth may.
    pub asleep: Option<Asleep>,
    /// The most replicas the oracle keeps asleep at once: `[daemon] host_memory` (or
    /// `--host-memory`) ÷ the model's `[model.sleep] host_memory`, as hearth's core bounds its
    /// own. None: not bounded (no budget, or sleepers that hold no host memory).
    pub max_asleep: Option<u32>,
    /// How arrivals reach replicas (`--router`).
    pub router: Router,
}

/// A sleeping replica's bill: `gpu_memory_asleep` ÷ `gpu_memory` of a replica-second, and the
/// host memory it holds (bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Asleep {
    pub charge: f64,
    pub host_memory: u64,
}

/// How many replicas may sleep at once under a host-memory budget: as many whole sleepers as
/// it holds. None: not bounded (no budget, no sleeping tier, or sleepers that hold nothing).
pub fn max_asleep(budget: Option<u64>, asleep: Option<Asleep>) -> Option<u32> {
    let each = asleep?.host_memory;
    let budget = budget?;
    (each > 0).then(|| u32::try_from(budget / each).unwrap_or(u32::MAX))
}

/// One point of the per-second time series (for plots).
#[derive(Debug, Clone, Copy, Default)]
pub struct Point {
    /// Replicas holding a GPU.
    pub holding: u32,
    /// Replicas receiving traffic.
    pub routable: u32,
    /// Oldest wait anywhere, µs.
    pub oldest: Us,
}

pub struct Sim {
    pub now: Us,
    pub p: Params,
    pub cl: Cluster,
    heap: BinaryHeap<Reverse<(Us, u64, Ev)>>,
    seq: u64,
    /// Replicas started after the warm-up instant (their cold starts count).
    pub cold_starts: u64,
    pub series: Vec<Point>,
}

impl Sim {
    pub fn at(&mut self, t: Us, ev: Ev) {
        self.seq += 1;
        // Behind the front door, a replica that becomes routable at an instant takes the waiting
        // requests before the slots freed at that same instant do (they go to the next ones),
        // as the oracle's planner orders a step: otherwise ties of whole-second starts and
        // services would hand the same requests to other replicas than the plan expects.
        let first = self.p.router == Router::FrontDoor && matches!(ev, Ev::Routable { .. });
        let order = if first { self.seq } else { LATER | self.seq };
        self.heap.push(Reverse((t.max(self.now), order, ev)));
    }

    fn schedule_starts(&mut self, starts: Starts) {
        for (q, t) in starts {
            self.at(t, Ev::Complete { req: q });
        }
    }

    /// A new replica process. `prewarmed`: part of the initial fleet, ready at once (no cold
    /// start counted); otherwise its cold start counts if it begins after the warm-up.
    pub fn spawn(&mut self, name: String, prewarmed: bool) -> u32 {
        if !prewarmed && self.now >= self.p.warmup {
            self.cold_starts += 1;
        }
        self.cl.spawn(name, self.now)
    }

    /// Adds `r` to the routed set; the router uses it after the promotion delay (or at once).
    pub fn route(&mut self, r: u32, immediately: bool) {
        let epoch = self.cl.set_routed(r);
        if immediately || self.p.promotion == 0 {
            let mut starts = Vec::new();
            self.cl.set_routable(r, self.now, &mut starts);
            self.schedule_starts(starts);
        } else {
            self.at(
                self.now + self.p.promotion,
                Ev::Routable { replica: r, epoch },
            );
        }
    }

    pub fn unroute(&mut self, r: u32) {
        self.cl.unroute(r);
    }

    /// The replica's process is gone; in-flight work dies with it.
    pub fn exit(&mut self, r: u32) {
        self.cl.exit(r, self.now);
    }
}

/// A capacity policy driven through the replica model.
pub trait Driver {
    /// Creates the initial fleet at t = 0 (`min` routed replicas, plus hearth's pool).
    fn init(&mut self, sim: &mut Sim);
    /// The period of `Ev::Tick`, if the driver wants one.
    fn tick_period(&self) -> Option<Us>;
    fn on_tick(&mut self, sim: &mut Sim);
    /// Every virtual second (after the series point is taken).
    fn on_second(&mut self, sim: &mut Sim);
    /// `Ready`, `Probe`, `GraceEnd` and `Timer` events.
    fn on_event(&mut self, sim: &mut Sim, ev: Ev);
    /// A draining replica has no work left.
    fn on_idle(&mut self, sim: &mut Sim, r: u32);
    /// Scale decisions taken after the warm-up instant.
    fn scale_actions(&self) -> u64;
}

/// Everything a run leaves behind for the report.
pub struct Outcome {
    pub cl: Cluster,
    pub cold_starts: u64,
    pub scale_actions: u64,
    pub series: Vec<Point>,
    pub end: Us,
}

/// Simulation continues past the horizon until every request has been served (or killed), but
/// never longer than this.
const MAX_OVERRUN: Us = 24 * 3600 * SEC;

/// Replays `w` against `driver`.
pub fn run(driver: &mut dyn Driver, w: &Workload, p: Params) -> Outcome {
    let mut sim = Sim {
        now: 0,
        p,
        cl: Cluster::new(p.concurrency, p.router),
        heap: BinaryHeap::new(),
        seq: 0,
        cold_starts: 0,
        series: Vec::with_capacity((w.horizon / SEC) as usize + 2),
    };
    sim.cl.reqs.reserve(w.requests.len());
    driver.init(&mut sim);
    let tick = driver.tick_period();
    if let Some(period) = tick {
        sim.at(period, Ev::Tick);
    }
    sim.at(SEC, Ev::Second);
    let mut next = 0usize;
    let mut starts: Starts = Vec::new();
    loop {
        let arrival = w.requests.get(next).map(|r| r.t);
        let event = sim.heap.peek().map(|Reverse((t, _, _))| *t);
        let take_event = match (arrival, event) {
            (Some(a), Some(e)) => e <= a,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (None, None) => break,
        };
        if !take_event {
            let r = w.requests[next];
            next += 1;
            sim.now = r.t;
            let q = sim.cl.new_request(r.t, r.service);
            sim.cl.arrive(q, sim.now, &mut starts);
            sim.schedule_starts(std::mem::take(&mut starts));
            continue;
        }
        let Reverse((t, _, ev)) = sim.heap.pop().expect("peeked");
        if matches!(ev, Ev::Second)
            && t >= w.horizon
            && next >= w.requests.len()
            && sim.cl.unresolved == 0
            && sim.cl.replicas.iter().all(|x| x.running.is_empty())
        {
            sim.now = t;
            break;
        }
        if t > w.horizon + MAX_OVERRUN {
            sim.now = t;
            break;
        }
        sim.now = t;
        match ev {
            Ev::Complete { req } => {
                if let Some(r) = sim.cl.complete(req, t, &mut starts) {
                    sim.schedule_starts(std::mem::take(&mut starts));
                    let x = &sim.cl.replicas[r as usize];
                    if x.draining && x.alive() && x.in_flight() == 0 {
                        driver.on_idle(&mut sim, r);
                    }
                }
            }
            Ev::Routable { replica, epoch } => {
                if sim.cl.replicas[replica as usize].epoch == epoch {
                    sim.cl.set_routable(replica, t, &mut starts);
                    sim.schedule_starts(std::mem::take(&mut starts));
                }
            }
            Ev::Tick => {
                driver.on_tick(&mut sim);
                if let Some(period) = tick {
                    sim.at(t + period, Ev::Tick);
                }
            }
            Ev::Second => {
                let point = Point {
                    holding: sim.cl.holding(),
                    routable: sim
                        .cl
                        .replicas
                        .iter()
                        .filter(|x| x.routable && x.alive())
                        .count() as u32,
                    oldest: sim.cl.oldest_wait(t),
                };
                sim.series.push(point);
                driver.on_second(&mut sim);
                sim.at(t + SEC, Ev::Second);
            }
            other => driver.on_event(&mut sim, other),
        }
    }
    Outcome {
        end: sim.now,
        cold_starts: sim.cold_starts,
        scale_actions: driver.scale_actions(),
        series: sim.series,
        cl: sim.cl,
    }
}
