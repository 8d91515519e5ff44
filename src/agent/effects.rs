//! Turns the core's actions into effects: processes, probes and scrapes, answers, watch events,
//! saved overrides, metrics and log lines. It decides nothing; it does what the core asked.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{broadcast, oneshot};
use tokio_util::task::TaskTracker;

use super::containment::Containment;
use super::inbox::{Answered, EventSink, Published};
use super::metrics::{ReadyPath, Recorder};
use super::state::Saver;
use super::supervisor::Supervisor;
use super::{probe, scrape};
use crate::core::{Action, Event, LogLevel, Readiness, ReplicaId, RequestId};
use crate::protocol::{WatchEvent, WatchedState};

/// The workers actions start.
pub struct Workers {
    pub supervisor: Supervisor,
    /// Whose process listens on a replica's port, for warm-ups.
    pub containment: Arc<Containment>,
    /// Probes and scrapes share one HTTP client (and its connection pool).
    pub http: reqwest::Client,
    /// Where probe and scrape results go.
    pub events: EventSink,
    /// Probe and scrape tasks, so the daemon can wait for them at exit.
    pub tracker: TaskTracker,
}

/// Requests waiting for the core's answer.
#[derive(Default)]
struct Replies {
    waiting: HashMap<RequestId, oneshot::Sender<Answered>>,
    next_id: RequestId,
    /// Report requests among them, by request id, with their model: counted once accepted.
    reports: HashMap<RequestId, String>,
}

/// What the event being applied is: where the shell's own timings start, and what the log's
/// GPU field says for lines about no replica.
struct Current {
    /// When the event loop took this event up.
    started: Instant,
    /// The device this event is about, if it is about one.
    gpu: Option<String>,
    /// This event changed a replica's state, the routed set, a scale or a GPU.
    changed: bool,
}

pub struct Effects {
    workers: Workers,
    replies: Replies,
    published: broadcast::Sender<Arc<Published>>,
    /// Sequence number of the last published event.
    seq: u64,
    recorder: Arc<Recorder>,
    /// Writes `state_dir/overrides.json`, off the loop.
    saver: Saver,
    /// The GPUs of each replica that holds some, for the log's GPU field.
    gpus: HashMap<String, String>,
    current: Current,
    /// Every replica is gone after a shutdown.
    done: bool,
}

impl Effects {
    pub fn new(
        workers: Workers,
        published: broadcast::Sender<Arc<Published>>,
        recorder: Arc<Recorder>,
        state_dir: PathBuf,
    ) -> Effects {
        Effects {
            workers,
            replies: Replies {
                next_id: 1,
                ..Default::default()
            },
            published,
            seq: 0,
            recorder,
            saver: Saver::start(state_dir),
            gpus: HashMap::new(),
            current: Current {
                started: Instant::now(),
                gpu: None,
                changed: false,
            },
            done: false,
        }
    }

    /// Starts applying the actions of a new event. `gpu`: the device the event is about.
    pub fn begin(&mut self, gpu: Option<String>) {
        self.current = Current {
            started: Instant::now(),
            gpu,
            changed: false,
        };
    }

    /// The event applied last changed a replica's state, the routed set, a scale or a GPU.
    pub fn changed(&self) -> bool {
        self.current.changed
    }

    /// Every replica is gone after a shutdown.
    pub fn done(&self) -> bool {
        self.done
    }

    /// The loop ends: overrides still being written are given `within` to reach the disk.
    pub fn finish(&mut self, within: std::time::Duration) {
        self.saver.finish(within);
    }

    /// Keeps `reply` until the core answers the request it gets the returned id with.
    pub fn register(&mut self, reply: oneshot::Sender<Answered>, report: Option<String>) -> u64 {
        let id = self.replies.next_id;
        self.replies.next_id += 1;
        self.replies.waiting.insert(id, reply);
        if let Some(model) = report {
            self.replies.reports.insert(id, model);
        }
        id
    }

    /// Shutdown: prefetches under way stop.
    pub fn cancel_prefetches(&self) {
        self.workers.supervisor.cancel_prefetches();
    }

    pub fn apply(&mut self, action: Action) {
        match action {
            Action::Spawn(spec) => {
                if !spec.gpus.is_empty() {
                    self.gpus
                        .insert(spec.replica.0.clone(), spec.gpus.join(","));
                }
                self.workers.supervisor.spawn(spec)
            }
            Action::Prefetch {
                replica,
                model,
                globs,
            } => self.workers.supervisor.prefetch(replica, model, globs),
            Action::Signal {
                replica,
                pid,
                signal,
            } => self.workers.supervisor.signal(&replica, pid, signal),
            Action::Probe {
                replica,
                kind,
                after,
                spec,
            } => {
                let client = self.workers.http.clone();
                let events = self.workers.events.clone();
                let containment = self.workers.containment.clone();
                self.workers.tracker.spawn(async move {
                    if !after.is_zero() {
                        tokio::time::sleep(after).await;
                    }
                    let mut outcome = probe::run(&client, &spec).await;
                    if outcome.ok && spec.verify_owner {
                        outcome = probe::verify_owner(containment, &replica, &spec, outcome).await;
                    }
                    events
                        .send(Event::Probed {
                            replica,
                            kind,
                            outcome,
                        })
                        .await;
                });
            }
            Action::Scrape {
                replica,
                url,
                format,
                models,
                timeout,
            } => {
                let client = self.workers.http.clone();
                let events = self.workers.events.clone();
                self.workers.tracker.spawn(async move {
                    let outcome = scrape::run(&client, &url, format, &models, timeout).await;
                    events.send(Event::Scraped { replica, outcome }).await;
                });
            }
            Action::Reply { id, answer } => {
                if let Some(model) = self.replies.reports.remove(&id) {
                    if answer.is_ok() {
                        self.recorder.report(&model);
                    }
                }
                if let Some(tx) = self.replies.waiting.remove(&id) {
                    let _ = tx.send(Answered {
                        answer,
                        seq: self.seq,
                    });
                }
            }
            Action::Publish(event) => self.publish(event),
            Action::PersistOverrides(overrides) => self.saver.save(overrides),
            Action::Ready { model, how, .. } => {
                let (path, secs) = match how {
                    Readiness::Cold(d) => (ReadyPath::Cold, d.as_secs_f64()),
                    Readiness::Promoted => (
                        ReadyPath::Promote,
                        self.current.started.elapsed().as_secs_f64(),
                    ),
                    Readiness::Woken(d) => (ReadyPath::Wake, d.as_secs_f64()),
                };
                self.recorder.ready(&model, path, secs);
            }
            Action::Log {
                level,
                model,
                replica,
                message,
            } => {
                let gpu = match &replica {
                    Some(r) => self.gpus.get(r.as_str()).cloned(),
                    None => self.current.gpu.clone(),
                };
                log(level, model, replica, gpu, &message)
            }
            Action::ShutdownComplete => self.done = true,
            // The event loop's: it owns the timer, the notifier and the log filter.
            Action::ReadConfig { .. } | Action::ReloadDone { .. } | Action::Upgrade { .. } => {}
        }
    }

    fn publish(&mut self, event: WatchEvent) {
        self.current.changed = true;
        match &event {
            WatchEvent::Replica {
                replica,
                state: WatchedState::Gone(_),
                ..
            } => {
                self.gpus.remove(replica);
            }
            WatchEvent::Scale {
                model, from, to, ..
            } => self.recorder.scale(model, *from, *to),
            WatchEvent::Replica { .. }
            | WatchEvent::Routed { .. }
            | WatchEvent::Gpu { .. }
            | WatchEvent::Capacity { .. } => {}
        }
        self.seq += 1;
        let line = serde_json::to_string(&event).unwrap_or_default();
        let _ = self.published.send(Arc::new(Published {
            seq: self.seq,
            event,
            line,
        }));
    }
}

/// A line the core asked for, with the journal fields MODEL, REPLICA and GPU where known.
fn log(
    level: LogLevel,
    model: Option<String>,
    replica: Option<ReplicaId>,
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
