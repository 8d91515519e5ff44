//! Devices a pending replica may not start on yet, although they have room: one start per
//! device (`start_alone`), and, just after the daemon starts, every device until each metered
//! device has given its first memory reading (the room is not known yet).

use std::collections::BTreeMap;
use std::time::Duration;

use super::event::{Action, LogLevel};
use super::node::Node;
use super::replica::ReplicaState;
use super::Time;

/// How long start-up placement waits for the first memory reading of a metered device. The
/// monitor reads at once; a device whose memory cannot be read is used after this anyway.
pub(super) const FIRST_READING: Duration = Duration::from_secs(10);

impl Node {
    /// Devices held back from a replica of `model` now, each with the reason.
    pub(super) fn held_for(&self, model: &str, now: Time) -> BTreeMap<String, String> {
        let alone = |m: &str| self.models.get(m).is_some_and(|m| m.config.start_alone);
        let this_alone = alone(model);
        let mut held = BTreeMap::new();
        for r in self.held.replicas().values() {
            // A start profiles the device's free memory; a stop frees memory under it.
            let (hold, doing) = match r.state {
                ReplicaState::Starting => (this_alone || alone(&r.model), "starting"),
                ReplicaState::Stopping => (this_alone, "stopping"),
                _ => (false, ""),
            };
            if !hold {
                continue;
            }
            for u in &r.gpus {
                held.entry(u.clone()).or_insert_with(|| {
                    format!(
                        "waiting for {} to finish {doing} on GPU {u} (start_alone: one start \
                         per device)",
                        r.id
                    )
                });
            }
        }
        if now < self.started + FIRST_READING {
            // Until every device has been read, none is placed on: the best device may be one
            // not read yet, and a multi-GPU set chosen among the devices read so far could
            // split a set that belongs together (an NVLink pair).
            let unread: Vec<&str> = self
                .held
                .gpus()
                .slots
                .iter()
                .filter(|s| s.device.metered && s.memory_used.is_none())
                .map(|s| s.device.uuid.as_str())
                .collect();
            if !unread.is_empty() {
                let why = format!(
                    "waiting for the first memory reading of GPU {}",
                    unread.join(", ")
                );
                for s in &self.held.gpus().slots {
                    held.entry(s.device.uuid.clone())
                        .or_insert_with(|| why.clone());
                }
            }
        }
        held
    }

    /// Placing on a metered device that never gave a reading: said once.
    pub(super) fn note_unread(&mut self, devices: &[String], out: &mut Vec<Action>) {
        if self.unread_warned {
            return;
        }
        let unread: Vec<String> = devices
            .iter()
            .filter(|u| {
                self.held
                    .gpus()
                    .slot(u)
                    .is_some_and(|s| s.device.metered && s.memory_used.is_none())
            })
            .cloned()
            .collect();
        if unread.is_empty() {
            return;
        }
        self.unread_warned = true;
        self.log_global(
            LogLevel::Warn,
            format!(
                "no memory reading from GPU {} within {}s of start; placing there without \
                 knowing what other processes hold on it",
                unread.join(", "),
                FIRST_READING.as_secs()
            ),
            out,
        );
    }
}
