//! The oracle's plan replayed through the same engine as every policy: what it reports is what
//! the replay measured, not what the planner predicted. A replica kept between uses for longer
//! than a sleep and a wake sleeps through the gap where the model has `[model.sleep]` (billed
//! in full while it falls asleep and wakes, at its `asleep` charge between), woken one wake time
//! before it is routed again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::engine::{Asleep, Driver, Ev, Params, Sim};
use super::oracle::{plan, Plan};
use super::workload::Workload;
use super::Us;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Spawn {
        id: u32,
    },
    /// `may_sleep`: the plan let it sleep through the gap before this route (the exit before
    /// it counted against the host-memory budget).
    Route {
        id: u32,
        may_sleep: bool,
    },
    Unroute {
        id: u32,
    },
    /// A kept replica's sleep request is answered: asleep from now.
    Asleep {
        r: u32,
    },
    /// Its wake request goes out: billed in full from now.
    Wake {
        r: u32,
    },
}

/// Replays the plan through the engine.
pub struct OracleDriver {
    actions: Vec<(Us, Act)>,
    min: u32,
    /// Planner id → the simulated replica.
    replica: BTreeMap<u32, u32>,
    /// Simulated replica → planner id.
    id_of: BTreeMap<u32, u32>,
    /// How many routes each planner id still has ahead: it is kept until then.
    routes_ahead: BTreeMap<u32, u32>,
    /// When each planner id's routes ahead take place, soonest first, and whether it may sleep
    /// before each.
    route_times: BTreeMap<u32, VecDeque<(Us, bool)>>,
    /// Simulated replicas whose sleep through a gap is under way (asleep or about to be).
    sleeping: BTreeSet<u32>,
    /// What a sleeping replica costs, `fall_asleep` and `wake` of the run (where the model has
    /// `[model.sleep]`).
    sleep: Option<(Asleep, Us, Us)>,
    scale_actions: u64,
    planned_misses: u64,
}

impl OracleDriver {
    /// Plans the run with one `hold` and builds its replay.
    pub fn new(w: &Workload, p: &Params, hold: Us) -> OracleDriver {
        let (log, misses) = plan(w, p, hold);
        let mut d = OracleDriver::from_plan(&log, p);
        d.planned_misses = misses;
        d
    }

    /// Requests (all of them, before the warm-up too) the planner expected to wait longer than
    /// the target: the replay should measure the same.
    pub fn planned_misses(&self) -> u64 {
        self.planned_misses
    }

    fn from_plan(log: &[(Us, Plan)], p: &Params) -> OracleDriver {
        let mut actions = Vec::new();
        let mut routes_ahead: BTreeMap<u32, u32> = BTreeMap::new();
        // The mark of each planner id's last exit, until the route that ends its gap takes it.
        // A route that follows no exit may sleep only where nothing bounds the sleepers: the
        // replay then sleeps wherever it did before the budget existed.
        let mut exit_mark: BTreeMap<u32, bool> = BTreeMap::new();
        let unbounded = p.max_asleep.is_none();
        for &(at, plan) in log {
            match plan {
                Plan::New { id } => {
                    // Spawned one cold start (and the promotion delay) before it must serve.
                    let spawn = at.saturating_sub(p.promotion + p.cold_start);
                    let route = at.saturating_sub(p.promotion).max(spawn + p.cold_start);
                    actions.push((spawn, Act::Spawn { id }));
                    let may_sleep = exit_mark.remove(&id).unwrap_or(unbounded);
                    actions.push((route, Act::Route { id, may_sleep }));
                    *routes_ahead.entry(id).or_default() += 1;
                }
                Plan::Reroute { id } => {
                    let may_sleep = exit_mark.remove(&id).unwrap_or(unbounded);
                    let route = at.saturating_sub(p.promotion);
                    actions.push((route, Act::Route { id, may_sleep }));
                    *routes_ahead.entry(id).or_default() += 1;
                }
                Plan::Unroute { id } => actions.push((at, Act::Unroute { id })),
                // The replay stops a replica when it has drained, unless it is routed again.
                Plan::Exit { id, may_sleep } => {
                    exit_mark.insert(id, may_sleep);
                }
            }
        }
        // Stable: at one instant, spawns, routes and unroutes keep the plan's order.
        actions.sort_by_key(|a| a.0);
        let mut route_times: BTreeMap<u32, VecDeque<(Us, bool)>> = BTreeMap::new();
        for &(t, a) in &actions {
            if let Act::Route { id, may_sleep } = a {
                route_times.entry(id).or_default().push_back((t, may_sleep));
            }
        }
        OracleDriver {
            actions,
            min: p.min.min(p.max),
            replica: BTreeMap::new(),
            id_of: BTreeMap::new(),
            routes_ahead,
            route_times,
            sleeping: BTreeSet::new(),
            sleep: p
                .asleep
                .filter(|a| (0.0..1.0).contains(&a.charge))
                .map(|a| (a, p.fall_asleep, p.wake)),
            scale_actions: 0,
            planned_misses: 0,
        }
    }

    fn spawn(&mut self, sim: &mut Sim, id: u32, prewarmed: bool) -> u32 {
        let r = sim.spawn(format!("oracle-{id}"), prewarmed);
        self.replica.insert(id, r);
        self.id_of.insert(r, id);
        r
    }

    /// Stops `r` if it has no work and is not to be routed again; one that is, with a gap
    /// longer than a sleep and a wake before then, sleeps through it (where the model sleeps
    /// and the plan's budget let it).
    fn maybe_exit(&mut self, sim: &mut Sim, r: u32) {
        let id = self.id_of[&r];
        let x = &sim.cl.replicas[r as usize];
        if x.routed || x.in_flight() != 0 {
            return;
        }
        if self.routes_ahead.get(&id).copied().unwrap_or(0) == 0 {
            sim.exit(r);
            return;
        }
        let Some((_, fall, wake)) = self.sleep else {
            return;
        };
        let next = self.route_times.get(&id).and_then(|t| t.front()).copied();
        let next = next.filter(|&(_, may_sleep)| may_sleep).map(|(t, _)| t);
        if let Some(next) = next.filter(|t| *t > sim.now + fall + wake) {
            if self.sleeping.insert(r) {
                self.at(sim, sim.now + fall, Act::Asleep { r });
                self.at(sim, next - wake, Act::Wake { r });
            }
        }
    }

    /// An action of the replay's own, beside the plan's.
    fn at(&mut self, sim: &mut Sim, t: Us, act: Act) {
        self.actions.push((t, act));
        let i = (self.actions.len() - 1) as u32;
        sim.at(t, Ev::Timer { id: i });
    }
}

impl Driver for OracleDriver {
    fn init(&mut self, sim: &mut Sim) {
        if let Some((a, _, _)) = self.sleep {
            sim.cl.asleep_charge = a.charge;
            sim.cl.asleep_host_memory = a.host_memory;
        }
        for id in 0..self.min {
            let r = self.spawn(sim, id, true);
            sim.cl.replicas[r as usize].ready = Some(0);
            sim.route(r, true);
        }
        for (i, &(t, _)) in self.actions.iter().enumerate() {
            sim.at(t, Ev::Timer { id: i as u32 });
        }
    }

    fn tick_period(&self) -> Option<Us> {
        None
    }

    fn on_tick(&mut self, _sim: &mut Sim) {}

    fn on_second(&mut self, _sim: &mut Sim) {}

    fn on_event(&mut self, sim: &mut Sim, ev: Ev) {
        let Ev::Timer { id: i } = ev else {
            return;
        };
        let counted = u64::from(sim.now >= sim.p.warmup);
        match self.actions[i as usize].1 {
            Act::Spawn { id } => {
                self.spawn(sim, id, false);
            }
            Act::Route { id, .. } => {
                let Some(&r) = self.replica.get(&id) else {
                    return;
                };
                if let Some(n) = self.routes_ahead.get_mut(&id) {
                    *n = n.saturating_sub(1);
                }
                if let Some(t) = self.route_times.get_mut(&id) {
                    t.pop_front();
                }
                let x = &mut sim.cl.replicas[r as usize];
                if !x.alive() {
                    return;
                }
                x.ready.get_or_insert(sim.now);
                x.draining = false;
                sim.route(r, false);
                self.scale_actions += counted;
            }
            Act::Unroute { id } => {
                let Some(&r) = self.replica.get(&id) else {
                    return;
                };
                sim.unroute(r);
                sim.cl.replicas[r as usize].draining = true;
                self.maybe_exit(sim, r);
                self.scale_actions += counted;
            }
            Act::Asleep { r } => sim.cl.set_asleep(r, true, sim.now),
            Act::Wake { r } => {
                sim.cl.set_asleep(r, false, sim.now);
                self.sleeping.remove(&r);
            }
        }
    }

    fn on_idle(&mut self, sim: &mut Sim, r: u32) {
        self.maybe_exit(sim, r);
    }

    fn scale_actions(&self) -> u64 {
        self.scale_actions
    }
}
