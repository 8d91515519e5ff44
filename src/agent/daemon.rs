//! The daemon's event loop: one task owns the `Node`; workers (socket connections, process
//! watchers, probes, the timer, signals) only send it messages (inbox.rs); it hands each to the
//! core and turns the core's actions into effects (effects.rs), and tells systemd where things
//! stand (status_line.rs, notify.rs).

// The crate denies unsafe code; this file needs it for the environment, changed before the re-exec: each block says why it is sound.
#![allow(unsafe_code)]

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
use super::containment::Containment;
use super::control::{self, Control};
use super::core_thread::on_own_thread;
use super::effects::{Effects, Workers};
use super::fault::Faults;
use super::gpu_monitor::MonitorSink;
use super::gpu_owner::Attribution;
use super::handover::Incoming;
use super::inbox::{self, EventSink, ShellMsg};
use super::inventory::Inventory;
use super::ledger::{Persister, Saved};
use super::metrics::{self, Recorder};
use super::reload::{self, RestartOnly, Settings};
use super::replica_log::ReplicaLogs;
use super::running_config::RunningConfig;
use super::status_line::status_line;
use super::supervisor::Supervisor;
use super::wake::{ticker, Sources, Wake};
use super::{probe, state, upgrade};

mod upgrade_flow;
use crate::config::Config;
use crate::core::{Action, Adoption, Event, Ledger, Node, Time};
use crate::protocol::Request;
use crate::service::logging::LogControl;
use crate::service::notify::Notifier;

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
    /// Fault injection for tests (fault.rs); none in production.
    pub faults: Faults,
    /// Where replicas' output goes, chosen (and `state_dir/logs` opened) before the socket is
    /// bound.
    pub logs: ReplicaLogs,
    /// The texts `config` was read from, which an upgrade carries across.
    pub running: RunningConfig,
    /// What the binary before this one handed over, when `hearth upgrade` started this process.
    pub incoming: Option<Arc<Incoming>>,
    /// The hand-over document, read.
    pub handover: Option<Saved>,
    /// How the file on disk differs from `config`, where this process runs a configuration
    /// carried across an upgrade.
    pub config_differs: Option<String>,
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
    restart_only: Arc<RestartOnly>,
    settings: Settings,
    events: EventSink,
    tracker: TaskTracker,
    /// "nvml", "static"…, for the status line.
    gpu_kind: String,
    /// SIGTERM/SIGINT came: the status line counts what is left.
    stopping: bool,
    /// Where replicas live: the proofs saved with the ledger.
    containment: Arc<Containment>,
    /// Writes the ledger (ledger.rs) off the loop.
    persister: Persister,
    /// The last ledger handed to the persister, to skip writing what did not change.
    saved: Vec<u8>,
    /// What an upgrade re-executes (taken at start), the socket it keeps open, and the
    /// loop's own wake-up for it.
    reexec: Option<upgrade::Reexec>,
    listener_fd: std::os::fd::RawFd,
    upgrade_due: mpsc::Sender<upgrade::UpgradeStep>,
    /// An upgrade's check or exec is under way: another is refused meanwhile.
    upgrading: bool,
    faults: Faults,
    /// The texts behind the running configuration, and the text of the last file read for a
    /// reload (it runs once the core applies it).
    running: RunningConfig,
    read_text: Option<Arc<str>>,
    /// What this process was handed over, if an upgrade started it: committed once adopted.
    incoming: Option<Arc<Incoming>>,
    /// The replicas in that hand-over (id, pid, state), to tell which kept their process.
    handed: Vec<(String, u32, crate::core::ReplicaState)>,
    config_differs: Option<String>,
    /// The runtime's workers, where what the loop starts runs (the loop has a thread of its
    /// own: `on_own_thread`).
    workers: tokio::runtime::Handle,
}

impl Daemon {
    /// Runs until every replica is gone after `stop` (SIGTERM/SIGINT) asked for a shutdown. The
    /// caller owns the listeners and the stop channel, so tests can drive both.
    pub async fn run(
        self,
        listener: UnixListener,
        metrics_listener: Option<TcpListener>,
        stop: mpsc::Receiver<bool>,
        hup: mpsc::Receiver<()>,
    ) -> anyhow::Result<()> {
        let Daemon {
            config,
            config_path,
            mut inventory,
            notifier,
            log,
            faults,
            logs,
            running,
            incoming,
            handover,
            config_differs,
        } = self;
        let clock = Clock::new();
        let (tx, rx) = inbox::channel();
        let (operators_tx, operators_rx) = inbox::channel();
        let events = EventSink::new(tx.clone());
        let published = inbox::published();
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let socket_path = config.daemon.socket.clone();
        let state_dir = config.daemon.state_dir.clone();
        let reexec = upgrade::Reexec::current();
        let listener_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let (upgrade_due, upgrade_wake) = mpsc::channel(1);

        let gpu_source = inventory.describe();
        tracing::info!("GPU inventory: {gpu_source}");
        // "nvml: 8 device(s), driver …" → "nvml", for the one-line status.
        let gpu_kind = gpu_source.split(':').next().unwrap_or("gpus").to_string();
        // main.rs checked the directory (paths.rs) before anything was created.
        let overrides = state::load(&state_dir, &config)?;
        let host_ram = host_ram();
        if config.models.iter().any(|m| m.sleep.is_some()) {
            match (config.daemon.host_memory, host_ram) {
                (Some(b), _) => tracing::info!(
                    "sleeping replicas may hold {} of host RAM (daemon.host_memory)",
                    crate::units::short_bytes(b)
                ),
                (None, Some(r)) => tracing::info!(
                    "sleeping replicas may hold {} of host RAM: half of the host's {} \
                     (daemon.host_memory sets it)",
                    crate::units::short_bytes(r / 2),
                    crate::units::short_bytes(r)
                ),
                (None, None) => tracing::warn!(
                    "the host's RAM could not be read: what sleeping replicas hold in it is not \
                     bounded (daemon.host_memory sets a bound)"
                ),
            }
        }
        let node = Node::new(config.clone(), inventory.devices(), overrides, clock.now())
            .with_host_ram(host_ram);

        // Where replicas live (systemd scopes, a cgroup2 subtree, or process groups); what an
        // earlier run left there is adopted where its saved ledger proves it, the rest
        // stopped, before the first replica of this run is placed.
        let (how, saved) = upgrade::saved_state(&state_dir, handover);
        let handed: Vec<_> = match (&how, &saved) {
            (Adoption::HandedOver, Some(s)) => {
                // A new binary that cannot adopt falls back to the previous one (handover.rs).
                faults.check_handover()?;
                s.ledger
                    .replicas
                    .iter()
                    .map(|r| (r.replica.clone(), r.pid, r.state))
                    .collect()
            }
            _ => Vec::new(),
        };
        let (containment, adopted) = containment::start(&state_dir, saved).await?;
        match containment.stop_everything_command() {
            Some(cmd) => tracing::info!(
                "replicas outlive the daemon (SIGTERM still drains and stops them; `hearth upgrade` replaces the daemon without stopping them); if hearth will not come back, stop them all with: {cmd}"
            ),
            None => tracing::info!(
                "replicas die with the daemon (PDEATHSIG): without a cgroup the next run could not find them"
            ),
        }
        tracing::info!("{}", logs.describe());
        super::replica_log::start_rotator(logs.clone(), containment.clone());

        // XIDs, memory readings and inventory changes, from a thread of their own; it stops when
        // this is dropped. GPU memory is attributed by each replica's cgroup where containment
        // makes one, else by the process tree (see gpu_owner.rs).
        let _monitor = inventory.start_monitor(MonitorSink::new(
            events.clone(),
            Arc::new(Attribution::new(containment.gpu_owners())),
        ));
        let sampling = Arc::new(AtomicBool::new(false));
        containment::start_sampler(containment.clone(), events.clone(), sampling.clone());

        // main.rs made the default account, where the host lacked it.
        let accounts = Accounts::lookup();
        accounts.open_socket_to_replicas(&socket_path);
        let access =
            Arc::new(Access::new(config.access.clone()).with_containment(containment.clone()));
        let control = Control {
            to_core: tx.clone(),
            operators: operators_tx.clone(),
            published: published.clone(),
            access: access.clone(),
            reporters: Some(tokio::runtime::Handle::current()),
        };
        // Served from the core's thread (below).
        let listener = listener.into_std()?;
        let recorder = Arc::new(Recorder::new());
        if let Some(l) = metrics_listener {
            if let Ok(addr) = l.local_addr() {
                tracing::info!("metrics at http://{addr}/metrics");
            }
            tracker.spawn(metrics::serve(
                l,
                recorder.clone(),
                operators_tx.clone(),
                shutdown.clone(),
                tracker.clone(),
            ));
        }
        let workers = Workers {
            supervisor: Supervisor::start(events.clone(), containment.clone(), accounts, logs),
            containment: containment.clone(),
            http: probe::client(),
            events: events.clone(),
            tracker: tracker.clone(),
        };
        for r in &adopted.replicas {
            workers.supervisor.watch_adopted(
                crate::core::ReplicaId(r.replica.clone()),
                r.pid,
                r.model.clone(),
            );
        }
        let persister = Persister::start(&state_dir);
        let mut shell = Shell {
            node,
            fx: Effects::new(workers, published, recorder, state_dir),
            clock,
            notifier,
            tick: ticker(config.daemon.tick),
            config_path,
            restart_only: Arc::new(RestartOnly::new(&config)),
            settings: Settings { log, access },
            events,
            tracker: tracker.clone(),
            gpu_kind,
            stopping: false,
            containment: containment.clone(),
            persister,
            saved: Vec::new(),
            reexec,
            listener_fd,
            upgrade_due,
            upgrading: false,
            faults,
            running,
            read_text: None,
            incoming,
            handed,
            config_differs,
            workers: tokio::runtime::Handle::current(),
        };
        on_own_thread(async move {
            // From here on, on the core's own thread (see `on_own_thread`).
            let listener = UnixListener::from_std(listener)?;
            tracker.spawn(control::serve(
                listener,
                control,
                shutdown.clone(),
                tracker.clone(),
            ));
            shell.tick = ticker(shell.tick.period());
            shell
                .run(how, adopted, stop, hup, rx, operators_rx, upgrade_wake)
                .await;
            shell.fx.finish(Duration::from_secs(2));
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
        })
        .await
    }
}

impl Shell {
    /// The loop: until every replica is gone after a shutdown (or its deadline passed).
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &mut self,
        how: Adoption,
        adopted: Ledger,
        stop: mpsc::Receiver<bool>,
        hup: mpsc::Receiver<()>,
        inbox: mpsc::Receiver<ShellMsg>,
        operators: mpsc::Receiver<ShellMsg>,
        upgrade: mpsc::Receiver<upgrade::UpgradeStep>,
    ) {
        let shell = self;
        {
            let workers = shell.workers.clone();
            let _on_workers = workers.enter();
            shell.start(how, adopted);
        }
        // Pings come from this loop, the one that owns the core, and from nowhere else: if the
        // core hangs in `handle`, or the loop stops turning, they stop and systemd restarts us.
        let watchdog = shell.notifier.watchdog_interval().map(ticker);
        if let Some(t) = shell.notifier.watchdog_timeout() {
            tracing::info!(
                "systemd watchdog: {}ms; pinging every {}ms",
                t.as_millis(),
                t.as_millis() / 2
            );
        }
        let mut sources = Sources {
            stop,
            hup,
            watchdog,
            inbox,
            operators,
            operators_first: true,
            deadline: None,
            upgrade,
        };

        // Work done since the loop last let the connections on its thread run.
        let mut worked = Duration::ZERO;
        while !shell.fx.done() {
            let wake = sources.next(&mut shell.tick).await;
            let began = Instant::now();
            if !shell.wake(wake, &mut sources) {
                break;
            }
            worked += began.elapsed();
            // Under a flood the queues never run dry and the loop would run until the runtime's
            // budget (128 messages, milliseconds of work) stops it, while an operator's
            // connection on this thread waits to be accepted, read or answered. It steps aside
            // after `TURN` of work instead.
            if worked >= TURN {
                worked = Duration::ZERO;
                tokio::task::yield_now().await;
            }
        }
    }

    /// Handles one wake-up; false: leave the loop. Whatever it starts is spawned on the
    /// runtime's workers, not on the core's thread.
    fn wake(&mut self, wake: Wake, sources: &mut Sources) -> bool {
        let workers = self.workers.clone();
        let _on_workers = workers.enter();
        match wake {
            Wake::Msg(msg) => self.message(msg),
            Wake::Stop(immediate) => {
                if !self.stopping {
                    // Checked: shutdown_timeout is whatever the file said.
                    sources.deadline = self
                        .node
                        .config()
                        .daemon
                        .shutdown_timeout
                        .checked_add(Duration::from_secs(5))
                        .and_then(|d| tokio::time::Instant::now().checked_add(d));
                }
                self.stop(immediate);
            }
            Wake::Hangup => self.event(Event::ReloadSignal),
            Wake::Watchdog => self.notifier.watchdog(),
            Wake::Upgrade(step) => self.upgrade_step(step),
            Wake::Tick => self.event(Event::Tick),
            Wake::Deadline => {
                tracing::error!("replicas still alive past shutdown_timeout; exiting anyway");
                return false;
            }
        }
        true
    }
}

impl Shell {
    /// Adoption first (so that the first tick counts the adopted replicas), then the first
    /// tick places the start-up replicas; then systemd hears that start-up is done.
    fn start(&mut self, how: Adoption, adopted: Ledger) {
        self.event(Event::Adopt {
            how,
            ledger: adopted,
        });
        self.adopted_handover();
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
                self.faults.check(&request, &peer);
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
        if let Event::ConfigRead(Ok(new)) = &ev {
            self.read_text = Some(new.text.clone());
        }
        // What the ledger holds changes with the processes, with what was published, and with
        // the bursts a model's autoscaler has seen (a level grows for a minute after its onset
        // without a decision): a tick compares the ledger too, and rewrites it only if it
        // changed.
        let ledger_may_change = matches!(
            ev,
            Event::Spawned { .. } | Event::Exited { .. } | Event::Adopt { .. } | Event::Tick
        );
        self.fx.begin(gpu_of(&ev));
        let actions = self.node.handle(ev, now);
        let mut reloaded = false;
        for action in actions {
            match action {
                Action::ReadConfig { cause } => {
                    self.notifier.reloading();
                    reload::start_read(
                        self.config_path.clone(),
                        self.restart_only.clone(),
                        cause,
                        self.events.clone(),
                        &self.tracker,
                    );
                }
                Action::ReloadDone { cause, applied } => {
                    let text = self.read_text.take();
                    if let Some(cfg) = applied {
                        if let Some(text) = text {
                            self.running.applied(text);
                        }
                        if let Some(period) = self.settings.apply(cause, &cfg, self.tick.period()) {
                            self.tick = ticker(period);
                        }
                    }
                    reloaded = true;
                }
                Action::Upgrade { id } => self.upgrade_asked(id),
                other => self.fx.apply(other),
            }
        }
        if ledger_may_change || self.fx.changed() {
            self.persist();
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

    /// The ledger and the proofs, as the next run would need them now.
    fn snapshot(&self) -> Vec<u8> {
        let saved = Saved::new(self.node.ledger(), self.containment.proofs());
        serde_json::to_vec(&saved).unwrap_or_default()
    }

    /// Hands the ledger to the writer if it changed.
    fn persist(&mut self) {
        let bytes = self.snapshot();
        if bytes != self.saved {
            self.saved = bytes.clone();
            self.persister.save(bytes);
        }
    }

    fn status_line(&self) -> String {
        let st = self.node.status(None, self.clock.now());
        status_line(&st, &self.gpu_kind, self.stopping)
    }
}

/// Work the loop does before it lets the other tasks on its thread run (see `Shell::run`).
const TURN: Duration = Duration::from_micros(200);

/// The device an event is about, for the `GPU` field of what the core logs in answer.
fn gpu_of(ev: &Event) -> Option<String> {
    match ev {
        Event::GpuXid { uuid, .. } => Some(uuid.clone()),
        Event::GpuReading(r) => Some(r.uuid.clone()),
        _ => None,
    }
}

/// The host's RAM (sysinfo's total), for the default bound on what sleeping replicas hold.
/// None where the system does not say.
fn host_ram() -> Option<u64> {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    Some(sys.total_memory()).filter(|t| *t > 0)
}
