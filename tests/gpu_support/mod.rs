//! Harness for the GPU integration tests: a config in a temp dir, the real daemon binary, a
//! socket client, a watch connection recorded on a thread, polling with deadlines, and cleanup of
//! every process on drop (also on panic).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

pub const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");
pub const GIB: u64 = 1 << 30;

/// Polls `f` until it returns Some or the deadline passes (then panics, saying what it waited
/// for and the last value seen).
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A temp dir with a socket path, a state dir and a config file.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub ports: (u16, u16),
}

impl Env {
    pub fn new(ports: (u16, u16)) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("hearth-gpu-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        Env { dir, ports }
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("hearth.sock")
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("hearth.toml")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }
    /// `[daemon]` and `[gpus]` with `devices` (uuid, GiB) declared, then `models`.
    pub fn config(&self, backend: &str, devices: &[(&str, u64)], models: &str) -> String {
        let mut s = format!(
            "[daemon]\nsocket = \"{}\"\nstate_dir = \"{}\"\nports = \"{}-{}\"\ntick = \"50ms\"\nshutdown_timeout = \"10s\"\n\n[gpus]\nbackend = \"{backend}\"\n",
            self.socket().display(),
            self.dir.path().join("state").display(),
            self.ports.0,
            self.ports.1
        );
        for (uuid, gib) in devices {
            s.push_str(&format!(
                "[[gpus.device]]\nuuid = \"{uuid}\"\nmemory = \"{gib}GiB\"\n"
            ));
        }
        s.push_str(models);
        s
    }
    pub fn write_config(&self, text: &str) {
        std::fs::write(self.config_path(), text).expect("write config");
    }
}

/// A toy model: `gpus = 1` with `gpu_memory`, warm-up = a real completion.
pub fn toy_model(name: &str, mem_gib: u64, priority: i32, scaling: &str) -> String {
    format!(
        r#"
[[model]]
name = "{name}"
command = ["{HEARTH}", "toy-server", "--port", "{{port}}", "--load-time", "200ms", "--service-time", "10ms"]
gpus = 1
gpu_memory = "{mem_gib}GiB"
placement = "pack"
priority = {priority}
stop_grace = "5s"
[model.warmup]
url = "http://127.0.0.1:{{port}}/v1/completions"
body = '{{"model":"{name}","prompt":"Hello","max_tokens":4}}'
headers = {{ "content-type" = "application/json" }}
expect_body = "choices"
timeout = "5s"
startup_timeout = "30s"
recheck = "1m"
[model.liveness]
url = "http://127.0.0.1:{{port}}/health"
interval = "1s"
timeout = "1s"
failures = 3
[model.scaling]
{scaling}
drain_timeout = "10s"
"#
    )
}

/// One request, one answer, on a fresh connection.
pub fn call(socket: &Path, req: Value) -> Value {
    let mut s = UnixStream::connect(socket).expect("connect to the daemon");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    writeln!(s, "{req}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("an answer");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad answer {line:?}: {e}"))
}

pub fn status(socket: &Path) -> Value {
    let v = call(socket, json!({"op": "status"}));
    assert_eq!(v["ok"], true, "{v}");
    v["status"].clone()
}

pub fn gpus(socket: &Path) -> Vec<Value> {
    let v = call(socket, json!({"op": "gpus"}));
    assert_eq!(v["ok"], true, "{v}");
    v["gpus"].as_array().cloned().unwrap_or_default()
}

pub fn model<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["models"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no model {name} in {status}"))
}

/// Replicas of `name` in `state`: (id, pid, gpus).
pub fn replicas(status: &Value, name: &str, state: &str) -> Vec<(String, u32, Vec<String>)> {
    model(status, name)["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["state"] == state)
        .map(|r| {
            (
                r["id"].as_str().unwrap_or_default().to_string(),
                r["pid"].as_u64().unwrap_or(0) as u32,
                r["gpus"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|g| g.as_str().map(String::from))
                    .collect(),
            )
        })
        .collect()
}

/// Runs a client verb of the real binary against the socket.
pub fn cli(socket: &Path, args: &[&str]) -> (ExitStatus, String, String) {
    let out = Command::new(HEARTH)
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("run hearth");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A variable from a live process's environment (/proc/PID/environ).
pub fn environ(pid: u32, name: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(|v| v.to_string())
    })
}

/// Every replica pid seen, so that drop can kill their process groups even if the daemon died.
#[derive(Default, Clone)]
pub struct Pids(Arc<Mutex<Vec<u32>>>);

impl Pids {
    pub fn note(&self, status: &Value) {
        let mut v = self.0.lock().unwrap();
        for m in status["models"].as_array().into_iter().flatten() {
            for r in m["replicas"].as_array().into_iter().flatten() {
                if let Some(pid) = r["pid"].as_u64() {
                    if !v.contains(&(pid as u32)) {
                        v.push(pid as u32);
                    }
                }
            }
        }
    }
    pub fn kill_all(&self) {
        for &pid in self.0.lock().unwrap().iter() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The real daemon, killed (with its replicas) on drop.
pub struct Daemon {
    pub env: Env,
    child: Option<Child>,
    pub pids: Pids,
}

impl Daemon {
    /// Starts `hearth daemon` on the env's config and waits until the socket answers.
    pub fn start(env: Env) -> Daemon {
        let log = std::fs::File::create(env.log_path()).expect("log file");
        let child = Command::new(HEARTH)
            .args(["daemon", "--config"])
            .arg(env.config_path())
            .env("RUST_LOG", "info")
            .env_remove("HEARTH_SOCKET")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn hearth daemon");
        let mut d = Daemon {
            env,
            child: Some(child),
            pids: Pids::default(),
        };
        let socket = d.socket();
        wait_for("the daemon's socket", Duration::from_secs(20), || {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the daemon exited early ({st}):\n{}", d.log());
            }
            UnixStream::connect(&socket).ok()
        });
        d
    }
    pub fn socket(&self) -> PathBuf {
        self.env.socket()
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.env.log_path()).unwrap_or_default()
    }
    pub fn status(&self) -> Value {
        let st = status(&self.socket());
        self.pids.note(&st);
        st
    }
    /// Polls status until `f` accepts it.
    pub fn wait_status<T>(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&Value) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            let st = self.status();
            if let Some(v) = f(&st) {
                return v;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {limit:?} waiting for {what}\nlast status: {}\ndaemon log:\n{}",
                    serde_json::to_string_pretty(&st).unwrap(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A second SIGTERM means "don't wait": replicas are killed, the daemon exits.
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.pids.kill_all();
    }
}

/// A `watch` connection read on a thread: every event, in order, with when it arrived.
pub struct Watch {
    pub events: Arc<Mutex<Vec<Value>>>,
    stream: UnixStream,
}

impl Watch {
    pub fn open(socket: &Path, model: Option<&str>) -> Watch {
        let mut s = UnixStream::connect(socket).expect("connect for watch");
        let req = match model {
            Some(m) => json!({"op": "watch", "model": m}),
            None => json!({"op": "watch"}),
        };
        writeln!(s, "{req}").unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let reader = BufReader::new(s.try_clone().unwrap());
        let sink = events.clone();
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        let w = Watch { events, stream: s };
        wait_for("the watch answer", Duration::from_secs(10), || {
            let ev = w.events.lock().unwrap();
            ev.first().map(|a| assert_eq!(a["ok"], true, "{a}"))
        });
        w
    }
    pub fn snapshot(&self) -> Vec<Value> {
        self.events.lock().unwrap().clone()
    }
    /// The routed sets published for `model`, in order (ids).
    pub fn routed_sets(&self, model: &str) -> Vec<Vec<String>> {
        self.snapshot()
            .iter()
            .filter(|e| e["event"] == "routed" && e["model"] == model)
            .map(|e| {
                e["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|ep| ep["replica"].as_str().map(String::from))
                    .collect()
            })
            .collect()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
