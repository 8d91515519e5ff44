//! Reading the inventory from NVML: whole GPUs, the MIG instances of GPUs in MIG mode, devices
//! that are lost, and how the GPUs reach each other. Run at start and again by the monitor
//! (periodically, and when a device is found lost), so that a device that disappears, a MIG
//! reconfiguration or a lost GPU reaches the core as `Event::Inventory`.

use std::collections::{BTreeMap, BTreeSet};

use super::driver::{DevRef, Driver, DriverError};
use crate::core::{GpuDevice, GpuFault, Link, MigSlice, PeerLink};

/// A bound on what a driver may claim, so that no loop is sized by its answer alone.
const MAX_DEVICES: u32 = 256;
const MAX_MIG_SLOTS: u32 = 64;

/// What a lost device is called when NVML could never tell its UUID.
pub fn lost_name(index: u32) -> String {
    format!("lost-{index}")
}

/// Reads the inventory; remembers what it saw, so that a device lost later keeps its UUID (and
/// its replicas their reservations), and logs each problem once.
#[derive(Debug, Clone, Default)]
pub struct Enumerator {
    /// The last good reading of each whole GPU, by NVML index.
    known: BTreeMap<u32, GpuDevice>,
    /// Where each MIG instance of the last reading is: its index on its parent.
    mig_positions: BTreeMap<String, u32>,
    said: BTreeSet<String>,
}

impl Enumerator {
    fn once(&mut self, level: tracing::Level, msg: String) {
        if self.said.insert(msg.clone()) {
            match level {
                tracing::Level::ERROR => tracing::error!("{msg}"),
                tracing::Level::WARN => tracing::warn!("{msg}"),
                _ => tracing::info!("{msg}"),
            }
        }
    }

    /// The index `nvmlDeviceGetMigDeviceHandleByIndex` takes for MIG instance `uuid`, as the
    /// last reading found it.
    pub fn mig_position(&self, uuid: &str) -> Option<u32> {
        self.mig_positions.get(uuid).copied()
    }

    /// The devices now.
    pub fn read(&mut self, drv: &mut dyn Driver) -> Vec<GpuDevice> {
        let n = match drv.device_count() {
            Ok(n) => n,
            Err(e) => {
                self.once(
                    tracing::Level::ERROR,
                    format!("NVML: counting devices: {e}"),
                );
                // What was seen before stays: a failed count is not every device gone.
                return self.known.values().cloned().collect();
            }
        };
        if n > MAX_DEVICES {
            self.once(
                tracing::Level::ERROR,
                format!("NVML reports {n} devices; hearth reads the first {MAX_DEVICES}"),
            );
        }
        let mut out = Vec::new();
        let mut whole: Vec<u32> = Vec::new();
        self.mig_positions.clear();
        for i in 0..n.min(MAX_DEVICES) {
            let facts = match drv.facts(DevRef::whole(i)) {
                Ok(f) => f,
                Err(DriverError::Lost) => {
                    out.push(self.lost(i));
                    continue;
                }
                Err(e) => {
                    self.once(
                        tracing::Level::ERROR,
                        format!("NVML: device {i}: {e}; left out of the inventory"),
                    );
                    continue;
                }
            };
            match drv.mig_mode(i) {
                Ok(m) if m.current => {
                    if !m.pending {
                        self.once(tracing::Level::WARN, format!("NVML: GPU {i} ({}) leaves MIG mode at its next reset", facts.uuid));
                    }
                    // Remembered whole, so that if it is lost it is reported by its own UUID.
                    self.known.insert(
                        i,
                        GpuDevice::new(i, facts.uuid.clone(), facts.name.clone(), 0),
                    );
                    out.extend(self.mig_instances(drv, i, &facts.uuid, &facts.name));
                    continue;
                }
                Ok(m) if m.pending => self.once(
                    tracing::Level::WARN,
                    format!("NVML: GPU {i} ({}) enters MIG mode at its next reset; until then it is used whole", facts.uuid),
                ),
                Err(DriverError::Lost) => {
                    out.push(self.lost(i));
                    continue;
                }
                // No MIG on this GPU, or not readable: a whole device.
                _ => {}
            }
            let mem = match drv.memory(DevRef::whole(i)) {
                Ok(m) => m,
                Err(DriverError::Lost) => {
                    out.push(self.lost(i));
                    continue;
                }
                Err(e) => {
                    self.once(
                        tracing::Level::ERROR,
                        format!(
                            "NVML: device {i} ({}): memory: {e}; left out of the inventory",
                            facts.uuid
                        ),
                    );
                    continue;
                }
            };
            let topology = facts
                .bus_id
                .as_deref()
                .and_then(|b| drv.numa_node(b))
                .filter(|&n| n >= 0)
                .map(|n| format!("numa{n}"));
            let mut d = GpuDevice::new(i, facts.uuid, facts.name, mem.total);
            d.topology = topology;
            d.metered = true;
            self.known.insert(i, d.clone());
            whole.push(i);
            out.push(d);
        }
        self.link(drv, &mut out, &whole);
        out
    }

    /// A GPU that answers GPU_IS_LOST: reported, faulted, under the UUID it had if it ever
    /// told it.
    fn lost(&mut self, i: u32) -> GpuDevice {
        let mut d = self
            .known
            .get(&i)
            .cloned()
            .unwrap_or_else(|| GpuDevice::new(i, lost_name(i), "unknown (lost)", 0));
        let why = GpuFault::Lost;
        self.once(
            tracing::Level::ERROR,
            format!("NVML: GPU {i} ({}) is {why}", d.uuid),
        );
        d.fault = Some(why);
        d.metered = false;
        d.links.clear();
        d
    }

    /// The MIG instances of GPU `i` (in MIG mode), each a device. A GPU in MIG mode whose
    /// instances can't be read, or that has none, is listed faulted: nothing can run on it whole.
    fn mig_instances(
        &mut self,
        drv: &mut dyn Driver,
        i: u32,
        parent: &str,
        parent_name: &str,
    ) -> Vec<GpuDevice> {
        let faulted = |why: GpuFault| {
            let mut d = GpuDevice::new(i, parent, parent_name, 0);
            d.fault = Some(why);
            vec![d]
        };
        let slots = match drv.mig_slots(i) {
            Ok(n) => n.min(MAX_MIG_SLOTS),
            Err(e) => {
                let why = GpuFault::MigUnreadable(e.to_string());
                self.once(
                    tracing::Level::ERROR,
                    format!("NVML: GPU {i} ({parent}): {why}"),
                );
                return faulted(why);
            }
        };
        let mut out = Vec::new();
        for m in 0..slots {
            let at = DevRef {
                index: i,
                mig: Some(m),
            };
            let facts = match drv.facts(at) {
                Ok(f) => f,
                Err(DriverError::NotFound) | Err(DriverError::NotSupported) => continue,
                Err(e) => {
                    self.once(
                        tracing::Level::ERROR,
                        format!("NVML: GPU {i} ({parent}): MIG instance {m}: {e}; left out"),
                    );
                    continue;
                }
            };
            let mem = match drv.memory(at) {
                Ok(mem) => mem,
                Err(e) => {
                    self.once(
                        tracing::Level::ERROR,
                        format!(
                            "NVML: MIG instance {} of GPU {i}: memory: {e}; left out",
                            facts.uuid
                        ),
                    );
                    continue;
                }
            };
            let mut d = GpuDevice::new(i, facts.uuid, facts.name, mem.total);
            d.mig = Some(MigSlice {
                parent: parent.to_string(),
                gpu_instance: facts.gpu_instance.unwrap_or(u32::MAX),
            });
            d.metered = true;
            self.mig_positions.insert(d.uuid.clone(), m);
            out.push(d);
        }
        if out.is_empty() {
            let why = GpuFault::MigWithoutInstances;
            self.once(
                tracing::Level::WARN,
                format!("NVML: GPU {i} ({parent}): {why}"),
            );
            return faulted(why);
        }
        self.once(
            tracing::Level::INFO,
            format!(
                "NVML: GPU {i} ({parent}) is in MIG mode: {} MIG instance(s) are devices; \
                 replicas name them by UUID (device_naming = \"uuid\")",
                out.len()
            ),
        );
        out
    }

    /// How each pair of whole GPUs is connected: NVLink where NVML says peer-to-peer over
    /// NVLink works, else the PCIe level they share.
    fn link(&mut self, drv: &mut dyn Driver, devices: &mut [GpuDevice], whole: &[u32]) {
        let mut links: BTreeMap<u32, Vec<PeerLink>> = BTreeMap::new();
        let uuid_of: BTreeMap<u32, String> = devices
            .iter()
            .filter(|d| d.mig.is_none() && d.fault.is_none())
            .map(|d| (d.index, d.uuid.clone()))
            .collect();
        let mut nvlinked = Vec::new();
        for (n, &a) in whole.iter().enumerate() {
            for &b in whole.iter().skip(n + 1) {
                let link = match drv.nvlink(a, b) {
                    Ok(true) => Some(Link::NvLink),
                    _ => drv.common_ancestor(a, b).ok(),
                };
                let (Some(link), Some(ua), Some(ub)) = (link, uuid_of.get(&a), uuid_of.get(&b))
                else {
                    continue;
                };
                if link == Link::NvLink {
                    nvlinked.push(format!("{a}-{b}"));
                }
                links.entry(a).or_default().push(PeerLink {
                    peer: ub.clone(),
                    link,
                });
                links.entry(b).or_default().push(PeerLink {
                    peer: ua.clone(),
                    link,
                });
            }
        }
        for d in devices.iter_mut() {
            if d.mig.is_none() && d.fault.is_none() {
                d.links = links.remove(&d.index).unwrap_or_default();
            }
        }
        if !nvlinked.is_empty() {
            self.once(
                tracing::Level::INFO,
                format!("NVML: NVLink between GPUs {}", nvlinked.join(", ")),
            );
        }
    }
}
