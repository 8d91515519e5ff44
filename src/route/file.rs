//! The `[route]` table, read from a file of its own (`hearth route --route-config FILE`) until it
//! joins the main configuration: the same keys, the same table name, so that moving it is a
//! cut and paste. Unknown keys are errors; errors name the file, the line and the key.
//!
//! ```toml
//! [route]
//! listen = "127.0.0.1:8080"
//! max_queue = 1024          # per model, unless the model says otherwise
//! queue_timeout = "60s"
//! max_body = "8MiB"
//! max_buffered = "1GiB"     # request bodies held at once, all requests together
//! max_connections = 4096
//! threads = 4               # default: the CPUs, at most 4
//! shutdown_grace = "30s"
//! api_keys = ["sk-…"]       # empty or absent: no authentication
//!
//! [route.aliases]
//! "gpt-4o-mini" = "llama-8b"
//!
//! [route.model.llama-8b]    # per model
//! slots = 8
//! max_queue = 256
//! paths = ["/generate", "/generate_stream"]   # what /m/llama-8b/… passes
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::paths::PathRules;
use super::settings::{
    RouteSettings, MAX_BODY_LIMIT, MAX_BUFFERED_LIMIT, MAX_CONNECTIONS_LIMIT, MAX_QUEUE_LIMIT,
    MAX_SLOTS, MAX_THREADS,
};
use crate::config::Config;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: String,
    pub message: String,
}

impl fmt::Display for RouteConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(
                f,
                "{}:{l}: {}: {}",
                self.file.display(),
                self.key,
                self.message
            ),
            None => write!(f, "{}: {}: {}", self.file.display(), self.key, self.message),
        }
    }
}

impl std::error::Error for RouteConfigError {}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    route: RawRoute,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    listen: Option<Spanned<String>>,
    max_queue: Option<Spanned<i64>>,
    queue_timeout: Option<Spanned<String>>,
    max_body: Option<Spanned<String>>,
    max_buffered: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    threads: Option<Spanned<i64>>,
    shutdown_grace: Option<Spanned<String>>,
    api_keys: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    aliases: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    model: BTreeMap<String, Spanned<RawModelRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelRoute {
    slots: Option<Spanned<i64>>,
    max_queue: Option<Spanned<i64>>,
    paths: Option<Spanned<Vec<String>>>,
}

/// Settings for `config`'s models, with the `[route]` keys of `route_file` (if any) applied.
pub fn load(config: &Config, route_file: Option<&Path>) -> Result<RouteSettings, RouteConfigError> {
    let base = RouteSettings::defaults(
        config.daemon.socket.clone(),
        config
            .models
            .iter()
            .map(|m| (m.name.clone(), m.scaling.target_wait))
            .collect(),
    );
    let Some(path) = route_file else {
        return Ok(base);
    };
    let text = std::fs::read_to_string(path).map_err(|e| RouteConfigError {
        file: path.to_path_buf(),
        line: None,
        key: "-".into(),
        message: format!("cannot read: {e}"),
    })?;
    apply(base, &text, path)
}

/// `base` with the keys of the `[route]` table in `text` applied.
pub fn apply(
    mut s: RouteSettings,
    text: &str,
    path: &Path,
) -> Result<RouteSettings, RouteConfigError> {
    let err = |span: Option<std::ops::Range<usize>>, key: &str, message: String| RouteConfigError {
        file: path.to_path_buf(),
        line: span.map(|r| line_at(text, r.start)),
        key: key.to_string(),
        message,
    };
    let raw: RawFile =
        toml::from_str(text).map_err(|e| err(e.span(), "route", e.message().trim().to_string()))?;
    let r = raw.route;
    if let Some(v) = r.listen {
        s.listen = v.get_ref().parse().map_err(|_| {
            err(
                Some(v.span()),
                "route.listen",
                format!(
                    "{:?}: expected IP:PORT, e.g. \"127.0.0.1:8080\"",
                    v.get_ref()
                ),
            )
        })?;
    }
    let default_queue = match r.max_queue {
        Some(v) => Some(
            bounded(&v, 0, MAX_QUEUE_LIMIT as i64)
                .map_err(|m| err(Some(v.span()), "route.max_queue", m))? as usize,
        ),
        None => None,
    };
    if let Some(q) = default_queue {
        for m in &mut s.models {
            m.max_queue = q;
        }
    }
    for (key, field) in [
        ("route.queue_timeout", &r.queue_timeout),
        ("route.shutdown_grace", &r.shutdown_grace),
    ] {
        if let Some(v) = field {
            let d = crate::units::parse_duration(v.get_ref())
                .map_err(|m| err(Some(v.span()), key, m))?;
            if d.is_zero() && key == "route.queue_timeout" {
                return Err(err(Some(v.span()), key, "must be > 0".into()));
            }
            if key == "route.queue_timeout" {
                s.queue_timeout = d;
            } else {
                s.shutdown_grace = d;
            }
        }
    }
    let body_span = r.max_body.as_ref().map(|v| v.span());
    let buffered_span = r.max_buffered.as_ref().map(|v| v.span());
    if let Some(v) = r.max_body {
        let b = crate::units::parse_size(v.get_ref())
            .map_err(|m| err(Some(v.span()), "route.max_body", m))?;
        if b == 0 || b > MAX_BODY_LIMIT as u64 {
            return Err(err(
                Some(v.span()),
                "route.max_body",
                format!("must be between 1 B and {} MiB", MAX_BODY_LIMIT >> 20),
            ));
        }
        s.max_body = b as usize;
    }
    if let Some(v) = r.max_buffered {
        let b = crate::units::parse_size(v.get_ref())
            .map_err(|m| err(Some(v.span()), "route.max_buffered", m))?;
        if b > MAX_BUFFERED_LIMIT as u64 {
            return Err(err(
                Some(v.span()),
                "route.max_buffered",
                format!("at most {} GiB", MAX_BUFFERED_LIMIT >> 30),
            ));
        }
        s.max_buffered = b as usize;
    }
    if s.max_buffered < s.max_body {
        return Err(err(
            buffered_span.or(body_span),
            "route.max_buffered",
            format!(
                "{} B is less than max_body ({} B): no request of max_body could be read",
                s.max_buffered, s.max_body
            ),
        ));
    }
    if let Some(v) = r.max_connections {
        s.max_connections = bounded(&v, 1, MAX_CONNECTIONS_LIMIT as i64)
            .map_err(|m| err(Some(v.span()), "route.max_connections", m))?
            as usize;
    }
    if let Some(v) = r.threads {
        s.threads = bounded(&v, 1, MAX_THREADS as i64)
            .map_err(|m| err(Some(v.span()), "route.threads", m))? as usize;
    }
    if let Some(v) = r.api_keys {
        for k in v.get_ref() {
            // A key travels in a header: it must be a valid header value, and short keys are
            // guessable.
            if k.len() < 16 || k.len() > 512 || !k.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(err(
                    Some(v.span()),
                    "route.api_keys",
                    "each key is 16 to 512 printable ASCII characters without spaces".into(),
                ));
            }
        }
        s.api_keys = v.into_inner();
    }
    for (alias, target) in r.aliases {
        let key = format!("route.aliases.{alias}");
        if s.models.iter().any(|m| m.name == alias) {
            return Err(err(
                Some(target.span()),
                &key,
                format!("{alias:?} is a model's own name; an alias must be another name"),
            ));
        }
        if !s.models.iter().any(|m| &m.name == target.get_ref()) {
            return Err(err(
                Some(target.span()),
                &key,
                format!("no model named {:?}", target.get_ref()),
            ));
        }
        s.aliases.insert(alias, target.into_inner());
    }
    for (name, m) in r.model {
        let key = format!("route.model.{name}");
        let span = m.span();
        let m = m.into_inner();
        let Some(target) = s.models.iter_mut().find(|x| x.name == name) else {
            return Err(err(Some(span), &key, format!("no model named {name:?}")));
        };
        if let Some(v) = m.slots {
            target.slots = bounded(&v, 1, i64::from(MAX_SLOTS))
                .map_err(|e| err(Some(v.span()), &format!("{key}.slots"), e))?
                as u32;
        }
        if let Some(v) = m.max_queue {
            target.max_queue = bounded(&v, 0, MAX_QUEUE_LIMIT as i64)
                .map_err(|e| err(Some(v.span()), &format!("{key}.max_queue"), e))?
                as usize;
        }
        if let Some(v) = m.paths {
            target.paths = PathRules::parse(v.get_ref().iter().map(String::as_str))
                .map_err(|e| err(Some(v.span()), &format!("{key}.paths"), e))?;
        }
    }
    Ok(s)
}

fn bounded(v: &Spanned<i64>, lo: i64, hi: i64) -> Result<i64, String> {
    let n = *v.get_ref();
    if n < lo || n > hi {
        return Err(format!("{n} is out of range: {lo} to {hi}"));
    }
    Ok(n)
}

fn line_at(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn base() -> RouteSettings {
        RouteSettings::defaults(
            "/run/h.sock".into(),
            vec![
                ("llama".into(), Duration::from_millis(500)),
                ("embed".into(), Duration::from_secs(2)),
            ],
        )
    }

    #[test]
    fn keys_apply_and_defaults_stay_elsewhere() {
        let s = apply(
            base(),
            r#"
[route]
listen = "0.0.0.0:9000"
max_queue = 10
queue_timeout = "5s"
max_body = "1MiB"
api_keys = ["0123456789abcdef"]
[route.aliases]
"gpt-4o" = "llama"
[route.model.embed]
slots = 8
max_queue = 3
paths = ["/embedding"]
"#,
            Path::new("r.toml"),
        )
        .unwrap();
        assert_eq!(s.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(s.queue_timeout, Duration::from_secs(5));
        assert_eq!(s.max_body, 1 << 20);
        assert_eq!(s.models[0].max_queue, 10);
        assert_eq!(s.models[0].slots, 1);
        assert_eq!(s.models[1].max_queue, 3);
        assert_eq!(s.models[1].slots, 8);
        assert!(s.models[1].paths.allows("/embedding"));
        assert!(!s.models[1].paths.allows("/completion"));
        assert!(s.models[0].paths.allows("/completion"));
        assert_eq!(s.resolve("gpt-4o"), Some(0));
        assert_eq!(s.resolve("embed"), Some(1));
        assert_eq!(s.resolve("nope"), None);
        assert_eq!(s.api_keys.len(), 1);
    }

    #[test]
    fn errors_name_line_and_key() {
        let cases = [
            ("[route]\nlisten = \"nowhere\"\n", 2, "route.listen"),
            ("[route]\n\nmax_queue = -1\n", 3, "route.max_queue"),
            (
                "[route]\nqueue_timeout = \"0s\"\n",
                2,
                "route.queue_timeout",
            ),
            ("[route.aliases]\nx = \"ghost\"\n", 2, "route.aliases.x"),
            (
                "[route.aliases]\nembed = \"llama\"\n",
                2,
                "route.aliases.embed",
            ),
            ("[route.model.ghost]\nslots = 2\n", 1, "route.model.ghost"),
            (
                "[route.model.llama]\nslots = 0\n",
                2,
                "route.model.llama.slots",
            ),
            (
                "[route.model.llama]\npaths = [\"/a/../b\"]\n",
                2,
                "route.model.llama.paths",
            ),
            ("[route]\napi_keys = [\"short\"]\n", 2, "route.api_keys"),
            ("[route]\nmax_body = \"2GiB\"\n", 2, "route.max_body"),
            ("[route]\nthreads = 0\n", 2, "route.threads"),
            (
                "[route]\nmax_body = \"2MiB\"\nmax_buffered = \"1MiB\"\n",
                3,
                "route.max_buffered",
            ),
            ("[route]\nlisten_on = 1\n", 2, "route"),
        ];
        for (text, line, key) in cases {
            let e = apply(base(), text, Path::new("r.toml")).unwrap_err();
            assert_eq!((e.line, e.key.as_str()), (Some(line), key), "{text}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("r.toml:{line}: {key}: ")),
                "{e}"
            );
        }
    }
}
