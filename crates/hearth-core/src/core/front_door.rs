//! Front doors (`hearth route`): how their reports are told apart and what they supersede.
//!
//! A report that carries `router` comes from a front door, which holds the model's queue: its
//! model-wide report is the exact oldest wait and depth of its FIFO, and its per-replica reports
//! count every request it sent to each replica, those still at replicas leaving the routed set
//! included. While any front door has reported for a model within the model's `stale_after`,
//! the front doors are the model's only signal: the replicas' own reports, other reporters'
//! reports and scrapes for that model are answered (saying which front doors hold the signal)
//! but not recorded, and scrapes are not asked for. A replica's own count could say "idle"
//! while a request a front door sent is on its way and end a drain early; a scrape sees only
//! the part of the queue that reached the server.
//!
//! Several front doors on one model combine (`front_doors.rs`): the oldest wait is the max of
//! theirs, depths and requests in flight add up, counters add up by how far each moved. A door
//! joining, leaving or restarting clears nothing. When the last one has been silent for
//! `stale_after` (stopped, restarting, cut off), the other sources count again from the next
//! report or scrape; that switch, and the first door's arrival, clear the model's per-replica
//! histories, so that counters from two kinds of source are never subtracted from each other.
//! Changes are logged at most once per ten seconds per model.

use super::event::{Action, LogLevel};
use super::front_doors::{Change, MAX_FRONT_DOORS};
use super::node::Node;
use super::queue_signal::Sample;
use super::replica::ReplicaId;
use super::Time;
use crate::protocol::{ErrorCode, Failure};

/// What became of a report or scrape for a model, by its source.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Admitted {
    /// Record it as it is (no front door reports for the model).
    Own,
    /// A front door's, combined with the others': record this sample.
    Combined(Sample),
    /// Not recorded: these front doors hold the model's signal.
    Superseded(Vec<String>),
}

impl Node {
    /// The front doors whose reports are the model's signal now, by name.
    pub fn front_doors(&self, model: &str, now: Time) -> Vec<String> {
        self.models.get(model).map_or_else(Vec::new, |m| {
            m.front_doors
                .active(now, m.config.scaling.stale_after)
                .into_iter()
                .map(str::to_string)
                .collect()
        })
    }

    /// Whether a report from front door `name` may be taken for `model` (checked before
    /// anything changes): refused `busy` when `MAX_FRONT_DOORS` others report already.
    pub(super) fn front_door_room(
        &self,
        model: &str,
        name: &str,
        now: Time,
    ) -> Result<(), Failure> {
        let Some(m) = self.models.get(model) else {
            return Ok(());
        };
        let stale_after = m.config.scaling.stale_after;
        if m.front_doors.has_room_for(name, now, stale_after) {
            return Ok(());
        }
        Err(Failure::new(
            ErrorCode::Busy,
            format!(
                "{MAX_FRONT_DOORS} front doors report for model {model:?} already (each within \
                 stale_after); a new one is taken once one of them has been silent that long"
            ),
        ))
    }

    /// Sorts a report or scrape for `model` by source before it is recorded: `router` is the
    /// front door that sent it (with its sample and whether it is for `replica`), None for every
    /// other source.
    pub(super) fn admit_signal(
        &mut self,
        model: &str,
        router: Option<(&str, Option<&ReplicaId>, Sample)>,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Admitted {
        self.expire_front_doors(model, now, out);
        let Some(m) = self.models.get_mut(model) else {
            return Admitted::Own;
        };
        let stale_after = m.config.scaling.stale_after;
        let Some((name, replica, sample)) = router else {
            let active = m.front_doors.active(now, stale_after);
            return if active.is_empty() {
                Admitted::Own
            } else {
                Admitted::Superseded(active.into_iter().map(str::to_string).collect())
            };
        };
        let (combined, change) = m.front_doors.record(name, replica, sample, stale_after);
        if change == Change::Began {
            self.clear_replica_signals(model);
        }
        if change != Change::None {
            self.log_front_doors(model, change, now, out);
        }
        Admitted::Combined(combined)
    }

    /// Forgets the model's front doors that went silent; when the last did, the replicas' own
    /// reports and scrapes are the signal again.
    fn expire_front_doors(&mut self, model: &str, now: Time, out: &mut Vec<Action>) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let change = m.front_doors.expire(now, m.config.scaling.stale_after);
        if change == Change::Ended {
            self.clear_replica_signals(model);
        }
        if change != Change::None {
            self.log_front_doors(model, change, now, out);
        }
    }

    /// The tick: doors gone silent are forgotten (and said), changes held back by the log's
    /// rate limit are said once it allows, counters of replicas that are gone are dropped.
    pub(super) fn front_doors_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        let names: Vec<String> = self
            .models
            .iter()
            .filter(|(_, m)| !m.front_doors.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.expire_front_doors(&name, now, out);
            let replicas = &self.held.replicas();
            if let Some(m) = self.models.get_mut(&name) {
                m.front_doors
                    .forget_replicas(|id| replicas.get(id).is_some());
                if let Some(n) = m.front_doors.log_due(now) {
                    let message = self.front_doors_line(&name, n, now);
                    self.log(LogLevel::Info, &name, None, message, out);
                }
            }
        }
    }

    fn log_front_doors(&mut self, model: &str, change: Change, now: Time, out: &mut Vec<Action>) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let Some(n) = m.front_doors.note_change(now) else {
            return;
        };
        let mut message = self.front_doors_line(model, n, now);
        if change == Change::Began && n == 1 {
            message.push_str(
                ": their reports supersede the replicas' own reports and scrapes, combined \
                 (the oldest wait of any, depths and requests in flight summed)",
            );
        }
        self.log(LogLevel::Info, model, None, message, out);
    }

    /// The log line for the set of front doors as it is now, after `changes` changes.
    fn front_doors_line(&self, model: &str, changes: u32, now: Time) -> String {
        let doors = self.front_doors(model, now);
        let stale_after = self
            .models
            .get(model)
            .map(|m| m.config.scaling.stale_after)
            .unwrap_or_default();
        let since = if changes > 1 {
            format!(" ({changes} changes since the last line)")
        } else {
            String::new()
        };
        if doors.is_empty() {
            format!(
                "no front door has reported for {stale_after:?}{since}: the replicas' own \
                 reports and scrapes are the signal again"
            )
        } else {
            let names: Vec<String> = doors.iter().map(|d| format!("{d:?}")).collect();
            format!(
                "front doors reporting for the model: {}{since}",
                names.join(", ")
            )
        }
    }

    fn clear_replica_signals(&mut self, model: &str) {
        for r in self.held.replicas_mut().of_model_mut(model) {
            r.signal = Default::default();
        }
        if let Some(m) = self.models.get_mut(model) {
            m.model_wide = Default::default();
        }
    }
}
