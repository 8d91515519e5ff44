//! The GPU table: devices as the inventory reports them, hearth's reservations on them, health
//! and cordons; and placement of a replica onto them.

use crate::config::Placement;
use crate::protocol::GpuView;

use super::replica::ReplicaId;

/// A device as the inventory (NVML or the static list) sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevice {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    /// Memory held by processes hearth did not start.
    pub memory_foreign: u64,
    /// Devices with the same value share a NUMA node or PCIe root (as NVML tells); multi-GPU
    /// replicas prefer such sets.
    pub topology: Option<String>,
}

impl GpuDevice {
    /// The devices declared in `[[gpus.device]]`, indexed in the order written.
    pub fn declared(cfg: &crate::config::GpusConfig) -> Vec<GpuDevice> {
        cfg.devices
            .iter()
            .enumerate()
            .map(|(i, d)| GpuDevice {
                index: i as u32,
                uuid: d.uuid.clone(),
                name: d.name.clone(),
                memory_total: d.memory,
                memory_foreign: 0,
                topology: None,
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct GpuSlot {
    pub device: GpuDevice,
    pub reserved: u64,
    /// Taken whole by a replica that declared no `gpu_memory`.
    pub exclusive: bool,
    pub healthy: bool,
    pub cordoned: bool,
    /// Replicas move off: unhealthy, or cordoned with `evacuate`.
    pub evacuate: bool,
    pub note: String,
    /// Memory in use on the device by every process, as NVML last said.
    pub memory_used: Option<u64>,
    pub replicas: Vec<ReplicaId>,
}

impl GpuSlot {
    fn free(&self) -> u64 {
        self.device
            .memory_total
            .saturating_sub(self.device.memory_foreign)
            .saturating_sub(self.reserved)
    }
    fn accepts(&self) -> bool {
        self.healthy && !self.cordoned && !self.exclusive
    }
}

#[derive(Debug, Clone, Default)]
pub struct GpuTable {
    pub slots: Vec<GpuSlot>,
}

/// Where a replica goes: device indices into the table and the bytes reserved on each.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub devices: Vec<usize>,
    pub bytes: u64,
}

impl GpuTable {
    pub fn new(devices: Vec<GpuDevice>) -> Self {
        let mut t = GpuTable::default();
        t.update(devices);
        t
    }

    /// Takes a new inventory reading; reservations, health and cordons stay with their UUID.
    pub fn update(&mut self, devices: Vec<GpuDevice>) {
        let mut slots = Vec::with_capacity(devices.len());
        for d in devices {
            match self.slots.iter().find(|s| s.device.uuid == d.uuid) {
                Some(known) => {
                    let mut s = known.clone();
                    s.device = d;
                    slots.push(s);
                }
                None => slots.push(GpuSlot {
                    device: d,
                    reserved: 0,
                    exclusive: false,
                    healthy: true,
                    cordoned: false,
                    evacuate: false,
                    note: String::new(),
                    memory_used: None,
                    replicas: Vec::new(),
                }),
            }
        }
        // A device that vanished while holding replicas stays, so its reservations are not lost.
        for s in &self.slots {
            if !s.replicas.is_empty() && !slots.iter().any(|n| n.device.uuid == s.device.uuid) {
                let mut gone = s.clone();
                gone.healthy = false;
                gone.evacuate = true;
                gone.note = "no longer reported by the inventory".into();
                slots.push(gone);
            }
        }
        self.slots = slots;
    }

    /// Chooses `count` devices with `bytes` free each (None: whole, unshared devices).
    /// `pack` fills the fullest device that fits, `spread` the emptiest.
    pub fn place(
        &self,
        count: u32,
        bytes: Option<u64>,
        placement: Placement,
    ) -> Result<Placed, String> {
        if count == 0 {
            return Ok(Placed {
                devices: Vec::new(),
                bytes: 0,
            });
        }
        let mut fits: Vec<(usize, u64)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.accepts())
            .filter(|(_, s)| match bytes {
                Some(b) => s.free() >= b,
                None => s.replicas.is_empty() && s.reserved == 0,
            })
            .map(|(i, s)| (i, s.free()))
            .collect();
        if fits.len() < count as usize {
            let usable = self.slots.iter().filter(|s| s.accepts()).count();
            let need = match bytes {
                Some(b) => format!("{} free", crate::units::short_bytes(b)),
                None => "a whole device".to_string(),
            };
            return Err(format!(
                "needs {count} GPU(s) with {need}; {} of {} device(s) fit ({} healthy and uncordoned)",
                fits.len(),
                self.slots.len(),
                usable
            ));
        }
        match placement {
            Placement::Pack => fits.sort_by_key(|&(i, free)| (free, i)),
            Placement::Spread => fits.sort_by_key(|&(i, free)| (std::cmp::Reverse(free), i)),
        }
        let devices = self.choose(&fits, count as usize);
        let bytes = match bytes {
            Some(b) => b,
            None => devices
                .iter()
                .filter_map(|&i| self.slots.get(i))
                .map(GpuSlot::free)
                .min()
                .unwrap_or(0),
        };
        Ok(Placed { devices, bytes })
    }

    /// The first `count` devices in preference order, from one topology group (NUMA node or
    /// PCIe root) when some group holds enough; across groups otherwise.
    fn choose(&self, ordered: &[(usize, u64)], count: usize) -> Vec<usize> {
        if count > 1 {
            let mut groups: Vec<&str> = Vec::new();
            for &(i, _) in ordered {
                if let Some(t) = self.topology(i) {
                    if !groups.contains(&t) {
                        groups.push(t);
                    }
                }
            }
            for g in groups {
                let same: Vec<usize> = ordered
                    .iter()
                    .filter(|&&(i, _)| self.topology(i) == Some(g))
                    .map(|&(i, _)| i)
                    .take(count)
                    .collect();
                if same.len() == count {
                    return same;
                }
            }
        }
        ordered.iter().take(count).map(|&(i, _)| i).collect()
    }

    fn topology(&self, i: usize) -> Option<&str> {
        self.slots.get(i)?.device.topology.as_deref()
    }

    /// Any of these devices is being left (unhealthy, or cordoned to evacuate).
    pub fn leaving(&self, devices: &[usize]) -> bool {
        devices
            .iter()
            .any(|&i| self.slots.get(i).is_some_and(|s| s.evacuate))
    }

    pub fn reserve(&mut self, replica: &ReplicaId, placed: &Placed, exclusive: bool) {
        for &i in &placed.devices {
            let Some(s) = self.slots.get_mut(i) else {
                continue;
            };
            s.reserved += placed.bytes;
            s.exclusive |= exclusive;
            s.replicas.push(replica.clone());
        }
    }

    pub fn release(&mut self, replica: &ReplicaId, devices: &[usize], bytes: u64) {
        for &i in devices {
            if let Some(s) = self.slots.get_mut(i) {
                s.reserved = s.reserved.saturating_sub(bytes);
                s.replicas.retain(|r| r != replica);
                if s.replicas.is_empty() {
                    s.exclusive = false;
                    s.reserved = 0;
                }
            }
        }
    }

    pub fn uuids(&self, devices: &[usize]) -> Vec<String> {
        devices
            .iter()
            .filter_map(|&i| self.slots.get(i))
            .map(|s| s.device.uuid.clone())
            .collect()
    }

    /// The slot of a device by UUID or index, as operators type it.
    pub fn slot_mut(&mut self, key: &str) -> Option<&mut GpuSlot> {
        let i = self.find(key)?;
        self.slots.get_mut(i)
    }

    /// A device by UUID or index, as operators type it.
    pub fn find(&self, key: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.device.uuid == key)
            .or_else(|| {
                let index: u32 = key.parse().ok()?;
                self.slots.iter().position(|s| s.device.index == index)
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
                healthy: s.healthy,
                cordoned: s.cordoned,
                replicas: s.replicas.iter().map(|r| r.0.clone()).collect(),
                memory_used: s.memory_used,
                memory_foreign: s.memory_used.map(|_| s.device.memory_foreign),
                note: (!s.note.is_empty()).then(|| s.note.clone()),
                topology: s.device.topology.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn dev(i: u32, total_gib: u64) -> GpuDevice {
        GpuDevice {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "fake".into(),
            memory_total: total_gib * GIB,
            memory_foreign: 0,
            topology: None,
        }
    }

    #[test]
    fn pack_fills_the_fullest_device_and_spread_the_emptiest() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        let a = ReplicaId("a-1".into());
        let p = t.place(1, Some(30 * GIB), Placement::Pack).unwrap();
        t.reserve(&a, &p, false);
        assert_eq!(p.devices, vec![0]);
        // pack: device 0 has 50 GiB free, device 1 has 80: the fuller one that fits.
        assert_eq!(
            t.place(1, Some(30 * GIB), Placement::Pack).unwrap().devices,
            vec![0]
        );
        assert_eq!(
            t.place(1, Some(30 * GIB), Placement::Spread)
                .unwrap()
                .devices,
            vec![1]
        );
        // 60 GiB only fits on device 1.
        assert_eq!(
            t.place(1, Some(60 * GIB), Placement::Pack).unwrap().devices,
            vec![1]
        );
        t.release(&a, &p.devices, p.bytes);
        assert_eq!(t.slots[0].reserved, 0);
    }

    #[test]
    fn whole_device_replicas_take_empty_devices_only_and_exclusively() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        let a = ReplicaId("a-1".into());
        let p = t.place(1, Some(GIB), Placement::Pack).unwrap();
        t.reserve(&a, &p, false);
        let whole = t.place(1, None, Placement::Pack).unwrap();
        assert_eq!(whole.devices, vec![1]);
        t.reserve(&ReplicaId("b-1".into()), &whole, true);
        assert!(t.place(1, Some(GIB), Placement::Spread).unwrap().devices == vec![0]);
        assert!(t.place(2, Some(GIB), Placement::Spread).is_err());
    }

    #[test]
    fn multi_gpu_is_all_or_nothing_and_foreign_memory_counts() {
        let mut devices = vec![dev(0, 80), dev(1, 80), dev(2, 80)];
        devices[2].memory_foreign = 70 * GIB;
        let t = GpuTable::new(devices);
        let p = t.place(2, Some(40 * GIB), Placement::Pack).unwrap();
        assert_eq!(p.devices.len(), 2);
        assert!(!p.devices.contains(&2));
        let err = t.place(3, Some(40 * GIB), Placement::Pack).unwrap_err();
        assert!(err.contains("needs 3 GPU(s)"), "{err}");
    }

    #[test]
    fn multi_gpu_prefers_devices_of_one_numa_node() {
        let mut devices: Vec<GpuDevice> = (0..4).map(|i| dev(i, 80)).collect();
        for (i, d) in devices.iter_mut().enumerate() {
            d.topology = Some(format!("numa{}", i % 2));
        }
        let t = GpuTable::new(devices);
        let p = t.place(2, Some(GIB), Placement::Pack).unwrap();
        let groups: Vec<_> = p
            .devices
            .iter()
            .map(|&i| t.slots[i].device.topology.clone())
            .collect();
        assert_eq!(groups[0], groups[1], "{p:?}");
        // No group holds 3: placement still succeeds across groups.
        assert_eq!(
            t.place(3, Some(GIB), Placement::Pack)
                .unwrap()
                .devices
                .len(),
            3
        );
    }

    #[test]
    fn cordoned_and_unhealthy_devices_take_nothing() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        t.slots[0].cordoned = true;
        t.slots[1].healthy = false;
        assert!(t.place(1, Some(GIB), Placement::Pack).is_err());
        assert_eq!(t.find("GPU-1"), Some(1));
        assert_eq!(t.find("0"), Some(0));
        assert_eq!(t.find("7"), None);
    }
}
