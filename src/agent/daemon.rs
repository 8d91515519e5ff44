//! The daemon's event loop: one task owns the `Node`; workers (socket connections, process
//! watchers, probes, the timer, signals) only send it messages; it turns actions into effects.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::control::{self, Control};
use super::gpu_monitor::{self, MonitorSink};
use super::inventory::Inventory;
use super::logging::LogControl;
use super::metrics::{self, ReadyPath, Recorder};
use super::notify::Notifier;
use super::supervisor::Supervisor;
use super::{probe, scrape, state};
use crate::config::{Config, DaemonConfig, GpusConfig};
use crate::core::{Action, Event, LogLevel, Node, Peer, Time};
use crate::protocol::{
    Answer, ErrorCode, Failure, Health, ReplicaState, Request, StatusView, WatchEvent, WatchedState,
};

/// Messages to the core's task.
pub enum ShellMsg {
    Event(Event),
    /// A control request; answered with the reply and the publish sequence at that moment.
    Request {
        peer: Peer,
        request: Request,
        reply: oneshot::Sender<(Answer, u64)>,
    },
    /// SIGHUP: re-read the configuration file.
    ReloadSignal,
    /// A metrics scrape: the status as the core sees it now.
    Snapshot {
        reply: oneshot::Sender<StatusView>,
    },
}

/// A watch event as broadcast to watchers, numbered so a watch can skip what its snapshot holds.
#[derive(Debug)]
pub struct Published {
    pub seq: u64,
    pub event: WatchEvent,
    /// The event as its watchers get it, serialized once for all of them.
    pub line: String,
}

/// Wall-clock time carried forward by a monotonic clock: timestamps operators can read, and
/// intervals that never jump.
#[derive(Clone, Copy)]
struct Clock {
    wall: Duration,
    mono: Instant,
}

impl Clock {
    fn new() -> Clock {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Clock {
            wall,
            mono: Instant::now(),
        }
    }
    fn now(&self) -> Time {
        Time(self.wall + self.mono.elapsed())
    }
}

pub struct Daemon {
    pub config: Config,
    pub config_path: PathBuf,
    pub inventory: Box<dyn Inventory>,
    /// sd_notify: readiness, reloads, stopping, status line, watchdog.
    pub notifier: Notifier,
    /// The log filter, changed by reloads.
    pub log: LogControl,
}

/// Capacity of the queue into the core's task: a flood of reports waits here rather than
/// growing memory without bound.
const INBOX: usize = 8192;

/// What a reload may not change without a restart: the socket and the metrics listener are
/// bound, the state directory was read, the inventory was opened at start.
struct Fixed {
    daemon: DaemonConfig,
    gpus: GpusConfig,
}

impl Fixed {
    /// Keeps the running values of what cannot change live in `cfg`, so the core goes on
    /// telling replicas the socket that really listens; returns a warning for each that changed.
    fn pin(&self, cfg: &mut Config) -> Vec<String> {
        let mut warnings = Vec::new();
        let d = &mut cfg.daemon;
        let mut check = |key: &str, changed: bool, was: String, now: String| {
            if changed {
                warnings.push(format!(
                    "{key} changed from {was} to {now}: not applied, takes a restart (systemctl restart hearth)"
                ));
            }
        };
        check(
            "daemon.socket",
            d.socket != self.daemon.socket,
            format!("{:?}", self.daemon.socket),
            format!("{:?}", d.socket),
        );
        check(
            "daemon.metrics",
            d.metrics != self.daemon.metrics,
            opt_addr(self.daemon.metrics),
            opt_addr(d.metrics),
        );
        check(
            "daemon.state_dir",
            d.state_dir != self.daemon.state_dir,
            format!("{:?}", self.daemon.state_dir),
            format!("{:?}", d.state_dir),
        );
        check(
            "[gpus]",
            cfg.gpus != self.gpus,
            "the running inventory".into(),
            "another".into(),
        );
        let d = &mut cfg.daemon;
        d.socket = self.daemon.socket.clone();
        d.metrics = self.daemon.metrics;
        d.state_dir = self.daemon.state_dir.clone();
        cfg.gpus = self.gpus.clone();
        warnings
    }
}

fn opt_addr(a: Option<std::net::SocketAddr>) -> String {
    a.map_or_else(|| "none".to_string(), |a| a.to_string())
}

impl Daemon {
    /// Runs until every replica is gone after `stop` (SIGTERM/SIGINT) asked for a shutdown. The
    /// caller owns the listeners and the stop channel, so tests can drive both.
    pub async fn run(
        self,
        listener: UnixListener,
        metrics_listener: Option<TcpListener>,
        mut stop: mpsc::Receiver<bool>,
        mut hup: mpsc::Receiver<()>,
    ) -> anyhow::Result<()> {
        let Daemon {
            config,
            config_path,
            mut inventory,
            mut notifier,
            mut log,
        } = self;
        let clock = Clock::new();
        let (tx, mut rx) = mpsc::channel::<ShellMsg>(INBOX);
        let (published, _) = broadcast::channel::<Arc<Published>>(4096);
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let socket_path = config.daemon.socket.clone();
        let state_dir = config.daemon.state_dir.clone();
        let fixed = Fixed {
            daemon: config.daemon.clone(),
            gpus: config.gpus.clone(),
        };

        let gpu_source = inventory.describe();
        tracing::info!("GPU inventory: {gpu_source}");
        // "nvml: 8 device(s), driver …" → "nvml", for the one-line status.
        let gpu_kind = gpu_source.split(':').next().unwrap_or("gpus").to_string();
        let overrides = state::load(&state_dir);
        let mut node = Node::new(config.clone(), inventory.devices(), overrides, clock.now());

        // XIDs and memory readings, from a thread of their own; it stops when this is dropped.
        let _monitor = inventory.start_monitor(MonitorSink {
            to_core: tx.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            interval: gpu_monitor::MEMORY_INTERVAL,
        });

        let supervisor = Supervisor::start(tx.clone());
        let probes = probe::client();
        let access = Arc::new(Access::new(config.access.clone()));
        let control = Control {
            to_core: tx.clone(),
            published: published.clone(),
            access: access.clone(),
        };
        tracker.spawn(control::serve(
            listener,
            control,
            shutdown.clone(),
            tracker.clone(),
        ));
        let recorder = Arc::new(Recorder::new());
        if let Some(l) = metrics_listener {
            if let Ok(addr) = l.local_addr() {
                tracing::info!("metrics at http://{addr}/metrics");
            }
            tracker.spawn(metrics::serve(
                l,
                recorder.clone(),
                tx.clone(),
                shutdown.clone(),
                tracker.clone(),
            ));
        }

        let mut fx = Effects {
            supervisor,
            probes,
            tx: tx.clone(),
            published,
            seq: 0,
            replies: HashMap::new(),
            next_id: 1,
            state_dir,
            done: false,
            tracker: tracker.clone(),
            recorder,
            reports: HashMap::new(),
            replicas: HashMap::new(),
            call: 0,
            now: clock.now(),
            started: Instant::now(),
            gpu: None,
            changed: false,
        };
        let mut tick = ticker(config.daemon.tick);
        let mut stopping = false;
        let mut hard_deadline: Option<tokio::time::Instant> = None;
        let first = node.handle(Event::Tick, clock.now());
        fx.begin(clock.now(), None);
        fx.apply(first);
        // The socket listens and the start-up replicas are placed: start-up is done as far as
        // systemd is concerned. Waiting for them to warm could take longer than any sensible
        // TimeoutStartSec (model loads take minutes), and `hearth status` shows their progress.
        notifier.ready(&status_line(
            &node.status(None, clock.now()),
            &gpu_kind,
            false,
        ));
        // Pings come from this loop, the one that owns the core, and from nowhere else: if the
        // core hangs in `handle`, or the loop stops turning, they stop and systemd restarts us.
        let mut watchdog = notifier.watchdog_interval().map(ticker);
        if let Some(t) = notifier.watchdog_timeout() {
            tracing::info!(
                "systemd watchdog: {}ms; pinging every {}ms",
                t.as_millis(),
                t.as_millis() / 2
            );
        }

        while !fx.done {
            let msg = tokio::select! {
                biased;
                Some(immediate) = stop.recv() => {
                    if !stopping {
                        stopping = true;
                        fx.supervisor.cancel_prefetches();
                        hard_deadline = Some(tokio::time::Instant::now() + node.config().daemon.shutdown_timeout + Duration::from_secs(5));
                        // Before the drain starts, so that systemd shows the unit as
                        // deactivating for the whole drain, also when the stop came from
                        // someone's `kill` rather than from `systemctl stop`.
                        notifier.stopping("stopping: draining and stopping every replica");
                    }
                    ShellMsg::Event(Event::Shutdown { immediate })
                }
                Some(()) = hup.recv() => ShellMsg::ReloadSignal,
                // Ahead of the inbox: a loop busy with a flood of reports is turning, not stuck.
                _ = async { watchdog.as_mut().expect("guarded").tick().await }, if watchdog.is_some() => {
                    notifier.watchdog();
                    continue;
                }
                Some(msg) = rx.recv() => msg,
                _ = tick.tick() => {
                    if hard_deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
                        tracing::error!("replicas still alive past shutdown_timeout; exiting anyway");
                        break;
                    }
                    ShellMsg::Event(Event::Tick)
                }
            };
            let now = clock.now();
            let actions = match msg {
                ShellMsg::Event(ev) => {
                    fx.begin(now, gpu_of(&ev));
                    node.handle(ev, now)
                }
                ShellMsg::Snapshot { reply } => {
                    let _ = reply.send(node.status(None, now));
                    continue;
                }
                ShellMsg::Request {
                    peer,
                    request: Request::Reload,
                    reply,
                } => {
                    if peer.role < crate::protocol::Role::Admin {
                        let f = Failure::new(
                            ErrorCode::Forbidden,
                            "op \"reload\" needs the admin role",
                        );
                        let _ = reply.send((Err(f), fx.seq));
                        continue;
                    }
                    if stopping {
                        let f = Failure::new(ErrorCode::Busy, "shutting down: not reloading");
                        let _ = reply.send((Err(f), fx.seq));
                        continue;
                    }
                    fx.begin(now, None);
                    let mut reload = Reload {
                        path: &config_path,
                        fixed: &fixed,
                        log: &mut log,
                        access: &access,
                        tick: &mut tick,
                        notifier: &mut notifier,
                    };
                    match reload.read("reload") {
                        Ok(cfg) => {
                            let id = fx.register(reply);
                            let actions = node.handle(
                                Event::Reload {
                                    id: Some(id),
                                    config: Box::new(cfg),
                                },
                                now,
                            );
                            fx.apply(actions);
                        }
                        Err(e) => {
                            let f = Failure::new(
                                ErrorCode::BadRequest,
                                format!("configuration not reloaded: {e}"),
                            );
                            let _ = reply.send((Err(f), fx.seq));
                        }
                    }
                    // Applied or refused: either way the daemon runs a valid configuration.
                    let line = status_line(&node.status(None, now), &gpu_kind, stopping);
                    notifier.ready(&line);
                    continue;
                }
                ShellMsg::Request {
                    peer,
                    request,
                    reply,
                } => {
                    let report = match &request {
                        Request::Report(r) => Some(r.model.clone()),
                        _ => None,
                    };
                    let id = fx.register(reply);
                    if let Some(model) = report {
                        fx.reports.insert(id, model);
                    }
                    fx.begin(now, None);
                    node.handle(Event::Request { id, peer, request }, now)
                }
                // A reload during the drain would start replicas only to stop them, and its
                // READY=1 would contradict STOPPING=1.
                ShellMsg::ReloadSignal if stopping => {
                    tracing::warn!("SIGHUP ignored: shutting down");
                    continue;
                }
                ShellMsg::ReloadSignal => {
                    fx.begin(now, None);
                    let mut reload = Reload {
                        path: &config_path,
                        fixed: &fixed,
                        log: &mut log,
                        access: &access,
                        tick: &mut tick,
                        notifier: &mut notifier,
                    };
                    if let Ok(cfg) = reload.read("SIGHUP") {
                        let actions = node.handle(
                            Event::Reload {
                                id: None,
                                config: Box::new(cfg),
                            },
                            now,
                        );
                        fx.apply(actions);
                    }
                    let line = status_line(&node.status(None, now), &gpu_kind, stopping);
                    notifier.ready(&line);
                    continue;
                }
            };
            fx.apply(actions);
            // The status line follows what changed (a replica's state, the routed set, a
            // scale decision, a GPU), not the clock: an event that published nothing, like most
            // reports and ticks, does not rebuild it, and an unchanged line is not resent.
            if fx.changed && notifier.enabled() {
                notifier.status(&status_line(&node.status(None, now), &gpu_kind, stopping));
            }
        }

        shutdown.cancel();
        tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
        match std::fs::remove_file(&socket_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("removing {}: {e}", socket_path.display()),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// The device an event is about, for the `GPU` field of what the core logs in answer.
fn gpu_of(ev: &Event) -> Option<String> {
    match ev {
        Event::GpuXid { uuid, .. } | Event::GpuMemory { uuid, .. } => Some(uuid.clone()),
        _ => None,
    }
}

/// One reload (SIGHUP or the `reload` op): read and validate the file, apply what the shell
/// owns, and hand the rest to the core. Announced to systemd as a reload either way.
struct Reload<'a> {
    path: &'a std::path::Path,
    fixed: &'a Fixed,
    log: &'a mut LogControl,
    access: &'a Access,
    tick: &'a mut tokio::time::Interval,
    notifier: &'a mut Notifier,
}

impl Reload<'_> {
    /// The validated configuration for the core, with what cannot change live pinned to the
    /// running values. On error the old configuration stays and the error is logged.
    fn read(&mut self, what: &str) -> Result<Config, crate::config::ConfigError> {
        self.notifier.reloading();
        let mut cfg = match Config::load(self.path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("{what}: configuration not reloaded, the running one is kept: {e}");
                return Err(e);
            }
        };
        tracing::info!("{what}: reloading {}", self.path.display());
        for w in self.fixed.pin(&mut cfg) {
            tracing::warn!("{what}: {w}");
        }
        if cfg.daemon.tick != self.tick.period() {
            tracing::info!(
                "{what}: daemon.tick {}ms → {}ms",
                self.tick.period().as_millis(),
                cfg.daemon.tick.as_millis()
            );
            *self.tick = ticker(cfg.daemon.tick);
        }
        if let Some(warning) = self.log.set_level(&cfg.daemon.log_level) {
            tracing::warn!("{what}: {warning}");
        }
        self.access.set_config(cfg.access.clone());
        Ok(cfg)
    }
}

/// The one-line `STATUS=` that `systemctl status hearth` shows, e.g.
/// "3 models: 5 routed, 2 warm, 1 starting; GPUs: static 2".
pub fn status_line(st: &StatusView, gpu_kind: &str, stopping: bool) -> String {
    let sum = |f: fn(&crate::protocol::ModelView) -> u32| st.models.iter().map(f).sum::<u32>();
    let (routed, warm, starting) = (sum(|m| m.routed), sum(|m| m.warm), sum(|m| m.starting));
    let (pending, draining) = (sum(|m| m.pending), sum(|m| m.draining));
    if stopping {
        let left = routed + warm + starting + pending + draining;
        return format!("stopping: {left} replica(s) left");
    }
    let n = st.models.len();
    let mut s = format!(
        "{n} model{}: {routed} routed, {warm} warm, {starting} starting",
        if n == 1 { "" } else { "s" }
    );
    if pending > 0 {
        s.push_str(&format!(", {pending} pending"));
    }
    if draining > 0 {
        s.push_str(&format!(", {draining} draining"));
    }
    let names = |f: &dyn Fn(&crate::protocol::ModelView) -> bool| {
        st.models
            .iter()
            .filter(|m| f(m))
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (label, list) in [
        ("crash_loop", names(&|m| m.health == Health::CrashLoop)),
        ("no_capacity", names(&|m| m.health == Health::NoCapacity)),
        (
            "rollout halted",
            names(&|m| m.rollout.as_ref().is_some_and(|r| r.halted.is_some())),
        ),
        (
            "rolling out",
            names(&|m| m.rollout.as_ref().is_some_and(|r| r.halted.is_none())),
        ),
    ] {
        if !list.is_empty() {
            s.push_str(&format!("; {label}: {list}"));
        }
    }
    let unhealthy = st.gpus.iter().filter(|g| !g.healthy).count();
    if st.gpus.is_empty() {
        s.push_str("; GPUs: none");
    } else {
        s.push_str(&format!("; GPUs: {gpu_kind} {}", st.gpus.len()));
        if unhealthy > 0 {
            s.push_str(&format!(" ({unhealthy} unhealthy)"));
        }
    }
    s
}

/// Turns the core's actions into effects.
struct Effects {
    supervisor: Supervisor,
    probes: reqwest::Client,
    tx: mpsc::Sender<ShellMsg>,
    published: broadcast::Sender<Arc<Published>>,
    seq: u64,
    replies: HashMap<u64, oneshot::Sender<(Answer, u64)>>,
    next_id: u64,
    state_dir: PathBuf,
    done: bool,
    tracker: TaskTracker,
    recorder: Arc<Recorder>,
    /// Report requests waiting for their answer, by request id: counted once accepted.
    reports: HashMap<u64, String>,
    /// Each replica's last published state, when it entered it (core time) and in which
    /// event, for the time-to-ready histogram; and its GPUs, for the log's GPU field.
    replicas: HashMap<String, Seen>,
    /// Number of the event being applied.
    call: u64,
    /// The time the core was given for this event.
    now: Time,
    /// When the event loop took this event up.
    started: Instant,
    /// The device this event is about, if it is about one.
    gpu: Option<String>,
    /// This event changed a replica's state, the routed set, a scale or a GPU.
    changed: bool,
}

struct Seen {
    state: ReplicaState,
    since: Time,
    call: u64,
    gpus: Option<String>,
}

impl Effects {
    fn register(&mut self, reply: oneshot::Sender<(Answer, u64)>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.replies.insert(id, reply);
        id
    }

    /// Starts applying the actions of a new event, handled by the core at `now`.
    fn begin(&mut self, now: Time, gpu: Option<String>) {
        self.call += 1;
        self.now = now;
        self.started = Instant::now();
        self.gpu = gpu;
        self.changed = false;
    }

    /// Metrics and log context from a replica's state change.
    ///
    /// cold: spawn → warm, the same interval the core reports as `time_to_ready_ms` (both use
    /// the core's time of the two events). promote: a replica that was already warm before this
    /// event and is routed by it; for the core a promotion is one step, so what there is to
    /// measure is the daemon's own reaction: from taking up the event (a report, a replica's
    /// exit, a tick) to publishing the routed set that holds the replica. A replica that warms
    /// and is routed in the same event filled a gap with a cold start, and counts as cold only.
    fn replica_state(&mut self, model: &str, replica: &str, state: WatchedState) {
        self.changed = true;
        let state = match state {
            WatchedState::State(s) => s,
            WatchedState::Gone(_) => {
                self.replicas.remove(replica);
                return;
            }
        };
        let prev = self.replicas.get(replica);
        match (prev.map(|p| (p.state, p.since)), state) {
            (Some((ReplicaState::Starting, since)), ReplicaState::Warm) => {
                let secs = self.now.since(since).as_secs_f64();
                self.recorder.ready(model, ReadyPath::Cold, secs);
            }
            (Some((ReplicaState::Warm, _)), ReplicaState::Routed)
                if prev.is_some_and(|p| p.call < self.call) =>
            {
                let secs = self.started.elapsed().as_secs_f64();
                self.recorder.ready(model, ReadyPath::Promote, secs);
            }
            _ => {}
        }
        let gpus = prev.and_then(|p| p.gpus.clone());
        self.replicas.insert(
            replica.to_string(),
            Seen {
                state,
                since: self.now,
                call: self.call,
                gpus,
            },
        );
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Spawn(spec) => {
                    if !spec.gpus.is_empty() {
                        if let Some(seen) = self.replicas.get_mut(spec.replica.as_str()) {
                            seen.gpus = Some(spec.gpus.join(","));
                        }
                    }
                    self.supervisor.spawn(spec)
                }
                Action::Prefetch {
                    replica,
                    model,
                    globs,
                } => self.supervisor.prefetch(replica, model, globs),
                Action::Signal {
                    replica,
                    pid,
                    signal,
                } => Supervisor::signal(&replica, pid, signal),
                Action::Probe {
                    replica,
                    kind,
                    after,
                    spec,
                } => {
                    let client = self.probes.clone();
                    let tx = self.tx.clone();
                    self.tracker.spawn(async move {
                        if !after.is_zero() {
                            tokio::time::sleep(after).await;
                        }
                        let outcome = probe::run(&client, &spec).await;
                        let _ = tx
                            .send(ShellMsg::Event(Event::Probed {
                                replica,
                                kind,
                                outcome,
                            }))
                            .await;
                    });
                }
                Action::Scrape {
                    replica,
                    url,
                    format,
                    timeout,
                } => {
                    let client = self.probes.clone();
                    let tx = self.tx.clone();
                    self.tracker.spawn(async move {
                        let outcome = scrape::run(&client, &url, format, timeout).await;
                        let _ = tx
                            .send(ShellMsg::Event(Event::Scraped { replica, outcome }))
                            .await;
                    });
                }
                Action::Reply { id, answer } => {
                    if let Some(model) = self.reports.remove(&id) {
                        if answer.is_ok() {
                            self.recorder.report(&model);
                        }
                    }
                    if let Some(tx) = self.replies.remove(&id) {
                        let _ = tx.send((answer, self.seq));
                    }
                }
                Action::Publish(event) => {
                    match &event {
                        WatchEvent::Replica {
                            model,
                            replica,
                            state,
                        } => self.replica_state(model, replica, *state),
                        WatchEvent::Scale {
                            model, from, to, ..
                        } => {
                            self.recorder.scale(model, *from, *to);
                            self.changed = true;
                        }
                        WatchEvent::Routed { .. } | WatchEvent::Gpu { .. } => self.changed = true,
                    }
                    self.seq += 1;
                    let line = serde_json::to_string(&event).unwrap_or_default();
                    let _ = self.published.send(Arc::new(Published {
                        seq: self.seq,
                        event,
                        line,
                    }));
                }
                Action::PersistOverrides(overrides) => {
                    if let Err(e) = state::save(&self.state_dir, &overrides) {
                        tracing::error!(
                            "saving scale overrides in {}: {e}",
                            self.state_dir.display()
                        );
                    }
                }
                Action::Log {
                    level,
                    model,
                    replica,
                    message,
                } => {
                    let gpu = match &replica {
                        Some(r) => self.replicas.get(r.as_str()).and_then(|s| s.gpus.clone()),
                        None => self.gpu.clone(),
                    };
                    log(level, model, replica, gpu, &message)
                }
                Action::ShutdownComplete => self.done = true,
            }
        }
    }
}

/// A line the core asked for, with the journal fields MODEL, REPLICA and GPU where known.
fn log(
    level: LogLevel,
    model: Option<String>,
    replica: Option<crate::core::ReplicaId>,
    gpu: Option<String>,
    message: &str,
) {
    let model = model.as_deref();
    let replica = replica.as_ref().map(|r| r.as_str());
    let gpu = gpu.as_deref();
    match level {
        LogLevel::Debug => tracing::debug!(model, replica, gpu, "{message}"),
        LogLevel::Info => tracing::info!(model, replica, gpu, "{message}"),
        LogLevel::Warn => tracing::warn!(model, replica, gpu, "{message}"),
        LogLevel::Error => tracing::error!(model, replica, gpu, "{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{GpuView, ModelView};

    fn model(name: &str, counts: [u32; 5], health: &str, halted: Option<&str>) -> ModelView {
        let [routed, warm, starting, pending, draining] = counts;
        let mut m: ModelView = serde_json::from_value(serde_json::json!({
            "name": name, "version": "1", "health": health, "routed": routed, "warm": warm,
            "starting": starting, "pending": pending, "draining": draining,
            "desired_routed": routed, "min": 1, "max": 8, "warm_pool": 1,
            "target_wait_ms": 500, "signal": {}, "last_scale": null, "replicas": []
        }))
        .unwrap();
        m.rollout = Some(crate::protocol::RolloutView {
            version: "2".into(),
            from: "1".into(),
            updated: 0,
            halted: halted.map(str::to_string),
        })
        .filter(|_| halted.is_some());
        m
    }

    fn gpu(uuid: &str, healthy: bool) -> GpuView {
        GpuView {
            index: 0,
            uuid: uuid.into(),
            name: "static device".into(),
            memory_total: 1,
            memory_reserved: 0,
            healthy,
            cordoned: false,
            replicas: vec![],
            memory_used: None,
            memory_foreign: None,
            note: None,
            topology: None,
        }
    }

    #[test]
    fn the_status_line_sums_models_and_names_the_ones_in_trouble() {
        let st = StatusView {
            models: vec![
                model("a", [3, 1, 1, 0, 0], "ok", None),
                model("b", [2, 1, 0, 1, 1], "crash_loop", None),
                model(
                    "c",
                    [0, 0, 0, 0, 0],
                    "ok",
                    Some("rollout of version 2 halted after 3 replicas failed to warm up"),
                ),
            ],
            gpus: vec![gpu("GPU-0", true), gpu("GPU-1", false)],
        };
        assert_eq!(
            status_line(&st, "nvml", false),
            "3 models: 5 routed, 2 warm, 1 starting, 1 pending, 1 draining; crash_loop: b; \
             rollout halted: c; GPUs: nvml 2 (1 unhealthy)"
        );
        assert_eq!(
            status_line(&st, "nvml", true),
            "stopping: 10 replica(s) left"
        );
        let one = StatusView {
            models: vec![model("a", [2, 1, 0, 0, 0], "ok", None)],
            gpus: vec![],
        };
        assert_eq!(
            status_line(&one, "static", false),
            "1 model: 2 routed, 1 warm, 0 starting; GPUs: none"
        );
    }
}
