//! The oracle's plan replayed through the same engine as every policy: what it reports is what
//! the replay measured, not what the planner predicted.

use std::collections::BTreeMap;

use super::engine::{Driver, Ev, Params, Sim};
use super::oracle::{plan, Plan};
use super::workload::Workload;
use super::Us;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Spawn { id: u32 },
    Route { id: u32 },
    Unroute { id: u32 },
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
        for &(at, plan) in log {
            match plan {
                Plan::New { id } => {
                    // Spawned one cold start (and the promotion delay) before it must serve.
                    let spawn = at.saturating_sub(p.promotion + p.cold_start);
                    let route = at.saturating_sub(p.promotion).max(spawn + p.cold_start);
                    actions.push((spawn, Act::Spawn { id }));
                    actions.push((route, Act::Route { id }));
                    *routes_ahead.entry(id).or_default() += 1;
                }
                Plan::Reroute { id } => {
                    actions.push((at.saturating_sub(p.promotion), Act::Route { id }));
                    *routes_ahead.entry(id).or_default() += 1;
                }
                Plan::Unroute { id } => actions.push((at, Act::Unroute { id })),
                // The replay stops a replica when it has drained, unless it is routed again.
                Plan::Exit { .. } => {}
            }
        }
        // Stable: at one instant, spawns, routes and unroutes keep the plan's order.
        actions.sort_by_key(|a| a.0);
        OracleDriver {
            actions,
            min: p.min.min(p.max),
            replica: BTreeMap::new(),
            id_of: BTreeMap::new(),
            routes_ahead,
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

    /// Stops `r` if it has no work and is not to be routed again.
    fn maybe_exit(&mut self, sim: &mut Sim, r: u32) {
        let id = self.id_of[&r];
        let x = &sim.cl.replicas[r as usize];
        if !x.routed && x.in_flight() == 0 && self.routes_ahead.get(&id).copied().unwrap_or(0) == 0
        {
            sim.exit(r);
        }
    }
}

impl Driver for OracleDriver {
    fn init(&mut self, sim: &mut Sim) {
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
            Act::Route { id } => {
                let Some(&r) = self.replica.get(&id) else {
                    return;
                };
                if let Some(n) = self.routes_ahead.get_mut(&id) {
                    *n = n.saturating_sub(1);
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
        }
    }

    fn on_idle(&mut self, sim: &mut Sim, r: u32) {
        self.maybe_exit(sim, r);
    }

    fn scale_actions(&self) -> u64 {
        self.scale_actions
    }
}
