//! Helpers for the front door's integration tests (`tests/route_*.rs`): the real `hearth daemon`
//! with real replicas (`hearth toy-server`, a streaming stand-in in Python, llama.cpp's server),
//! the real `hearth route` process, and a plain HTTP/1.1 client that reads answers as they
//! arrive. Every process started here is killed on drop, also when a test panics.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");
pub const POLL: Duration = Duration::from_millis(20);

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

pub fn wait_until<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll_for(timeout, f).unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
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

/// `n` consecutive loopback ports free now, below the ephemeral range, at random (other tests
/// and checkouts run at the same time).
pub fn free_ports(n: u16) -> (u16, u16) {
    const LOW: u16 = 33000;
    const HIGH: u16 = 42000;
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

pub fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

// ---- processes ----------------------------------------------------------------------------------

fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

pub fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

/// Live processes whose environment holds exactly `entry`.
pub fn procs_with_env(entry: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
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

/// A command that dies with the test process (PR_SET_PDEATHSIG) in a group of its own.
fn guarded(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn tail(path: &Path, n: usize) -> String {
    let log = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---- configuration ------------------------------------------------------------------------------

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
        let mut command = vec![
            HEARTH.to_string(),
            "toy-server".into(),
            "--port".into(),
            "{port}".into(),
        ];
        command.extend(args.iter().map(|s| s.to_string()));
        Model::with_command(name, command)
    }

    /// The streaming stand-in (`route_support/stream_replica.py`).
    pub fn streaming(name: &str) -> Model {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/route_support/stream_replica.py");
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
        let command: Vec<String> = self.command.iter().map(|s| q(s)).collect();
        // The account the test runs as, as testkit's presets do: a root daemon would otherwise
        // run the replicas as an unprivileged account that may not reach the test's files.
        let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map(|u| format!("user = {}\n", q(&u.name)))
            .unwrap_or_default();
        format!(
            "[[model]]\nname = {}\ncommand = [{}]\ngpus = 0\n{user}stop_grace = {}\nslots = {}\n\n\
             [model.warmup]\nurl = {}\nbody = {}\nheaders = {{ \"content-type\" = \"application/json\" }}\n\
             expect_body = {}\ntimeout = \"30s\"\nstartup_timeout = {}\nrecheck = \"10m\"\n\n\
             [model.scaling]\nmin = {}\nmax = {}\nwarm_pool = {}\ntarget_wait = {}\n\
             idle_to_zero = {}\ndown_stabilization = {}\ndown_step = {}\ndrain_timeout = {}\n\n",
            q(&self.name),
            command.join(", "),
            q(self.stop_grace),
            self.slots,
            q(&self.warmup_url),
            q(&self.warmup_body),
            q(self.expect_body),
            q(self.startup_timeout),
            self.min,
            self.max,
            self.warm_pool,
            q(self.target_wait),
            q(self.idle_to_zero),
            q(self.down_stabilization),
            q(self.down_step),
            q(self.drain_timeout),
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
            q(&socket.display().to_string()),
            q(&dir.path().join("state").display().to_string()),
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

// ---- the daemon ---------------------------------------------------------------------------------

pub struct Daemon {
    pub socket: PathBuf,
    child: Child,
    log: PathBuf,
    env_mark: String,
}

impl Daemon {
    pub fn start(setup: &Setup) -> Daemon {
        let log = setup.dir.path().join("daemon.log");
        let out = fs::File::create(&log).unwrap();
        let mut cmd = Command::new(HEARTH);
        cmd.arg("daemon")
            .arg("--config")
            .arg(&setup.config)
            .env_remove("HEARTH_SOCKET")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        guarded(&mut cmd);
        let child = cmd.spawn().expect("start hearth daemon");
        let d = Daemon {
            socket: setup.socket.clone(),
            child,
            log,
            env_mark: format!("HEARTH_SOCKET={}", setup.socket.display()),
        };
        wait_until("the daemon's socket", Duration::from_secs(10), || {
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
        wait_until(
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
                kill(-p, libc::SIGKILL);
                kill(p, libc::SIGKILL);
            }
            std::thread::sleep(POLL);
        }
    }
}

// ---- the router ---------------------------------------------------------------------------------

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
        let out = fs::File::create(&log).unwrap();
        let mut cmd = Command::new(HEARTH);
        cmd.arg("route")
            .arg("--config")
            .arg(config)
            .env_remove("HEARTH_SOCKET")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        guarded(&mut cmd);
        let mut child = cmd.spawn().expect("start hearth route");
        let ok = poll_for(Duration::from_secs(10), || {
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

// ---- HTTP ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {} {}", self.status, self.text()))
    }
}

/// An answer being read as it arrives.
pub struct Streaming {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    remaining: Option<usize>,
    done: bool,
}

impl Streaming {
    /// The next piece of the body (a chunk, or what a read returned); None at its end. An error
    /// is an answer cut off.
    pub fn next_piece(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        if self.chunked {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "cut off"));
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io::Error::other(format!("bad chunk size {line:?}")))?;
            if size == 0 {
                let mut end = String::new();
                self.reader.read_line(&mut end)?;
                self.done = true;
                return Ok(None);
            }
            let mut buf = vec![0; size + 2];
            self.reader.read_exact(&mut buf)?;
            buf.truncate(size);
            return Ok(Some(buf));
        }
        let mut buf = vec![0; 65536];
        let want = self.remaining.map_or(buf.len(), |r| r.min(buf.len()));
        if want == 0 {
            self.done = true;
            return Ok(None);
        }
        let n = self.reader.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
            if self.remaining.is_some_and(|r| r > 0) {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "cut off"));
            }
            return Ok(None);
        }
        if let Some(r) = self.remaining.as_mut() {
            *r -= n;
        }
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// The rest of the body.
    pub fn rest(&mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(p) = self.next_piece()? {
            out.extend(p);
        }
        Ok(out)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Closes the connection now (a client that leaves).
    pub fn abandon(self) {
        let _ = self.reader.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// Writes a request on a new connection and reads nothing: a client that may leave before its
/// answer (drop the stream).
pub fn open(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    s
}

/// The value of an unlabelled or fully labelled series in a Prometheus text page.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Sends a request on a new connection and reads the answer's head.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<Streaming> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| {
        k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding")
    }) {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    read_head(BufReader::new(s))
}

fn read_head(mut reader: BufReader<TcpStream>) -> io::Result<Streaming> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "in the head"));
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let remaining = find("content-length").and_then(|v| v.parse().ok());
    Ok(Streaming {
        status,
        headers,
        reader,
        chunked,
        remaining,
        done: false,
    })
}

/// A whole request and answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<Resp> {
    let mut s = send(addr, method, path, headers, body, timeout)?;
    let body = s.rest()?;
    Ok(Resp {
        status: s.status,
        headers: s.headers,
        body,
    })
}

pub fn get(addr: SocketAddr, path: &str) -> io::Result<Resp> {
    request(addr, "GET", path, &[], b"", Duration::from_secs(10))
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &Value, timeout: Duration) -> io::Result<Resp> {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
        timeout,
    )
}

/// A completion for `model` through the router.
pub fn complete(addr: SocketAddr, model: &str, timeout: Duration) -> io::Result<Resp> {
    post(
        addr,
        "/v1/completions",
        &json!({"model": model, "prompt": "Hello there", "max_tokens": 4}),
        timeout,
    )
}

/// Requests run on threads, for the ones a test must keep waiting.
pub fn spawn<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}

// ---- watch --------------------------------------------------------------------------------------

/// Events in order of arrival, stamped, and a condition to wait for more.
type Events = Arc<(Mutex<Vec<(Instant, Value)>>, Condvar)>;

/// A watch on the daemon, read by a thread; events stamped on arrival.
pub struct Watch {
    events: Events,
    stream: UnixStream,
}

impl Watch {
    pub fn open(socket: &Path) -> Watch {
        let mut s = UnixStream::connect(socket).expect("connect for watch");
        s.write_all(b"{\"op\":\"watch\"}\n").unwrap();
        let events: Events = Arc::default();
        let e2 = events.clone();
        let reader = BufReader::new(s.try_clone().unwrap());
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                let (lock, cv) = &*e2;
                lock.lock().unwrap().push((Instant::now(), v));
                cv.notify_all();
            }
        });
        Watch { events, stream: s }
    }

    /// The first event at or after index `from` that matches, within `timeout`.
    pub fn wait_for(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<(usize, Instant, Value)> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.events;
        let mut g = lock.lock().unwrap();
        let mut i = from;
        loop {
            while i < g.len() {
                if pred(&g[i].1) {
                    return Some((i, g[i].0, g[i].1.clone()));
                }
                i += 1;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    pub fn events(&self) -> Vec<(Instant, Value)> {
        self.events.0.lock().unwrap().clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The replica ids of a `routed` event.
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

// ---- the real model and the openai client -------------------------------------------------------

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(HEARTH)
                .parent()
                .and_then(Path::parent)
                .expect("target dir")
                .to_path_buf()
        })
}

/// Runs `prepare` once across test processes (under a file lock), marking `dir` when done.
fn once_in(dir: &Path, lock_name: &str, prepare: impl FnOnce()) {
    fs::create_dir_all(dir).unwrap();
    let lock = fs::File::create(target_dir().join(lock_name)).unwrap();
    // SAFETY: flock on a file we own; released when `lock` closes.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", io::Error::last_os_error());
    let done = dir.join(".setup-done");
    if !done.exists() {
        prepare();
        fs::write(&done, b"ok\n").unwrap();
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// llama.cpp's server and a tiny model: `HEARTH_REAL_MODEL_DIR` (CI sets it), else set up once
/// in `TARGET/real-model` with `../shared/real-model/setup.sh`.
pub fn real_model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HEARTH_REAL_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let dir = target_dir().join("real-model");
    once_in(&dir, "real-model.lock", || {
        let mut shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
        if !shared.join("real-model/setup.sh").exists() {
            shared = PathBuf::from("/work/shared");
        }
        run_ok(
            Command::new("bash")
                .arg(shared.join("real-model/setup.sh"))
                .arg(&dir),
        );
    });
    dir
}

/// A Python with the official `openai` package: `HEARTH_OPENAI_PYTHON` (CI sets it), else a
/// virtual environment made once in `TARGET/openai-venv`.
pub fn openai_python() -> PathBuf {
    if let Some(p) = std::env::var_os("HEARTH_OPENAI_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = target_dir().join("openai-venv");
    once_in(&dir, "openai-venv.lock", || {
        run_ok(Command::new("python3").args(["-m", "venv"]).arg(&dir));
        run_ok(Command::new(dir.join("bin/pip")).args([
            "install",
            "-q",
            "--no-cache-dir",
            "openai",
        ]));
    });
    dir.join("bin/python")
}
