//! `[route]`: the front door's keys. The daemon checks them with the rest of the file (so that
//! `check-config` and a reload refuse a file the front door could not run), and `hearth route`
//! runs with them.

use std::collections::BTreeMap;

use toml::Spanned;

use super::{at, Cx, Res};
use crate::config::raw::{index, join, Opt, RawRoute};
use crate::config::route::paths::PathRules;
use crate::config::route::proxies::{Cidr, TrustedProxies};
use crate::config::route::settings::{
    per_client_default, DEFAULT_BALANCERS, DEFAULT_DRAIN_GRACE, DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_LISTEN, DEFAULT_MAX_BODY, DEFAULT_MAX_BUFFERED, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_QUEUE, DEFAULT_QUEUE_TIMEOUT, DEFAULT_SHUTDOWN_GRACE, MAX_BALANCERS,
    MAX_BODY_LIMIT, MAX_BUFFERED_LIMIT, MAX_CONNECTIONS_LIMIT, MAX_DRAIN, MAX_QUEUE_LIMIT,
    MAX_THREADS,
};
use crate::config::{ModelConfig, RouteConfig, RouteModelConfig};

/// Bearer tokens travel in a header: a valid header value, and long enough not to be guessed.
const API_KEY_LEN: std::ops::RangeInclusive<usize> = 16..=512;
/// More keys than any deployment hands out; each request compares against all of them.
const MAX_API_KEYS: usize = 1024;
/// More balancers than a fleet has; each connection is checked against all of them.
const MAX_TRUSTED_PROXIES: usize = 1024;

impl Cx<'_> {
    pub(super) fn route(&self, raw: Opt<RawRoute>, models: &[ModelConfig]) -> Res<RouteConfig> {
        let raw = raw.map(Spanned::into_inner).unwrap_or_default();
        let listen = match &raw.listen {
            None => DEFAULT_LISTEN.parse().expect("a valid address"),
            Some(v) => v.get_ref().trim().parse().map_err(|_| {
                self.err(
                    "route.listen",
                    Some(v.span()),
                    format!(
                        "{:?} is not a socket address; expected IP:PORT, e.g. \"127.0.0.1:8080\"",
                        v.get_ref()
                    ),
                )
            })?,
        };
        let max_queue = match &raw.max_queue {
            None => DEFAULT_MAX_QUEUE,
            Some(v) => self.bounded("route.max_queue", v, 0, MAX_QUEUE_LIMIT as i64)? as usize,
        };
        let queue_timeout = self.nonzero_duration(
            "route.queue_timeout",
            &raw.queue_timeout,
            DEFAULT_QUEUE_TIMEOUT,
        )?;
        let shutdown_grace = self.duration(
            "route.shutdown_grace",
            &raw.shutdown_grace,
            DEFAULT_SHUTDOWN_GRACE,
        )?;
        let max_body = match &raw.max_body {
            None => DEFAULT_MAX_BODY,
            Some(v) => {
                let b = self.size("route.max_body", v)?;
                if b > MAX_BODY_LIMIT as u64 {
                    return Err(self.err(
                        "route.max_body",
                        Some(v.span()),
                        format!("at most {} MiB", MAX_BODY_LIMIT >> 20),
                    ));
                }
                b as usize
            }
        };
        let max_buffered = match &raw.max_buffered {
            None => DEFAULT_MAX_BUFFERED,
            Some(v) => {
                let b = self.size("route.max_buffered", v)?;
                if b > MAX_BUFFERED_LIMIT as u64 {
                    return Err(self.err(
                        "route.max_buffered",
                        Some(v.span()),
                        format!("at most {} GiB", MAX_BUFFERED_LIMIT >> 30),
                    ));
                }
                b as usize
            }
        };
        if max_buffered < max_body {
            return Err(self.err(
                "route.max_buffered",
                at(&raw.max_buffered).or(at(&raw.max_body)),
                format!(
                    "{max_buffered} B is less than max_body ({max_body} B): no request of \
                     max_body could be read"
                ),
            ));
        }
        let max_buffered_per_client = match &raw.max_buffered_per_client {
            None => per_client_default(max_buffered, max_body),
            Some(v) => {
                let b = self.size("route.max_buffered_per_client", v)?;
                if b < max_body as u64 || b > max_buffered as u64 {
                    return Err(self.err(
                        "route.max_buffered_per_client",
                        Some(v.span()),
                        format!(
                            "{b} B is outside max_body ({max_body} B) to max_buffered \
                             ({max_buffered} B): one address could not send its largest \
                             request, or would be bounded by nothing"
                        ),
                    ));
                }
                b as usize
            }
        };
        let trusted_proxies = self.trusted_proxies(raw.trusted_proxies)?;
        let max_connections = match &raw.max_connections {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(v) => {
                self.bounded("route.max_connections", v, 1, MAX_CONNECTIONS_LIMIT as i64)? as usize
            }
        };
        let threads = match &raw.threads {
            None => None,
            Some(v) => Some(self.bounded("route.threads", v, 1, MAX_THREADS as i64)? as usize),
        };
        let agent_listen = match &raw.agent_listen {
            None => None,
            Some(v) => Some(v.get_ref().trim().parse().map_err(|_| {
                self.err(
                    "route.agent_listen",
                    Some(v.span()),
                    format!(
                        "{:?} is not a socket address; expected IP:PORT on the balancers' \
                         network, e.g. \"10.0.0.5:9400\"",
                        v.get_ref()
                    ),
                )
            })?),
        };
        if let Some(a) = agent_listen.filter(|a: &std::net::SocketAddr| *a == listen) {
            return Err(self.err(
                "route.agent_listen",
                at(&raw.agent_listen),
                format!("{a} is route.listen's address: the agent needs a port of its own"),
            ));
        }
        let balancers = match &raw.balancers {
            None => DEFAULT_BALANCERS,
            Some(v) => self.bounded("route.balancers", v, 1, i64::from(MAX_BALANCERS))? as u32,
        };
        let drain_timeout = self.duration(
            "route.drain_timeout",
            &raw.drain_timeout,
            DEFAULT_DRAIN_TIMEOUT,
        )?;
        let drain_grace =
            self.duration("route.drain_grace", &raw.drain_grace, DEFAULT_DRAIN_GRACE)?;
        for (key, raw_value, d) in [
            ("route.drain_timeout", &raw.drain_timeout, drain_timeout),
            ("route.drain_grace", &raw.drain_grace, drain_grace),
        ] {
            if d > MAX_DRAIN {
                return Err(self.err(
                    key,
                    at(raw_value),
                    format!("at most {} min", MAX_DRAIN.as_secs() / 60),
                ));
            }
        }
        let api_keys = self.api_keys(raw.api_keys)?;
        let aliases = self.aliases(raw.aliases, models)?;
        let mut per_model = BTreeMap::new();
        for (name, m) in raw.model.map(Spanned::into_inner).unwrap_or_default() {
            let key = join("route.model", name.get_ref());
            if !models.iter().any(|x| &x.name == name.get_ref()) {
                return Err(self.err(
                    &key,
                    Some(name.span()),
                    format!("no [[model]] named {:?}", name.get_ref()),
                ));
            }
            let m = m.into_inner();
            let max_queue = match &m.max_queue {
                None => None,
                Some(v) => {
                    Some(
                        self.bounded(&join(&key, "max_queue"), v, 0, MAX_QUEUE_LIMIT as i64)?
                            as usize,
                    )
                }
            };
            let paths = match &m.paths {
                None => None,
                Some(v) => Some(
                    PathRules::parse(v.get_ref().iter().map(|p| p.get_ref().as_str())).map_err(
                        |e| self.err(&join(&key, "paths"), Some(v.span()), e.to_string()),
                    )?,
                ),
            };
            per_model.insert(name.into_inner(), RouteModelConfig { max_queue, paths });
        }
        Ok(RouteConfig {
            listen,
            max_queue,
            queue_timeout,
            max_body,
            max_buffered,
            max_buffered_per_client,
            trusted_proxies,
            max_connections,
            threads,
            shutdown_grace,
            agent_listen,
            balancers,
            drain_timeout,
            drain_grace,
            api_keys,
            aliases,
            models: per_model,
        })
    }

    fn trusted_proxies(&self, raw: Opt<Vec<Spanned<String>>>) -> Res<TrustedProxies> {
        let Some(list) = raw else {
            return Ok(TrustedProxies::default());
        };
        if list.get_ref().len() > MAX_TRUSTED_PROXIES {
            return Err(self.err(
                "route.trusted_proxies",
                Some(list.span()),
                format!("at most {MAX_TRUSTED_PROXIES} addresses or blocks"),
            ));
        }
        let nets = list
            .into_inner()
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                Cidr::parse(s.get_ref().trim()).map_err(|e| {
                    self.err(
                        &index("route.trusted_proxies", i),
                        Some(s.span()),
                        e.to_string(),
                    )
                })
            })
            .collect::<Res<Vec<Cidr>>>()?;
        Ok(TrustedProxies(nets))
    }

    fn api_keys(&self, raw: Opt<Vec<Spanned<String>>>) -> Res<Vec<String>> {
        let Some(keys) = raw else {
            return Ok(Vec::new());
        };
        if keys.get_ref().len() > MAX_API_KEYS {
            return Err(self.err(
                "route.api_keys",
                Some(keys.span()),
                format!("at most {MAX_API_KEYS} keys"),
            ));
        }
        keys.into_inner()
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                if !API_KEY_LEN.contains(&k.get_ref().len())
                    || !k.get_ref().bytes().all(|b| b.is_ascii_graphic())
                {
                    return Err(self.err(
                        &index("route.api_keys", i),
                        Some(k.span()),
                        "each key is 16 to 512 printable ASCII characters without spaces",
                    ));
                }
                Ok(k.into_inner())
            })
            .collect()
    }

    fn aliases(
        &self,
        raw: Opt<BTreeMap<Spanned<String>, Spanned<String>>>,
        models: &[ModelConfig],
    ) -> Res<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (alias, target) in raw.map(Spanned::into_inner).unwrap_or_default() {
            let key = join("route.aliases", alias.get_ref());
            if models.iter().any(|m| &m.name == alias.get_ref()) {
                return Err(self.err(
                    &key,
                    Some(alias.span()),
                    format!(
                        "{:?} is a model's own name; an alias must be another name",
                        alias.get_ref()
                    ),
                ));
            }
            if !models.iter().any(|m| &m.name == target.get_ref()) {
                return Err(self.err(
                    &key,
                    Some(target.span()),
                    format!("no [[model]] named {:?}", target.get_ref()),
                ));
            }
            out.insert(alias.into_inner(), target.into_inner());
        }
        Ok(out)
    }
}
