//! The daemon's event loop: one task owns the `Node`; workers (socket connections, process
//! watchers, probes, the timer, signals) only send it messages; it turns actions into effects.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tokio::net::UnixListener;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::control::{self, Control};
use super::gpu_monitor::{self, MonitorSink};
use super::inventory::Inventory;
use super::supervisor::Supervisor;
use super::{probe, scrape, state};
use crate::config::Config;
use crate::core::{Action, Event, LogLevel, Node, Peer, Time};
use crate::protocol::{ErrorCode, Failure, Request, WatchEvent};

/// Messages to the core's task.
pub enum ShellMsg {
    Event(Event),
    /// A control request; answered with the reply and the publish sequence at that moment.
    Request {
        peer: Peer,
        request: Request,
        reply: oneshot::Sender<(Value, u64)>,
    },
    /// SIGHUP: re-read the configuration file.
    ReloadSignal,
}

/// A watch event as broadcast to watchers, numbered so a watch can skip what its snapshot holds.
#[derive(Debug)]
pub struct Published {
    pub seq: u64,
    pub event: WatchEvent,
    pub json: Value,
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
}

/// Capacity of the queue into the core's task: a flood of reports waits here rather than
/// growing memory without bound.
const INBOX: usize = 8192;

impl Daemon {
    /// Runs until every replica is gone after `stop` (SIGTERM/SIGINT) asked for a shutdown. The
    /// caller owns the listener and the stop channel, so tests can drive both.
    pub async fn run(
        self,
        listener: UnixListener,
        mut stop: mpsc::Receiver<bool>,
        mut hup: mpsc::Receiver<()>,
    ) -> anyhow::Result<()> {
        let Daemon {
            config,
            config_path,
            mut inventory,
        } = self;
        let clock = Clock::new();
        let (tx, mut rx) = mpsc::channel::<ShellMsg>(INBOX);
        let (published, _) = broadcast::channel::<Arc<Published>>(4096);
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let socket_path = config.daemon.socket.clone();
        let state_dir = config.daemon.state_dir.clone();

        tracing::info!("GPU inventory: {}", inventory.describe());
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
        let control = Control {
            to_core: tx.clone(),
            published: published.clone(),
            access: Arc::new(Access::new(config.access.clone())),
        };
        tracker.spawn(control::serve(
            listener,
            control,
            shutdown.clone(),
            tracker.clone(),
        ));

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
        };
        let mut tick = tokio::time::interval(config.daemon.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping = false;
        let mut hard_deadline: Option<tokio::time::Instant> = None;
        let first = node.handle(Event::Tick, clock.now());
        fx.apply(first);

        while !fx.done {
            let msg = tokio::select! {
                biased;
                Some(immediate) = stop.recv() => {
                    if !stopping {
                        stopping = true;
                        fx.supervisor.cancel_prefetches();
                        hard_deadline = Some(tokio::time::Instant::now() + node.config().daemon.shutdown_timeout + Duration::from_secs(5));
                    }
                    ShellMsg::Event(Event::Shutdown { immediate })
                }
                Some(()) = hup.recv() => ShellMsg::ReloadSignal,
                Some(msg) = rx.recv() => msg,
                _ = tick.tick() => {
                    if hard_deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
                        tracing::error!("replicas still alive past shutdown_timeout; exiting anyway");
                        break;
                    }
                    ShellMsg::Event(Event::Tick)
                }
            };
            let actions = match msg {
                ShellMsg::Event(ev) => node.handle(ev, clock.now()),
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
                        let _ = reply.send((f.to_value(), fx.seq));
                        continue;
                    }
                    match Config::load(&config_path) {
                        Ok(cfg) => {
                            let id = fx.register(reply);
                            node.handle(
                                Event::Reload {
                                    id: Some(id),
                                    config: Box::new(cfg),
                                },
                                clock.now(),
                            )
                        }
                        Err(e) => {
                            tracing::error!("reload refused, old configuration kept: {e}");
                            let f = Failure::new(
                                ErrorCode::BadRequest,
                                format!("configuration not reloaded: {e}"),
                            );
                            let _ = reply.send((f.to_value(), fx.seq));
                            continue;
                        }
                    }
                }
                ShellMsg::Request {
                    peer,
                    request,
                    reply,
                } => {
                    let id = fx.register(reply);
                    node.handle(Event::Request { id, peer, request }, clock.now())
                }
                ShellMsg::ReloadSignal => match Config::load(&config_path) {
                    Ok(cfg) => {
                        tracing::info!("SIGHUP: reloading {}", config_path.display());
                        node.handle(
                            Event::Reload {
                                id: None,
                                config: Box::new(cfg),
                            },
                            clock.now(),
                        )
                    }
                    Err(e) => {
                        tracing::error!("SIGHUP: reload refused, old configuration kept: {e}");
                        continue;
                    }
                },
            };
            fx.apply(actions);
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

/// Turns the core's actions into effects.
struct Effects {
    supervisor: Supervisor,
    probes: reqwest::Client,
    tx: mpsc::Sender<ShellMsg>,
    published: broadcast::Sender<Arc<Published>>,
    seq: u64,
    replies: HashMap<u64, oneshot::Sender<(Value, u64)>>,
    next_id: u64,
    state_dir: PathBuf,
    done: bool,
    tracker: TaskTracker,
}

impl Effects {
    fn register(&mut self, reply: oneshot::Sender<(Value, u64)>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.replies.insert(id, reply);
        id
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Spawn(spec) => self.supervisor.spawn(spec),
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
                Action::Reply { id, response } => {
                    if let Some(tx) = self.replies.remove(&id) {
                        let _ = tx.send((response, self.seq));
                    }
                }
                Action::Publish(event) => {
                    self.seq += 1;
                    let json = serde_json::to_value(&event).unwrap_or_default();
                    let _ = self.published.send(Arc::new(Published {
                        seq: self.seq,
                        event,
                        json,
                    }));
                }
                Action::PersistOverrides(v) => {
                    if let Err(e) = state::save(&self.state_dir, &v) {
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
                } => log(level, model, replica, &message),
                Action::ShutdownComplete => self.done = true,
            }
        }
    }
}

fn log(
    level: LogLevel,
    model: Option<String>,
    replica: Option<crate::core::ReplicaId>,
    message: &str,
) {
    let model = model.unwrap_or_default();
    let replica = replica.map(|r| r.0).unwrap_or_default();
    match level {
        LogLevel::Debug => tracing::debug!(model, replica, "{message}"),
        LogLevel::Info => tracing::info!(model, replica, "{message}"),
        LogLevel::Warn => tracing::warn!(model, replica, "{message}"),
        LogLevel::Error => tracing::error!(model, replica, "{message}"),
    }
}
