//! Shared by the integration tests and benchmarks that run the real `hearth` binary against
//! llama.cpp's real server: finding (or setting up) the server and its tiny model, a free port
//! range, the daemon in a temporary directory, and cleaning up every process on drop — panics
//! included.
#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// The project's shared folder: `../shared` beside the checkout, else `/work/shared`.
pub fn shared_dir() -> PathBuf {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    if beside.join("real-model/setup.sh").exists() {
        return beside;
    }
    PathBuf::from("/work/shared")
}

fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    // …/target/debug/hearth
    let bin = Path::new(env!("CARGO_BIN_EXE_hearth"));
    bin.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// A folder with `llama-server` (llama.cpp's own server) and `tiny-llama.gguf`:
/// `HEARTH_REAL_MODEL_DIR` if set, else `setup.sh` run once into `$CARGO_TARGET_DIR/real-model`
/// (about 20 s; later runs find it done). Concurrent callers wait on a lock file.
pub fn real_model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HEARTH_REAL_MODEL_DIR") {
        let d = PathBuf::from(d);
        assert!(
            d.join("llama-server").exists(),
            "HEARTH_REAL_MODEL_DIR={} has no llama-server",
            d.display()
        );
        return d;
    }
    let dir = target_dir().join("real-model");
    std::fs::create_dir_all(&dir).expect("create the real-model folder");
    let lock = std::fs::File::create(dir.join(".setup.lock")).expect("lock file");
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("lock the real-model folder");
    let done = dir.join(".setup-done");
    if !done.exists() {
        let setup = shared_dir().join("real-model/setup.sh");
        eprintln!(
            "setting up llama.cpp's server: {} {}",
            setup.display(),
            dir.display()
        );
        let status = Command::new("bash")
            .arg(&setup)
            .arg(&dir)
            .status()
            .expect("run setup.sh");
        assert!(status.success(), "{} failed: {status}", setup.display());
        std::fs::write(&done, b"").expect("mark setup done");
    }
    dir
}

/// `n` consecutive loopback ports that are free now, from a per-process starting point so that
/// parallel test binaries do not collide.
pub fn port_range(n: u16) -> (u16, u16) {
    let mut base = 30_000 + (std::process::id() % 2_000) as u16 * 13;
    for _ in 0..200 {
        if (base..base + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return (base, base + n - 1);
        }
        base = 30_000 + (base - 30_000 + 997) % 26_000;
    }
    panic!("no {n} free consecutive ports");
}

/// A config for one model served by llama.cpp's real server, scraped for its queue.
pub struct LlamaModel<'a> {
    pub name: &'a str,
    pub parallel: u32,
    pub ctx: u32,
    pub min: u32,
    pub max: u32,
    pub warm_pool: u32,
    pub target_wait: &'a str,
    pub interval: &'a str,
}

impl LlamaModel<'_> {
    pub fn config(&self, real: &Path, dir: &Path, ports: (u16, u16)) -> String {
        let server = real.join("llama-server");
        let gguf = real.join("tiny-llama.gguf");
        format!(
            r#"
[daemon]
socket = "{dir}/hearth.sock"
state_dir = "{dir}/state"
ports = "{lo}-{hi}"
tick = "100ms"
shutdown_timeout = "10s"

[gpus]
backend = "static"
[[gpus.device]]
uuid = "GPU-test-0"
memory = "80GiB"

[[model]]
name = "{name}"
command = ["{server}", "-m", "{gguf}", "--host", "127.0.0.1", "--port", "{{port}}",
           "-np", "{parallel}", "-c", "{ctx}", "-t", "1", "--metrics"]
gpus = 0
stop_grace = "5s"

[model.warmup]
url = "http://127.0.0.1:{{port}}/completion"
body = '{{"prompt":"hello","n_predict":4}}'
headers = {{ "content-type" = "application/json" }}
expect_body = "content"
timeout = "20s"
startup_timeout = "2m"
recheck = "5m"

[model.liveness]
url = "http://127.0.0.1:{{port}}/health"
interval = "2s"
timeout = "2s"
failures = 5

[model.signal]
scrape = "http://127.0.0.1:{{port}}/metrics"
format = "llamacpp"
interval = "{interval}"

[model.scaling]
min = {min}
max = {max}
warm_pool = {pool}
target_wait = "{target}"
stale_after = "5s"
"#,
            dir = dir.display(),
            lo = ports.0,
            hi = ports.1,
            name = self.name,
            server = server.display(),
            gguf = gguf.display(),
            parallel = self.parallel,
            ctx = self.ctx,
            interval = self.interval,
            min = self.min,
            max = self.max,
            pool = self.warm_pool,
            target = self.target_wait,
        )
    }
}

/// The real daemon, in a temporary directory. Dropping it stops it (SIGTERM, then SIGKILL) and
/// kills whatever replica it was seen to run.
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    log: PathBuf,
    /// Replica pids seen in status answers, and the folder their command lines name.
    replica_pids: Arc<Mutex<HashSet<u32>>>,
    marker: String,
}

impl Daemon {
    /// Writes the config `make(dir)` returns and starts `hearth daemon` on it; returns once the
    /// socket answers.
    pub fn start(marker: &Path, make: impl FnOnce(&Path) -> String) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("hearth.toml");
        std::fs::write(&config, make(dir.path())).expect("write config");
        let log = dir.path().join("daemon.log");
        let out = std::fs::File::create(&log).expect("daemon log");
        let child = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start hearth daemon");
        let d = Daemon {
            child: Some(child),
            socket: dir.path().join("hearth.sock"),
            dir,
            log,
            replica_pids: Arc::default(),
            marker: marker.display().to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&d.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the daemon's socket never answered:\n{}",
                d.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// The last lines of the daemon's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// One request on a fresh connection, answered within `timeout` (blocking).
    pub fn call(&self, request: &Value, timeout: Duration) -> Option<Value> {
        let mut s = UnixStream::connect(&self.socket).ok()?;
        s.set_read_timeout(Some(timeout)).ok()?;
        s.write_all(format!("{request}\n").as_bytes()).ok()?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).ok()?;
        let v: Value = serde_json::from_str(&line).ok()?;
        self.remember_pids(&v);
        Some(v)
    }

    /// The status of `model`, remembering the replica pids it shows.
    pub fn status(&self, model: &str) -> Value {
        let req = serde_json::json!({"op": "status", "model": model});
        let v = self
            .call(&req, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no status answer:\n{}", self.log_tail()));
        assert_eq!(v["ok"], true, "{v}");
        v["status"]["models"][0].clone()
    }

    fn remember_pids(&self, v: &Value) {
        let mut pids = self.replica_pids.lock().unwrap();
        for m in v["status"]["models"].as_array().into_iter().flatten() {
            for r in m["replicas"].as_array().into_iter().flatten() {
                if let Some(pid) = r["pid"].as_u64() {
                    pids.insert(pid as u32);
                }
            }
        }
    }

    /// Polls status until `done` accepts the model's status, or panics at the deadline.
    pub fn wait_for(&self, model: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let m = self.status(model);
            if done(&m) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "gave up waiting after {within:?}; status: {m}\nlog:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Learn the replicas it runs now, in case some were never seen in a status answer.
        let _ = self.call(&serde_json::json!({"op": "status"}), Duration::from_secs(2));
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        // Replicas die with the daemon (PR_SET_PDEATHSIG); make sure, without touching a pid
        // that was reused by something else.
        for pid in self.replica_pids.lock().unwrap().iter() {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&self.marker) {
                let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP client for loopback servers.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("HTTP client")
}

/// One non-streamed completion: (HTTP status, tokens predicted, body).
pub async fn complete(
    client: &reqwest::Client,
    addr: &str,
    n_predict: u32,
) -> Result<(u16, u64, String), String> {
    let body = format!(r#"{{"prompt":"hello","n_predict":{n_predict},"ignore_eos":true}}"#);
    let resp = client
        .post(format!("http://{addr}/completion"))
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    let tokens = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["tokens_predicted"].as_u64())
        .unwrap_or(0);
    Ok((status, tokens, text))
}

/// How many tokens (at most `max`) one request must generate to hold a slot about `hold` on this
/// machine now, measured with an unloaded request of `max` tokens (a token costs more as the
/// context fills, so a short probe would overstate the speed).
pub async fn tokens_for(client: &reqwest::Client, addr: &str, hold: Duration, max: u32) -> u32 {
    let started = Instant::now();
    let (status, tokens, body) = complete(client, addr, max).await.expect("probe request");
    assert_eq!(status, 200, "{body}");
    let per_token = started.elapsed().as_secs_f64() / tokens.max(1) as f64;
    ((hold.as_secs_f64() / per_token) as u32).clamp(32, max)
}
