//! The front door's replicas, the router process, and the arrange step the tests share
//! ([`front_door`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use super::{get, sample};
use crate::daemon::spawn_marked;
use crate::procs::signal;
use crate::{poll, Daemon, DaemonBuilder, Home, Model, Signal};

/// How long a router may take to answer /health after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(10);

impl Model {
    /// [`Model::toy`] as the front door's tests run it, where a request may take seconds: a
    /// warm-up try may take 30 s, and is rechecked every 10 min only (a recheck would take a
    /// slot these tests count); `down_step` 2 m, `idle_to_zero` 30 m.
    pub fn front_toy(name: &str, args: &[&str]) -> Model {
        let mut m = Model::toy(name, args);
        m.warmup.timeout = "30s".into();
        m.warmup.recheck = "10m".into();
        m.scaling.down_step = Some("2m".into());
        m.scaling.idle_to_zero = Some("30m".into());
        m
    }

    /// The streaming stand-in (`testkit/src/route/stream_replica.py`), as [`Model::front_toy`].
    pub fn streaming(name: &str) -> Model {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/route/stream_replica.py");
        let script = script.display().to_string();
        Model::front_toy(name, &[]).command(&["python3", &script, "--port", "{port}"])
    }
}

/// The daemon of the front door's tests, before it starts: `models` on a 100 ms tick, one
/// declared GPU, and `[route]` with `route_keys` after `listen`.
pub fn front_door_daemon(
    models: impl IntoIterator<Item = Model>,
    route_keys: &str,
) -> DaemonBuilder {
    Daemon::builder()
        .models(models)
        .tick("100ms")
        .gpus("static", &[("GPU-route-test", "1GiB")])
        .route(route_keys)
}

/// The arrange step most front-door tests share: [`front_door_daemon`] started, then `hearth
/// route` on its file, answering /health. Bind the three in this order (`let (daemon, router,
/// addr) = …`) so that the router is dropped before the daemon.
pub fn front_door(
    models: impl IntoIterator<Item = Model>,
    route_keys: &str,
) -> (Daemon, Router, SocketAddr) {
    let daemon = front_door_daemon(models, route_keys).start();
    let router = Router::start(&daemon);
    let addr = router.addr;
    (daemon, router, addr)
}

/// `hearth route --config FILE` on a daemon's configuration, its output appended to
/// `route.log` in the daemon's directory. Killed on drop.
pub struct Router {
    pub addr: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
    /// The listen port of a second front door ([`Router::another`]), held while it runs.
    _port: Option<crate::ports::PortBlock>,
}

impl Router {
    /// Starts the router on `home`'s file (which has `[route]`: [`DaemonBuilder::route`]) and
    /// waits until it answers /health; panics, with its log, if it exits first or does not
    /// answer in time. Marked as `home`'s, so that its cleanup finds it.
    pub fn start(home: &Home) -> Router {
        let addr = home
            .route_addr
            .expect("a configuration with [route] (DaemonBuilder::route)");
        let log = home.dir.path().join("route.log");
        Router::start_on(home, &home.config_path, addr, log, None)
    }

    /// Another front door on the same models and daemon: `home`'s file with `[route] listen`
    /// on a port of its own (`route-N.toml`, its log `route-N.log`, N its port).
    pub fn another(home: &Home) -> Router {
        let block = crate::ports::ports(1);
        let addr = SocketAddr::from(([127, 0, 0, 1], block.first));
        let listen = home.route_addr.expect("a configuration with [route]");
        let text = home.config_text().replace(
            &format!("listen = \"{listen}\""),
            &format!("listen = \"{addr}\""),
        );
        assert!(text.contains(&addr.to_string()), "no listen line to move");
        let config = home.dir.path().join(format!("route-{}.toml", block.first));
        std::fs::write(&config, text).expect("write the second front door's file");
        let log = home.dir.path().join(format!("route-{}.log", block.first));
        Router::start_on(home, &config, addr, log, Some(block))
    }

    fn start_on(
        home: &Home,
        config: &Path,
        addr: SocketAddr,
        log: PathBuf,
        port: Option<crate::ports::PortBlock>,
    ) -> Router {
        let mut cmd = Command::new(crate::hearth());
        cmd.arg("route")
            .arg("--config")
            .arg(config)
            .env_remove("HEARTH_SOCKET")
            .env("RUST_LOG", "info");
        let child = spawn_marked(&mut cmd, home, &log, &log);
        let mut router = Router {
            addr,
            child: Some(child),
            log,
            _port: port,
        };
        let up = poll(START_TIMEOUT, || {
            if let Some(st) = router
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("wait"))
            {
                panic!(
                    "hearth route exited at start ({st}):\n{}",
                    router.log_tail(40)
                );
            }
            get(addr, "/health").ok().filter(|r| r.status == 200)
        });
        assert!(
            up.is_some(),
            "hearth route never answered within {START_TIMEOUT:?}:\n{}",
            router.log_tail(40)
        );
        router
    }

    /// The front door's pid, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn signal(&self, sig: Signal) {
        if let Some(c) = &self.child {
            signal(c.id() as i32, sig);
        }
    }

    /// Waits for the router to exit (and reaps it); None if it still runs after `timeout`, or
    /// was reaped before.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        let status = poll(timeout, || c.try_wait().expect("wait"))?;
        self.child = None;
        Some(status)
    }

    /// SIGKILLs the router and reaps it.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.signal(Signal::SIGKILL);
        self.wait_exit(START_TIMEOUT)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The replica of `model` holding requests now, per the router (one with in_flight ≥ 1).
    pub fn busy_replica(&self, model: &str) -> Option<String> {
        let page = get(self.addr, "/metrics").ok()?.text();
        let prefix = format!("hearth_route_replica_in_flight{{model=\"{model}\",replica=\"");
        page.lines().find_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (id, value) = rest.split_once("\"} ")?;
            (value.trim().parse::<f64>().ok()? >= 1.0).then(|| id.to_string())
        })
    }

    /// A sample of the router's metrics: `name{labels}` exactly as exposed.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let r = get(self.addr, "/metrics").ok()?;
        sample(&r.text(), series)
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- router log ----\n{}", self.log_tail(60));
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
