//! The core under test: a [`Harness`] drives a `Node` with a virtual clock and a fake process
//! table (no sleeps, no processes, no sockets), and the configurations the tests start from.
//! The core's own tests use it, and so do the shell's tests of what feeds the core (the NVML
//! path), through the `harness` feature.
// Test support: a failed unwrap is a failed test.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::config::Config;
use crate::protocol::{Answer, Report, Request, Response, StatusView, WatchEvent};

/// A reload's read refused as the shell's checks say it: `FILE[:LINE]: KEY: message`.
pub fn refused(file: &str, line: Option<usize>, key: &str, message: &str) -> ConfigReadError {
    ConfigReadError::Invalid(crate::config::ConfigError {
        file: file.into(),
        line,
        key: key.into(),
        message: message.into(),
    })
}

/// A replica's end as SIGKILL leaves it.
pub const KILLED: ExitStatus = ExitStatus::Signaled {
    signal: 9,
    core_dumped: false,
};

pub const BASE: &str = r#"
[daemon]
socket = "/tmp/hearth-test.sock"
ports = "30000-30099"

[gpus]
backend = "static"
[[gpus.device]]
uuid = "GPU-a"
memory = "80GiB"
[[gpus.device]]
uuid = "GPU-b"
memory = "80GiB"
"#;

/// `BASE` with one device, `GPU-a`, of `memory` (a size, as the file writes it).
pub fn one_device(memory: &str) -> String {
    let (head, _) = BASE
        .split_once("[[gpus.device]]")
        .expect("BASE declares devices");
    format!("{head}[[gpus.device]]\nuuid = \"GPU-a\"\nmemory = \"{memory}\"\n")
}

pub fn model(name: &str, extra: &str, scaling: &str) -> String {
    format!(
        r#"
[[model]]
name = "{name}"
command = ["server", "--port", "{{port}}"]
gpus = 0
stop_grace = "5s"
{extra}
[model.warmup]
url = "http://127.0.0.1:{{port}}/v1/completions"
body = '{{"prompt":"hi"}}'
expect_body = "choices"
startup_timeout = "10s"
recheck = "1m"
[model.liveness]
url = "http://127.0.0.1:{{port}}/health"
interval = "1s"
failures = 3
[model.scaling]
{scaling}
"#
    )
}

/// A node under test, with a virtual clock and a fake process table.
pub struct Harness {
    pub node: Node,
    pub now: Time,
    next_pid: u32,
    pub log: Vec<Action>,
    next_req: u64,
}

impl Harness {
    pub fn new(toml: &str) -> Harness {
        let mut h = Harness::bare(toml);
        h.send(Event::Tick);
        h
    }

    /// A node that has handled nothing yet (the daemon's adoption comes before its first tick).
    pub fn bare(toml: &str) -> Harness {
        let config = Config::parse(toml, Path::new("test.toml")).expect("test config parses");
        let devices = GpuDevice::declared(&config.gpus);
        Harness::with_devices(toml, devices)
    }

    /// A node whose inventory found `devices` (rather than the file's `[[gpus.device]]`).
    pub fn with_devices(toml: &str, devices: Vec<GpuDevice>) -> Harness {
        let config = Config::parse(toml, Path::new("test.toml")).expect("test config parses");
        let now = Time::from_millis(1_000_000);
        Harness {
            node: Node::new(config, devices, Default::default(), now),
            now,
            next_pid: 1000,
            log: Vec::new(),
            next_req: 1,
        }
    }

    /// Whether the device takes replicas now (for tests outside the core).
    pub fn accepts(&self, uuid: &str) -> bool {
        self.node
            .held
            .gpus()
            .slot(uuid)
            .is_some_and(|s| s.accepts())
    }

    /// (bytes reserved, NVML index) of a device.
    pub fn reserved_on(&self, uuid: &str) -> Option<(u64, u32)> {
        self.node
            .held
            .gpus()
            .slot(uuid)
            .map(|s| (s.reserved, s.device.index))
    }

    /// The devices of a replica.
    pub fn gpus_of(&self, id: &ReplicaId) -> Vec<String> {
        self.node
            .held
            .replicas()
            .get(id)
            .map(|r| r.gpus.clone())
            .unwrap_or_default()
    }

    /// Every replica's state and devices.
    pub fn all_replicas(&self) -> Vec<(ReplicaState, Vec<String>)> {
        self.node
            .held
            .replicas()
            .values()
            .map(|r| (r.state, r.gpus.clone()))
            .collect()
    }

    pub fn send(&mut self, ev: Event) -> Vec<Action> {
        let out = self.node.handle(ev, self.now);
        self.log.extend(out.iter().cloned());
        out
    }

    pub fn advance(&mut self, d: Duration) -> Vec<Action> {
        self.now = self.now + d;
        self.send(Event::Tick)
    }

    /// Advances in tick steps, collecting every action.
    pub fn run_for(&mut self, d: Duration) -> Vec<Action> {
        let step = Duration::from_millis(250);
        let end = self.now + d;
        let mut all = Vec::new();
        while self.now < end {
            all.extend(self.advance(step));
        }
        all
    }

    /// The answer to `request` from `peer`, as a client reads it: written as the socket writes
    /// it, then decoded by the op that was sent (`protocol::decode_answer`).
    pub fn ask(&mut self, peer: Peer, request: Request) -> Answer {
        let id = self.next_req;
        self.next_req += 1;
        let op = request.op();
        let out = self.send(Event::Request { id, peer, request });
        let line = out
            .into_iter()
            .find_map(|a| match a {
                Action::Reply { id: i, answer } if i == id => {
                    Some(crate::protocol::encode_answer(&answer))
                }
                _ => None,
            })
            .expect("every request is answered");
        crate::protocol::decode_answer(&line, op).expect("the answer decodes as its op's")
    }

    /// `status` of every model, as an operator's client reads it.
    pub fn status(&mut self) -> StatusView {
        match self.ask(Peer::trusted(), Request::Status { model: None }) {
            Ok(Response::Status { status }) => status,
            other => panic!("status answered {other:?}"),
        }
    }

    /// The answer to `request` as JSON, for the tests that read a field by its wire name.
    pub fn request(&mut self, peer: Peer, request: Request) -> Value {
        let id = self.next_req;
        self.next_req += 1;
        let out = self.send(Event::Request { id, peer, request });
        out.into_iter()
            .find_map(|a| match a {
                Action::Reply { id: i, answer } if i == id => {
                    // As the socket writes it, so that tests read what a client reads.
                    serde_json::from_str(&crate::protocol::encode_answer(&answer)).ok()
                }
                _ => None,
            })
            .expect("every request is answered")
    }

    /// SIGHUP with `toml` as the file: the core asks for the file, the shell reads it. Returns
    /// what the core did with it.
    pub fn reload(&mut self, toml: &str) -> Vec<Action> {
        let config = Config::parse(toml, Path::new("reload.toml")).expect("test config parses");
        self.reload_config(config)
    }

    /// SIGHUP with a file that reads as `config`.
    pub fn reload_config(&mut self, config: Config) -> Vec<Action> {
        let asked = self.send(Event::ReloadSignal);
        assert!(
            asked.contains(&Action::ReadConfig {
                cause: ReloadCause::Signal
            }),
            "{asked:?}"
        );
        self.send(Event::ConfigRead(Ok(Box::new(NewConfig {
            config,
            warnings: Vec::new(),
            text: "".into(),
        }))))
    }

    /// A trusted report of `model`'s queue (for `replica`, or model-wide); it must be taken.
    pub fn report(
        &mut self,
        model: &str,
        replica: Option<&str>,
        wait_ms: f64,
        depth: u64,
        in_flight: u64,
    ) {
        let r = Report {
            model: model.into(),
            replica: replica.map(String::from),
            oldest_wait_ms: Some(wait_ms),
            queue_depth: Some(depth),
            in_flight: Some(in_flight),
            arrived: None,
            completed: None,
            router: None,
        };
        let answer = self.ask(Peer::trusted(), Request::Report(r));
        assert!(answer.is_ok(), "the report was refused: {answer:?}");
    }

    /// Answers every Spawn in `actions` with a pid; returns the spawned replica ids.
    pub fn spawn_all(&mut self, actions: &[Action]) -> Vec<ReplicaId> {
        let mut ids = Vec::new();
        for a in actions {
            if let Action::Spawn(spec) = a {
                self.next_pid += 1;
                let pid = self.next_pid;
                self.send(Event::Spawned {
                    replica: spec.replica.clone(),
                    pid,
                });
                ids.push(spec.replica.clone());
            }
        }
        ids
    }

    pub fn warm(&mut self, id: &ReplicaId) -> Vec<Action> {
        self.passed(id, ProbeKind::Warmup)
    }

    /// The replica's probe of `kind` passed (HTTP 200).
    pub fn passed(&mut self, id: &ReplicaId, kind: ProbeKind) -> Vec<Action> {
        let outcome = ProbeOutcome {
            ok: true,
            not_ready: false,
            detail: "HTTP 200".into(),
        };
        self.send(Event::Probed {
            replica: id.clone(),
            kind,
            outcome,
        })
    }

    /// Spawns and warms everything the node asks for, repeatedly, until it asks for nothing.
    pub fn settle(&mut self, mut actions: Vec<Action>) {
        for _ in 0..20 {
            let ids = self.spawn_all(&actions);
            if ids.is_empty() {
                return;
            }
            actions = Vec::new();
            for id in ids {
                actions.extend(self.warm(&id));
            }
        }
        panic!("did not settle");
    }

    pub fn exit(&mut self, id: &ReplicaId, status: ExitStatus) -> Vec<Action> {
        self.send(Event::Exited {
            replica: id.clone(),
            status,
        })
    }

    pub fn in_state(&self, model: &str, state: ReplicaState) -> Vec<ReplicaId> {
        let mut v: Vec<_> = self
            .node
            .held
            .replicas()
            .values()
            .filter(|r| r.model == model && r.state == state)
            .map(|r| (r.n, r.id.clone()))
            .collect();
        v.sort();
        v.into_iter().map(|(_, id)| id).collect()
    }

    pub fn pid(&self, id: &ReplicaId) -> u32 {
        self.node
            .held
            .replicas()
            .get(id)
            .and_then(|r| r.pid)
            .expect("has a pid")
    }
}

/// What a request was refused with; None when it was answered ok.
pub fn error_code(answer: &Answer) -> Option<crate::protocol::ErrorCode> {
    answer.as_ref().err().map(|f| f.code)
}

pub fn spawns(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Spawn(_)))
        .count()
}

pub fn signals(actions: &[Action], want: StopSignal) -> Vec<ReplicaId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Signal {
                replica, signal, ..
            } if *signal == want => Some(replica.clone()),
            _ => None,
        })
        .collect()
}

pub fn routed_sets(actions: &[Action]) -> Vec<Vec<String>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Publish(WatchEvent::Routed { endpoints, .. }) => {
                Some(endpoints.iter().map(|e| e.replica.clone()).collect())
            }
            _ => None,
        })
        .collect()
}

/// A model on one GPU holding `mem`.
pub fn gpu_model(name: &str, mem: &str, extra: &str, scaling: &str) -> String {
    model(name, extra, scaling).replace("gpus = 0", &format!("gpus = 1\ngpu_memory = \"{mem}\""))
}

pub fn on_device(h: &Harness, uuid: &str) -> Vec<ReplicaId> {
    let mut v = h.node.held.gpus().slot(uuid).unwrap().replicas.clone();
    v.sort();
    v
}
