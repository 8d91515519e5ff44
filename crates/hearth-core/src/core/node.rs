//! `Node`: all state, and `handle(event, now) -> Vec<Action>`, the one entry point; the scaling
//! decision, the model signal and the routed set. Requests are answered in requests.rs, probes
//! in probes.rs, lifecycle transitions in lifecycle.rs, the reconciler in reconcile.rs.

use std::collections::BTreeMap;

use super::event::{Action, Event, LogLevel};
use super::gpu::GpuDevice;
use super::model::{ModelState, Overrides};
use super::policy::{Decision, Inputs};
use super::queue_signal::ModelSignal;
use super::reload::Reloads;
use super::replica::{ReplicaId, ReplicaState};
use super::reservations::Reservations;
use super::Time;
use crate::config::Config;
use crate::protocol::{ConfigFileView, Endpoint, UpgradeView, WatchEvent};

#[derive(Debug, Clone)]
pub(super) struct ShutdownState {
    pub deadline: Time,
}

/// A routed set as published: what its endpoints say, without making their strings (it is
/// compared with the routed replicas after every event, and almost always found the same).
#[derive(Debug, Clone, Default)]
struct RoutedSet {
    slots: u32,
    /// Each routed replica with a port, in id order, and its port.
    replicas: Vec<(ReplicaId, u16)>,
}

pub struct Node {
    pub(super) config: Config,
    pub(super) models: BTreeMap<String, ModelState>,
    /// Replicas, their ports and GPU reservations: changed through its own methods only.
    pub(super) held: Reservations,
    pub(super) shutdown: Option<ShutdownState>,
    pub(super) shutdown_reported: bool,
    pub(super) reloads: Reloads,
    /// The routed set last published per model, to publish only changes.
    published: BTreeMap<String, RoutedSet>,
    /// Each model's `capacity` event last published (fleet.rs).
    pub(super) capacity_published: BTreeMap<String, super::fleet::Capacity>,
    pub(super) version: String,
    /// Events handled so far: tells what happened in this event from what happened before.
    pub(super) events: u64,
    /// When the node was made: start-up placement waits for the first memory readings until
    /// `FIRST_READING` after it.
    pub(super) started: Time,
    /// Placement went ahead without a device's first memory reading (logged once).
    pub(super) unread_warned: bool,
    /// Whether the configuration file is what runs (daemon_facts.rs).
    pub(super) config_file: ConfigFileView,
    /// How the last upgrade ended, as the shell found it.
    pub(super) upgrade: Option<UpgradeView>,
    /// The host's RAM (`with_host_ram`); None: not measured (the simulator, tests).
    pub(super) host_ram: Option<u64>,
}

impl Node {
    /// A node for `config`, with the GPUs the inventory found and the saved scale overrides.
    /// The shell checks the overrides first (`check_overrides`) and says what it set aside;
    /// overrides that fail the check anyway are not used.
    pub fn new(
        config: Config,
        devices: Vec<GpuDevice>,
        overrides: BTreeMap<String, Overrides>,
        now: Time,
    ) -> Node {
        let overrides = match super::overrides::check(&config, &overrides) {
            Ok(()) => overrides,
            Err(_) => BTreeMap::new(),
        };
        let models = config
            .models
            .iter()
            .map(|m| {
                let o = overrides.get(&m.name).cloned().unwrap_or_default();
                (m.name.clone(), ModelState::new(m.clone(), o, now))
            })
            .collect();
        Node {
            held: Reservations::new(config.daemon.ports, devices),
            config_file: ConfigFileView {
                path: config.path.display().to_string(),
                ..ConfigFileView::default()
            },
            upgrade: None,
            config,
            models,
            shutdown: None,
            shutdown_reported: false,
            reloads: Reloads::default(),
            published: BTreeMap::new(),
            capacity_published: BTreeMap::new(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            events: 0,
            started: now,
            unread_warned: false,
            host_ram: None,
        }
    }

    /// The host's RAM, as the shell measured it: without `[daemon] host_memory`, sleeping
    /// replicas may hold half of it (`host_memory_budget`).
    pub fn with_host_ram(mut self, bytes: Option<u64>) -> Node {
        self.host_ram = bytes.filter(|b| *b > 0);
        self
    }

    pub fn handle(&mut self, event: Event, now: Time) -> Vec<Action> {
        let mut out = Vec::new();
        self.events += 1;
        match event {
            Event::Tick => self.tick(now, &mut out),
            Event::Spawned { replica, pid } => self.spawned(&replica, pid, now, &mut out),
            Event::SpawnFailed { replica, error } => self.process_gone(
                &replica,
                &format!("could not start: {error}"),
                now,
                &mut out,
            ),
            Event::Exited { replica, status } => {
                self.process_gone(&replica, &format!("exited ({status})"), now, &mut out)
            }
            Event::Probed {
                replica,
                kind,
                outcome,
            } => self.probed(&replica, kind, outcome, now, &mut out),
            Event::Scraped { replica, outcome } => self.scraped(&replica, outcome, now, &mut out),
            Event::Request { id, peer, request } => self.request(id, &peer, request, now, &mut out),
            Event::ReloadSignal => self.reload_asked(None, &mut out),
            Event::ConfigRead(read) => self.config_read(read, now, &mut out),
            Event::Inventory(devices) => self.inventory(devices, &mut out),
            Event::GpuXid {
                uuid,
                xid,
                recovery,
            } => self.xid(&uuid, xid, recovery, now, &mut out),
            Event::GpuReading(reading) => self.gpu_reading(reading, &mut out),
            Event::Prefetch {
                replica,
                done_bytes,
                total_bytes,
                missing,
            } => self.prefetch_progress(&replica, done_bytes, total_bytes, &missing),
            Event::PortBusy {
                replica,
                port,
                holder,
            } => self.port_busy(&replica, port, &holder, now, &mut out),
            Event::Usage(samples) => self.usage(samples),
            Event::Adopt { how, ledger } => self.adopt(how, ledger, now, &mut out),
            Event::ConfigFile { differs } => self.config_file_is(differs),
            Event::Upgraded(view) => self.upgraded(view),
            Event::Shutdown { immediate } => self.begin_shutdown(immediate, now, &mut out),
        }
        self.reconcile(now, &mut out);
        self.publish_routed(&mut out);
        self.publish_capacity(&mut out);
        out
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    // ---- scaling -----------------------------------------------------------------------------

    /// Runs the model's autoscaler and applies its decision to `desired_routed`.
    pub(super) fn autoscale(&mut self, model: &str, now: Time, out: &mut Vec<Action>) {
        if self.shutdown.is_some() {
            return;
        }
        let routed = self.count(model, ReplicaState::Routed);
        // A sleeping replica wakes in seconds, not a cold start's minutes: the policy may call on
        // it as on a warm one when a cold start would come too late.
        let warm = self
            .held
            .replicas()
            .of_model(model)
            .filter(|r| (r.promotable() || r.state == ReplicaState::Sleeping) && !self.departing(r))
            .count() as u32;
        let signal = self.model_signal(model, now);
        let wake = self.pool_wake(model);
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        if m.removed {
            return;
        }
        if m.evicted {
            let waiting = signal.is_some_and(|s| s.holds_work());
            if m.desired_routed == 0 && !waiting {
                return;
            }
            m.evicted = false;
        }
        let inputs = Inputs {
            now,
            scaling: &m.config.scaling,
            min: m.routed_min(),
            max: m.max(),
            signal,
            routed,
            desired: m.desired_routed,
            warm,
            wake,
        };
        if let Some(decision) = m.autoscaler.evaluate(&inputs) {
            self.set_desired(model, decision, now, out);
        }
        self.idle_to_sleep(model, now, out);
    }

    pub(super) fn set_desired(
        &mut self,
        model: &str,
        d: Decision,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(m) = self.models.get_mut(model) else {
            return;
        };
        let from = m.desired_routed;
        if from == d.to {
            return;
        }
        m.desired_routed = d.to;
        m.last_scale = Some(super::model::ScaleRecord {
            at: now,
            from,
            to: d.to,
            reason: d.reason.clone(),
        });
        out.push(Action::Log {
            level: LogLevel::Info,
            model: Some(model.to_string()),
            replica: None,
            message: format!("scale {from} → {}: {}", d.to, d.reason),
        });
        out.push(Action::Publish(WatchEvent::Scale {
            model: model.to_string(),
            from,
            to: d.to,
            reason: d.reason,
        }));
    }

    // ---- signal ------------------------------------------------------------------------------

    pub(super) fn model_signal(&self, model: &str, now: Time) -> Option<ModelSignal> {
        let m = self.models.get(model)?;
        let routed = self
            .held
            .replicas()
            .of_model(model)
            .filter(|r| r.state == ReplicaState::Routed)
            .map(|r| &r.signal);
        ModelSignal::combine(&m.model_wide, routed, now, m.config.scaling.stale_after)
    }

    // ---- routed set --------------------------------------------------------------------------

    pub(super) fn routed_endpoints(&self, model: &str) -> Vec<Endpoint> {
        // Live: the configuration now, whatever spec the replica was launched from.
        let slots = self.models.get(model).map_or(1, |m| m.config.slots);
        self.held
            .replicas()
            .of_model(model)
            .filter(|r| r.state == ReplicaState::Routed)
            .filter_map(|r| {
                Some(Endpoint {
                    replica: r.id.0.clone(),
                    addr: r.addr()?,
                    slots: Some(slots),
                })
            })
            .collect()
    }

    fn publish_routed(&mut self, out: &mut Vec<Action>) {
        let names: Vec<String> = self.models.keys().cloned().collect();
        for name in names {
            if self
                .published
                .get(&name)
                .is_some_and(|p| self.routed_unchanged(&name, p))
            {
                continue;
            }
            let endpoints = self.routed_endpoints(&name);
            let set = RoutedSet {
                slots: self.models.get(&name).map_or(1, |m| m.config.slots),
                replicas: self
                    .held
                    .replicas()
                    .of_model(&name)
                    .filter(|r| r.state == ReplicaState::Routed)
                    .filter_map(|r| Some((r.id.clone(), r.port?)))
                    .collect(),
            };
            self.published.insert(name.clone(), set);
            out.push(Action::Publish(WatchEvent::Routed {
                model: name,
                endpoints,
            }));
        }
    }

    /// `routed_endpoints(model)` is what `published` says.
    fn routed_unchanged(&self, model: &str, published: &RoutedSet) -> bool {
        // Each endpoint says the slots: an empty set says nothing of them.
        let slots = self.models.get(model).map_or(1, |m| m.config.slots);
        if published.slots != slots && !published.replicas.is_empty() {
            return false;
        }
        let mut was = published.replicas.iter();
        for r in self
            .held
            .replicas()
            .of_model(model)
            .filter(|r| r.state == ReplicaState::Routed)
        {
            let Some(port) = r.port else {
                continue;
            };
            match was.next() {
                Some((id, p)) if *id == r.id && *p == port => {}
                _ => return false,
            }
        }
        was.next().is_none()
    }

    pub(super) fn count(&self, model: &str, state: ReplicaState) -> u32 {
        self.held
            .replicas()
            .of_model(model)
            .filter(|r| r.state == state)
            .count() as u32
    }

    pub(super) fn log(
        &self,
        level: LogLevel,
        model: &str,
        replica: Option<&ReplicaId>,
        message: String,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Log {
            level,
            model: Some(model.to_string()),
            replica: replica.cloned(),
            message,
        });
    }
}
