//! What a sleeping replica holds on its GPUs: `[model.sleep] gpu_memory_asleep` (the CUDA
//! context), not its awake `gpu_memory`. Its reservation shrinks once it is asleep and grows
//! back before its first wake request, so several models can share a device with one awake at
//! a time. A wake that finds no room on its devices waits, asleep, and is asked again (and
//! reclaim.rs looks for other models' idle replicas to put to sleep for it).
//!
//! And what it holds in host RAM (`[model.sleep] host_memory`, vLLM's weights at level 1):
//! every replica asleep, falling asleep or draining to sleep counts against `[daemon]
//! host_memory`, and one that would go beyond it is not put to sleep.

use super::node::Node;
use super::replica::{ReplicaId, ReplicaState};

/// Why a replica is not put to sleep: `[daemon] host_memory` (or its default) is full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not put to sleep: it would hold {} of host RAM, and sleeping replicas hold {} of the {} \
     they may (daemon.host_memory, or half of the host's RAM)",
    short(*own),
    short(*held),
    short(*budget)
)]
pub(super) struct NoHostRoom {
    pub own: u64,
    pub held: u64,
    pub budget: u64,
}

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
    pub(super) fn awake_asleep(&self, id: &ReplicaId) -> Option<(u64, u64)> {
        let r = self.held.replicas().get(id)?;
        if r.gpus.is_empty() {
            return None;
        }
        let awake = r.spec.gpu_memory?;
        let sleep = self.models.get(&r.model)?.config.sleep.as_ref()?;
        Some((awake, sleep.held_asleep(awake)))
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

    /// What one of the model's replicas holds in host RAM while asleep.
    pub(super) fn host_memory_of(&self, model: &str) -> u64 {
        self.models
            .get(model)
            .and_then(|m| m.config.sleep.as_ref())
            .map_or(0, |s| s.host_memory)
    }

    /// What sleeping replicas hold in host RAM now: those asleep, falling asleep, or draining
    /// to sleep (their RAM is spoken for).
    pub(super) fn host_memory_held(&self) -> u64 {
        self.held
            .replicas()
            .values()
            .filter(|r| match r.state {
                ReplicaState::Sleeping | ReplicaState::FallingAsleep => true,
                ReplicaState::Draining => r.then_sleep,
                _ => false,
            })
            .map(|r| self.host_memory_of(&r.model))
            .fold(0u64, u64::saturating_add)
    }

    /// What sleeping replicas may hold in host RAM: `[daemon] host_memory`, else half of the
    /// host's RAM as the shell measured it (the rest is the servers' own and the system's);
    /// None: not bounded (nothing measured).
    pub(super) fn host_memory_budget(&self) -> Option<u64> {
        self.config
            .daemon
            .host_memory
            .or(self.host_ram.map(|r| r / 2))
    }

    /// Host RAM the budget leaves for more sleeping replicas; None: not bounded.
    pub(super) fn host_memory_room(&self) -> Option<u64> {
        let budget = self.host_memory_budget()?;
        Some(budget.saturating_sub(self.host_memory_held()))
    }

    /// How many more of the model's replicas may go to sleep within `[daemon] host_memory`.
    pub(super) fn sleepers_allowed(&self, model: &str) -> u32 {
        let each = self.host_memory_of(model);
        match self.host_memory_room() {
            Some(room) if each > 0 => u32::try_from(room / each).unwrap_or(u32::MAX),
            _ => u32::MAX,
        }
    }

    /// The replica may go to sleep within `[daemon] host_memory`; Err: why not.
    pub(super) fn host_room_for(&self, id: &ReplicaId) -> Result<(), NoHostRoom> {
        let (Some(budget), Some(r)) = (self.host_memory_budget(), self.held.replicas().get(id))
        else {
            return Ok(());
        };
        let own = self.host_memory_of(&r.model);
        // A replica draining to sleep is counted already.
        let counted = r.state == ReplicaState::Draining && r.then_sleep;
        let held = self.host_memory_held();
        let others = if counted {
            held.saturating_sub(own)
        } else {
            held
        };
        if others.saturating_add(own) <= budget {
            return Ok(());
        }
        Err(NoHostRoom {
            own,
            held: others,
            budget,
        })
    }
}
