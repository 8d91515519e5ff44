//! The status view: what `hearth status` and the metrics show.

use std::sync::Arc;

use super::model::ModelState;
use super::node::Node;
use super::reconcile::Counts;
use super::replica::{Replica, ReplicaState};
use super::Time;
use crate::config::WarmPool;
use crate::protocol::{
    ForecastView, Health, ModelView, ReplicaView, RolloutView, ScaleView, SignalView, StatusView,
    WarmPoolSetting,
};

impl Node {
    /// Why nothing serves `m` and nothing will until something changes, if so: no replica
    /// routed or warm (none to route, none to promote), replicas wanted, and the last try to
    /// get one ready did not succeed. A first cold start is not this (nothing has failed yet),
    /// nor a model at zero with nothing asked of it, nor a daemon shutting down.
    fn unavailable(&self, m: &ModelState, c: &Counts) -> Option<String> {
        if self.shutdown.is_some() || c.routed + c.leaving + c.warm + c.sleeping + c.waking > 0 {
            return None;
        }
        if m.desired_routed == 0 && c.pending + c.starting == 0 {
            return None;
        }
        let stalled = m.stalled.as_deref()?;
        // What the replicas wait for now (a back-off, a port), where it says more.
        let waiting = self
            .held
            .replicas()
            .of_model(m.name())
            .filter(|r| r.state == ReplicaState::Pending && !r.reason.is_empty())
            .map(|r| &*r.reason)
            .find(|why| *why != stalled);
        Some(match waiting {
            Some(w) => format!("nothing routed or warm, and none can be: {stalled}; {w}"),
            None => format!("nothing routed or warm, and none can be: {stalled}"),
        })
    }

    pub fn status(&self, model: Option<&str>, now: Time) -> StatusView {
        let models = self
            .models
            .values()
            .filter(|m| model.is_none_or(|name| name == m.name()))
            .map(|m| self.model_view(m, now))
            .collect();
        StatusView {
            models,
            gpus: self.gpu_views(),
            daemon: Box::new(self.daemon_view()),
        }
    }

    fn model_view(&self, m: &ModelState, now: Time) -> ModelView {
        let name = m.name();
        let c = self.counts(name);

        let (health, health_reason) = if m.crash_looping() {
            (
                Health::CrashLoop,
                format!(
                    "{} failures in 10 min; last: {}",
                    m.failures.len(),
                    m.last_failure
                ),
            )
        } else if let Some(why) = &m.no_capacity {
            (Health::NoCapacity, why.clone())
        } else if let Some(why) = self.unavailable(m, &c) {
            (Health::Unavailable, why)
        } else {
            (Health::Ok, String::new())
        };
        let signal = match self.model_signal(name, now) {
            Some(s) => SignalView {
                oldest_wait_ms: Some(s.oldest_wait_ms),
                queue_depth: Some(s.queue_depth),
                in_flight: Some(s.in_flight),
                age_ms: Some(now.since(s.at).as_millis() as u64),
                router: self.front_doors(name, now).into_iter().next(),
                routers: self.front_doors(name, now),
            },
            None => SignalView::default(),
        };
        // The model's replicas, once: in `n` order (its index holds them in id order, where
        // "m-10" comes before "m-2"); `n` is unique within a model, so an unstable sort. Sorted
        // with their `n` beside them: a comparison that read it from the replica would miss the
        // cache twice (a fifth of a status of a thousand replicas).
        let mut by_n: Vec<(u64, &Replica)> = self
            .held
            .replicas()
            .of_model(name)
            .map(|r| (r.n, r))
            .collect();
        by_n.sort_unstable_by_key(|&(n, _)| n);
        let replicas: Vec<&Replica> = by_n.into_iter().map(|(_, r)| r).collect();
        let draining = replicas
            .iter()
            .filter(|r| matches!(r.state, ReplicaState::Draining | ReplicaState::Stopping))
            .count() as u32;
        ModelView {
            name: name.to_string(),
            version: m.config.launch.version.clone(),
            health,
            health_reason,
            // Every routed replica, those on their way out (old version, device being left)
            // included: they still serve, and the routed set watchers see holds them.
            routed: c.routed + c.leaving,
            warm: c.warm,
            starting: c.starting,
            pending: c.pending,
            draining,
            sleeping: replicas
                .iter()
                .filter(|r| {
                    matches!(
                        r.state,
                        ReplicaState::Sleeping | ReplicaState::FallingAsleep
                    )
                })
                .count() as u32,
            waking: c.waking,
            desired_routed: m.desired_routed,
            desired_warm: self.desired_warm(name),
            min: m.min(),
            max: m.max(),
            warm_pool: match m.warm_pool_setting() {
                WarmPool::Fixed(n) => WarmPoolSetting::Count(n),
                WarmPool::Auto => WarmPoolSetting::AUTO,
            },
            target_wait_ms: m.config.scaling.target_wait.as_millis() as u64,
            slots: m.config.slots,
            signal,
            last_scale: m.last_scale.as_ref().map(|s| ScaleView {
                at_ms: s.at.as_millis(),
                from: s.from,
                to: s.to,
                reason: s.reason.clone(),
            }),
            rollout: m.rollout.as_ref().map(|r| RolloutView {
                version: m.config.launch.version.clone(),
                from: r.previous.launch.version.clone(),
                updated: replicas
                    .iter()
                    .filter(|x| x.spec == m.spec && x.state == ReplicaState::Routed)
                    .count() as u32,
                halted: r.halted.clone(),
            }),
            time_to_ready_ms: m.time_to_ready.map(|d| d.as_millis() as u64),
            wake: m.config.sleep.as_ref().map(|_| m.wakes.view()),
            restarts_total: m.total_restarts,
            drained: m.overrides.drained,
            gave_way_total: m.gave_way,
            last_gave_way: m.last_gave_way.clone(),
            forecast: m.autoscaler.foreseen().map(|f| ForecastView {
                period_ms: (f.period.mean_s * 1000.0) as u64,
                seen: f.period.seen as u32,
                due_in_ms: f.period.earliest.saturating_sub(f.now) * 1000,
                level_per_s: f.period.level,
                replicas: f.need,
                holding: f.holding(),
            }),
            replicas: replicas
                .iter()
                .map(|r| ReplicaView {
                    id: Arc::clone(&r.shown_id),
                    state: r.state,
                    pid: r.pid,
                    port: r.port,
                    addr: r.shown_addr.clone(),
                    gpus: r.gpus.clone(),
                    since_ms: r.since.as_millis(),
                    restarts: r.restarts,
                    version: Arc::clone(&r.version),
                    reason: if r.reason.is_empty() && r.probe_failures > 0 {
                        Arc::from(format!("probe failing: {}", r.last_probe_error))
                    } else {
                        Arc::clone(&r.reason)
                    },
                    rss_bytes: r.usage.rss_bytes,
                    cpu_seconds: r.usage.cpu_seconds,
                })
                .collect(),
        }
    }
}
