//! What the front door runs with, typed and validated before anything starts: the listen address,
//! the limits on what clients may send and queue, the keys, the aliases, and per model its slots,
//! queue bound, target wait and the paths its prefix route passes.
//!
//! Built from the configuration file the daemon reads (models, their `slots` and
//! `scaling.target_wait`, `daemon.socket`, and the `[route]` table, checked in
//! `config::validate::route`), so that the router and the daemon agree on the models by
//! construction.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::paths::PathRules;
use super::proxies::TrustedProxies;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Requests a model's FIFO holds before answering 429.
pub const DEFAULT_MAX_QUEUE: usize = 1024;
/// How long a request may wait for a slot before 503. Long enough to cover a promotion and a
/// short cold start; clients (the `openai` library: 10 min) wait longer than this.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request body. Chat requests with base64 images run to a few MiB.
pub const DEFAULT_MAX_BODY: usize = 8 << 20;
/// Request bodies held at once, all requests together (reading, queued, being sent).
pub const DEFAULT_MAX_BUFFERED: usize = 1 << 30;
/// Without `max_buffered_per_client`, one client address may hold this share of
/// `max_buffered` (and at least `max_body`, so that its largest request can be read).
pub const DEFAULT_PER_CLIENT_SHARE: usize = 8;
/// Concurrent client connections; more wait in the kernel's accept backlog.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Requests one replica serves at once (docs/design.md: `[[model]] slots`, default 1).
pub const DEFAULT_SLOTS: u32 = 1;
/// Threads serving connections, at most: a proxy's work is system calls, and a few threads
/// carry tens of thousands of requests a second, more than a GPU host's replicas serve.
pub const DEFAULT_MAX_THREADS: usize = 4;
pub const MAX_THREADS: usize = 256;
/// How long a SIGTERM lets requests in progress finish.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// `scaling.stale_after`'s default, for settings made without a file.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(5);
/// Balancers in front of the fleet, each applying the agent's `maxconn` on its own.
pub const DEFAULT_BALANCERS: u32 = 1;
pub const MAX_BALANCERS: u32 = 1024;
/// Longest a drain waits for the balancers to be told and to stop sending; a balancer seen
/// once that never polls again holds it no longer than this.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// No new request for this long, once every balancer was answered `drain`: the drain is done.
/// Covers a request a balancer sent just before it read the answer.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Bound on both, so that a stop is never held for a typo's hours.
pub const MAX_DRAIN: Duration = Duration::from_secs(3600);

/// Upper bounds on configured numbers, so that nothing is sized by a typo.
pub const MAX_SLOTS: u32 = 65_536;
pub const MAX_QUEUE_LIMIT: usize = 1_000_000;
pub const MAX_BODY_LIMIT: usize = 1 << 30;
pub const MAX_BUFFERED_LIMIT: usize = 1 << 40;
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

#[derive(Debug, Clone, PartialEq)]
pub struct RouteSettings {
    pub listen: SocketAddr,
    /// The daemon's control socket (`daemon.socket`): watch and reports.
    pub socket: PathBuf,
    pub queue_timeout: Duration,
    pub max_body: usize,
    pub max_buffered: usize,
    /// What one client address (not a trusted proxy) may hold of `max_buffered`.
    pub max_buffered_per_client: usize,
    /// Balancers: exempt from the per-address bounds, the silent deadline and being closed for
    /// room.
    pub trusted_proxies: TrustedProxies,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
    /// HAProxy agent checks (docs/fleet.md); None: not answered.
    pub agent_listen: Option<SocketAddr>,
    pub balancers: u32,
    pub drain_timeout: Duration,
    pub drain_grace: Duration,
    /// Threads serving client connections (each a single-threaded runtime of its own).
    pub threads: usize,
    /// Bearer tokens; empty: no authentication.
    pub api_keys: Vec<String>,
    /// Another name → a configured model.
    pub aliases: BTreeMap<String, String>,
    pub models: Vec<ModelRoute>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelRoute {
    pub name: String,
    /// Requests one replica serves at once; the router never sends more.
    pub slots: u32,
    /// Requests the model's FIFO holds; one more is answered 429.
    pub max_queue: usize,
    /// `scaling.target_wait`: a report goes out the moment the oldest wait crosses it.
    pub target_wait: Duration,
    /// `scaling.stale_after`: a view of the daemon older than this is answered `maint`.
    pub stale_after: Duration,
    /// What `/m/{model}/…` passes.
    pub paths: PathRules,
}

/// `max_buffered_per_client` where the file does not say: an eighth of `max_buffered`, at
/// least `max_body`.
pub fn per_client_default(max_buffered: usize, max_body: usize) -> usize {
    (max_buffered / DEFAULT_PER_CLIENT_SHARE)
        .max(max_body)
        .min(max_buffered)
}

impl RouteSettings {
    /// Settings for the models with every `[route]` key at its default.
    pub fn defaults(socket: PathBuf, models: Vec<(String, Duration)>) -> RouteSettings {
        RouteSettings {
            listen: DEFAULT_LISTEN.parse().expect("a valid address"),
            socket,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            max_body: DEFAULT_MAX_BODY,
            max_buffered: DEFAULT_MAX_BUFFERED,
            max_buffered_per_client: per_client_default(DEFAULT_MAX_BUFFERED, DEFAULT_MAX_BODY),
            trusted_proxies: TrustedProxies::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            agent_listen: None,
            balancers: DEFAULT_BALANCERS,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            drain_grace: DEFAULT_DRAIN_GRACE,
            threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(DEFAULT_MAX_THREADS),
            api_keys: Vec::new(),
            aliases: BTreeMap::new(),
            models: models
                .into_iter()
                .map(|(name, target_wait)| ModelRoute {
                    name,
                    slots: DEFAULT_SLOTS,
                    max_queue: DEFAULT_MAX_QUEUE,
                    target_wait,
                    stale_after: DEFAULT_STALE_AFTER,
                    paths: PathRules::default_inference(),
                })
                .collect(),
        }
    }

    /// What `hearth route --config FILE` runs with: the file's models and its `[route]` table.
    pub fn from_config(config: &crate::config::Config) -> RouteSettings {
        let r = &config.route;
        let mut s = RouteSettings::defaults(
            config.daemon.socket.clone(),
            config
                .models
                .iter()
                .map(|m| (m.name.clone(), m.scaling.target_wait))
                .collect(),
        );
        s.listen = r.listen;
        s.queue_timeout = r.queue_timeout;
        s.max_body = r.max_body;
        s.max_buffered = r.max_buffered;
        s.max_buffered_per_client = r.max_buffered_per_client;
        s.trusted_proxies = r.trusted_proxies.clone();
        s.max_connections = r.max_connections;
        s.shutdown_grace = r.shutdown_grace;
        s.agent_listen = r.agent_listen;
        s.balancers = r.balancers;
        s.drain_timeout = r.drain_timeout;
        s.drain_grace = r.drain_grace;
        if let Some(t) = r.threads {
            s.threads = t;
        }
        s.api_keys = r.api_keys.clone();
        s.aliases = r.aliases.clone();
        for (m, cfg) in s.models.iter_mut().zip(&config.models) {
            m.slots = cfg.slots;
            m.stale_after = cfg.scaling.stale_after;
            let own = r.models.get(&m.name);
            m.max_queue = own.and_then(|o| o.max_queue).unwrap_or(r.max_queue);
            if let Some(p) = own.and_then(|o| o.paths.clone()) {
                m.paths = p;
            }
        }
        s
    }

    /// A configured model by its own name (as the daemon names it), not an alias.
    pub fn resolve_own(&self, name: &str) -> Option<usize> {
        self.models.iter().position(|m| m.name == name)
    }

    /// The configured model a client's name means: a model's own name or an alias.
    pub fn resolve(&self, name: &str) -> Option<usize> {
        let name = self.aliases.get(name).map(String::as_str).unwrap_or(name);
        self.models.iter().position(|m| m.name == name)
    }
}
