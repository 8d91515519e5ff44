//! The daemon's event loop: one task owns the `Node`; workers (socket connections, process
//! watchers, probes, the timer, signals) only send it messages (inbox.rs); it hands each to the
//! core and turns the core's actions into effects (effects.rs), and tells systemd where things
//! stand (status_line.rs, notify.rs).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::account::Accounts;
use super::containment;
use super::control::{self, Control};
use super::effects::{Effects, Workers};
use super::gpu_monitor::{self, MonitorSink};
use super::inbox::{self, EventSink, ShellMsg};
use super::inventory::Inventory;
use super::logging::LogControl;
use super::metrics::{self, Recorder};
use super::notify::Notifier;
use super::reload::{self, Fixed, Settings};
use super::status_line::status_line;
use super::supervisor::Supervisor;
use super::{probe, state};
use crate::config::Config;
use crate::core::{Action, Event, Node, Time};
use crate::protocol::Request;

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

/// What woke the loop.
enum Wake {
    Msg(ShellMsg),
    /// SIGTERM/SIGINT; true from the second one on.
    Stop(bool),
    Hangup,
    Watchdog,
    Tick,
}

/// The loop's state: the core, and what carries out and announces its decisions.
struct Shell {
    node: Node,
    fx: Effects,
    clock: Clock,
    notifier: Notifier,
    tick: tokio::time::Interval,
    /// The shell's side of reloads: where the file is, what it may not change, what it applies.
    config_path: PathBuf,
    fixed: Arc<Fixed>,
    settings: Settings,
    events: EventSink,
    tracker: TaskTracker,
    /// "nvml", "static"…, for the status line.
    gpu_kind: String,
    /// SIGTERM/SIGINT came: the status line counts what is left.
    stopping: bool,
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
            notifier,
            log,
        } = self;
        let clock = Clock::new();
        let (tx, mut rx) = inbox::channel();
        let events = EventSink::new(tx.clone());
        let published = inbox::published();
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let socket_path = config.daemon.socket.clone();
        let state_dir = config.daemon.state_dir.clone();

        let gpu_source = inventory.describe();
        tracing::info!("GPU inventory: {gpu_source}");
        // "nvml: 8 device(s), driver …" → "nvml", for the one-line status.
        let gpu_kind = gpu_source.split(':').next().unwrap_or("gpus").to_string();
        let overrides = state::load(&state_dir);
        let node = Node::new(config.clone(), inventory.devices(), overrides, clock.now());

        // XIDs and memory readings, from a thread of their own; it stops when this is dropped.
        let _monitor = inventory.start_monitor(MonitorSink {
            to_core: events.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            interval: gpu_monitor::MEMORY_INTERVAL,
        });

        // Where replicas live (systemd scopes, a cgroup2 subtree, or process groups), and what an
        // earlier run left there stopped, before the first replica of this run is placed.
        let containment = containment::start(&state_dir).await?;
        let sampling = Arc::new(AtomicBool::new(false));
        containment::start_sampler(containment.clone(), events.clone(), sampling.clone());

        let accounts = Accounts::resolve();
        accounts.open_socket_to_replicas(&socket_path);
        let access =
            Arc::new(Access::new(config.access.clone()).with_containment(containment.clone()));
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
        let workers = Workers {
            supervisor: Supervisor::start(events.clone(), containment.clone(), accounts),
            containment: containment.clone(),
            http: probe::client(),
            events: events.clone(),
            tracker: tracker.clone(),
        };
        let mut shell = Shell {
            node,
            fx: Effects::new(workers, published, recorder, state_dir),
            clock,
            notifier,
            tick: ticker(config.daemon.tick),
            config_path,
            fixed: Arc::new(Fixed::new(&config)),
            settings: Settings { log, access },
            events,
            tracker: tracker.clone(),
            gpu_kind,
            stopping: false,
        };
        shell.start();
        // Pings come from this loop, the one that owns the core, and from nowhere else: if the
        // core hangs in `handle`, or the loop stops turning, they stop and systemd restarts us.
        let mut watchdog = shell.notifier.watchdog_interval().map(ticker);
        if let Some(t) = shell.notifier.watchdog_timeout() {
            tracing::info!(
                "systemd watchdog: {}ms; pinging every {}ms",
                t.as_millis(),
                t.as_millis() / 2
            );
        }
        let mut hard_deadline: Option<tokio::time::Instant> = None;

        while !shell.fx.done() {
            let wake = tokio::select! {
                biased;
                Some(immediate) = stop.recv() => Wake::Stop(immediate),
                Some(()) = hup.recv() => Wake::Hangup,
                // Ahead of the inbox: a loop busy with a flood of reports is turning, not stuck.
                _ = tick_opt(&mut watchdog) => Wake::Watchdog,
                Some(msg) = rx.recv() => Wake::Msg(msg),
                _ = shell.tick.tick() => Wake::Tick,
            };
            match wake {
                Wake::Msg(msg) => shell.message(msg),
                Wake::Stop(immediate) => {
                    if !shell.stopping {
                        hard_deadline = Some(
                            tokio::time::Instant::now()
                                + shell.node.config().daemon.shutdown_timeout
                                + Duration::from_secs(5),
                        );
                    }
                    shell.stop(immediate);
                }
                Wake::Hangup => shell.event(Event::ReloadSignal),
                Wake::Watchdog => shell.notifier.watchdog(),
                Wake::Tick => {
                    if hard_deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
                        tracing::error!(
                            "replicas still alive past shutdown_timeout; exiting anyway"
                        );
                        break;
                    }
                    shell.event(Event::Tick);
                }
            }
        }

        shutdown.cancel();
        tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
        sampling.store(true, std::sync::atomic::Ordering::Relaxed);
        containment.close();
        match std::fs::remove_file(&socket_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("removing {}: {e}", socket_path.display()),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

impl Shell {
    /// The first tick places the start-up replicas; then systemd hears that start-up is done.
    fn start(&mut self) {
        self.event(Event::Tick);
        // The socket listens and the start-up replicas are placed: start-up is done as far as
        // systemd is concerned. Waiting for them to warm could take longer than any sensible
        // TimeoutStartSec (model loads take minutes), and `hearth status` shows their progress.
        let line = self.status_line();
        self.notifier.ready(&line);
    }

    fn message(&mut self, msg: ShellMsg) {
        match msg {
            ShellMsg::Event(ev) => self.event(ev),
            ShellMsg::Snapshot { reply } => {
                let _ = reply.send(self.node.status(None, self.clock.now()));
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
                let id = self.fx.register(reply, report);
                self.event(Event::Request { id, peer, request });
            }
        }
    }

    /// SIGTERM/SIGINT: tell systemd before the drain starts, then the core.
    fn stop(&mut self, immediate: bool) {
        if !self.stopping {
            self.stopping = true;
            self.fx.cancel_prefetches();
            // Before the drain starts, so that systemd shows the unit as deactivating for the
            // whole drain, also when the stop came from someone's `kill` rather than from
            // `systemctl stop`.
            self.notifier
                .stopping("stopping: draining and stopping every replica");
        }
        self.event(Event::Shutdown { immediate });
    }

    /// Hands one event to the core and carries out what it asks.
    fn event(&mut self, ev: Event) {
        let now = self.clock.now();
        self.fx.begin(gpu_of(&ev));
        let actions = self.node.handle(ev, now);
        let mut reloaded = false;
        for action in actions {
            match action {
                Action::ReadConfig { cause } => {
                    self.notifier.reloading();
                    reload::start_read(
                        self.config_path.clone(),
                        self.fixed.clone(),
                        cause,
                        self.events.clone(),
                        &self.tracker,
                    );
                }
                Action::ReloadDone { cause, applied } => {
                    if let Some(cfg) = applied {
                        if let Some(period) = self.settings.apply(cause, &cfg, self.tick.period()) {
                            self.tick = ticker(period);
                        }
                    }
                    reloaded = true;
                }
                other => self.fx.apply(other),
            }
        }
        if reloaded {
            // Applied or refused: either way the daemon runs a valid configuration.
            let line = self.status_line();
            self.notifier.ready(&line);
        } else if self.fx.changed() && self.notifier.enabled() {
            // The status line follows what changed (a replica's state, the routed set, a scale
            // decision, a GPU), not the clock: an event that published nothing, like most
            // reports and ticks, does not rebuild it, and an unchanged line is not resent.
            let line = self.status_line();
            self.notifier.status(&line);
        }
    }

    fn status_line(&self) -> String {
        let st = self.node.status(None, self.clock.now());
        status_line(&st, &self.gpu_kind, self.stopping)
    }
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// The next tick of a timer that may not exist (no watchdog): never, then.
async fn tick_opt(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The device an event is about, for the `GPU` field of what the core logs in answer.
fn gpu_of(ev: &Event) -> Option<String> {
    match ev {
        Event::GpuXid { uuid, .. } | Event::GpuMemory { uuid, .. } => Some(uuid.clone()),
        _ => None,
    }
}
