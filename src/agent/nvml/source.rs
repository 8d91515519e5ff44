//! The GPU monitor's source on NVML: one event set per GPU, memory and recovery-action readings
//! per device, lost GPUs, and the inventory read again. Written against [`Driver`], so that
//! tests drive it with scripted NVML answers.
//!
//! One event set per GPU: nvml-wrapper frees the set a registration fails on (and NVML leaves it
//! undefined after an unknown error), so with one shared set a failure on device k would
//! silently unregister every device before it. With a set each, a failure costs device k alone,
//! and is named in a warning.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use super::driver::{event_bits, DevRef, Driver, DriverError, SetId};
use super::enumerate::Enumerator;
use crate::agent::gpu_monitor::{DeviceMemory, GpuSource, News, Xid};
use crate::core::{GpuDevice, GpuFault, RecoveryAction};

/// NVIDIA's XID for a GPU that has fallen off the bus.
const XID_FALLEN_OFF_THE_BUS: u64 = 79;
/// The shortest wait on one set, so that many sets never make a wait of zero.
const MIN_SLICE: Duration = Duration::from_millis(1);

/// A whole GPU the source watches.
#[derive(Debug)]
struct Gpu {
    index: u32,
    uuid: String,
    /// Its event set; None where registering failed or the GPU is lost.
    set: Option<SetId>,
    /// Its MIG instances: GPU instance id → UUID.
    slices: BTreeMap<u32, String>,
}

pub struct NvmlSource<D: Driver> {
    driver: D,
    enumerator: Enumerator,
    /// The devices of the last inventory reading (what memory readings cover).
    devices: Vec<GpuDevice>,
    gpus: Vec<Gpu>,
    /// GPUs found lost (by index), reported once each.
    lost: BTreeSet<u32>,
    pending: VecDeque<News>,
    /// Round-robin position among the event sets.
    next: usize,
    /// Devices whose memory could not be read, logged once.
    memory_failing: BTreeSet<String>,
}

impl<D: Driver> NvmlSource<D> {
    /// Watches `devices` (the inventory as read at start, by `enumerator`).
    pub fn new(driver: D, enumerator: Enumerator, devices: Vec<GpuDevice>) -> NvmlSource<D> {
        let mut s = NvmlSource {
            driver,
            enumerator,
            devices: Vec::new(),
            gpus: Vec::new(),
            lost: BTreeSet::new(),
            pending: VecDeque::new(),
            next: 0,
            memory_failing: BTreeSet::new(),
        };
        s.take_inventory(devices);
        s
    }

    /// Takes an inventory reading: watches GPUs it has not watched, forgets those gone, and
    /// reports GPUs the reading found lost.
    fn take_inventory(&mut self, devices: Vec<GpuDevice>) {
        // Whole GPUs by index: a device, or the parent of MIG instances.
        let mut wanted: BTreeMap<u32, (String, BTreeMap<u32, String>)> = BTreeMap::new();
        for d in &devices {
            if d.fault == Some(GpuFault::Lost) {
                self.mark_lost(d.index, &d.uuid);
                continue;
            }
            match &d.mig {
                None => {
                    wanted
                        .entry(d.index)
                        .or_insert_with(|| (d.uuid.clone(), BTreeMap::new()));
                }
                Some(m) => {
                    wanted
                        .entry(d.index)
                        .or_insert_with(|| (m.parent.clone(), BTreeMap::new()))
                        .1
                        .insert(m.gpu_instance, d.uuid.clone());
                }
            }
        }
        // Gone, lost, or another GPU at that index now: stop watching.
        let mut keep = Vec::new();
        for g in std::mem::take(&mut self.gpus) {
            match wanted.get(&g.index) {
                Some((uuid, _)) if *uuid == g.uuid && !self.lost.contains(&g.index) => keep.push(g),
                _ => {
                    if let Some(set) = g.set {
                        self.driver.free_set(set);
                    }
                }
            }
        }
        self.gpus = keep;
        for (index, (uuid, slices)) in wanted {
            if self.lost.contains(&index) {
                continue;
            }
            match self.gpus.iter_mut().find(|g| g.index == index) {
                Some(g) => g.slices = slices,
                None => {
                    let set = self.watch(index, &uuid);
                    self.gpus.push(Gpu {
                        index,
                        uuid,
                        set,
                        slices,
                    });
                }
            }
        }
        self.devices = devices;
    }

    /// An event set of its own for GPU `index`, with its XID, uncorrectable-ECC and
    /// recovery-action events; None (and a warning naming the device) where that fails.
    fn watch(&mut self, index: u32, uuid: &str) -> Option<SetId> {
        let supported = match self.driver.supported_events(index) {
            Ok(bits) => bits,
            Err(DriverError::Lost) => {
                self.mark_lost(index, uuid);
                return None;
            }
            Err(e) => {
                tracing::warn!(gpu = %uuid, "NVML: the event types GPU {index} supports: {e}; its XIDs will not be seen");
                return None;
            }
        };
        let wanted = supported
            & (event_bits::CRITICAL_XID_ERROR
                | event_bits::DOUBLE_BIT_ECC_ERROR
                | event_bits::GPU_RECOVERY_ACTION);
        if wanted & event_bits::CRITICAL_XID_ERROR == 0 {
            tracing::warn!(gpu = %uuid, "NVML: GPU {index} does not report XID events; its faults will not be seen");
        }
        if wanted == 0 {
            return None;
        }
        let set = match self.driver.create_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(gpu = %uuid, "NVML: cannot create an event set for GPU {index} ({e}); its XIDs will not be seen");
                return None;
            }
        };
        match self.driver.register(set, index, wanted) {
            Ok(()) => Some(set),
            Err(DriverError::Lost) => {
                self.mark_lost(index, uuid);
                None
            }
            Err(e) => {
                // The set is gone with the failure; the other GPUs' sets are untouched.
                tracing::error!(gpu = %uuid, "NVML: registering GPU {index}'s XID events: {e}; its faults will not be seen (the other GPUs' are)");
                None
            }
        }
    }

    /// GPU `index` answered GPU_IS_LOST: reported once, as XID 79 ("fallen off the bus") for its
    /// UUID, since the driver may never deliver an event for it; and the inventory is read again.
    fn mark_lost(&mut self, index: u32, uuid: &str) {
        if !self.lost.insert(index) {
            return;
        }
        tracing::error!(gpu = %uuid, "NVML: GPU {index} is lost (fallen off the bus)");
        if let Some(g) = self.gpus.iter_mut().find(|g| g.index == index) {
            if let Some(set) = g.set.take() {
                self.driver.free_set(set);
            }
        }
        self.pending.push_back(News::Xid(Xid {
            uuid: uuid.to_string(),
            xid: XID_FALLEN_OFF_THE_BUS,
            recovery: None,
        }));
        self.pending.push_back(News::Reread);
    }

    fn recovery(&mut self, index: u32) -> Option<RecoveryAction> {
        self.driver
            .recovery_action(index)
            .ok()
            .map(RecoveryAction::from_raw)
    }

    /// An event from GPU `gpu` (a position in `self.gpus`).
    fn event(&mut self, gpu: usize, types: u64, data: u64, gpu_instance: u32) -> Option<News> {
        let g = self.gpus.get(gpu)?;
        let (index, parent) = (g.index, g.uuid.clone());
        // On a GPU in MIG mode, an event names the instance it is about; else the whole GPU.
        let uuid = g
            .slices
            .get(&gpu_instance)
            .cloned()
            .unwrap_or_else(|| parent.clone());
        if types & event_bits::CRITICAL_XID_ERROR != 0 {
            let recovery = self.recovery(index);
            return Some(News::Xid(Xid {
                uuid,
                xid: data,
                recovery,
            }));
        }
        if types & event_bits::DOUBLE_BIT_ECC_ERROR != 0 {
            // Not an XID of its own: the XID that comes with it (48, 94, 95…) and the recovery
            // action say what it means for the device.
            tracing::warn!(gpu = %uuid, "NVML: uncorrectable (double-bit) ECC error on GPU {index}");
            return Some(News::Reread);
        }
        if types & event_bits::GPU_RECOVERY_ACTION != 0 {
            return Some(News::Reread);
        }
        None
    }
}

impl<D: Driver> GpuSource for NvmlSource<D> {
    fn memory(&mut self) -> Vec<DeviceMemory> {
        let mut out = Vec::new();
        let mut recovery: BTreeMap<u32, Option<RecoveryAction>> = BTreeMap::new();
        let devices: Vec<(DevRef, String)> = self
            .devices
            .iter()
            .filter(|d| d.fault.is_none() && !self.lost.contains(&d.index))
            .filter_map(|d| {
                let at = match &d.mig {
                    None => DevRef::whole(d.index),
                    Some(_) => DevRef {
                        index: d.index,
                        mig: Some(self.enumerator.mig_position(&d.uuid)?),
                    },
                };
                Some((at, d.uuid.clone()))
            })
            .collect();
        for (at, uuid) in devices {
            let reading = (|| {
                let m = self.driver.memory(at)?;
                let processes = self.driver.processes(at)?;
                Ok::<_, DriverError>((m, processes))
            })();
            match reading {
                Ok((m, processes)) => {
                    self.memory_failing.remove(&uuid);
                    let r = *recovery
                        .entry(at.index)
                        .or_insert_with(|| self.recovery(at.index));
                    out.push(DeviceMemory {
                        uuid,
                        used: m.used,
                        driver_reserved: m.reserved,
                        processes,
                        recovery: r,
                    });
                }
                Err(DriverError::Lost) => {
                    let parent = self
                        .gpus
                        .iter()
                        .find(|g| g.index == at.index)
                        .map_or(uuid, |g| g.uuid.clone());
                    self.mark_lost(at.index, &parent);
                }
                // Without the process list, hearth's own use would count as foreign: better
                // no reading than a wrong one.
                Err(e) => {
                    if self.memory_failing.insert(uuid.clone()) {
                        tracing::warn!(gpu = %uuid, "NVML: reading memory: {e}");
                    }
                }
            }
        }
        out
    }

    fn wait_event(&mut self, timeout: Duration) -> Result<Option<News>, String> {
        if let Some(n) = self.pending.pop_front() {
            return Ok(Some(n));
        }
        let watched: Vec<usize> = (0..self.gpus.len())
            .filter(|&i| self.gpus.get(i).is_some_and(|g| g.set.is_some()))
            .collect();
        if watched.is_empty() {
            std::thread::sleep(timeout);
            return Ok(None);
        }
        // One set per call, in turn: an event waits at most one round to be seen.
        let slice = (timeout / watched.len() as u32).max(MIN_SLICE);
        let Some(&gpu) = watched.get(self.next % watched.len()) else {
            return Ok(None);
        };
        self.next = self.next.wrapping_add(1);
        let Some((index, uuid, Some(set))) =
            self.gpus.get(gpu).map(|g| (g.index, g.uuid.clone(), g.set))
        else {
            return Ok(None);
        };
        let ms = slice.as_millis().min(u128::from(u32::MAX)) as u32;
        match self.driver.wait(set, ms) {
            Ok(ev) => Ok(self.event(gpu, ev.types, ev.data, ev.gpu_instance)),
            Err(DriverError::Timeout) => Ok(None),
            Err(DriverError::Lost) => {
                self.mark_lost(index, &uuid);
                Ok(self.pending.pop_front())
            }
            Err(e) => Err(format!("GPU {index} ({uuid}): {e}")),
        }
    }

    fn inventory(&mut self) -> Option<Vec<GpuDevice>> {
        let devices = self.enumerator.read(&mut self.driver);
        self.take_inventory(devices.clone());
        Some(devices)
    }
}
