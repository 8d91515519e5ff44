//! Whether models' minimum replicas can be placed on declared devices at all, by the rules the
//! core places by (`core::gpu`): a replica takes `gpus` distinct devices, with `gpu_memory`
//! reserved on each, or, without `gpu_memory`, whole devices nothing else holds.
//!
//! The answer is "no" only when no placement exists: a proof by counting, or an exhaustive search
//! that finished. A search too large for its budget answers "unknown", and the file passes: a
//! false error would refuse a file that works.

use std::collections::HashSet;

use crate::units::short_bytes;

/// What one model's minimum asks of the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::config) struct Demand {
    pub replicas: u32,
    /// Devices per replica, at least 1.
    pub gpus: u32,
    /// Bytes on each device; None: whole devices.
    pub bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::config) enum Fit {
    Fits,
    No,
    Unknown,
}

/// Beyond these sizes the search is not tried (counting may still prove "no").
const MAX_DEVICES: usize = 64;
const MAX_REPLICAS: u64 = 512;
/// Search steps (a state visited or a choice of devices tried) before giving up.
const BUDGET: u32 = 50_000;
/// Sizes listed in a message before "…".
const LISTED: usize = 6;

/// The declared devices as (memory, how many), smallest first.
#[derive(Debug, Clone)]
pub(in crate::config) struct Devices {
    memory: Vec<u64>,
    sizes: Vec<(u64, u64)>,
}

impl Devices {
    pub(in crate::config) fn new(memory: &[u64]) -> Devices {
        let mut sizes = std::collections::BTreeMap::new();
        for &m in memory {
            *sizes.entry(m).or_insert(0u64) += 1;
        }
        Devices {
            memory: memory.to_vec(),
            sizes: sizes.into_iter().collect(),
        }
    }

    pub(in crate::config) fn len(&self) -> usize {
        self.memory.len()
    }

    /// How many devices have at least `bytes`.
    pub(in crate::config) fn at_least(&self, bytes: u64) -> u64 {
        self.sizes
            .iter()
            .filter(|(m, _)| *m >= bytes)
            .map(|(_, n)| n)
            .sum()
    }

    /// Whether `k` replicas of `d` fit with nothing else on the devices. Exact: with `c` slots on
    /// a device (how many replicas' shares it holds), `k` replicas that each need `g` distinct
    /// devices fit iff Σ min(c, k) ≥ k·g.
    fn alone(&self, d: &Demand, k: u64) -> bool {
        let held: u64 = self
            .sizes
            .iter()
            .map(|&(m, n)| {
                let slots = match d.bytes {
                    Some(b) => m / b.max(1),
                    None => 1,
                };
                slots.min(k).saturating_mul(n)
            })
            .fold(0u64, u64::saturating_add);
        held >= k.saturating_mul(u64::from(d.gpus.max(1)))
    }

    /// Whether `d.replicas` of `d` fit with nothing else on the devices.
    pub(in crate::config) fn fits_alone(&self, d: &Demand) -> bool {
        self.alone(d, u64::from(d.replicas))
    }

    /// The most replicas of `d` (at most `d.replicas`) that fit with nothing else on the devices.
    /// Σ min(c, k) − k·g is concave in k and 0 at k = 0, so the ks that fit are 0..=K.
    pub(in crate::config) fn most_alone(&self, d: &Demand) -> u32 {
        let (mut lo, mut hi) = (0u64, u64::from(d.replicas));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.alone(d, mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo as u32
    }

    /// Whether every demand's replicas can be placed at once.
    pub(in crate::config) fn together(&self, demands: &[Demand]) -> Fit {
        let whole: u64 = demands
            .iter()
            .filter(|d| d.bytes.is_none())
            .map(|d| u64::from(d.replicas) * u64::from(d.gpus))
            .sum();
        if whole > self.len() as u64 {
            return Fit::No;
        }
        // Whole-device replicas leave the most memory to the others on the smallest devices.
        let (mut skip, mut left) = (whole, 0u128);
        for &(m, n) in &self.sizes {
            let taken = skip.min(n);
            skip -= taken;
            left += u128::from(m) * u128::from(n - taken);
        }
        let asked: u128 = demands
            .iter()
            .filter_map(|d| {
                d.bytes
                    .map(|b| u128::from(d.replicas) * u128::from(d.gpus) * u128::from(b))
            })
            .sum();
        if asked > left {
            return Fit::No;
        }
        let replicas: u64 = demands.iter().map(|d| u64::from(d.replicas)).sum();
        if self.len() > MAX_DEVICES || replicas > MAX_REPLICAS {
            return Fit::Unknown;
        }
        // Hardest first: whole devices, then the largest shares; first fit then usually succeeds.
        let mut items: Vec<Demand> = demands
            .iter()
            .flat_map(|d| std::iter::repeat_n(*d, d.replicas as usize))
            .collect();
        items.sort_by_key(|d| {
            (
                d.bytes.is_some(),
                std::cmp::Reverse(d.bytes.unwrap_or(0)),
                std::cmp::Reverse(d.gpus),
            )
        });
        let start: Vec<Device> = self
            .memory
            .iter()
            .map(|&m| Device { total: m, free: m })
            .collect();
        let mut search = Search {
            items: &items,
            failed: HashSet::new(),
            budget: BUDGET,
        };
        match search.place(0, normal(start)) {
            Some(true) => Fit::Fits,
            Some(false) => Fit::No,
            None => Fit::Unknown,
        }
    }

    /// "2 × 80.0GiB, 1 × 40.0GiB"
    pub(in crate::config) fn describe(&self) -> String {
        let mut listed: Vec<String> = self
            .sizes
            .iter()
            .rev()
            .take(LISTED)
            .map(|(m, n)| format!("{n} × {}", short_bytes(*m)))
            .collect();
        if self.sizes.len() > LISTED {
            listed.push("…".to_string());
        }
        listed.join(", ")
    }
}

/// A device in the search: untouched while `free == total` (reservations are never zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Device {
    total: u64,
    free: u64,
}

/// Devices in a canonical order, without those that can take nothing more: equal states compare
/// equal, whichever device got which replica.
fn normal(mut devices: Vec<Device>) -> Vec<Device> {
    devices.retain(|d| d.free > 0);
    devices.sort_unstable();
    devices
}

struct Search<'a> {
    items: &'a [Demand],
    /// (item, devices) known to leave the rest unplaceable.
    failed: HashSet<(usize, Vec<Device>)>,
    budget: u32,
}

impl Search<'_> {
    /// Whether items `pos..` fit on `devices`; None when the budget ran out.
    fn place(&mut self, pos: usize, devices: Vec<Device>) -> Option<bool> {
        let Some(item) = self.items.get(pos).copied() else {
            return Some(true);
        };
        if self.failed.contains(&(pos, devices.clone())) {
            return Some(false);
        }
        self.budget = self.budget.checked_sub(1)?;
        let takes = |d: &Device| match item.bytes {
            Some(b) => d.free >= b,
            None => d.free == d.total,
        };
        // Devices that can take the item, in classes of equal devices, tightest first.
        let mut classes: Vec<(Device, Vec<usize>)> = Vec::new();
        let mut order: Vec<usize> = (0..devices.len())
            .filter(|&i| devices.get(i).is_some_and(takes))
            .collect();
        order.sort_by_key(|&i| devices.get(i).map(|d| (d.free, d.total)));
        for i in order {
            let Some(&d) = devices.get(i) else { continue };
            match classes.last_mut() {
                Some((c, members)) if *c == d => members.push(i),
                _ => classes.push((d, vec![i])),
            }
        }
        let mut counts = vec![0usize; classes.len()];
        let found = self.choose(
            pos,
            item,
            &devices,
            &classes,
            0,
            item.gpus as usize,
            &mut counts,
        )?;
        if !found {
            self.failed.insert((pos, devices));
        }
        Some(found)
    }

    /// Tries every way of taking `need` more devices from classes `j..`, then the next item.
    #[allow(clippy::too_many_arguments)]
    fn choose(
        &mut self,
        pos: usize,
        item: Demand,
        devices: &[Device],
        classes: &[(Device, Vec<usize>)],
        j: usize,
        need: usize,
        counts: &mut Vec<usize>,
    ) -> Option<bool> {
        if need == 0 {
            self.budget = self.budget.checked_sub(1)?;
            let mut next = devices.to_vec();
            for ((_, members), &n) in classes.iter().zip(counts.iter()) {
                for &i in members.iter().take(n) {
                    if let Some(d) = next.get_mut(i) {
                        d.free = match item.bytes {
                            Some(b) => d.free - b,
                            None => 0,
                        };
                    }
                }
            }
            return self.place(pos + 1, normal(next));
        }
        let Some((_, members)) = classes.get(j) else {
            return Some(false);
        };
        let rest: usize = classes.iter().skip(j + 1).map(|(_, m)| m.len()).sum();
        // Take as many from this class as possible first (packing), down to what must be left
        // for the classes after it.
        let most = need.min(members.len());
        let least = need.saturating_sub(rest);
        for n in (least..=most).rev() {
            if let Some(c) = counts.get_mut(j) {
                *c = n;
            }
            if self.choose(pos, item, devices, classes, j + 1, need - n, counts)? {
                return Some(true);
            }
        }
        if let Some(c) = counts.get_mut(j) {
            *c = 0;
        }
        Some(false)
    }
}

/// One replica's ask: "1 GPU with 40.0GiB", "2 whole GPUs".
pub(in crate::config) fn describe(d: &Demand) -> String {
    let s = if d.gpus == 1 { "" } else { "s" };
    match d.bytes {
        Some(b) => format!("{} GPU{s} with {}", d.gpus, short_bytes(b)),
        None => format!("{} whole GPU{s}", d.gpus),
    }
}

/// A minimum's ask: "2 × (1 GPU with 40.0GiB)".
pub(in crate::config) fn describe_min(d: &Demand) -> String {
    format!("{} × ({})", d.replicas, describe(d))
}
