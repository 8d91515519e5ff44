//! GPU health and operator cordons: XIDs, memory accounting, cordon/uncordon with evacuation.

use super::event::{Action, LogLevel};
use super::gpu::GpuSlot;
use super::node::Node;
use super::Time;
use crate::protocol::{ErrorCode, Failure, WatchEvent};

/// XIDs that mean the device can no longer be trusted (NVIDIA's XID catalogue: GPU fallen off
/// the bus, uncorrectable ECC / row-remap failures, NVLink and contained/uncontained errors…).
pub const CRITICAL_XIDS: &[u64] = &[48, 63, 64, 74, 79, 92, 94, 95, 119, 120];
/// XIDs caused by the application (illegal address, MMU faults from user code…): the device is
/// fine; the process that caused it fails on its own.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Tolerance before actual use counts as overrunning the declared `gpu_memory`: allocators
/// round up.
const OVERRUN_SLACK: f64 = 1.05;

impl Node {
    pub(super) fn xid(&mut self, uuid: &str, xid: u64, now: Time, out: &mut Vec<Action>) {
        let Some(s) = self.gpus.slot_mut(uuid) else {
            self.log_global(
                LogLevel::Warn,
                format!("XID {xid} for unknown device {uuid}"),
                out,
            );
            return;
        };
        if !CRITICAL_XIDS.contains(&xid) {
            let kind = if APPLICATION_XIDS.contains(&xid) {
                "application"
            } else {
                "unclassified"
            };
            self.log_global(
                LogLevel::Warn,
                format!("GPU {uuid}: XID {xid} ({kind}); device stays in service"),
                out,
            );
            return;
        }
        let first = s.healthy;
        s.healthy = false;
        s.evacuate = true;
        s.note = format!("critical XID {xid}");
        let n = s.replicas.len();
        out.push(gpu_event(s));
        if first {
            self.log_global(
                LogLevel::Error,
                format!("GPU {uuid}: critical XID {xid}: unhealthy until `hearth uncordon`; moving {n} replica(s) off it"),
                out,
            );
        }
        let _ = now;
    }

    pub(super) fn gpu_memory(
        &mut self,
        uuid: &str,
        used: u64,
        by_group: &[(u32, u64)],
        out: &mut Vec<Action>,
    ) {
        let Some(s) = self.gpus.slot_mut(uuid) else {
            return;
        };
        let mut ours = 0u64;
        let ids: Vec<_> = s.replicas.clone();
        for id in ids {
            let Some(r) = self.replicas.get_mut(&id) else {
                continue;
            };
            let bytes: u64 = by_group
                .iter()
                .filter(|(g, _)| Some(*g) == r.pid)
                .map(|(_, b)| b)
                .sum();
            ours += bytes;
            r.gpu_used.insert(uuid.to_string(), bytes);
            let declared = r.gpu_bytes;
            let over = declared > 0 && bytes as f64 > declared as f64 * OVERRUN_SLACK;
            if over && !r.overrun_warned {
                r.overrun_warned = true;
                let (model, rid) = (r.model.clone(), r.id.clone());
                let msg = format!(
                    "uses {} on {uuid}, more than its declared gpu_memory {}",
                    crate::units::short_bytes(bytes),
                    crate::units::short_bytes(declared)
                );
                self.log(LogLevel::Warn, &model, Some(&rid), msg, out);
            } else if !over {
                r.overrun_warned = false;
            }
        }
        let Some(s) = self.gpus.slot_mut(uuid) else {
            return;
        };
        s.memory_used = Some(used);
        // Capacity is what others leave: whatever hearth's replicas don't account for is foreign.
        s.device.memory_foreign = used.saturating_sub(ours);
    }

    pub(super) fn cordon(
        &mut self,
        gpu: &str,
        cordon: bool,
        reason: Option<String>,
        evacuate: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), Failure> {
        let s = self
            .gpus
            .slot_mut(gpu)
            .ok_or_else(|| Failure::new(ErrorCode::UnknownGpu, format!("no GPU {gpu:?}")))?;
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
            // Uncordon also clears an unhealthy mark: the operator vouches for the device.
            s.cordoned = false;
            s.evacuate = false;
            s.healthy = true;
            s.note.clear();
            format!("GPU {uuid} uncordoned")
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
        healthy: s.healthy,
        cordoned: s.cordoned,
    })
}
