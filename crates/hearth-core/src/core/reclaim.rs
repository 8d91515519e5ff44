//! Arbitration when GPUs are full: a model that needs routed capacity may take the GPUs of
//! other models' replicas — warm ones of lower or equal priority first, then routed ones of
//! lower priority above their `min` (drained, never killed).

use super::event::{Action, LogLevel};
use super::model::ScaleRecord;
use super::node::Node;
use super::placement::Want;
use super::replica::{ReplicaId, ReplicaState};
use super::Time;
use crate::protocol::WatchEvent;

impl Node {
    /// Starts freeing GPUs for the pending replica `id`, if its model needs routed capacity and a
    /// victim whose devices would make it fit exists. Returns the replica being reclaimed (also
    /// when a reclaim for this model is already under way).
    pub(super) fn reclaim_for(
        &mut self,
        id: &ReplicaId,
        now: Time,
        out: &mut Vec<Action>,
    ) -> Option<ReplicaId> {
        let r = self.held.replicas().get(id)?;
        let model = r.model.clone();
        let m = self.models.get(&model)?;
        let prio = m.config.priority;
        let launch = m.config.launch.clone();
        // Only a scale-up reclaims: refilling a warm pool never takes from others.
        let c = self.counts(&model);
        if m.desired_routed <= c.routed + c.leaving + c.warm + c.starting {
            return None;
        }
        if let Some(v) = self
            .held
            .replicas()
            .values()
            .find(|v| v.reclaimed_for.as_deref() == Some(model.as_str()))
        {
            return Some(v.id.clone());
        }
        let victim = self
            .reclaim_candidates(&model, prio)
            .into_iter()
            .find(|v| {
                let Some(trial) = self.held.gpus_without(v) else {
                    return false;
                };
                let none = std::collections::BTreeSet::new();
                trial.place(&Want::of(&launch, &none)).is_ok()
            })?;
        let v = self.held.replicas_mut().get_mut(&victim)?;
        v.reclaimed_for = Some(model.clone());
        let (vmodel, vstate) = (v.model.clone(), v.state);
        let why = format!("GPU reclaimed by model {model} (priority {prio})");
        self.log(LogLevel::Info, &vmodel, Some(&victim), why.clone(), out);
        if vstate == ReplicaState::Routed {
            // The victim's model gives up one routed replica: its autoscaler owns the count, and
            // must not relaunch what was just taken.
            if let Some(vm) = self.models.get_mut(&vmodel) {
                let from = vm.desired_routed;
                let to = from.saturating_sub(1).max(vm.routed_min());
                vm.desired_routed = to;
                vm.last_scale = Some(ScaleRecord {
                    at: now,
                    from,
                    to,
                    reason: why.clone(),
                });
                out.push(Action::Publish(WatchEvent::Scale {
                    model: vmodel.clone(),
                    from,
                    to,
                    reason: why.clone(),
                }));
            }
            self.begin_drain(&victim, &why, now, out);
        } else {
            self.stop(&victim, &why, false, now, out);
        }
        Some(victim)
    }

    /// Replicas of other models that `model` (priority `prio`) may reclaim, in order: warm ones
    /// of lower priority, warm ones of equal priority, then routed ones of lower priority whose
    /// model is above its min.
    fn reclaim_candidates(&self, model: &str, prio: i32) -> Vec<ReplicaId> {
        let mut warm: Vec<(i32, u64, ReplicaId)> = Vec::new();
        let mut routed: Vec<(i32, u64, ReplicaId)> = Vec::new();
        for r in self.held.replicas().values() {
            if r.model == model || r.gpus.is_empty() || r.reclaimed_for.is_some() {
                continue;
            }
            let Some(m) = self.models.get(&r.model) else {
                continue;
            };
            // `pin = true`: never reclaimed for another model.
            if m.config.pin {
                continue;
            }
            let p = m.config.priority;
            match r.state {
                ReplicaState::Warm if p <= prio => warm.push((p, u64::MAX - r.n, r.id.clone())),
                ReplicaState::Routed
                    if p < prio && self.count(&r.model, ReplicaState::Routed) > m.routed_min() =>
                {
                    routed.push((p, u64::MAX - r.n, r.id.clone()))
                }
                _ => {}
            }
        }
        warm.sort();
        routed.sort();
        warm.into_iter()
            .chain(routed)
            .map(|(_, _, id)| id)
            .collect()
    }
}
