//! TOML configuration: schema, defaults, validation. Parsed and validated completely before the
//! runtime starts; every error names the file, the line and the key.
//!
//! PUBLIC API (other modules rely on exactly these names):
//!   Config::load(path: &Path) -> Result<Config, ConfigError>
//!   Config::parse(text: &str, path: &Path) -> Result<Config, ConfigError>
//!   ConfigError { file, line: Option<usize>, key: String, message: String } with Display
//!   "FILE:LINE: KEY: MESSAGE"
//!   expand(template: &str, vars: &Placeholders) -> String

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::units::{parse_duration, parse_size};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file this configuration was read from (for messages).
    pub path: PathBuf,
    pub daemon: DaemonConfig,
    pub access: AccessConfig,
    pub gpus: GpusConfig,
    pub models: Vec<ModelConfig>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Pack,
    Spread,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    pub version: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub gpus: u32,
    /// None: the replica takes whole devices.
    pub gpu_memory: Option<u64>,
    pub placement: Placement,
    pub priority: i32,
    pub stop_grace: Duration,
    pub prefetch: Vec<String>,
    pub warmup: WarmupConfig,
    pub liveness: Option<LivenessConfig>,
    pub signal: Option<SignalConfig>,
    pub scaling: ScalingConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WarmupConfig {
    pub method: String,
    pub url: String,
    pub body: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub expect_status: u16,
    pub expect_body: Option<String>,
    pub timeout: Duration,
    pub startup_timeout: Duration,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmPool {
    Fixed(u32),
    Auto,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScalingConfig {
    pub min: u32,
    pub max: u32,
    pub warm_pool: WarmPool,
    pub target_wait: Duration,
    pub down_below: f64,
    pub down_stabilization: Duration,
    pub down_step: Duration,
    pub max_up_step: u32,
    pub idle_to_zero: Duration,
    pub drain_timeout: Duration,
    pub stale_after: Duration,
}

/// Values for `{port}`, `{replica}`, `{model}`, `{gpus}`.
#[derive(Debug, Clone, Default)]
pub struct Placeholders {
    pub port: u16,
    pub replica: String,
    pub model: String,
    /// comma-separated device UUIDs, empty for CPU-only replicas
    pub gpus: String,
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

impl Config {
    /// Read and validate the configuration file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: None,
            key: "-".to_string(),
            message: format!("cannot read configuration file: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Parse and validate configuration `text`; `path` is only used for messages and `Config::path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let index = match toml::de::DeTable::parse(text) {
            Ok(doc) => SpanIndex::build(text, doc),
            Err(e) => {
                let line = e.span().map(|s| line_at(text, s.start));
                return Err(ConfigError {
                    file: path.to_path_buf(),
                    line,
                    key: "-".to_string(),
                    message: format!("TOML syntax error: {}", e.message().trim()),
                });
            }
        };
        let cx = Cx { file: path, index };
        let raw: RawConfig = toml::from_str(text).map_err(|e| cx.serde_error(&e))?;
        cx.convert(raw)
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }
}

/// The placeholders that exist in templates.
const PLACEHOLDERS: [&str; 4] = ["port", "replica", "model", "gpus"];

/// Replace `{port}`, `{replica}`, `{model}` and `{gpus}` in `template`. Anything else, including
/// JSON braces and unknown `{names}`, is left as written.
pub fn expand(template: &str, vars: &Placeholders) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(pos) = rest.find('{') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        match placeholder_at(after) {
            Some((name, len)) if PLACEHOLDERS.contains(&name) => {
                match name {
                    "port" => out.push_str(&vars.port.to_string()),
                    "replica" => out.push_str(&vars.replica),
                    "model" => out.push_str(&vars.model),
                    _ => out.push_str(&vars.gpus),
                }
                rest = &after[len..];
            }
            _ => {
                out.push('{');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `s` starts with `{identifier}`, the identifier and the length of the whole placeholder.
fn placeholder_at(s: &str) -> Option<(&str, usize)> {
    let body = s.strip_prefix('{')?;
    let end = body.find('}')?;
    let name = &body[..end];
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first.is_ascii_alphabetic() || first == '_')
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return None;
    }
    Some((name, end + 2))
}

/// Every `{identifier}` in `template`, known or not.
fn placeholders_in(template: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(pos) = rest.find('{') {
        let after = &rest[pos..];
        match placeholder_at(after) {
            Some((name, len)) => {
                found.push(name);
                rest = &after[len..];
            }
            None => rest = &after[1..],
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Raw (serde) form of the file: exactly the keys of the file, nothing interpreted yet.

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    daemon: RawDaemon,
    #[serde(default)]
    access: RawAccess,
    #[serde(default)]
    gpus: RawGpus,
    #[serde(default)]
    model: Vec<RawModel>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    socket: Option<String>,
    state_dir: Option<String>,
    ports: Option<String>,
    tick: Option<String>,
    metrics: Option<String>,
    shutdown_timeout: Option<String>,
    log_level: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAccess {
    admins: Option<Vec<String>>,
    reporters: Option<Vec<String>>,
    readers: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGpus {
    backend: Option<RawBackend>,
    #[serde(default)]
    device: Vec<RawDevice>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawBackend {
    Auto,
    Nvml,
    Static,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    uuid: String,
    memory: String,
    name: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawPlacement {
    Pack,
    Spread,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    version: Option<String>,
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    user: Option<String>,
    gpus: Option<u32>,
    gpu_memory: Option<String>,
    placement: Option<RawPlacement>,
    priority: Option<i32>,
    stop_grace: Option<String>,
    #[serde(default)]
    prefetch: Vec<String>,
    warmup: RawWarmup,
    liveness: Option<RawLiveness>,
    signal: Option<RawSignal>,
    #[serde(default)]
    scaling: RawScaling,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWarmup {
    method: Option<String>,
    url: String,
    body: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    expect_status: Option<i64>,
    expect_body: Option<String>,
    timeout: Option<String>,
    startup_timeout: Option<String>,
    recheck: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLiveness {
    url: String,
    interval: Option<String>,
    timeout: Option<String>,
    failures: Option<u32>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawFormat {
    Vllm,
    Llamacpp,
    Tgi,
    Triton,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSignal {
    scrape: String,
    format: RawFormat,
    interval: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawScaling {
    min: Option<u32>,
    max: Option<u32>,
    warm_pool: Option<toml::Value>,
    target_wait: Option<String>,
    down_below: Option<toml::Value>,
    down_stabilization: Option<String>,
    down_step: Option<String>,
    max_up_step: Option<u32>,
    idle_to_zero: Option<String>,
    drain_timeout: Option<String>,
    stale_after: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Key paths and their positions in the text.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// `base` extended by one key.
fn key(base: &[Seg], k: &str) -> Vec<Seg> {
    let mut p = base.to_vec();
    p.push(Seg::Key(k.to_string()));
    p
}

/// `base` extended by one array index.
fn idx(base: &[Seg], i: usize) -> Vec<Seg> {
    let mut p = base.to_vec();
    p.push(Seg::Index(i));
    p
}

/// 1-based line of byte `offset` in `text`.
fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

struct Node {
    path: Vec<Seg>,
    /// Span of the key naming this node (absent for array elements).
    key_span: Option<Range<usize>>,
    value_span: Range<usize>,
    key_line: Option<usize>,
    value_line: usize,
}

/// Every key and array element of the document, with its path and position.
struct SpanIndex {
    nodes: Vec<Node>,
}

impl SpanIndex {
    fn build(text: &str, doc: toml::Spanned<toml::de::DeTable<'_>>) -> SpanIndex {
        let mut index = SpanIndex { nodes: Vec::new() };
        index.walk_table(text, doc.get_ref(), &[]);
        index
    }

    fn walk_table(&mut self, text: &str, table: &toml::de::DeTable<'_>, base: &[Seg]) {
        for (k, v) in table.iter() {
            let path = key(base, k.get_ref());
            self.nodes.push(Node {
                path: path.clone(),
                key_span: Some(k.span()),
                value_span: v.span(),
                key_line: Some(line_at(text, k.span().start)),
                value_line: line_at(text, v.span().start),
            });
            self.walk_value(text, v.get_ref(), &path);
        }
    }

    fn walk_value(&mut self, text: &str, value: &toml::de::DeValue<'_>, base: &[Seg]) {
        match value {
            toml::de::DeValue::Table(t) => self.walk_table(text, t, base),
            toml::de::DeValue::Array(a) => {
                for (i, e) in a.iter().enumerate() {
                    let path = idx(base, i);
                    self.nodes.push(Node {
                        path: path.clone(),
                        key_span: None,
                        value_span: e.span(),
                        key_line: None,
                        value_line: line_at(text, e.span().start),
                    });
                    self.walk_value(text, e.get_ref(), &path);
                }
            }
            _ => {}
        }
    }

    /// Line of the key at `path` (the element itself for array elements); if the path is not in
    /// the text (a default), the line of its deepest ancestor that is.
    fn line_of(&self, path: &[Seg]) -> Option<usize> {
        (0..=path.len()).rev().find_map(|n| {
            let prefix = &path[..n];
            self.nodes
                .iter()
                .find(|node| node.path == prefix)
                .map(|node| node.key_line.unwrap_or(node.value_line))
        })
    }

    /// The path of the innermost key or element whose key or value covers `span`.
    fn path_at(&self, span: &Range<usize>) -> Option<(&[Seg], usize)> {
        let covers =
            |s: &Range<usize>| s.start <= span.start && span.start < s.end.max(s.start + 1);
        let mut best: Option<(&Node, usize, bool)> = None;
        for node in &self.nodes {
            for (s, is_key) in [
                (node.key_span.as_ref(), true),
                (Some(&node.value_span), false),
            ] {
                let Some(s) = s else { continue };
                if !covers(s) {
                    continue;
                }
                let len = s.end - s.start;
                let better = match best {
                    None => true,
                    Some((b, blen, _)) => {
                        len < blen || (len == blen && node.path.len() > b.path.len())
                    }
                };
                if better {
                    best = Some((node, len, is_key));
                }
            }
        }
        best.map(|(n, _, is_key)| {
            let line = if is_key {
                n.key_line.unwrap_or(n.value_line)
            } else {
                n.value_line
            };
            (n.path.as_slice(), line)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion and validation.

struct Cx<'a> {
    file: &'a Path,
    index: SpanIndex,
}

type Res<T> = Result<T, ConfigError>;

/// The name between the first pair of backticks in a serde message.
fn backticked(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

impl Cx<'_> {
    fn err(&self, path: &[Seg], message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line: self.index.line_of(path),
            key: render(path),
            message: message.into(),
        }
    }

    fn serde_error(&self, e: &toml::de::Error) -> ConfigError {
        let message = e.message().trim().to_string();
        let found = e.span().and_then(|s| self.index.path_at(&s));
        let (mut path, line) = match found {
            Some((p, line)) => (p.to_vec(), Some(line)),
            None => (Vec::new(), None),
        };
        if message.starts_with("missing field") {
            if let Some(field) = backticked(&message) {
                path.push(Seg::Key(field.to_string()));
            }
        }
        let message = if message.starts_with("unknown field") {
            format!("unknown key ({message})")
        } else if let Some(pos) = message.find("struct Raw") {
            // serde names our private structs; say what the file needs instead
            match message.strip_prefix("invalid type: ") {
                Some(_) => format!("{}a table", &message[..pos]),
                None => "invalid type, expected a table".to_string(),
            }
        } else if message == "wanted string or table" {
            "invalid type, expected a string".to_string()
        } else {
            message
        };
        ConfigError {
            file: self.file.to_path_buf(),
            line,
            key: if path.is_empty() {
                "-".to_string()
            } else {
                render(&path)
            },
            message,
        }
    }

    fn duration(&self, path: &[Seg], raw: Option<&String>, default: Duration) -> Res<Duration> {
        match raw {
            None => Ok(default),
            Some(s) => parse_duration(s).map_err(|m| self.err(path, m)),
        }
    }

    /// A duration that must not be zero.
    fn nonzero_duration(
        &self,
        path: &[Seg],
        raw: Option<&String>,
        default: Duration,
    ) -> Res<Duration> {
        let d = self.duration(path, raw, default)?;
        if d.is_zero() {
            return Err(self.err(path, "must be greater than 0"));
        }
        Ok(d)
    }

    fn size(&self, path: &[Seg], raw: &str) -> Res<u64> {
        let bytes = parse_size(raw).map_err(|m| self.err(path, m))?;
        if bytes == 0 {
            return Err(self.err(path, "must be greater than 0"));
        }
        Ok(bytes)
    }

    /// Placeholders in `template` must be known ones.
    fn template(&self, path: &[Seg], template: &str) -> Res<()> {
        for name in placeholders_in(template) {
            if !PLACEHOLDERS.contains(&name) {
                return Err(self.err(
                    path,
                    format!(
                        "unknown placeholder {{{name}}} (known: {{port}}, {{replica}}, {{model}}, {{gpus}})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A URL template: known placeholders and an http:// scheme.
    fn url(&self, path: &[Seg], template: &str) -> Res<()> {
        self.template(path, template)?;
        if !template.starts_with("http://") || template.len() == "http://".len() {
            return Err(self.err(
                path,
                format!("{template:?} is not an http:// URL (e.g. \"http://127.0.0.1:{{port}}/health\")"),
            ));
        }
        Ok(())
    }

    fn principals(
        &self,
        path: &[Seg],
        raw: Option<Vec<String>>,
        default: &[&str],
    ) -> Res<Vec<Principal>> {
        let names = raw.unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect());
        names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let here = idx(path, i);
                let principal = match name.strip_prefix('@') {
                    Some(group) => Principal::Group(group.to_string()),
                    None => Principal::User(name.clone()),
                };
                match &principal {
                    Principal::Group(g) if g.trim().is_empty() => {
                        Err(self.err(&here, "empty group name after \"@\""))
                    }
                    Principal::User(u) if u.trim().is_empty() => {
                        Err(self.err(&here, "empty user name"))
                    }
                    _ => Ok(principal),
                }
            })
            .collect()
    }

    fn convert(&self, raw: RawConfig) -> Res<Config> {
        let daemon = self.daemon(raw.daemon)?;
        let access = self.access(raw.access)?;
        let gpus = self.gpus(raw.gpus)?;
        let mut models: Vec<ModelConfig> = Vec::with_capacity(raw.model.len());
        for (i, m) in raw.model.into_iter().enumerate() {
            let path = idx(&[Seg::Key("model".into())], i);
            let model = self.model(&path, m)?;
            if models.iter().any(|other| other.name == model.name) {
                return Err(self.err(
                    &key(&path, "name"),
                    format!("duplicate model name {:?}", model.name),
                ));
            }
            models.push(model);
        }
        let needed: u64 = models.iter().map(|m| u64::from(m.scaling.max)).sum();
        let available = u64::from(daemon.ports.last) - u64::from(daemon.ports.first) + 1;
        if needed > available {
            return Err(self.err(
                &[Seg::Key("daemon".into()), Seg::Key("ports".into())],
                format!(
                    "port range {}-{} has {available} ports but the models' scaling.max add up to \
                     {needed}; at least {needed} ports are needed",
                    daemon.ports.first, daemon.ports.last
                ),
            ));
        }
        Ok(Config {
            path: self.file.to_path_buf(),
            daemon,
            access,
            gpus,
            models,
        })
    }

    fn daemon(&self, raw: RawDaemon) -> Res<DaemonConfig> {
        let p = [Seg::Key("daemon".into())];
        let ports = match &raw.ports {
            None => PortRange {
                first: 20000,
                last: 20999,
            },
            Some(s) => parse_ports(s).map_err(|m| self.err(&key(&p, "ports"), m))?,
        };
        let metrics = match &raw.metrics {
            None => None,
            Some(s) => Some(s.trim().parse::<SocketAddr>().map_err(|_| {
                self.err(
                    &key(&p, "metrics"),
                    format!(
                        "{s:?} is not a socket address; expected IP:PORT, e.g. \"127.0.0.1:9464\""
                    ),
                )
            })?),
        };
        let log_level = raw.log_level.unwrap_or_else(|| "info".to_string());
        if log_level.trim().is_empty() {
            return Err(self.err(&key(&p, "log_level"), "must not be empty"));
        }
        let socket = raw
            .socket
            .unwrap_or_else(|| "/run/hearth/hearth.sock".into());
        if socket.is_empty() {
            return Err(self.err(&key(&p, "socket"), "must not be empty"));
        }
        let state_dir = raw.state_dir.unwrap_or_else(|| "/var/lib/hearth".into());
        if state_dir.is_empty() {
            return Err(self.err(&key(&p, "state_dir"), "must not be empty"));
        }
        Ok(DaemonConfig {
            socket: PathBuf::from(socket),
            state_dir: PathBuf::from(state_dir),
            ports,
            tick: self.nonzero_duration(
                &key(&p, "tick"),
                raw.tick.as_ref(),
                Duration::from_millis(250),
            )?,
            metrics,
            shutdown_timeout: self.duration(
                &key(&p, "shutdown_timeout"),
                raw.shutdown_timeout.as_ref(),
                Duration::from_secs(60),
            )?,
            log_level,
        })
    }

    fn access(&self, raw: RawAccess) -> Res<AccessConfig> {
        let p = [Seg::Key("access".into())];
        Ok(AccessConfig {
            admins: self.principals(&key(&p, "admins"), raw.admins, &["root", "@hearth-admin"])?,
            reporters: self.principals(
                &key(&p, "reporters"),
                raw.reporters,
                &["@hearth-report"],
            )?,
            readers: self.principals(&key(&p, "readers"), raw.readers, &["@hearth"])?,
        })
    }

    fn gpus(&self, raw: RawGpus) -> Res<GpusConfig> {
        let p = [Seg::Key("gpus".into())];
        let backend = match raw.backend.unwrap_or(RawBackend::Auto) {
            RawBackend::Auto => GpuBackend::Auto,
            RawBackend::Nvml => GpuBackend::Nvml,
            RawBackend::Static => GpuBackend::Static,
        };
        let mut devices: Vec<StaticDevice> = Vec::with_capacity(raw.device.len());
        for (i, d) in raw.device.into_iter().enumerate() {
            let here = idx(&key(&p, "device"), i);
            if d.uuid.trim().is_empty() {
                return Err(self.err(&key(&here, "uuid"), "must not be empty"));
            }
            if devices.iter().any(|o| o.uuid == d.uuid) {
                return Err(self.err(
                    &key(&here, "uuid"),
                    format!("duplicate device uuid {:?}", d.uuid),
                ));
            }
            let memory = self.size(&key(&here, "memory"), &d.memory)?;
            devices.push(StaticDevice {
                uuid: d.uuid,
                name: d.name.unwrap_or_else(|| "static device".to_string()),
                memory,
            });
        }
        if backend == GpuBackend::Static && devices.is_empty() {
            return Err(self.err(
                &key(&p, "backend"),
                "backend \"static\" needs at least one [[gpus.device]]",
            ));
        }
        Ok(GpusConfig { backend, devices })
    }

    fn model(&self, p: &[Seg], raw: RawModel) -> Res<ModelConfig> {
        if raw.name.is_empty() {
            return Err(self.err(&key(p, "name"), "model name must not be empty"));
        }
        if let Some(c) = raw
            .name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(self.err(
                &key(p, "name"),
                format!(
                    "model name {:?} contains {c:?}; only A-Z, a-z, 0-9, '.', '_' and '-' are allowed",
                    raw.name
                ),
            ));
        }
        let version = raw.version.unwrap_or_else(|| "1".to_string());
        if version.is_empty() {
            return Err(self.err(&key(p, "version"), "must not be empty"));
        }
        if raw.command.is_empty() {
            return Err(self.err(&key(p, "command"), "command must not be empty"));
        }
        if raw.command[0].is_empty() {
            return Err(self.err(
                &idx(&key(p, "command"), 0),
                "the program name must not be empty",
            ));
        }
        for (i, arg) in raw.command.iter().enumerate() {
            self.template(&idx(&key(p, "command"), i), arg)?;
        }
        for (name, value) in &raw.env {
            let here = key(&key(p, "env"), name);
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(self.err(&here, "invalid environment variable name"));
            }
            self.template(&here, value)?;
        }
        if let Some(user) = &raw.user {
            if user.trim().is_empty() {
                return Err(self.err(&key(p, "user"), "user name must not be empty"));
            }
        }
        let gpu_memory = match &raw.gpu_memory {
            None => None,
            Some(s) => Some(self.size(&key(p, "gpu_memory"), s)?),
        };
        let placement = match raw.placement.unwrap_or(RawPlacement::Pack) {
            RawPlacement::Pack => Placement::Pack,
            RawPlacement::Spread => Placement::Spread,
        };
        let stop_grace = self.duration(
            &key(p, "stop_grace"),
            raw.stop_grace.as_ref(),
            Duration::from_secs(30),
        )?;
        let warmup = self.warmup(&key(p, "warmup"), raw.warmup)?;
        let liveness = match raw.liveness {
            None => None,
            Some(l) => Some(self.liveness(&key(p, "liveness"), l)?),
        };
        let signal = match raw.signal {
            None => None,
            Some(s) => Some(self.signal(&key(p, "signal"), s)?),
        };
        let scaling = self.scaling(&key(p, "scaling"), raw.scaling)?;
        Ok(ModelConfig {
            name: raw.name,
            version,
            command: raw.command,
            env: raw.env,
            user: raw.user,
            gpus: raw.gpus.unwrap_or(1),
            gpu_memory,
            placement,
            priority: raw.priority.unwrap_or(0),
            stop_grace,
            prefetch: raw.prefetch,
            warmup,
            liveness,
            signal,
            scaling,
        })
    }

    fn warmup(&self, p: &[Seg], raw: RawWarmup) -> Res<WarmupConfig> {
        let method = raw.method.unwrap_or_else(|| "POST".to_string());
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(self.err(
                &key(p, "method"),
                format!("{method:?} is not an HTTP method (e.g. \"POST\", \"GET\")"),
            ));
        }
        self.url(&key(p, "url"), &raw.url)?;
        if let Some(body) = &raw.body {
            self.template(&key(p, "body"), body)?;
        }
        for (name, value) in &raw.headers {
            let here = key(&key(p, "headers"), name);
            if name.is_empty() {
                return Err(self.err(&here, "header name must not be empty"));
            }
            self.template(&here, value)?;
        }
        let expect_status = match raw.expect_status {
            None => 200,
            Some(s) if (100..=599).contains(&s) => s as u16,
            Some(s) => {
                return Err(self.err(
                    &key(p, "expect_status"),
                    format!("{s} is not an HTTP status; expected 100..=599"),
                ))
            }
        };
        Ok(WarmupConfig {
            method,
            url: raw.url,
            body: raw.body,
            headers: raw.headers,
            expect_status,
            expect_body: raw.expect_body,
            timeout: self.nonzero_duration(
                &key(p, "timeout"),
                raw.timeout.as_ref(),
                Duration::from_secs(30),
            )?,
            startup_timeout: self.nonzero_duration(
                &key(p, "startup_timeout"),
                raw.startup_timeout.as_ref(),
                Duration::from_secs(600),
            )?,
            recheck: self.nonzero_duration(
                &key(p, "recheck"),
                raw.recheck.as_ref(),
                Duration::from_secs(300),
            )?,
        })
    }

    fn liveness(&self, p: &[Seg], raw: RawLiveness) -> Res<LivenessConfig> {
        self.url(&key(p, "url"), &raw.url)?;
        let failures = raw.failures.unwrap_or(3);
        if failures == 0 {
            return Err(self.err(&key(p, "failures"), "must be at least 1"));
        }
        Ok(LivenessConfig {
            url: raw.url,
            interval: self.nonzero_duration(
                &key(p, "interval"),
                raw.interval.as_ref(),
                Duration::from_secs(10),
            )?,
            timeout: self.nonzero_duration(
                &key(p, "timeout"),
                raw.timeout.as_ref(),
                Duration::from_secs(5),
            )?,
            failures,
        })
    }

    fn signal(&self, p: &[Seg], raw: RawSignal) -> Res<SignalConfig> {
        self.url(&key(p, "scrape"), &raw.scrape)?;
        let format = match raw.format {
            RawFormat::Vllm => ScrapeFormat::Vllm,
            RawFormat::Llamacpp => ScrapeFormat::Llamacpp,
            RawFormat::Tgi => ScrapeFormat::Tgi,
            RawFormat::Triton => ScrapeFormat::Triton,
        };
        Ok(SignalConfig {
            scrape: raw.scrape,
            format,
            interval: self.nonzero_duration(
                &key(p, "interval"),
                raw.interval.as_ref(),
                Duration::from_secs(1),
            )?,
        })
    }

    fn scaling(&self, p: &[Seg], raw: RawScaling) -> Res<ScalingConfig> {
        let min = raw.min.unwrap_or(1);
        let max = raw.max.unwrap_or(8);
        if max == 0 {
            return Err(self.err(&key(p, "max"), "must be at least 1"));
        }
        if min > max {
            return Err(self.err(
                &key(p, "min"),
                format!("min ({min}) is larger than max ({max})"),
            ));
        }
        let warm_pool = match &raw.warm_pool {
            None => WarmPool::Fixed(0),
            Some(toml::Value::String(s)) if s == "auto" => WarmPool::Auto,
            Some(toml::Value::Integer(n)) if (0..=i64::from(u32::MAX)).contains(n) => {
                WarmPool::Fixed(*n as u32)
            }
            Some(other) => {
                return Err(self.err(
                    &key(p, "warm_pool"),
                    format!("expected a non-negative integer or \"auto\", found {other}"),
                ))
            }
        };
        let down_below = match &raw.down_below {
            None => 0.5,
            Some(toml::Value::Float(f)) => *f,
            Some(toml::Value::Integer(n)) => *n as f64,
            Some(other) => {
                return Err(self.err(
                    &key(p, "down_below"),
                    format!("expected a number between 0 and 1, found {other}"),
                ))
            }
        };
        if !(down_below > 0.0 && down_below < 1.0) {
            return Err(self.err(
                &key(p, "down_below"),
                format!("{down_below} is out of range; expected a number strictly between 0 and 1"),
            ));
        }
        let max_up_step = raw.max_up_step.unwrap_or(4);
        if max_up_step == 0 {
            return Err(self.err(&key(p, "max_up_step"), "must be at least 1"));
        }
        let d = |k: &str, v: &Option<String>, default: u64| {
            self.duration(&key(p, k), v.as_ref(), Duration::from_secs(default))
        };
        Ok(ScalingConfig {
            min,
            max,
            warm_pool,
            target_wait: self.nonzero_duration(
                &key(p, "target_wait"),
                raw.target_wait.as_ref(),
                Duration::from_millis(500),
            )?,
            down_below,
            down_stabilization: d("down_stabilization", &raw.down_stabilization, 300)?,
            down_step: d("down_step", &raw.down_step, 120)?,
            max_up_step,
            idle_to_zero: d("idle_to_zero", &raw.idle_to_zero, 1800)?,
            drain_timeout: d("drain_timeout", &raw.drain_timeout, 300)?,
            stale_after: self.nonzero_duration(
                &key(p, "stale_after"),
                raw.stale_after.as_ref(),
                Duration::from_secs(5),
            )?,
        })
    }
}

/// "A-B" with 1 <= A <= B <= 65535.
fn parse_ports(s: &str) -> Result<PortRange, String> {
    let form = "expected \"FIRST-LAST\", e.g. \"20000-20999\", with 1 <= FIRST <= LAST <= 65535";
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("invalid port range {s:?}; {form}"))?;
    let first: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("invalid port range {s:?}: bad first port {a:?}; {form}"))?;
    let last: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("invalid port range {s:?}: bad last port {b:?}; {form}"))?;
    if first == 0 {
        return Err(format!(
            "invalid port range {s:?}: port 0 is not allowed; {form}"
        ));
    }
    if first > last {
        return Err(format!(
            "invalid port range {s:?}: first port is above the last; {form}"
        ));
    }
    Ok(PortRange { first, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example from DESIGN.md "Configuration", verbatim.
    const EXAMPLE: &str = r#"[daemon]
socket = "/run/hearth/hearth.sock"   # control and report socket
state_dir = "/var/lib/hearth"         # runtime overrides that survive restarts
ports = "20000-20999"                 # {port} handed to replicas
tick = "250ms"
metrics = "127.0.0.1:9464"            # Prometheus exposition; omit to disable
shutdown_timeout = "60s"

[access]                              # who may do what on the socket (SO_PEERCRED)
admins = ["root", "@hearth-admin"]    # every op
reporters = ["@hearth-report"]        # report + read ops; replicas may always report for themselves
readers = ["@hearth"]                 # status, watch, gpus, version

[gpus]
backend = "auto"                      # auto | nvml | static
[[gpus.device]]                       # used by static, and by auto when NVML is absent
uuid = "GPU-static-0"
memory = "80GiB"

[[model]]
name = "llama-8b"
version = "1"                         # a change rolls replicas over
command = ["vllm", "serve", "/models/llama-8b", "--port", "{port}"]
env = { HF_HOME = "/models/cache" }
user = "hearth-model"                 # optional; drop privileges before exec
gpus = 1
gpu_memory = "40GiB"
placement = "pack"                    # pack | spread
priority = 0
stop_grace = "30s"

[model.warmup]                        # readiness = a real inference
method = "POST"
url = "http://127.0.0.1:{port}/v1/completions"
body = '{"model":"llama-8b","prompt":"Hello","max_tokens":4}'
headers = { "content-type" = "application/json" }
expect_status = 200
expect_body = "choices"               # substring the answer must contain
timeout = "30s"                       # one attempt
startup_timeout = "10m"               # give up, kill, back off, retry
recheck = "5m"                        # re-verify warm replicas

[model.liveness]
url = "http://127.0.0.1:{port}/health"
interval = "10s"
timeout = "5s"
failures = 3

[model.signal]                        # optional: for servers that cannot report on the socket
scrape = "http://127.0.0.1:{port}/metrics"   # polled on every routed replica
format = "llamacpp"                   # vllm | llamacpp | tgi | triton
interval = "1s"

[model.scaling]
min = 1
max = 8
warm_pool = 1                         # or "auto"
target_wait = "500ms"
down_below = 0.5
down_stabilization = "5m"
down_step = "2m"
max_up_step = 4
idle_to_zero = "30m"                  # only with min = 0
drain_timeout = "5m"
stale_after = "5s"
"#;

    /// A minimal valid model block, named `name`; lines appended to it are model-level keys.
    fn model(name: &str) -> String {
        format!(
            "[[model]]\nname = \"{name}\"\ncommand = [\"srv\", \"--port\", \"{{port}}\"]\n\
             warmup.url = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
        )
    }

    /// A minimal valid model block whose last section is `[model.warmup]`, so lines appended to
    /// it are warmup keys.
    fn model_w(name: &str) -> String {
        format!(
            "[[model]]\nname = \"{name}\"\ncommand = [\"srv\", \"--port\", \"{{port}}\"]\n\
             [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
        )
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/hearth/hearth.toml"))
    }

    /// Parse `text`, expecting an error at `line` for `key`; returns the message.
    #[track_caller]
    fn fails(text: &str, key: &str, line: usize) -> String {
        let err = match parse(text) {
            Ok(_) => panic!("expected an error for {key} in:\n{text}"),
            Err(e) => e,
        };
        assert_eq!(err.key, key, "wrong key in {err}\n---\n{text}");
        assert_eq!(err.line, Some(line), "wrong line in {err}\n---\n{text}");
        assert_eq!(err.file, Path::new("/etc/hearth/hearth.toml"));
        err.message
    }

    /// 1-based line of the first line of `text` that starts with `prefix` (after the nth match).
    fn line_of(text: &str, prefix: &str, nth: usize) -> usize {
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with(prefix))
            .nth(nth)
            .map(|(i, _)| i + 1)
            .unwrap_or_else(|| panic!("{prefix:?} not in text"))
    }

    #[test]
    fn design_example_parses_with_documented_values() {
        let c = parse(EXAMPLE).expect("example parses");
        assert_eq!(c.path, Path::new("/etc/hearth/hearth.toml"));
        let d = &c.daemon;
        assert_eq!(d.socket, Path::new("/run/hearth/hearth.sock"));
        assert_eq!(d.state_dir, Path::new("/var/lib/hearth"));
        assert_eq!(
            d.ports,
            PortRange {
                first: 20000,
                last: 20999
            }
        );
        assert_eq!(d.tick, Duration::from_millis(250));
        assert_eq!(d.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(d.shutdown_timeout, Duration::from_secs(60));
        assert_eq!(d.log_level, "info");

        assert_eq!(
            c.access.admins,
            vec![
                Principal::User("root".into()),
                Principal::Group("hearth-admin".into())
            ]
        );
        assert_eq!(
            c.access.reporters,
            vec![Principal::Group("hearth-report".into())]
        );
        assert_eq!(c.access.readers, vec![Principal::Group("hearth".into())]);

        assert_eq!(c.gpus.backend, GpuBackend::Auto);
        assert_eq!(
            c.gpus.devices,
            vec![StaticDevice {
                uuid: "GPU-static-0".into(),
                name: "static device".into(),
                memory: 80 << 30,
            }]
        );

        assert_eq!(c.models.len(), 1);
        let m = c.model("llama-8b").expect("model by name");
        assert_eq!(m.version, "1");
        assert_eq!(
            m.command,
            vec!["vllm", "serve", "/models/llama-8b", "--port", "{port}"]
        );
        assert_eq!(
            m.env.get("HF_HOME").map(String::as_str),
            Some("/models/cache")
        );
        assert_eq!(m.user.as_deref(), Some("hearth-model"));
        assert_eq!(m.gpus, 1);
        assert_eq!(m.gpu_memory, Some(40 << 30));
        assert_eq!(m.placement, Placement::Pack);
        assert_eq!(m.priority, 0);
        assert_eq!(m.stop_grace, Duration::from_secs(30));
        assert!(m.prefetch.is_empty());

        let w = &m.warmup;
        assert_eq!(w.method, "POST");
        assert_eq!(w.url, "http://127.0.0.1:{port}/v1/completions");
        assert_eq!(
            w.body.as_deref(),
            Some(r#"{"model":"llama-8b","prompt":"Hello","max_tokens":4}"#)
        );
        assert_eq!(
            w.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
        assert_eq!(w.expect_status, 200);
        assert_eq!(w.expect_body.as_deref(), Some("choices"));
        assert_eq!(w.timeout, Duration::from_secs(30));
        assert_eq!(w.startup_timeout, Duration::from_secs(600));
        assert_eq!(w.recheck, Duration::from_secs(300));

        let l = m.liveness.as_ref().expect("liveness");
        assert_eq!(l.url, "http://127.0.0.1:{port}/health");
        assert_eq!(l.interval, Duration::from_secs(10));
        assert_eq!(l.timeout, Duration::from_secs(5));
        assert_eq!(l.failures, 3);

        let s = m.signal.as_ref().expect("signal");
        assert_eq!(s.scrape, "http://127.0.0.1:{port}/metrics");
        assert_eq!(s.format, ScrapeFormat::Llamacpp);
        assert_eq!(s.interval, Duration::from_secs(1));

        let sc = &m.scaling;
        assert_eq!(sc.min, 1);
        assert_eq!(sc.max, 8);
        assert_eq!(sc.warm_pool, WarmPool::Fixed(1));
        assert_eq!(sc.target_wait, Duration::from_millis(500));
        assert_eq!(sc.down_below, 0.5);
        assert_eq!(sc.down_stabilization, Duration::from_secs(300));
        assert_eq!(sc.down_step, Duration::from_secs(120));
        assert_eq!(sc.max_up_step, 4);
        assert_eq!(sc.idle_to_zero, Duration::from_secs(1800));
        assert_eq!(sc.drain_timeout, Duration::from_secs(300));
        assert_eq!(sc.stale_after, Duration::from_secs(5));
    }

    #[test]
    fn empty_file_gives_all_defaults() {
        let c = parse("").expect("empty config is valid");
        assert_eq!(c.daemon.socket, Path::new("/run/hearth/hearth.sock"));
        assert_eq!(c.daemon.state_dir, Path::new("/var/lib/hearth"));
        assert_eq!(
            c.daemon.ports,
            PortRange {
                first: 20000,
                last: 20999
            }
        );
        assert_eq!(c.daemon.tick, Duration::from_millis(250));
        assert_eq!(c.daemon.metrics, None);
        assert_eq!(c.daemon.shutdown_timeout, Duration::from_secs(60));
        assert_eq!(c.daemon.log_level, "info");
        assert_eq!(
            c.access,
            AccessConfig {
                admins: vec![
                    Principal::User("root".into()),
                    Principal::Group("hearth-admin".into())
                ],
                reporters: vec![Principal::Group("hearth-report".into())],
                readers: vec![Principal::Group("hearth".into())],
            }
        );
        assert_eq!(c.gpus.backend, GpuBackend::Auto);
        assert!(c.gpus.devices.is_empty());
        assert!(c.models.is_empty());
    }

    #[test]
    fn minimal_model_gets_defaults() {
        let c = parse(&model("m")).unwrap();
        let m = &c.models[0];
        assert_eq!(m.version, "1");
        assert!(m.env.is_empty());
        assert_eq!(m.user, None);
        assert_eq!(m.gpus, 1);
        assert_eq!(m.gpu_memory, None);
        assert_eq!(m.placement, Placement::Pack);
        assert_eq!(m.priority, 0);
        assert_eq!(m.stop_grace, Duration::from_secs(30));
        assert!(m.prefetch.is_empty());
        assert_eq!(
            m.warmup,
            WarmupConfig {
                method: "POST".into(),
                url: "http://127.0.0.1:{port}/v1/completions".into(),
                body: None,
                headers: BTreeMap::new(),
                expect_status: 200,
                expect_body: None,
                timeout: Duration::from_secs(30),
                startup_timeout: Duration::from_secs(600),
                recheck: Duration::from_secs(300),
            }
        );
        assert_eq!(m.liveness, None);
        assert_eq!(m.signal, None);
        assert_eq!(
            m.scaling,
            ScalingConfig {
                min: 1,
                max: 8,
                warm_pool: WarmPool::Fixed(0),
                target_wait: Duration::from_millis(500),
                down_below: 0.5,
                down_stabilization: Duration::from_secs(300),
                down_step: Duration::from_secs(120),
                max_up_step: 4,
                idle_to_zero: Duration::from_secs(1800),
                drain_timeout: Duration::from_secs(300),
                stale_after: Duration::from_secs(5),
            }
        );
    }

    #[test]
    fn optional_sections_get_defaults_and_variants_parse() {
        let text = format!(
            "[daemon]\nlog_level = \"hearth=debug\"\n[gpus]\nbackend = \"static\"\n\
             [[gpus.device]]\nuuid = \"GPU-a\"\nname = \"H100\"\nmemory = \"80GB\"\n{}\
             placement = \"spread\"\ngpus = 0\npriority = -3\nprefetch = [\"/models/x/*.safetensors\"]\n\
             [model.liveness]\nurl = \"http://127.0.0.1:{{port}}/health\"\n\
             [model.signal]\nscrape = \"http://127.0.0.1:{{port}}/metrics\"\nformat = \"vllm\"\n\
             [model.scaling]\nmin = 0\nmax = 1\nwarm_pool = \"auto\"\ndown_below = 0.25\n",
            model("m")
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.daemon.log_level, "hearth=debug");
        assert_eq!(c.gpus.backend, GpuBackend::Static);
        assert_eq!(c.gpus.devices[0].name, "H100");
        assert_eq!(c.gpus.devices[0].memory, 80_000_000_000);
        let m = &c.models[0];
        assert_eq!(m.placement, Placement::Spread);
        assert_eq!(m.gpus, 0);
        assert_eq!(m.priority, -3);
        assert_eq!(m.prefetch, vec!["/models/x/*.safetensors"]);
        let l = m.liveness.as_ref().unwrap();
        assert_eq!(
            (l.interval, l.timeout, l.failures),
            (Duration::from_secs(10), Duration::from_secs(5), 3)
        );
        let s = m.signal.as_ref().unwrap();
        assert_eq!(s.format, ScrapeFormat::Vllm);
        assert_eq!(s.interval, Duration::from_secs(1));
        assert_eq!(m.scaling.min, 0);
        assert_eq!(m.scaling.max, 1);
        assert_eq!(m.scaling.warm_pool, WarmPool::Auto);
        assert_eq!(m.scaling.down_below, 0.25);
    }

    #[test]
    fn load_reads_files_and_reports_unreadable_ones() {
        let dir = std::env::temp_dir().join(format!("hearth-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hearth.toml");
        std::fs::write(&file, EXAMPLE).unwrap();
        let c = Config::load(&file).unwrap();
        assert_eq!(c.path, file);
        assert_eq!(c.models[0].name, "llama-8b");

        let missing = dir.join("missing.toml");
        let err = Config::load(&missing).unwrap_err();
        assert_eq!(err.file, missing);
        assert_eq!(err.line, None);
        assert_eq!(err.key, "-");
        assert!(err
            .to_string()
            .starts_with(&format!("{}: -: ", missing.display())));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn display_is_file_line_key_message() {
        let err = parse("[daemon]\ntick = \"0s\"\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/hearth/hearth.toml:2: daemon.tick: must be greater than 0"
        );
    }

    #[test]
    fn syntax_error_has_line() {
        let err = parse("[daemon]\n\ntick = \n").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(err.message.contains("syntax"), "{}", err.message);
    }

    #[test]
    fn unknown_keys_are_errors_with_path_and_line() {
        let m = fails(
            "[daemon]\ntick = \"1s\"\nsockets = \"/x\"\n",
            "daemon.sockets",
            3,
        );
        assert!(m.contains("unknown"), "{m}");
        fails("[deamon]\n", "deamon", 1);

        let text = format!("{}{}bogus = 1\n", model("a"), model("b"));
        fails(&text, "model[1].bogus", line_of(&text, "bogus", 0));

        let text = format!(
            "{}{}[model.scaling]\nmin = 1\nmaxx = 2\n",
            model("a"),
            model("b")
        );
        fails(&text, "model[1].scaling.maxx", line_of(&text, "maxx", 0));

        let text = format!("{}[model.foo]\nx = 1\n", model("a"));
        fails(&text, "model[0].foo", line_of(&text, "[model.foo]", 0));

        let text = format!("{}[model.warmup.extra]\n", model("a"));
        fails(
            &text,
            "model[0].warmup.extra",
            line_of(&text, "[model.warmup.extra]", 0),
        );

        let text = "[gpus]\n[[gpus.device]]\nuuid = \"a\"\nmemory = \"1GiB\"\nmem = 3\n";
        fails(text, "gpus.device[0].mem", 5);
    }

    #[test]
    fn wrong_types_and_missing_keys() {
        let m = fails("[daemon]\n\ntick = 250\n", "daemon.tick", 3);
        assert!(m.contains("invalid type"), "{m}");

        let text = model("a").replace("name = \"a\"", "name = 3");
        fails(&text, "model[0].name", 2);

        let text = format!("{}gpus = -1\n", model("a"));
        fails(&text, "model[0].gpus", line_of(&text, "gpus", 0));

        let text = format!("{}placement = \"random\"\n", model("a"));
        let m = fails(&text, "model[0].placement", line_of(&text, "placement", 0));
        assert!(m.contains("spread"), "{m}");

        let m = fails("daemon = 3\n", "daemon", 1);
        assert_eq!(m, "invalid type: integer `3`, expected a table");
        let m = fails("daemon = []\n", "daemon", 1);
        assert!(!m.contains("Raw"), "{m}");
        let m = fails(
            "[[model]]\nname = 'a'\ncommand = ['x']\nwarmup = 'x'\n",
            "model[0].warmup",
            4,
        );
        assert!(!m.contains("Raw"), "{m}");
        let m = fails("[gpus]\nbackend = 3\n", "gpus.backend", 2);
        assert!(m.contains("string"), "{m}");
        let m = fails("[gpus]\nbackend = \"cuda\"\n", "gpus.backend", 2);
        assert!(m.contains("nvml"), "{m}");

        // [model.warmup] and its url are required
        let text = "[[model]]\nname = \"a\"\ncommand = [\"x\"]\n";
        let m = fails(text, "model[0].warmup", 1);
        assert!(m.contains("missing"), "{m}");
        let text = "[[model]]\nname = \"a\"\ncommand = [\"x\"]\n[model.warmup]\nmethod = \"GET\"\n";
        fails(text, "model[0].warmup.url", 4);
        let text = "[[model]]\nname = \"a\"\n[model.warmup]\nurl = \"http://x\"\n";
        fails(text, "model[0].command", 1);

        let text = format!(
            "{}[model.signal]\nscrape = \"http://x/{{port}}\"\n",
            model("a")
        );
        fails(
            &text,
            "model[0].signal.format",
            line_of(&text, "[model.signal]", 0),
        );
        let text = format!(
            "{}[model.signal]\nscrape = \"http://x\"\nformat = \"prom\"\n",
            model("a")
        );
        fails(&text, "model[0].signal.format", line_of(&text, "format", 0));

        let text = format!("{}[model.liveness]\ninterval = \"1s\"\n", model("a"));
        fails(
            &text,
            "model[0].liveness.url",
            line_of(&text, "[model.liveness]", 0),
        );

        let text = format!("{}[model.scaling]\nwarm_pool = \"many\"\n", model("a"));
        fails(
            &text,
            "model[0].scaling.warm_pool",
            line_of(&text, "warm_pool", 0),
        );
        let text = format!("{}[model.scaling]\nwarm_pool = -1\n", model("a"));
        fails(
            &text,
            "model[0].scaling.warm_pool",
            line_of(&text, "warm_pool", 0),
        );
        let text = format!("{}[model.scaling]\ndown_below = \"half\"\n", model("a"));
        fails(
            &text,
            "model[0].scaling.down_below",
            line_of(&text, "down_below", 0),
        );
    }

    #[test]
    fn bad_durations_and_sizes_name_the_key() {
        let text = format!("{}stop_grace = \"30 seconds\"\n", model("a"));
        let m = fails(
            &text,
            "model[0].stop_grace",
            line_of(&text, "stop_grace", 0),
        );
        assert!(m.contains("30 seconds") && m.contains("250ms"), "{m}");

        let text = format!("{}gpu_memory = \"40G\"\n", model("a"));
        let m = fails(
            &text,
            "model[0].gpu_memory",
            line_of(&text, "gpu_memory", 0),
        );
        assert!(m.contains("40G") && m.contains("GiB"), "{m}");

        let text = format!("{}[model.scaling]\ntarget_wait = \"-1s\"\n", model("a"));
        fails(
            &text,
            "model[0].scaling.target_wait",
            line_of(&text, "target_wait", 0),
        );

        let text = "[gpus]\n[[gpus.device]]\nuuid = \"a\"\nmemory = \"lots\"\n";
        fails(text, "gpus.device[0].memory", 4);
    }

    #[test]
    fn model_names() {
        let text = model("");
        let m = fails(&text, "model[0].name", 2);
        assert!(m.contains("empty"), "{m}");
        let text = format!("{}{}", model("ok"), model("has space"));
        let m = fails(&text, "model[1].name", line_of(&text, "name", 1));
        assert!(m.contains("' '"), "{m}");
        fails(&model("a/b"), "model[0].name", 2);
        assert!(parse(&model("Llama-3.1_8b")).is_ok());

        let text = format!("{}{}{}", model("a"), model("b"), model("a"));
        let m = fails(&text, "model[2].name", line_of(&text, "name", 2));
        assert!(m.contains("duplicate"), "{m}");
    }

    #[test]
    fn commands() {
        let text = "[[model]]\nname = \"a\"\ncommand = []\n[model.warmup]\nurl = \"http://x\"\n";
        fails(text, "model[0].command", 3);
        let text =
            "[[model]]\nname = \"a\"\ncommand = [\"\"]\n[model.warmup]\nurl = \"http://x\"\n";
        fails(text, "model[0].command[0]", 3);
    }

    #[test]
    fn scaling_rules() {
        let sc = |body: &str| format!("{}[model.scaling]\n{body}\n", model("a"));

        let text = sc("min = 3\nmax = 2");
        let m = fails(&text, "model[0].scaling.min", line_of(&text, "min", 0));
        assert!(m.contains('3') && m.contains('2'), "{m}");
        // min above the default max
        let text = sc("min = 9");
        fails(&text, "model[0].scaling.min", line_of(&text, "min", 0));
        let text = sc("min = 0\nmax = 0");
        fails(&text, "model[0].scaling.max", line_of(&text, "max", 0));
        assert!(parse(&sc("min = 0\nmax = 1")).is_ok());
        assert!(parse(&sc("min = 2\nmax = 2")).is_ok());

        for bad in ["0.0", "1.0", "1", "0", "-0.5", "1.5"] {
            let text = sc(&format!("down_below = {bad}"));
            fails(
                &text,
                "model[0].scaling.down_below",
                line_of(&text, "down_below", 0),
            );
        }
        assert!(parse(&sc("down_below = 0.9")).is_ok());

        let text = sc("max_up_step = 0");
        fails(
            &text,
            "model[0].scaling.max_up_step",
            line_of(&text, "max_up_step", 0),
        );
        assert!(parse(&sc("warm_pool = 3")).is_ok());
    }

    #[test]
    fn liveness_warmup_and_zero_timeouts() {
        let text = format!(
            "{}[model.liveness]\nurl = \"http://x/{{port}}\"\nfailures = 0\n",
            model("a")
        );
        fails(
            &text,
            "model[0].liveness.failures",
            line_of(&text, "failures", 0),
        );

        for (section, k) in [
            ("warmup", "timeout"),
            ("warmup", "startup_timeout"),
            ("liveness", "timeout"),
        ] {
            let text = if section == "warmup" {
                format!("{}{k} = \"0s\"\n", model_w("a"))
            } else {
                format!(
                    "{}[model.liveness]\nurl = \"http://x\"\n{k} = \"0ms\"\n",
                    model("a")
                )
            };
            let m = fails(
                &text,
                &format!("model[0].{section}.{k}"),
                line_of(&text, &format!("{k} ="), 0),
            );
            assert!(m.contains("greater than 0"), "{m}");
        }

        for status in ["99", "600", "0", "-200"] {
            let text = format!("{}expect_status = {status}\n", model_w("a"));
            fails(
                &text,
                "model[0].warmup.expect_status",
                line_of(&text, "expect_status", 0),
            );
        }
        let text = format!("{}expect_status = 204\n", model_w("a"));
        assert_eq!(parse(&text).unwrap().models[0].warmup.expect_status, 204);
    }

    #[test]
    fn daemon_rules() {
        fails("[daemon]\ntick = \"0ms\"\n", "daemon.tick", 2);
        for bad in ["20000", "a-b", "20999-20000", "0-10", "1-70000", "-5", ""] {
            let text = format!("[daemon]\n# c\nports = \"{bad}\"\n");
            let m = fails(&text, "daemon.ports", 3);
            assert!(m.contains("20000-20999"), "{m}");
        }
        let c = parse("[daemon]\nports = \"1-1\"\n").unwrap();
        assert_eq!(c.daemon.ports, PortRange { first: 1, last: 1 });

        let m = fails("[daemon]\nmetrics = \"localhost\"\n", "daemon.metrics", 2);
        assert!(m.contains("localhost"), "{m}");
        let c = parse("[daemon]\nmetrics = \"[::1]:9000\"\n").unwrap();
        assert_eq!(c.daemon.metrics, Some("[::1]:9000".parse().unwrap()));
    }

    #[test]
    fn port_range_must_cover_all_replicas() {
        // two models, max 8 each = 16 ports needed, 10 available
        let text = format!(
            "[daemon]\nports = \"20000-20009\"\n{}{}",
            model("a"),
            model("b")
        );
        let m = fails(&text, "daemon.ports", 2);
        assert!(m.contains("16"), "{m}");
        // exactly enough
        let text = format!(
            "[daemon]\nports = \"20000-20015\"\n{}{}",
            model("a"),
            model("b")
        );
        assert!(parse(&text).is_ok());
        // default range, ports key absent: the key is still daemon.ports; no line to point at
        let text = format!("{}[model.scaling]\nmax = 1001\n", model("a"));
        let err = parse(&text).unwrap_err();
        assert_eq!(err.key, "daemon.ports");
        assert_eq!(err.line, None);
        assert!(err.message.contains("1001"), "{}", err.message);
    }

    #[test]
    fn gpu_rules() {
        let text =
            "[gpus]\nbackend = \"static\"\n[[gpus.device]]\nuuid = \"GPU-0\"\nmemory = \"1GiB\"\n\
                    [[gpus.device]]\nuuid = \"GPU-1\"\nmemory = \"1GiB\"\n\
                    [[gpus.device]]\nuuid = \"GPU-0\"\nmemory = \"1GiB\"\n";
        let m = fails(text, "gpus.device[2].uuid", 10);
        assert!(m.contains("GPU-0"), "{m}");
        let m = fails("[gpus]\n\nbackend = \"static\"\n", "gpus.backend", 3);
        assert!(m.contains("device"), "{m}");
        // a model asking more memory than any declared device is fine
        let text = format!(
            "[gpus]\n[[gpus.device]]\nuuid = \"GPU-0\"\nmemory = \"1GiB\"\n{}gpu_memory = \"80GiB\"\n",
            model("a")
        );
        assert!(parse(&text).is_ok());
    }

    #[test]
    fn user_names() {
        let text = format!("{}user = \"\"\n", model("a"));
        fails(&text, "model[0].user", line_of(&text, "user", 0));
        fails(
            "[access]\nadmins = [\"root\",\n  \"\"]\n",
            "access.admins[1]",
            3,
        );
        fails("[access]\nreaders = [\"@\"]\n", "access.readers[0]", 2);
    }

    #[test]
    fn unknown_placeholders_name_key_and_placeholder() {
        let text = model("a").replace("\"{port}\"]", "\"{port}\", \"{prot}\"]");
        let m = fails(&text, "model[0].command[3]", line_of(&text, "command", 0));
        assert!(m.contains("{prot}"), "{m}");

        let text = format!("{}env = {{ A = \"ok\", B = \"{{nope}}\" }}\n", model("a"));
        let m = fails(&text, "model[0].env.B", line_of(&text, "env", 0));
        assert!(m.contains("{nope}"), "{m}");

        let text = model("a").replace("{port}/v1", "{host}/v1");
        fails(
            &text,
            "model[0].warmup.url",
            line_of(&text, "warmup.url", 0),
        );

        let text = format!("{}body = '{{\"model\":\"{{name}}\"}}'\n", model_w("a"));
        let m = fails(&text, "model[0].warmup.body", line_of(&text, "body", 0));
        assert!(m.contains("{name}"), "{m}");

        let text = format!(
            "{}[model.warmup.headers]\nx-id = \"{{replica_id}}\"\n",
            model("a")
        );
        fails(
            &text,
            "model[0].warmup.headers.x-id",
            line_of(&text, "x-id", 0),
        );

        let text = format!(
            "{}[model.liveness]\nurl = \"http://h:{{Port}}/\"\n",
            model("a")
        );
        fails(&text, "model[0].liveness.url", line_of(&text, "url", 0));

        let text = format!(
            "{}[model.signal]\nscrape = \"http://h:{{port}}/{{x}}\"\nformat = \"tgi\"\n",
            model("a")
        );
        fails(&text, "model[0].signal.scrape", line_of(&text, "scrape", 0));

        // JSON braces and known placeholders are fine
        let text = format!(
            "{}body = '{{\"model\":\"{{model}}\",\"n\":{{ \"a\": 1 }},\"r\":\"{{replica}}\",\"g\":\"{{gpus}}\"}}'\n",
            model_w("a")
        );
        assert!(parse(&text).is_ok(), "{:?}", parse(&text).err());
    }

    #[test]
    fn urls_must_be_http() {
        let text = model("a").replace("http://127.0.0.1", "https://127.0.0.1");
        let m = fails(
            &text,
            "model[0].warmup.url",
            line_of(&text, "warmup.url", 0),
        );
        assert!(m.contains("http://"), "{m}");
        let text = format!("{}[model.liveness]\nurl = \"/health\"\n", model("a"));
        fails(&text, "model[0].liveness.url", line_of(&text, "url", 0));
        let text = format!(
            "{}[model.signal]\nscrape = \"127.0.0.1:{{port}}\"\nformat = \"triton\"\n",
            model("a")
        );
        fails(&text, "model[0].signal.scrape", line_of(&text, "scrape", 0));
    }

    #[test]
    fn expand_replaces_only_known_placeholders() {
        let vars = Placeholders {
            port: 20001,
            replica: "llama-8b-3".into(),
            model: "llama-8b".into(),
            gpus: "GPU-a,GPU-b".into(),
        };
        assert_eq!(
            expand("http://127.0.0.1:{port}/v1/completions", &vars),
            "http://127.0.0.1:20001/v1/completions"
        );
        assert_eq!(
            expand(
                r#"{"model":"{model}","prompt":"Hello","max_tokens":4}"#,
                &vars
            ),
            r#"{"model":"llama-8b","prompt":"Hello","max_tokens":4}"#
        );
        assert_eq!(
            expand(
                r#"{ "r": "{replica}", "g": "{gpus}", "x": {"y": "{other}"} }{"#,
                &vars
            ),
            r#"{ "r": "llama-8b-3", "g": "GPU-a,GPU-b", "x": {"y": "{other}"} }{"#
        );
        assert_eq!(expand("{port}{port}", &vars), "2000120001");
        assert_eq!(expand("{{port}}", &vars), "{20001}");
        assert_eq!(expand("", &vars), "");
        assert_eq!(expand("plain é {", &vars), "plain é {");
    }

    #[test]
    fn placeholder_scanner() {
        assert_eq!(
            placeholders_in(r#"{"a":{b}} {_x1} {1x} { y} {z"#),
            vec!["b", "_x1"]
        );
    }
}
