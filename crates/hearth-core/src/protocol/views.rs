//! What the daemon shows: the STATUS view (`status`, `gpus`, the metrics) and watch events, with
//! the states they carry. The core builds them; the CLI, the metrics and the systemd status line
//! read them; nobody parses a state out of a string.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{wire_name, WarmPoolSetting};

/// A replica's lifecycle state (docs/design.md: `pending → starting → warm ⇄ routed →
/// draining`, plus `stopping`: signalled, waiting for the process to exit; and for a model with
/// `[model.sleep]`, `warm → falling_asleep → sleeping → waking → warm`: docs/sleep.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Waiting for GPU room, a port, or the restart back-off. No process.
    Pending,
    /// Process spawned (or being spawned); warm-up not yet passed.
    Starting,
    /// Warm-up passed; ready but not routed.
    Warm,
    /// In the routed set.
    Routed,
    /// Unrouted, finishing in-flight work.
    Draining,
    /// Signalled to stop; waiting for the process to exit. Still holds its port and GPUs.
    Stopping,
    /// Being put to sleep: its sleep requests are under way (nothing is in flight on it).
    FallingAsleep,
    /// Asleep: its process, port and devices kept, its memory released; woken on demand.
    Sleeping,
    /// Being woken: its wake requests, then the warm-up, under way.
    Waking,
}

impl fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&wire_name(self))
    }
}

/// A replica's state as a watch event gives it: a lifecycle state, or `"gone"` once the replica
/// is forgotten (its process exited, or it never had one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WatchedState {
    State(ReplicaState),
    Gone(GoneTag),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GoneTag {
    Gone,
}

impl WatchedState {
    pub const GONE: WatchedState = WatchedState::Gone(GoneTag::Gone);
}

impl From<ReplicaState> for WatchedState {
    fn from(s: ReplicaState) -> Self {
        WatchedState::State(s)
    }
}

/// A model's health in status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Ok,
    /// Replicas keep failing: restarts back off, and status says the last failure.
    CrashLoop,
    /// Pending replicas cannot be placed on the GPUs.
    NoCapacity,
    /// Nothing serves the model and nothing is on its way: no replica is routed or warm, and
    /// its last try to get one ready did not succeed (a failure, a port held by another
    /// process, no port left), so none will be routed until something changes. Status says
    /// what stopped the last try and what the replicas wait for.
    Unavailable,
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&wire_name(self))
    }
}

// ---- STATUS ----------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    pub models: Vec<ModelView>,
    pub gpus: Vec<GpuView>,
    /// The daemon itself: its version, its configuration file, its last upgrade (boxed: an
    /// answer is moved whole through the connection's queue).
    #[serde(default)]
    pub daemon: Box<super::DaemonView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    pub name: String,
    pub version: String,
    pub health: Health,
    /// Why the model is not ok (last failure, what placement lacks); empty when ok.
    #[serde(default)]
    pub health_reason: String,
    pub routed: u32,
    pub warm: u32,
    pub starting: u32,
    pub pending: u32,
    pub draining: u32,
    /// Replicas asleep, and those on their way there (draining or falling asleep).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sleeping: u32,
    /// Replicas being woken.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waking: u32,
    pub desired_routed: u32,
    #[serde(default)]
    pub desired_warm: u32,
    pub min: u32,
    pub max: u32,
    /// a count, or "auto"
    pub warm_pool: WarmPoolSetting,
    pub target_wait_ms: u64,
    /// `[[model]] slots`: requests one replica serves at once (absent before it: one).
    #[serde(default = "one_slot")]
    pub slots: u32,
    pub signal: SignalView,
    pub last_scale: Option<ScaleView>,
    /// A rollout under way or halted; None when every replica runs the configuration.
    #[serde(default)]
    pub rollout: Option<RolloutView>,
    /// spawn → warm of the latest cold start, when measured
    #[serde(default)]
    pub time_to_ready_ms: Option<u64>,
    /// A model with `[model.sleep]`: its wake times (first wake request → warm-up passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<WakeView>,
    /// Replicas that failed (exited, failed a probe, never warmed) since the daemon started,
    /// each replaced after its back-off; `hearth_replica_restarts_total` in the metrics.
    #[serde(default)]
    pub restarts_total: u64,
    /// An operator drained the model off this host (`hearth drain --model`): front doors
    /// answer balancers `drain` for it; its replicas keep running.
    #[serde(default)]
    pub drained: bool,
    /// Its replicas that gave way to other models (put to sleep, or stopped, for their starts
    /// or wakes: docs/sleep.md, "More models than GPUs") since the daemon started.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub gave_way_total: u64,
    /// Why the last of them did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_gave_way: Option<String>,
    /// A burst that recurs, foreseen (`[model.scaling] forecast`; docs/autoscaling.md,
    /// "Recurring load"): absent while no period holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<ForecastView>,
    pub replicas: Vec<ReplicaView>,
}

/// The next burst of a model's recurring load, as its autoscaler foresees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastView {
    /// The mean interval between the bursts that agreed.
    pub period_ms: u64,
    /// Bursts that agreed on it.
    pub seen: u32,
    /// Until the earliest the next burst is due.
    pub due_in_ms: u64,
    /// The arrival rate those bursts reached (requests per second).
    pub level_per_s: f64,
    /// Routed replicas that level needs.
    pub replicas: u32,
    /// They are held now, for the burst.
    pub holding: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// A model's measured wake times, over its recent wakes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WakeView {
    /// Wakes that passed their warm-up since the daemon started.
    pub wakes: u64,
    /// Wakes that failed or timed out (each stopped its replica).
    pub failed: u64,
    pub last_ms: Option<u64>,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
}

/// A change of what a model's replicas are (command, env, warm-up, version…) being rolled out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutView {
    /// The version being rolled out.
    pub version: String,
    /// The version serving before it.
    pub from: String,
    /// Routed replicas already of the new configuration.
    pub updated: u32,
    /// Why the rollout halted, when it did: the new version failed to warm up, and the previous
    /// one keeps serving until the configuration changes again.
    #[serde(default)]
    pub halted: Option<String>,
}

impl fmt::Display for RolloutView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.halted {
            Some(why) => f.write_str(why),
            None => write!(
                f,
                "rolling out version {} (from {}): {} routed replica(s) updated",
                self.version, self.from, self.updated
            ),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SignalView {
    pub oldest_wait_ms: Option<f64>,
    pub queue_depth: Option<u64>,
    pub in_flight: Option<u64>,
    /// age of the newest report in use; None when there is no fresh signal
    pub age_ms: Option<u64>,
    /// A front door whose reports are the signal now (the first of `routers` by name); None:
    /// replicas' own reports, scrapes or other reporters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<String>,
    /// Every front door whose reports are combined into the signal now, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleView {
    pub at_ms: u64,
    pub from: u32,
    pub to: u32,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaView {
    // The strings a replica keeps for its life (id, address, version, reason) are shared with
    // the core's replica, not copied: a status of a thousand replicas on the daemon's loop
    // would otherwise allocate four thousand strings. On the wire they are plain strings.
    pub id: Arc<str>,
    pub state: ReplicaState,
    pub pid: Option<u32>,
    pub port: Option<u16>,
    pub addr: Option<Arc<str>>,
    pub gpus: Vec<String>,
    pub since_ms: u64,
    pub restarts: u32,
    pub version: Arc<str>,
    /// What the replica is waiting for or why it is leaving; empty when nothing to say.
    #[serde(default)]
    pub reason: Arc<str>,
    /// Resident memory of the replica's processes, in bytes (its cgroup's `memory.current`
    /// where the memory controller is on, else the sum over its processes); null when unknown.
    #[serde(default)]
    pub rss_bytes: Option<u64>,
    /// CPU time its processes used so far, user and system, in seconds (the cgroup's
    /// `cpu.stat`, else the sum over its processes); null when unknown.
    #[serde(default)]
    pub cpu_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_reserved: u64,
    pub healthy: bool,
    pub cordoned: bool,
    pub replicas: Vec<String>,
    /// Memory in use on the device by every process, as NVML last said; null without NVML.
    #[serde(default)]
    pub memory_used: Option<u64>,
    /// The part of `memory_used` that hearth's replicas do not account for (other users of the
    /// GPU); it is not capacity. Null until NVML has reported.
    #[serde(default)]
    pub memory_foreign: Option<u64>,
    /// Why the device is unhealthy or cordoned (the XID, the operator's reason), if it is.
    #[serde(default)]
    pub note: Option<String>,
    /// The NUMA node the device hangs off (`numa<N>`, from the kernel); null if unknown.
    #[serde(default)]
    pub topology: Option<String>,
    /// Memory the driver and firmware set aside (NVML's `reserved`): never capacity. Null until
    /// NVML has reported.
    #[serde(default)]
    pub memory_driver_reserved: Option<u64>,
    /// For a MIG instance, the UUID of the GPU it is a slice of; null for a whole GPU.
    #[serde(default)]
    pub mig_parent: Option<String>,
    /// UUIDs of the devices NVML says this one reaches over NVLink.
    #[serde(default)]
    pub nvlink: Vec<String>,
    /// Those of `replicas` that are asleep: each holds its `[model.sleep] gpu_memory_asleep`
    /// here, not its `gpu_memory`.
    #[serde(default)]
    pub asleep: Vec<String>,
}

// ---- WATCH -----------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub replica: String,
    pub addr: String,
    /// Requests the replica serves at once (`[[model]] slots`); a front door never sends more.
    /// This daemon always says; None only from a daemon before it (the reader's own
    /// configuration then decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
}

fn one_slot() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEvent {
    Routed {
        model: String,
        endpoints: Vec<Endpoint>,
    },
    Replica {
        model: String,
        replica: String,
        state: WatchedState,
    },
    Scale {
        model: String,
        from: u32,
        to: u32,
        reason: String,
    },
    Gpu {
        uuid: String,
        healthy: bool,
        cordoned: bool,
    },
    /// What a front door tells balancers beyond the routed set (docs/fleet.md): whether an
    /// operator drained the model (`hearth drain --model`), and the capacity it can add in
    /// milliseconds (warm replicas to promote) or at all (`can_start`: room under `max` and
    /// nothing that stops a start). Sent in the snapshot and on every change.
    Capacity {
        model: String,
        drained: bool,
        max: u32,
        warm: u32,
        can_start: bool,
        /// Replicas asleep or on their way there (`[model.sleep]`): capacity a wake adds in
        /// seconds. Absent from a daemon before the sleeping tier: none.
        #[serde(default, skip_serializing_if = "is_zero")]
        asleep: u32,
    },
}

impl WatchEvent {
    /// The model an event is about; None for host-wide events, which every watcher gets.
    pub fn model(&self) -> Option<&str> {
        match self {
            WatchEvent::Routed { model, .. }
            | WatchEvent::Replica { model, .. }
            | WatchEvent::Scale { model, .. }
            | WatchEvent::Capacity { model, .. } => Some(model),
            WatchEvent::Gpu { .. } => None,
        }
    }
}
