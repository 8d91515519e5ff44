//! The port pool: `{port}` for each replica, from `daemon.ports`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Time;
use crate::config::PortRange;

/// How long a port found held by another process is passed over before it is tried again.
pub(super) const BUSY_PORT_HOLD: Duration = Duration::from_secs(60);

/// Ports from `daemon.ports`, handed out round-robin so a port just freed (maybe still in
/// TIME_WAIT, or held by a straggler) is the last to be reused.
#[derive(Debug, Clone)]
pub(super) struct PortPool {
    range: PortRange,
    next: u16,
    in_use: BTreeSet<u16>,
    /// Ports another process held when one of ours was to start on them, with when they may be
    /// tried again. Bounded by the range: one entry per port at most.
    busy: BTreeMap<u16, Time>,
}

impl PortPool {
    pub fn new(range: PortRange) -> Self {
        PortPool {
            range,
            next: range.first,
            in_use: Default::default(),
            busy: Default::default(),
        }
    }
    pub fn capacity(&self) -> usize {
        usize::from(self.range.last.saturating_sub(self.range.first)) + 1
    }
    /// Ports of the range not handed out.
    pub fn free(&self) -> usize {
        let in_range = self
            .in_use
            .range(self.range.first..=self.range.last)
            .count();
        self.capacity().saturating_sub(in_range)
    }
    /// The ports handed out (for the core's own consistency checks).
    #[cfg(test)]
    pub fn in_use(&self) -> &BTreeSet<u16> {
        &self.in_use
    }
    pub fn take(&mut self) -> Option<u16> {
        // Every port handed out: the walk below would find none, and come back to `next`.
        // (Told at once: with a thousand replicas waiting for ports, this is asked after
        // every event.)
        if self.free() == 0 {
            return None;
        }
        for _ in 0..self.capacity() {
            let p = self.next;
            self.next = if p >= self.range.last {
                self.range.first
            } else {
                p + 1
            };
            if !self.busy.contains_key(&p) && self.in_use.insert(p) {
                return Some(p);
            }
        }
        None
    }
    /// `p` could be claimed: in the range and not handed out.
    pub fn claimable(&self, p: u16) -> bool {
        (self.range.first..=self.range.last).contains(&p) && !self.in_use.contains(&p)
    }
    /// Takes `p` (an adopted replica's); false if it is not claimable.
    pub fn claim(&mut self, p: u16) -> bool {
        self.claimable(p) && self.in_use.insert(p)
    }
    /// Books `p`, in the range or outside it, for a process that holds it now (an earlier
    /// run's replica that is leaving); false if a replica holds it already.
    pub fn claim_held(&mut self, p: u16) -> bool {
        self.in_use.insert(p)
    }
    pub fn give_back(&mut self, p: u16) {
        self.in_use.remove(&p);
    }
    /// `p` is held by a process that is not ours: pass it over until `until`.
    pub fn hold_busy(&mut self, p: u16, until: Time) {
        self.in_use.remove(&p);
        self.busy.insert(p, until);
    }
    /// Busy ports whose hold has passed may be tried again (the shell checks again then).
    pub fn expire_busy(&mut self, now: Time) {
        self.busy.retain(|_, until| *until > now);
    }
    /// Ports passed over now.
    #[cfg(test)]
    pub fn busy(&self) -> impl Iterator<Item = u16> + '_ {
        self.busy.keys().copied()
    }
    pub fn set_range(&mut self, range: PortRange) {
        self.range = range;
        if !(range.first..=range.last).contains(&self.next) {
            self.next = range.first;
        }
    }
}
