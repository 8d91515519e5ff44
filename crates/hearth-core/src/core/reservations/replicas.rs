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

#[cfg(test)]
use super::BooksBroken;
use crate::core::replica::{Replica, ReplicaId};

/// A replica's place in the table, for a pass that looks many up again without copying
/// their ids: it names that replica only (a slot reused by another replica has a new
/// generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::core) struct Handle {
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
pub(in crate::core) struct Replicas {
    slots: Vec<Slot>,
    /// Empty slots, reused before the table grows.
    free: Vec<usize>,
    /// Each replica's slot, by id: hashing an id costs less than the dozen string comparisons
    /// of a walk down a tree, and lookups are most of what an event does. The walks in id
    /// order merge the models' indexes (a few models; an ordered map of every id besides
    /// would make each replica's start and stop cost a third tree operation).
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
        self.slot_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot_of.is_empty()
    }

    /// Adds `r` under its id and its model, in place of any replica with that id.
    pub(super) fn insert(&mut self, mut r: Replica) {
        // The id views show is the id (one made for a replica whose id was set after it).
        if *r.shown_id != *r.id.0 {
            r.shown_id = r.id.0.as_str().into();
        }
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
        self.slot_of.insert(id, slot);
    }

    pub(super) fn remove(&mut self, id: &ReplicaId) -> Option<Replica> {
        let slot = self.slot_of.remove(id)?;
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

    /// Every replica's id and slot, in id order.
    fn in_id_order(&self) -> impl Iterator<Item = (&ReplicaId, usize)> + '_ {
        let mut models: Vec<_> = self
            .by_model
            .values()
            .map(|m| m.iter().peekable())
            .collect();
        std::iter::from_fn(move || {
            // The model whose next id is least.
            let mut least: Option<(usize, &ReplicaId)> = None;
            for (i, m) in models.iter_mut().enumerate() {
                let Some(&(id, _)) = m.peek() else {
                    continue;
                };
                match least {
                    Some((_, l)) if l <= id => {}
                    _ => least = Some((i, id)),
                }
            }
            let (i, _) = least?;
            models.get_mut(i)?.next().map(|(id, &slot)| (id, slot))
        })
    }

    pub fn keys(&self) -> impl Iterator<Item = &ReplicaId> + '_ {
        self.in_id_order().map(|(id, _)| id)
    }

    /// Every replica, in id order.
    pub fn values(&self) -> impl Iterator<Item = &Replica> + '_ {
        let slots = &self.slots;
        self.in_id_order()
            .filter_map(move |(_, s)| slots.get(s).and_then(|s| s.replica.as_ref()))
    }

    /// Every replica, in id order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Replica> + '_ {
        let order: Vec<usize> = self.in_id_order().map(|(_, s)| s).collect();
        in_order_mut(&mut self.slots, order.into_iter())
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
    pub fn check(&self) -> Result<(), BooksBroken> {
        let mut indexed = 0;
        for (model, ids) in &self.by_model {
            if ids.is_empty() {
                return Err(BooksBroken::EmptyModelIndex {
                    model: model.clone(),
                });
            }
            for (id, &slot) in ids {
                if self.slot_of.get(id) != Some(&slot) {
                    return Err(BooksBroken::ModelIndexSlot {
                        id: id.clone(),
                        model: model.clone(),
                        slot,
                    });
                }
                indexed += 1;
            }
        }
        if indexed != self.slot_of.len() {
            return Err(BooksBroken::IndexSizes {
                in_models: indexed,
                by_id: self.slot_of.len(),
            });
        }
        for (id, &slot) in &self.slot_of {
            let Some(Some(r)) = self.slots.get(slot).map(|s| s.replica.as_ref()) else {
                return Err(BooksBroken::EmptySlot {
                    id: id.clone(),
                    slot,
                });
            };
            if r.id != *id {
                return Err(BooksBroken::SlotHoldsAnother {
                    id: id.clone(),
                    slot,
                    held: r.id.clone(),
                });
            }
            if *r.shown_id != *id.0 {
                return Err(BooksBroken::ShownId {
                    id: id.clone(),
                    shown: r.shown_id.to_string(),
                });
            }
            if r.shown_addr.as_deref() != r.port.map(crate::core::replica::addr).as_deref() {
                return Err(BooksBroken::ShownAddr {
                    id: id.clone(),
                    port: r.port,
                    shown: r.shown_addr.as_deref().map(str::to_string),
                });
            }
            if !self
                .by_model
                .get(&r.model)
                .is_some_and(|m| m.contains_key(id))
            {
                return Err(BooksBroken::MissingFromModel {
                    id: id.clone(),
                    model: r.model.to_string(),
                });
            }
            if self.free.contains(&slot) {
                return Err(BooksBroken::SlotAlsoFree {
                    id: id.clone(),
                    slot,
                });
            }
        }
        let used = self.slots.iter().filter(|s| s.replica.is_some()).count();
        if used != self.slot_of.len() || used + self.free.len() != self.slots.len() {
            return Err(BooksBroken::SlotCounts {
                used,
                free: self.free.len(),
                slots: self.slots.len(),
                replicas: self.slot_of.len(),
            });
        }
        let ids: Vec<&ReplicaId> = self.keys().collect();
        if ids.len() != self.slot_of.len() || ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(BooksBroken::WalkOrder {
                walk: ids.into_iter().cloned().collect(),
            });
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::harness::{model, Harness, BASE};
    use crate::core::Time;

    /// Model names whose ids interleave (`a-1` < `a-b-1` < `a-2`…): a prefix of the id map
    /// would not find a model's replicas, and the walks in id order must merge the models.
    #[test]
    fn walks_go_in_id_order_and_a_models_walk_holds_its_replicas_only() {
        let h = Harness::new(&format!("{BASE}{}", model("a", "", "")));
        let spec = Arc::clone(h.node.models.get("a").unwrap().launch_spec());
        let names = ["a", "a-b", "a0", "b", "a+", "a-1"];
        let mut t = Replicas::default();
        let mut ids = Vec::new();
        for (i, m) in names.iter().enumerate() {
            for n in [1, 2, 10, 100, 11] {
                let r = Replica::new(m, n + i as u64, Arc::clone(&spec), Time::ZERO, 0);
                ids.push(r.id.clone());
                t.insert(r);
            }
        }
        // Slots freed and used again.
        for id in ids.iter().step_by(3) {
            assert!(t.remove(id).is_some());
        }
        let mut kept: Vec<ReplicaId> = ids.iter().skip(1).step_by(3).cloned().collect();
        for id in &kept {
            let r = t.get(id).unwrap().clone();
            t.insert(r);
        }
        kept.extend(ids.iter().skip(2).step_by(3).cloned());
        kept.sort();
        t.check().unwrap();
        assert_eq!(t.keys().cloned().collect::<Vec<_>>(), kept);
        assert_eq!(t.values().map(|r| r.id.clone()).collect::<Vec<_>>(), kept);
        assert_eq!(
            t.values_mut().map(|r| r.id.clone()).collect::<Vec<_>>(),
            kept
        );
        for m in names {
            let want: Vec<&ReplicaId> = kept
                .iter()
                .filter(|id| t.get(id).unwrap().model == m)
                .collect();
            assert_eq!(t.of_model(m).map(|r| &r.id).collect::<Vec<_>>(), want);
            assert_eq!(t.has_model(m), !want.is_empty());
            let want: Vec<ReplicaId> = want.into_iter().cloned().collect();
            assert_eq!(
                t.of_model_mut(m).map(|r| r.id.clone()).collect::<Vec<_>>(),
                want
            );
        }
        // A handle names its replica only: not the one that takes its slot next.
        let (h, r) = t.unordered().next().unwrap();
        let id = r.id.clone();
        let back = t.remove(&id).unwrap();
        assert!(t.at(h).is_none());
        let mut other = back.clone();
        other.id = ReplicaId("z-1".into());
        other.model = "z".into();
        t.insert(other);
        assert!(t.at(h).is_none());
        assert!(t.unordered().any(|(_, r)| r.id.0 == "z-1"));
        t.check().unwrap();
    }

    /// The check can fail: each way the indexes could drift apart is told by its breach.
    #[test]
    fn the_check_names_each_drift_of_the_indexes() {
        let h = Harness::new(&format!("{BASE}{}", model("a", "", "")));
        let spec = Arc::clone(h.node.models.get("a").unwrap().launch_spec());
        let table = || {
            let mut t = Replicas::default();
            for n in 1..=3 {
                t.insert(Replica::new("a", n, Arc::clone(&spec), Time::ZERO, 0));
            }
            t.check().unwrap();
            t
        };
        let a = |n: u64| ReplicaId::new("a", n);

        let mut t = table();
        let slot = t.slot_of[&a(1)];
        t.free.push(slot);
        assert_eq!(t.check(), Err(BooksBroken::SlotAlsoFree { id: a(1), slot }));

        let mut t = table();
        let other = t.slot_of[&a(2)];
        t.slot_of.insert(a(1), other);
        assert!(
            matches!(t.check(), Err(BooksBroken::ModelIndexSlot { ref id, .. }) if *id == a(1)),
            "{:?}",
            t.check()
        );

        let mut t = table();
        t.by_model.get_mut("a").unwrap().remove(&a(3));
        assert_eq!(
            t.check(),
            Err(BooksBroken::IndexSizes {
                in_models: 2,
                by_id: 3
            })
        );

        let mut t = table();
        let slot = t.slot_of[&a(2)];
        t.slots[slot].replica.as_mut().unwrap().shown_id = Arc::from("a-9");
        assert_eq!(
            t.check(),
            Err(BooksBroken::ShownId {
                id: a(2),
                shown: "a-9".into()
            })
        );
    }
}
