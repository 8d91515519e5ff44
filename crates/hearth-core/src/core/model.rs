//! Per-model state: its configuration, operator overrides, failure history and restart back-off,
//! the model-wide signal and the autoscaler's memory.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::policy::Autoscaler;
use super::queue_signal::ReplicaSignal;
use super::Time;
use crate::config::{LaunchSpec, ModelConfig, WarmPool};

/// Failures counted for back-off and crash-loop detection are the ones this recent.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(600);
/// This many failures in the window is a crash loop.
pub const CRASH_LOOP_FAILURES: usize = 5;
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// `hearth scale` overrides, kept in state_dir across restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool: Option<crate::protocol::WarmPoolSetting>,
    /// `hearth drain --model`: kept with the scale overrides so that a restart or an upgrade
    /// of the daemon does not put the model back in the balancers' rotation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drained: bool,
}

impl Overrides {
    pub fn is_empty(&self) -> bool {
        self.min.is_none() && self.max.is_none() && self.warm_pool.is_none() && !self.drained
    }
}

/// A change of what a replica is (its [`LaunchSpec`]) being rolled out. The autoscaler keeps
/// owning the count; the rollout owns only which version fills it.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// The configuration serving before the change.
    pub previous: ModelConfig,
    /// `previous.launch`, shared with the replicas made from it.
    pub previous_spec: Arc<LaunchSpec>,
    /// New-version replicas that failed before ever becoming warm.
    pub failures: u32,
    /// Latched: the new version cannot warm up; the previous one keeps serving until the
    /// configuration changes again.
    pub halted: Option<String>,
}

/// New-version replicas that may fail to warm up before a rollout halts.
pub const ROLLOUT_FAILURES: u32 = 3;

#[derive(Debug, Clone)]
pub struct ScaleRecord {
    pub at: Time,
    pub from: u32,
    pub to: u32,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct ModelState {
    pub config: ModelConfig,
    /// `config.launch`, shared with the replicas made from it. Which replicas those are is
    /// decided by `==` on the spec, never by where it came from.
    pub spec: Arc<LaunchSpec>,
    pub rollout: Option<Rollout>,
    pub overrides: Overrides,
    /// N of the next replica id.
    pub next_n: u64,
    pub failures: VecDeque<Time>,
    pub total_restarts: u64,
    pub last_failure: String,
    pub backoff_until: Time,
    /// Why pending replicas cannot be placed, when GPUs are the reason.
    pub no_capacity: Option<String>,
    /// What stopped the model's last try to get a replica ready (a failure, a port held by
    /// another process, no port left), until one of its replicas passes a warm-up. With
    /// nothing routed or warm, it makes the model `unavailable` (status.rs).
    pub stalled: Option<String>,
    pub desired_routed: u32,
    pub last_scale: Option<ScaleRecord>,
    /// Reports without a replica (from a router).
    pub model_wide: ReplicaSignal,
    /// The front doors reporting for the model (see `front_door.rs`).
    pub front_doors: super::front_doors::FrontDoors,
    pub autoscaler: Autoscaler,
    /// Spawn → warm of the latest cold start.
    pub time_to_ready: Option<Duration>,
    /// Removed from the configuration: its replicas drain away, then it is forgotten.
    pub removed: bool,
    /// Set while its surplus stops are unfinished (more than a batch were due in one event):
    /// how many of its pending replicas, the oldest, the pending pass may still place. The
    /// others are surplus the next events stop; starting them meanwhile would be waste.
    pub placeable_pending: Option<u32>,
    /// `[model.sleep]`: its measured wakes (sleep_tier.rs).
    pub wakes: super::sleep_tier::WakeTimes,
    /// The most replicas it needed lately, which a sleeping tier keeps (sleep_tier.rs).
    pub needed: super::sleep_tier::Peaks,
    /// `idle_to_sleep` passed with no work: nothing is kept routed or warm (every replica
    /// sleeps) until work arrives (sleep_tier.rs).
    pub idle_asleep: bool,
    /// Its last routed replica was put to sleep to make room for another model (reclaim.rs): as
    /// under `idle_asleep`, nothing is kept routed, and only a request that waits for it (a
    /// queue, or work in flight) wakes it, not the arrival rate left from before, which would
    /// send the two models back and forth.
    pub evicted: bool,
    /// Its replicas that gave way to other models (reclaim.rs), and why the last did.
    pub gave_way: u64,
    pub last_gave_way: Option<String>,
}

impl ModelState {
    pub fn new(config: ModelConfig, overrides: Overrides, now: Time) -> Self {
        let mut m = ModelState {
            spec: Arc::new(config.launch.clone()),
            rollout: None,
            config,
            overrides,
            next_n: 1,
            failures: VecDeque::new(),
            total_restarts: 0,
            last_failure: String::new(),
            backoff_until: now,
            no_capacity: None,
            stalled: None,
            desired_routed: 0,
            last_scale: None,
            model_wide: ReplicaSignal::default(),
            front_doors: Default::default(),
            autoscaler: Autoscaler::default(),
            time_to_ready: None,
            removed: false,
            placeable_pending: None,
            wakes: Default::default(),
            needed: Default::default(),
            idle_asleep: false,
            evicted: false,
            gave_way: 0,
            last_gave_way: None,
        };
        m.desired_routed = m.routed_min();
        m
    }

    /// The configuration new replicas are made from: the new one, unless its rollout halted.
    pub fn launch_config(&self) -> &ModelConfig {
        match &self.rollout {
            Some(r) if r.halted.is_some() => &r.previous,
            _ => &self.config,
        }
    }

    /// `launch_config().launch`, to hand to new replicas.
    pub fn launch_spec(&self) -> &Arc<LaunchSpec> {
        match &self.rollout {
            Some(r) if r.halted.is_some() => &r.previous_spec,
            _ => &self.spec,
        }
    }

    /// The configuration a replica made from `spec` follows: the previous one for a replica of
    /// the version a rollout is replacing, else the current one.
    pub fn config_of(&self, spec: &Arc<LaunchSpec>) -> &ModelConfig {
        match &self.rollout {
            // `==` on the specs (the same allocation answers at once).
            Some(r) if r.previous_spec == *spec => &r.previous,
            _ => &self.config,
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn min(&self) -> u32 {
        let min = self.overrides.min.unwrap_or(self.config.scaling.min);
        min.min(self.max())
    }

    /// The least the model keeps routed. With `[model.sleep]`, `min` counts replicas awake or
    /// asleep, and one routed replica (none at `min = 0`) is what stays awake.
    pub fn routed_min(&self) -> u32 {
        match self.config.sleep {
            Some(_) if self.idle_asleep => 0,
            Some(_) => self.min().min(1),
            None => self.min(),
        }
    }

    pub fn max(&self) -> u32 {
        self.overrides.max.unwrap_or(self.config.scaling.max)
    }

    pub fn warm_pool_setting(&self) -> WarmPool {
        use crate::protocol::WarmPoolSetting;
        match self.overrides.warm_pool {
            Some(WarmPoolSetting::Count(n)) => WarmPool::Fixed(n),
            Some(WarmPoolSetting::Auto(_)) => WarmPool::Auto,
            None => self.config.scaling.warm_pool,
        }
    }

    /// Failures in the window, after forgetting older ones.
    pub fn recent_failures(&mut self, now: Time) -> usize {
        while let Some(&t) = self.failures.front() {
            if now.since(t) > FAILURE_WINDOW {
                self.failures.pop_front();
            } else {
                break;
            }
        }
        self.failures.len()
    }

    /// Records a failed replica; the next spawn waits 1 s doubling per recent failure, up to 5 min.
    pub fn record_failure(&mut self, now: Time, why: &str) -> Duration {
        self.failures.push_back(now);
        self.total_restarts += 1;
        self.last_failure = why.to_string();
        self.stalled = Some(why.to_string());
        let n = self.recent_failures(now) as u32;
        let backoff = BACKOFF_FIRST
            .checked_mul(1u32 << (n.saturating_sub(1)).min(16))
            .unwrap_or(BACKOFF_MAX)
            .min(BACKOFF_MAX);
        self.backoff_until = now + backoff;
        backoff
    }

    pub fn crash_looping(&self) -> bool {
        self.failures.len() >= CRASH_LOOP_FAILURES
    }
}
