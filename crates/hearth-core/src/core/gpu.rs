//! The GPU table: devices as the inventory reports them, hearth's reservations on them, what the
//! readings say (memory, recovery action), health and cordons. Everything is keyed by the
//! device's UUID: the inventory may list devices in another order, or without one of them, at
//! any reading, and a reservation must stay with the device it was made on. Placement is in
//! placement.rs.

use crate::config::GpusConfig;
use crate::protocol::GpuView;

use super::replica::ReplicaId;
use super::xid::RecoveryAction;

/// A device as the inventory (NVML or the static list) sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevice {
    /// NVML's index (PCI bus order), or the position in `[[gpus.device]]`; a MIG instance has
    /// its parent's.
    pub index: u32,
    /// `GPU-…`, or `MIG-…` for a MIG instance.
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    /// The NUMA node the device hangs off (`numa<N>`), where the kernel knows it.
    pub topology: Option<String>,
    /// Set when the device is a MIG instance (a slice of a GPU in MIG mode).
    pub mig: Option<MigSlice>,
    /// How this device reaches each other device (from NVML's topology and NVLink queries);
    /// multi-GPU replicas prefer the closest set.
    pub links: Vec<PeerLink>,
    /// Why the inventory found the device unusable (lost, MIG mode without instances…); such a
    /// device takes nothing and what it holds moves off.
    pub fault: Option<GpuFault>,
    /// NVML will report the device's memory: start-up placement waits (briefly) for the first
    /// reading, so that memory someone else holds is known before anything is placed.
    pub metered: bool,
}

/// Where a MIG instance sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSlice {
    /// The UUID of the GPU it is a slice of: XIDs and recovery actions are the parent's.
    pub parent: String,
    /// Its GPU instance id, which NVML's XID events carry.
    pub gpu_instance: u32,
}

/// How a device reaches a peer, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Link {
    /// NVLink (a bridge, or an NVSwitch fabric): NVML says peer-to-peer over NVLink works.
    NvLink,
    /// On one board (NVML: TOPOLOGY_INTERNAL, e.g. two GPUs of one card).
    Board,
    /// Behind one PCIe switch (TOPOLOGY_SINGLE).
    PcieSwitch,
    /// Behind several PCIe switches, without the host bridge (TOPOLOGY_MULTIPLE).
    PcieSwitches,
    /// Through one PCIe host bridge (TOPOLOGY_HOSTBRIDGE).
    HostBridge,
    /// On one NUMA node, across host bridges (TOPOLOGY_NODE).
    Numa,
    /// Across NUMA nodes (TOPOLOGY_SYSTEM).
    System,
}

impl Link {
    pub fn describe(self) -> &'static str {
        match self {
            Link::NvLink => "NVLink",
            Link::Board => "same board",
            Link::PcieSwitch => "one PCIe switch",
            Link::PcieSwitches => "PCIe switches",
            Link::HostBridge => "one PCIe host bridge",
            Link::Numa => "one NUMA node",
            Link::System => "across NUMA nodes",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLink {
    pub peer: String,
    pub link: Link,
}

impl GpuDevice {
    /// A whole device with nothing known beyond its size.
    pub fn new(index: u32, uuid: impl Into<String>, name: impl Into<String>, total: u64) -> Self {
        GpuDevice {
            index,
            uuid: uuid.into(),
            name: name.into(),
            memory_total: total,
            topology: None,
            mig: None,
            links: Vec::new(),
            fault: None,
            metered: false,
        }
    }

    /// The devices declared in `[[gpus.device]]`, indexed in the order written. A UUID that
    /// starts with `MIG-` is a MIG instance (of a parent nobody declared).
    pub fn declared(cfg: &GpusConfig) -> Vec<GpuDevice> {
        cfg.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut g = GpuDevice::new(i as u32, d.uuid.clone(), d.name.clone(), d.memory);
                if d.uuid.starts_with("MIG-") {
                    g.mig = Some(MigSlice {
                        parent: String::new(),
                        gpu_instance: u32::MAX,
                    });
                }
                g
            })
            .collect()
    }

    pub fn link_to(&self, peer: &str) -> Option<Link> {
        self.links.iter().find(|l| l.peer == peer).map(|l| l.link)
    }
}

#[derive(Debug, Clone)]
pub struct GpuSlot {
    pub device: GpuDevice,
    pub reserved: u64,
    /// Taken whole by a replica that declared no `gpu_memory`.
    pub exclusive: bool,
    /// False after a fault (an XID or a recovery action that needs a reset or a reboot), until
    /// `hearth uncordon`.
    pub healthy: bool,
    pub cordoned: bool,
    /// Replicas move off: unhealthy, or cordoned with `evacuate`.
    pub evacuate: bool,
    /// The recovery action asks to drain peer-to-peer traffic: multi-GPU replicas move off and
    /// none come, until the action reads otherwise.
    pub p2p_drain: bool,
    pub note: String,
    /// Memory in use on the device by every process, as NVML last said.
    pub memory_used: Option<u64>,
    /// The part of `memory_used` no replica of hearth's accounts for.
    pub memory_foreign: u64,
    /// Memory the driver and firmware set aside; never available to anyone.
    pub driver_reserved: u64,
    /// The device's recovery action as last read (None: never read, or not readable).
    pub recovery: Option<RecoveryAction>,
    pub replicas: Vec<ReplicaId>,
    /// Gone from the inventory while holding replicas: kept until they have moved off.
    pub gone: bool,
}

/// Why the inventory found a device unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuFault {
    /// NVML says GPU_IS_LOST: fallen off the bus or otherwise inaccessible.
    Lost,
    /// A GPU in MIG mode whose instances cannot be read (NVML's words).
    MigUnreadable(String),
    /// A GPU in MIG mode with no instances: nothing can run on it whole.
    MigWithoutInstances,
    /// Gone from the inventory while holding replicas: kept until they have moved off.
    Gone,
}

impl std::fmt::Display for GpuFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuFault::Lost => f.write_str(
                "lost: the GPU has fallen off the bus or is otherwise inaccessible (NVML: \
                 GPU_IS_LOST)",
            ),
            GpuFault::MigUnreadable(e) => {
                write!(f, "MIG mode is on and its instances cannot be read ({e})")
            }
            GpuFault::MigWithoutInstances => {
                f.write_str("MIG mode is on but it has no MIG instances: nothing can run on it")
            }
            GpuFault::Gone => f.write_str("no longer reported by the inventory"),
        }
    }
}

impl GpuSlot {
    fn new(device: GpuDevice) -> GpuSlot {
        GpuSlot {
            device,
            reserved: 0,
            exclusive: false,
            healthy: true,
            cordoned: false,
            evacuate: false,
            p2p_drain: false,
            note: String::new(),
            memory_used: None,
            memory_foreign: 0,
            driver_reserved: 0,
            recovery: None,
            replicas: Vec::new(),
            gone: false,
        }
    }

    /// What a new reservation may take: the total, less the driver's share, less what others
    /// use, less what hearth has reserved.
    pub(super) fn free(&self) -> u64 {
        self.device
            .memory_total
            .saturating_sub(self.driver_reserved)
            .saturating_sub(self.memory_foreign)
            .saturating_sub(self.reserved)
    }

    /// Healthy, uncordoned, not taken whole, and not faulted.
    pub(super) fn accepts(&self) -> bool {
        self.healthy && !self.cordoned && !self.exclusive && self.device.fault.is_none()
    }

    pub(super) fn is_mig(&self) -> bool {
        self.device.mig.is_some()
    }
}

#[derive(Debug, Clone, Default)]
pub struct GpuTable {
    pub slots: Vec<GpuSlot>,
}

/// What changed in the device list at an inventory reading, for the log.
#[derive(Debug, Default, PartialEq)]
pub struct InventoryChange {
    pub appeared: Vec<String>,
    /// Gone from the reading while holding replicas: kept, faulted, until they have moved off.
    pub vanished: Vec<String>,
    /// Gone from the reading with nothing on them: dropped.
    pub dropped: Vec<String>,
    /// Faulted by this reading (newly): (uuid, why).
    pub faulted: Vec<(String, String)>,
}

impl GpuTable {
    pub fn new(devices: Vec<GpuDevice>) -> Self {
        let mut t = GpuTable::default();
        t.update(devices);
        t
    }

    /// Takes a new inventory reading. Reservations, readings, health and cordons stay with
    /// their UUID, whatever order the devices come in. A device that vanished while holding
    /// replicas stays, faulted, so that its reservations are not lost and its replicas move off.
    pub fn update(&mut self, devices: Vec<GpuDevice>) -> InventoryChange {
        let mut change = InventoryChange::default();
        let mut slots = Vec::with_capacity(devices.len());
        for d in devices {
            // A list with one UUID twice is the inventory's mistake: the first stands.
            if slots.iter().any(|s: &GpuSlot| s.device.uuid == d.uuid) {
                continue;
            }
            let known = self.slots.iter().find(|s| s.device.uuid == d.uuid);
            let newly_faulted =
                d.fault.is_some() && known.is_none_or(|k| k.device.fault != d.fault);
            if let (true, Some(why)) = (newly_faulted, &d.fault) {
                change.faulted.push((d.uuid.clone(), why.to_string()));
            }
            match known {
                Some(k) => {
                    let mut s = k.clone();
                    s.device = d;
                    s.gone = false;
                    slots.push(s);
                }
                None => {
                    change.appeared.push(d.uuid.clone());
                    slots.push(GpuSlot::new(d));
                }
            }
        }
        for s in &self.slots {
            if slots.iter().any(|n| n.device.uuid == s.device.uuid) {
                continue;
            }
            if s.replicas.is_empty() {
                change.dropped.push(s.device.uuid.clone());
                continue;
            }
            let mut gone = s.clone();
            if !gone.gone {
                change.vanished.push(gone.device.uuid.clone());
            }
            gone.gone = true;
            gone.device.fault = Some(GpuFault::Gone);
            gone.device.metered = false;
            slots.push(gone);
        }
        self.slots = slots;
        change
    }

    pub fn slot(&self, uuid: &str) -> Option<&GpuSlot> {
        self.slots.iter().find(|s| s.device.uuid == uuid)
    }

    pub fn slot_by_uuid_mut(&mut self, uuid: &str) -> Option<&mut GpuSlot> {
        self.slots.iter_mut().find(|s| s.device.uuid == uuid)
    }

    /// Any of these devices is being left: unhealthy, cordoned to evacuate, faulted or gone;
    /// or, for a replica on several devices, draining its peer-to-peer traffic.
    pub fn leaving(&self, devices: &[String]) -> bool {
        let multi = devices.len() > 1;
        devices.iter().any(|u| match self.slot(u) {
            Some(s) => s.evacuate || s.device.fault.is_some() || (multi && s.p2p_drain),
            None => true,
        })
    }

    /// `bytes` no larger than the smallest of these devices: a reservation read from disk
    /// never overflows a slot's books.
    pub fn bounded_bytes(&self, devices: &[String], bytes: u64) -> u64 {
        devices
            .iter()
            .filter_map(|u| self.slot(u))
            .map(|s| s.device.memory_total)
            .min()
            .map_or(0, |m| bytes.min(m))
    }

    /// NVML indices of these devices (for `device_naming = "index"`).
    pub fn indices(&self, devices: &[String]) -> Vec<u32> {
        devices
            .iter()
            .filter_map(|u| self.slot(u))
            .map(|s| s.device.index)
            .collect()
    }

    /// The slot of a device by UUID or index, as operators type it.
    pub fn slot_mut(&mut self, key: &str) -> Option<&mut GpuSlot> {
        let i = self.find(key)?;
        self.slots.get_mut(i)
    }

    /// A device by UUID, or a whole device by index, as operators type it (MIG instances share
    /// their parent's index and are named by UUID only).
    pub fn find(&self, key: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.device.uuid == key)
            .or_else(|| {
                let index: u32 = key.parse().ok()?;
                self.slots
                    .iter()
                    .position(|s| s.device.index == index && !s.is_mig())
            })
    }

    pub fn views(&self) -> Vec<GpuView> {
        self.slots
            .iter()
            .map(|s| GpuView {
                index: s.device.index,
                uuid: s.device.uuid.clone(),
                name: s.device.name.clone(),
                memory_total: s.device.memory_total,
                memory_reserved: s.reserved,
                healthy: s.healthy && s.device.fault.is_none(),
                cordoned: s.cordoned,
                replicas: s.replicas.iter().map(|r| r.0.clone()).collect(),
                memory_used: s.memory_used,
                memory_foreign: s.memory_used.map(|_| s.memory_foreign),
                note: match (&s.device.fault, s.note.is_empty()) {
                    (Some(f), true) => Some(f.to_string()),
                    (Some(f), false) => Some(format!("{f}; {}", s.note)),
                    (None, false) => Some(s.note.clone()),
                    (None, true) => None,
                },
                topology: s.device.topology.clone(),
                memory_driver_reserved: s.memory_used.map(|_| s.driver_reserved),
                mig_parent: s
                    .device
                    .mig
                    .as_ref()
                    .map(|m| m.parent.clone())
                    .filter(|p| !p.is_empty()),
                nvlink: s
                    .device
                    .links
                    .iter()
                    .filter(|l| l.link == Link::NvLink)
                    .map(|l| l.peer.clone())
                    .collect(),
                asleep: Vec::new(),
            })
            .collect()
    }
}
