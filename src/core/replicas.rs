//! The replica table: every replica by id, and each model's replicas, kept together.
//!
//! Most of what one event does walks one model's replicas (counting them, ranking them, the
//! routed set). Found by scanning every replica and comparing model names, that walk was a
//! fifth of an event's time with a thousand replicas. A prefix scan of the id map would not do
//! either: ids are `model-n`, and model `a`'s range holds `a-b`'s replicas. So each model keeps
//! its own index, and both indexes change only here, in `insert` and `remove`: they cannot
//! drift apart (`check` says whether they did; the core's property test asks after every
//! event).
//!
//! Replicas live in slots; the indexes hold slot numbers. A walk (all, or a model's) goes in id
//! order, the order of the map this replaced: the order in which actions go out, and in which
//! the simulator's decisions are made, did not change.

use std::collections::{BTreeMap, HashMap};

use super::replica::{Replica, ReplicaId};

/// A replica's place in the table, for a pass that looks many up again without copying
/// their ids: it names that replica only (a slot reused by another replica has a new
/// generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Handle {
    slot: usize,
    generation: u64,
}

#[derive(Debug, Default)]
struct Slot {
    /// Counts the replicas removed from this slot.
    generation: u64,
    replica: Option<Replica>,
}

#[derive(Debug, Default)]
pub(super) struct Replicas {
    slots: Vec<Slot>,
    /// Empty slots, reused before the table grows.
    free: Vec<usize>,
    by_id: BTreeMap<ReplicaId, usize>,
    /// The same as `by_id`, for lookups: hashing an id costs less than the dozen string
    /// comparisons of a walk down the tree, and lookups are most of what an event does.
    slot_of: HashMap<ReplicaId, usize>,
    /// Per model, its replicas' slots by id. A model with no replicas has no entry.
    by_model: BTreeMap<String, BTreeMap<ReplicaId, usize>>,
}

impl Replicas {
    pub fn get(&self, id: &ReplicaId) -> Option<&Replica> {
        let slot = *self.slot_of.get(id)?;
        self.slots.get(slot)?.replica.as_ref()
    }

    pub fn get_mut(&mut self, id: &ReplicaId) -> Option<&mut Replica> {
        let slot = *self.slot_of.get(id)?;
        self.slots.get_mut(slot)?.replica.as_mut()
    }

    /// The replica `h` names, if it is still here.
    pub fn at(&self, h: Handle) -> Option<&Replica> {
        let s = self.slots.get(h.slot)?;
        if s.generation != h.generation {
            return None;
        }
        s.replica.as_ref()
    }

    /// The replica `h` names, if it is still here.
    pub fn at_mut(&mut self, h: Handle) -> Option<&mut Replica> {
        let s = self.slots.get_mut(h.slot)?;
        if s.generation != h.generation {
            return None;
        }
        s.replica.as_mut()
    }

    /// Every replica with its handle, in no particular order.
    pub fn unordered(&self) -> impl Iterator<Item = (Handle, &Replica)> + '_ {
        self.slots.iter().enumerate().filter_map(|(slot, s)| {
            let h = Handle {
                slot,
                generation: s.generation,
            };
            Some((h, s.replica.as_ref()?))
        })
    }

    pub fn contains_key(&self, id: &ReplicaId) -> bool {
        self.slot_of.contains_key(id)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Adds `r` under its id and its model, in place of any replica with that id.
    pub fn insert(&mut self, r: Replica) {
        let id = r.id.clone();
        self.remove(&id);
        let model = r.model.clone();
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(s) = self.slots.get_mut(slot) {
                    s.replica = Some(r);
                }
                slot
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    replica: Some(r),
                });
                self.slots.len() - 1
            }
        };
        self.by_model
            .entry(model)
            .or_default()
            .insert(id.clone(), slot);
        self.slot_of.insert(id.clone(), slot);
        self.by_id.insert(id, slot);
    }

    pub fn remove(&mut self, id: &ReplicaId) -> Option<Replica> {
        let slot = self.by_id.remove(id)?;
        self.slot_of.remove(id);
        let s = self.slots.get_mut(slot)?;
        let r = s.replica.take()?;
        s.generation += 1;
        self.free.push(slot);
        if let Some(of_model) = self.by_model.get_mut(&r.model) {
            of_model.remove(id);
            if of_model.is_empty() {
                self.by_model.remove(&r.model);
            }
        }
        Some(r)
    }

    pub fn keys(&self) -> impl Iterator<Item = &ReplicaId> + '_ {
        self.by_id.keys()
    }

    /// Every replica, in id order.
    pub fn values(&self) -> impl Iterator<Item = &Replica> + '_ {
        let slots = &self.slots;
        self.by_id
            .values()
            .filter_map(move |&s| slots.get(s).and_then(|s| s.replica.as_ref()))
    }

    /// Every replica, in id order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Replica> + '_ {
        in_order_mut(&mut self.slots, self.by_id.values().copied())
    }

    /// The model's replicas, in id order.
    pub fn of_model<'a>(&'a self, model: &str) -> impl Iterator<Item = &'a Replica> + 'a {
        let slots = &self.slots;
        self.by_model
            .get(model)
            .into_iter()
            .flat_map(|m| m.values())
            .filter_map(move |&s| slots.get(s).and_then(|s| s.replica.as_ref()))
    }

    /// The model's replicas, in id order.
    pub fn of_model_mut<'a>(&'a mut self, model: &str) -> impl Iterator<Item = &'a mut Replica> {
        let order = self
            .by_model
            .get(model)
            .into_iter()
            .flat_map(|m| m.values().copied());
        in_order_mut(&mut self.slots, order)
    }

    /// The model has replicas.
    pub fn has_model(&self, model: &str) -> bool {
        self.by_model.contains_key(model)
    }

    /// Whether the indexes agree with the replicas they hold: each id's slot holds the replica
    /// of that id, each model's index holds exactly the replicas of that model, and no slot is
    /// both used and free.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let mut indexed = 0;
        for (model, ids) in &self.by_model {
            if ids.is_empty() {
                return Err(format!("model {model}: an empty index is kept"));
            }
            for (id, slot) in ids {
                if self.by_id.get(id) != Some(slot) {
                    return Err(format!("{id}: model {model}'s index has slot {slot}"));
                }
                indexed += 1;
            }
        }
        if indexed != self.by_id.len() {
            return Err(format!(
                "{indexed} replicas in the models' indexes, {} by id",
                self.by_id.len()
            ));
        }
        if self.slot_of.len() != self.by_id.len()
            || self
                .by_id
                .iter()
                .any(|(id, s)| self.slot_of.get(id) != Some(s))
        {
            return Err("the lookup table and the ordered index differ".into());
        }
        for (id, &slot) in &self.by_id {
            let Some(Some(r)) = self.slots.get(slot).map(|s| s.replica.as_ref()) else {
                return Err(format!("{id}: slot {slot} is empty"));
            };
            if r.id != *id {
                return Err(format!("{id}: slot {slot} holds {}", r.id));
            }
            if !self
                .by_model
                .get(&r.model)
                .is_some_and(|m| m.contains_key(id))
            {
                return Err(format!("{id}: not in model {}'s index", r.model));
            }
            if self.free.contains(&slot) {
                return Err(format!("{id}: slot {slot} is also free"));
            }
        }
        let used = self.slots.iter().filter(|s| s.replica.is_some()).count();
        if used != self.by_id.len() || used + self.free.len() != self.slots.len() {
            return Err(format!(
                "{used} slots used, {} free, {} in all, {} replicas",
                self.free.len(),
                self.slots.len(),
                self.by_id.len()
            ));
        }
        Ok(())
    }
}

/// The replicas in `slots`, mutably, in `order` (slot numbers, each at most once).
fn in_order_mut<'a>(
    slots: &'a mut [Slot],
    order: impl Iterator<Item = usize> + 'a,
) -> impl Iterator<Item = &'a mut Replica> + 'a {
    let mut refs: Vec<Option<&'a mut Replica>> =
        slots.iter_mut().map(|s| s.replica.as_mut()).collect();
    order.filter_map(move |s| refs.get_mut(s).and_then(Option::take))
}

/// Tests name a replica they know is there.
#[cfg(test)]
impl std::ops::Index<&ReplicaId> for Replicas {
    type Output = Replica;
    fn index(&self, id: &ReplicaId) -> &Replica {
        self.get(id).unwrap_or_else(|| panic!("no replica {id}"))
    }
}
