//! Front doors (`hearth route`): how their reports are told apart and what they supersede.
//!
//! A report that carries `router` comes from a front door, which holds the model's whole queue:
//! its model-wide report is the exact oldest wait and depth, and its per-replica reports count
//! every request it sent to each replica, those still at replicas leaving the routed set
//! included. While a front door has reported for a model within the model's `stale_after`, it
//! is the model's only signal: the replicas' own reports, other reporters' reports and scrapes
//! for that model are answered but not recorded, and scrapes are not asked for. A replica's own
//! count could say "idle" while a request the router sent is on its way and end a drain early;
//! a scrape sees only the part of the queue that reached the server.
//!
//! When the front door falls silent for `stale_after` (stopped, restarting, cut off), the other
//! sources count again from the next report or scrape. Each switch clears the model's
//! per-replica histories, so that counters from two sources are never subtracted from each
//! other.

use super::event::{Action, LogLevel};
use super::node::Node;
use super::Time;

impl Node {
    /// The front door whose reports are the model's signal now.
    pub fn front_door(&self, model: &str, now: Time) -> Option<&str> {
        let m = self.models.get(model)?;
        let (name, at) = m.router.as_ref()?;
        (now.since(*at) <= m.config.scaling.stale_after).then_some(name.as_str())
    }

    /// Sorts a report or scrape for `model` by source before it is recorded: `router` is the
    /// front door that sent it, None for every other source. Returns whether to record it.
    pub(super) fn admit_signal(
        &mut self,
        model: &str,
        router: Option<&str>,
        now: Time,
        out: &mut Vec<Action>,
    ) -> bool {
        let active = self.front_door(model, now).map(str::to_string);
        let Some(m) = self.models.get_mut(model) else {
            return false;
        };
        match (router, active) {
            (Some(name), active) => {
                m.router = Some((name.to_string(), now));
                if active.as_deref() != Some(name) {
                    self.clear_replica_signals(model);
                    let message = match active {
                        None => format!(
                            "front door {name:?} reports for the model: its reports supersede the \
                             replicas' own reports and scrapes"
                        ),
                        Some(other) => {
                            format!(
                                "front door {name:?} reports for the model instead of {other:?}"
                            )
                        }
                    };
                    self.log(LogLevel::Info, model, None, message, out);
                }
                true
            }
            (None, Some(_)) => false,
            (None, None) => {
                let stale_after = m.config.scaling.stale_after;
                if let Some((name, _)) = m.router.take() {
                    self.clear_replica_signals(model);
                    let message = format!(
                        "front door {name:?} has not reported for {stale_after:?}: the \
                         replicas' own reports and scrapes are the signal again"
                    );
                    self.log(LogLevel::Info, model, None, message, out);
                }
                true
            }
        }
    }

    fn clear_replica_signals(&mut self, model: &str) {
        for r in self.replicas.values_mut().filter(|r| r.model == model) {
            r.signal = Default::default();
        }
        if let Some(m) = self.models.get_mut(model) {
            m.model_wide = Default::default();
        }
    }
}
