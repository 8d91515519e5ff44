//! From the raw file to the typed [`Config`]: defaults, values, and the checks across keys. Errors
//! name the key and the line of its value, or, for a key that is absent, of the table it belongs
//! in. Checks run by depth, so that a user fixing one error at a time meets the file's own
//! mistakes first: values here and in `model`, then `deploy` (ports, GPU fit), then `host`.

mod deploy;
pub(in crate::config) mod fit;
mod host;
mod model;
mod route;
mod sleep;
mod wake_fit;

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::placeholders::{placeholders_in, PLACEHOLDERS};
use super::raw::{index, join, line_at, Opt, RawAccess, RawConfig, RawDaemon, RawGpus};
use super::{
    AccessConfig, Checks, Config, ConfigError, DaemonConfig, GpuBackend, GpusConfig, ModelConfig,
    PortRange, Principal, Reach, StaticDevice,
};
use crate::units::{parse_duration, parse_size};

pub(super) type Res<T> = Result<T, ConfigError>;

/// A place in the text, when there is one.
pub(super) type At = Option<Range<usize>>;

/// Where a value is, if it is in the file.
pub(super) fn at<T>(v: &Opt<T>) -> At {
    v.as_ref().map(Spanned::span)
}

/// Where a model's keys are, for the checks that run after every value is read.
pub(super) struct Marks {
    /// "model[i]"
    pub key: String,
    pub name: At,
    pub command: At,
    pub program: At,
    pub gpus: At,
    pub gpu_memory: At,
    /// `device_naming`, or the model when it is left out.
    pub device_naming: At,
    pub min: At,
    /// The warm-up, liveness and scrape URLs.
    pub urls: Vec<UrlMark>,
}

/// A URL template of a model and where it is.
pub(super) struct UrlMark {
    pub key: String,
    pub at: At,
    pub url: String,
}

pub(in crate::config) struct Cx<'a> {
    text: &'a str,
    file: &'a Path,
    checks: Checks,
    /// The host's answers about the replicas' accounts (see [`Reach`]), when asked for.
    reach: Option<&'a dyn Reach>,
}

impl<'a> Cx<'a> {
    pub(in crate::config) fn new(text: &'a str, file: &'a Path, checks: Checks) -> Self {
        Cx {
            text,
            file,
            checks,
            reach: None,
        }
    }

    pub(in crate::config) fn with_reach(mut self, reach: &'a dyn Reach) -> Self {
        self.reach = Some(reach);
        self
    }

    pub(super) fn err(&self, key: &str, at: At, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line: at.map(|s| line_at(self.text, s.start)),
            key: if key.is_empty() { "-" } else { key }.to_string(),
            message: message.into(),
        }
    }

    /// A key the file must have; `table` is where it belongs (for the line).
    pub(super) fn required<'r, T>(
        &self,
        key: &str,
        raw: &'r Opt<T>,
        table: At,
        what: &str,
    ) -> Res<&'r Spanned<T>> {
        raw.as_ref()
            .ok_or_else(|| self.err(key, table, format!("missing; {what}")))
    }

    pub(super) fn duration(
        &self,
        key: &str,
        raw: &Opt<String>,
        default: Duration,
    ) -> Res<Duration> {
        match raw {
            None => Ok(default),
            Some(s) => parse_duration(s.get_ref())
                .map_err(|m| self.err(key, Some(s.span()), m.to_string())),
        }
    }

    /// A duration that must not be zero.
    pub(super) fn nonzero_duration(
        &self,
        key: &str,
        raw: &Opt<String>,
        default: Duration,
    ) -> Res<Duration> {
        let d = self.duration(key, raw, default)?;
        if d.is_zero() {
            return Err(self.err(key, at(raw), "must be greater than 0"));
        }
        Ok(d)
    }

    pub(super) fn size(&self, key: &str, raw: &Spanned<String>) -> Res<u64> {
        let bytes = parse_size(raw.get_ref())
            .map_err(|m| self.err(key, Some(raw.span()), m.to_string()))?;
        if bytes == 0 {
            return Err(self.err(key, Some(raw.span()), "must be greater than 0"));
        }
        Ok(bytes)
    }

    /// An integer within `lo..=hi`.
    pub(super) fn bounded(&self, key: &str, raw: &Spanned<i64>, lo: i64, hi: i64) -> Res<i64> {
        let n = *raw.get_ref();
        if n < lo || n > hi {
            return Err(self.err(
                key,
                Some(raw.span()),
                format!("{n} is out of range: {lo} to {hi}"),
            ));
        }
        Ok(n)
    }

    /// A string that must not be empty (after trimming, with `trim`).
    pub(super) fn nonempty(&self, key: &str, raw: &Spanned<String>, message: &str) -> Res<()> {
        if raw.get_ref().trim().is_empty() {
            return Err(self.err(key, Some(raw.span()), message));
        }
        Ok(())
    }

    /// Placeholders in a template must be known ones.
    pub(super) fn template(&self, key: &str, raw: &Spanned<String>) -> Res<()> {
        for name in placeholders_in(raw.get_ref()) {
            if !PLACEHOLDERS.contains(&name) {
                return Err(self.err(
                    key,
                    Some(raw.span()),
                    format!(
                        "unknown placeholder {{{name}}} (known: {{port}}, {{replica}}, {{model}}, {{gpus}})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A URL template: known placeholders and an http:// scheme.
    pub(super) fn url(&self, key: &str, raw: &Spanned<String>) -> Res<()> {
        self.template(key, raw)?;
        let url = raw.get_ref();
        if !url.starts_with("http://") || url.len() == "http://".len() {
            return Err(self.err(
                key,
                Some(raw.span()),
                format!(
                    "{url:?} is not an http:// URL (e.g. \"http://127.0.0.1:{{port}}/health\")"
                ),
            ));
        }
        Ok(())
    }

    /// One of `choices`, written as a string.
    pub(super) fn choice<T: Copy>(
        &self,
        key: &str,
        raw: &Spanned<String>,
        what: &str,
        choices: &[(&str, T)],
    ) -> Res<T> {
        if let Some((_, v)) = choices.iter().find(|(name, _)| name == raw.get_ref()) {
            return Ok(*v);
        }
        let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
        let expected = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        };
        Err(self.err(
            key,
            Some(raw.span()),
            format!("{:?} is not {what}; expected {expected}", raw.get_ref()),
        ))
    }

    pub(in crate::config) fn config(&self, raw: RawConfig) -> Res<Config> {
        let daemon_at = at(&raw.daemon);
        let ports_at = raw
            .daemon
            .as_ref()
            .and_then(|d| at(&d.get_ref().ports))
            .or(daemon_at.clone());
        let socket_at = raw
            .daemon
            .as_ref()
            .and_then(|d| at(&d.get_ref().socket))
            .or(daemon_at);
        let daemon = self.daemon(raw.daemon.map(Spanned::into_inner))?;
        let access = self.access(raw.access.map(Spanned::into_inner))?;
        let gpus = self.gpus(raw.gpus)?;
        let raw_route = raw.route;
        let Some(raw_models) = raw.model else {
            return Err(self.err(
                "model",
                None,
                "the file declares no [[model]]; to run no model, say so with `model = []` at \
                 the top, before any [table] (an empty or cut-short file is never read as \
                 \"stop every model\")",
            ));
        };
        let mut models: Vec<ModelConfig> = Vec::with_capacity(raw_models.get_ref().len());
        let mut marks: Vec<Marks> = Vec::with_capacity(models.capacity());
        for (i, m) in raw_models.into_inner().into_iter().enumerate() {
            let key = index("model", i);
            let (model, mark) = self.model(&key, m)?;
            if models.iter().any(|other| other.name == model.name) {
                return Err(self.err(
                    &join(&key, "name"),
                    mark.name.clone(),
                    format!("duplicate model name {:?}", model.name),
                ));
            }
            models.push(model);
            marks.push(mark);
        }
        let needed: u64 = models.iter().map(|m| u64::from(m.scaling.max)).sum();
        let available = u64::from(daemon.ports.last) - u64::from(daemon.ports.first) + 1;
        if needed > available {
            return Err(self.err(
                "daemon.ports",
                ports_at,
                format!(
                    "port range {}-{} has {available} ports but the models' scaling.max add up to \
                     {needed}; at least {needed} ports are needed",
                    daemon.ports.first, daemon.ports.last
                ),
            ));
        }
        let route = self.route(raw_route, &models)?;
        if self.checks >= Checks::Deployment {
            self.deployment(&gpus, &models, &marks)?;
        }
        if self.checks >= Checks::Host {
            self.host(&models, &marks)?;
            self.reach(&daemon.socket, socket_at, &models, &marks)?;
        }
        Ok(Config {
            path: self.file.to_path_buf(),
            daemon,
            access,
            gpus,
            models,
            route,
        })
    }

    fn daemon(&self, raw: Option<RawDaemon>) -> Res<DaemonConfig> {
        let raw = raw.unwrap_or_default();
        let ports = match &raw.ports {
            None => PortRange {
                first: 20000,
                last: 20999,
            },
            Some(s) => {
                parse_ports(s.get_ref()).map_err(|m| self.err("daemon.ports", Some(s.span()), m))?
            }
        };
        let metrics = match &raw.metrics {
            None => None,
            Some(s) => Some(s.get_ref().trim().parse::<SocketAddr>().map_err(|_| {
                self.err(
                    "daemon.metrics",
                    Some(s.span()),
                    format!(
                        "{:?} is not a socket address; expected IP:PORT, e.g. \"127.0.0.1:9464\"",
                        s.get_ref()
                    ),
                )
            })?),
        };
        let text = |v: &Opt<String>, key: &str, default: &str, trim: bool| -> Res<String> {
            match v {
                None => Ok(default.to_string()),
                Some(s) => {
                    let empty = if trim {
                        s.get_ref().trim().is_empty()
                    } else {
                        s.get_ref().is_empty()
                    };
                    if empty {
                        return Err(self.err(key, Some(s.span()), "must not be empty"));
                    }
                    Ok(s.get_ref().clone())
                }
            }
        };
        Ok(DaemonConfig {
            socket: PathBuf::from(text(
                &raw.socket,
                "daemon.socket",
                "/run/hearth/hearth.sock",
                false,
            )?),
            state_dir: PathBuf::from(text(
                &raw.state_dir,
                "daemon.state_dir",
                "/var/lib/hearth",
                false,
            )?),
            ports,
            tick: self.nonzero_duration("daemon.tick", &raw.tick, Duration::from_millis(250))?,
            metrics,
            shutdown_timeout: self.duration(
                "daemon.shutdown_timeout",
                &raw.shutdown_timeout,
                Duration::from_secs(60),
            )?,
            log_level: text(&raw.log_level, "daemon.log_level", "info", true)?,
            host_memory: match &raw.host_memory {
                None => None,
                Some(s) => Some(self.size("daemon.host_memory", s)?),
            },
        })
    }

    fn access(&self, raw: Option<RawAccess>) -> Res<AccessConfig> {
        let raw = raw.unwrap_or_default();
        Ok(AccessConfig {
            admins: self.principals("access.admins", raw.admins, &["root", "@hearth-admin"])?,
            reporters: self.principals("access.reporters", raw.reporters, &["@hearth-report"])?,
            readers: self.principals("access.readers", raw.readers, &["@hearth"])?,
        })
    }

    fn principals(
        &self,
        key: &str,
        raw: Opt<Vec<Spanned<String>>>,
        default: &[&str],
    ) -> Res<Vec<Principal>> {
        let Some(names) = raw else {
            return Ok(default
                .iter()
                .map(|n| match n.strip_prefix('@') {
                    Some(g) => Principal::Group(g.to_string()),
                    None => Principal::User(n.to_string()),
                })
                .collect());
        };
        names
            .into_inner()
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let here = index(key, i);
                match name.get_ref().strip_prefix('@') {
                    Some(group) if group.trim().is_empty() => {
                        Err(self.err(&here, Some(name.span()), "empty group name after \"@\""))
                    }
                    Some(group) => Ok(Principal::Group(group.to_string())),
                    None if name.get_ref().trim().is_empty() => {
                        Err(self.err(&here, Some(name.span()), "empty user name"))
                    }
                    None => Ok(Principal::User(name.into_inner())),
                }
            })
            .collect()
    }

    fn gpus(&self, raw: Opt<RawGpus>) -> Res<GpusConfig> {
        let table = at(&raw);
        let raw = raw.map(Spanned::into_inner).unwrap_or_default();
        let backend = match &raw.backend {
            None => GpuBackend::Auto,
            Some(b) => self.choice(
                "gpus.backend",
                b,
                "a GPU backend",
                &[
                    ("auto", GpuBackend::Auto),
                    ("nvml", GpuBackend::Nvml),
                    ("static", GpuBackend::Static),
                ],
            )?,
        };
        let raw_devices = raw.device.map(Spanned::into_inner).unwrap_or_default();
        let mut devices: Vec<StaticDevice> = Vec::with_capacity(raw_devices.len());
        for (i, d) in raw_devices.into_iter().enumerate() {
            let here = index("gpus.device", i);
            let d_at = Some(d.span());
            let d = d.into_inner();
            let uuid = self.required(
                &join(&here, "uuid"),
                &d.uuid,
                d_at.clone(),
                "the device's UUID, as NVML would name it",
            )?;
            self.nonempty(&join(&here, "uuid"), uuid, "must not be empty")?;
            if devices.iter().any(|o| &o.uuid == uuid.get_ref()) {
                return Err(self.err(
                    &join(&here, "uuid"),
                    Some(uuid.span()),
                    format!("duplicate device uuid {:?}", uuid.get_ref()),
                ));
            }
            let memory = self.required(
                &join(&here, "memory"),
                &d.memory,
                d_at,
                "the device's memory, e.g. \"80GiB\"",
            )?;
            let memory = self.size(&join(&here, "memory"), memory)?;
            devices.push(StaticDevice {
                uuid: uuid.get_ref().clone(),
                name: d
                    .name
                    .map(Spanned::into_inner)
                    .unwrap_or_else(|| "static device".to_string()),
                memory,
            });
        }
        if backend == GpuBackend::Static && devices.is_empty() {
            return Err(self.err(
                "gpus.backend",
                at(&raw.backend).or(table),
                "backend \"static\" needs at least one [[gpus.device]]",
            ));
        }
        Ok(GpusConfig { backend, devices })
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
