//! GPU health and operator cordons: XIDs and recovery actions, device readings (memory and who
//! holds it), inventory changes, cordon/uncordon with evacuation.

use std::collections::BTreeMap;

use super::event::{Action, GpuReading, LogLevel};
use super::gpu::{GpuDevice, GpuSlot};
use super::node::Node;
use super::replica::ReplicaId;
use super::xid::{self, RecoveryAction, Verdict};
use super::Time;
use crate::protocol::{ErrorCode, Failure, WatchEvent};

/// Tolerance before actual use counts as overrunning the declared `gpu_memory`: allocators
/// round up.
const OVERRUN_SLACK: f64 = 1.05;

impl Node {
    /// The devices an XID or a recovery action of `uuid` is about: the device itself, or every
    /// MIG instance of the GPU `uuid`.
    fn affected(&self, uuid: &str) -> Vec<String> {
        if self.held.gpus().slot(uuid).is_some() {
            return vec![uuid.to_string()];
        }
        self.held
            .gpus()
            .slots
            .iter()
            .filter(|s| s.device.mig.as_ref().is_some_and(|m| m.parent == uuid))
            .map(|s| s.device.uuid.clone())
            .collect()
    }

    pub(super) fn xid(
        &mut self,
        uuid: &str,
        xid: u64,
        recovery: Option<RecoveryAction>,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let devices = self.affected(uuid);
        if devices.is_empty() {
            self.log_global(
                LogLevel::Warn,
                format!("XID {xid} for unknown device {uuid}"),
                out,
            );
            return;
        }
        match xid::verdict(xid, recovery) {
            Verdict::Evacuate(why) => {
                for d in devices {
                    self.make_unhealthy(&d, &why, out);
                }
            }
            Verdict::DrainP2p => {
                for d in devices {
                    self.drain_p2p(&d, true, out);
                }
            }
            Verdict::Stay(why) => self.log_global(
                LogLevel::Warn,
                format!("GPU {uuid}: XID {xid} ({why}); the device stays in service"),
                out,
            ),
        }
        if let Some(a) = recovery {
            for d in self.affected(uuid) {
                self.recovery_read(&d, a, out);
            }
        }
        let _ = now;
    }

    /// A device needs a reset (or the host a reboot): it takes nothing until `hearth uncordon`,
    /// and its replicas are replaced elsewhere.
    fn make_unhealthy(&mut self, uuid: &str, why: &str, out: &mut Vec<Action>) {
        let Some(s) = self.held.gpus_mut().slot_by_uuid_mut(uuid) else {
            return;
        };
        if !s.healthy {
            // The first cause stays in the note; the device is already being left.
            return;
        }
        s.healthy = false;
        s.evacuate = true;
        s.note = why.to_string();
        let n = s.replicas.len();
        out.push(gpu_event(s));
        {
            self.log_global(
                LogLevel::Error,
                format!(
                    "GPU {uuid}: {why}: unhealthy until `hearth uncordon`; moving {n} replica(s) off it"
                ),
                out,
            );
        }
    }

    fn drain_p2p(&mut self, uuid: &str, on: bool, out: &mut Vec<Action>) {
        let Some(s) = self.held.gpus_mut().slot_by_uuid_mut(uuid) else {
            return;
        };
        if s.p2p_drain == on {
            return;
        }
        s.p2p_drain = on;
        let msg = if on {
            format!(
                "GPU {uuid}: recovery action: drain peer-to-peer traffic; multi-GPU replicas \
                 move off it and none are placed on it"
            )
        } else {
            format!("GPU {uuid}: peer-to-peer traffic drained; multi-GPU replicas may use it again")
        };
        self.log_global(LogLevel::Warn, msg, out);
    }

    /// A recovery action read with a device's memory: acted on when it changes.
    fn recovery_read(&mut self, uuid: &str, action: RecoveryAction, out: &mut Vec<Action>) {
        let Some(s) = self.held.gpus_mut().slot_by_uuid_mut(uuid) else {
            return;
        };
        let before = s.recovery.replace(action);
        if before == Some(action) {
            return;
        }
        if action.needs_reset() {
            let why = format!("recovery action: {}", action.describe());
            self.make_unhealthy(uuid, &why, out);
        } else if action == RecoveryAction::DrainP2p {
            self.drain_p2p(uuid, true, out);
        } else {
            self.drain_p2p(uuid, false, out);
            if action == RecoveryAction::RecoverImexDomain {
                self.log_global(
                    LogLevel::Error,
                    format!("GPU {uuid}: recovery action: recover the IMEX domain (hearth does not use IMEX; the device stays in service)"),
                    out,
                );
            }
        }
    }

    /// A device reading: memory, who holds it, the recovery action.
    pub(super) fn gpu_reading(&mut self, reading: GpuReading, out: &mut Vec<Action>) {
        let uuid = reading.uuid.as_str();
        let Some(s) = self.held.gpus().slot(uuid) else {
            return;
        };
        let on_device = s.replicas.clone();
        // Replica leaders on this device, by pid.
        let leaders: BTreeMap<u32, ReplicaId> = on_device
            .iter()
            .filter_map(|id| Some((self.held.replicas().get(id)?.pid?, id.clone())))
            .collect();
        // (known bytes, some process's bytes unknown) per replica.
        let mut held: BTreeMap<ReplicaId, (u64, bool)> = BTreeMap::new();
        // Bytes the driver named for processes that are certainly someone else's (hearth can
        // see them, and they lead to no replica).
        let mut others_known = 0u64;
        for p in &reading.processes {
            let owner = p
                .replica
                .as_ref()
                .filter(|r| on_device.contains(r))
                .cloned()
                .or_else(|| p.leaders.iter().find_map(|l| leaders.get(l).cloned()));
            match (owner, p.bytes) {
                (Some(owner), b) => {
                    let e = held.entry(owner).or_default();
                    match b {
                        Some(b) => e.0 = e.0.saturating_add(b),
                        None => e.1 = true,
                    }
                }
                (None, Some(b)) if !p.leaders.is_empty() => {
                    others_known = others_known.saturating_add(b)
                }
                // Unseen (another PID namespace) or "Unavailable": may be a replica's.
                (None, _) => {}
            }
        }
        // What no process is known to hold: "Unavailable" bytes, processes hearth cannot see,
        // the driver's contexts. A replica whose bytes the driver would not give, or whose
        // processes hearth could not find, is taken to hold from it up to what it reserved, and
        // no more than is there: its bytes count once, as its own, and never again as someone
        // else's.
        let attributed: u64 = held.values().map(|(k, _)| *k).sum();
        let mut pool = reading
            .used
            .saturating_sub(attributed)
            .saturating_sub(others_known);
        let mut ours = 0u64;
        for id in on_device {
            let Some(r) = self.held.replicas_mut().get_mut(&id) else {
                continue;
            };
            let (known, unknown) = match held.get(&id) {
                Some(&(k, u)) => (k, u),
                // Nothing found for it: what it holds is unknown.
                None => (0, true),
            };
            let usage = if unknown {
                let extra = r.gpu_bytes.saturating_sub(known).min(pool);
                pool -= extra;
                known.saturating_add(extra)
            } else {
                known
            };
            ours = ours.saturating_add(usage);
            r.gpu_used
                .insert(uuid.to_string(), (!unknown).then_some(known));
            let declared = r.gpu_bytes;
            let over = !unknown && declared > 0 && known as f64 > declared as f64 * OVERRUN_SLACK;
            if over && !r.overrun_warned {
                r.overrun_warned = true;
                let (model, rid) = (r.model.clone(), r.id.clone());
                let msg = format!(
                    "uses {} on {uuid}, more than its declared gpu_memory {}",
                    crate::units::short_bytes(known),
                    crate::units::short_bytes(declared)
                );
                self.log(LogLevel::Warn, &model, Some(&rid), msg, out);
            } else if !over {
                r.overrun_warned = false;
            }
        }
        if let Some(s) = self.held.gpus_mut().slot_by_uuid_mut(uuid) {
            s.memory_used = Some(reading.used);
            s.driver_reserved = reading.driver_reserved.min(s.device.memory_total);
            // Capacity is what others leave: what hearth's replicas don't account for is foreign.
            s.memory_foreign = reading.used.saturating_sub(ours);
        }
        if let Some(a) = reading.recovery {
            self.recovery_read(uuid, a, out);
        }
    }

    /// A new inventory reading: devices that appeared, vanished or were found faulted.
    pub(super) fn inventory(&mut self, devices: Vec<GpuDevice>, out: &mut Vec<Action>) {
        let change = self.held.gpus_mut().update(devices);
        for u in &change.appeared {
            self.log_global(
                LogLevel::Info,
                format!("GPU {u} appeared in the inventory"),
                out,
            );
            if let Some(s) = self.held.gpus().slot(u) {
                out.push(gpu_event(s));
            }
        }
        for u in &change.vanished {
            let n = self.held.gpus().slot(u).map_or(0, |s| s.replicas.len());
            self.log_global(
                LogLevel::Error,
                format!(
                    "GPU {u} is no longer reported by the inventory; moving {n} replica(s) off it"
                ),
                out,
            );
            if let Some(s) = self.held.gpus().slot(u) {
                out.push(gpu_event(s));
            }
        }
        for u in &change.dropped {
            self.log_global(
                LogLevel::Warn,
                format!("GPU {u} is no longer reported by the inventory"),
                out,
            );
        }
        for (u, why) in &change.faulted {
            let n = self.held.gpus().slot(u).map_or(0, |s| s.replicas.len());
            self.log_global(
                LogLevel::Error,
                format!("GPU {u}: {why}; it takes no replicas (moving {n} off it)"),
                out,
            );
            if let Some(s) = self.held.gpus().slot(u) {
                out.push(gpu_event(s));
            }
        }
    }

    pub(super) fn cordon(
        &mut self,
        gpu: &str,
        cordon: bool,
        reason: Option<String>,
        evacuate: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        let s = self.held.gpus_mut().slot_mut(gpu).ok_or_else(|| {
            Failure::new(
                ErrorCode::UnknownGpu,
                format!("no GPU {}", crate::protocol::quote(gpu)),
            )
        })?;
        let uuid = s.device.uuid.clone();
        let msg = if cordon {
            s.cordoned = true;
            s.evacuate |= evacuate;
            s.note = reason.unwrap_or_else(|| "cordoned by operator".into());
            let how = if evacuate {
                "; moving its replicas off"
            } else {
                ""
            };
            format!("GPU {uuid} cordoned: {}{how}", s.note)
        } else {
            // Uncordon also clears an unhealthy mark: the operator vouches for the device. A
            // fault the inventory reports (a lost device) stays until the inventory clears it.
            s.cordoned = false;
            s.evacuate = false;
            s.healthy = true;
            s.note.clear();
            match &s.device.fault {
                Some(f) => format!("GPU {uuid} uncordoned; it still takes nothing: {f}"),
                None => format!("GPU {uuid} uncordoned"),
            }
        };
        let event = gpu_event(s);
        self.log_global(LogLevel::Info, msg, out);
        out.push(event);
        Ok(())
    }
}

/// The watch event that says a device's health and cordon.
fn gpu_event(s: &GpuSlot) -> Action {
    Action::Publish(WatchEvent::Gpu {
        uuid: s.device.uuid.clone(),
        healthy: s.healthy && s.device.fault.is_none(),
        cordoned: s.cordoned,
    })
}
