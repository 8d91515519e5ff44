//! The file as serde reads it: exactly its keys, nothing interpreted, each value with its place in
//! the text (`toml::Spanned`) so that validation can name the line. Every key is optional here,
//! required ones included: validation says which is missing, and where, in its own words.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::ConfigError;

/// A key that may be absent, with its place in the text when present.
pub(super) type Opt<T> = Option<Spanned<T>>;

/// A table of names to templates (`env`, `headers`).
pub(super) type Templates = BTreeMap<Spanned<String>, Spanned<String>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawConfig {
    pub daemon: Opt<RawDaemon>,
    pub access: Opt<RawAccess>,
    pub gpus: Opt<RawGpus>,
    /// None when the file has neither `[[model]]` nor `model = []`.
    pub model: Opt<Vec<Spanned<RawModel>>>,
    pub route: Opt<RawRoute>,
}

/// `[route]`: the front door's keys (`hearth route` reads the same file).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawRoute {
    pub listen: Opt<String>,
    pub max_queue: Opt<i64>,
    pub queue_timeout: Opt<String>,
    pub max_body: Opt<String>,
    pub max_buffered: Opt<String>,
    pub max_buffered_per_client: Opt<String>,
    pub trusted_proxies: Opt<Vec<Spanned<String>>>,
    pub max_connections: Opt<i64>,
    pub threads: Opt<i64>,
    pub shutdown_grace: Opt<String>,
    pub agent_listen: Opt<String>,
    pub balancers: Opt<i64>,
    pub drain_timeout: Opt<String>,
    pub drain_grace: Opt<String>,
    pub api_keys: Opt<Vec<Spanned<String>>>,
    pub aliases: Opt<BTreeMap<Spanned<String>, Spanned<String>>>,
    /// `[route.model.NAME]`: per-model overrides.
    pub model: Opt<BTreeMap<Spanned<String>, Spanned<RawRouteModel>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawRouteModel {
    pub max_queue: Opt<i64>,
    pub paths: Opt<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawDaemon {
    pub socket: Opt<String>,
    pub state_dir: Opt<String>,
    pub ports: Opt<String>,
    pub tick: Opt<String>,
    pub metrics: Opt<String>,
    pub shutdown_timeout: Opt<String>,
    pub log_level: Opt<String>,
    pub host_memory: Opt<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawAccess {
    pub admins: Opt<Vec<Spanned<String>>>,
    pub reporters: Opt<Vec<Spanned<String>>>,
    pub readers: Opt<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawGpus {
    pub backend: Opt<String>,
    pub device: Opt<Vec<Spanned<RawDevice>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawDevice {
    pub uuid: Opt<String>,
    pub memory: Opt<String>,
    pub name: Opt<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawModel {
    pub name: Opt<String>,
    pub version: Opt<String>,
    pub command: Opt<Vec<Spanned<String>>>,
    pub env: Opt<Templates>,
    pub user: Opt<String>,
    pub gpus: Opt<u32>,
    pub gpu_memory: Opt<String>,
    pub placement: Opt<String>,
    pub device_naming: Opt<String>,
    pub start_alone: Opt<bool>,
    pub priority: Opt<i32>,
    pub pin: Opt<bool>,
    pub slots: Opt<i64>,
    pub stop_grace: Opt<String>,
    pub prefetch: Opt<Vec<String>>,
    pub warmup: Opt<RawWarmup>,
    pub liveness: Opt<RawLiveness>,
    pub signal: Opt<RawSignal>,
    pub scaling: Opt<RawScaling>,
    pub sleep: Opt<RawSleep>,
}

/// `[model.sleep]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawSleep {
    pub format: Opt<String>,
    pub level: Opt<i64>,
    pub sleep: Opt<Vec<Spanned<RawSleepRequest>>>,
    pub wake: Opt<Vec<Spanned<RawSleepRequest>>>,
    pub state: Opt<RawStateRequest>,
    pub host_memory: Opt<String>,
    pub gpu_memory_asleep: Opt<String>,
    pub wake_timeout: Opt<String>,
    pub sleep_timeout: Opt<String>,
    pub idle_to_sleep: Opt<String>,
}

/// One request of `[[model.sleep.sleep]]` or `[[model.sleep.wake]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawSleepRequest {
    pub method: Opt<String>,
    pub url: Opt<String>,
    pub body: Opt<String>,
}

/// `[model.sleep.state]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawStateRequest {
    pub method: Opt<String>,
    pub url: Opt<String>,
    pub body: Opt<String>,
    pub asleep: Opt<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawWarmup {
    pub method: Opt<String>,
    pub url: Opt<String>,
    pub body: Opt<String>,
    pub headers: Opt<Templates>,
    pub expect_status: Opt<i64>,
    pub expect_body: Opt<String>,
    pub timeout: Opt<String>,
    pub startup_timeout: Opt<String>,
    pub recheck: Opt<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawLiveness {
    pub url: Opt<String>,
    pub interval: Opt<String>,
    pub timeout: Opt<String>,
    pub failures: Opt<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawSignal {
    pub scrape: Opt<String>,
    pub format: Opt<String>,
    pub interval: Opt<String>,
    pub models: Opt<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(super) struct RawScaling {
    pub min: Opt<u32>,
    pub max: Opt<u32>,
    /// A count or "auto".
    pub warm_pool: Opt<toml::Value>,
    pub target_wait: Opt<String>,
    /// An integer or a float.
    pub down_below: Opt<toml::Value>,
    pub down_stabilization: Opt<String>,
    pub down_step: Opt<String>,
    pub max_up_step: Opt<u32>,
    pub forecast: Opt<bool>,
    pub idle_to_zero: Opt<String>,
    pub drain_timeout: Opt<String>,
    pub stale_after: Opt<String>,
}

/// Deserialize `text`. A syntax error names its line; a serde error (an unknown key, a wrong
/// type) names its line and the key path found at the position toml reports.
pub(super) fn read(text: &str, file: &Path) -> Result<RawConfig, ConfigError> {
    let e = match toml::from_str::<RawConfig>(text) {
        Ok(raw) => return Ok(raw),
        Err(e) => e,
    };
    let line = e.span().map(|s| line_at(text, s.start));
    // The document alone tells a syntax error (no document) from a schema error (a document
    // whose key or value at the reported position does not fit).
    let (key, message) = match DeTable::parse(text) {
        // toml names neither the key nor its table: the path is read off the text.
        Err(syntax) if syntax.message().trim() == "duplicate key" => (
            syntax
                .span()
                .map(|s| super::duplicate::key_path(text, s.start, s.end)),
            "duplicate key: it is already set above (TOML allows each key once)".to_string(),
        ),
        Err(syntax) => (
            None,
            format!("TOML syntax error: {}", syntax.message().trim()),
        ),
        Ok(doc) => (
            e.span().and_then(|s| key_at(doc.get_ref(), s.start)),
            e.message().trim().to_string(),
        ),
    };
    Err(ConfigError {
        file: file.to_path_buf(),
        line,
        key: key.unwrap_or_else(|| "-".to_string()),
        message,
    })
}

/// 1-based line of byte `offset` in `text`.
pub(super) fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// `base.key`, or `key` at the top.
pub(super) fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// `base[i]`.
pub(super) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

/// The path ("model[1].scaling.maxx") of the innermost key or value whose text covers byte `at`.
/// A key's text and its value's are both candidates: toml points at the key of an unknown field
/// and at the value of a wrong type. Spans nest or are disjoint, so the shortest covering one is
/// the innermost; a header table's value is its header, which contains the key: the tie goes to
/// the deeper path.
fn key_at(doc: &DeTable<'_>, at: usize) -> Option<String> {
    let mut best = None;
    walk_table(doc, at, "", 0, &mut best);
    best.map(|(_, _, path)| path)
}

/// The best candidate so far: (span length, depth, path).
type Best = Option<(usize, usize, String)>;

fn consider(span: Range<usize>, at: usize, path: &str, depth: usize, best: &mut Best) {
    // An empty span (a value toml could not read) still covers its own position.
    if !(span.start <= at && at < span.end.max(span.start + 1)) {
        return;
    }
    let len = span.end - span.start;
    if best
        .as_ref()
        .is_none_or(|(l, d, _)| len < *l || (len == *l && depth > *d))
    {
        *best = Some((len, depth, path.to_string()));
    }
}

fn walk_table(table: &DeTable<'_>, at: usize, base: &str, depth: usize, best: &mut Best) {
    for (k, v) in table.iter() {
        let path = join(base, k.get_ref());
        consider(k.span(), at, &path, depth + 1, best);
        consider(v.span(), at, &path, depth + 1, best);
        walk_value(v.get_ref(), at, &path, depth + 1, best);
    }
}

fn walk_value(value: &DeValue<'_>, at: usize, base: &str, depth: usize, best: &mut Best) {
    match value {
        DeValue::Table(t) => walk_table(t, at, base, depth, best),
        DeValue::Array(a) => {
            for (i, e) in a.iter().enumerate() {
                let path = index(base, i);
                consider(e.span(), at, &path, depth + 1, best);
                walk_value(e.get_ref(), at, &path, depth + 1, best);
            }
        }
        _ => {}
    }
}
