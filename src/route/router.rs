//! The shell around the queue: what every request task and the daemon link share. The queue's
//! decisions are pure (`queue.rs`); here they are applied under a lock that is held for the
//! decision only, never across an await, so a request that finds a free slot takes it with no
//! task hop. Waiting requests get their grant over a oneshot channel, sent under the same lock,
//! so a request that gives up (timeout, client gone) can always tell whether a grant reached it
//! and release it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::agent::{self, Answer, Capacity};
use super::fleet::{Fleet, Target};
use super::metrics::Metrics;
use super::queue::{Admit, Delivery, Grant, ModelState, Queues};
use super::settings::RouteSettings;

type Ticket = oneshot::Sender<Grant>;

pub struct Router {
    pub settings: RouteSettings,
    queues: Mutex<Queues<Ticket>>,
    pub metrics: Metrics,
    /// Wakes the reporter: a report is due now, or the next crossing moved earlier.
    pub report_wake: Notify,
    pub daemon_connected: AtomicBool,
    /// `max_buffered`, in units of `body::UNIT` bytes: what request bodies may hold together.
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// `max_buffered_per_client`: what each client address holds of it.
    pub client_bodies: Arc<super::body::ClientBodies>,
    /// Unix time at start, for `/v1/models`' `created`.
    pub started_unix: u64,
    /// Its name in reports (`router`), by which the daemon tells a front door's reports from
    /// the replicas' own: where it listens.
    pub name: String,
    /// The daemon's capacity events, the balancers polling the agent, the drains (fleet.rs).
    fleet: Mutex<Fleet>,
    /// Per model: its drain is over, requests are refused (read by every request).
    refusing: Box<[AtomicBool]>,
    /// A stop's drain is over: the listener may close.
    stop_drained: AtomicBool,
}

/// Why a request got no replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Full,
    Timeout,
}

/// A slot on a replica. Dropping it gives the slot back (the request ended, or its client
/// left, whatever the path); `eject` first marks the replica as failing.
pub struct Lease {
    router: Arc<Router>,
    pub grant: Grant,
    /// When the request was granted, for the queue-wait metric.
    pub granted_at: Instant,
}

impl Router {
    pub fn new(settings: RouteSettings) -> Router {
        let queues = Mutex::new(Queues::new(&settings.models));
        let body_budget = Arc::new(tokio::sync::Semaphore::new(
            settings
                .max_buffered
                .div_ceil(super::body::UNIT)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        ));
        let client_bodies = super::body::ClientBodies::new(settings.max_buffered_per_client);
        let metrics = Metrics::new(&settings.models);
        let name = format!("hearth route {}", settings.listen);
        let fleet = Mutex::new(Fleet::new(
            settings.models.len(),
            settings.drain_timeout,
            settings.drain_grace,
            Instant::now(),
        ));
        let refusing = settings
            .models
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        Router {
            name,
            fleet,
            refusing,
            stop_drained: AtomicBool::new(false),
            settings,
            queues,
            metrics,
            report_wake: Notify::new(),
            daemon_connected: AtomicBool::new(false),
            body_budget,
            client_bodies,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// A free slot on the model's least outstanding replica, waiting in the model's FIFO until
    /// one frees or `timeout` passes.
    pub async fn acquire(
        self: &Arc<Self>,
        model: usize,
        timeout: Duration,
    ) -> Result<Lease, Refused> {
        let mut rx = None;
        let admitted = self.with_queues(|q| {
            q.admit(model, Instant::now(), || {
                let (tx, r) = oneshot::channel();
                rx = Some(r);
                tx
            })
        });
        self.wait(model, admitted, rx, timeout).await
    }

    /// A slot on another replica for a request whose replica failed before any byte reached
    /// its client, ahead of the FIFO. The failed lease is given back first.
    pub async fn reacquire(
        self: &Arc<Self>,
        failed: Lease,
        timeout: Duration,
    ) -> Result<Lease, Refused> {
        let (model, key) = (failed.grant.model, failed.grant.replica);
        drop(failed);
        let mut rx = None;
        let admitted = self.with_queues(|q| {
            q.retry(model, key, Instant::now(), || {
                let (tx, r) = oneshot::channel();
                rx = Some(r);
                tx
            })
        });
        self.wait(model, admitted, rx, timeout).await
    }

    async fn wait(
        self: &Arc<Self>,
        model: usize,
        admitted: Admit,
        rx: Option<oneshot::Receiver<Grant>>,
        timeout: Duration,
    ) -> Result<Lease, Refused> {
        let seq = match admitted {
            Admit::Granted(grant) => return Ok(self.lease(grant)),
            Admit::Full => return Err(Refused::Full),
            Admit::Queued(seq) => seq,
        };
        let mut waiting = Waiting {
            router: self.clone(),
            model,
            seq,
            rx: rx.expect("a queued request has its channel"),
            done: false,
        };
        let outcome = tokio::time::timeout(timeout, &mut waiting.rx).await;
        waiting.done = true;
        match outcome {
            Ok(Ok(grant)) => Ok(self.lease(grant)),
            // The queue never drops a ticket without a grant except by `cancel`, which only we
            // call; treat it as a timeout all the same.
            Ok(Err(_)) => Err(Refused::Timeout),
            Err(_) => {
                let gone = self.with_queues(|q| q.cancel(model, seq).is_some());
                if gone {
                    return Err(Refused::Timeout);
                }
                // The grant was sent while the timer fired: it is in the channel; use it.
                match waiting.rx.try_recv() {
                    Ok(grant) => Ok(self.lease(grant)),
                    Err(_) => Err(Refused::Timeout),
                }
            }
        }
    }

    fn lease(self: &Arc<Self>, grant: Grant) -> Lease {
        Lease {
            router: self.clone(),
            grant,
            granted_at: Instant::now(),
        }
    }

    /// Whether another replica of the model is routed (a retry has somewhere to go).
    pub fn has_other(&self, model: usize, key: super::queue::ReplicaKey) -> bool {
        self.lock().has_other(model, key)
    }

    /// The daemon's routed set for a model.
    pub fn set_routed(&self, model: usize, endpoints: &[(String, std::net::SocketAddr)]) {
        self.with_queues(|q| q.set_routed(model, endpoints, Instant::now()));
    }

    pub fn set_slots(&self, model: usize, slots: u32) {
        self.with_queues(|q| q.set_slots(model, slots, Instant::now()));
    }

    /// Periodic: ejections that ran out free their replicas' slots for waiting requests;
    /// drains that are over start refusing.
    pub fn tick(&self) {
        let now = Instant::now();
        self.with_queues(|q| q.tick(now));
        self.drains_tick(now);
    }

    /// Reports due now (and the queue's bookkeeping of what they showed).
    pub fn reports(&self) -> Vec<crate::protocol::Report> {
        self.lock().reports(Instant::now())
    }

    pub fn next_crossing(&self) -> Option<Instant> {
        self.lock().next_crossing()
    }

    /// A report is due at once.
    pub fn take_urgent(&self) -> bool {
        self.lock().take_urgent()
    }

    pub fn states(&self) -> Vec<ModelState> {
        self.lock().states(Instant::now())
    }

    fn lock(&self) -> MutexGuard<'_, Queues<Ticket>> {
        // A panic while holding the lock (a bug) must not take every later request with it:
        // the queue's state is updated in one step per call.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a decision that may hand grants out, delivers them under the lock, and wakes the
    /// reporter when the decision asks for it.
    fn with_queues<R>(&self, f: impl FnOnce(&mut Queues<Ticket>) -> R) -> R
    where
        R: TakeDeliveries,
    {
        let (out, wake) = {
            let mut q = self.lock();
            let mut out = f(&mut q);
            let mut pending = out.take_deliveries();
            while !pending.is_empty() {
                let mut again = Vec::new();
                for (ticket, grant) in pending {
                    // A receiver can only be gone if its request was dropped between its cancel
                    // and now, which the lock excludes; give the slot back all the same.
                    if let Err(grant) = ticket.send(grant) {
                        again.extend(q.release(&grant, Instant::now()));
                    }
                }
                pending = again;
            }
            let wake = q.take_reschedule() | q.urgent_pending();
            (out, wake)
        };
        if wake {
            self.report_wake.notify_one();
        }
        out
    }
}

/// Results of queue decisions that may carry grants to deliver.
trait TakeDeliveries {
    fn take_deliveries(&mut self) -> Vec<Delivery<Ticket>>;
}

impl TakeDeliveries for Vec<Delivery<Ticket>> {
    fn take_deliveries(&mut self) -> Vec<Delivery<Ticket>> {
        std::mem::take(self)
    }
}

impl TakeDeliveries for Admit {
    fn take_deliveries(&mut self) -> Vec<Delivery<Ticket>> {
        Vec::new()
    }
}

impl TakeDeliveries for bool {
    fn take_deliveries(&mut self) -> Vec<Delivery<Ticket>> {
        Vec::new()
    }
}

impl TakeDeliveries for () {
    fn take_deliveries(&mut self) -> Vec<Delivery<Ticket>> {
        Vec::new()
    }
}

impl Lease {
    /// The replica's connection failed: pass it over for a while. The slot is given back when
    /// the lease is dropped.
    pub fn eject(&self) {
        self.router
            .with_queues(|q| q.eject(&self.grant, Instant::now()));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let grant = &self.grant;
        self.router
            .with_queues(|q| q.release(grant, Instant::now()));
    }
}

/// A request waiting in the FIFO; dropped before its grant arrived (the client left), it takes
/// itself out of the queue, or gives back a grant that reached it meanwhile.
struct Waiting {
    router: Arc<Router>,
    model: usize,
    seq: u64,
    rx: oneshot::Receiver<Grant>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let removed = self
            .router
            .with_queues(|q| q.cancel(self.model, self.seq).is_some());
        if !removed {
            if let Ok(grant) = self.rx.try_recv() {
                drop(self.router.lease(grant));
            }
        }
    }
}

/// Whether the router currently follows the daemon.
impl Router {
    pub fn set_daemon_connected(&self, up: bool) {
        self.daemon_connected.store(up, Ordering::Relaxed);
        self.fleet().set_daemon(up, Instant::now());
    }

    pub fn is_daemon_connected(&self) -> bool {
        self.daemon_connected.load(Ordering::Relaxed)
    }
}

/// The fleet's side: the daemon's capacity events, agent checks, drains (docs/fleet.md).
impl Router {
    fn fleet(&self) -> MutexGuard<'_, Fleet> {
        self.fleet.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_capacity(&self, model: usize, c: Capacity) {
        self.fleet().set_capacity(model, c, Instant::now());
    }

    /// The daemon's last capacity event for the model; None before one came.
    pub fn capacity(&self, model: usize) -> Option<Capacity> {
        self.fleet().capacity(model)
    }

    /// Whether requests for the model are refused now (its drain is over).
    pub fn refusing(&self, model: usize) -> bool {
        self.refusing
            .get(model)
            .is_some_and(|r| r.load(Ordering::Relaxed))
    }

    /// SIGTERM with an agent listening: every model drains before the listener closes.
    pub fn begin_stop(&self) {
        self.fleet().begin_stop(Instant::now());
    }

    pub fn stop_drained(&self) -> bool {
        self.stop_drained.load(Ordering::Relaxed)
    }

    /// Per model: 0 serving, 1 answering `drain` (still serving), 2 drained (refusing).
    pub fn drain_phases(&self) -> Vec<u8> {
        let f = self.fleet();
        (0..self.settings.models.len())
            .map(|i| u8::from(f.draining(i)) + u8::from(self.refusing(i)))
            .collect()
    }

    /// Periodic: drains that are over start refusing; a stop whose every model's drain is over
    /// lets the listener close.
    fn drains_tick(&self, now: Instant) {
        let arrivals: Vec<Option<Instant>> = {
            let q = self.lock();
            (0..self.settings.models.len())
                .map(|i| q.last_arrival(i))
                .collect()
        };
        let (done, stopping, seen): (Vec<bool>, bool, usize) = {
            let f = self.fleet();
            let done = arrivals
                .iter()
                .enumerate()
                .map(|(i, a)| f.drain_done(i, *a, now))
                .collect();
            (done, f.stopping(), f.balancers_seen(now))
        };
        for (i, d) in done.iter().enumerate() {
            let was = self.refusing[i].swap(*d, Ordering::Relaxed);
            if was != *d && !stopping {
                let name = &self.settings.models[i].name;
                if *d {
                    tracing::info!(model = %name, "drained: {seen} balancer(s) polling were told, then no request for {:?}; refusing (503) what still comes", self.settings.drain_grace);
                } else {
                    tracing::info!(model = %name, "undrained: serving again");
                }
            }
        }
        if stopping && !done.is_empty() && done.iter().all(|d| *d) && !self.stop_drained() {
            tracing::info!("drained for the stop: {seen} balancer(s) polling were told");
            self.stop_drained.store(true, Ordering::Relaxed);
        }
        if stopping && done.is_empty() {
            self.stop_drained.store(true, Ordering::Relaxed);
        }
    }

    /// The answer to an agent check from `ip` that sent `asked` (a model's name or alias; empty
    /// for the host as a whole), recorded as that balancer's.
    pub fn agent_answer(&self, ip: std::net::IpAddr, asked: &str) -> Answer {
        let now = Instant::now();
        let target = if asked.is_empty() {
            Target::Host
        } else {
            match self.settings.resolve(asked) {
                Some(i) => Target::Model(i),
                None => Target::Unknown,
            }
        };
        let loads: Vec<agent::Load> = {
            let q = self.lock();
            match target {
                Target::Host => (0..self.settings.models.len())
                    .map(|i| q.load(i, now))
                    .collect(),
                Target::Model(i) => vec![q.load(i, now)],
                Target::Unknown => Vec::new(),
            }
        };
        let balancers = self.settings.balancers;
        let mut f = self.fleet();
        let gone = f.daemon_gone_for(now);
        let input = |i: usize, load: agent::Load| agent::ModelInput {
            load,
            capacity: f.capacity(i),
            draining: f.draining(i),
            daemon_gone_for: gone,
            stale_after: self.settings.models[i].stale_after,
        };
        let answer = match target {
            Target::Host => {
                let inputs: Vec<agent::ModelInput> = loads
                    .into_iter()
                    .enumerate()
                    .map(|(i, l)| input(i, l))
                    .collect();
                agent::host_answer(&inputs, balancers)
            }
            Target::Model(i) => {
                let load = loads.first().copied().unwrap_or_default();
                agent::model_answer(&self.settings.models[i].name, &input(i, load), balancers)
            }
            Target::Unknown => agent::unknown_answer(asked),
        };
        f.polled(ip, target, &answer, now);
        answer
    }
}
