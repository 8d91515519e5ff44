//! Reloads: the core decides (forbidden, busy while shutting down, or go), asks the shell to
//! read the file (`Action::ReadConfig`; the shell reads and validates it off the event loop and
//! sends `Event::ConfigRead`), applies it or answers the error, and tells the shell the reload
//! is done (`Action::ReloadDone`). Then: applying a new configuration to a running node, and
//! rolling models over to a new version.
//!
//! The autoscaler owns the count (routed + pool); a rollout owns only which version fills it:
//! replicas of the new configuration are launched and warmed, routed ones of the old drain only
//! once new ones are routed in their place (see `departing` in reconcile.rs), so routed capacity
//! never drops. The two never write the same field.

use std::sync::Arc;

use super::event::{Action, ConfigReadError, LogLevel, NewConfig, ReloadCause, RequestId};
use super::model::{ModelState, Rollout, ROLLOUT_FAILURES};
use super::node::Node;
use super::Time;
use crate::config::{Config, LaunchSpec};
use crate::protocol::{ErrorCode, Failure, Response};

/// Reloads asked for and not yet answered. One read of the file is out at a time; what is asked
/// while it is out waits for the next read, so that every asker gets a file read after it asked,
/// and a storm of SIGHUPs costs two reads, not one each.
#[derive(Debug, Default)]
pub(super) struct Reloads {
    /// The read out, and who asked for it: a request, or SIGHUP (None).
    reading: Option<Vec<Option<RequestId>>>,
    /// Asked while a read was out.
    queued: Vec<Option<RequestId>>,
}

/// Answers the requests among `askers`: busy, shutting down.
fn refuse(askers: Vec<Option<RequestId>>, out: &mut Vec<Action>) {
    for id in askers.into_iter().flatten() {
        out.push(Action::Reply {
            id,
            answer: Err(Failure::new(
                ErrorCode::Busy,
                "shutting down: not reloading",
            )),
        });
    }
}

/// SIGHUP, or a request: the cause of a read, for the log.
fn cause_of(askers: &[Option<RequestId>]) -> ReloadCause {
    if askers.iter().any(Option::is_none) {
        ReloadCause::Signal
    } else {
        ReloadCause::Request
    }
}

impl Node {
    /// A reload was asked for (the `reload` op, already authorized, or SIGHUP: `id` None).
    /// Refused while shutting down: it would start replicas only to stop them.
    pub(super) fn reload_asked(&mut self, id: Option<RequestId>, out: &mut Vec<Action>) {
        if self.shutdown.is_some() {
            match id {
                Some(id) => out.push(Action::Reply {
                    id,
                    answer: Err(Failure::new(
                        ErrorCode::Busy,
                        "shutting down: not reloading",
                    )),
                }),
                None => {
                    self.log_global(LogLevel::Warn, "SIGHUP ignored: shutting down".into(), out)
                }
            }
            return;
        }
        if self.reloads.reading.is_some() {
            self.reloads.queued.push(id);
            return;
        }
        self.reloads.reading = Some(vec![id]);
        out.push(Action::ReadConfig {
            cause: cause_of(&[id]),
        });
    }

    /// The shell read the file: apply it, or keep the running configuration and say why.
    /// The shell applies its part first (`ReloadDone`), then the askers are answered, so that an
    /// answered reload is in force everywhere.
    pub(super) fn config_read(
        &mut self,
        read: Result<Box<NewConfig>, ConfigReadError>,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(askers) = self.reloads.reading.take() else {
            self.log_global(
                LogLevel::Debug,
                "a configuration read nobody waits for: ignored".into(),
                out,
            );
            return;
        };
        let cause = cause_of(&askers);
        // The scale overrides in force must fit the new file too (its ports, its models' max);
        // else the file is refused like a bad one and the operator told how to make room.
        let overrides = self.overrides();
        let read = read.and_then(
            |new| match super::overrides::check(&new.config, &overrides) {
                Ok(()) => Ok(new),
                Err(why) => Err(ConfigReadError::Overrides {
                    path: new.config.path.clone(),
                    why,
                }),
            },
        );
        let answer = match read {
            _ if self.shutdown.is_some() => {
                out.push(Action::ReloadDone {
                    cause,
                    applied: None,
                });
                Err(Failure::new(
                    ErrorCode::Busy,
                    "shutting down: not reloading",
                ))
            }
            Err(e) => {
                self.config_file_reloaded(Some(&e.to_string()));
                self.log_global(
                    LogLevel::Error,
                    format!("{cause}: configuration not reloaded, the running one is kept: {e}"),
                    out,
                );
                out.push(Action::ReloadDone {
                    cause,
                    applied: None,
                });
                Err(Failure::new(
                    ErrorCode::BadRequest,
                    format!("configuration not reloaded: {e}"),
                ))
            }
            Ok(new) => {
                let NewConfig {
                    config, warnings, ..
                } = *new;
                for w in warnings {
                    self.log_global(LogLevel::Warn, format!("{cause}: {w}"), out);
                }
                self.apply_config(config, now, out);
                self.config_file_reloaded(None);
                out.push(Action::ReloadDone {
                    cause,
                    applied: Some(Box::new(self.config.clone())),
                });
                Ok(Response::Done {})
            }
        };
        for id in askers.into_iter().flatten() {
            out.push(Action::Reply {
                id,
                answer: answer.clone(),
            });
        }
        let queued = std::mem::take(&mut self.reloads.queued);
        if self.shutdown.is_some() {
            refuse(queued, out);
        } else if !queued.is_empty() {
            out.push(Action::ReadConfig {
                cause: cause_of(&queued),
            });
            self.reloads.reading = Some(queued);
        }
    }

    /// A read of the file is out (tests: its answer is still to come).
    #[cfg(test)]
    pub(super) fn reloads_pending(&self) -> bool {
        self.reloads.reading.is_some()
    }

    /// At shutdown: reloads waiting for a read are refused now, not when it comes back.
    pub(super) fn refuse_reloads(&mut self, out: &mut Vec<Action>) {
        refuse(std::mem::take(&mut self.reloads.queued), out);
        if let Some(reading) = &mut self.reloads.reading {
            // The read stays out: its result, when it comes, ends the reload for the shell.
            refuse(std::mem::take(reading), out);
        }
    }

    /// Applies a validated configuration: untouched models keep their replicas, scaling changes
    /// apply at once, a changed launch spec (command, env, warm-up, version…) rolls the model
    /// over, new models start, removed models drain away.
    fn apply_config(&mut self, config: Config, now: Time, out: &mut Vec<Action>) {
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
            let spec = &mc.launch;
            let msg = if *spec == *m.spec {
                // Scaling, liveness, signal, priority, stop_grace: they apply live. A rollout
                // under way goes on: its replicas of either version are what they were.
                "configuration changed; replicas kept".to_string()
            } else if m.rollout.is_some() && *spec == **m.launch_spec() {
                // Back to the version a halted rollout left serving.
                m.rollout = None;
                "configuration changed back to the version serving; rollout dropped".to_string()
            } else {
                let previous = m.launch_config().clone();
                let msg = format!(
                    "rolling out version {} (from {}): new replicas warm before old ones drain",
                    mc.launch.version, previous.launch.version
                );
                m.rollout = Some(Rollout {
                    previous_spec: Arc::clone(m.launch_spec()),
                    previous,
                    failures: 0,
                    halted: None,
                });
                msg
            };
            if *spec != *m.spec {
                m.spec = Arc::new(spec.clone());
            }
            m.config = mc.clone();
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
            let Some(m) = self.models.get_mut(&name) else {
                continue;
            };
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
            if !self.held.replicas().has_model(&name) {
                self.models.remove(&name);
            }
        }
        self.held.set_port_range(config.daemon.ports);
        self.config = config;
    }

    /// Ends a rollout when no replica of another version is left.
    pub(super) fn rollout_progress(&mut self, model: &str, out: &mut Vec<Action>) {
        let Some(m) = self.models.get(model) else {
            return;
        };
        let Some(r) = &m.rollout else { return };
        if r.halted.is_some()
            || self
                .held
                .replicas()
                .of_model(model)
                .any(|x| x.spec != m.spec)
        {
            return;
        }
        let version = m.config.launch.version.clone();
        if let Some(m) = self.models.get_mut(model) {
            m.rollout = None;
        }
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
        spec: &LaunchSpec,
        ever_warm: bool,
        why: &str,
        out: &mut Vec<Action>,
    ) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let new_spec = Arc::clone(&m.spec);
        let version = m.config.launch.version.clone();
        let Some(r) = m.rollout.as_mut() else { return };
        if *spec != *new_spec || ever_warm || r.halted.is_some() {
            return;
        }
        r.failures += 1;
        if r.failures >= ROLLOUT_FAILURES {
            let halted = format!(
                "rollout of version {version} halted after {} replicas failed to warm up (last: {why}); version {} keeps serving until the configuration changes",
                r.failures, r.previous.launch.version
            );
            r.halted = Some(halted.clone());
            self.log(LogLevel::Error, model, None, halted, out);
        }
    }
}
