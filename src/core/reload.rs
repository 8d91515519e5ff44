//! Applying a new configuration to a running node, and rolling models over to a new version.
//!
//! The autoscaler owns the count (routed + pool); a rollout owns only which version fills it:
//! replicas of the new configuration are launched and warmed, routed ones of the old drain only
//! once new ones are routed in their place (see `departing` in reconcile.rs), so routed capacity
//! never drops. The two never write the same field.

use super::event::{Action, LogLevel, RequestId};
use super::model::{spec_of, ModelState, Rollout, ROLLOUT_FAILURES};
use super::node::Node;
use super::Time;
use crate::config::Config;
use crate::protocol;

impl Node {
    /// Applies a validated configuration: untouched models keep their replicas, scaling changes
    /// apply at once, a changed command, env, warm-up or version rolls the model over, new models
    /// start, removed models drain away.
    pub(super) fn reload(
        &mut self,
        id: Option<RequestId>,
        config: Config,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        for mc in &config.models {
            let Some(m) = self.models.get_mut(&mc.name) else {
                let m = ModelState::new(mc.clone(), Default::default(), now);
                self.models.insert(mc.name.clone(), m);
                self.log(LogLevel::Info, &mc.name, None, "model added".into(), out);
                continue;
            };
            if m.config == *mc && !m.removed {
                continue;
            }
            let spec = spec_of(mc);
            let msg = if spec == m.spec {
                // Scaling, liveness, signal, priority, stop_grace: they apply live.
                "configuration changed; replicas kept".to_string()
            } else if m.rollout.is_some() && spec == m.launch_spec() {
                "configuration changed back to the version serving; rollout dropped".to_string()
            } else {
                let previous = m.launch_config().clone();
                let msg = format!(
                    "rolling out version {} (from {}): new replicas warm before old ones drain",
                    mc.version, previous.version
                );
                m.rollout = Some(Rollout {
                    previous_spec: m.launch_spec(),
                    previous,
                    failures: 0,
                    halted: None,
                });
                msg
            };
            if spec == m.launch_spec() {
                m.rollout = None;
            }
            m.config = mc.clone();
            m.spec = spec;
            m.removed = false;
            let name = mc.name.clone();
            self.log(LogLevel::Info, &name, None, msg, out);
        }
        let gone: Vec<String> = self
            .models
            .keys()
            .filter(|name| config.model(name).is_none())
            .cloned()
            .collect();
        for name in gone {
            let m = self.models.get_mut(&name).expect("present");
            if !m.removed {
                m.removed = true;
                self.log(
                    LogLevel::Info,
                    &name,
                    None,
                    "model removed from the configuration: draining".into(),
                    out,
                );
            }
            if !self.replicas.values().any(|r| r.model == name) {
                self.models.remove(&name);
            }
        }
        self.ports.set_range(config.daemon.ports);
        self.config = config;
        if let Some(id) = id {
            out.push(Action::Reply {
                id,
                answer: Ok(protocol::Response::Done {}),
            });
        }
    }

    /// Ends a rollout when no replica of another version is left.
    pub(super) fn rollout_progress(&mut self, model: &str, out: &mut Vec<Action>) {
        let Some(m) = self.models.get(model) else {
            return;
        };
        let Some(r) = &m.rollout else { return };
        if r.halted.is_some()
            || self
                .replicas
                .values()
                .any(|x| x.model == model && x.spec != m.spec)
        {
            return;
        }
        let version = m.config.version.clone();
        self.models.get_mut(model).expect("present").rollout = None;
        self.log(
            LogLevel::Info,
            model,
            None,
            format!("rollout of version {version} complete"),
            out,
        );
    }

    /// A replica of the version being rolled out failed before it was ever warm: after a few,
    /// the rollout halts and latches; the previous version keeps serving until the configuration
    /// changes again.
    pub(super) fn rollout_failure(
        &mut self,
        model: &str,
        spec: u64,
        ever_warm: bool,
        why: &str,
        out: &mut Vec<Action>,
    ) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let (new_spec, version) = (m.spec, m.config.version.clone());
        let Some(r) = m.rollout.as_mut() else { return };
        if spec != new_spec || ever_warm || r.halted.is_some() {
            return;
        }
        r.failures += 1;
        if r.failures >= ROLLOUT_FAILURES {
            let halted = format!(
                "rollout of version {version} halted after {} replicas failed to warm up (last: {why}); version {} keeps serving until the configuration changes",
                r.failures, r.previous.version
            );
            r.halted = Some(halted.clone());
            self.log(LogLevel::Error, model, None, halted, out);
        }
    }
}
