//! TOML configuration: schema, defaults, validation. Parsed and validated completely before the
//! runtime starts; every error names the file, the line and the key.
//!
//! PUBLIC API (other modules rely on exactly these names):
//!   Config::parse(text: &str, path: &Path) -> Result<Config, ConfigError>
//!   Config::parse_on(text, path, checks, reach: &dyn Reach) -> Result<Config, ConfigError>
//!   ConfigError { file, line: Option<usize>, key: String, message: String } with Display
//!   "FILE:LINE: KEY: MESSAGE"
//!   expand(template: &str, vars: &Placeholders) -> String
//!
//! Three depths of checking ([`Checks`]), because one file is read by three kinds of reader:
//! - `Values`: the file's syntax, keys, types and values, and that it names its models (a file
//!   without `[[model]]` must say `model = []`: an empty or truncated file is never read as
//!   "stop every model"). `Config::parse` checks this much; the simulator and the core's tests
//!   read files this way.
//! - `Deployment`: also what running it needs that the file alone decides: every replica is told
//!   its `{port}` and probed there, and the `min` replicas fit the declared static GPUs.
//! - `Host`: also what this host must provide: each command's program exists and is executable,
//!   and the replicas' account can reach it and the socket. Only the host can say, so the shell
//!   answers through [`Reach`] (`Config::parse_on`; the shell's `config::load` reads the file and
//!   passes its answers in); it is what `hearth daemon`, a reload and `hearth check-config` accept (`check-config --no-binaries` stops at `Deployment`, for a file checked
//!   away from the host that will run it).
//!
//! Rooms: `raw` is the file's keys exactly as serde reads them, each with its place in the text;
//! `validate` turns them into the typed [`Config`] below; `placeholders` expands templates.

mod defaults;
mod duplicate;
mod placeholders;
mod raw;
pub mod route;
pub mod sleep;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use placeholders::{expand, Placeholders};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file this configuration was read from (for messages).
    pub path: PathBuf,
    pub daemon: DaemonConfig,
    pub access: AccessConfig,
    pub gpus: GpusConfig,
    pub models: Vec<ModelConfig>,
    /// `[route]`: what `hearth route` runs with (the daemon only checks it).
    pub route: RouteConfig,
}

/// `[route]`, the front door. Every key has a default, so a file without the table runs a front
/// door on loopback with the defaults in `crate::config::route::settings`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub listen: SocketAddr,
    /// Requests each model's FIFO holds, unless `[route.model.NAME] max_queue` says otherwise.
    pub max_queue: usize,
    pub queue_timeout: Duration,
    pub max_body: usize,
    /// Request bodies held at once, all requests together.
    pub max_buffered: usize,
    /// What one client address (not a trusted proxy) may hold of them.
    pub max_buffered_per_client: usize,
    /// Balancers' addresses, exempt from the bounds per client address.
    pub trusted_proxies: crate::config::route::proxies::TrustedProxies,
    pub max_connections: usize,
    /// None: the CPUs, at most `route::settings::DEFAULT_MAX_THREADS`.
    pub threads: Option<usize>,
    pub shutdown_grace: Duration,
    /// Where HAProxy's agent checks are answered (docs/fleet.md); None: nowhere.
    pub agent_listen: Option<SocketAddr>,
    /// Balancers that each apply the agent's `maxconn` on their own.
    pub balancers: u32,
    /// Longest a drain (SIGTERM, or a model drained) waits for the balancers before refusing.
    pub drain_timeout: Duration,
    /// How long a drain waits with no new request, once every balancer was told.
    pub drain_grace: Duration,
    /// Bearer tokens; empty: no authentication.
    pub api_keys: Vec<String>,
    /// Another name → a configured model.
    pub aliases: BTreeMap<String, String>,
    /// `[route.model.NAME]`, by model name (every name is a configured model).
    pub models: BTreeMap<String, RouteModelConfig>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteModelConfig {
    pub max_queue: Option<usize>,
    /// What `/m/{model}/…` passes; None: the inference paths.
    pub paths: Option<crate::config::route::paths::PathRules>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub ports: PortRange,
    pub tick: Duration,
    pub metrics: Option<SocketAddr>,
    pub shutdown_timeout: Duration,
    /// tracing filter directive used when RUST_LOG is not set, e.g. "info" or "hearth=debug".
    pub log_level: String,
    /// What sleeping replicas may hold in host RAM, all together (bytes); None: not bounded.
    pub host_memory: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    User(String),
    /// written "@group" in the file
    Group(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessConfig {
    pub admins: Vec<Principal>,
    pub reporters: Vec<Principal>,
    pub readers: Vec<Principal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBackend {
    Auto,
    Nvml,
    Static,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GpusConfig {
    pub backend: GpuBackend,
    pub devices: Vec<StaticDevice>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StaticDevice {
    pub uuid: String,
    pub name: String,
    pub memory: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    Pack,
    Spread,
}

/// How a replica's `CUDA_VISIBLE_DEVICES` names its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceNaming {
    /// NVML indices, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that CUDA numbers devices the way
    /// NVML does (PCI bus order). What vLLM needs (it reads each entry with `int()`); cannot
    /// name a MIG instance.
    Index,
    /// Device UUIDs (`GPU-…`, `MIG-…`): unambiguous, and the only way to name MIG instances.
    Uuid,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    /// What its replicas are made from. Everything else here applies to running replicas live.
    pub launch: LaunchSpec,
    /// A replica of this model starts alone on its GPUs: it is not started on a device where
    /// another replica is starting or stopping, and while it starts nothing else is started
    /// there (servers such as vLLM size their KV cache from the device's free memory once, at
    /// start).
    pub start_alone: bool,
    pub priority: i32,
    /// Requests one replica serves at once (`slots`, default 1): the front door never sends
    /// more. Live: a change reaches the router through `watch`, replicas keep running.
    pub slots: u32,
    /// Whether the file gives `slots` (else `slots` is the default): `hearth simulate` sizes
    /// its replicas by the model's slots only where they are given.
    pub slots_declared: bool,
    pub stop_grace: Duration,
    pub liveness: Option<LivenessConfig>,
    pub signal: Option<SignalConfig>,
    pub scaling: ScalingConfig,
    /// `[model.sleep]`: its replicas can sleep (a tier between warm and stopped).
    pub sleep: Option<sleep::SleepConfig>,
    /// `pin = true`: its replicas are never reclaimed nor put to sleep for another model (and a
    /// pinned model has no `[model.sleep]`).
    pub pin: bool,
}

/// What makes a replica what it is: a change rolls the model over; anything added here takes
/// part automatically. Two specs are the same launch exactly when they are `==`, field by field;
/// nothing hand-picks the fields, and nothing hashes them for identity.
///
/// It is persisted (serde) to be compared with a later configuration, possibly by a later
/// binary. The rule for every field, here and in [`WarmupConfig`]: one that the file may leave
/// out reads as the configuration's own default when it is missing (`#[serde(default = …)]`
/// from `config::defaults`, which validation uses too), so a field added later, left at its
/// default, never makes an older persisted spec differ. A field the reader does not know is an
/// error, not ignored: a spec this binary cannot compare in full is not the same launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    #[serde(default = "defaults::version")]
    pub version: String,
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default = "defaults::gpus")]
    pub gpus: u32,
    /// None: the replica takes whole devices.
    #[serde(default)]
    pub gpu_memory: Option<u64>,
    #[serde(default = "defaults::placement")]
    pub placement: Placement,
    /// How `CUDA_VISIBLE_DEVICES` names the replica's devices.
    #[serde(default = "defaults::device_naming")]
    pub device_naming: DeviceNaming,
    #[serde(default)]
    pub prefetch: Vec<String>,
    pub warmup: WarmupConfig,
}

/// Part of [`LaunchSpec`], under its rule for defaults.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupConfig {
    #[serde(default = "defaults::warmup_method")]
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "defaults::warmup_expect_status")]
    pub expect_status: u16,
    #[serde(default)]
    pub expect_body: Option<String>,
    #[serde(
        with = "crate::units::duration_text",
        default = "defaults::warmup_timeout"
    )]
    pub timeout: Duration,
    #[serde(
        with = "crate::units::duration_text",
        default = "defaults::warmup_startup_timeout"
    )]
    pub startup_timeout: Duration,
    #[serde(
        with = "crate::units::duration_text",
        default = "defaults::warmup_recheck"
    )]
    pub recheck: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LivenessConfig {
    pub url: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeFormat {
    Vllm,
    Llamacpp,
    Tgi,
    Triton,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SignalConfig {
    pub scrape: String,
    pub format: ScrapeFormat,
    pub interval: Duration,
    /// Triton: the models whose request counters count (the ones clients call: an ensemble,
    /// not its steps); empty: every model.
    pub models: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmPool {
    Fixed(u32),
    Auto,
}

/// `down_stabilization` and `down_step`: the policy's own rule, or an operator's limit on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownLimit {
    /// The policy decides how long to hold and how far to step (`"auto"`, the default).
    Auto,
    /// Never sooner than this (the policy may hold longer).
    AtLeast(Duration),
}

impl DownLimit {
    /// The least the operator imposes: nothing for `Auto`.
    pub fn floor(self) -> Duration {
        match self {
            DownLimit::Auto => Duration::ZERO,
            DownLimit::AtLeast(d) => d,
        }
    }
}

impl std::fmt::Display for DownLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownLimit::Auto => f.write_str("auto"),
            DownLimit::AtLeast(d) => f.write_str(&crate::units::format_duration(*d)),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScalingConfig {
    pub min: u32,
    pub max: u32,
    pub warm_pool: WarmPool,
    pub target_wait: Duration,
    pub down_below: f64,
    /// Calm this long at least before a step down.
    pub down_stabilization: DownLimit,
    /// At most one replica removed per this long.
    pub down_step: DownLimit,
    pub max_up_step: u32,
    /// Foresee bursts that recur (`forecast`; off by default until it misses no more on the
    /// held-out family): their capacity is ready before them and released between them.
    pub forecast: bool,
    pub idle_to_zero: Duration,
    pub drain_timeout: Duration,
    pub stale_after: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(
                f,
                "{}:{}: {}: {}",
                self.file.display(),
                line,
                self.key,
                self.message
            ),
            None => write!(f, "{}: {}: {}", self.file.display(), self.key, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// How much [`Config::parse_with`] and [`Config::parse_on`] check; each depth includes the ones
/// before it (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Checks {
    /// The file's syntax, keys, types and values.
    Values,
    /// Also `{port}` wiring and the fit of `min` replicas on static GPUs.
    Deployment,
    /// Also that each command's program exists here and is executable.
    Host,
}

/// What only the host can say about a model's replicas: whether their program is there, and
/// whether the account they run as can reach what they must. The shell answers (its `config`
/// and `agent::reach`), which can look at files and accounts; the configuration only asks, at
/// [`Checks::Host`] through [`Config::parse_on`], so that what it refuses is named by file, line
/// and key like any other error.
pub trait Reach {
    /// Why the daemon could not find and execute `program` as the spawn will look it up (a path
    /// as it is, a bare name on `search`, the PATH the replicas are given; None: the daemon's),
    /// if it could not.
    fn lookup(&self, program: &str, search: Option<&str>) -> Option<String>;
    /// Why `model`'s replicas could not execute `program` (a path, or a name looked up on
    /// `search`, the PATH they are given; None: the daemon's), if they could not.
    fn program(&self, model: &ModelConfig, program: &str, search: Option<&str>) -> Option<String>;
    /// Why they could not connect to the control socket at `socket`, if they could not.
    fn socket(&self, model: &ModelConfig, socket: &Path) -> Option<String>;
}

impl Config {
    /// Parse configuration `text` and check its values ([`Checks::Values`]); `path` is only used
    /// for messages and `Config::path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::parse_with(text, path, Checks::Values)
    }

    /// Parse configuration `text` and check it to depth `checks`. [`Checks::Host`] needs the
    /// host's answers: without them ([`Config::parse_on`]) it checks as much as `Deployment`.
    pub fn parse_with(text: &str, path: &Path, checks: Checks) -> Result<Config, ConfigError> {
        let raw = raw::read(text, path)?;
        validate::Cx::new(text, path, checks).config(raw)
    }

    /// Parse configuration `text` and check it to depth `checks`, asking `reach` what only the
    /// host can say at [`Checks::Host`]: whether each model's program is there, and whether its
    /// replicas' account can reach it and the control socket.
    pub fn parse_on(
        text: &str,
        path: &Path,
        checks: Checks,
        reach: &dyn Reach,
    ) -> Result<Config, ConfigError> {
        let raw = raw::read(text, path)?;
        validate::Cx::new(text, path, checks)
            .with_reach(reach)
            .config(raw)
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }
}
