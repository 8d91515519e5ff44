//! The NVML inventory: the devices as the driver sees them.

use nvml_wrapper::Nvml;

use super::inventory::Inventory;
use crate::core::GpuDevice;

pub struct NvmlInventory {
    nvml: Nvml,
}

impl NvmlInventory {
    /// Loads libnvidia-ml and initialises it once for the process lifetime.
    pub fn open() -> Result<NvmlInventory, String> {
        let nvml = Nvml::init().map_err(describe_init_error)?;
        Ok(NvmlInventory { nvml })
    }
}

fn describe_init_error(e: nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::LibloadingError(_) => "the NVML library (libnvidia-ml.so.1) is not installed".into(),
        E::DriverNotLoaded => "the NVIDIA driver is not loaded".into(),
        E::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        other => format!("NVML failed to initialise: {other}"),
    }
}

impl Inventory for NvmlInventory {
    fn describe(&self) -> String {
        let driver = self
            .nvml
            .sys_driver_version()
            .unwrap_or_else(|_| "unknown".into());
        let n = self.nvml.device_count().unwrap_or(0);
        format!("nvml: {n} device(s), driver {driver}")
    }

    fn devices(&mut self) -> Vec<GpuDevice> {
        let n = self.nvml.device_count().unwrap_or(0);
        (0..n)
            .filter_map(|i| {
                let d = self.nvml.device_by_index(i).ok()?;
                let mem = d.memory_info().ok()?;
                Some(GpuDevice {
                    index: i,
                    uuid: d.uuid().ok()?,
                    name: d.name().unwrap_or_else(|_| "unknown".into()),
                    memory_total: mem.total,
                    memory_foreign: 0,
                    topology: None,
                })
            })
            .collect()
    }
}
