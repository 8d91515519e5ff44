//! What a sleeping replica holds on its GPUs: `[model.sleep] gpu_memory_asleep` (the CUDA
//! context), not its awake `gpu_memory`. Its reservation shrinks once it is asleep and grows
//! back before its first wake request, so several models can share a device with one awake at
//! a time. A wake that finds no room on its devices waits, asleep, and is asked again.

use super::node::Node;
use super::replica::{ReplicaId, ReplicaState};

/// Why a sleeping replica cannot wake now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("waiting for room on GPU {device} to wake: needs {}, {} free", short(*needs), short(*free))]
pub(super) struct NoRoomToWake {
    pub device: String,
    pub needs: u64,
    pub free: u64,
}

fn short(b: u64) -> String {
    crate::units::short_bytes(b)
}

impl Node {
    /// The devices as `gpus` and `status` show them: each with its replicas asleep named.
    pub(super) fn gpu_views(&self) -> Vec<crate::protocol::GpuView> {
        let mut views = self.held.gpus().views();
        // `views` is in the table's order, one per slot.
        for (v, s) in views.iter_mut().zip(&self.held.gpus().slots) {
            v.asleep = s
                .replicas
                .iter()
                .filter(|id| {
                    self.held
                        .replicas()
                        .get(id)
                        .is_some_and(|r| r.state == ReplicaState::Sleeping)
                })
                .map(|id| id.0.clone())
                .collect();
        }
        views
    }

    /// What the replica holds on each device awake (its launch's `gpu_memory`) and asleep;
    /// None: it holds no share of a device (no GPUs, or whole devices, which stay its own).
    fn awake_asleep(&self, id: &ReplicaId) -> Option<(u64, u64)> {
        let r = self.held.replicas().get(id)?;
        if r.gpus.is_empty() {
            return None;
        }
        let awake = r.spec.gpu_memory?;
        let sleep = self.models.get(&r.model)?.config.sleep.as_ref()?;
        Some((awake, sleep.gpu_memory_asleep.min(awake)))
    }

    /// Asleep: its reservation shrinks to what it still holds.
    pub(super) fn shrink_asleep(&mut self, id: &ReplicaId) {
        if let Some((_, asleep)) = self.awake_asleep(id) {
            self.held.resize(id, asleep);
        }
    }

    /// Before a wake: its reservation grows back to its awake size, if each of its devices has
    /// the room; else nothing changes and the wake waits.
    pub(super) fn grow_to_wake(&mut self, id: &ReplicaId) -> Result<(), NoRoomToWake> {
        let Some((awake, _)) = self.awake_asleep(id) else {
            return Ok(());
        };
        let Some(r) = self.held.replicas().get(id) else {
            return Ok(());
        };
        let more = awake.saturating_sub(r.gpu_bytes);
        for u in &r.gpus {
            let free = self.held.gpus().slot(u).map_or(0, |s| s.free());
            if free < more {
                return Err(NoRoomToWake {
                    device: u.clone(),
                    needs: more,
                    free,
                });
            }
        }
        self.held.resize(id, awake);
        Ok(())
    }
}
