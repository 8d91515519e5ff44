//! The daemon's configuration file, rendered from [`Config`] and [`Model`]s.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// A TOML basic string (JSON's escapes are TOML's).
pub fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

fn list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| q(s)).collect();
    format!("[{}]", items.join(", "))
}

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
        let mut s = String::new();
        let mut env = vec![format!("{} = {}", q(mark.0), q(mark.1))];
        env.extend(self.env.iter().map(|(k, v)| format!("{} = {}", q(k), q(v))));
        let _ = write!(
            s,
            "[[model]]\nname = {}\nversion = {}\ncommand = {}\nenv = {{ {} }}\n",
            q(&self.name),
            q(&self.version),
            list(&self.command),
            env.join(", "),
        );
        if let Some(u) = &self.user {
            let _ = writeln!(s, "user = {}", q(u));
        }
        let _ = writeln!(s, "gpus = {}", self.gpus);
        if let Some(m) = &self.gpu_memory {
            let _ = writeln!(s, "gpu_memory = {}", q(m));
        }
        if let Some(p) = &self.placement {
            let _ = writeln!(s, "placement = {}", q(p));
        }
        if let Some(n) = &self.device_naming {
            let _ = writeln!(s, "device_naming = {}", q(n));
        }
        if let Some(a) = self.start_alone {
            let _ = writeln!(s, "start_alone = {a}");
        }
        if let Some(p) = self.priority {
            let _ = writeln!(s, "priority = {p}");
        }
        if !self.prefetch.is_empty() {
            let _ = writeln!(s, "prefetch = {}", list(&self.prefetch));
        }
        if let Some(n) = self.slots {
            let _ = writeln!(s, "slots = {n}");
        }
        let w = &self.warmup;
        let _ = write!(
            s,
            "stop_grace = {}\n\n[model.warmup]\nurl = \"http://127.0.0.1:{{port}}{}\"\nbody = {}\n\
             headers = {{ \"content-type\" = \"application/json\" }}\nexpect_status = 200\n\
             expect_body = {}\ntimeout = {}\nstartup_timeout = {}\nrecheck = {}\n\n",
            q(&self.stop_grace),
            w.path,
            q(&w.body),
            q(&w.expect_body),
            q(&w.timeout),
            q(&w.startup_timeout),
            q(&w.recheck),
        );
        if let Some(l) = &self.liveness {
            let _ = write!(
                s,
                "[model.liveness]\nurl = \"http://127.0.0.1:{{port}}/health\"\ninterval = {}\n\
                 timeout = {}\nfailures = {}\n\n",
                q(&l.interval),
                q(&l.timeout),
                l.failures
            );
        }
        if let Some(sig) = &self.signal {
            let _ = write!(
                s,
                "[model.signal]\nscrape = \"http://127.0.0.1:{{port}}/metrics\"\nformat = {}\n\
                 interval = {}\n\n",
                q(&sig.format),
                q(&sig.interval)
            );
        }
        let c = &self.scaling;
        let _ = write!(
            s,
            "[model.scaling]\nmin = {}\nmax = {}\nwarm_pool = {}\n",
            c.min, c.max, c.warm_pool
        );
        for (key, value) in [
            ("target_wait", &c.target_wait),
            ("stale_after", &c.stale_after),
            ("down_stabilization", &c.down_stabilization),
            ("down_step", &c.down_step),
            ("drain_timeout", &c.drain_timeout),
            ("idle_to_zero", &c.idle_to_zero),
        ] {
            if let Some(v) = value {
                let _ = writeln!(s, "{key} = {}", q(v));
            }
        }
        if let Some(n) = c.max_up_step {
            let _ = writeln!(s, "max_up_step = {n}");
        }
        s.push('\n');
        if let Some(lines) = &self.sleep {
            let _ = writeln!(s, "[model.sleep]\n{lines}\n");
        }
        s
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
        // hearth refuses a file without [[model]] unless it says `model = []` (a cut-short file
        // must never read as "stop every model"); the key has to come before any table.
        let mut s = String::from(if self.models.is_empty() {
            "model = []\n"
        } else {
            ""
        });
        s += &format!(
            "[daemon]\nsocket = {}\nstate_dir = {}\nports = \"{}-{}\"\ntick = {}\n\
             shutdown_timeout = {}\n",
            q(&dir.join("hearth.sock").display().to_string()),
            q(&dir.join("state").display().to_string()),
            ports.0,
            ports.1,
            q(&self.tick),
            q(&self.shutdown_timeout),
        );
        if let Some(p) = self.metrics {
            let _ = writeln!(s, "metrics = \"127.0.0.1:{p}\"");
        }
        if let Some(level) = &self.log_level {
            let _ = writeln!(s, "log_level = {}", q(level));
        }
        let _ = write!(s, "\n[gpus]\nbackend = {}\n\n", q(&self.gpu_backend));
        for (uuid, memory) in &self.gpu_devices {
            let _ = write!(
                s,
                "[[gpus.device]]\nuuid = {}\nmemory = {}\n\n",
                q(uuid),
                q(memory)
            );
        }
        for m in &self.models {
            s.push_str(&m.render(mark));
        }
        s.push_str(&self.extra);
        if let (Some(keys), Some(addr)) = (&self.route, listen) {
            let _ = write!(s, "\n[route]\nlisten = \"{addr}\"\n{keys}");
        }
        s
    }
}

/// `text` with the lines that set `socket`, `state_dir`, `ports` and `listen` (at the start of a
/// line, as config.toml.example writes them) pointing at the daemon's own.
fn moved(text: &str, dir: &Path, ports: (u16, u16), listen: Option<SocketAddr>) -> String {
    text.lines()
        .map(|l| {
            let key = l.split('=').next().unwrap_or("").trim();
            match key {
                "socket" => format!(
                    "socket = {}",
                    q(&dir.join("hearth.sock").display().to_string())
                ),
                "state_dir" => format!(
                    "state_dir = {}",
                    q(&dir.join("state").display().to_string())
                ),
                "ports" => format!("ports = \"{}-{}\"", ports.0, ports.1),
                "listen" if listen.is_some() => {
                    format!("listen = \"{}\"", listen.expect("checked"))
                }
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}
