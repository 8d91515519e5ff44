//! What the world tells the core (events) and what the core asks of the world (actions).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::exit::{ExitStatus, SpawnError};
use super::gpu::GpuDevice;
use super::model::Overrides;
use super::replica::ReplicaId;
use super::xid::RecoveryAction;
use crate::config::{Config, ConfigError, ScrapeFormat};
use crate::protocol::{Answer, Request, Role, WatchEvent};

/// Ties a control request to its answer; chosen by the shell.
pub type RequestId = u64;

/// Who is on the other end of a control connection, as the shell resolved it from SO_PEERCRED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub pid: Option<u32>,
    /// The peer's process group: a replica's processes share the group its leader created.
    pub pgid: Option<u32>,
    /// The replica whose cgroup or scope holds the peer, as the shell's containment found it
    /// (none where replicas have no cgroup: then the process group tells).
    pub replica: Option<ReplicaId>,
    pub role: Role,
}

impl Peer {
    /// The daemon talking to itself, or a test: every right.
    pub fn trusted() -> Peer {
        Peer {
            uid: 0,
            pid: None,
            pgid: None,
            replica: None,
            role: Role::Admin,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// The readiness request of a starting replica.
    Warmup,
    /// The same request, repeated on a warm replica so the pool never holds a rotten one.
    Recheck,
    /// The cheap probe of a routed replica.
    Liveness,
    /// One of the requests that put a replica to sleep (`[model.sleep] sleep`, in order).
    Sleep,
    /// One of the requests that wake it (`[model.sleep] wake`, in order; the warm-up follows).
    Wake,
    /// The request that says whether it sleeps (`[model.sleep] state`): while it falls asleep,
    /// and as a sleeping replica's health check.
    SleepState,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOutcome {
    pub ok: bool,
    /// The server did not answer at all (refused, reset, timed out) or said it is still loading
    /// (503): normal while a replica starts, so the next attempt comes sooner.
    pub not_ready: bool,
    /// What went wrong, or the status line when ok.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSpec {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
    pub expect_status: u16,
    /// Any 2xx answer passes, not only `expect_status`: sleep and wake requests.
    pub accept_2xx: bool,
    pub expect_body: Option<String>,
    pub timeout: Duration,
    /// Before a passing answer counts, the shell checks that the process listening on the
    /// URL's port belongs to the replica (its cgroup, or its process group where there is no
    /// cgroup): an orphan of an earlier run, or any other squatter, never passes.
    pub verify_owner: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpawnSpec {
    pub replica: ReplicaId,
    pub model: String,
    pub command: Vec<String>,
    /// Variables to set on top of the daemon's environment (which the shell filters).
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    pub port: u16,
    pub gpus: Vec<String>,
    /// The model's `stop_grace`: the backstop the shell's containment gives a stop it makes
    /// without the core (a systemd scope stopped by an operator).
    pub stop_grace: Duration,
}

/// What a replica's processes use, read from its cgroup (or summed over its processes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Resident memory, in bytes; None when unknown.
    pub rss_bytes: Option<u64>,
    /// CPU time used so far, user and system, in seconds; None when unknown.
    pub cpu_seconds: Option<f64>,
}

/// One reading of a device by the GPU monitor.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    pub uuid: String,
    /// Memory allocated on the device by every process (NVML's `used`, which leaves out the
    /// driver's reserve).
    pub used: u64,
    /// Memory the driver and firmware set aside.
    pub driver_reserved: u64,
    /// The compute processes on the device, as the driver lists them.
    pub processes: Vec<GpuProcess>,
    /// The device's recovery action, where the driver reports one.
    pub recovery: Option<RecoveryAction>,
}

/// A process on a GPU and what the shell could find out about whose it is.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    /// Bytes it holds on the device; None where the driver would not say ("Unavailable": MIG
    /// without privilege, another PID namespace).
    pub bytes: Option<u64>,
    /// The replica whose cgroup holds it, where replicas have cgroups.
    pub replica: Option<ReplicaId>,
    /// Processes that may have started it, nearest first: itself, its process group, its
    /// parents, its session. The first that is a replica's leader makes it that replica's.
    pub leaders: Vec<u32>,
}

/// What a scrape of a model server's own metrics says about its queue.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ScrapedQueue {
    pub queue_depth: u64,
    pub in_flight: u64,
    /// The server's own measure of queue wait, where it has one; otherwise the core bounds the
    /// oldest wait by how long the queue has been non-empty, tightened by FIFO departures
    /// (see `oldest_wait_bound` in scrape.rs).
    pub oldest_wait_ms: Option<f64>,
    /// Cumulative queue time of the requests that have left the queue, where the server counts
    /// it (a queue-time histogram's `_sum`/`_count`, or a queue-duration counter and a request
    /// counter). The core turns two scrapes of it into the mean wait of the requests that
    /// started service in between.
    pub queue_time: Option<QueueTime>,
    pub arrived: Option<u64>,
    pub completed: Option<u64>,
}

impl ScrapedQueue {
    /// Within the bounds a report is held to (`protocol::MAX_QUEUE` and the others beside it):
    /// a server's metrics are numbers from outside, and nobody is there to refuse them to, so
    /// they are clamped. A wait that is not a finite number ≥ 0 is no wait.
    pub fn bounded(self) -> ScrapedQueue {
        use crate::protocol::{MAX_COUNTER, MAX_QUEUE, MAX_WAIT_MS};
        let wait = |w: f64| (w.is_finite() && w >= 0.0).then(|| w.min(MAX_WAIT_MS));
        ScrapedQueue {
            queue_depth: self.queue_depth.min(MAX_QUEUE),
            in_flight: self.in_flight.min(MAX_QUEUE),
            oldest_wait_ms: self.oldest_wait_ms.and_then(wait),
            queue_time: self.queue_time.and_then(|t| {
                (t.total_ms.is_finite() && t.total_ms >= 0.0).then_some(QueueTime {
                    total_ms: t.total_ms.min(MAX_WAIT_MS * MAX_COUNTER as f64),
                    count: t.count.min(MAX_COUNTER),
                })
            }),
            arrived: self.arrived.map(|v| v.min(MAX_COUNTER)),
            completed: self.completed.map(|v| v.min(MAX_COUNTER)),
        }
    }
}

/// Monotonic totals over the requests that have left a server's queue.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QueueTime {
    /// Their queue time, added up, in milliseconds.
    pub total_ms: f64,
    /// How many they are.
    pub count: u64,
}

impl QueueTime {
    /// Mean queue time of the requests that left the queue between `earlier` and `self`; none
    /// when none left, or when the totals went backwards (the server restarted).
    pub fn mean_since(&self, earlier: &QueueTime) -> Option<f64> {
        if self.count <= earlier.count || self.total_ms < earlier.total_ms {
            return None;
        }
        Some((self.total_ms - earlier.total_ms) / (self.count - earlier.count) as f64)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM to the process group: the server's own graceful stop.
    Term,
    /// SIGKILL to the process group.
    Kill,
}

/// How capacity became ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// A cold start passed its warm-up: spawn → warm, in the core's time (the figure status
    /// shows as `time_to_ready_ms`).
    Cold(Duration),
    /// A replica that was warm before this event was routed by it. For the core a promotion is
    /// one step; what there is to measure is the shell's own reaction, from taking the event up
    /// (a report, an exit, a tick) to publishing the routed set that holds the replica. A replica
    /// that warms and is routed in the same event filled a gap with a cold start: `Cold` only.
    Promoted,
    /// A sleeping replica woke and passed its warm-up: first wake request → warm.
    Woken(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// What asked for a reload, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadCause {
    Signal,
    Request,
}

impl std::fmt::Display for ReloadCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReloadCause::Signal => "SIGHUP",
            ReloadCause::Request => "reload",
        })
    }
}

/// Why a reload's read of the configuration file gave no configuration to apply.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigReadError {
    /// The file could not be read, or it did not pass the checks (FILE[:LINE]: KEY: why).
    Invalid(ConfigError),
    /// The default account for the models without `user` could not be made (the tool's words).
    Account(String),
    /// The thread that read the file failed.
    Failed { path: PathBuf, error: String },
    /// No data came within the deadline (a FIFO at the path, a hung filesystem).
    TimedOut { path: PathBuf, after: Duration },
    /// The scale overrides in force do not fit the new file (the core's own check).
    Overrides {
        path: PathBuf,
        why: super::overrides::OverridesError,
    },
}

impl std::fmt::Display for ConfigReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigReadError::Invalid(e) => write!(f, "{e}"),
            ConfigReadError::Account(why) => f.write_str(why),
            ConfigReadError::Failed { path, error } => {
                write!(f, "{}: -: reading failed: {error}", path.display())
            }
            ConfigReadError::TimedOut { path, after } => write!(
                f,
                "{}: -: cannot read configuration file: no data within {} s",
                path.display(),
                after.as_secs()
            ),
            ConfigReadError::Overrides { path, why } => write!(
                f,
                "{}: {why}; widen daemon.ports, or clear an override with `hearth scale MODEL \
                 --reset`",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ConfigReadError {}

/// A configuration file read for a reload.
#[derive(Debug, Clone)]
pub struct NewConfig {
    pub config: Config,
    /// What the file changes that only a restart can (socket, metrics, state_dir, `[gpus]`):
    /// kept at the running values, and said in the log.
    pub warnings: Vec<String>,
    /// The file's text, which an upgrade carries across once it is applied (the shell's; the
    /// core does not read it).
    pub text: std::sync::Arc<str>,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// The periodic timer: deadlines, probe schedules and slow policy windows are checked here.
    Tick,
    Spawned {
        replica: ReplicaId,
        pid: u32,
    },
    SpawnFailed {
        replica: ReplicaId,
        error: SpawnError,
    },
    /// The replica's leader process exited (the shell has already killed what was left of its
    /// process group).
    Exited {
        replica: ReplicaId,
        status: ExitStatus,
    },
    Probed {
        replica: ReplicaId,
        kind: ProbeKind,
        outcome: ProbeOutcome,
    },
    /// A scrape of a replica's metrics finished.
    Scraped {
        replica: ReplicaId,
        outcome: Result<ScrapedQueue, super::ScrapeError>,
    },
    /// A control-socket request, already authenticated; answered by `Action::Reply`.
    Request {
        id: RequestId,
        peer: Peer,
        request: Request,
    },
    /// SIGHUP: re-read the configuration file (as the `reload` op does).
    ReloadSignal,
    /// The configuration file as the shell read it after `Action::ReadConfig`: validated, with
    /// what cannot change live pinned to the running values; or why it could not be read.
    ConfigRead(Result<Box<NewConfig>, ConfigReadError>),
    /// What the shell found comparing the configuration file with what runs (after an upgrade,
    /// which carries the running configuration across): None, the same; else how it differs.
    ConfigFile {
        differs: Option<String>,
    },
    /// How an upgrade ended, once the binary that runs after it has adopted the hand-over (or
    /// found that its exec failed): for status.
    Upgraded(crate::protocol::UpgradeView),
    /// The devices the inventory sees now (at start, and when it changes).
    Inventory(Vec<GpuDevice>),
    /// An XID error NVML reported for a device (or for a GPU whose MIG instances are the
    /// devices), with the device's recovery action read right after it (None: not readable).
    GpuXid {
        uuid: String,
        xid: u64,
        recovery: Option<RecoveryAction>,
    },
    /// A reading of one device: memory, the processes on it, the recovery action.
    GpuReading(GpuReading),
    /// Progress of reading a starting replica's `prefetch` files into the page cache (the
    /// shell sends one at the start, some while reading, and one when done: `done == total`).
    /// `missing`: patterns that matched nothing or files that could not be read.
    Prefetch {
        replica: ReplicaId,
        done_bytes: u64,
        total_bytes: u64,
        missing: Vec<String>,
    },
    /// The shell found the port it was to start `replica` on held by another process (checked
    /// by binding it, as the server would, just before the spawn): nothing was started.
    PortBusy {
        replica: ReplicaId,
        port: u16,
        /// Who holds it, as far as the shell could tell.
        holder: String,
    },
    /// Resource use of live replicas, sampled by the shell.
    Usage(Vec<(ReplicaId, Usage)>),
    /// At start, before the first tick: replicas of an earlier run, found alive and proven to
    /// be the processes that were started (pid, start time, cgroup); the shell has taken
    /// charge of their processes (it sees their exits, it can signal them).
    Adopt {
        how: super::adopt::Adoption,
        ledger: super::adopt::Ledger,
    },
    /// SIGTERM/SIGINT: drain and stop everything; `immediate` on the second signal.
    Shutdown {
        immediate: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Spawn(SpawnSpec),
    /// Read a replica's weight files into the page cache, from the moment it is wanted: the
    /// read overlaps a restart back-off, a wait for GPU room, and the server's own loading.
    Prefetch {
        replica: ReplicaId,
        model: String,
        globs: Vec<String>,
    },
    Signal {
        replica: ReplicaId,
        pid: u32,
        signal: StopSignal,
    },
    /// Run one probe attempt after `after`, then report `Event::Probed`.
    Probe {
        replica: ReplicaId,
        kind: ProbeKind,
        after: Duration,
        spec: ProbeSpec,
    },
    /// Fetch the replica's metrics once and report `Event::Scraped`.
    Scrape {
        replica: ReplicaId,
        url: String,
        format: ScrapeFormat,
        /// Triton: the models whose request counters count; empty: all.
        models: Vec<String>,
        timeout: Duration,
    },
    /// The answer to `Event::Request` `id`; the socket layer writes it.
    Reply {
        id: RequestId,
        answer: Answer,
    },
    /// A watch event: the routed set changed, a replica changed state, a scale decision, a GPU.
    Publish(WatchEvent),
    /// Scale overrides changed: the shell writes every model's (those with any) to state_dir.
    PersistOverrides(BTreeMap<String, Overrides>),
    Log {
        level: LogLevel,
        model: Option<String>,
        replica: Option<ReplicaId>,
        message: String,
    },
    /// Read and validate the configuration file off the event loop (announcing a reload to the
    /// service manager), then send `Event::ConfigRead`.
    ReadConfig {
        cause: ReloadCause,
    },
    /// A reload ended, before its requests are answered. `applied`: the configuration now in
    /// force, whose daemon settings the shell applies (log level, access, tick); None: refused,
    /// the running configuration stays. Either way the daemon is ready again.
    ReloadDone {
        cause: ReloadCause,
        applied: Option<Box<Config>>,
    },
    /// Capacity became ready, for the time-to-ready histogram.
    Ready {
        model: String,
        replica: ReplicaId,
        how: Readiness,
    },
    /// Every replica is gone after a shutdown.
    ShutdownComplete,
    /// `upgrade` asked (request `id`, not yet answered): the shell re-executes the daemon with
    /// the binary on disk, handing every replica over (agent/upgrade.rs), or answers why not.
    Upgrade {
        id: RequestId,
    },
}
