//! [`DaemonBuilder`]: everything about a daemon before it starts (its configuration, ports,
//! environment and binary), then [`crate::Home`] and [`crate::Launch`] made from it.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::procs::Reaper;
use crate::{hearth, temp_dir, Config, Daemon, Home, Launch, Model};

/// Everything about a daemon before it starts.
pub struct DaemonBuilder {
    dir: tempfile::TempDir,
    config: Config,
    ports: Option<u16>,
    /// `[route] listen` given by the test (a fleet's host on an address of its own).
    route_listen: Option<SocketAddr>,
    env: Vec<(String, String)>,
    wrapper: Vec<String>,
    watchdog_pid: bool,
    own_binary: bool,
}

impl DaemonBuilder {
    pub(crate) fn new() -> DaemonBuilder {
        DaemonBuilder {
            dir: temp_dir(),
            config: Config::default(),
            ports: None,
            route_listen: None,
            env: Vec::new(),
            wrapper: Vec::new(),
            watchdog_pid: false,
            own_binary: false,
        }
    }

    /// The daemon's directory, there from the start (for sockets a test binds beside it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where the daemon's control socket will be.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("hearth.sock")
    }

    pub fn model(mut self, m: Model) -> Self {
        self.config.models.push(m);
        self
    }

    pub fn models(mut self, ms: impl IntoIterator<Item = Model>) -> Self {
        self.config.models.extend(ms);
        self
    }

    /// `daemon.tick` (default 250ms).
    pub fn tick(mut self, d: &str) -> Self {
        self.config.tick = d.into();
        self
    }

    /// `daemon.shutdown_timeout` (default 10s).
    pub fn shutdown_timeout(mut self, d: &str) -> Self {
        self.config.shutdown_timeout = d.into();
        self
    }

    /// `daemon.metrics = "127.0.0.1:PORT"`.
    pub fn metrics(mut self, port: u16) -> Self {
        self.config.metrics = Some(port);
        self
    }

    /// `daemon.log_level`; the daemon then starts without `RUST_LOG`, so that it applies.
    pub fn log_level(mut self, level: &str) -> Self {
        self.config.log_level = Some(level.into());
        self
    }

    /// `[gpus] backend` and the declared devices (uuid, memory): GPUs without a GPU.
    pub fn gpus(mut self, backend: &str, devices: &[(&str, &str)]) -> Self {
        self.config.gpu_backend = backend.into();
        self.config.gpu_devices = devices
            .iter()
            .map(|(u, m)| (u.to_string(), m.to_string()))
            .collect();
        self
    }

    /// Raw TOML appended to the file.
    pub fn extra_config(mut self, toml: &str) -> Self {
        self.config.extra.push_str(toml);
        self
    }

    /// `[route]` for `hearth route` on the same file: `listen` on a port of the daemon's, then
    /// `keys` (TOML) as they are.
    pub fn route(mut self, keys: &str) -> Self {
        self.config.route = Some(keys.into());
        self
    }

    /// How many replica ports (default: the models' `max`, summed, plus 4).
    /// Runs `text`, a whole configuration file (such as config.toml.example), in place of the
    /// rendered one: its socket, state_dir, ports and `[route] listen` move to this daemon's
    /// own (16 ports unless `ports` says otherwise); everything else stays as written.
    pub fn file(mut self, text: &str) -> Self {
        self.config.file = Some(text.to_string());
        if text.lines().any(|l| l.trim_start().starts_with("[route]")) {
            self.config.route.get_or_insert_with(String::new);
        }
        self.ports.get_or_insert(16);
        self
    }

    pub fn ports(mut self, n: u16) -> Self {
        self.ports = Some(n);
        self
    }

    /// `[route] listen` at `addr` (a port the test holds) instead of 127.0.0.1 and a port of
    /// the daemon's own: a fleet's hosts on 127.0.0.2, .3, ….
    pub fn route_listen(mut self, addr: SocketAddr) -> Self {
        self.route_listen = Some(addr);
        self
    }

    /// A variable in the daemon's environment.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// `NOTIFY_SOCKET`: the test plays systemd (see [`crate::NotifyRecorder`]).
    pub fn notify_socket(self, path: &Path) -> Self {
        let p = path.display().to_string();
        self.env("NOTIFY_SOCKET", &p)
    }

    /// `WATCHDOG_PID` set to the daemon's own pid, as systemd sets it.
    pub fn watchdog_pid_self(mut self) -> Self {
        self.watchdog_pid = true;
        self
    }

    /// Runs the daemon from a copy of the `hearth` binary in its directory (`bin/hearth`), which
    /// the test may replace ([`Daemon::replace_binary`]) before `hearth upgrade`; the replicas'
    /// commands still name the build's binary.
    pub fn own_binary(mut self) -> Self {
        self.own_binary = true;
        self
    }

    /// Runs the daemon under `argv…` (which must exec it, as `unshare -m sh -c '…; exec "$@"'`).
    pub fn wrapper(mut self, argv: &[&str]) -> Self {
        self.wrapper = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Takes the ports and writes the configuration: everything but the process. A root
    /// daemon with a model on the default account (no `user`) and no wrapper of the test's
    /// own runs on a private /etc without hearth's accounts ([`crate::FreshAccounts`]), as on a
    /// fresh machine: the account it makes is made there, never on this host.
    pub fn prepare(mut self) -> (Home, Launch) {
        let fresh = (self.wrapper.is_empty()
            && self.config.models.iter().any(|m| m.user.is_none()))
        .then(crate::FreshAccounts::new)
        .flatten();
        if let Some(f) = &fresh {
            self.wrapper = f.wrapper();
        }
        let n = self.ports.unwrap_or_else(|| {
            let max: u32 = self.config.models.iter().map(|m| m.scaling.max).sum();
            u16::try_from(max + 4).expect("a port range that fits")
        });
        let block = crate::ports::ports(n);
        let route_port = (self.config.route.is_some() && self.route_listen.is_none())
            .then(|| crate::ports::ports(1));
        let dir = self.dir;
        let reaper = Reaper::new(&dir.path().display().to_string())
            .with_cgroups_of(&dir.path().join("state"));
        let home = Home {
            socket: dir.path().join("hearth.sock"),
            config_path: dir.path().join("config.toml"),
            ports: block.range(),
            route_addr: route_port
                .as_ref()
                .map(|b| SocketAddr::from(([127, 0, 0, 1], b.first)))
                .or(self.route_listen.filter(|_| self.config.route.is_some())),
            config: self.config,
            _ports: block,
            _route_port: route_port,
            fresh,
            reaper,
            dir,
        };
        home.write_config();
        let binary = if self.own_binary {
            let bin = home.dir.path().join("bin");
            fs::create_dir_all(&bin).expect("the daemon's bin directory");
            let copy = bin.join("hearth");
            fs::copy(hearth(), &copy).expect("copy the hearth binary");
            copy
        } else {
            hearth().to_path_buf()
        };
        let launch = Launch {
            env: self.env,
            wrapper: self.wrapper,
            watchdog_pid: self.watchdog_pid,
            binary,
        };
        (home, launch)
    }

    /// Starts the daemon and waits until its socket answers.
    pub fn start(self) -> Daemon {
        let (home, launch) = self.prepare();
        launch.start(home)
    }

    /// Starts the daemon without waiting for anything.
    pub fn spawn(self) -> Daemon {
        let (home, launch) = self.prepare();
        launch.spawn(home)
    }
}
