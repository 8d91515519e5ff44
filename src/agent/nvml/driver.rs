//! The NVML calls hearth makes, as a trait: `real.rs` makes them on the driver, `script.rs`
//! answers them from a script in tests. Everything that decides anything about the answers
//! (which devices there are, MIG, lost devices, event sets, memory readings) is written against
//! this trait, in `enumerate.rs` and `source.rs`, so that a scripted driver drives exactly the
//! code a GPU host runs.

use std::fmt;

/// A device to ask about: a whole GPU by NVML index, or one of its MIG instances (by the index
/// NVML's `nvmlDeviceGetMigDeviceHandleByIndex` takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevRef {
    pub index: u32,
    pub mig: Option<u32>,
}

impl DevRef {
    pub fn whole(index: u32) -> DevRef {
        DevRef { index, mig: None }
    }
}

/// Why an NVML call failed, in the cases hearth tells apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverError {
    /// NVML_ERROR_GPU_IS_LOST: the device has fallen off the bus or is otherwise inaccessible.
    Lost,
    NotSupported,
    /// No such device (e.g. a MIG index with no instance behind it).
    NotFound,
    NoPermission,
    /// An event wait that saw nothing.
    Timeout,
    Other(String),
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverError::Lost => f.write_str("the GPU is lost (GPU_IS_LOST)"),
            DriverError::NotSupported => f.write_str("not supported"),
            DriverError::NotFound => f.write_str("not found"),
            DriverError::NoPermission => f.write_str("no permission"),
            DriverError::Timeout => f.write_str("timed out"),
            DriverError::Other(e) => f.write_str(e),
        }
    }
}

/// What identifies a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub uuid: String,
    pub name: String,
    /// `00000000:3B:00.0`, as NVML writes it; None for a MIG instance or where NVML won't say.
    pub bus_id: Option<String>,
    /// A MIG instance's GPU instance id, which XID events carry.
    pub gpu_instance: Option<u32>,
}

/// NVML's `nvmlMemory_v2_t`: `total` = `reserved` + `used` + `free`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    pub total: u64,
    /// Set aside by the driver and firmware.
    pub reserved: u64,
    /// Allocated by processes.
    pub used: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigMode {
    pub current: bool,
    /// The mode after the next GPU reset.
    pub pending: bool,
}

/// An event as NVML's `nvmlEventData_t` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// `nvmlEventType*` bits.
    pub types: u64,
    /// The XID, for a critical XID event.
    pub data: u64,
    /// The GPU instance the event is about, on a GPU in MIG mode; `u32::MAX` for the whole GPU.
    pub gpu_instance: u32,
}

/// An event set handle of the driver's.
pub type SetId = usize;

/// NVML's event type bits (nvml.h). nvml-wrapper's `EventTypes` lacks the recovery-action bit
/// and drops unknown bits from what the driver says; hearth keeps the raw mask.
pub mod event_bits {
    pub const DOUBLE_BIT_ECC_ERROR: u64 = 0x2;
    pub const CRITICAL_XID_ERROR: u64 = 0x8;
    pub const GPU_RECOVERY_ACTION: u64 = 0x8000;
}

pub trait Driver {
    /// The driver version, for the log.
    fn driver_version(&mut self) -> Result<String, DriverError>;
    fn device_count(&mut self) -> Result<u32, DriverError>;
    fn facts(&mut self, d: DevRef) -> Result<Facts, DriverError>;
    fn memory(&mut self, d: DevRef) -> Result<Memory, DriverError>;
    /// The compute processes on the device: (pid, bytes, None where the driver reports
    /// "Unavailable").
    fn processes(&mut self, d: DevRef) -> Result<Vec<(u32, Option<u64>)>, DriverError>;
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` of a whole GPU, raw.
    fn recovery_action(&mut self, index: u32) -> Result<u32, DriverError>;
    /// NotSupported where the GPU has no MIG.
    fn mig_mode(&mut self, index: u32) -> Result<MigMode, DriverError>;
    /// How many MIG instance indices to try (`nvmlDeviceGetMaxMigDeviceCount`).
    fn mig_slots(&mut self, index: u32) -> Result<u32, DriverError>;
    /// Whether two whole GPUs reach each other over NVLink (NVML's P2P status for NVLink).
    fn nvlink(&mut self, a: u32, b: u32) -> Result<bool, DriverError>;
    /// The PCIe topology level two whole GPUs share (`nvmlDeviceGetTopologyCommonAncestor`).
    fn common_ancestor(&mut self, a: u32, b: u32) -> Result<crate::core::Link, DriverError>;
    /// The kernel's NUMA node for a PCI function (sysfs; -1 or None: unknown).
    fn numa_node(&mut self, bus_id: &str) -> Option<i64>;
    /// The event types the GPU can deliver, raw bits.
    fn supported_events(&mut self, index: u32) -> Result<u64, DriverError>;
    fn create_set(&mut self) -> Result<SetId, DriverError>;
    /// Registers `mask` for the GPU in `set`. On failure the set is gone (nvml-wrapper frees it,
    /// and NVML leaves it undefined after an unknown error): it must not be used again.
    fn register(&mut self, set: SetId, index: u32, mask: u64) -> Result<(), DriverError>;
    /// Waits at most `timeout_ms` for the next event in `set`.
    fn wait(&mut self, set: SetId, timeout_ms: u32) -> Result<RawEvent, DriverError>;
    fn free_set(&mut self, set: SetId);
}
