//! Placement of one replica onto the GPU table: which devices may take it, in `placement`
//! order, and for a multi-GPU replica the closest set of them (NVLink before a PCIe switch
//! before a host bridge before a NUMA node before crossing sockets).

use std::collections::BTreeSet;

use crate::config::Placement;

use super::gpu::{GpuSlot, GpuTable, Link};

/// What one replica asks of the table.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub count: u32,
    /// Bytes on each device; None: whole, unshared devices.
    pub bytes: Option<u64>,
    pub placement: Placement,
    /// The replica names its devices by NVML index, which cannot name a MIG instance.
    pub by_index: bool,
    /// Devices it may not take now (one start per device; the first memory reading pending).
    pub exclude: &'a BTreeSet<String>,
}

impl<'a> Want<'a> {
    /// What a replica of this launch spec asks, leaving out the devices in `exclude`.
    pub fn of(launch: &crate::config::LaunchSpec, exclude: &'a BTreeSet<String>) -> Self {
        Want {
            count: launch.gpus,
            bytes: launch.gpu_memory,
            placement: launch.placement,
            by_index: launch.device_naming == crate::config::DeviceNaming::Index,
            exclude,
        }
    }
}

/// Where a replica goes: the devices' UUIDs and the bytes reserved on each.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub devices: Vec<String>,
    pub bytes: u64,
}

/// Why no set of devices takes a replica now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "needs {count} GPU(s) with {need}; {fit} of {devices} device(s) fit ({usable} healthy and \
     uncordoned){}",
    mig.map(|m| m.to_string()).unwrap_or_default()
)]
pub struct Unplaceable {
    pub count: u32,
    pub need: Need,
    /// Devices that would take it.
    pub fit: usize,
    pub devices: usize,
    /// Devices healthy and uncordoned.
    pub usable: usize,
    pub mig: Option<MigLeftOut>,
}

/// What a replica needs of each device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Free(u64),
    /// A whole device, unshared (no `gpu_memory`).
    Whole,
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Need::Free(b) => write!(f, "{} free", crate::units::short_bytes(*b)),
            Need::Whole => f.write_str("a whole device"),
        }
    }
}

/// MIG instances that had room but cannot be used for this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "; {count} MIG instance(s) left out: {}",
    if *multi {
        "a multi-GPU replica cannot use MIG instances (CUDA shows a process one)"
    } else {
        "device_naming = \"index\" cannot name MIG instances (set device_naming = \"uuid\")"
    }
)]
pub struct MigLeftOut {
    pub count: usize,
    /// The replica takes several devices (else: named by index).
    pub multi: bool,
}

/// Closeness of two devices for ranking sets: a link NVML reported, else the NUMA keys, else
/// unknown (ranked last, so that known-close devices win and unknown ones keep their order).
fn rank(a: &GpuSlot, b: &GpuSlot) -> u8 {
    if let Some(l) = a
        .device
        .link_to(&b.device.uuid)
        .or_else(|| b.device.link_to(&a.device.uuid))
    {
        return l as u8;
    }
    match (&a.device.topology, &b.device.topology) {
        (Some(x), Some(y)) if x == y => Link::Numa as u8,
        (Some(_), Some(_)) => Link::System as u8,
        _ => Link::System as u8 + 1,
    }
}

/// Beyond this many candidates, a multi-GPU set is grown only from the first ones (in
/// placement order): the work per placement stays bounded on any host.
const SEEDS: usize = 16;
/// Candidates (in placement order) a multi-GPU set is chosen from; a replica larger than this
/// takes the first ones in order.
const CLOSEST: usize = 64;

impl GpuTable {
    /// Chooses `want.count` devices with `want.bytes` free each (None: whole, unshared
    /// devices). `pack` fills the fullest device that fits, `spread` the emptiest; a multi-GPU
    /// replica takes the closest set, then the earliest in that order.
    pub fn place(&self, want: &Want<'_>) -> Result<Placed, Unplaceable> {
        if want.count == 0 {
            return Ok(Placed {
                devices: Vec::new(),
                bytes: 0,
            });
        }
        let multi = want.count > 1;
        let mut mig_left_out = 0usize;
        let mut fits: Vec<(usize, u64)> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if !s.accepts() || want.exclude.contains(&s.device.uuid) {
                continue;
            }
            if multi && s.p2p_drain {
                continue;
            }
            let fit = match want.bytes {
                Some(b) => s.free() >= b,
                None => s.replicas.is_empty() && s.reserved == 0,
            };
            if !fit {
                continue;
            }
            // CUDA shows a process one MIG instance at most, and only by UUID.
            if s.is_mig() && (multi || want.by_index) {
                mig_left_out += 1;
                continue;
            }
            fits.push((i, s.free()));
        }
        if fits.len() < want.count as usize {
            return Err(self.why_not(want, fits.len(), mig_left_out));
        }
        match want.placement {
            Placement::Pack => fits.sort_by_key(|&(i, free)| (free, i)),
            Placement::Spread => fits.sort_by_key(|&(i, free)| (std::cmp::Reverse(free), i)),
        }
        let order: Vec<usize> = fits.iter().map(|&(i, _)| i).collect();
        let chosen = self.closest(&order, want.count as usize);
        let bytes = match want.bytes {
            Some(b) => b,
            None => chosen
                .iter()
                .filter_map(|&i| self.slots.get(i))
                .map(GpuSlot::free)
                .min()
                .unwrap_or(0),
        };
        Ok(Placed {
            devices: chosen
                .iter()
                .filter_map(|&i| self.slots.get(i))
                .map(|s| s.device.uuid.clone())
                .collect(),
            bytes,
        })
    }

    fn why_not(&self, want: &Want<'_>, fit: usize, mig_left_out: usize) -> Unplaceable {
        Unplaceable {
            count: want.count,
            need: match want.bytes {
                Some(b) => Need::Free(b),
                None => Need::Whole,
            },
            fit,
            devices: self.slots.len(),
            usable: self.slots.iter().filter(|s| s.accepts()).count(),
            mig: (mig_left_out > 0).then_some(MigLeftOut {
                count: mig_left_out,
                multi: want.count > 1,
            }),
        }
    }

    /// The `count` closest devices among `order` (indices into the table, in placement order):
    /// the set whose farthest pair is closest, then whose pairs are closest in sum, then the
    /// earliest in order. Pairs are searched in full; larger sets grow greedily from each seed.
    fn closest(&self, order: &[usize], count: usize) -> Vec<usize> {
        if count <= 1 || count > CLOSEST {
            return order.iter().take(count).copied().collect();
        }
        let order = order.get(..order.len().min(CLOSEST)).unwrap_or(order);
        // Ranks between positions in `order`, computed once.
        let slots: Vec<Option<&GpuSlot>> = order.iter().map(|&i| self.slots.get(i)).collect();
        let ranks: Vec<Vec<u8>> = slots
            .iter()
            .map(|a| {
                slots
                    .iter()
                    .map(|b| match (a, b) {
                        (Some(x), Some(y)) => rank(x, y),
                        _ => u8::MAX,
                    })
                    .collect()
            })
            .collect();
        let pair = |a: usize, b: usize| -> u8 {
            ranks
                .get(a)
                .and_then(|row| row.get(b))
                .copied()
                .unwrap_or(u8::MAX)
        };
        // (worst pair, sum of pairs, positions in order): smaller is better.
        type Score = (u8, u32, Vec<usize>);
        let score = |set: &[usize]| -> Score {
            let mut worst = 0u8;
            let mut sum = 0u32;
            for (n, &a) in set.iter().enumerate() {
                for &b in set.iter().skip(n + 1) {
                    let r = pair(a, b);
                    worst = worst.max(r);
                    sum += u32::from(r);
                }
            }
            let mut pos = set.to_vec();
            pos.sort_unstable();
            (worst, sum, pos)
        };
        let mut best: Option<Score> = None;
        let mut consider = |set: Vec<usize>| {
            let s = score(&set);
            if best.as_ref().is_none_or(|b| s < *b) {
                best = Some(s);
            }
        };
        if count == 2 {
            for a in 0..order.len() {
                for b in a + 1..order.len() {
                    consider(vec![a, b]);
                }
            }
        } else {
            for seed in 0..order.len().min(SEEDS) {
                let mut set = vec![seed];
                while set.len() < count {
                    let next = (0..order.len())
                        .filter(|c| !set.contains(c))
                        .min_by_key(|&c| {
                            let worst = set.iter().map(|&m| pair(m, c)).max().unwrap_or(0);
                            let sum: u32 = set.iter().map(|&m| u32::from(pair(m, c))).sum();
                            (worst, sum, c)
                        });
                    let Some(next) = next else { break };
                    set.push(next);
                }
                if set.len() == count {
                    consider(set);
                }
            }
        }
        match best {
            Some((_, _, positions)) => positions
                .iter()
                .filter_map(|&p| order.get(p))
                .copied()
                .collect(),
            None => order.iter().take(count).copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::gpu::{GpuDevice, PeerLink};
    use super::super::replica::ReplicaId;
    use super::*;

    const GIB: u64 = 1 << 30;

    fn dev(i: u32, total_gib: u64) -> GpuDevice {
        GpuDevice::new(i, format!("GPU-{i}"), "fake", total_gib * GIB)
    }

    fn want(count: u32, bytes: Option<u64>, placement: Placement) -> Want<'static> {
        static NONE: BTreeSet<String> = BTreeSet::new();
        Want {
            count,
            bytes,
            placement,
            by_index: false,
            exclude: &NONE,
        }
    }

    fn place(
        t: &GpuTable,
        count: u32,
        gib: Option<u64>,
        p: Placement,
    ) -> Result<Placed, Unplaceable> {
        t.place(&want(count, gib.map(|g| g * GIB), p))
    }

    fn reserve(t: &mut GpuTable, id: &str, p: &Placed, whole: bool) {
        crate::core::reservations::book(t, &ReplicaId(id.into()), p, whole);
    }

    #[test]
    fn pack_fills_the_fullest_device_and_spread_the_emptiest() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        let p = place(&t, 1, Some(30), Placement::Pack).unwrap();
        reserve(&mut t, "a-1", &p, false);
        assert_eq!(p.devices, vec!["GPU-0"]);
        // pack: device 0 has 50 GiB free, device 1 has 80: the fuller one that fits.
        assert_eq!(
            place(&t, 1, Some(30), Placement::Pack).unwrap().devices,
            vec!["GPU-0"]
        );
        assert_eq!(
            place(&t, 1, Some(30), Placement::Spread).unwrap().devices,
            vec!["GPU-1"]
        );
        // 60 GiB only fits on device 1.
        assert_eq!(
            place(&t, 1, Some(60), Placement::Pack).unwrap().devices,
            vec!["GPU-1"]
        );
        crate::core::reservations::unbook(&mut t, &ReplicaId("a-1".into()), &p);
        assert_eq!(t.slots[0].reserved, 0);
    }

    #[test]
    fn whole_device_replicas_take_empty_devices_only_and_exclusively() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        let p = place(&t, 1, Some(1), Placement::Pack).unwrap();
        reserve(&mut t, "a-1", &p, false);
        let whole = place(&t, 1, None, Placement::Pack).unwrap();
        assert_eq!(whole.devices, vec!["GPU-1"]);
        reserve(&mut t, "b-1", &whole, true);
        assert_eq!(
            place(&t, 1, Some(1), Placement::Spread).unwrap().devices,
            vec!["GPU-0"]
        );
        assert!(place(&t, 2, Some(1), Placement::Spread).is_err());
    }

    #[test]
    fn multi_gpu_is_all_or_nothing_and_foreign_and_driver_memory_count() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80), dev(2, 80)]);
        t.slots[2].memory_foreign = 70 * GIB;
        let p = place(&t, 2, Some(40), Placement::Pack).unwrap();
        assert_eq!(p.devices.len(), 2);
        assert!(!p.devices.contains(&"GPU-2".to_string()));
        let err = place(&t, 3, Some(40), Placement::Pack).unwrap_err();
        assert_eq!(err.count, 3);
        assert_eq!(err.fit, 2);
        assert!(err.to_string().contains("needs 3 GPU(s)"), "{err}");
        // The driver's reserve is never available: 80 − 1 reserved leaves 79.
        t.slots[0].driver_reserved = GIB;
        assert!(
            place(&t, 1, Some(80), Placement::Pack).is_ok(),
            "device 1 still has 80"
        );
        t.slots[1].driver_reserved = GIB;
        assert!(place(&t, 1, Some(80), Placement::Pack).is_err());
        assert!(place(&t, 1, Some(79), Placement::Pack).is_ok());
    }

    #[test]
    fn multi_gpu_prefers_devices_of_one_numa_node() {
        let mut devices: Vec<GpuDevice> = (0..4).map(|i| dev(i, 80)).collect();
        for (i, d) in devices.iter_mut().enumerate() {
            d.topology = Some(format!("numa{}", i % 2));
        }
        let t = GpuTable::new(devices);
        let p = place(&t, 2, Some(1), Placement::Pack).unwrap();
        let groups: Vec<_> = p
            .devices
            .iter()
            .map(|u| t.slot(u).unwrap().device.topology.clone())
            .collect();
        assert_eq!(groups[0], groups[1], "{p:?}");
        // No group holds 3: placement still succeeds across groups.
        assert_eq!(
            place(&t, 3, Some(1), Placement::Pack)
                .unwrap()
                .devices
                .len(),
            3
        );
    }

    /// Four GPUs on one NUMA node, bridged in pairs (0,3) and (1,2), as an H100 NVL host with
    /// its bridges on non-adjacent cards; everything else through the host bridge.
    fn nvl_host() -> GpuTable {
        let mut devices: Vec<GpuDevice> = (0..4).map(|i| dev(i, 80)).collect();
        for d in devices.iter_mut() {
            d.topology = Some("numa0".into());
            for j in 0..4u32 {
                if j == d.index {
                    continue;
                }
                let bridged = matches!((d.index, j), (0, 3) | (3, 0) | (1, 2) | (2, 1));
                d.links.push(PeerLink {
                    peer: format!("GPU-{j}"),
                    link: if bridged {
                        Link::NvLink
                    } else {
                        Link::HostBridge
                    },
                });
            }
        }
        GpuTable::new(devices)
    }

    #[test]
    fn a_two_gpu_replica_takes_an_nvlink_bridged_pair() {
        let mut t = nvl_host();
        let p = place(&t, 2, Some(30), Placement::Pack).unwrap();
        assert_eq!(
            p.devices,
            vec!["GPU-0", "GPU-3"],
            "the bridged pair, not 0 and 1"
        );
        reserve(&mut t, "tp-1", &p, false);
        // The next pair: pack would take the fuller 0 and 3 again (50 GiB free each).
        let p2 = place(&t, 2, Some(30), Placement::Pack).unwrap();
        assert_eq!(p2.devices, vec!["GPU-0", "GPU-3"]);
        reserve(&mut t, "tp-2", &p2, false);
        // Now 0 and 3 are full: the other bridged pair, never an unbridged mix.
        let p3 = place(&t, 2, Some(30), Placement::Pack).unwrap();
        let mut d = p3.devices.clone();
        d.sort();
        assert_eq!(d, vec!["GPU-1", "GPU-2"]);
        // With only an unbridged pair left (2 and 3 cordoned), it still places, across the
        // host bridge.
        t.slots[2].cordoned = true;
        t.slots[3].cordoned = true;
        let p4 = place(&t, 2, Some(10), Placement::Pack).unwrap();
        assert_eq!(p4.devices, vec!["GPU-0", "GPU-1"]);
    }

    #[test]
    fn mig_instances_take_single_gpu_replicas_named_by_uuid_only() {
        let mut devices = vec![dev(0, 80)];
        for gi in 0..2 {
            let mut m = GpuDevice::new(1, format!("MIG-{gi}"), "slice", 40 * GIB);
            m.mig = Some(super::super::gpu::MigSlice {
                parent: "GPU-1".into(),
                gpu_instance: gi,
            });
            devices.push(m);
        }
        let mut t = GpuTable::new(devices);
        t.slots[0].cordoned = true;
        let by_uuid = place(&t, 1, Some(20), Placement::Pack).unwrap();
        assert!(by_uuid.devices[0].starts_with("MIG-"));
        let none = BTreeSet::new();
        let by_index = t.place(&Want {
            count: 1,
            bytes: Some(20 * GIB),
            placement: Placement::Pack,
            by_index: true,
            exclude: &none,
        });
        let err = by_index.unwrap_err().to_string();
        assert!(
            err.contains("2 MIG instance(s) left out") && err.contains("device_naming"),
            "{err}"
        );
        let err = place(&t, 2, Some(20), Placement::Pack).unwrap_err();
        assert_eq!(err.mig.map(|m| (m.count, m.multi)), Some((2, true)));
        assert!(err.to_string().contains("multi-GPU"), "{err}");
        // Operators name MIG instances by UUID; an index names the whole device only.
        assert_eq!(t.find("1"), None);
        assert_eq!(t.find("MIG-1"), Some(2));
    }

    #[test]
    fn cordoned_unhealthy_and_faulted_devices_take_nothing() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80), dev(2, 80)]);
        t.slots[0].cordoned = true;
        t.slots[1].healthy = false;
        t.slots[2].device.fault = Some(super::super::gpu::GpuFault::Lost);
        assert!(place(&t, 1, Some(1), Placement::Pack).is_err());
        assert_eq!(t.find("GPU-1"), Some(1));
        assert_eq!(t.find("0"), Some(0));
        assert_eq!(t.find("7"), None);
    }

    #[test]
    fn excluded_devices_are_skipped_and_reservations_follow_the_uuid_through_a_reorder() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        let p = place(&t, 1, Some(30), Placement::Pack).unwrap();
        reserve(&mut t, "a-1", &p, false);
        let busy: BTreeSet<String> = ["GPU-0".to_string()].into();
        let w = Want {
            exclude: &busy,
            ..want(1, Some(30 * GIB), Placement::Pack)
        };
        assert_eq!(t.place(&w).unwrap().devices, vec!["GPU-1"]);
        // The inventory lists them the other way round, with new indices.
        let mut d1 = dev(0, 80);
        d1.uuid = "GPU-1".into();
        let mut d0 = dev(1, 80);
        d0.uuid = "GPU-0".into();
        let change = t.update(vec![d1, d0]);
        assert_eq!(change, Default::default());
        assert_eq!(t.slot("GPU-0").unwrap().reserved, 30 * GIB);
        assert_eq!(t.slot("GPU-1").unwrap().reserved, 0);
        assert_eq!(t.indices(&["GPU-0".to_string()]), vec![1]);
    }

    #[test]
    fn a_vanished_device_with_replicas_stays_faulted_until_they_leave() {
        let mut t = GpuTable::new(vec![dev(0, 80), dev(1, 80)]);
        let p = place(&t, 1, Some(30), Placement::Pack).unwrap();
        reserve(&mut t, "a-1", &p, false);
        let change = t.update(vec![dev(1, 80)]);
        assert_eq!(change.vanished, vec!["GPU-0"]);
        assert!(t.leaving(&p.devices));
        assert_eq!(t.slots.len(), 2);
        // Another reading without it changes nothing more.
        assert_eq!(t.update(vec![dev(1, 80)]), Default::default());
        crate::core::reservations::unbook(&mut t, &ReplicaId("a-1".into()), &p);
        assert_eq!(t.slots.len(), 1, "gone once nothing holds it");
        // A device with nothing on it just goes.
        assert_eq!(t.update(vec![]).dropped, vec!["GPU-1"]);
    }
}
