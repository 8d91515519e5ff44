//! What the shell's containment found out about processes: a port held by a stranger just
//! before a spawn, and the memory and CPU replicas use.

use super::event::{Action, LogLevel, Usage};
use super::node::Node;
use super::ports::BUSY_PORT_HOLD;
use super::replica::{ReplicaId, ReplicaState};
use super::Time;
use crate::units::short_duration;

impl Node {
    /// Nothing was started: the port the replica was given is held by another process (an
    /// orphan of an earlier run, a server someone started by hand). The port is passed over for
    /// a while and the replica goes back to waiting for a place, without counting a failure:
    /// the model did nothing wrong, and the next port is tried at once.
    pub(super) fn port_busy(
        &mut self,
        id: &ReplicaId,
        port: u16,
        holder: &str,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas().get(id) else {
            return;
        };
        // Only the answer to the spawn this replica is waiting for: not one for a port it no
        // longer holds, nor for a replica whose process exists.
        if r.port != Some(port) || r.pid.is_some() {
            return;
        }
        let (state, model) = (r.state, r.model.clone());
        self.held.unplace(id, Some(now + BUSY_PORT_HOLD));
        let message = format!(
            "port {port} is in use by {holder}; passing it over for {} and trying another",
            short_duration(BUSY_PORT_HOLD)
        );
        self.log(LogLevel::Warn, &model, Some(id), message.clone(), out);
        if let Some(m) = self.models.get_mut(&model) {
            m.stalled = Some(message.clone());
        }
        if state == ReplicaState::Stopping {
            // Asked to stop before it existed: there is nothing left to stop (its port and
            // GPUs were handed back above).
            self.forget(id, "never started: port busy", out);
            self.check_shutdown_complete(out);
            return;
        }
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        r.spawned_at = None;
        self.set_state(id, ReplicaState::Pending, now, out);
        if let Some(r) = self.held.replicas_mut().get_mut(id) {
            r.reason = message.into();
        }
    }

    /// A round of usage samples. Replicas that are gone by now are skipped.
    pub(super) fn usage(&mut self, samples: Vec<(ReplicaId, Usage)>) {
        for (id, usage) in samples {
            if let Some(r) = self.held.replicas_mut().get_mut(&id) {
                if r.pid.is_some() {
                    r.usage = usage;
                }
            }
        }
    }
}
