//! Several front doors on one model: their reports combined into one signal, as if one front
//! door held the whole queue. Pure data, time passed in; `front_door.rs` applies it.
//!
//! - Model-wide: the oldest wait is the oldest of any door's (max), the depth and the requests
//!   in flight are the sums.
//! - Per replica: the requests in flight there are the sum of what each door has sent it and
//!   not had back, so a drain ends when the last door's last request there does.
//! - Counters (`arrived`, `completed`): each door's own counter moves the combined one by as
//!   much as it moved (a door's first report only sets where it starts; a door whose counter
//!   went back restarted, and counts from zero), so the combined counters are monotonic however
//!   doors come, go and restart, and the rates read from them are the sums of the doors' rates.
//!
//! A door counts while it has reported within `stale_after`; each of its parts (its model-wide
//! report, its report for a replica) while that part is that fresh. Nothing is cleared when a
//! door joins or leaves: the others' histories go on.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::queue_signal::Sample;
use super::replica::ReplicaId;
use super::Time;

/// Most front doors reporting for one model at once: a fleet runs a few per host; a reporter
/// inventing names gets `busy` past this rather than growing the daemon's memory.
pub const MAX_FRONT_DOORS: usize = 16;
/// Changes to the set of front doors are logged at most once per this, per model.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The front doors reporting for one model, and the combined counters.
#[derive(Debug, Clone, Default)]
pub struct FrontDoors {
    doors: BTreeMap<String, Door>,
    wide: Totals,
    replicas: HashMap<ReplicaId, Totals>,
    /// When the next log line may go, and how many changes wait for it.
    log_after: Time,
    unlogged: u32,
}

#[derive(Debug, Clone, Default)]
struct Door {
    last: Time,
    wide: Option<Sample>,
    replicas: HashMap<ReplicaId, Sample>,
}

/// Combined monotonic counters; None until some door has sent one.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    arrived: Option<u64>,
    completed: Option<u64>,
}

impl Totals {
    fn advance(&mut self, before: Option<&Sample>, now: &Sample) {
        step(
            &mut self.arrived,
            before.and_then(|b| b.arrived),
            now.arrived,
        );
        step(
            &mut self.completed,
            before.and_then(|b| b.completed),
            now.completed,
        );
    }
}

/// Moves `total` by how far one door's counter moved from `before` to `now`.
fn step(total: &mut Option<u64>, before: Option<u64>, now: Option<u64>) {
    let Some(now) = now else {
        return;
    };
    let t = total.get_or_insert(0);
    *t = t.saturating_add(match before {
        None => 0,
        Some(b) if now >= b => now - b,
        // The door restarted: what it counted since is what it counts now.
        Some(_) => now,
    });
}

fn fresh(at: Time, now: Time, stale_after: Duration) -> bool {
    now.since(at) <= stale_after
}

/// What changed in the set of doors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// The first door: front doors hold the model's signal from now on.
    Began,
    /// A door joined or left; others still report.
    Members,
    /// The last door has gone silent.
    Ended,
}

impl FrontDoors {
    /// The doors that have reported within `stale_after`, by name.
    pub fn active(&self, now: Time, stale_after: Duration) -> Vec<&str> {
        self.doors
            .iter()
            .filter(|(_, d)| fresh(d.last, now, stale_after))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// No door is known (none has reported since the last went silent and was forgotten).
    pub fn is_empty(&self) -> bool {
        self.doors.is_empty()
    }

    pub fn any_active(&self, now: Time, stale_after: Duration) -> bool {
        self.doors.values().any(|d| fresh(d.last, now, stale_after))
    }

    /// Whether a report from `name` may be taken: a door already counted, or room for one more
    /// besides those still active.
    pub fn has_room_for(&self, name: &str, now: Time, stale_after: Duration) -> bool {
        self.doors.contains_key(name) || self.active(now, stale_after).len() < MAX_FRONT_DOORS
    }

    /// Forgets the doors gone silent and the parts (per-replica reports) gone stale; what that
    /// changed.
    pub fn expire(&mut self, now: Time, stale_after: Duration) -> Change {
        if self.doors.is_empty() {
            return Change::None;
        }
        let before = self.doors.len();
        self.doors.retain(|_, d| fresh(d.last, now, stale_after));
        for d in self.doors.values_mut() {
            d.replicas.retain(|_, s| fresh(s.at, now, stale_after));
        }
        if self.doors.is_empty() {
            self.wide = Totals::default();
            self.replicas.clear();
            return Change::Ended;
        }
        if self.doors.len() == before {
            Change::None
        } else {
            Change::Members
        }
    }

    /// Totals kept only for replicas `live` still holds.
    pub fn forget_replicas(&mut self, live: impl Fn(&ReplicaId) -> bool) {
        self.replicas.retain(|id, _| live(id));
        for d in self.doors.values_mut() {
            d.replicas.retain(|id, _| live(id));
        }
    }

    /// A report from door `name` (for `replica`, or model-wide): kept, and the combined sample
    /// of its subject returned, with what it changed in the set of doors (call `expire` first).
    pub fn record(
        &mut self,
        name: &str,
        replica: Option<&ReplicaId>,
        s: Sample,
        stale_after: Duration,
    ) -> (Sample, Change) {
        let now = s.at;
        let change = if self.doors.is_empty() {
            Change::Began
        } else if !self.doors.contains_key(name) {
            Change::Members
        } else {
            Change::None
        };
        let door = self.doors.entry(name.to_string()).or_default();
        door.last = now;
        let combined = match replica {
            None => {
                self.wide.advance(door.wide.as_ref(), &s);
                door.wide = Some(s);
                let mut c = self.sum(now, stale_after, |d| d.wide.as_ref());
                c.arrived = self.wide.arrived;
                c.completed = self.wide.completed;
                c
            }
            Some(id) => {
                let totals = self.replicas.entry(id.clone()).or_default();
                totals.advance(door.replicas.get(id), &s);
                let totals = *totals;
                door.replicas.insert(id.clone(), s);
                let mut c = self.sum(now, stale_after, |d| d.replicas.get(id));
                c.arrived = totals.arrived;
                c.completed = totals.completed;
                c
            }
        };
        (combined, change)
    }

    /// The parts `part` picks of every active door, combined: the oldest wait, the sums.
    fn sum<'a>(
        &'a self,
        now: Time,
        stale_after: Duration,
        part: impl Fn(&'a Door) -> Option<&'a Sample>,
    ) -> Sample {
        let mut c = Sample {
            at: now,
            oldest_wait_ms: 0.0,
            queue_depth: 0,
            in_flight: 0,
            arrived: None,
            completed: None,
        };
        for d in self.doors.values() {
            let Some(p) = part(d).filter(|p| fresh(p.at, now, stale_after)) else {
                continue;
            };
            c.oldest_wait_ms = c.oldest_wait_ms.max(p.oldest_wait_ms);
            c.queue_depth = c.queue_depth.saturating_add(p.queue_depth);
            c.in_flight = c.in_flight.saturating_add(p.in_flight);
        }
        c
    }

    /// A change to say in the log: Some(changes it covers) when a line may go now, else it is
    /// counted for a later line (`log_due`). Rate-limited per model to one line per
    /// `LOG_EVERY`, so that doors that come and go, or a reporter that alternates names, cost
    /// a line every ten seconds, not a line a report.
    pub fn note_change(&mut self, now: Time) -> Option<u32> {
        self.unlogged = self.unlogged.saturating_add(1);
        self.log_due(now)
    }

    /// Changes not yet logged, once a line may go (the tick asks).
    pub fn log_due(&mut self, now: Time) -> Option<u32> {
        if self.unlogged == 0 || now < self.log_after {
            return None;
        }
        self.log_after = now + LOG_EVERY;
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
#[path = "front_doors_tests.rs"]
mod tests;
