//! How the reservations' books can disagree with the replicas they account for: what
//! `Reservations::check` and `Replicas::check` answer, typed so that the property test (and any
//! test) can match on the breach instead of reading a sentence.

use std::collections::BTreeSet;

use crate::core::replica::ReplicaId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BooksBroken {
    #[error("model {model}: an empty index is kept")]
    EmptyModelIndex { model: String },
    #[error("{id}: model {model}'s index has slot {slot}, the id map another")]
    ModelIndexSlot {
        id: ReplicaId,
        model: String,
        slot: usize,
    },
    #[error("{in_models} replicas in the models' indexes, {by_id} by id")]
    IndexSizes { in_models: usize, by_id: usize },
    #[error("{id}: slot {slot} is empty")]
    EmptySlot { id: ReplicaId, slot: usize },
    #[error("{id}: slot {slot} holds {held}")]
    SlotHoldsAnother {
        id: ReplicaId,
        slot: usize,
        held: ReplicaId,
    },
    #[error("{id}: shown as {shown}")]
    ShownId { id: ReplicaId, shown: String },
    #[error("{id}: port {port:?} shown as {shown:?}")]
    ShownAddr {
        id: ReplicaId,
        port: Option<u16>,
        shown: Option<String>,
    },
    #[error("{id}: not in model {model}'s index")]
    MissingFromModel { id: ReplicaId, model: String },
    #[error("{id}: slot {slot} is also free")]
    SlotAlsoFree { id: ReplicaId, slot: usize },
    #[error("{used} slots used, {free} free, {slots} in all, {replicas} replicas")]
    SlotCounts {
        used: usize,
        free: usize,
        slots: usize,
        replicas: usize,
    },
    #[error("the walk in id order gave {walk:?}")]
    WalkOrder { walk: Vec<ReplicaId> },
    #[error("port {0} twice")]
    PortTwice(u16),
    #[error("ports of replicas {replicas:?}, the pool's books {pool:?}")]
    PortBooks {
        replicas: BTreeSet<u16>,
        pool: BTreeSet<u16>,
    },
}
