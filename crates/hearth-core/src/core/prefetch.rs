//! Weight prefetch progress: the shell reads a new replica's `prefetch` files into the page
//! cache (asked by `Action::Prefetch` when the replica is created) and tells the core how far it
//! got; the core only shows it (status `reason`) while the replica starts.

use super::node::Node;
use super::replica::{ReplicaId, ReplicaState};
use crate::units::short_bytes as bytes;

impl Node {
    pub(super) fn prefetch_progress(
        &mut self,
        id: &ReplicaId,
        done: u64,
        total: u64,
        missing: &[String],
    ) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        // A late report for a replica that has moved on (warm, stopping) changes nothing.
        if !matches!(r.state, ReplicaState::Pending | ReplicaState::Starting) {
            return;
        }
        let mut reason = if done >= total {
            format!("weights prefetched: {}", bytes(total))
        } else {
            format!("prefetching weights: {} of {}", bytes(done), bytes(total))
        };
        if !missing.is_empty() {
            reason.push_str(&format!("; not found: {}", missing.join(", ")));
        }
        r.reason = reason.into();
    }
}
