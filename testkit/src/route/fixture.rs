//! The daemon's configuration for the front door's tests, the daemon, the router, and the
//! arrange step they share ([`front_door`]).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{free_ports, get, guarded, kill, procs_with_env, random_u64, sample, tail};

/// One `[[model]]` of the daemon's configuration.
#[derive(Debug, Clone)]
pub struct Model {
    pub name: String,
    pub command: Vec<String>,
    pub min: u32,
    pub max: u32,
    pub warm_pool: u32,
    pub target_wait: &'static str,
    pub idle_to_zero: &'static str,
    pub warmup_url: String,
    pub warmup_body: String,
    pub expect_body: &'static str,
    pub startup_timeout: &'static str,
    pub stop_grace: &'static str,
    pub drain_timeout: &'static str,
    /// `[[model]] slots`
    pub slots: u32,
    pub down_stabilization: &'static str,
    pub down_step: &'static str,
}

impl Model {
    /// `hearth toy-server --port {port} ARGS…`: min 2, no pool.
    pub fn toy(name: &str, args: &[&str]) -> Model {
        Model::with_command(name, crate::config::toy_command(args))
    }

    /// The streaming stand-in (`testkit/src/route/stream_replica.py`).
    pub fn streaming(name: &str) -> Model {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/route/stream_replica.py");
        Model::with_command(
            name,
            vec![
                "python3".into(),
                script.display().to_string(),
                "--port".into(),
                "{port}".into(),
            ],
        )
    }

    pub fn with_command(name: &str, command: Vec<String>) -> Model {
        Model {
            name: name.into(),
            command,
            min: 2,
            max: 2,
            warm_pool: 0,
            target_wait: "2s",
            idle_to_zero: "30m",
            warmup_url: "http://127.0.0.1:{port}/v1/completions".into(),
            warmup_body: format!(r#"{{"model":"{name}","prompt":"Hello","max_tokens":4}}"#),
            expect_body: "choices",
            startup_timeout: "1m",
            stop_grace: "2s",
            drain_timeout: "30s",
            slots: 1,
            down_stabilization: "10m",
            down_step: "2m",
        }
    }

    pub fn scale(mut self, min: u32, max: u32, warm_pool: u32) -> Model {
        self.min = min;
        self.max = max;
        self.warm_pool = warm_pool;
        self
    }

    fn render(&self) -> String {
        let command: Vec<String> = self.command.iter().map(|s| crate::config::q(s)).collect();
        // The account the test runs as, as testkit's presets do: a root daemon would otherwise
        // run the replicas as an unprivileged account that may not reach the test's files.
        let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map(|u| format!("user = {}\n", crate::config::q(&u.name)))
            .unwrap_or_default();
        format!(
            "[[model]]\nname = {}\ncommand = [{}]\ngpus = 0\n{user}stop_grace = {}\nslots = {}\n\n\
             [model.warmup]\nurl = {}\nbody = {}\nheaders = {{ \"content-type\" = \"application/json\" }}\n\
             expect_body = {}\ntimeout = \"30s\"\nstartup_timeout = {}\nrecheck = \"10m\"\n\n\
             [model.scaling]\nmin = {}\nmax = {}\nwarm_pool = {}\ntarget_wait = {}\n\
             idle_to_zero = {}\ndown_stabilization = {}\ndown_step = {}\ndrain_timeout = {}\n\n",
            crate::config::q(&self.name),
            command.join(", "),
            crate::config::q(self.stop_grace),
            self.slots,
            crate::config::q(&self.warmup_url),
            crate::config::q(&self.warmup_body),
            crate::config::q(self.expect_body),
            crate::config::q(self.startup_timeout),
            self.min,
            self.max,
            self.warm_pool,
            crate::config::q(self.target_wait),
            crate::config::q(self.idle_to_zero),
            crate::config::q(self.down_stabilization),
            crate::config::q(self.down_step),
            crate::config::q(self.drain_timeout),
        )
    }
}

/// A temporary directory with the daemon's configuration for `models`.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
}

impl Setup {
    pub fn new(models: &[Model]) -> Setup {
        Setup::with_spare_ports(models, 2)
    }

    /// With `spare` ports beyond the models' `max` (a rollout at `max` starts its new replicas
    /// beside the old ones).
    pub fn with_spare_ports(models: &[Model], spare: u32) -> Setup {
        let dir = tempfile::Builder::new()
            .prefix("hearth-route-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("hearth.sock");
        let n: u32 = models.iter().map(|m| m.max).sum::<u32>() + spare;
        let ports = free_ports(n as u16);
        let mut text = format!(
            "[daemon]\nsocket = {}\nstate_dir = {}\nports = \"{}-{}\"\ntick = \"100ms\"\n\
             shutdown_timeout = \"10s\"\n\n[gpus]\nbackend = \"static\"\n\
             [[gpus.device]]\nuuid = \"GPU-route-test\"\nmemory = \"1GiB\"\n\n",
            crate::config::q(&socket.display().to_string()),
            crate::config::q(&dir.path().join("state").display().to_string()),
            ports.0,
            ports.1,
        );
        for m in models {
            text.push_str(&m.render());
        }
        let config = dir.path().join("config.toml");
        fs::write(&config, text).unwrap();
        Setup {
            dir,
            config,
            socket,
        }
    }

    /// Adds the `[route]` table (listen on a free port, then `extra`) to the configuration
    /// file and returns the file and the address.
    pub fn route_file(&self, extra: &str) -> (PathBuf, SocketAddr) {
        let port = free_ports(1).0;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut text = fs::read_to_string(&self.config).unwrap();
        text.push_str(&format!("\n[route]\nlisten = \"{addr}\"\n{extra}"));
        fs::write(&self.config, text).unwrap();
        (self.config.clone(), addr)
    }
}

/// `hearth VERB --config CONFIG`, its output to `log`, guarded (see `guarded`).
fn launch(verb: &str, config: &Path, log: &Path) -> Child {
    let out = fs::File::create(log).unwrap();
    let mut cmd = Command::new(crate::hearth());
    cmd.arg(verb)
        .arg("--config")
        .arg(config)
        .env_remove("HEARTH_SOCKET")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    guarded(&mut cmd);
    cmd.spawn()
        .unwrap_or_else(|e| panic!("start hearth {verb}: {e}"))
}

pub struct Daemon {
    pub socket: PathBuf,
    child: Child,
    log: PathBuf,
    env_mark: String,
}

impl Daemon {
    pub fn start(setup: &Setup) -> Daemon {
        let log = setup.dir.path().join("daemon.log");
        let child = launch("daemon", &setup.config, &log);
        let d = Daemon {
            socket: setup.socket.clone(),
            child,
            log,
            env_mark: format!("HEARTH_SOCKET={}", setup.socket.display()),
        };
        crate::wait_until("the daemon's socket", Duration::from_secs(10), || {
            UnixStream::connect(&d.socket).ok()
        });
        d
    }

    pub fn request(&self, req: Value) -> Value {
        let s = UnixStream::connect(&self.socket).expect("connect to the daemon");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().unwrap();
        w.write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    pub fn model(&self, name: &str) -> Value {
        let a = self.request(json!({"op": "status", "model": name}));
        assert_eq!(a["ok"], json!(true), "{a}");
        a["status"]["models"][0].clone()
    }

    /// Replicas of `model` in `state`.
    pub fn in_state(&self, model: &str, state: &str) -> Vec<Value> {
        self.model(model)["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["state"] == state)
            .cloned()
            .collect()
    }

    /// A replica of `model` by id, if the daemon still has it.
    pub fn replica(&self, model: &str, id: &str) -> Option<Value> {
        self.model(model)["replicas"]
            .as_array()?
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
    }

    /// Waits until `model` has `n` routed replicas; returns them.
    pub fn wait_routed(&self, model: &str, n: usize, timeout: Duration) -> Vec<Value> {
        crate::wait_until(
            &format!("{n} routed replica(s) of {model}"),
            timeout,
            || {
                let r = self.in_state(model, "routed");
                (r.len() == n).then_some(r)
            },
        )
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", tail(&self.log, 60));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = procs_with_env(&self.env_mark);
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for p in left {
                kill(-p, nix::libc::SIGKILL);
                kill(p, nix::libc::SIGKILL);
            }
            std::thread::sleep(crate::POLL);
        }
    }
}

pub struct Router {
    pub addr: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
}

impl Router {
    /// `hearth route --config CONFIG` (the file from `Setup::route_file`); waits until it
    /// answers /health.
    pub fn start(config: &Path, addr: SocketAddr) -> Router {
        let log = config.with_extension(format!("route.{}.log", random_u64() % 100_000));
        let mut child = launch("route", config, &log);
        let ok = crate::poll(Duration::from_secs(10), || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("hearth route exited at start ({st}):\n{}", tail(&log, 40));
            }
            get(addr, "/health").ok().filter(|r| r.status == 200)
        });
        assert!(
            ok.is_some(),
            "hearth route never answered:\n{}",
            tail(&log, 40)
        );
        Router {
            addr,
            child: Some(child),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Sends `sig` (none for 0) and waits for the exit.
    pub fn kill(&mut self, sig: i32) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        if sig != 0 {
            kill(c.id() as i32, sig);
        }
        c.wait().ok()
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
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
            eprintln!("---- router log ----\n{}", tail(&self.log, 60));
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The arrange step most front-door tests share: the daemon on `setup`'s configuration, then the
/// `[route]` table (a free port, then `route_extra`) added to that file, then `hearth route` on it,
/// answering /health. Bind the three in this order (`let (daemon, router, addr) = …`) so that the
/// router is dropped before the daemon, and both before `setup`'s directory.
pub fn front_door(setup: &Setup, route_extra: &str) -> (Daemon, Router, SocketAddr) {
    let daemon = Daemon::start(setup);
    let (route, addr) = setup.route_file(route_extra);
    let router = Router::start(&route, addr);
    (daemon, router, addr)
}
