//! The router's decisions, with no I/O and no clock (time is passed in): per model a FIFO of
//! waiting requests, the routed replicas and their slots, which replica a request goes to, and
//! the reports that tell the daemon about all of it.
//!
//! - A request is granted a replica only when one has a free slot (`slots` per replica); among
//!   those, the least outstanding, ties taken in turn. Otherwise it waits in the model's FIFO,
//!   which holds at most `max_queue` requests.
//! - A replica that leaves the routed set gets nothing new from that moment; its requests in
//!   flight finish. When the last one does, a report saying so is due at once, so that the
//!   daemon's drain ends exactly then.
//! - A retry (the first replica failed before any byte reached the client) goes to another
//!   replica, ahead of the FIFO: it has waited longest.
//! - A replica whose connection failed is passed over for `EJECT_FOR`, so that while the daemon
//!   has not yet unrouted it (or is away) it does not take every other request.
//!
//! `T` is the shell's handle on a waiting request (a channel to hand it its grant); this module
//! only stores and returns it.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;

use super::settings::ModelRoute;
use crate::protocol::Report;

/// How long a replica whose connection failed is passed over.
pub const EJECT_FOR: Duration = Duration::from_secs(2);

/// A replica as the router knows it: the daemon's id at one address. A daemon that restarts
/// reuses ids for other processes on other ports, so the pair is the identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaKey(u64);

/// A slot on a replica, held by one request until `release`.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub model: usize,
    pub replica: ReplicaKey,
    pub id: Arc<str>,
    pub addr: SocketAddr,
    /// `addr` as the replica's `Host` header, and `id` as the answer's `x-hearth-replica` (None
    /// where an id is not a valid header value), made once per replica rather than per request.
    pub host: HeaderValue,
    pub id_header: Option<HeaderValue>,
}

#[derive(Debug, PartialEq)]
pub enum Admit {
    Granted(Grant),
    /// Waiting; the number identifies it for `cancel`.
    Queued(u64),
    /// The model's FIFO is full.
    Full,
}

/// What the shell must deliver: this grant to the request behind this handle.
pub type Delivery<T> = (T, Grant);

pub struct Queues<T> {
    models: Vec<ModelQueue<T>>,
    next_seq: u64,
    next_key: u64,
    /// A report should go out now (work for a model with nothing routed; a leaving replica
    /// became idle).
    urgent: bool,
    /// The earliest crossing of a target may have moved earlier.
    reschedule: bool,
}

struct ModelQueue<T> {
    name: String,
    slots: u32,
    max_queue: usize,
    target_wait: Duration,
    replicas: Vec<Replica>,
    /// Retries, ahead of everything; at most one per request in flight.
    retries: VecDeque<Waiter<T>>,
    /// The FIFO, by arrival number.
    waiting: BTreeMap<u64, Waiter<T>>,
    arrived: u64,
    completed: u64,
    /// Where the search for a replica starts, so that ties go round.
    turn: usize,
    /// The last report showed the oldest wait over the target.
    reported_over: bool,
    /// When the latest request arrived: a drain is over only after a quiet spell.
    last_arrival: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Replica {
    key: ReplicaKey,
    id: Arc<str>,
    addr: SocketAddr,
    host: HeaderValue,
    id_header: Option<HeaderValue>,
    routed: bool,
    in_flight: u32,
    arrived: u64,
    completed: u64,
    ejected_until: Option<Instant>,
}

struct Waiter<T> {
    seq: u64,
    since: Instant,
    exclude: Option<ReplicaKey>,
    ticket: T,
}

/// A model's state for `/v1/models` and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelState {
    pub name: String,
    pub slots: u32,
    pub routed: usize,
    pub queue_depth: usize,
    pub oldest_wait: Duration,
    /// Requests at replicas.
    pub running: u64,
    pub replicas: Vec<ReplicaState>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaState {
    pub id: Arc<str>,
    pub addr: SocketAddr,
    pub routed: bool,
    pub in_flight: u32,
}

impl<T> Queues<T> {
    pub fn new(models: &[ModelRoute]) -> Queues<T> {
        Queues {
            models: models
                .iter()
                .map(|m| ModelQueue {
                    name: m.name.clone(),
                    slots: m.slots,
                    max_queue: m.max_queue,
                    target_wait: m.target_wait,
                    replicas: Vec::new(),
                    retries: VecDeque::new(),
                    waiting: BTreeMap::new(),
                    arrived: 0,
                    completed: 0,
                    turn: 0,
                    reported_over: false,
                    last_arrival: None,
                })
                .collect(),
            next_seq: 0,
            next_key: 0,
            urgent: false,
            reschedule: false,
        }
    }

    pub fn model_index(&self, name: &str) -> Option<usize> {
        self.models.iter().position(|m| m.name == name)
    }

    /// A new request: a replica now, or a place in the FIFO (`ticket()` is called only then), or
    /// Full.
    pub fn admit(&mut self, model: usize, now: Instant, ticket: impl FnOnce() -> T) -> Admit {
        let m = &mut self.models[model];
        m.last_arrival = Some(now);
        if m.retries.is_empty() && m.waiting.is_empty() {
            if let Some(g) = m.take_slot(model, None, now) {
                m.arrived += 1;
                return Admit::Granted(g);
            }
        }
        if m.waiting.len() >= m.max_queue {
            return Admit::Full;
        }
        m.arrived += 1;
        if m.waiting.is_empty() && m.retries.is_empty() {
            self.reschedule = true;
            // Work for a model with nothing routed: the daemon must hear of it now (a model at
            // zero starts or promotes a replica on the first report that shows work).
            if !m.replicas.iter().any(|r| r.routed) {
                self.urgent = true;
            }
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        m.waiting.insert(
            seq,
            Waiter {
                seq,
                since: now,
                exclude: None,
                ticket: ticket(),
            },
        );
        Admit::Queued(seq)
    }

    /// A request whose replica failed before any byte reached its client: another replica now,
    /// or a place ahead of the FIFO until one has a free slot (one may have yet to be routed:
    /// the request is held, as any other, rather than failed).
    pub fn retry(
        &mut self,
        model: usize,
        failed: ReplicaKey,
        now: Instant,
        ticket: impl FnOnce() -> T,
    ) -> Admit {
        let m = &mut self.models[model];
        if let Some(g) = m.take_slot(model, Some(failed), now) {
            return Admit::Granted(g);
        }
        if m.waiting.is_empty() && m.retries.is_empty() {
            self.reschedule = true;
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        m.retries.push_back(Waiter {
            seq,
            since: now,
            exclude: Some(failed),
            ticket: ticket(),
        });
        Admit::Queued(seq)
    }

    /// Whether a replica other than `key` is routed for the model (somewhere a retry can go).
    pub fn has_other(&self, model: usize, key: ReplicaKey) -> bool {
        self.models[model]
            .replicas
            .iter()
            .any(|r| r.routed && r.key != key)
    }

    /// A report is due now (not taken: the reporter takes it).
    pub fn urgent_pending(&self) -> bool {
        self.urgent
    }

    /// Takes a waiting request out of the queue (timed out, or its client left). None: it was
    /// not waiting any more (its grant is on its way and must be released by whoever gets it).
    pub fn cancel(&mut self, model: usize, seq: u64) -> Option<T> {
        let m = &mut self.models[model];
        if let Some(w) = m.waiting.remove(&seq) {
            return Some(w.ticket);
        }
        let i = m.retries.iter().position(|w| w.seq == seq)?;
        m.retries.remove(i).map(|w| w.ticket)
    }

    /// The request holding `grant` is done with its replica (answered, failed, or its client
    /// left). Its slot goes to the next waiting request, if any.
    pub fn release(&mut self, grant: &Grant, now: Instant) -> Vec<Delivery<T>> {
        let m = &mut self.models[grant.model];
        if let Some(i) = m.replicas.iter().position(|r| r.key == grant.replica) {
            let r = &mut m.replicas[i];
            r.in_flight = r.in_flight.saturating_sub(1);
            r.completed += 1;
            m.completed += 1;
            if !r.routed && r.in_flight == 0 {
                self.urgent = true;
            }
        }
        self.dispatch(grant.model, now)
    }

    /// The replica's connection failed: pass it over for a while.
    pub fn eject(&mut self, grant: &Grant, now: Instant) {
        if let Some(r) = self.models[grant.model]
            .replicas
            .iter_mut()
            .find(|r| r.key == grant.replica)
        {
            r.ejected_until = Some(now + EJECT_FOR);
        }
    }

    /// The daemon's routed set for the model (the whole set, as a `routed` event carries it).
    /// Replicas that left finish their requests; new ones take waiting requests at once.
    pub fn set_routed(
        &mut self,
        model: usize,
        endpoints: &[(String, SocketAddr)],
        now: Instant,
    ) -> Vec<Delivery<T>> {
        let m = &mut self.models[model];
        for r in &mut m.replicas {
            let still = endpoints
                .iter()
                .any(|(id, addr)| **id == *r.id && *addr == r.addr);
            if r.routed && !still {
                // Idle or not, the daemon is told at once: an idle one's drain can end now.
                self.urgent = true;
            }
            r.routed = still;
        }
        for (id, addr) in endpoints {
            if !m.replicas.iter().any(|r| *r.id == **id && r.addr == *addr) {
                self.next_key += 1;
                m.replicas.push(Replica {
                    key: ReplicaKey(self.next_key),
                    id: id.as_str().into(),
                    addr: *addr,
                    host: HeaderValue::from_str(&addr.to_string())
                        .expect("an address is a valid header value"),
                    id_header: HeaderValue::from_str(id).ok(),
                    routed: true,
                    in_flight: 0,
                    arrived: 0,
                    completed: 0,
                    ejected_until: None,
                });
            }
        }
        self.dispatch(model, now)
    }

    /// The model's slots per replica, as the daemon's routed set says (`[[model]] slots`, live
    /// across reloads); bounded like the file's key, since the number comes from outside.
    pub fn set_slots(&mut self, model: usize, slots: u32, now: Instant) -> Vec<Delivery<T>> {
        let m = &mut self.models[model];
        m.slots = slots.clamp(1, crate::route::settings::MAX_SLOTS);
        self.dispatch(model, now)
    }

    /// Periodic: replicas whose ejection ran out take waiting requests again.
    pub fn tick(&mut self, now: Instant) -> Vec<Delivery<T>> {
        let mut out = Vec::new();
        for i in 0..self.models.len() {
            out.extend(self.dispatch(i, now));
        }
        out
    }

    /// The reports to send now: per model, the FIFO's exact oldest wait and depth (model-wide),
    /// and per replica its requests in flight and its counters. A replica that left the routed
    /// set is reported until a report has shown it idle, then forgotten.
    pub fn reports(&mut self, now: Instant) -> Vec<Report> {
        let mut out = Vec::new();
        for m in &mut self.models {
            let oldest = m.oldest_wait(now);
            m.reported_over = oldest > m.target_wait;
            let queued = (m.waiting.len() + m.retries.len()) as u64;
            let running: u64 = m.replicas.iter().map(|r| u64::from(r.in_flight)).sum();
            out.push(Report {
                model: m.name.clone(),
                replica: None,
                oldest_wait_ms: Some(oldest.as_secs_f64() * 1000.0),
                queue_depth: Some(queued),
                in_flight: Some(queued + running),
                arrived: Some(m.arrived),
                completed: Some(m.completed),
                router: None,
            });
            for r in &m.replicas {
                out.push(Report {
                    model: m.name.clone(),
                    replica: Some(r.id.to_string()),
                    oldest_wait_ms: None,
                    queue_depth: Some(0),
                    in_flight: Some(u64::from(r.in_flight)),
                    arrived: Some(r.arrived),
                    completed: Some(r.completed),
                    router: None,
                });
            }
            m.replicas.retain(|r| r.routed || r.in_flight > 0);
        }
        self.urgent = false;
        out
    }

    /// When the next model's oldest wait crosses its target, for models whose last report was
    /// under it (the instant may have passed: the crossing is then due now).
    pub fn next_crossing(&self) -> Option<Instant> {
        self.models
            .iter()
            .filter(|m| !m.reported_over)
            .filter_map(|m| m.oldest_since().map(|t| t + m.target_wait))
            .min()
    }

    /// The model's load as an agent check weighs it.
    pub fn load(&self, model: usize, now: Instant) -> crate::route::agent::Load {
        let m = &self.models[model];
        let mut load = crate::route::agent::Load {
            slots: m.slots,
            queued: u32::try_from(m.waiting.len() + m.retries.len()).unwrap_or(u32::MAX),
            max_queue: u32::try_from(m.max_queue).unwrap_or(u32::MAX),
            ..Default::default()
        };
        for r in m.replicas.iter().filter(|r| r.routed) {
            load.routed += 1;
            if r.ejected_until.is_none_or(|t| now >= t) {
                load.free += m.slots.saturating_sub(r.in_flight);
            }
        }
        load
    }

    /// When the model's latest request arrived.
    pub fn last_arrival(&self, model: usize) -> Option<Instant> {
        self.models[model].last_arrival
    }

    pub fn take_urgent(&mut self) -> bool {
        std::mem::take(&mut self.urgent)
    }

    pub fn take_reschedule(&mut self) -> bool {
        std::mem::take(&mut self.reschedule)
    }

    pub fn states(&self, now: Instant) -> Vec<ModelState> {
        self.models
            .iter()
            .map(|m| ModelState {
                name: m.name.clone(),
                slots: m.slots,
                routed: m.replicas.iter().filter(|r| r.routed).count(),
                queue_depth: m.waiting.len() + m.retries.len(),
                oldest_wait: m.oldest_wait(now),
                running: m.replicas.iter().map(|r| u64::from(r.in_flight)).sum(),
                replicas: m
                    .replicas
                    .iter()
                    .map(|r| ReplicaState {
                        id: r.id.clone(),
                        addr: r.addr,
                        routed: r.routed,
                        in_flight: r.in_flight,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Grants free slots to waiting requests: retries first, then the FIFO in order.
    fn dispatch(&mut self, model: usize, now: Instant) -> Vec<Delivery<T>> {
        let m = &mut self.models[model];
        let mut out = Vec::new();
        'grant: loop {
            for i in 0..m.retries.len() {
                let exclude = m.retries[i].exclude;
                if let Some(g) = m.take_slot(model, exclude, now) {
                    let w = m.retries.remove(i).expect("index in range");
                    out.push((w.ticket, g));
                    continue 'grant;
                }
            }
            if m.waiting.is_empty() {
                break;
            }
            let Some(g) = m.take_slot(model, None, now) else {
                break;
            };
            let (_, w) = m.waiting.pop_first().expect("not empty");
            out.push((w.ticket, g));
        }
        out
    }
}

impl<T> ModelQueue<T> {
    /// Takes a slot on the least outstanding routed replica with one free (not `exclude`, not
    /// ejected), counting the request as arrived there.
    fn take_slot(
        &mut self,
        model: usize,
        exclude: Option<ReplicaKey>,
        now: Instant,
    ) -> Option<Grant> {
        let n = self.replicas.len();
        let mut best: Option<usize> = None;
        for k in 0..n {
            let i = (self.turn + k) % n;
            let r = &self.replicas[i];
            if !r.routed
                || r.in_flight >= self.slots
                || Some(r.key) == exclude
                || r.ejected_until.is_some_and(|t| now < t)
            {
                continue;
            }
            if best.is_none_or(|b| r.in_flight < self.replicas[b].in_flight) {
                best = Some(i);
            }
        }
        let i = best?;
        self.turn = (i + 1) % n;
        let r = &mut self.replicas[i];
        r.in_flight += 1;
        r.arrived += 1;
        r.ejected_until = None;
        Some(Grant {
            model,
            replica: r.key,
            id: r.id.clone(),
            addr: r.addr,
            host: r.host.clone(),
            id_header: r.id_header.clone(),
        })
    }

    fn oldest_since(&self) -> Option<Instant> {
        let fifo = self.waiting.first_key_value().map(|(_, w)| w.since);
        let retry = self.retries.iter().map(|w| w.since).min();
        match (fifo, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn oldest_wait(&self, now: Instant) -> Duration {
        self.oldest_since()
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
