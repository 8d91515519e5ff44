//! `Step::Restart`: the node ends (a hand-over, or a kill -9) and a new one adopts what it left.

use super::*;

impl World {
    /// A new node, with the old one's ledger and overrides (what the shell saves), adopts every
    /// replica with a process (the shell's containment proves them all: this world's pids are
    /// never reused). With the same configuration, every routed replica with a process is
    /// routed still, after the adoption event itself; with any, none that was routed is sent a
    /// signal in it (one that cannot be taken back leaves by a drain).
    pub(super) fn restart(&mut self, handed_over: bool, config: u8) {
        let how = if handed_over {
            Adoption::HandedOver
        } else {
            Adoption::Found
        };
        let same = !config.is_multiple_of(4);
        let c = if same {
            self.node.config().clone()
        } else {
            self.configs[usize::from(config) % self.configs.len()].clone()
        };
        let ledger = self.node.ledger();
        let overrides = self.node.overrides();
        let routed_before: BTreeSet<ReplicaId> = self
            .node
            .held
            .replicas()
            .values()
            .filter(|r| r.state == ReplicaState::Routed && r.pid.is_some())
            .map(|r| r.id.clone())
            .collect();
        let devices = GpuDevice::declared(&c.gpus);
        self.node = Node::new(c, devices, overrides, self.now);
        // What the old run had asked for and not heard back is gone with it (those replicas had
        // no process, so no record).
        self.unanswered.clear();
        // A watcher of the new daemon starts from its snapshot: nothing routed before the
        // adoption.
        self.routed_seen = self
            .node
            .models
            .keys()
            .map(|m| (m.clone(), Vec::new()))
            .collect();
        let out = self.send(Event::Adopt { how, ledger });
        for a in &out {
            if let Action::Signal { replica, .. } = a {
                assert!(
                    !routed_before.contains(replica),
                    "{how:?}: {replica}, routed, stopped without a drain by the adoption"
                );
            }
        }
        if same {
            for id in &routed_before {
                let state = self.node.held.replicas().get(id).map(|r| r.state);
                assert_eq!(
                    state,
                    Some(ReplicaState::Routed),
                    "{how:?}: {id} was routed and lost its place"
                );
            }
        }
        self.send(Event::Tick);
    }
}
