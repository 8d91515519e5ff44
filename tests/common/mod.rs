//! Harness for integration tests (and the warm-delay benchmark): runs the real `hearth` binary
//! as a daemon in a temporary directory, with toy-server (or real) replicas on a port range of
//! its own, and talks to it over its Unix socket and over HTTP.
//!
//! Cleanup: `Daemon`'s Drop SIGKILLs the daemon (its replicas get PR_SET_PDEATHSIG), then kills
//! every process that still carries this daemon's `HEARTH_SOCKET` in its environment (every
//! replica has it) until none is left — also when the test panicked. The daemon itself gets
//! PR_SET_PDEATHSIG too, so a test binary killed from outside takes its daemons with it.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The binary under test.
pub const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(20);

// ---- waiting --------------------------------------------------------------------------------

/// Polls `f` until it returns Some or `timeout` passes; panics naming `what` on timeout.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(POLL);
    }
}

/// Polls `f` until it returns Some or `timeout` passes.
pub fn poll_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
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

/// A block of `n` consecutive loopback ports that are free now, below the kernel's ephemeral
/// range (so outgoing connections cannot take them), chosen at random so that tests running in
/// parallel (here, or in another checkout) do not collide.
pub fn free_ports(n: u16) -> (u16, u16) {
    const LOW: u16 = 22000;
    const HIGH: u16 = 32000;
    let blocks = (HIGH - LOW) / n;
    for _ in 0..200 {
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

// ---- configuration ---------------------------------------------------------------------------

/// A TOML basic string.
pub fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[derive(Debug, Clone)]
pub struct Liveness {
    pub interval: &'static str,
    pub timeout: &'static str,
    pub failures: u32,
}

/// One `[[model]]` section.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub name: String,
    pub command: Vec<String>,
    pub min: u32,
    pub max: u32,
    pub warm_pool: u32,
    pub warmup_body: String,
    pub expect_body: String,
    pub warmup_timeout: &'static str,
    pub startup_timeout: &'static str,
    pub recheck: &'static str,
    pub liveness: Option<Liveness>,
    pub stop_grace: &'static str,
    pub drain_timeout: &'static str,
    /// `[model.scaling]` timings (defaults: 2s, 10m, 5m; the config's defaults for the rest).
    pub target_wait: &'static str,
    pub down_stabilization: &'static str,
    pub down_step: &'static str,
    pub stale_after: Option<&'static str>,
    pub max_up_step: Option<u32>,
}

impl ModelSpec {
    /// A toy-server model: `hearth toy-server --port {port} ARGS…`, 2 routed + 1 warm.
    pub fn toy(name: &str, args: &[&str]) -> ModelSpec {
        let mut command = vec![HEARTH.to_string(), "toy-server".into(), "--port".into()];
        command.push("{port}".into());
        command.extend(args.iter().map(|s| s.to_string()));
        ModelSpec {
            name: name.to_string(),
            command,
            min: 2,
            max: 3,
            warm_pool: 1,
            warmup_body: format!(r#"{{"model":"{name}","prompt":"Hello","max_tokens":4}}"#),
            expect_body: "choices".into(),
            warmup_timeout: "5s",
            startup_timeout: "1m",
            recheck: "1m",
            liveness: None,
            stop_grace: "2s",
            drain_timeout: "30s",
            target_wait: "2s",
            down_stabilization: "10m",
            down_step: "5m",
            stale_after: None,
            max_up_step: None,
        }
    }

    pub fn scale(mut self, min: u32, max: u32, warm_pool: u32) -> ModelSpec {
        self.min = min;
        self.max = max;
        self.warm_pool = warm_pool;
        self
    }

    fn render(&self) -> String {
        let command: Vec<String> = self.command.iter().map(|s| q(s)).collect();
        let mut s = format!(
            "[[model]]\nname = {}\nversion = \"1\"\ncommand = [{}]\ngpus = 0\nstop_grace = {}\n\n",
            q(&self.name),
            command.join(", "),
            q(self.stop_grace),
        );
        s.push_str(&format!(
            "[model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\nbody = {}\n\
             headers = {{ \"content-type\" = \"application/json\" }}\nexpect_status = 200\n\
             expect_body = {}\ntimeout = {}\nstartup_timeout = {}\nrecheck = {}\n\n",
            q(&self.warmup_body),
            q(&self.expect_body),
            q(self.warmup_timeout),
            q(self.startup_timeout),
            q(self.recheck),
        ));
        if let Some(l) = &self.liveness {
            s.push_str(&format!(
                "[model.liveness]\nurl = \"http://127.0.0.1:{{port}}/health\"\ninterval = {}\n\
                 timeout = {}\nfailures = {}\n\n",
                q(l.interval),
                q(l.timeout),
                l.failures
            ));
        }
        s.push_str(&format!(
            "[model.scaling]\nmin = {}\nmax = {}\nwarm_pool = {}\ntarget_wait = {}\n\
             down_stabilization = {}\ndown_step = {}\ndrain_timeout = {}\n",
            self.min,
            self.max,
            self.warm_pool,
            q(self.target_wait),
            q(self.down_stabilization),
            q(self.down_step),
            q(self.drain_timeout),
        ));
        if let Some(v) = self.stale_after {
            s.push_str(&format!("stale_after = {}\n", q(v)));
        }
        if let Some(v) = self.max_up_step {
            s.push_str(&format!("max_up_step = {v}\n"));
        }
        s.push('\n');
        s
    }
}

#[derive(Debug, Clone)]
pub struct DaemonOpts {
    pub tick: &'static str,
    pub shutdown_timeout: &'static str,
    /// Ports in the daemon's range (at least the models' max, summed).
    pub ports: u16,
}

impl Default for DaemonOpts {
    fn default() -> Self {
        DaemonOpts {
            tick: "250ms",
            shutdown_timeout: "10s",
            ports: 12,
        }
    }
}

/// The configuration text for a daemon in `dir`.
pub fn config_text(
    dir: &Path,
    ports: (u16, u16),
    opts: &DaemonOpts,
    models: &[ModelSpec],
) -> String {
    let mut s = format!(
        "[daemon]\nsocket = {}\nstate_dir = {}\nports = \"{}-{}\"\ntick = {}\nshutdown_timeout = {}\n\n\
         [gpus]\nbackend = \"auto\"\n\n",
        q(&dir.join("hearth.sock").display().to_string()),
        q(&dir.join("state").display().to_string()),
        ports.0,
        ports.1,
        q(opts.tick),
        q(opts.shutdown_timeout),
    );
    for m in models {
        s.push_str(&m.render());
    }
    s
}

// ---- processes --------------------------------------------------------------------------------

/// The fields of /proc/PID/stat after the command name: state is [0], pgrp [2].
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live (non-zombie) processes of process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| {
            stat_fields(p).is_some_and(|f| f[0] != "Z" && f[0] != "X" && f[2] == pgid.to_string())
        })
        .collect()
}

/// Live processes whose environment holds exactly `entry` ("NAME=value").
pub fn procs_with_env(entry: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    all_pids()
        .into_iter()
        .filter(|&p| p != me && alive(p))
        .filter(|&p| {
            fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

pub fn kill(pid: i32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid, sig);
    }
}

pub fn is_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

// ---- measurement (benchmarks) -------------------------------------------------------------------

/// User + system CPU time of a process so far (from /proc/PID/stat, in clock ticks).
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    let f = stat_fields(pid)?;
    // utime and stime are fields 14 and 15 of the whole line; [0] here is field 3 (state).
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks per second (the unit of `cpu_ticks`).
pub fn clk_tck() -> f64 {
    // SAFETY: plain libc query.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Resident set size (VmRSS) in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The load averages as /proc/loadavg shows them ("1.23 0.98 0.75"), and the CPU count.
pub fn machine_load() -> String {
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("load average {} on {cpus} CPUs", load.join(" "))
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

// ---- socket -----------------------------------------------------------------------------------

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

    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.writer.set_write_timeout(t)
    }

    /// Another handle on the connection's socket, for writing from another thread.
    pub fn writer_clone(&self) -> UnixStream {
        self.writer.try_clone().expect("clone the socket")
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// The next line from the daemon, parsed.
    pub fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            ));
        }
        serde_json::from_str(&line).map_err(|e| io::Error::other(format!("{e}: {line:?}")))
    }

    pub fn call(&mut self, req: &Value) -> io::Result<Value> {
        self.send_raw(format!("{req}\n").as_bytes())?;
        self.read()
    }
}

/// An event received on a watch connection, stamped when it arrived.
#[derive(Debug, Clone)]
pub struct Ev {
    pub at: Instant,
    pub v: Value,
}

type Shared = Arc<(Mutex<(Vec<Ev>, bool)>, Condvar)>;

/// A watch connection read by a thread; events are kept in order of arrival.
pub struct Watch {
    shared: Shared,
    stream: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    pub fn open(socket: &Path, model: Option<&str>) -> Watch {
        let mut conn = Conn::connect(socket).expect("connect for watch");
        let mut req = json!({"op": "watch"});
        if let Some(m) = model {
            req["model"] = json!(m);
        }
        let answer = conn.call(&req).expect("watch answer");
        assert_eq!(answer["ok"], json!(true), "watch refused: {answer}");
        let Conn { reader, writer } = conn;
        writer.set_read_timeout(None).unwrap();
        let shared: Shared = Arc::new((Mutex::new((Vec::new(), false)), Condvar::new()));
        let s2 = shared.clone();
        let thread = std::thread::spawn(move || {
            let mut reader = reader;
            reader.get_ref().set_read_timeout(None).ok();
            loop {
                let mut line = String::new();
                let n = reader.read_line(&mut line).unwrap_or(0);
                let at = Instant::now();
                let (lock, cv) = &*s2;
                let mut g = lock.lock().unwrap();
                if n == 0 {
                    g.1 = true;
                    cv.notify_all();
                    return;
                }
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| json!({"unparsable": line, "error": e.to_string()}));
                g.0.push(Ev { at, v });
                cv.notify_all();
            }
        });
        Watch {
            shared,
            stream: writer,
            thread: Some(thread),
        }
    }

    pub fn len(&self) -> usize {
        self.shared.0.lock().unwrap().0.len()
    }

    pub fn events(&self) -> Vec<Ev> {
        self.shared.0.lock().unwrap().0.clone()
    }

    /// The first event at index ≥ `from` that matches, waiting up to `timeout`.
    pub fn wait_for(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<(usize, Ev)> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.shared;
        let mut g = lock.lock().unwrap();
        let mut i = from;
        loop {
            while i < g.0.len() {
                if pred(&g.0[i].v) {
                    return Some((i, g.0[i].clone()));
                }
                i += 1;
            }
            let now = Instant::now();
            if now >= deadline || g.1 {
                return None;
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// The routed set of `model` as the latest `routed` event says (replica ids, sorted).
    pub fn routed(&self, model: &str) -> Option<Vec<String>> {
        let g = self.shared.0.lock().unwrap();
        g.0.iter()
            .rev()
            .find(|e| e.v["event"] == "routed" && e.v["model"] == model)
            .map(|e| endpoint_ids(&e.v))
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

/// A predicate for `{"event":"replica","replica":ID,"state":STATE}`.
pub fn replica_event(id: &str, state: &str) -> impl Fn(&Value) -> bool {
    let (id, state) = (id.to_string(), state.to_string());
    move |v| v["event"] == "replica" && v["replica"] == id.as_str() && v["state"] == state.as_str()
}

// ---- HTTP -------------------------------------------------------------------------------------

/// One HTTP/1.1 request on a fresh connection (`Connection: close`): (status, body).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other("no address"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A completion request like a client's, straight to a replica.
pub fn complete(addr: &str, timeout: Duration) -> io::Result<(u16, String)> {
    http(
        addr,
        "POST",
        "/v1/completions",
        Some(r#"{"model":"toy","prompt":"Hello there","max_tokens":4}"#),
        timeout,
    )
}

// ---- the daemon -------------------------------------------------------------------------------

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub config_path: PathBuf,
    pub ports: (u16, u16),
    /// When the daemon process was started.
    pub started: Instant,
    child: Option<Child>,
    pid: i32,
    log: PathBuf,
    /// `HEARTH_SOCKET=…` as every replica of this daemon has it in its environment.
    env_mark: String,
}

impl Daemon {
    /// Writes the configuration and starts `hearth daemon`; waits for the socket.
    pub fn start(models: &[ModelSpec]) -> Daemon {
        Daemon::start_with(DaemonOpts::default(), models)
    }

    pub fn start_with(opts: DaemonOpts, models: &[ModelSpec]) -> Daemon {
        Daemon::start_in(Daemon::temp_dir(), opts, models)
    }

    /// A temporary directory for a daemon (socket, state, log), for callers that need to know
    /// the socket's path before the daemon starts (`dir/hearth.sock`).
    pub fn temp_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("hearth-it-")
            .tempdir()
            .expect("temp dir")
    }

    /// Like `start_with`, in a directory the caller made (see `temp_dir`).
    pub fn start_in(dir: tempfile::TempDir, opts: DaemonOpts, models: &[ModelSpec]) -> Daemon {
        let ports = free_ports(opts.ports);
        let text = config_text(dir.path(), ports, &opts, models);
        let config_path = dir.path().join("config.toml");
        fs::write(&config_path, &text).unwrap();
        let mut d = Daemon::spawn(dir, config_path, ports);
        let sock = d.socket.clone();
        let ok = poll_for(Duration::from_secs(10), || {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the daemon exited at start ({status}):\n{}\n--- config ---\n{text}",
                    d.log()
                );
            }
            Conn::connect(&sock).ok().map(|_| ())
        });
        if ok.is_none() {
            panic!("no socket at {} within 10 s:\n{}", sock.display(), d.log());
        }
        d
    }

    /// Starts `hearth daemon --config CONFIG` without waiting for anything.
    pub fn spawn(dir: tempfile::TempDir, config_path: PathBuf, ports: (u16, u16)) -> Daemon {
        let socket = dir.path().join("hearth.sock");
        let log = dir.path().join("daemon.log");
        let out = fs::File::create(&log).unwrap();
        let mut cmd = Command::new(HEARTH);
        cmd.arg("daemon")
            .arg("--config")
            .arg(&config_path)
            .env_remove("HEARTH_SOCKET")
            .env("RUST_LOG", "info")
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
        let started = Instant::now();
        let child = cmd.spawn().expect("start hearth daemon");
        let pid = child.id() as i32;
        let env_mark = format!("HEARTH_SOCKET={}", socket.display());
        Daemon {
            dir,
            socket,
            config_path,
            ports,
            started,
            child: Some(child),
            pid,
            log,
            env_mark,
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn request(&self, req: Value) -> Value {
        let mut c = Conn::connect(&self.socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.socket.display()));
        c.call(&req)
            .unwrap_or_else(|e| panic!("request {req}: {e}"))
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
            .unwrap_or_else(|| panic!("no model {name} in status: {s}"))
    }

    pub fn replicas(&self, model: &str) -> Vec<Value> {
        self.model(model)["replicas"].as_array().unwrap().clone()
    }

    /// Replicas of `model` in `state`, by id.
    pub fn in_state(&self, model: &str, state: &str) -> Vec<Value> {
        self.replicas(model)
            .into_iter()
            .filter(|r| r["state"] == state)
            .collect()
    }

    pub fn watch(&self, model: Option<&str>) -> Watch {
        Watch::open(&self.socket, model)
    }

    /// Runs a client verb of the CLI against this daemon.
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

    /// Waits for the daemon to exit; None if it is still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        poll_for(timeout, || child.try_wait().unwrap())
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Every live process this daemon started (they all carry its socket in their environment).
    pub fn children(&self) -> Vec<i32> {
        procs_with_env(&self.env_mark)
    }

    /// Kills everything; used by Drop, and by tests that want to stop early.
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
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("hearth test harness: processes {left:?} survive SIGKILL");
                break;
            }
            for p in left {
                kill(-p, libc::SIGKILL);
                kill(p, libc::SIGKILL);
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!(
                "---- daemon log ({}), last {} lines ----",
                self.log.display(),
                tail.len()
            );
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        self.kill_all();
    }
}

// ---- the real model -----------------------------------------------------------------------------

/// The shared directory next to the repository (CI), or /work/shared.
pub fn shared_dir() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    if p.join("real-model/setup.sh").exists() {
        p
    } else {
        PathBuf::from("/work/shared")
    }
}

/// The directory where the real model is installed: `HEARTH_REAL_MODEL_DIR`, else
/// `TARGET/real-model`, set up with `setup.sh` once (under a file lock, for parallel tests and
/// test binaries).
pub fn real_model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HEARTH_REAL_MODEL_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        assert!(
            d.join("llama-server").exists() && d.join("tiny-llama.gguf").exists(),
            "HEARTH_REAL_MODEL_DIR={} lacks llama-server or tiny-llama.gguf",
            d.display()
        );
        return d;
    }
    // target/debug/hearth → target
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(HEARTH)
                .parent()
                .and_then(Path::parent)
                .expect("target dir")
                .to_path_buf()
        });
    let dir = target.join("real-model");
    fs::create_dir_all(&dir).unwrap();
    let lock = fs::File::create(target.join("real-model.lock")).unwrap();
    // SAFETY: flock on a file we own; released when `lock` closes.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", io::Error::last_os_error());
    let done = dir.join(".setup-done");
    if !done.exists() {
        let setup = shared_dir().join("real-model/setup.sh");
        let out = Command::new("bash")
            .arg(&setup)
            .arg(&dir)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", setup.display()));
        assert!(
            out.status.success(),
            "{} {} failed ({}):\n{}\n{}",
            setup.display(),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        fs::write(&done, b"ok\n").unwrap();
    }
    drop(lock);
    dir
}
