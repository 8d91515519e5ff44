//! GPU inventory: where the device list comes from. NVML on a real host; the devices declared
//! in the configuration otherwise; nothing at all on a host without GPUs.

use super::gpu_monitor::{MonitorHandle, MonitorSink};
use crate::config::{GpuBackend, GpusConfig};
use crate::core::GpuDevice;

pub trait Inventory: Send {
    /// Which inventory this is, in words, for the log and `hearth gpus`.
    fn describe(&self) -> String;
    /// The devices now.
    fn devices(&mut self) -> Vec<GpuDevice>;
    /// Starts the thread that reports XIDs and memory use to the core through `sink`, where this
    /// inventory can see them (NVML); declared devices have nothing to report.
    fn start_monitor(&mut self, sink: MonitorSink) -> Option<MonitorHandle> {
        let _ = sink;
        None
    }
}

/// The devices declared in `[[gpus.device]]`: for hosts where NVML is absent, and for tests.
pub struct StaticInventory {
    devices: Vec<GpuDevice>,
    why: String,
}

impl StaticInventory {
    pub fn from_config(cfg: &GpusConfig, why: impl Into<String>) -> Self {
        let devices = GpuDevice::declared(cfg);
        StaticInventory {
            devices,
            why: why.into(),
        }
    }
}

impl Inventory for StaticInventory {
    fn describe(&self) -> String {
        format!(
            "static: {} device(s) declared in the configuration ({})",
            self.devices.len(),
            self.why
        )
    }
    fn devices(&mut self) -> Vec<GpuDevice> {
        self.devices.clone()
    }
}

/// Chooses the inventory `[gpus] backend` asks for. `nvml` without NVML is an error; `auto`
/// falls back to the declared devices and says why.
pub fn open(cfg: &GpusConfig) -> Result<Box<dyn Inventory>, String> {
    match cfg.backend {
        GpuBackend::Static => Ok(Box::new(StaticInventory::from_config(
            cfg,
            "backend = \"static\"",
        ))),
        GpuBackend::Nvml => super::nvml::NvmlInventory::open()
            .map(|n| Box::new(n) as Box<dyn Inventory>)
            .map_err(|e| format!("[gpus] backend = \"nvml\" but NVML is not usable: {e}")),
        GpuBackend::Auto => match super::nvml::NvmlInventory::open() {
            Ok(n) => Ok(Box::new(n) as Box<dyn Inventory>),
            Err(e) => Ok(Box::new(StaticInventory::from_config(
                cfg,
                format!("backend = \"auto\" and NVML is not usable: {e}"),
            ))),
        },
    }
}
