//! The front door's side of a fleet (docs/fleet.md), with no I/O and no clock (time is passed
//! in): what the daemon said of each model beyond its routed set, how old the view of the
//! daemon is, the balancers seen polling the agent, and the drains.
//!
//! A drain — a model an operator drained (`hearth drain --model`), or every model while the
//! front door stops — is over once every balancer seen polling for it has been answered `drain`
//! at least once and then `drain_grace` passed with no new request; or, at the latest,
//! `drain_timeout` after it began (a balancer seen once may never poll again). Until then the
//! front door serves whatever arrives; after it, it refuses (503, which a balancer retries
//! elsewhere), and a stopping front door closes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::agent::{Answer, Capacity};

/// A balancer counts as polling for this long after its last check.
pub const SEEN_FOR: Duration = Duration::from_secs(60);
/// Pollers remembered at most: (address, what it asks about) pairs. A fleet has a handful of
/// balancers, each asking about a handful of models; anything beyond is noise to forget.
pub const MAX_POLLERS: usize = 4096;

/// What an agent check asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Host,
    Model(usize),
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Poller {
    ip: IpAddr,
    target: Target,
}

#[derive(Debug, Clone, Copy)]
struct Polled {
    last: Instant,
    /// When it was first answered `drain` since it was last answered anything else.
    told_drain: Option<Instant>,
}

pub struct Fleet {
    capacity: Vec<Option<Capacity>>,
    /// None while the daemon's watch is followed; else since when it is not (the start, at
    /// first).
    daemon_lost_at: Option<Instant>,
    /// Per model, since when the daemon has said it is drained.
    drained_since: Vec<Option<Instant>>,
    stopping_since: Option<Instant>,
    pollers: HashMap<Poller, Polled>,
    timeout: Duration,
    grace: Duration,
}

impl Fleet {
    pub fn new(models: usize, timeout: Duration, grace: Duration, now: Instant) -> Fleet {
        Fleet {
            capacity: vec![None; models],
            daemon_lost_at: Some(now),
            drained_since: vec![None; models],
            stopping_since: None,
            pollers: HashMap::new(),
            timeout,
            grace,
        }
    }

    /// The daemon's `capacity` event for a model.
    pub fn set_capacity(&mut self, model: usize, c: Capacity, now: Instant) {
        let Some(slot) = self.capacity.get_mut(model) else {
            return;
        };
        *slot = Some(c);
        let since = &mut self.drained_since[model];
        match (c.drained, *since) {
            (true, None) => *since = Some(now),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }

    pub fn capacity(&self, model: usize) -> Option<Capacity> {
        self.capacity.get(model).copied().flatten()
    }

    /// The watch is followed (true) or lost (false).
    pub fn set_daemon(&mut self, connected: bool, now: Instant) {
        if connected {
            self.daemon_lost_at = None;
        } else if self.daemon_lost_at.is_none() {
            self.daemon_lost_at = Some(now);
        }
    }

    pub fn daemon_gone_for(&self, now: Instant) -> Option<Duration> {
        self.daemon_lost_at
            .map(|t| now.saturating_duration_since(t))
    }

    /// SIGTERM: every model drains.
    pub fn begin_stop(&mut self, now: Instant) {
        self.stopping_since.get_or_insert(now);
    }

    pub fn stopping(&self) -> bool {
        self.stopping_since.is_some()
    }

    /// Whether the model is answered `drain`.
    pub fn draining(&self, model: usize) -> bool {
        self.drain_began(model).is_some()
    }

    fn drain_began(&self, model: usize) -> Option<Instant> {
        let op = self.drained_since.get(model).copied().flatten();
        match (op, self.stopping_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Records what a balancer at `ip` was answered about `target`.
    pub fn polled(&mut self, ip: IpAddr, target: Target, answer: &Answer, now: Instant) {
        let key = Poller { ip, target };
        if !self.pollers.contains_key(&key) && self.pollers.len() >= MAX_POLLERS {
            self.forget(now);
        }
        let drain = *answer == Answer::Drain;
        let p = self.pollers.entry(key).or_insert(Polled {
            last: now,
            told_drain: None,
        });
        p.last = now;
        p.told_drain = if drain {
            p.told_drain.or(Some(now))
        } else {
            None
        };
    }

    /// Room for a new poller: those not seen for `SEEN_FOR`, else the longest silent one.
    fn forget(&mut self, now: Instant) {
        self.pollers
            .retain(|_, p| now.saturating_duration_since(p.last) < SEEN_FOR);
        if self.pollers.len() >= MAX_POLLERS {
            if let Some(k) = self
                .pollers
                .iter()
                .min_by_key(|(_, p)| p.last)
                .map(|(k, _)| *k)
            {
                self.pollers.remove(&k);
            }
        }
    }

    /// Whether the model's drain is over (see the module's comment): its balancers told, then
    /// `grace` with no request since `last_arrival`; or `timeout` since it began. False for a
    /// model that is not draining.
    pub fn drain_done(&self, model: usize, last_arrival: Option<Instant>, now: Instant) -> bool {
        let Some(began) = self.drain_began(model) else {
            return false;
        };
        if now.saturating_duration_since(began) >= self.timeout {
            return true;
        }
        let stopping = self.stopping_since.is_some();
        let mut told_at = began;
        for (k, p) in &self.pollers {
            let asks = match k.target {
                Target::Model(m) => m == model,
                // The host's answer drains only once every model does: a stop.
                Target::Host => stopping,
                Target::Unknown => false,
            };
            if !asks || now.saturating_duration_since(p.last) >= SEEN_FOR {
                continue;
            }
            match p.told_drain {
                Some(t) => told_at = told_at.max(t),
                None => return false,
            }
        }
        let quiet_since = last_arrival.map_or(told_at, |a| a.max(told_at));
        now.saturating_duration_since(quiet_since) >= self.grace
    }

    /// Balancers polling now (seen within `SEEN_FOR`), by address.
    pub fn balancers_seen(&self, now: Instant) -> usize {
        let mut ips: Vec<IpAddr> = self
            .pollers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.last) < SEEN_FOR)
            .map(|(k, _)| k.ip)
            .collect();
        ips.sort_unstable();
        ips.dedup();
        ips.len()
    }
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
