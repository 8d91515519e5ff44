//! What front doors tell a fleet's balancers about this host, beyond the routed set: a model an
//! operator drained (`hearth drain --model M`, ended by `hearth undrain --model M`), and the
//! capacity it can add (warm replicas to promote; whether a replica can start at all). Sent to
//! watchers as `capacity` events, in the snapshot and on every change (docs/fleet.md).
//!
//! A drain of a model changes nothing here but the flag: its replicas keep running and keep
//! their roles, so that the front door goes on serving whatever still reaches it while the
//! balancers move away. The flag is kept with the scale overrides in `state_dir`, so that a
//! restart or `hearth upgrade` does not put the model back in rotation.

use super::event::{Action, LogLevel};
use super::node::Node;
use crate::protocol::{quote, ErrorCode, Failure, WatchEvent};

/// A model's `capacity` event, without its name: what was last published, to publish only
/// changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Capacity {
    drained: bool,
    max: u32,
    warm: u32,
    can_start: bool,
    asleep: u32,
}

impl Node {
    /// `drain --model` (`drained`) and `undrain --model`.
    pub(super) fn set_drained(
        &mut self,
        model: &str,
        drained: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        let Some(m) = self.models.get_mut(model).filter(|m| !m.removed) else {
            return Err(Failure::new(
                ErrorCode::UnknownModel,
                format!("no model {}", quote(model)),
            ));
        };
        if m.overrides.drained == drained {
            return Ok(());
        }
        m.overrides.drained = drained;
        let message = if drained {
            "drained by operator: front doors answer balancers `drain`; replicas keep running"
        } else {
            "undrained by operator: front doors answer balancers `ready` again"
        };
        self.log(LogLevel::Info, model, None, message.into(), out);
        out.push(Action::PersistOverrides(self.overrides()));
        Ok(())
    }

    fn capacity(&self, model: &str) -> Option<Capacity> {
        let m = self.models.get(model).filter(|m| !m.removed)?;
        let c = self.counts(model);
        let live = c.routed + c.leaving + c.warm + c.starting + c.pending;
        // A start that would fail or wait on something outside the model's count is no
        // capacity a balancer should count on.
        let blocked = self.shutdown.is_some()
            || m.crash_looping()
            || m.no_capacity.is_some()
            || m.stalled.is_some();
        Some(Capacity {
            drained: m.overrides.drained,
            max: m.max(),
            warm: c.warm,
            can_start: !blocked && (c.starting > 0 || live < m.max()),
            asleep: c.sleeping,
        })
    }

    /// The model's `capacity` event now (None for a model being removed).
    pub(super) fn capacity_event(&self, model: &str) -> Option<WatchEvent> {
        let c = self.capacity(model)?;
        Some(WatchEvent::Capacity {
            model: model.to_string(),
            drained: c.drained,
            max: c.max,
            warm: c.warm,
            can_start: c.can_start,
            asleep: c.asleep,
        })
    }

    /// Publishes each model's `capacity` where it changed in this event.
    pub(super) fn publish_capacity(&mut self, out: &mut Vec<Action>) {
        let changed: Vec<(String, Capacity)> = self
            .models
            .keys()
            .filter_map(|name| {
                let now = self.capacity(name)?;
                (self.capacity_published.get(name) != Some(&now)).then(|| (name.clone(), now))
            })
            .collect();
        for (name, c) in changed {
            self.capacity_published.insert(name.clone(), c);
            out.push(Action::Publish(WatchEvent::Capacity {
                model: name,
                drained: c.drained,
                max: c.max,
                warm: c.warm,
                can_start: c.can_start,
                asleep: c.asleep,
            }));
        }
    }
}
