//! Harness for the systemd, reload and metrics tests: runs the real `hearth` binary as a daemon
//! in a temporary directory, with `hearth toy-server` replicas, and talks to it over its socket,
//! its CLI and HTTP.
//!
//! Cleanup, also when a test panics: `Daemon`'s Drop SIGKILLs the daemon, then every process
//! whose environment carries this daemon's mark (`HEARTH_TEST_MARK=<its temp dir>`, set in every
//! model's `env`, so replicas have it whatever else they strip), until none is left. The daemon
//! also gets PR_SET_PDEATHSIG, so a test binary killed from outside takes its daemon along, and
//! the daemon's replicas die with the daemon.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");
pub const POLL: Duration = Duration::from_millis(25);

// ---- waiting ----------------------------------------------------------------------------------

/// Polls `f` until it returns Some; panics naming `what` after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

// ---- ports ------------------------------------------------------------------------------------

static TAKEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// `n` consecutive loopback ports, free now, of this test alone: chosen at random in 12000-19999
/// (below the kernel's ephemeral range, so outgoing connections cannot take them, and apart from
/// the range the other integration tests draw from), never twice in one test binary.
pub fn free_ports(n: u16) -> (u16, u16) {
    const LOW: u16 = 12000;
    const HIGH: u16 = 20000;
    let blocks = (HIGH - LOW) / n;
    for _ in 0..500 {
        let first = LOW + (random_u64() % u64::from(blocks)) as u16 * n;
        let last = first + n - 1;
        let mut taken = TAKEN.lock().unwrap();
        let taken = taken.get_or_insert_with(HashSet::new);
        if (first..=last).any(|p| taken.contains(&p)) {
            continue;
        }
        if (first..=last).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            taken.extend(first..=last);
            return (first, last);
        }
    }
    panic!("no free block of {n} ports in {LOW}-{HIGH}");
}

// ---- configuration ----------------------------------------------------------------------------

/// A TOML basic string.
pub fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// One `[[model]]` of toy-server replicas.
#[derive(Debug, Clone)]
pub struct Toy {
    pub name: String,
    pub version: String,
    /// Arguments after `toy-server --port {port}`.
    pub args: Vec<String>,
    /// Runs the server through `env -u HEARTH_SOCKET`, so it does not report its own queue.
    pub silent: bool,
    pub min: u32,
    pub max: u32,
    pub warm_pool: u32,
    pub startup_timeout: String,
    pub target_wait: String,
    pub stale_after: String,
    /// (devices per replica, gpu_memory); CPU-only when None.
    pub gpus: Option<(u32, String)>,
}

impl Toy {
    /// 2 routed + 1 warm of `toy-server --load-time 1s`.
    pub fn new(name: &str) -> Toy {
        Toy {
            name: name.into(),
            version: "1".into(),
            args: vec!["--load-time".into(), "1s".into()],
            silent: false,
            min: 2,
            max: 4,
            warm_pool: 1,
            startup_timeout: "1m".into(),
            target_wait: "10s".into(),
            stale_after: "5s".into(),
            gpus: None,
        }
    }

    fn render(&self, mark: &str) -> String {
        let mut command: Vec<String> = Vec::new();
        if self.silent {
            command.extend(["env", "-u", "HEARTH_SOCKET"].map(String::from));
        }
        command.extend([HEARTH, "toy-server", "--port", "{port}"].map(String::from));
        command.extend(self.args.iter().cloned());
        let command: Vec<String> = command.iter().map(|s| q(s)).collect();
        let (gpus, memory) = match &self.gpus {
            Some((n, mem)) => (*n, format!("gpu_memory = {}\n", q(mem))),
            None => (0, String::new()),
        };
        format!(
            "[[model]]\nname = {name}\nversion = {version}\ncommand = [{command}]\n\
             env = {{ HEARTH_TEST_MARK = {mark} }}\ngpus = {gpus}\n{memory}stop_grace = \"2s\"\n\n\
             [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n\
             body = '{{\"model\":\"toy\",\"prompt\":\"Hello\",\"max_tokens\":4}}'\n\
             headers = {{ \"content-type\" = \"application/json\" }}\nexpect_status = 200\n\
             expect_body = \"choices\"\ntimeout = \"5s\"\nstartup_timeout = {startup}\n\
             recheck = \"1m\"\n\n\
             [model.scaling]\nmin = {min}\nmax = {max}\nwarm_pool = {pool}\n\
             target_wait = {target}\nstale_after = {stale}\ndown_stabilization = \"10m\"\n\
             down_step = \"5m\"\ndrain_timeout = \"5s\"\n\n",
            name = q(&self.name),
            version = q(&self.version),
            command = command.join(", "),
            mark = q(mark),
            startup = q(&self.startup_timeout),
            min = self.min,
            max = self.max,
            pool = self.warm_pool,
            target = q(&self.target_wait),
            stale = q(&self.stale_after),
        )
    }
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub tick: String,
    pub shutdown_timeout: String,
    /// Serve /metrics on this port.
    pub metrics: Option<u16>,
    /// `[gpus] backend = "static"` with these (uuid, memory); `auto` with none when empty.
    pub static_gpus: Vec<(String, String)>,
    /// `daemon.log_level`; when set, the daemon starts without RUST_LOG so that it applies.
    pub log_level: Option<String>,
    pub models: Vec<Toy>,
}

impl Opts {
    pub fn new(models: Vec<Toy>) -> Opts {
        Opts {
            tick: "100ms".into(),
            shutdown_timeout: "15s".into(),
            metrics: None,
            static_gpus: Vec::new(),
            log_level: None,
            models,
        }
    }
}

/// The configuration file for a daemon in `dir` with replica ports `ports`.
pub fn config_text(dir: &Path, ports: (u16, u16), opts: &Opts) -> String {
    let mark = mark_of(dir);
    let mut s = format!(
        "[daemon]\nsocket = {}\nstate_dir = {}\nports = \"{}-{}\"\ntick = {}\n\
         shutdown_timeout = {}\n",
        q(&dir.join("hearth.sock").display().to_string()),
        q(&dir.join("state").display().to_string()),
        ports.0,
        ports.1,
        q(&opts.tick),
        q(&opts.shutdown_timeout),
    );
    if let Some(p) = opts.metrics {
        s.push_str(&format!("metrics = \"127.0.0.1:{p}\"\n"));
    }
    if let Some(level) = &opts.log_level {
        s.push_str(&format!("log_level = {}\n", q(level)));
    }
    if opts.static_gpus.is_empty() {
        s.push_str("\n[gpus]\nbackend = \"auto\"\n\n");
    } else {
        s.push_str("\n[gpus]\nbackend = \"static\"\n\n");
        for (uuid, memory) in &opts.static_gpus {
            s.push_str(&format!(
                "[[gpus.device]]\nuuid = {}\nmemory = {}\n\n",
                q(uuid),
                q(memory)
            ));
        }
    }
    for m in &opts.models {
        s.push_str(&m.render(&mark));
    }
    s
}

fn mark_of(dir: &Path) -> String {
    dir.display().to_string()
}

// ---- processes ----------------------------------------------------------------------------------

fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

/// The environment of a live process, as NAME=value strings.
pub fn environ(pid: i32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|e| !e.is_empty())
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .collect(),
    )
}

/// Live processes whose environment holds exactly `entry`.
pub fn procs_with_env(entry: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me && alive(p))
        .filter(|&p| environ(p).is_some_and(|env| env.iter().any(|e| e == entry)))
        .collect()
}

pub fn kill(pid: i32, sig: i32) {
    // SAFETY: a plain syscall.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// CLOCK_MONOTONIC in µs, the clock of sd_notify's MONOTONIC_USEC.
pub fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

// ---- socket -------------------------------------------------------------------------------------

/// One control-socket connection: JSON lines each way.
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    pub fn connect(socket: &Path) -> io::Result<Conn> {
        let s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Conn {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    pub fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        serde_json::from_str(&line).map_err(|e| io::Error::other(format!("{e}: {line:?}")))
    }

    pub fn call(&mut self, req: &Value) -> io::Result<Value> {
        self.writer.write_all(format!("{req}\n").as_bytes())?;
        self.read()
    }
}

#[derive(Default)]
struct Events {
    /// In order of arrival, stamped.
    list: Vec<(Instant, Value)>,
    /// The daemon closed the connection.
    closed: bool,
}

/// A watch connection read by a thread.
pub struct Watch {
    shared: Arc<Mutex<Events>>,
    stream: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    pub fn open(socket: &Path, model: &str) -> Watch {
        let mut conn = Conn::connect(socket).expect("connect for watch");
        let answer = conn
            .call(&json!({"op": "watch", "model": model}))
            .expect("watch answer");
        assert_eq!(answer["ok"], json!(true), "watch refused: {answer}");
        let Conn { reader, writer } = conn;
        reader.get_ref().set_read_timeout(None).unwrap();
        let shared = Arc::new(Mutex::new(Events::default()));
        let s2 = shared.clone();
        let thread = std::thread::spawn(move || {
            let mut reader = reader;
            loop {
                let mut line = String::new();
                let n = reader.read_line(&mut line).unwrap_or(0);
                let mut g = s2.lock().unwrap();
                if n == 0 {
                    g.closed = true;
                    return;
                }
                let v: Value =
                    serde_json::from_str(&line).unwrap_or_else(|_| json!({ "unparsable": line }));
                g.list.push((Instant::now(), v));
            }
        });
        Watch {
            shared,
            stream: writer,
            thread: Some(thread),
        }
    }

    pub fn events(&self) -> Vec<Value> {
        let g = self.shared.lock().unwrap();
        g.list.iter().map(|(_, v)| v.clone()).collect()
    }

    /// Whether the daemon closed the watch.
    pub fn closed(&self) -> bool {
        self.shared.lock().unwrap().closed
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The replica ids of a `routed` event, sorted.
pub fn endpoint_ids(ev: &Value) -> Vec<String> {
    let mut ids: Vec<String> = ev["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["replica"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

// ---- HTTP ---------------------------------------------------------------------------------------

/// GET `path` on 127.0.0.1:`port` over a fresh connection: (status, content-type, body).
pub fn http_get(port: u16, path: &str) -> io::Result<(u16, String, String)> {
    use std::io::Read;
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no status in {head:?}")))?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok((status, content_type, body.to_string()))
}

// ---- the daemon ---------------------------------------------------------------------------------

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub config_path: PathBuf,
    pub ports: (u16, u16),
    pub opts: Opts,
    child: Option<Child>,
    pid: i32,
    log: PathBuf,
    mark: String,
}

/// How to start the daemon process.
#[derive(Default)]
pub struct Launch {
    /// Extra environment (NOTIFY_SOCKET, WATCHDOG_USEC…).
    pub env: Vec<(String, String)>,
    /// Set WATCHDOG_PID to the daemon's own pid, as systemd does (through `sh -c 'export
    /// WATCHDOG_PID=$$; exec …'`: exec keeps the pid).
    pub watchdog_pid: bool,
    /// Run under this wrapper (argv prefix), e.g. `unshare -m …`.
    pub wrapper: Vec<String>,
    /// The daemon's directory (socket, state, config), when the test needs its paths first.
    pub dir: Option<tempfile::TempDir>,
}

/// A fresh directory for a daemon.
pub fn daemon_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("hearth-sd-")
        .tempdir()
        .expect("temp dir")
}

impl Daemon {
    /// Writes the configuration, starts the daemon, waits for its socket.
    pub fn start(opts: Opts) -> Daemon {
        Daemon::start_with(opts, Launch::default())
    }

    pub fn start_with(opts: Opts, mut launch: Launch) -> Daemon {
        let dir = launch.dir.take().unwrap_or_else(daemon_dir);
        let max: u32 = opts.models.iter().map(|m| m.max).sum();
        let ports = free_ports((max + 4) as u16);
        let config_path = dir.path().join("config.toml");
        fs::write(&config_path, config_text(dir.path(), ports, &opts)).unwrap();
        let socket = dir.path().join("hearth.sock");
        let log = dir.path().join("daemon.log");
        let out = fs::File::create(&log).unwrap();
        let mut argv: Vec<String> = launch.wrapper.clone();
        if launch.watchdog_pid {
            argv.extend(
                ["sh", "-c", "export WATCHDOG_PID=$$; exec \"$@\"", "sh"].map(String::from),
            );
        }
        argv.extend([HEARTH, "daemon", "--config"].map(String::from));
        argv.push(config_path.display().to_string());
        let mut cmd = Command::new(&argv[0]);
        if opts.log_level.is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.args(&argv[1..])
            .env_remove("HEARTH_SOCKET")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("JOURNAL_STREAM")
            .env_remove("RUST_LOG")
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0);
        // SAFETY: prctl only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start hearth daemon");
        let pid = child.id() as i32;
        let mark = format!("HEARTH_TEST_MARK={}", mark_of(dir.path()));
        let mut d = Daemon {
            dir,
            socket,
            config_path,
            ports,
            opts,
            child: Some(child),
            pid,
            log,
            mark,
        };
        let sock = d.socket.clone();
        wait_until("the daemon's socket", Duration::from_secs(20), || {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the daemon exited at start ({st}):\n{}", d.log());
            }
            Conn::connect(&sock).ok().map(|_| ())
        });
        d
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Rewrites the configuration file (not applied until a reload).
    pub fn write_config(&mut self, opts: Opts) {
        fs::write(
            &self.config_path,
            config_text(self.dir.path(), self.ports, &opts),
        )
        .unwrap();
        self.opts = opts;
    }

    pub fn request(&self, req: Value) -> Value {
        let mut c = Conn::connect(&self.socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}\n{}", self.socket.display(), self.log()));
        c.call(&req)
            .unwrap_or_else(|e| panic!("request {req}: {e}\n{}", self.log()))
    }

    pub fn status(&self) -> Value {
        let a = self.request(json!({"op": "status"}));
        assert_eq!(a["ok"], json!(true), "status failed: {a}");
        a["status"].clone()
    }

    pub fn model(&self, name: &str) -> Value {
        let s = self.status();
        s["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no model {name} in {s}"))
    }

    /// (id, state, pid) of each replica of `model`, sorted by id.
    pub fn replicas(&self, model: &str) -> Vec<(String, String, Option<i64>)> {
        let mut v: Vec<_> = self.model(model)["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["id"].as_str().unwrap().to_string(),
                    r["state"].as_str().unwrap().to_string(),
                    r["pid"].as_i64(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Waits until `model` has exactly `routed` routed and `warm` warm replicas, nothing else.
    pub fn wait_settled(&self, model: &str, routed: u64, warm: u64, timeout: Duration) -> Value {
        wait_until(
            &format!("{model}: {routed} routed + {warm} warm"),
            timeout,
            || {
                let m = self.model(model);
                let n = |k: &str| m[k].as_u64().unwrap_or(0);
                (n("routed") == routed
                    && n("warm") == warm
                    && n("starting") + n("pending") + n("draining") == 0
                    && m["replicas"].as_array().unwrap().len() as u64 == routed + warm)
                    .then_some(m)
            },
        )
    }

    pub fn watch(&self, model: &str) -> Watch {
        Watch::open(&self.socket, model)
    }

    /// A client verb of the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(HEARTH)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .env_remove("HEARTH_SOCKET")
            .output()
            .expect("run hearth")
    }

    pub fn signal(&self, sig: i32) {
        kill(self.pid, sig);
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Every live process this daemon started.
    pub fn children(&self) -> Vec<i32> {
        procs_with_env(&self.mark)
    }

    pub fn kill_all(&mut self) {
        if let Some(mut c) = self.child.take() {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.children();
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for p in left {
                kill(p, libc::SIGKILL);
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill_all();
        if std::thread::panicking() {
            eprintln!(
                "---- daemon log ({}) ----\n{}",
                self.log.display(),
                self.log()
            );
        }
    }
}
