//! The real daemon in a temporary directory: configured by [`DaemonBuilder`], launched as a
//! child process, and killed with everything it started when dropped.

use std::fs;
use std::io::Read;
use std::net::SocketAddr;
use std::ops::Deref;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{getpid, getppid};
use serde_json::{json, Value};

use crate::ports::PortBlock;
use crate::procs::{signal, Reaper};
use crate::{hearth, poll, request, status, Config, Conn, DaemonBuilder, Model, Watch};

/// How long a CLI run may take before the test fails (and the run is killed).
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// The daemon's stderr and stdout, in its directory.
const LOG: &str = "daemon.log";
const OUT: &str = "daemon.out";
/// How long a daemon may take to answer on its socket after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// What the daemon must not inherit from the test's own environment.
const PRIVATE_ENV: [&str; 6] = [
    "HEARTH_SOCKET",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "JOURNAL_STREAM",
    "RUST_LOG",
];

/// A daemon's directory (socket, state, config, logs), its ports and its reaper, before and
/// while it runs. An in-process daemon (tests/agent/gpu.rs) keeps one alive for its lifetime.
pub struct Home {
    // Dropped in this order: the sweep, then the ports (free once nothing holds them), then the
    // directory.
    pub(crate) reaper: Reaper,
    pub(crate) _ports: PortBlock,
    pub(crate) _route_port: Option<PortBlock>,
    /// The private /etc a root daemon with a model on the default account runs on (see
    /// [`DaemonBuilder::prepare`]).
    pub fresh: Option<crate::FreshAccounts>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub config_path: PathBuf,
    /// The replica port range of the configuration.
    pub ports: (u16, u16),
    /// `[route] listen`, on a port of its own held as long as the daemon's ports (a router
    /// started again binds it again), when the configuration has `[route]`.
    pub route_addr: Option<SocketAddr>,
    pub config: Config,
}

impl Home {
    /// The configuration file as rendered from `config`.
    pub fn config_text(&self) -> String {
        self.config.render(
            self.dir.path(),
            self.ports,
            self.route_addr,
            self.reaper.env(),
        )
    }

    /// Writes the configuration file from `config`.
    pub fn write_config(&self) {
        fs::write(&self.config_path, self.config_text()).expect("write the configuration");
    }

    /// Live processes carrying this daemon's mark (every process it or the harness started for
    /// it, the daemon itself included while it runs).
    pub fn marked(&self) -> Vec<i32> {
        self.reaper.marked()
    }

    /// The mark (NAME, value) to put in the environment of a process the test starts itself.
    pub fn mark(&self) -> (&'static str, &str) {
        self.reaper.env()
    }

    /// What the daemon's one containment line says it chose ("cgroup2 subtree at …", "systemd
    /// scopes under …", "process groups …"). The daemon logs it just after its socket listens,
    /// so a test that has only waited for the socket waits for the line here.
    pub fn containment(&self) -> String {
        crate::wait_until(
            "the daemon's containment line",
            Duration::from_secs(20),
            || {
                self.log().lines().find_map(|l| {
                    let (_, chosen) = l.split_once("containment: ")?;
                    (!chosen.starts_with("not stronger")).then(|| chosen.to_string())
                })
            },
        )
    }

    /// A toy server on `port` that the daemon did not start (a squatter, a stranger on a
    /// replica's port), carrying the mark so that cleanup finds it. Started once the port can be
    /// bound: a process just killed holds its sockets until its last thread has exited, after
    /// its leader already reads as gone.
    pub fn squatter(&self, port: &str) -> Child {
        let n: u16 = port.parse().expect("a port number");
        crate::wait_until(
            &format!("port {port} free for the squatter"),
            Duration::from_secs(10),
            || std::net::TcpListener::bind(("127.0.0.1", n)).ok().map(drop),
        );
        let (k, v) = self.mark();
        Command::new(crate::hearth())
            .args(["toy-server", "--port", port])
            .env(k, v)
            .stdout(Stdio::null())
            .spawn()
            .expect("start a toy server the daemon does not know")
    }

    /// The daemon's stderr so far: its log (empty for an in-process daemon).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join(LOG)).unwrap_or_default()
    }

    /// What a replica printed (stdout and stderr): its log file under the state directory,
    /// where the daemon puts replica output when there is no journald.
    pub fn replica_log(&self, replica: &str) -> String {
        let p = self
            .dir
            .path()
            .join("state/logs")
            .join(format!("{replica}.log"));
        fs::read_to_string(p).unwrap_or_default()
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The daemon's stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(self.dir.path().join(OUT)).unwrap_or_default()
    }

    /// Changes the configuration and rewrites the file (applied at the next reload).
    pub fn rewrite_config(&mut self, change: impl FnOnce(&mut Config)) {
        change(&mut self.config);
        self.write_config();
    }

    /// One request on a fresh connection; panics, with the log, if there is no answer.
    pub fn request(&self, req: Value) -> Value {
        if !self.socket.exists() {
            panic!("no socket at {}:\n{}", self.socket.display(), self.log());
        }
        request(&self.socket, &req)
    }

    pub fn status(&self) -> Value {
        let a = self.request(json!({"op": "status"}));
        assert_eq!(a["ok"], json!(true), "status failed: {a}");
        a["status"].clone()
    }

    /// The status of one model.
    pub fn model(&self, name: &str) -> Value {
        status::model(&self.status(), name).clone()
    }

    /// The replicas of `model`, as status lists them.
    pub fn replicas(&self, model: &str) -> Vec<Value> {
        status::replicas(&self.status(), model)
    }

    /// The replicas of `model` in `state`.
    pub fn in_state(&self, model: &str, state: &str) -> Vec<Value> {
        status::in_state(&self.status(), model, state)
    }

    pub fn gpus(&self) -> Vec<Value> {
        let a = self.request(json!({"op": "gpus"}));
        assert_eq!(a["ok"], json!(true), "gpus failed: {a}");
        a["gpus"].as_array().cloned().unwrap_or_default()
    }

    pub fn watch(&self, model: Option<&str>) -> Watch {
        Watch::open(&self.socket, model)
    }

    /// A replica of `model` by id, if the daemon still has it.
    pub fn replica(&self, model: &str, id: &str) -> Option<Value> {
        self.replicas(model).into_iter().find(|r| r["id"] == id)
    }

    /// Waits until `model` has exactly `n` routed replicas; returns them.
    pub fn wait_routed(&self, model: &str, n: usize, timeout: Duration) -> Vec<Value> {
        let what = format!("{n} routed replica(s) of {model}");
        self.wait_status(&what, timeout, |st| {
            let routed = status::in_state(st, model, "routed");
            (routed.len() == n).then_some(routed)
        })
    }

    /// Polls the status until `f` returns Some; panics after `timeout` with the last status and
    /// the log.
    pub fn wait_status<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Value) -> Option<T>,
    ) -> T {
        let mut last = Value::Null;
        poll(timeout, || {
            last = self.status();
            f(&last)
        })
        .unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for {what}\nlast status: {last:#}\n\
                 log:\n{}",
                self.log_tail(60)
            )
        })
    }

    /// Polls the status of `model` until `pred` accepts it; returns it.
    pub fn wait_model(
        &self,
        model: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_status(&format!("{model}: {what}"), timeout, |st| {
            let m = status::model(st, model);
            pred(m).then(|| m.clone())
        })
    }

    /// Waits until `model` has exactly `routed` routed and `warm` warm replicas, and no other.
    pub fn wait_settled(&self, model: &str, routed: u64, warm: u64, timeout: Duration) -> Value {
        self.wait_model(
            model,
            &format!("{routed} routed + {warm} warm, nothing else"),
            timeout,
            |m| {
                let n = |k: &str| m[k].as_u64().unwrap_or(0);
                n("routed") == routed
                    && n("warm") == warm
                    && n("starting") + n("pending") + n("draining") == 0
                    && status::replicas_of(m).len() as u64 == routed + warm
            },
        )
    }

    /// Runs a client verb of the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        run(&mut self.command(args), CLI_TIMEOUT)
    }

    /// Runs a client verb that must succeed; returns its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "hearth {args:?}: {}\n{}{}\nlog:\n{}",
            out.status,
            out.stdout,
            out.stderr,
            self.log_tail(40)
        );
        out.stdout
    }

    /// A `hearth ARGS… --socket SOCKET` client command, marked, in its own process group.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(hearth());
        let (k, v) = self.mark();
        cmd.args(args)
            .arg("--socket")
            .arg(&self.socket)
            .env_remove("HEARTH_SOCKET")
            .env(k, v)
            .stdin(Stdio::null())
            .process_group(0);
        cmd
    }
}

/// What a CLI run printed.
#[derive(Debug)]
pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to its end with stdout and stderr captured; kills it and panics after `timeout`.
pub fn run(cmd: &mut Command, timeout: Duration) -> CliOutput {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = pipe(child.stdout.take().map(|s| Box::new(s) as _));
    let err = pipe(child.stderr.take().map(|s| Box::new(s) as _));
    let Some(status) = poll(timeout, || child.try_wait().expect("wait")) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not finish within {timeout:?}");
    };
    CliOutput {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// How the daemon process is started.
pub struct Launch {
    pub(crate) env: Vec<(String, String)>,
    pub(crate) wrapper: Vec<String>,
    pub(crate) watchdog_pid: bool,
    /// The binary the daemon runs.
    pub(crate) binary: PathBuf,
}

impl Launch {
    /// Starts `hearth daemon --config …` in `home` without waiting for anything.
    pub fn spawn(self, home: Home) -> Daemon {
        let (child, pid) = self.spawn_process(&home);
        Daemon {
            pid,
            child,
            started: Instant::now(),
            home,
            launch: self,
        }
    }

    /// `hearth daemon --config …` for `home`: the process and its pid.
    fn spawn_process(&self, home: &Home) -> (Option<Child>, i32) {
        let log = home.dir.path().join(LOG);
        let out = home.dir.path().join(OUT);
        let mut argv = self.wrapper.clone();
        if self.watchdog_pid {
            // exec keeps the pid that $$ named.
            argv.extend(
                ["sh", "-c", "export WATCHDOG_PID=$$; exec \"$@\"", "sh"].map(String::from),
            );
        }
        argv.extend([
            self.binary.display().to_string(),
            "daemon".into(),
            "--config".into(),
        ]);
        argv.push(home.config_path.display().to_string());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        for k in PRIVATE_ENV {
            cmd.env_remove(k);
        }
        if home.config.log_level.is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = spawn_marked(&mut cmd, home, &out, &log);
        let pid = child.id() as i32;
        (Some(child), pid)
    }

    /// Starts the daemon and waits until its socket answers; panics, with its log, if it exits
    /// first or does not answer in time.
    pub fn start(self, home: Home) -> Daemon {
        let mut d = self.spawn(home);
        d.wait_up();
        d
    }
}

/// Starts a process of the harness's own (the daemon, a router) for `home`: with its mark, no
/// stdin, stdout and stderr appended to `out` and `err`, in a process group of its own, killed
/// when the test process dies.
pub(crate) fn spawn_marked(cmd: &mut Command, home: &Home, out: &Path, err: &Path) -> Child {
    let (k, v) = home.mark();
    cmd.env(k, v)
        .stdin(Stdio::null())
        .stdout(append(out))
        .stderr(append(err))
        .process_group(0);
    let parent = getpid();
    // SAFETY: between fork and exec only prctl and getppid, both async-signal-safe, and no
    // allocation (an Errno converts to io::Error without one).
    unsafe {
        cmd.pre_exec(move || {
            // A test binary killed from outside takes the process along.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // It may have died before the prctl: then no signal would ever come.
            if getppid() != parent {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
    // A binary a test has just copied can be "busy" for a moment: another test thread's child,
    // forked while the copy was open for writing, holds that descriptor until it execs. Wait for
    // it (bounded) rather than fail the test.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match cmd.spawn() {
            Err(e)
                if e.raw_os_error() == Some(libc_etxtbsy())
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.unwrap_or_else(|e| panic!("start {cmd:?}: {e}")),
        }
    }
}

/// ETXTBSY, "text file busy".
fn libc_etxtbsy() -> i32 {
    nix::errno::Errno::ETXTBSY as i32
}

/// A log file a process appends to: a restarted process's lines follow the earlier run's.
fn append(path: &Path) -> fs::File {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("a log file")
}

impl Daemon {
    /// Waits until the socket answers; panics, with the log, if the daemon exits first or does
    /// not answer in time.
    fn wait_up(&mut self) {
        let d = self;
        let up = poll(START_TIMEOUT, || {
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().expect("wait")) {
                panic!(
                    "the daemon exited at start ({st}):\n{}\n--- config ---\n{}",
                    d.log(),
                    d.config_text()
                );
            }
            Conn::connect(&d.socket).ok()
        });
        if up.is_none() {
            panic!(
                "no answer on {} within {START_TIMEOUT:?}:\n{}",
                d.socket.display(),
                d.log()
            );
        }
    }

    /// Starts the daemon again, in the same directory with the same configuration and launch,
    /// after its process has exited (a test killed it, or it stopped): what an earlier run left
    /// is there for it to find. Waits for the socket. Replicas of the earlier run are not killed.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            assert!(
                c.try_wait().expect("wait").is_some(),
                "restart: the daemon (pid {}) still runs",
                self.pid
            );
        }
        let (child, pid) = self.launch.spawn_process(&self.home);
        self.child = child;
        self.pid = pid;
        self.started = Instant::now();
        self.wait_up();
    }
}

/// The real daemon process. Derefs to its [`Home`] (socket, dir, config_path, ports, config).
pub struct Daemon {
    home: Home,
    child: Option<Child>,
    pid: i32,
    launch: Launch,
    /// When the process was started.
    pub started: Instant,
}

impl Deref for Daemon {
    type Target = Home;
    fn deref(&self) -> &Home {
        &self.home
    }
}

impl Daemon {
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::new()
    }

    /// Starts a daemon with `models` and the default settings; waits for its socket.
    pub fn start(models: impl IntoIterator<Item = Model>) -> Daemon {
        Daemon::builder().models(models).start()
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The binary the daemon was started from (and `hearth upgrade` re-executes).
    pub fn binary(&self) -> &Path {
        &self.launch.binary
    }

    /// Puts `content` (mode `mode`) at the daemon's binary path the way an install does: written
    /// beside it, then renamed over it, so that the running file is untouched.
    pub fn replace_binary(&self, content: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.binary();
        let new = path.with_extension("new");
        fs::write(&new, content).expect("write the new binary");
        fs::set_permissions(&new, fs::Permissions::from_mode(mode)).expect("chmod the new binary");
        fs::rename(&new, path).expect("rename the new binary into place");
    }

    /// Changes the configuration and rewrites the file (applied at the next reload).
    pub fn rewrite_config(&mut self, change: impl FnOnce(&mut Config)) {
        self.home.rewrite_config(change);
    }

    pub fn signal(&self, sig: Signal) {
        signal(self.pid, sig);
    }

    /// Waits for the daemon to exit (and reaps it); None if it still runs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        poll(timeout, || child.try_wait().expect("wait"))
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("wait").is_none())
    }

    /// Every live process this daemon started (or the harness started for it), the daemon
    /// itself aside.
    pub fn children(&self) -> Vec<i32> {
        let mut v = self.marked();
        v.retain(|&p| p != self.pid);
        v.sort();
        v
    }

    /// SIGKILLs the daemon and reaps it, then every process it started; what survives, if any.
    /// Drop does this too.
    pub fn kill_all(&mut self) -> Vec<i32> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.home.reaper.kill_all()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- daemon log ({}), last 120 lines ----\n{}",
                self.dir.path().join(LOG).display(),
                self.log_tail(120)
            );
        }
        self.kill_all();
        // Home's reaper sweeps once more on drop, and fails the test if anything survived.
    }
}
