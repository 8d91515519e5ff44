//! The anchors hearth is measured against: published autoscalers with their published defaults,
//! one per file, each naming its source. They have no warm pool; they get the model's `min` and
//! `max`, and a target in their own terms (see `Targets`). All of them drive the same replica and
//! queue model as hearth through a `Deployment`: a replica count that the platform reconciles by
//! starting replicas (cold start, then ready, then routed after the promotion delay) or
//! terminating them.
//!
//! Scale-down, as the platforms do it:
//! - Which replica goes: not-ready (still starting) replicas first, then the most recently ready.
//!   Kubernetes' ReplicaSet controller ranks pods for deletion that way (unscheduled < pending <
//!   not ready < ready; then shorter time ready first — `controller.ActivePodsWithRanks`, used by
//!   the HPA, Knative and Cortex deployments); Ray Serve stops replicas that are not RUNNING
//!   first, then newer ones (`DeploymentScheduler._get_replicas_to_stop`).
//! - What happens to its work: it leaves the routed set at once and gets SIGTERM; a model server
//!   stops accepting and finishes what it holds (running and queued). It exits when that is done,
//!   or at the end of its grace period, when whatever is left is killed (counted in `killed`).
//!   Grace periods: Kubernetes' default `terminationGracePeriodSeconds` 30 s (HPA); Knative sets
//!   it to the revision's `timeoutSeconds`, default 300 s; Cortex sets 60 s
//!   (`_terminationGracePeriodSeconds` in its realtime API specs); Ray Serve waits
//!   `graceful_shutdown_timeout_s`, default 20 s.

pub mod cortex;
pub mod fixed;
pub mod hpa;
pub mod kpa;
pub mod ray;

use super::engine::{Driver, Ev, Sim};
use super::{Us, SEC};

/// A replica count reconciled by the platform.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// The count asked for (a Deployment's `spec.replicas`, Ray's target).
    pub desired: u32,
    /// SIGTERM → SIGKILL.
    pub grace: Us,
    /// Replicas not terminating and not gone (starting or ready), in creation order.
    pub live: Vec<u32>,
    next_name: u64,
}

impl Deployment {
    pub fn new(grace: Us) -> Deployment {
        Deployment {
            desired: 0,
            grace,
            live: Vec::new(),
            next_name: 1,
        }
    }

    fn start_one(&mut self, sim: &mut Sim, prewarmed: bool) {
        let r = sim.spawn(format!("pod-{}", self.next_name), prewarmed);
        self.next_name += 1;
        self.live.push(r);
        if prewarmed {
            sim.cl.replicas[r as usize].ready = Some(sim.now);
            sim.route(r, true);
        } else {
            let at = sim.now + sim.p.cold_start;
            sim.at(at, Ev::Ready { replica: r });
        }
    }

    /// The initial fleet: `n` replicas, ready and routed at t = 0.
    pub fn init(&mut self, sim: &mut Sim, n: u32) {
        self.desired = n;
        for _ in 0..n {
            self.start_one(sim, true);
        }
    }

    pub fn is_ready(sim: &Sim, r: u32) -> bool {
        sim.cl.replicas[r as usize].ready.is_some()
    }

    /// Live replicas that are ready.
    pub fn ready(&self, sim: &Sim) -> impl Iterator<Item = u32> + '_ {
        let ready: Vec<u32> = self
            .live
            .iter()
            .copied()
            .filter(|&r| Self::is_ready(sim, r))
            .collect();
        ready.into_iter()
    }

    pub fn ready_count(&self, sim: &Sim) -> u32 {
        self.live
            .iter()
            .filter(|&&r| Self::is_ready(sim, r))
            .count() as u32
    }

    /// Sets the replica count; starts or terminates replicas to match.
    pub fn scale_to(&mut self, sim: &mut Sim, n: u32) {
        self.desired = n;
        while (self.live.len() as u32) < n {
            self.start_one(sim, false);
        }
        while (self.live.len() as u32) > n {
            let victim = self.victim(sim);
            self.live.retain(|&r| r != victim);
            self.terminate(sim, victim);
        }
    }

    /// Not-ready replicas first (newest first), then the most recently ready.
    fn victim(&self, sim: &Sim) -> u32 {
        *self
            .live
            .iter()
            .max_by_key(|&&r| {
                let x = &sim.cl.replicas[r as usize];
                (x.ready.is_none(), x.ready.unwrap_or(0), r)
            })
            .expect("a live replica")
    }

    fn terminate(&mut self, sim: &mut Sim, r: u32) {
        sim.unroute(r);
        let x = &mut sim.cl.replicas[r as usize];
        x.draining = true;
        if x.in_flight() == 0 {
            sim.exit(r);
        } else {
            let at = sim.now + self.grace;
            sim.at(at, Ev::GraceEnd { replica: r });
        }
    }

    /// A starting replica finished its cold start.
    pub fn on_ready(&mut self, sim: &mut Sim, r: u32) {
        if !self.live.contains(&r) || !sim.cl.replicas[r as usize].alive() {
            return;
        }
        sim.cl.replicas[r as usize].ready = Some(sim.now);
        sim.route(r, false);
    }
}

/// A baseline's decision rule.
pub trait Baseline {
    /// Its control period (sync period, tick).
    fn period(&self) -> Us;
    /// Called every virtual second, for metric collection.
    fn on_second(&mut self, _sim: &Sim, _dep: &Deployment) {}
    /// Called every period: the new replica count, if it changes anything.
    fn decide(&mut self, sim: &Sim, dep: &Deployment) -> Option<u32>;
}

/// Runs a `Baseline` over a `Deployment`.
pub struct BaselineDriver<B: Baseline> {
    pub rule: B,
    pub dep: Deployment,
    min: u32,
    scale_actions: u64,
}

impl<B: Baseline> BaselineDriver<B> {
    pub fn new(rule: B, grace: Us, min: u32) -> Self {
        BaselineDriver {
            rule,
            dep: Deployment::new(grace),
            min,
            scale_actions: 0,
        }
    }
}

impl<B: Baseline> Driver for BaselineDriver<B> {
    fn init(&mut self, sim: &mut Sim) {
        self.dep.init(sim, self.min);
    }

    fn tick_period(&self) -> Option<Us> {
        Some(self.rule.period())
    }

    fn on_tick(&mut self, sim: &mut Sim) {
        if let Some(n) = self.rule.decide(sim, &self.dep) {
            if n != self.dep.desired {
                if sim.now >= sim.p.warmup {
                    self.scale_actions += 1;
                }
                self.dep.scale_to(sim, n);
            }
        }
    }

    fn on_second(&mut self, sim: &mut Sim) {
        self.rule.on_second(sim, &self.dep);
    }

    fn on_event(&mut self, sim: &mut Sim, ev: Ev) {
        match ev {
            Ev::Ready { replica } => self.dep.on_ready(sim, replica),
            Ev::GraceEnd { replica } => sim.exit(replica),
            _ => {}
        }
    }

    fn on_idle(&mut self, sim: &mut Sim, r: u32) {
        // A terminating server exits once it has finished what it held.
        sim.exit(r);
    }

    fn scale_actions(&self) -> u64 {
        self.scale_actions
    }
}

/// What the baselines aim at, in their own terms, from the model's settings.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    pub concurrency: u32,
    /// `[model.scaling] target_wait`, seconds.
    pub target_wait_s: f64,
    /// Mean service time of the workload, seconds (what a load test would have measured).
    pub mean_service_s: f64,
}

impl Targets {
    /// Little's law per replica: a replica completes μ = C / E[S] requests per second, so a
    /// queue wait of W corresponds to μ × W requests waiting (L_q = λ W_q at saturation).
    pub fn queue_depth_per_replica(&self) -> f64 {
        let mu = self.concurrency as f64 / self.mean_service_s.max(1e-6);
        (mu * self.target_wait_s).max(0.001)
    }
}

/// Whole seconds, for the periods below.
pub const fn secs(s: u64) -> Us {
    s * SEC
}
