//! The NVML inventory: the devices as the driver sees them (whole GPUs, MIG instances, lost
//! GPUs, NVLink and PCIe topology), and the monitor thread's source of XID events, memory
//! readings and recovery actions.
//!
//! - `driver.rs`: the NVML calls hearth makes, as a trait;
//! - `real.rs`: those calls on the driver (nvml-wrapper, and its raw symbols where it lacks one);
//! - `enumerate.rs`: reading the inventory;
//! - `source.rs`: the monitor's source (event sets, readings, lost GPUs);
//! - `script.rs`: scripted answers, for tests.
//!
//! NVML is initialised once and kept for the process lifetime (`Arc<Nvml>`, shared by the
//! inventory and the monitor thread).
//!
//! Topology: a device's `topology` key is the NUMA node the kernel reports for the device's PCI
//! function (`/sys/bus/pci/devices/<bus id>/numa_node`), as `numa<N>`: the CPU-side node the GPU
//! hangs off. NVML's `numa_node_id()` (nvmlDeviceGetNumaNodeId) is not that: it names the node
//! the GPU's own memory forms on coherent platforms (Grace Hopper). How GPUs reach each other
//! (NVLink, PCIe switch, host bridge…) comes from NVML per pair (see enumerate.rs).

pub mod driver;
pub mod enumerate;
mod real;
pub mod script;
pub mod source;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::gpu_monitor::{self, MonitorHandle, MonitorSink};
use super::inventory::Inventory;
use crate::core::GpuDevice;
use driver::Driver;
use enumerate::Enumerator;
use source::NvmlSource;

pub use real::RealDriver;

/// The inventory over a driver: the real one on a GPU host, a scripted one in tests.
pub struct NvmlInventory<D: Driver + Send + 'static> {
    /// Moved to the monitor thread when it starts.
    driver: Option<D>,
    enumerator: Enumerator,
    /// The last reading.
    devices: Vec<GpuDevice>,
    description: String,
}

impl NvmlInventory<RealDriver> {
    /// Loads libnvidia-ml and initialises it once for the process lifetime.
    pub fn open() -> Result<NvmlInventory<RealDriver>, String> {
        let nvml = Nvml::init().map_err(describe_init_error)?;
        Ok(NvmlInventory::with_driver(RealDriver::new(Arc::new(nvml))))
    }
}

impl<D: Driver + Send + 'static> NvmlInventory<D> {
    pub fn with_driver(mut driver: D) -> NvmlInventory<D> {
        let version = driver.driver_version().unwrap_or_else(|_| "unknown".into());
        let mut enumerator = Enumerator::default();
        let devices = enumerator.read(&mut driver);
        let description = format!("nvml: {} device(s), driver {version}", devices.len());
        NvmlInventory {
            driver: Some(driver),
            enumerator,
            devices,
            description,
        }
    }
}

/// Why NVML could not start, in an operator's words.
pub fn describe_init_error(e: NvmlError) -> String {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::LibloadingError(_) => "the NVML library (libnvidia-ml.so.1) is not installed".into(),
        E::DriverNotLoaded => "the NVIDIA driver is not loaded".into(),
        E::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        other => format!("NVML failed to initialise: {other}"),
    }
}

/// The kernel's NUMA node for a PCI device, from sysfs, which names functions with a 4-digit
/// lower-case domain (`0000:3b:00.0`) where NVML writes 8 upper-case digits.
pub(super) fn sysfs_numa_node(bus_id: &str) -> Option<i64> {
    let text = std::fs::read_to_string(format!(
        "/sys/bus/pci/devices/{}/numa_node",
        sysfs_name(bus_id)
    ))
    .ok()?;
    text.trim().parse().ok()
}

fn sysfs_name(bus_id: &str) -> String {
    let id = bus_id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

impl<D: Driver + Send + 'static> Inventory for NvmlInventory<D> {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn devices(&mut self) -> Vec<GpuDevice> {
        if let Some(d) = self.driver.as_mut() {
            self.devices = self.enumerator.read(d);
        }
        self.devices.clone()
    }

    fn start_monitor(&mut self, sink: MonitorSink) -> Option<MonitorHandle> {
        let driver = self.driver.take()?;
        let (enumerator, devices) = (self.enumerator.clone(), self.devices.clone());
        match gpu_monitor::spawn("hearth-nvml", sink, move |sink| {
            let mut source = NvmlSource::new(driver, enumerator, devices);
            gpu_monitor::pump(&mut source, &sink);
        }) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!(
                    "could not start the NVML monitor thread: {e}; no XID or memory readings"
                );
                None
            }
        }
    }
}
