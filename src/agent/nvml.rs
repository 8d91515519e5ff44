//! The NVML inventory: the devices as the driver sees them, and the monitor thread's source of
//! XID events and memory readings. NVML is initialised once and kept for the process lifetime
//! (`Arc<Nvml>`, shared by the inventory and the monitor thread).
//!
//! Topology: a device's `topology` key is the NUMA node the kernel reports for the device's PCI
//! function (`/sys/bus/pci/devices/<bus id>/numa_node`), as `numa<N>`: the CPU-side node the GPU
//! hangs off. NVML's `numa_node_id()` (nvmlDeviceGetNumaNodeId) is not that: it names the node
//! the GPU's own memory forms on coherent platforms (Grace Hopper), and answers NotSupported
//! elsewhere. Where the kernel knows no NUMA node (-1: single-socket hosts, some VMs), the key is
//! the PCI domain and bus (`pci<domain>:<bus>`) from NVML's `pci_info()`, which groups only
//! devices on the same bus.

use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::EventSet;
use nvml_wrapper::Nvml;

use super::gpu_monitor::{self, DeviceMemory, GpuSource, MonitorHandle, MonitorSink, Xid};
use super::inventory::Inventory;
use crate::core::GpuDevice;

pub struct NvmlInventory {
    nvml: Arc<Nvml>,
}

impl NvmlInventory {
    /// Loads libnvidia-ml and initialises it once for the process lifetime.
    pub fn open() -> Result<NvmlInventory, String> {
        let nvml = Nvml::init().map_err(describe_init_error)?;
        Ok(NvmlInventory {
            nvml: Arc::new(nvml),
        })
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

/// The topology key of a device from its PCI bus id (`00000000:3B:00.0`, as NVML writes it)
/// and the kernel's NUMA node for it (None or negative: unknown).
pub fn topology_key(bus_id: &str, numa_node: Option<i64>) -> Option<String> {
    if let Some(n) = numa_node.filter(|&n| n >= 0) {
        return Some(format!("numa{n}"));
    }
    // domain:bus of domain:bus:device.function
    let mut parts = bus_id.trim().split(':');
    let domain = parts.next()?;
    let bus = parts.next()?;
    parts.next()?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    Some(format!("pci{domain:04x}:{bus:02x}"))
}

/// The kernel's NUMA node for a PCI device, from sysfs, which names functions with a 4-digit
/// lower-case domain (`0000:3b:00.0`) where NVML writes 8 upper-case digits.
fn sysfs_numa_node(bus_id: &str) -> Option<i64> {
    let id = bus_id.trim().to_ascii_lowercase();
    let short = match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    };
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{short}/numa_node")).ok()?;
    text.trim().parse().ok()
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
        let n = match self.nvml.device_count() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("NVML: counting devices: {e}");
                return Vec::new();
            }
        };
        (0..n)
            .filter_map(|i| {
                let d = match self.nvml.device_by_index(i) {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::error!("NVML: device {i}: {e}; left out of the inventory");
                        return None;
                    }
                };
                let (uuid, mem) = match (d.uuid(), d.memory_info()) {
                    (Ok(u), Ok(m)) => (u, m),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::error!("NVML: device {i}: {e}; left out of the inventory");
                        return None;
                    }
                };
                let topology = d
                    .pci_info()
                    .ok()
                    .and_then(|p| topology_key(&p.bus_id, sysfs_numa_node(&p.bus_id)));
                Some(GpuDevice {
                    index: i,
                    uuid,
                    name: d.name().unwrap_or_else(|_| "unknown".into()),
                    memory_total: mem.total,
                    // The monitor's first memory reading (at once) replaces this.
                    memory_foreign: 0,
                    topology,
                })
            })
            .collect()
    }

    fn start_monitor(&mut self, sink: MonitorSink) -> Option<MonitorHandle> {
        let nvml = self.nvml.clone();
        match gpu_monitor::spawn("hearth-nvml", sink, move |sink| {
            let mut source = NvmlSource::new(&nvml);
            gpu_monitor::pump(&mut source, &sink, &gpu_monitor::pgid_of);
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

/// XIDs from an NVML event set, memory from `memory_info` and the running compute processes.
pub struct NvmlSource<'n> {
    nvml: &'n Nvml,
    events: Option<EventSet<'n>>,
    /// Devices whose memory could not be read, logged once.
    memory_failing: std::collections::BTreeSet<u32>,
    /// UUIDs by index, as at start: a device that falls off the bus can't tell its UUID any more.
    uuids: Vec<Option<String>>,
    /// Devices found lost (NVML_ERROR_GPU_IS_LOST) and reported as XID 79 ("GPU has fallen off
    /// the bus"), once each: the driver may never deliver an XID event for them.
    lost: std::collections::BTreeSet<u32>,
    pending: std::collections::VecDeque<Xid>,
}

/// NVIDIA's XID for a GPU that has fallen off the bus.
const XID_FALLEN_OFF_THE_BUS: u64 = 79;

impl<'n> NvmlSource<'n> {
    /// Registers every device's critical-XID events (and double-bit ECC errors, which NVIDIA
    /// numbers XID 48) in one event set. A device that can't deliver them is logged: its faults
    /// then go unseen by hearth.
    pub fn new(nvml: &'n Nvml) -> NvmlSource<'n> {
        let mut events = match nvml.create_event_set() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!("NVML: cannot create an event set ({e}); XIDs will not be seen");
                None
            }
        };
        let n = nvml.device_count().unwrap_or(0);
        for i in 0..n {
            let Some(set) = events.take() else { break };
            let Ok(d) = nvml.device_by_index(i) else {
                events = Some(set);
                continue;
            };
            let uuid = d.uuid().unwrap_or_else(|_| format!("index {i}"));
            let supported = d.supported_event_types().unwrap_or(EventTypes::empty());
            let wanted =
                supported & (EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR);
            if !wanted.contains(EventTypes::CRITICAL_XID_ERROR) {
                tracing::warn!(gpu = %uuid, "NVML: the device does not report XID events; its faults will not be seen");
            }
            if wanted.is_empty() {
                events = Some(set);
                continue;
            }
            match d.register_events(wanted, set) {
                Ok(set) => events = Some(set),
                Err(e) => {
                    // NVML frees the set on failure: start a new one for the other devices.
                    tracing::error!(gpu = %uuid, "NVML: registering XID events: {}; its faults will not be seen", e.error);
                    events = nvml.create_event_set().ok();
                }
            }
        }
        let uuids = (0..n)
            .map(|i| nvml.device_by_index(i).and_then(|d| d.uuid()).ok())
            .collect();
        NvmlSource {
            nvml,
            events,
            memory_failing: Default::default(),
            uuids,
            lost: Default::default(),
            pending: Default::default(),
        }
    }

    /// Device `i` answered GPU_IS_LOST: report it once, as XID 79.
    fn mark_lost(&mut self, i: u32) {
        let Some(Some(uuid)) = self.uuids.get(i as usize) else {
            return;
        };
        if self.lost.insert(i) {
            tracing::error!(gpu = %uuid, "NVML: device {i} is lost (fallen off the bus)");
            self.pending.push_back(Xid {
                uuid: uuid.clone(),
                xid: XID_FALLEN_OFF_THE_BUS,
            });
        }
    }

    /// After the event wait said a GPU is lost: find which.
    fn find_lost(&mut self) {
        for i in 0..self.uuids.len() as u32 {
            let lost = match self.nvml.device_by_index(i) {
                Ok(d) => matches!(d.memory_info(), Err(NvmlError::GpuLost)),
                Err(e) => matches!(e, NvmlError::GpuLost),
            };
            if lost {
                self.mark_lost(i);
            }
        }
    }
}

impl GpuSource for NvmlSource<'_> {
    fn memory(&mut self) -> Vec<DeviceMemory> {
        let n = self.nvml.device_count().unwrap_or(0);
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let reading = (|| -> Result<DeviceMemory, NvmlError> {
                let d = self.nvml.device_by_index(i)?;
                let uuid = d.uuid()?;
                let used = d.memory_info()?.used;
                let processes = d
                    .running_compute_processes()?
                    .into_iter()
                    .filter_map(|p| match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some((p.pid, b)),
                        UsedGpuMemory::Unavailable => None,
                    })
                    .collect();
                Ok(DeviceMemory {
                    uuid,
                    used,
                    processes,
                })
            })();
            match reading {
                Ok(m) => {
                    self.memory_failing.remove(&i);
                    out.push(m);
                }
                Err(NvmlError::GpuLost) => self.mark_lost(i),
                // Without the process list, hearth's own use would count as foreign: better
                // no reading than a wrong one.
                Err(e) => {
                    if self.memory_failing.insert(i) {
                        tracing::warn!("NVML: reading memory of device {i}: {e}");
                    }
                }
            }
        }
        out
    }

    fn wait_xid(&mut self, timeout: Duration) -> Result<Option<Xid>, String> {
        if let Some(x) = self.pending.pop_front() {
            return Ok(Some(x));
        }
        let Some(set) = &self.events else {
            std::thread::sleep(timeout);
            return Ok(None);
        };
        let ms = timeout.as_millis().min(u32::MAX as u128) as u32;
        match set.wait(ms) {
            Ok(ev) => {
                let uuid = ev
                    .device
                    .uuid()
                    .map_err(|e| format!("event for a device whose UUID NVML can't tell: {e}"))?;
                let xid = if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    match ev.event_data {
                        Some(XidError::Value(x)) => x,
                        Some(XidError::Unknown) | None => {
                            tracing::warn!(gpu = %uuid, "NVML: critical XID event without a number");
                            return Ok(None);
                        }
                    }
                } else if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    48
                } else {
                    return Ok(None);
                };
                Ok(Some(Xid { uuid, xid }))
            }
            Err(NvmlError::Timeout) => Ok(None),
            Err(NvmlError::GpuLost) => {
                self.find_lost();
                match self.pending.pop_front() {
                    Some(x) => Ok(Some(x)),
                    None => Err("NVML: a GPU is lost, but no device says so".into()),
                }
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_is_the_numa_node_when_known_else_the_pci_domain_and_bus() {
        assert_eq!(
            topology_key("00000000:3B:00.0", Some(1)).as_deref(),
            Some("numa1")
        );
        assert_eq!(
            topology_key("00000000:3B:00.0", Some(-1)).as_deref(),
            Some("pci0000:3b")
        );
        assert_eq!(
            topology_key("00000001:0A:00.0", None).as_deref(),
            Some("pci0001:0a")
        );
        assert_eq!(topology_key("garbage", None), None);
    }

    #[test]
    fn without_nvml_opening_says_why() {
        // This machine has no NVIDIA driver; on one that has, NVML opens and this says nothing.
        if let Err(e) = NvmlInventory::open() {
            assert!(
                e.contains("NVML") || e.contains("NVIDIA"),
                "the reason names NVML or the driver: {e}"
            );
        }
    }
}
