//! Scripted NVML answers, for tests: a [`Driver`] whose GPUs, MIG instances, processes,
//! recovery actions, lost devices and events a test sets, and changes while the daemon runs
//! (the driver is a handle on shared state). The daemon never uses it: `inventory::open` only
//! ever opens the real driver.
//!
//! It keeps NVML's sharp edges where hearth must survive them: a failed registration frees the
//! event set it was made on (as nvml-wrapper does), so events of devices registered there before
//! are never delivered; a lost GPU answers GPU_IS_LOST to everything.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::driver::{
    event_bits, DevRef, Driver, DriverError, Facts, Memory, MigMode, RawEvent, SetId,
};
use crate::core::Link;

#[derive(Debug, Clone, Default)]
pub struct ScriptedMig {
    pub uuid: String,
    pub gpu_instance: u32,
    pub memory: Memory,
    pub processes: Vec<(u32, Option<u64>)>,
}

#[derive(Debug, Clone)]
pub struct ScriptedGpu {
    pub uuid: String,
    pub name: String,
    pub bus_id: Option<String>,
    pub numa: Option<i64>,
    pub memory: Memory,
    pub processes: Vec<(u32, Option<u64>)>,
    /// The raw recovery action, or the error reading it gives.
    pub recovery: Result<u32, DriverError>,
    /// Answers GPU_IS_LOST to everything.
    pub lost: bool,
    /// Some: in MIG mode, with these instances.
    pub mig: Option<Vec<ScriptedMig>>,
    /// Registering its events fails with this.
    pub register_fails: Option<DriverError>,
    pub supported_events: u64,
}

impl ScriptedGpu {
    /// A healthy 80 GiB GPU with 1 GiB set aside by the driver, no processes, recovery action
    /// none, XID, ECC and recovery-action events supported.
    pub fn new(uuid: &str) -> ScriptedGpu {
        ScriptedGpu {
            uuid: uuid.into(),
            name: "Scripted H100".into(),
            bus_id: None,
            numa: None,
            memory: Memory {
                total: 80 << 30,
                reserved: 1 << 30,
                used: 0,
            },
            processes: Vec::new(),
            recovery: Ok(0),
            lost: false,
            mig: None,
            register_fails: None,
            supported_events: event_bits::CRITICAL_XID_ERROR
                | event_bits::DOUBLE_BIT_ECC_ERROR
                | event_bits::GPU_RECOVERY_ACTION,
        }
    }
}

#[derive(Debug)]
enum SetState {
    Live {
        devices: BTreeSet<u32>,
        events: VecDeque<RawEvent>,
    },
    Freed,
}

#[derive(Debug, Default)]
pub struct Script {
    pub gpus: Vec<ScriptedGpu>,
    /// Pairs of GPU indices (smaller first) with NVLink between them.
    pub nvlink: BTreeSet<(u32, u32)>,
    /// The PCIe level every other pair shares.
    pub ancestor: Option<Link>,
    sets: Vec<SetState>,
    /// Registrations made: (set, device).
    pub registrations: Vec<(SetId, u32)>,
    /// Event sets freed by a failed registration.
    pub freed_by_failure: usize,
}

/// A handle on the script: clone it, give one to the daemon, change the other.
#[derive(Debug, Clone, Default)]
pub struct ScriptedDriver {
    state: Arc<Mutex<Script>>,
}

impl ScriptedDriver {
    pub fn new(gpus: Vec<ScriptedGpu>) -> ScriptedDriver {
        let d = ScriptedDriver::default();
        d.script().gpus = gpus;
        d
    }

    pub fn script(&self) -> MutexGuard<'_, Script> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Delivers an event for GPU `index` to every live set it is registered in.
    pub fn event(&self, index: u32, ev: RawEvent) {
        let mut s = self.script();
        for set in s.sets.iter_mut() {
            if let SetState::Live { devices, events } = set {
                if devices.contains(&index) {
                    events.push_back(ev);
                }
            }
        }
    }

    /// An XID on GPU `index` (`gpu_instance`: the MIG instance, or `u32::MAX`).
    pub fn xid(&self, index: u32, xid: u64, gpu_instance: u32) {
        self.event(
            index,
            RawEvent {
                types: event_bits::CRITICAL_XID_ERROR,
                data: xid,
                gpu_instance,
            },
        );
    }

    fn gpu<T>(
        &self,
        index: u32,
        f: impl FnOnce(&ScriptedGpu) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        let s = self.script();
        let g = s.gpus.get(index as usize).ok_or(DriverError::NotFound)?;
        if g.lost {
            return Err(DriverError::Lost);
        }
        f(g)
    }

    fn mig<T>(
        &self,
        d: DevRef,
        f: impl FnOnce(&ScriptedMig) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        let Some(m) = d.mig else {
            return Err(DriverError::NotFound);
        };
        self.gpu(d.index, |g| {
            let slices = g.mig.as_ref().ok_or(DriverError::NotSupported)?;
            f(slices.get(m as usize).ok_or(DriverError::NotFound)?)
        })
    }
}

impl Driver for ScriptedDriver {
    fn driver_version(&mut self) -> Result<String, DriverError> {
        Ok("scripted".into())
    }

    fn device_count(&mut self) -> Result<u32, DriverError> {
        Ok(self.script().gpus.len() as u32)
    }

    fn facts(&mut self, d: DevRef) -> Result<Facts, DriverError> {
        match d.mig {
            None => self.gpu(d.index, |g| {
                Ok(Facts {
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                    bus_id: g.bus_id.clone(),
                    gpu_instance: None,
                })
            }),
            Some(_) => self.mig(d, |m| {
                Ok(Facts {
                    uuid: m.uuid.clone(),
                    name: "Scripted MIG instance".into(),
                    bus_id: None,
                    gpu_instance: Some(m.gpu_instance),
                })
            }),
        }
    }

    fn memory(&mut self, d: DevRef) -> Result<Memory, DriverError> {
        match d.mig {
            None => self.gpu(d.index, |g| Ok(g.memory)),
            Some(_) => self.mig(d, |m| Ok(m.memory)),
        }
    }

    fn processes(&mut self, d: DevRef) -> Result<Vec<(u32, Option<u64>)>, DriverError> {
        match d.mig {
            None => self.gpu(d.index, |g| Ok(g.processes.clone())),
            Some(_) => self.mig(d, |m| Ok(m.processes.clone())),
        }
    }

    fn recovery_action(&mut self, index: u32) -> Result<u32, DriverError> {
        self.gpu(index, |g| g.recovery.clone())
    }

    fn mig_mode(&mut self, index: u32) -> Result<MigMode, DriverError> {
        self.gpu(index, |g| match &g.mig {
            Some(_) => Ok(MigMode {
                current: true,
                pending: true,
            }),
            None => Err(DriverError::NotSupported),
        })
    }

    fn mig_slots(&mut self, index: u32) -> Result<u32, DriverError> {
        self.gpu(index, |g| Ok(g.mig.as_ref().map_or(0, |m| m.len() as u32)))
    }

    fn nvlink(&mut self, a: u32, b: u32) -> Result<bool, DriverError> {
        self.gpu(a, |_| Ok(()))?;
        self.gpu(b, |_| Ok(()))?;
        Ok(self.script().nvlink.contains(&(a.min(b), a.max(b))))
    }

    fn common_ancestor(&mut self, a: u32, b: u32) -> Result<Link, DriverError> {
        self.gpu(a, |_| Ok(()))?;
        self.gpu(b, |_| Ok(()))?;
        self.script().ancestor.ok_or(DriverError::NotSupported)
    }

    fn numa_node(&mut self, bus_id: &str) -> Option<i64> {
        let s = self.script();
        s.gpus
            .iter()
            .find(|g| g.bus_id.as_deref() == Some(bus_id))
            .and_then(|g| g.numa)
    }

    fn supported_events(&mut self, index: u32) -> Result<u64, DriverError> {
        self.gpu(index, |g| Ok(g.supported_events))
    }

    fn create_set(&mut self) -> Result<SetId, DriverError> {
        let mut s = self.script();
        s.sets.push(SetState::Live {
            devices: BTreeSet::new(),
            events: VecDeque::new(),
        });
        Ok(s.sets.len() - 1)
    }

    fn register(&mut self, set: SetId, index: u32, _mask: u64) -> Result<(), DriverError> {
        let failure = self.gpu(index, |g| Ok(g.register_fails.clone()))?;
        let mut s = self.script();
        if let Some(e) = failure {
            // As nvml-wrapper does: the set goes with the failure, and every device in it.
            if let Some(st) = s.sets.get_mut(set) {
                *st = SetState::Freed;
            }
            s.freed_by_failure += 1;
            return Err(e);
        }
        match s.sets.get_mut(set) {
            Some(SetState::Live { devices, .. }) => {
                devices.insert(index);
            }
            _ => return Err(DriverError::Other(format!("event set {set} was freed"))),
        }
        s.registrations.push((set, index));
        Ok(())
    }

    fn wait(&mut self, set: SetId, timeout_ms: u32) -> Result<RawEvent, DriverError> {
        {
            let mut s = self.script();
            let lost = match s.sets.get(set) {
                Some(SetState::Live { devices, .. }) => devices
                    .iter()
                    .any(|&i| s.gpus.get(i as usize).is_some_and(|g| g.lost)),
                _ => return Err(DriverError::Other(format!("event set {set} was freed"))),
            };
            if lost {
                return Err(DriverError::Lost);
            }
            if let Some(SetState::Live { events, .. }) = s.sets.get_mut(set) {
                if let Some(ev) = events.pop_front() {
                    return Ok(ev);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(u64::from(timeout_ms).min(2)));
        Err(DriverError::Timeout)
    }

    fn free_set(&mut self, set: SetId) {
        if let Some(st) = self.script().sets.get_mut(set) {
            *st = SetState::Freed;
        }
    }
}
