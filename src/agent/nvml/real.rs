//! The NVML calls on the real driver: nvml-wrapper where it has what hearth needs, its
//! `NvmlLib` (raw nvml-wrapper-sys symbols, through `Nvml::lib()`) where it does not: event sets
//! (the wrapper frees a shared set when one registration fails, and drops event bits and the
//! MIG instance of an event), the maximum MIG device count and a MIG instance's GPU instance id.
//! Every raw symbol is checked for presence first: an older driver lacks some.

// The crate denies unsafe code; this file needs it for the raw NVML symbols nvml-wrapper does not wrap: each block says why it is sound.
#![allow(unsafe_code)]

use std::mem;
use std::sync::Arc;

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{nvmlEventData_t, nvmlEventSet_t};

use super::driver::{DevRef, Driver, DriverError, Facts, Memory, MigMode, RawEvent, SetId};
use crate::core::Link;

/// An event set handle. NVML is thread-safe and its handles are process-wide: the set may be
/// used from the monitor thread it is moved to.
struct Set(nvmlEventSet_t);
// SAFETY: see above; the handle is only an opaque pointer NVML resolves.
unsafe impl Send for Set {}

pub struct RealDriver {
    nvml: Arc<Nvml>,
    sets: Vec<Option<Set>>,
}

impl RealDriver {
    pub fn new(nvml: Arc<Nvml>) -> RealDriver {
        RealDriver {
            nvml,
            sets: Vec::new(),
        }
    }

    fn device(&self, d: DevRef) -> Result<Device<'_>, DriverError> {
        let whole = self.nvml.device_by_index(d.index).map_err(from_nvml)?;
        match d.mig {
            None => Ok(whole),
            Some(m) => whole.mig_device_by_index(m).map_err(from_nvml),
        }
    }
}

impl Drop for RealDriver {
    fn drop(&mut self) {
        for set in self.sets.drain(..).flatten() {
            free(&self.nvml, set);
        }
    }
}

fn free(nvml: &Nvml, set: Set) {
    let lib = nvml.lib();
    if lib.nvmlEventSetFree.is_ok() {
        // SAFETY: the set came from nvmlEventSetCreate and is freed once (it was taken out).
        unsafe {
            lib.nvmlEventSetFree(set.0);
        }
    }
}

fn from_nvml(e: NvmlError) -> DriverError {
    match e {
        NvmlError::GpuLost => DriverError::Lost,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) => DriverError::NotSupported,
        NvmlError::NotFound => DriverError::NotFound,
        NvmlError::NoPermission => DriverError::NoPermission,
        NvmlError::Timeout => DriverError::Timeout,
        other => DriverError::Other(other.to_string()),
    }
}

fn missing(symbol: &str) -> DriverError {
    DriverError::Other(format!("this NVIDIA driver's NVML has no {symbol}"))
}

impl Driver for RealDriver {
    fn driver_version(&mut self) -> Result<String, DriverError> {
        self.nvml.sys_driver_version().map_err(from_nvml)
    }

    fn device_count(&mut self) -> Result<u32, DriverError> {
        self.nvml.device_count().map_err(from_nvml)
    }

    fn facts(&mut self, d: DevRef) -> Result<Facts, DriverError> {
        let dev = self.device(d)?;
        let uuid = dev.uuid().map_err(from_nvml)?;
        let name = dev.name().unwrap_or_else(|_| "unknown".into());
        let (bus_id, gpu_instance) = match d.mig {
            None => (dev.pci_info().ok().map(|p| p.bus_id), None),
            Some(_) => {
                let lib = self.nvml.lib();
                let sym = lib
                    .nvmlDeviceGetGpuInstanceId
                    .as_ref()
                    .map_err(|_| missing("nvmlDeviceGetGpuInstanceId"))?;
                let mut id: u32 = 0;
                // SAFETY: a valid MIG device handle and an out-pointer to a local.
                let code = unsafe { sym(dev.handle(), &mut id) };
                nvml_try(code).map_err(from_nvml)?;
                (None, Some(id))
            }
        };
        Ok(Facts {
            uuid,
            name,
            bus_id,
            gpu_instance,
        })
    }

    fn memory(&mut self, d: DevRef) -> Result<Memory, DriverError> {
        let m = self.device(d)?.memory_info().map_err(from_nvml)?;
        Ok(Memory {
            total: m.total,
            reserved: m.reserved,
            used: m.used,
        })
    }

    fn processes(&mut self, d: DevRef) -> Result<Vec<(u32, Option<u64>)>, DriverError> {
        let list = self
            .device(d)?
            .running_compute_processes()
            .map_err(from_nvml)?;
        Ok(list
            .into_iter()
            .map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => (p.pid, Some(b)),
                UsedGpuMemory::Unavailable => (p.pid, None),
            })
            .collect())
    }

    fn recovery_action(&mut self, index: u32) -> Result<u32, DriverError> {
        let dev = self.device(DevRef::whole(index))?;
        let samples = dev
            .field_values_for(&[FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)])
            .map_err(from_nvml)?;
        let Some(sample) = samples.into_iter().next() else {
            return Err(DriverError::NotSupported);
        };
        let sample: FieldValueSample = sample.map_err(from_nvml)?;
        match sample.value.map_err(from_nvml)? {
            SampleValue::U32(v) => Ok(v),
            SampleValue::U64(v) => u32::try_from(v).map_err(|_| DriverError::NotSupported),
            SampleValue::I64(v) => u32::try_from(v).map_err(|_| DriverError::NotSupported),
            SampleValue::F64(_) => Err(DriverError::NotSupported),
        }
    }

    fn mig_mode(&mut self, index: u32) -> Result<MigMode, DriverError> {
        let m = self
            .device(DevRef::whole(index))?
            .mig_mode()
            .map_err(from_nvml)?;
        Ok(MigMode {
            current: m.current == 1,
            pending: m.pending == 1,
        })
    }

    fn mig_slots(&mut self, index: u32) -> Result<u32, DriverError> {
        let dev = self.device(DevRef::whole(index))?;
        let lib = self.nvml.lib();
        let sym = lib
            .nvmlDeviceGetMaxMigDeviceCount
            .as_ref()
            .map_err(|_| missing("nvmlDeviceGetMaxMigDeviceCount"))?;
        let mut n: u32 = 0;
        // SAFETY: a valid device handle and an out-pointer to a local.
        let code = unsafe { sym(dev.handle(), &mut n) };
        nvml_try(code).map_err(from_nvml)?;
        Ok(n)
    }

    fn nvlink(&mut self, a: u32, b: u32) -> Result<bool, DriverError> {
        let (da, db) = (
            self.device(DevRef::whole(a))?,
            self.device(DevRef::whole(b))?,
        );
        let status = da
            .p2p_status(&db, P2pCapabilitiesIndex::NvLink)
            .map_err(from_nvml)?;
        Ok(status == P2pStatus::Ok)
    }

    fn common_ancestor(&mut self, a: u32, b: u32) -> Result<Link, DriverError> {
        let (da, db) = (
            self.device(DevRef::whole(a))?,
            self.device(DevRef::whole(b))?,
        );
        let level = da.topology_common_ancestor(db).map_err(from_nvml)?;
        Ok(match level {
            TopologyLevel::Internal => Link::Board,
            TopologyLevel::Single => Link::PcieSwitch,
            TopologyLevel::Multiple => Link::PcieSwitches,
            TopologyLevel::HostBridge => Link::HostBridge,
            TopologyLevel::Node => Link::Numa,
            TopologyLevel::System => Link::System,
        })
    }

    fn numa_node(&mut self, bus_id: &str) -> Option<i64> {
        super::sysfs_numa_node(bus_id)
    }

    fn supported_events(&mut self, index: u32) -> Result<u64, DriverError> {
        let dev = self.device(DevRef::whole(index))?;
        let lib = self.nvml.lib();
        let sym = lib
            .nvmlDeviceGetSupportedEventTypes
            .as_ref()
            .map_err(|_| missing("nvmlDeviceGetSupportedEventTypes"))?;
        let mut bits: u64 = 0;
        // SAFETY: a valid device handle and an out-pointer to a local.
        let code = unsafe { sym(dev.handle(), &mut bits) };
        nvml_try(code).map_err(from_nvml)?;
        Ok(bits)
    }

    fn create_set(&mut self) -> Result<SetId, DriverError> {
        let lib = self.nvml.lib();
        let sym = lib
            .nvmlEventSetCreate
            .as_ref()
            .map_err(|_| missing("nvmlEventSetCreate"))?;
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        let code = unsafe { sym(&mut set) };
        nvml_try(code).map_err(from_nvml)?;
        self.sets.push(Some(Set(set)));
        Ok(self.sets.len() - 1)
    }

    fn register(&mut self, set: SetId, index: u32, mask: u64) -> Result<(), DriverError> {
        let handle = match self.sets.get(set) {
            Some(Some(s)) => s.0,
            _ => return Err(DriverError::Other(format!("no event set {set}"))),
        };
        let dev = self.device(DevRef::whole(index))?;
        let lib = self.nvml.lib();
        let sym = lib
            .nvmlDeviceRegisterEvents
            .as_ref()
            .map_err(|_| missing("nvmlDeviceRegisterEvents"))?;
        // SAFETY: a valid device handle and a live set.
        let code = unsafe { sym(dev.handle(), mask, handle) };
        match nvml_try(code) {
            Ok(()) => Ok(()),
            Err(e) => {
                // Unusable from now on, whatever the error (see the trait): free it.
                if let Some(s) = self.sets.get_mut(set).and_then(Option::take) {
                    free(&self.nvml, s);
                }
                Err(from_nvml(e))
            }
        }
    }

    fn wait(&mut self, set: SetId, timeout_ms: u32) -> Result<RawEvent, DriverError> {
        let handle = match self.sets.get(set) {
            Some(Some(s)) => s.0,
            _ => return Err(DriverError::Other(format!("no event set {set}"))),
        };
        let lib = self.nvml.lib();
        let sym = lib
            .nvmlEventSetWait_v2
            .as_ref()
            .map_err(|_| missing("nvmlEventSetWait_v2"))?;
        // SAFETY: zeroed plain C struct, filled by NVML.
        let mut data: nvmlEventData_t = unsafe { mem::zeroed() };
        // SAFETY: a live set and an out-pointer to a local.
        let code = unsafe { sym(handle, &mut data, timeout_ms) };
        nvml_try(code).map_err(from_nvml)?;
        Ok(RawEvent {
            types: data.eventType,
            data: data.eventData,
            gpu_instance: data.gpuInstanceId,
        })
    }

    fn free_set(&mut self, set: SetId) {
        if let Some(s) = self.sets.get_mut(set).and_then(Option::take) {
            free(&self.nvml, s);
        }
    }
}
