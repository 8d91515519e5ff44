//! The reservations: every replica, the port each holds and what it holds on its GPUs, kept by
//! one owner.
//!
//! A replica's port and GPU memory are booked here and nowhere else: `add` takes a replica that
//! holds nothing, `place` gives it a port and its devices, `resize` changes what it holds on
//! them (the sleeping tier shrinks a reservation as a replica falls asleep and grows it as it
//! wakes), `unplace` hands both back while the replica waits to be placed again, and `release`
//! forgets the replica with all it held. The replica table's `insert` and `remove` are
//! reachable from this module only, and the GPU table has no mutator of reservations, so
//! "reservations = live replicas" holds by construction (the property test still checks it
//! after every event).
//!
//! Everything else about replicas (their state, probes, reasons) and devices (health, cordons,
//! readings) is changed through `replicas_mut` and `gpus_mut`.

#[cfg(test)]
mod books;
mod replicas;

pub(super) use replicas::{Handle, Replicas};

use super::gpu::{GpuDevice, GpuTable};
use super::placement::Placed;
use super::ports::PortPool;
use super::replica::{Replica, ReplicaId};
use super::Time;
use crate::config::PortRange;
#[cfg(test)]
pub(in crate::core) use books::BooksBroken;

/// How an adopted replica's port is booked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PortClaim {
    /// Taken back: in the range and free (the caller asked `ports().claimable`).
    Range(u16),
    /// Held by a leaving process of an earlier run, in the range or not: booked unless another
    /// replica holds it already.
    Held(u16),
}

#[derive(Debug)]
pub(super) struct Reservations {
    replicas: Replicas,
    ports: PortPool,
    gpus: GpuTable,
}

impl Reservations {
    pub fn new(ports: PortRange, devices: Vec<GpuDevice>) -> Self {
        Reservations {
            replicas: Replicas::default(),
            ports: PortPool::new(ports),
            gpus: GpuTable::new(devices),
        }
    }

    pub fn replicas(&self) -> &Replicas {
        &self.replicas
    }

    /// The replicas, to change anything but what they hold (their port and GPUs).
    pub fn replicas_mut(&mut self) -> &mut Replicas {
        &mut self.replicas
    }

    pub fn ports(&self) -> &PortPool {
        &self.ports
    }

    pub fn gpus(&self) -> &GpuTable {
        &self.gpus
    }

    /// The devices, to change their health, cordons and readings.
    pub fn gpus_mut(&mut self) -> &mut GpuTable {
        &mut self.gpus
    }

    pub fn set_port_range(&mut self, range: PortRange) {
        self.ports.set_range(range);
    }

    /// Busy ports whose hold has passed may be tried again.
    pub fn expire_busy_ports(&mut self, now: Time) {
        self.ports.expire_busy(now);
    }

    /// Adds a replica that holds nothing yet (a port or devices it names are not kept).
    pub fn add(&mut self, mut r: Replica) {
        r.set_port(None);
        r.gpus = Vec::new();
        r.gpu_bytes = 0;
        self.release(&r.id.clone());
        self.replicas.insert(r);
    }

    /// Gives the replica `h` names a port and books `placed` for it (`whole`: the devices are
    /// taken whole). None, and nothing booked: no port is free, or no such replica.
    pub fn place(&mut self, h: Handle, placed: &Placed, whole: bool) -> Option<u16> {
        let r = self.replicas.at_mut(h)?;
        let port = self.ports.take()?;
        r.set_port(Some(port));
        r.gpus = placed.devices.clone();
        r.gpu_bytes = placed.bytes;
        let id = r.id.clone();
        reserve(&mut self.gpus, &id, &placed.devices, placed.bytes, whole);
        Some(port)
    }

    /// Adds a replica of an earlier run with the port and devices it holds (`placed`: devices
    /// the inventory knows, bytes bounded by them).
    pub fn adopt(&mut self, mut r: Replica, port: PortClaim, placed: Placed, whole: bool) {
        self.release(&r.id.clone());
        let booked = match port {
            PortClaim::Range(p) => self.ports.claim(p).then_some(p),
            PortClaim::Held(p) => self.ports.claim_held(p).then_some(p),
        };
        r.set_port(booked);
        reserve(&mut self.gpus, &r.id, &placed.devices, placed.bytes, whole);
        r.gpus = placed.devices;
        r.gpu_bytes = placed.bytes;
        self.replicas.insert(r);
    }

    /// Changes what the replica holds on each of its devices to `bytes`.
    pub fn resize(&mut self, id: &ReplicaId, bytes: u64) {
        let Some(r) = self.replicas.get_mut(id) else {
            return;
        };
        let was = std::mem::replace(&mut r.gpu_bytes, bytes);
        rebook(&mut self.gpus, &r.gpus, was, bytes);
    }

    /// The replica keeps its place in the table but hands back its port and devices, to be
    /// placed again; `busy_until`: its port is held by another process, passed over until then.
    pub fn unplace(&mut self, id: &ReplicaId, busy_until: Option<Time>) {
        let Some(r) = self.replicas.get_mut(id) else {
            return;
        };
        let gpus = std::mem::take(&mut r.gpus);
        let bytes = std::mem::take(&mut r.gpu_bytes);
        let port = r.port;
        r.set_port(None);
        match (port, busy_until) {
            (Some(p), Some(until)) => self.ports.hold_busy(p, until),
            (Some(p), None) => self.ports.give_back(p),
            (None, _) => {}
        }
        free(&mut self.gpus, id, &gpus, bytes);
    }

    /// The devices as they would be if each replica named held `bytes` on each of its devices
    /// (0: none, as if released): to ask what putting replicas to sleep or stopping them would
    /// free, before doing it.
    pub fn gpus_after(&self, changes: &[(ReplicaId, u64)]) -> GpuTable {
        let mut trial = self.gpus.clone();
        for (id, bytes) in changes {
            let Some(r) = self.replicas.get(id) else {
                continue;
            };
            if *bytes == 0 {
                free(&mut trial, id, &r.gpus, r.gpu_bytes);
            } else {
                rebook(&mut trial, &r.gpus, r.gpu_bytes, *bytes);
            }
        }
        trial
    }

    /// The port pool, for tests that take ports behind the node's back.
    #[cfg(test)]
    pub fn ports_mut(&mut self) -> &mut PortPool {
        &mut self.ports
    }

    /// Forgets the replica, handing back all it held.
    pub fn release(&mut self, id: &ReplicaId) -> Option<Replica> {
        let r = self.replicas.remove(id)?;
        if let Some(p) = r.port {
            self.ports.give_back(p);
        }
        free(&mut self.gpus, id, &r.gpus, r.gpu_bytes);
        Some(r)
    }

    /// Ports and GPU reservations are exactly those of the live replicas, and the replica
    /// table's indexes agree with it.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), BooksBroken> {
        self.replicas.check()?;
        let mut ports = std::collections::BTreeSet::new();
        for r in self.replicas.values() {
            if let Some(p) = r.port {
                if !ports.insert(p) {
                    return Err(BooksBroken::PortTwice(p));
                }
            }
        }
        if &ports != self.ports.in_use() {
            return Err(BooksBroken::PortBooks {
                replicas: ports,
                pool: self.ports.in_use().clone(),
            });
        }
        Ok(())
    }
}

/// Books `bytes` for a replica on devices of a table that is not a node's (placement's tests).
#[cfg(test)]
pub(super) fn book(t: &mut GpuTable, replica: &ReplicaId, placed: &Placed, whole: bool) {
    reserve(t, replica, &placed.devices, placed.bytes, whole);
}

/// Hands back what `book` booked.
#[cfg(test)]
pub(super) fn unbook(t: &mut GpuTable, replica: &ReplicaId, placed: &Placed) {
    free(t, replica, &placed.devices, placed.bytes);
}

fn reserve(t: &mut GpuTable, replica: &ReplicaId, devices: &[String], bytes: u64, whole: bool) {
    for u in devices {
        let Some(s) = t.slot_by_uuid_mut(u) else {
            continue;
        };
        s.reserved = s.reserved.saturating_add(bytes);
        s.exclusive |= whole;
        s.replicas.push(replica.clone());
    }
}

/// A reservation of `was` bytes on each of `devices` becomes one of `bytes`.
fn rebook(t: &mut GpuTable, devices: &[String], was: u64, bytes: u64) {
    for u in devices {
        if let Some(s) = t.slot_by_uuid_mut(u) {
            s.reserved = s.reserved.saturating_sub(was).saturating_add(bytes);
        }
    }
}

fn free(t: &mut GpuTable, replica: &ReplicaId, devices: &[String], bytes: u64) {
    for u in devices {
        if let Some(s) = t.slot_by_uuid_mut(u) {
            s.reserved = s.reserved.saturating_sub(bytes);
            s.replicas.retain(|r| r != replica);
            if s.replicas.is_empty() {
                s.exclusive = false;
                s.reserved = 0;
            }
        }
    }
    // A device that vanished goes once nothing holds it any more.
    t.slots.retain(|s| !(s.gone && s.replicas.is_empty()));
}
