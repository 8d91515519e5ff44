//! One replica and its lifecycle states.

use std::fmt;
use std::sync::Arc;

use super::event::{QueueTime, Usage};
use super::queue_signal::ReplicaSignal;
use super::Time;
use crate::config::LaunchSpec;
pub use crate::protocol::ReplicaState;

/// `MODEL-N`, N increasing for the daemon's life.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaId(pub String);

impl ReplicaId {
    pub fn new(model: &str, n: u64) -> Self {
        ReplicaId(format!("{model}-{n}"))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone)]
pub struct Replica {
    pub id: ReplicaId,
    /// `id`, shared with the status views (which would otherwise copy every replica's id on
    /// the daemon's loop). The table keeps it equal to `id` (`Replicas::insert`).
    pub shown_id: Arc<str>,
    /// The N of `MODEL-N`: creation order within the model.
    pub n: u64,
    pub model: String,
    /// `spec.version`, for views (shared with them).
    pub version: Arc<str>,
    /// What it was made from: it belongs to a configuration whose launch spec is `==` to this.
    pub spec: Arc<LaunchSpec>,
    /// It passed its warm-up once. A replica is one process for its whole life (its pid is set
    /// once, when it is spawned or adopted): this is a warm-up passed by that process identity,
    /// in this run or in the run it was adopted from (its record says so).
    pub ever_warm: bool,
    /// Taken over from an earlier run of the daemon (core/adopt.rs), not started by this one.
    pub adopted: bool,
    /// Adopted from a run in which it was routed: it gets its place back first.
    pub was_routed: bool,
    /// Adopted after an unplanned death while routed: it kept its place, and its warm-up is
    /// re-verifying it (adopt_roles.rs). Not promotable until that passes.
    pub reverifying: bool,
    pub state: ReplicaState,
    /// When it entered `state`.
    pub since: Time,
    /// The number of the event (`Node::events`) in which it entered `state`.
    pub since_event: u64,
    pub created: Time,
    /// When the process was asked for (Starting); time-to-ready is measured from here.
    pub spawned_at: Option<Time>,
    pub pid: Option<u32>,
    /// Written through `set_port`, which keeps `shown_addr` with it.
    pub port: Option<u16>,
    /// `127.0.0.1:port` while it has a port, shared with the status views.
    pub shown_addr: Option<Arc<str>>,
    /// UUIDs of the devices it holds.
    pub gpus: Vec<String>,
    /// Bytes reserved on each of `gpus`.
    pub gpu_bytes: u64,
    /// Failed predecessors in this replica's line.
    pub restarts: u32,
    /// Why it waits / why it is leaving, for status (shared with the views).
    pub reason: Arc<str>,
    /// A probe attempt is out; don't send another.
    pub probe_in_flight: bool,
    /// The next liveness probe (routed) or recheck (warm) is due at.
    pub next_probe: Time,
    /// Failed probes in a row (liveness, or recheck).
    pub probe_failures: u32,
    pub last_probe_error: String,
    /// Draining or stopping: when to give up waiting (drain → stop; stop → SIGKILL).
    pub deadline: Option<Time>,
    /// SIGKILL already sent.
    pub killed: bool,
    /// An operator asked to drain it while that would have taken routed below `min`: it leaves
    /// (as a departing replica) once a replacement is routed.
    pub drain_asked: bool,
    /// Counts as a failure when it exits (it was stopped because it failed).
    pub failed: bool,
    pub signal: ReplicaSignal,
    /// Scraping the server's metrics: next due, one out, failing (logged once per episode).
    pub scrape_next: Time,
    pub scrape_in_flight: bool,
    pub scrape_failing: bool,
    /// Giving way to another model that needs its GPUs (that model's name): stopping, or on
    /// its way to sleep (cleared once asleep).
    pub reclaimed_for: Option<String>,
    /// GPU memory its processes hold, per device UUID, as NVML last said (None: the driver
    /// would not say for one of its processes).
    pub gpu_used: std::collections::BTreeMap<String, Option<u64>>,
    /// An overrun of the declared `gpu_memory` was logged (once per episode).
    pub overrun_warned: bool,
    /// Requests the scrapes saw waiting, oldest first: (the earliest they can have arrived,
    /// how many). Bounds the oldest wait of servers that do not say it.
    pub queue_cohorts: std::collections::VecDeque<(Time, u64)>,
    /// The previous successful scrape.
    pub last_scraped: Option<Time>,
    /// The queue-time totals of the last scrape that had them.
    pub scraped_queue_time: Option<QueueTime>,
    /// Memory and CPU of its processes, as the shell last sampled them.
    pub usage: Usage,
    /// Draining to sleep rather than to stop (`[model.sleep]`): once nothing is in flight.
    pub then_sleep: bool,
    /// Falling asleep or waking: the index of the request whose answer is awaited next.
    pub sleep_step: usize,
    /// Waking since (the first wake request): its wake time is measured from here.
    pub wake_started: Option<Time>,
    /// Asleep and wanted awake, since when it has found no room on its devices and nothing
    /// there that could give way (sleep.rs: past a cold start's time, it is replaced).
    pub no_room_since: Option<Time>,
}

impl Replica {
    pub fn new(model: &str, n: u64, spec: Arc<LaunchSpec>, now: Time, restarts: u32) -> Self {
        Replica {
            id: ReplicaId::new(model, n),
            shown_id: Arc::from(format!("{model}-{n}")),
            n,
            model: model.to_string(),
            version: Arc::from(spec.version.as_str()),
            spec,
            ever_warm: false,
            adopted: false,
            was_routed: false,
            reverifying: false,
            state: ReplicaState::Pending,
            since: now,
            since_event: 0,
            created: now,
            spawned_at: None,
            pid: None,
            port: None,
            shown_addr: None,
            gpus: Vec::new(),
            gpu_bytes: 0,
            restarts,
            reason: Arc::default(),
            probe_in_flight: false,
            next_probe: now,
            probe_failures: 0,
            last_probe_error: String::new(),
            deadline: None,
            killed: false,
            drain_asked: false,
            failed: false,
            signal: ReplicaSignal::default(),
            scrape_next: now,
            scrape_in_flight: false,
            scrape_failing: false,
            queue_cohorts: Default::default(),
            last_scraped: None,
            reclaimed_for: None,
            gpu_used: Default::default(),
            overrun_warned: false,
            scraped_queue_time: None,
            usage: Usage::default(),
            then_sleep: false,
            sleep_step: 0,
            wake_started: None,
            no_room_since: None,
        }
    }

    pub fn addr(&self) -> Option<String> {
        self.shown_addr.as_deref().map(str::to_string)
    }

    /// Gives it `port` (or takes its port away), with the address views show.
    pub fn set_port(&mut self, port: Option<u16>) {
        if self.port != port || self.shown_addr.is_none() != port.is_none() {
            self.shown_addr = port.map(|p| Arc::from(addr(p)));
        }
        self.port = port;
    }

    /// Warm and not under suspicion: safe to hand traffic to.
    pub fn promotable(&self) -> bool {
        self.state == ReplicaState::Warm && self.probe_failures == 0 && !self.reverifying
    }
}

/// `127.0.0.1:port`, in one allocation of the right size.
pub(super) fn addr(port: u16) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(15);
    s.push_str("127.0.0.1:");
    let _ = write!(s, "{port}");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn addr_is_what_replica_addr_says() {
        for port in [0, 1, 9, 10, 99, 100, 8080, 30000, 65535] {
            assert_eq!(super::addr(port), format!("127.0.0.1:{port}"));
        }
    }
}
