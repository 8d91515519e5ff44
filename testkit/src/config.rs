//! The daemon's configuration file, rendered from [`Config`] and [`Model`]s.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::Serialize;
use toml::{Table, Value};

/// `hearth toy-server --port {port} ARGS…`, as a model's `command`.
pub(crate) fn toy_command(args: &[&str]) -> Vec<String> {
    let mut command = vec![
        crate::hearth().display().to_string(),
        "toy-server".into(),
        "--port".into(),
        "{port}".into(),
    ];
    command.extend(args.iter().map(|s| s.to_string()));
    command
}

/// The name of the account this test runs as.
pub fn current_user() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// `[model.liveness]`: GET /health.
#[derive(Debug, Clone)]
pub struct Liveness {
    pub interval: String,
    pub timeout: String,
    pub failures: u32,
}

/// `[model.warmup]`: POST `path` with `body`, expecting 200 and `expect_body`.
#[derive(Debug, Clone)]
pub struct Warmup {
    pub path: String,
    pub body: String,
    pub expect_body: String,
    pub timeout: String,
    pub startup_timeout: String,
    pub recheck: String,
}

/// `[model.signal]`: scrape /metrics in `format` every `interval`.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub format: String,
    pub interval: String,
}

/// `[model.scaling]`; None leaves a key to the daemon's default.
#[derive(Debug, Clone)]
pub struct Scaling {
    pub min: u32,
    pub max: u32,
    pub warm_pool: u32,
    pub target_wait: Option<String>,
    pub stale_after: Option<String>,
    pub down_stabilization: Option<String>,
    pub down_step: Option<String>,
    pub drain_timeout: Option<String>,
    pub max_up_step: Option<u32>,
    pub idle_to_zero: Option<String>,
}

/// One `[[model]]`.
#[derive(Debug, Clone)]
pub struct Model {
    pub name: String,
    pub version: String,
    pub command: Vec<String>,
    /// Besides the harness's mark.
    pub env: Vec<(String, String)>,
    /// `user`: the presets name the account the test runs as, so that replicas reach what the
    /// test prepares for them (a relay socket, a file) as before hearth ran models without
    /// `user` unprivileged; [`Model::default_account`] leaves it out, as a user's file would.
    pub user: Option<String>,
    pub gpus: u32,
    pub gpu_memory: Option<String>,
    pub placement: Option<String>,
    /// `device_naming` ("index" or "uuid"); None leaves the default (index).
    pub device_naming: Option<String>,
    /// `start_alone`; None leaves the default (true).
    pub start_alone: Option<bool>,
    pub priority: Option<i32>,
    /// `pin`; None leaves the default (false).
    pub pin: Option<bool>,
    pub prefetch: Vec<String>,
    /// `slots`; None leaves the default (1).
    pub slots: Option<u32>,
    pub stop_grace: String,
    pub warmup: Warmup,
    pub liveness: Option<Liveness>,
    pub signal: Option<Scrape>,
    pub scaling: Scaling,
    /// The lines of its `[model.sleep]` table, if it has one.
    pub sleep: Option<String>,
}

impl Model {
    /// `hearth toy-server --port {port} ARGS…`: 2 routed + 1 warm (max 3), warm-up a real
    /// completion (5 s a try, 1 m to start, rechecked every minute), stop_grace 2 s; scaling
    /// target 2 s, down after 10 m of calm by one a 5 m, drains up to 30 s.
    pub fn toy(name: &str, args: &[&str]) -> Model {
        let command = toy_command(args);
        Model {
            name: name.to_string(),
            version: "1".into(),
            command,
            env: Vec::new(),
            user: current_user(),
            gpus: 0,
            gpu_memory: None,
            placement: None,
            device_naming: None,
            start_alone: None,
            priority: None,
            pin: None,
            prefetch: Vec::new(),
            slots: None,
            stop_grace: "2s".into(),
            warmup: Warmup {
                path: "/v1/completions".into(),
                body: format!(r#"{{"model":"{name}","prompt":"Hello","max_tokens":4}}"#),
                expect_body: "choices".into(),
                timeout: "5s".into(),
                startup_timeout: "1m".into(),
                recheck: "1m".into(),
            },
            liveness: None,
            signal: None,
            scaling: Scaling {
                min: 2,
                max: 3,
                warm_pool: 1,
                target_wait: Some("2s".into()),
                stale_after: None,
                down_stabilization: Some("10m".into()),
                down_step: Some("5m".into()),
                drain_timeout: Some("30s".into()),
                max_up_step: None,
                idle_to_zero: None,
            },
            sleep: None,
        }
    }

    /// `[model.sleep]` with these lines (docs/sleep.md), e.g. `format = "vllm"`.
    pub fn sleep(mut self, lines: &str) -> Model {
        self.sleep = Some(lines.to_string());
        self
    }

    /// min, max and warm_pool.
    pub fn scale(mut self, min: u32, max: u32, warm_pool: u32) -> Model {
        (self.scaling.min, self.scaling.max, self.scaling.warm_pool) = (min, max, warm_pool);
        self
    }

    /// Replaces the command line.
    pub fn command(mut self, argv: &[&str]) -> Model {
        self.command = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    /// `gpus = n` and `gpu_memory` for each replica.
    pub fn gpus(mut self, n: u32, memory: &str) -> Model {
        self.gpus = n;
        self.gpu_memory = Some(memory.to_string());
        self
    }

    pub fn liveness(mut self, interval: &str, timeout: &str, failures: u32) -> Model {
        self.liveness = Some(Liveness {
            interval: interval.into(),
            timeout: timeout.into(),
            failures,
        });
        self
    }

    pub fn target_wait(mut self, d: &str) -> Model {
        self.scaling.target_wait = Some(d.into());
        self
    }

    pub fn stale_after(mut self, d: &str) -> Model {
        self.scaling.stale_after = Some(d.into());
        self
    }

    /// `slots = n`: requests one replica serves at once (the router's limit).
    pub fn slots(mut self, n: u32) -> Model {
        self.slots = Some(n);
        self
    }

    pub fn drain_timeout(mut self, d: &str) -> Model {
        self.scaling.drain_timeout = Some(d.into());
        self
    }

    /// No `user`: the replicas run as hearth's default account (unprivileged when the daemon
    /// runs as root).
    pub fn default_account(mut self) -> Model {
        self.user = None;
        self
    }

    /// `user = NAME`: the account its replicas run as.
    pub fn user(mut self, name: &str) -> Model {
        self.user = Some(name.to_string());
        self
    }

    pub fn stop_grace(mut self, d: &str) -> Model {
        self.stop_grace = d.into();
        self
    }

    pub fn startup_timeout(mut self, d: &str) -> Model {
        self.warmup.startup_timeout = d.into();
        self
    }

    /// The `[[model]]` section, with `mark` (NAME, value) in its `env`.
    pub fn render(&self, mark: (&str, &str)) -> String {
        let file = ModelsFile {
            model: vec![self.section(mark)],
        };
        toml::to_string(&file).expect("a model serializes")
    }

    /// The `[[model]]` table, with `mark` (NAME, value) in its `env`.
    fn section<'a>(&'a self, mark: (&'a str, &'a str)) -> ModelSection<'a> {
        let mut env: BTreeMap<&str, &str> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        env.insert(mark.0, mark.1);
        let w = &self.warmup;
        let c = &self.scaling;
        ModelSection {
            name: &self.name,
            version: &self.version,
            command: &self.command,
            env,
            user: self.user.as_deref(),
            gpus: self.gpus,
            gpu_memory: self.gpu_memory.as_deref(),
            placement: self.placement.as_deref(),
            device_naming: self.device_naming.as_deref(),
            start_alone: self.start_alone,
            priority: self.priority,
            pin: self.pin,
            prefetch: (!self.prefetch.is_empty()).then_some(&self.prefetch[..]),
            slots: self.slots,
            stop_grace: &self.stop_grace,
            warmup: WarmupSection {
                url: format!("http://127.0.0.1:{{port}}{}", w.path),
                body: &w.body,
                headers: BTreeMap::from([("content-type", "application/json")]),
                expect_status: 200,
                expect_body: &w.expect_body,
                timeout: &w.timeout,
                startup_timeout: &w.startup_timeout,
                recheck: &w.recheck,
            },
            liveness: self.liveness.as_ref().map(|l| LivenessSection {
                url: "http://127.0.0.1:{port}/health",
                interval: &l.interval,
                timeout: &l.timeout,
                failures: l.failures,
            }),
            signal: self.signal.as_ref().map(|sig| SignalSection {
                scrape: "http://127.0.0.1:{port}/metrics",
                format: &sig.format,
                interval: &sig.interval,
            }),
            scaling: ScalingSection {
                min: c.min,
                max: c.max,
                warm_pool: c.warm_pool,
                target_wait: c.target_wait.as_deref(),
                stale_after: c.stale_after.as_deref(),
                down_stabilization: c.down_stabilization.as_deref(),
                down_step: c.down_step.as_deref(),
                drain_timeout: c.drain_timeout.as_deref(),
                idle_to_zero: c.idle_to_zero.as_deref(),
                max_up_step: c.max_up_step,
            },
            sleep: self
                .sleep
                .as_deref()
                .map(|lines| parsed(lines, "[model.sleep]")),
        }
    }
}

/// A file of `[[model]]`s only.
#[derive(Serialize)]
struct ModelsFile<'a> {
    model: Vec<ModelSection<'a>>,
}

/// `[[model]]` as the daemon reads it; `None` leaves a key to the daemon's default. Fields are
/// written in this order, which tests that edit the text rely on (`min = 1\nmax = 2`).
#[derive(Serialize)]
struct ModelSection<'a> {
    name: &'a str,
    version: &'a str,
    command: &'a [String],
    env: BTreeMap<&'a str, &'a str>,
    user: Option<&'a str>,
    gpus: u32,
    gpu_memory: Option<&'a str>,
    placement: Option<&'a str>,
    device_naming: Option<&'a str>,
    start_alone: Option<bool>,
    priority: Option<i32>,
    pin: Option<bool>,
    prefetch: Option<&'a [String]>,
    slots: Option<u32>,
    stop_grace: &'a str,
    warmup: WarmupSection<'a>,
    liveness: Option<LivenessSection<'a>>,
    signal: Option<SignalSection<'a>>,
    scaling: ScalingSection<'a>,
    sleep: Option<Table>,
}

#[derive(Serialize)]
struct WarmupSection<'a> {
    url: String,
    body: &'a str,
    headers: BTreeMap<&'a str, &'a str>,
    expect_status: u16,
    expect_body: &'a str,
    timeout: &'a str,
    startup_timeout: &'a str,
    recheck: &'a str,
}

#[derive(Serialize)]
struct LivenessSection<'a> {
    url: &'a str,
    interval: &'a str,
    timeout: &'a str,
    failures: u32,
}

#[derive(Serialize)]
struct SignalSection<'a> {
    scrape: &'a str,
    format: &'a str,
    interval: &'a str,
}

#[derive(Serialize)]
struct ScalingSection<'a> {
    min: u32,
    max: u32,
    warm_pool: u32,
    target_wait: Option<&'a str>,
    stale_after: Option<&'a str>,
    down_stabilization: Option<&'a str>,
    down_step: Option<&'a str>,
    drain_timeout: Option<&'a str>,
    idle_to_zero: Option<&'a str>,
    max_up_step: Option<u32>,
}

/// `[daemon]`, `[gpus]` and the models, as the daemon reads them.
#[derive(Serialize)]
struct FileSection<'a> {
    daemon: DaemonSection<'a>,
    gpus: GpusSection<'a>,
    /// Always written: hearth refuses a file without `[[model]]` unless it says `model = []` (a
    /// cut-short file must never read as "stop every model").
    model: Vec<ModelSection<'a>>,
}

#[derive(Serialize)]
struct DaemonSection<'a> {
    socket: String,
    state_dir: String,
    ports: String,
    tick: &'a str,
    shutdown_timeout: &'a str,
    metrics: Option<String>,
    log_level: Option<&'a str>,
}

#[derive(Serialize)]
struct GpusSection<'a> {
    backend: &'a str,
    device: Vec<DeviceSection<'a>>,
}

#[derive(Serialize)]
struct DeviceSection<'a> {
    uuid: &'a str,
    memory: &'a str,
}

/// `text`, TOML a test wrote by hand, as a table; `what` names it when it does not parse.
fn parsed(text: &str, what: &str) -> Table {
    text.parse::<Table>()
        .unwrap_or_else(|e| panic!("the test's {what} is not TOML: {e}\n{text}"))
}

/// `extra` laid over `base`: tables merge key by key, any other value of `extra` replaces
/// `base`'s (moved() lays the daemon's own paths and ports over a whole file).
fn merge(base: &mut Table, extra: Table) {
    for (key, value) in extra {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(e)) => merge(b, e),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// The whole file but for the paths and ports, which belong to the daemon's [`crate::Home`].
#[derive(Debug, Clone)]
pub struct Config {
    pub tick: String,
    pub shutdown_timeout: String,
    /// Serve /metrics on 127.0.0.1 at this port.
    pub metrics: Option<u16>,
    pub log_level: Option<String>,
    /// `[gpus] backend`.
    pub gpu_backend: String,
    /// `[[gpus.device]]`: (uuid, memory).
    pub gpu_devices: Vec<(String, String)>,
    pub models: Vec<Model>,
    /// Appended as it is.
    pub extra: String,
    /// `[route]`, for `hearth route` on the same file: the keys after `listen` (which is the
    /// daemon's [`crate::Home`]'s, like the paths and ports), as TOML. None: no `[route]`.
    pub route: Option<String>,
    /// A whole configuration file as it is (`DaemonBuilder::file`), in place of everything
    /// above: only its socket, state_dir, ports and `[route] listen` are moved to the daemon's
    /// own, as CI moves config.toml.example's.
    pub file: Option<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            tick: "250ms".into(),
            shutdown_timeout: "10s".into(),
            metrics: None,
            log_level: None,
            gpu_backend: "auto".into(),
            gpu_devices: Vec::new(),
            models: Vec::new(),
            extra: String::new(),
            route: None,
            file: None,
        }
    }
}

impl Config {
    /// The file for a daemon in `dir` with replica ports `ports`, its models marked with `mark`;
    /// `[route]` listens on `listen` (given when `route` is).
    pub fn render(
        &self,
        dir: &Path,
        ports: (u16, u16),
        listen: Option<SocketAddr>,
        mark: (&str, &str),
    ) -> String {
        if let Some(text) = &self.file {
            return moved(text, dir, ports, listen);
        }
        let file = FileSection {
            daemon: DaemonSection {
                socket: dir.join("hearth.sock").display().to_string(),
                state_dir: dir.join("state").display().to_string(),
                ports: format!("{}-{}", ports.0, ports.1),
                tick: &self.tick,
                shutdown_timeout: &self.shutdown_timeout,
                metrics: self.metrics.map(|p| format!("127.0.0.1:{p}")),
                log_level: self.log_level.as_deref(),
            },
            gpus: GpusSection {
                backend: &self.gpu_backend,
                device: self
                    .gpu_devices
                    .iter()
                    .map(|(uuid, memory)| DeviceSection { uuid, memory })
                    .collect(),
            },
            model: self.models.iter().map(|m| m.section(mark)).collect(),
        };
        let mut s = toml::to_string(&file).expect("a configuration serializes");
        // What the test wrote by hand comes after, as it wrote it: its own tables, and the keys
        // of `[route]` (followed, maybe, by `[route.…]` tables of its own).
        s.push_str(&self.extra);
        if let (Some(keys), Some(addr)) = (&self.route, listen) {
            let listen = Value::String(addr.to_string());
            s += &format!("\n[route]\nlisten = {listen}\n{keys}");
        }
        s
    }
}

/// `text` with its `[daemon] socket`, `state_dir` and `ports` and its `[route] listen` pointing
/// at the daemon's own, as CI moves config.toml.example's.
fn moved(text: &str, dir: &Path, ports: (u16, u16), listen: Option<SocketAddr>) -> String {
    let mut table = parsed(text, "configuration file");
    let mut daemon = Table::new();
    daemon.insert(
        "socket".into(),
        Value::String(dir.join("hearth.sock").display().to_string()),
    );
    daemon.insert(
        "state_dir".into(),
        Value::String(dir.join("state").display().to_string()),
    );
    daemon.insert(
        "ports".into(),
        Value::String(format!("{}-{}", ports.0, ports.1)),
    );
    let mut ours = Table::from_iter([("daemon".into(), Value::Table(daemon))]);
    if let (Some(addr), true) = (listen, table.contains_key("route")) {
        let route = Table::from_iter([("listen".into(), Value::String(addr.to_string()))]);
        ours.insert("route".into(), Value::Table(route));
    }
    merge(&mut table, ours);
    toml::to_string(&table).expect("a configuration serializes")
}
