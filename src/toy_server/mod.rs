//! `hearth toy-server`: an honest stand-in model server for demos and tests.
//!
//! It behaves like the parts of a real model server that hearth cares about and nothing else:
//! it takes a while to load (optionally really reading a "weights" file), answers `/health` with
//! 503 until loaded, serves the OpenAI API (completions and chat, streamed or not, with
//! `max_tokens` tokens; embeddings; the model list) through a FIFO queue in front of a fixed
//! number of slots, exposes its queue on `/metrics`, and (with `HEARTH_SOCKET` set) reports its
//! own queue wait to the daemon every 200 ms. Failure modes (`--fail-warmup`, `--crash-after`,
//! `--hang-after`) exist so the supervisor's reactions can be exercised without a GPU.
//!
//! Rooms: [`queue`] (the FIFO queue and its slots), [`http`] (the HTTP surface), [`api`] (the
//! OpenAI endpoints) and [`openai`] (their requests and answers, pure), [`report`] (the socket
//! reporter); this file holds the flags and wires them together.

// The crate denies unsafe code; this file needs it for the environment is read and changed at start, before any thread: each block says why it is sound.
#![allow(unsafe_code)]

mod api;
mod http;
mod openai;
mod queue;
mod report;
mod sleep;
#[cfg(test)]
mod test_server;

use std::future::Future;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use report::Reporter;

/// Upper bound on waiting for in-flight requests at shutdown.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// Largest `--hold-memory`: a stand-in, not a way to exhaust the host.
const MAX_HOLD: u64 = 64 << 30;
/// Chunk size for `--read-file`, like a loader streaming weights.
const READ_CHUNK: usize = 8 << 20;

/// Command-line arguments of `hearth toy-server`.
#[derive(clap::Args, Debug, Clone)]
pub struct ToyArgs {
    /// TCP port to listen on.
    #[arg(long)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// How long loading takes before /health turns 200.
    #[arg(long, default_value = "0s", value_parser = crate::units::parse_duration)]
    pub load_time: Duration,
    /// Number of completion slots; further requests wait in a FIFO queue.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// How long each completion holds its slot (a stream spreads its tokens over it).
    #[arg(long, default_value = "200ms", value_parser = crate::units::parse_duration)]
    pub service_time: Duration,
    /// Also hold the slot this long per token asked for (`max_tokens`, 16 when absent, at most
    /// 4096), as a real server generates: a 4-token warm-up is then short beside long
    /// generations.
    #[arg(long, default_value = "0s", value_parser = crate::units::parse_duration)]
    pub token_time: Duration,
    /// The model name `/v1/models` lists and answers carry when a request names none; default
    /// `$HEARTH_MODEL` (the daemon sets it), else "toy".
    #[arg(long)]
    pub model: Option<String>,
    /// Answer completions with 500 (a model that loads but cannot serve).
    #[arg(long)]
    pub fail_warmup: bool,
    /// Exit with status 1 this long after start.
    #[arg(long, value_parser = crate::units::parse_duration)]
    pub crash_after: Option<Duration>,
    /// Stop answering anything (and stop reporting) this long after start, staying alive.
    #[arg(long, value_parser = crate::units::parse_duration)]
    pub hang_after: Option<Duration>,
    /// Read this whole file during loading, in 8 MiB chunks (like reading weights).
    #[arg(long)]
    pub read_file: Option<PathBuf>,
    /// Send queue reports to this socket instead of `$HEARTH_SOCKET` (model and replica still
    /// come from `HEARTH_MODEL` and `HEARTH_REPLICA`); e.g. a relay that timestamps them.
    #[arg(long)]
    pub report_socket: Option<PathBuf>,
    /// Fork a detached worker (its own session: setsid) that serves on the same listening
    /// socket and outlives this process, like a server's worker that escapes its process group.
    #[arg(long)]
    pub fork_worker: bool,
    /// Ignore SIGTERM (keep serving): only SIGKILL stops it.
    #[arg(long)]
    pub ignore_sigterm: bool,
    /// Before the first completion it answers, create DIR/REPLICA.PID holding the process's
    /// cgroup (REPLICA from `HEARTH_REPLICA`): a record of which process answered for which
    /// replica, e.g. its warm-up.
    #[arg(long, value_name = "DIR")]
    pub marks: Option<PathBuf>,
    /// How long `POST /sleep` (vLLM) or `/release_memory_occupation` (SGLang) takes to put it
    /// to sleep.
    #[arg(long, default_value = "0s", value_parser = crate::units::parse_duration)]
    pub sleep_time: Duration,
    /// How long `POST /wake_up` or `/resume_memory_occupation` takes to wake it.
    #[arg(long, default_value = "0s", value_parser = crate::units::parse_duration)]
    pub wake_time: Duration,
    /// Memory held while awake (allocated and touched: resident), freed while asleep, e.g.
    /// "256MiB": what a real server's weights make its RSS do.
    #[arg(long, default_value = "0", value_parser = crate::units::parse_size)]
    pub hold_memory: u64,
    /// Serve on this inherited listening socket instead of binding (the forked worker's).
    #[arg(long, hide = true)]
    pub listen_fd: Option<i32>,
}

/// What the HTTP handlers and the reporter share.
struct State {
    /// `x-toy-pid` and `x-toy-replica` on every completion: who answered.
    pid: u32,
    replica: String,
    marks: Option<PathBuf>,
    marked: std::sync::atomic::AtomicBool,
    loaded: watch::Sender<bool>,
    hung: watch::Sender<bool>,
    fail_warmup: bool,
    service_time: Duration,
    token_time: Duration,
    queue: Arc<queue::Queue>,
    /// The model it serves, for `/v1/models` and answers to requests that name none.
    model: String,
    /// For `/v1/models`' `created`, and response ids unique to this process.
    started_unix: u64,
    started_nanos: u64,
    /// Answers numbered, for their ids.
    responses: std::sync::atomic::AtomicU64,
    /// Asleep or awake (sleep.rs).
    sleeper: sleep::Sleeper,
}

/// Binds, wires the process-level behaviour (env reporter, signals, `--crash-after`) and serves
/// until SIGTERM/SIGINT. Returns once the server has shut down.
pub async fn run(args: ToyArgs) -> anyhow::Result<()> {
    if let Some(d) = args.crash_after {
        // Crashing is a process-level act, so it lives here rather than in `serve` (tests call
        // `serve` inside the test process).
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            println!("toy-server: --crash-after {d:?} elapsed, exiting with status 1");
            let _ = std::io::stdout().flush();
            std::process::exit(1);
        });
    }
    // SIGTERM is how the daemon drains a replica and SIGINT how a person at a terminal stops
    // one: both mean "finish what is in flight, then exit 0", which `serve` does on shutdown.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let listener = match args.listen_fd {
        Some(fd) => inherited_listener(fd)?,
        None => TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?,
    };
    if args.fork_worker {
        fork_worker(&listener)?;
    }
    let ignore_term = args.ignore_sigterm;
    let shutdown = async move {
        loop {
            tokio::select! {
                _ = term.recv() => {
                    if !ignore_term {
                        break;
                    }
                    println!("toy-server: --ignore-sigterm: SIGTERM ignored");
                    let _ = std::io::stdout().flush();
                }
                _ = int.recv() => break,
            }
        }
    };
    // The forked worker answers but does not report: its replica's leader does.
    let reporter = match args.listen_fd {
        Some(_) => None,
        None => Reporter::from_env(args.report_socket.clone()),
    };
    serve(listener, args, reporter, shutdown).await
}

/// Serves on an already bound listener until `shutdown` completes, then stops accepting, lets
/// in-flight requests finish (at most 30 s) and returns. `--crash-after` is ignored here (see
/// [`run`]); `--port`/`--host` are ignored in favour of the listener.
pub async fn serve(
    listener: TcpListener,
    args: ToyArgs,
    reporter: Option<Reporter>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(
        args.hold_memory <= MAX_HOLD,
        "--hold-memory is at most {}",
        crate::units::short_bytes(MAX_HOLD)
    );
    let start = Instant::now();
    let addr = listener.local_addr()?;
    let state = Arc::new(State {
        pid: std::process::id(),
        replica: std::env::var("HEARTH_REPLICA").unwrap_or_else(|_| "-".into()),
        marks: args.marks.clone(),
        marked: std::sync::atomic::AtomicBool::new(false),
        loaded: watch::Sender::new(false),
        hung: watch::Sender::new(false),
        fail_warmup: args.fail_warmup,
        service_time: args.service_time,
        token_time: args.token_time,
        queue: Arc::new(queue::Queue::new(args.concurrency)),
        model: args
            .model
            .clone()
            .or_else(|| std::env::var("HEARTH_MODEL").ok())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "toy".into()),
        started_unix: since_epoch().as_secs(),
        started_nanos: u64::try_from(since_epoch().as_nanos()).unwrap_or(0),
        responses: std::sync::atomic::AtomicU64::new(0),
        sleeper: sleep::Sleeper::new(args.sleep_time, args.wake_time, args.hold_memory),
    });
    state.sleeper.hold().await;
    println!(
        "toy-server listening on {addr} (loading for {}{})",
        crate::units::format_duration(args.load_time),
        match &args.read_file {
            Some(p) => format!(" and reading {}", p.display()),
            None => String::new(),
        }
    );
    let _ = std::io::stdout().flush();

    // The reporter runs beside the server; aborting it on the way out keeps tests that start
    // many servers in one process from accumulating reporters.
    let reporter_task =
        reporter.map(|r| AbortOnDrop(tokio::spawn(report::report_loop(state.clone(), r))));

    let loader = load(args.load_time, args.read_file.clone());
    tokio::pin!(loader);
    tokio::pin!(shutdown);
    let hang_at = args
        .hang_after
        .map(|d| tokio::time::Instant::from_std(start + d));
    let hang_timer = tokio::time::sleep_until(hang_at.unwrap_or_else(tokio::time::Instant::now));
    tokio::pin!(hang_timer);

    let conns = TaskTracker::new();
    let stop = CancellationToken::new();
    // Connections accepted while hung: held open and never served.
    let mut held: Vec<TcpStream> = Vec::new();
    let mark_ready = || {
        state.loaded.send_replace(true);
        println!("toy-server ready");
        let _ = std::io::stdout().flush();
    };
    // With nothing to load, be ready before the first accept, so that no request (a test's, or
    // a probe's racing the loader) ever sees "loading" from a server configured not to load.
    let mut loading = !(args.load_time.is_zero() && args.read_file.is_none());
    if !loading {
        mark_ready();
    }
    loop {
        tokio::select! {
            // Shutdown, then state changes, before new connections.
            biased;
            _ = &mut shutdown => break,
            res = &mut loader, if loading => {
                loading = false;
                res.context("loading")?;
                mark_ready();
            }
            _ = &mut hang_timer, if hang_at.is_some() && !*state.hung.borrow() => {
                println!("toy-server: --hang-after elapsed, no longer answering");
                let _ = std::io::stdout().flush();
                state.hung.send_replace(true);
            }
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Usually EMFILE; back off a little instead of spinning.
                        eprintln!("toy-server: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if *state.hung.borrow() {
                    held.push(stream);
                    continue;
                }
                conns.spawn(http::serve_conn(stream, state.clone(), stop.clone()));
            }
        }
    }

    // Stop accepting first, then ask every connection to finish its current request and close.
    drop(listener);
    drop(held);
    stop.cancel();
    conns.close();
    if tokio::time::timeout(DRAIN_LIMIT, conns.wait())
        .await
        .is_err()
    {
        eprintln!("toy-server: in-flight requests still running after {DRAIN_LIMIT:?}; exiting");
    }
    drop(reporter_task);
    println!("toy-server stopped");
    let _ = std::io::stdout().flush();
    Ok(())
}

fn since_epoch() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Loading: the load time and the optional file read run together; loading ends when both have.
async fn load(load_time: Duration, read_file: Option<PathBuf>) -> anyhow::Result<()> {
    let read = async {
        let Some(path) = read_file else {
            return Ok(());
        };
        // Blocking reads on the blocking pool: that is what a loader reading weights looks like
        // to the OS (page cache, disk throughput), which is the point of the flag.
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut f = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            let mut buf = vec![0u8; READ_CHUNK];
            while f
                .read(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?
                > 0
            {}
            Ok(())
        })
        .await?
    };
    let (_, read) = tokio::join!(tokio::time::sleep(load_time), read);
    read
}

/// The listening socket a parent toy server handed down (`--listen-fd`).
fn inherited_listener(fd: i32) -> anyhow::Result<TcpListener> {
    use std::os::fd::FromRawFd;
    anyhow::ensure!(
        fd > 2,
        "--listen-fd must name an inherited socket, not stdio"
    );
    // SAFETY: the parent passed this descriptor for exactly this purpose; nothing else in this
    // process owns it.
    let std_listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    std_listener.set_nonblocking(true)?;
    Ok(TcpListener::from_std(std_listener)?)
}

/// `--fork-worker`: starts this same server, detached in a session of its own, serving on our
/// listening socket; it keeps the flags that shape answers and drops the ones that would end
/// it early or fork again.
fn fork_worker(listener: &TcpListener) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = listener.as_raw_fd();
    let mut argv: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fork-worker" => {}
            // Values follow these: drop both.
            "--crash-after" | "--hang-after" | "--load-time" | "--listen-fd" => {
                args.next();
            }
            _ => argv.push(a),
        }
    }
    argv.extend(["--listen-fd".into(), fd.to_string()]);
    let exe = std::env::current_exe().context("finding the toy server's own binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&argv)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: fcntl and setsid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // The listening socket is close-on-exec: this child keeps it.
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let child = cmd.spawn().context("forking the worker")?;
    println!("toy-server: forked detached worker pid {}", child.id());
    let _ = std::io::stdout().flush();
    // Not waited for: it is meant to outlive us.
    drop(child);
    Ok(())
}

/// Wraps a task so dropping the handle aborts it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::test_server::{args, until, Server};
    use super::*;

    #[test]
    fn clap_defaults_and_flags() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            toy: ToyArgs,
        }
        let a = Cli::try_parse_from(["toy", "--port", "8000"]).unwrap().toy;
        assert_eq!(a.host, "127.0.0.1");
        assert_eq!(a.load_time, Duration::ZERO);
        assert_eq!(a.concurrency, 1);
        assert_eq!(a.service_time, Duration::from_millis(200));
        assert!(!a.fail_warmup && a.crash_after.is_none() && a.hang_after.is_none());
        assert!(a.report_socket.is_none());
        let a = Cli::try_parse_from([
            "toy",
            "--port",
            "1",
            "--load-time",
            "2s",
            "--concurrency",
            "4",
            "--service-time",
            "50ms",
            "--fail-warmup",
            "--crash-after",
            "1m",
            "--hang-after",
            "1.5s",
            "--read-file",
            "/tmp/w",
            "--report-socket",
            "/tmp/relay.sock",
        ])
        .unwrap()
        .toy;
        assert_eq!(a.load_time, Duration::from_secs(2));
        assert_eq!(a.concurrency, 4);
        assert!(a.fail_warmup);
        assert_eq!(a.crash_after, Some(Duration::from_secs(60)));
        assert_eq!(a.hang_after, Some(Duration::from_millis(1500)));
        assert_eq!(a.read_file, Some(PathBuf::from("/tmp/w")));
        assert_eq!(a.report_socket, Some(PathBuf::from("/tmp/relay.sock")));
        assert!(Cli::try_parse_from(["toy"]).is_err(), "--port is required");
    }

    #[tokio::test]
    async fn zero_slots_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let none = ToyArgs {
            concurrency: 0,
            ..args()
        };
        let err = serve(listener, none, None, std::future::pending())
            .await
            .unwrap_err();
        assert!(format!("{err:#}").contains("--concurrency"), "{err:#}");
    }

    #[tokio::test]
    async fn loading_waits_for_read_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, vec![7u8; 9 << 20]).unwrap();
        let s = Server::start(
            ToyArgs {
                read_file: Some(path),
                ..args()
            },
            None,
        )
        .await;
        until("health 200", Duration::from_secs(5), || async {
            (s.get("/health").await.unwrap().0 == 200).then_some(())
        })
        .await;
        // A missing file fails loading, as a model without weights would.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let missing = ToyArgs {
            read_file: Some(dir.path().join("missing")),
            ..args()
        };
        let err = serve(listener, missing, None, std::future::pending())
            .await
            .unwrap_err();
        assert!(format!("{err:#}").contains("missing"), "{err:#}");
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_finishes_in_flight_requests() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_millis(600),
                ..args()
            },
            None,
        )
        .await;
        let inflight = tokio::spawn(s.complete("{}"));
        until("a running request", Duration::from_secs(3), || async {
            (s.metrics().await["toy_requests_running"] == 1.0).then_some(())
        })
        .await;
        let addr = s.addr().to_string();
        s.stop().await.unwrap();
        assert_eq!(inflight.await.unwrap().unwrap().0, 200);
        // The listener is gone.
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
