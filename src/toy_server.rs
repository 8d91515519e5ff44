//! `hearth toy-server`: an honest stand-in model server for demos and tests.
//!
//! It behaves like the parts of a real model server that hearth cares about and nothing else:
//! it takes a while to load (optionally really reading a "weights" file), answers `/health` with
//! 503 until loaded, serves `POST /v1/completions` through a FIFO queue in front of a fixed number
//! of slots, exposes its queue on `/metrics`, and (with `HEARTH_SOCKET` set) reports its own queue
//! wait to the daemon every 200 ms. Failure modes (`--fail-warmup`, `--crash-after`,
//! `--hang-after`) exist so the supervisor's reactions can be exercised without a GPU.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder, LinesCodec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often a report goes to the daemon (the contract says 200 ms).
const REPORT_EVERY: Duration = Duration::from_millis(200);
/// How long to wait before reconnecting to an unreachable or closed socket.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// Upper bound on waiting for in-flight requests at shutdown.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// Chunk size for `--read-file`, like a loader streaming weights.
const READ_CHUNK: usize = 8 << 20;
/// Socket protocol line limit (64 KiB).
const MAX_LINE: usize = 64 * 1024;
/// Largest completion request body we accept; a toy has no use for more.
const MAX_BODY: usize = 1 << 20;

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
    /// How long each completion holds its slot.
    #[arg(long, default_value = "200ms", value_parser = crate::units::parse_duration)]
    pub service_time: Duration,
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
}

/// Where and as whom the server reports its queue (normally from `HEARTH_SOCKET`,
/// `HEARTH_MODEL` and `HEARTH_REPLICA`; tests build it directly so they leave the env alone).
#[derive(Debug, Clone)]
pub struct Reporter {
    pub socket: PathBuf,
    pub model: String,
    pub replica: Option<String>,
}

impl Reporter {
    /// The reporter the daemon asked for through the environment, if any; `socket`, when given
    /// (`--report-socket`), replaces `HEARTH_SOCKET`.
    pub fn from_env(socket: Option<PathBuf>) -> Option<Reporter> {
        let socket = socket.or_else(|| {
            std::env::var_os("HEARTH_SOCKET")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        })?;
        Some(Reporter {
            socket,
            model: std::env::var("HEARTH_MODEL").unwrap_or_default(),
            replica: std::env::var("HEARTH_REPLICA")
                .ok()
                .filter(|r| !r.is_empty()),
        })
    }
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
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    let reporter = Reporter::from_env(args.report_socket.clone());
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
    let start = Instant::now();
    let addr = listener.local_addr()?;
    let state = Arc::new(State::new(&args));
    println!(
        "toy-server listening on {addr} (loading for {}{})",
        // Debug shows 250ms / 2s / 1.5s, but "0ns" for zero.
        if args.load_time.is_zero() {
            "0s".to_string()
        } else {
            format!("{:?}", args.load_time)
        },
        match &args.read_file {
            Some(p) => format!(" and reading {}", p.display()),
            None => String::new(),
        }
    );
    let _ = std::io::stdout().flush();

    // The reporter runs beside the server; aborting it on the way out keeps tests that start
    // many servers in one process from accumulating reporters.
    let reporter_task = reporter.map(|r| AbortOnDrop(tokio::spawn(report_loop(state.clone(), r))));

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
                conns.spawn(serve_conn(stream, state.clone(), stop.clone()));
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

/// Shared server state.
struct State {
    loaded: watch::Sender<bool>,
    hung: watch::Sender<bool>,
    fail_warmup: bool,
    service_time: Duration,
    slots: Semaphore,
    queue: Mutex<Queue>,
}

/// Queue accounting, under one lock so a snapshot is consistent.
#[derive(Default)]
struct Queue {
    /// Arrival instants of requests waiting for a slot, by request id (ids grow, so the first
    /// entry is the oldest).
    waiting: BTreeMap<u64, Instant>,
    running: u64,
    arrived: u64,
    completed: u64,
    next_id: u64,
}

/// A consistent view of the queue, for `/metrics` and for reports.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stats {
    oldest_wait: Duration,
    waiting: u64,
    running: u64,
    arrived: u64,
    completed: u64,
}

impl State {
    fn new(args: &ToyArgs) -> State {
        State {
            loaded: watch::Sender::new(false),
            hung: watch::Sender::new(false),
            fail_warmup: args.fail_warmup,
            service_time: args.service_time,
            slots: Semaphore::new(args.concurrency),
            queue: Mutex::new(Queue::default()),
        }
    }

    fn stats(&self) -> Stats {
        let q = self.queue.lock().unwrap();
        Stats {
            oldest_wait: q
                .waiting
                .values()
                .next()
                .map(|t| t.elapsed())
                .unwrap_or_default(),
            waiting: q.waiting.len() as u64,
            running: q.running,
            arrived: q.arrived,
            completed: q.completed,
        }
    }

    /// Admits a completion request into the queue.
    fn admit(self: &Arc<Self>) -> Ticket {
        let mut q = self.queue.lock().unwrap();
        // The id is taken under the lock so id order is arrival order (oldest = first entry).
        q.next_id += 1;
        let id = q.next_id;
        q.waiting.insert(id, Instant::now());
        q.arrived += 1;
        Ticket {
            state: self.clone(),
            id,
            phase: Phase::Waiting,
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let loaded = *self.loaded.borrow();
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/health") if loaded => {
                json_response(StatusCode::OK, json!({"status":"ok"}))
            }
            (&Method::GET, "/health") => {
                json_response(StatusCode::SERVICE_UNAVAILABLE, json!({"status":"loading"}))
            }
            (&Method::GET, "/metrics") => self.metrics(),
            (&Method::POST, "/v1/completions") => self.completion(req).await,
            (_, "/health" | "/metrics" | "/v1/completions") => json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error":"method not allowed"}),
            ),
            _ => json_response(StatusCode::NOT_FOUND, json!({"error":"not found"})),
        }
    }

    async fn completion(self: Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if !*self.loaded.borrow() {
            return json_response(StatusCode::SERVICE_UNAVAILABLE, json!({"status":"loading"}));
        }
        if self.fail_warmup {
            return json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error":"toy-server: --fail-warmup"}),
            );
        }
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return json_response(StatusCode::BAD_REQUEST, json!({"error": e.to_string()}))
            }
        };
        // Missing body or missing fields are fine; malformed JSON is the client's bug.
        let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        json!({"error": format!("invalid JSON body: {e}")}),
                    )
                }
            }
        };
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("toy")
            .to_string();
        let prompt_tokens = prompt_tokens(body.get("prompt"));

        // Queue for a slot. The ticket's drop guard removes the entry if this future is dropped
        // (client gone, shutdown timeout), so the queue never leaks.
        let mut ticket = self.admit();
        let Ok(_permit) = self.slots.acquire().await else {
            unreachable!("the semaphore is never closed");
        };
        ticket.start();
        tokio::time::sleep(self.service_time).await;
        ticket.finish();

        json_response(
            StatusCode::OK,
            json!({
                "id": format!("toy-{}", ticket.id),
                "object": "text_completion",
                "created": std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                "model": model,
                "choices": [{"index": 0, "text": " toy", "logprobs": null, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": 1,
                    "total_tokens": prompt_tokens + 1
                }
            }),
        )
    }

    fn metrics(&self) -> Response<Full<Bytes>> {
        let s = self.stats();
        let mut out = String::new();
        for (name, kind, help, value) in [
            (
                "toy_requests_waiting",
                "gauge",
                "Completion requests waiting for a slot.",
                s.waiting as f64,
            ),
            (
                "toy_requests_running",
                "gauge",
                "Completion requests holding a slot.",
                s.running as f64,
            ),
            (
                "toy_requests_arrived_total",
                "counter",
                "Completion requests admitted to the queue.",
                s.arrived as f64,
            ),
            (
                "toy_requests_completed_total",
                "counter",
                "Completion requests answered.",
                s.completed as f64,
            ),
            (
                "toy_oldest_wait_seconds",
                "gauge",
                "Age of the oldest request still waiting for a slot.",
                s.oldest_wait.as_secs_f64(),
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(out)))
            .expect("static response parts are valid")
    }
}

/// A rough token count for `usage`: words in the prompt (string or list of strings).
fn prompt_tokens(prompt: Option<&Value>) -> u64 {
    match prompt {
        Some(Value::String(s)) => s.split_whitespace().count() as u64,
        Some(Value::Array(items)) => items.iter().map(|v| prompt_tokens(Some(v))).sum(),
        _ => 0,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Waiting,
    Running,
    Done,
}

/// One admitted completion request's place in the accounting; dropping it at any phase undoes
/// exactly what is still counted for it.
struct Ticket {
    state: Arc<State>,
    id: u64,
    phase: Phase,
}

impl Ticket {
    fn start(&mut self) {
        let mut q = self.state.queue.lock().unwrap();
        q.waiting.remove(&self.id);
        q.running += 1;
        self.phase = Phase::Running;
    }

    fn finish(&mut self) {
        let mut q = self.state.queue.lock().unwrap();
        q.running -= 1;
        q.completed += 1;
        self.phase = Phase::Done;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut q = self.state.queue.lock().unwrap();
        match self.phase {
            Phase::Waiting => {
                q.waiting.remove(&self.id);
            }
            Phase::Running => q.running -= 1,
            Phase::Done => {}
        }
    }
}

fn json_response(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static response parts are valid")
}

/// Serves one connection (keep-alive) until it closes or shutdown asks it to finish.
async fn serve_conn(stream: TcpStream, state: Arc<State>, stop: CancellationToken) {
    let svc = service_fn(move |req| {
        let state = state.clone();
        async move {
            let mut hung = state.hung.subscribe();
            // Once hung, every request (in progress or new) waits forever: the handler is
            // dropped (releasing its slot) and no answer is ever written. The hang is checked
            // first: an unbiased select would answer about half the requests that the handler
            // can answer at once (/health, /metrics) on connections kept alive from before.
            tokio::select! {
                biased;
                // (The async block drops wait_for's borrow guard, which is not Send.)
                _ = async { let _ = hung.wait_for(|h| *h).await; } => std::future::pending().await,
                resp = state.clone().handle(req) => Ok::<_, Infallible>(resp),
            }
        }
    });
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.cancelled() => {
            // Finish the request in progress (if any), then close.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Wraps a task so dropping the handle aborts it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Logs each distinct message once, so a daemon that is down for an hour costs one line.
#[derive(Default)]
struct LogOnce(HashSet<String>);

impl LogOnce {
    fn log(&mut self, msg: String) {
        if self.0.insert(msg.clone()) {
            eprintln!("toy-server: report: {msg}");
        }
    }
}

/// Reports the queue to the daemon every 200 ms once loaded; reconnects every second when the
/// socket is unreachable or closes; goes silent (but keeps the process alive) when hung.
async fn report_loop(state: Arc<State>, reporter: Reporter) {
    let mut log = LogOnce::default();
    // Nothing is sent before loading is done, not even a connection attempt.
    let _ = state.loaded.subscribe().wait_for(|l| *l).await;
    loop {
        if *state.hung.borrow() {
            std::future::pending::<()>().await;
        }
        match UnixStream::connect(&reporter.socket).await {
            Ok(stream) => {
                let err = report_on(&state, &reporter, stream, &mut log).await;
                log.log(err);
            }
            Err(e) => log.log(format!("connecting to {}: {e}", reporter.socket.display())),
        }
        tokio::time::sleep(RECONNECT_EVERY).await;
    }
}

/// Writes reports on one connection until it fails; returns why it stopped.
async fn report_on(
    state: &State,
    reporter: &Reporter,
    mut stream: UnixStream,
    log: &mut LogOnce,
) -> String {
    let mut codec = LinesCodec::new_with_max_length(MAX_LINE);
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut wbuf = BytesMut::with_capacity(512);
    let mut hung = state.hung.subscribe();
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let s = state.stats();
                let mut report = json!({
                    "op": "report",
                    "model": reporter.model,
                    "oldest_wait_ms": s.oldest_wait.as_millis() as u64,
                    "queue_depth": s.waiting,
                    "in_flight": s.waiting + s.running,
                    "arrived": s.arrived,
                    "completed": s.completed,
                });
                if let Some(r) = &reporter.replica {
                    report["replica"] = json!(r);
                }
                wbuf.clear();
                if let Err(e) = codec.encode(report.to_string(), &mut wbuf) {
                    return format!("encoding report: {e}");
                }
                if let Err(e) = stream.write_all(&wbuf).await {
                    return format!("writing to {}: {e}", reporter.socket.display());
                }
            }
            // read_buf is cancel-safe, so losing the race to the ticker loses no data.
            read = stream.read_buf(&mut rbuf) => {
                match read {
                    Ok(0) => return format!("{} closed the connection", reporter.socket.display()),
                    Ok(_) => {}
                    Err(e) => return format!("reading from {}: {e}", reporter.socket.display()),
                }
                loop {
                    match codec.decode(&mut rbuf) {
                        Ok(Some(line)) => check_answer(&line, log),
                        Ok(None) => break,
                        // The codec skips to the next newline after an over-long line.
                        Err(e) => log.log(format!("answer: {e}")),
                    }
                }
            }
            _ = async { let _ = hung.wait_for(|h| *h).await; } => {
                // A hung server says nothing more; the connection stays open like a stuck
                // process's would.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Answers are read only to notice errors; `{"ok":true}` needs nothing.
fn check_answer(line: &str, log: &mut LogOnce) {
    match serde_json::from_str::<Value>(line) {
        Ok(v) if v.get("ok") == Some(&Value::Bool(true)) => {}
        Ok(v) => log.log(format!(
            "daemon answered {}: {}",
            v.get("error").and_then(Value::as_str).unwrap_or("error"),
            v.get("message").and_then(Value::as_str).unwrap_or(line)
        )),
        Err(_) => log.log(format!("unparsable answer: {line}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixListener;
    use tokio::sync::oneshot;

    fn args() -> ToyArgs {
        ToyArgs {
            port: 0,
            host: "127.0.0.1".into(),
            load_time: Duration::ZERO,
            concurrency: 1,
            service_time: Duration::from_millis(200),
            fail_warmup: false,
            crash_after: None,
            hang_after: None,
            read_file: None,
            report_socket: None,
        }
    }

    /// A server running in the test process on an ephemeral port.
    struct Server {
        base: String,
        stop: Option<oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<anyhow::Result<()>>,
        http: reqwest::Client,
    }

    impl Server {
        async fn start(args: ToyArgs, reporter: Option<Reporter>) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let (tx, rx) = oneshot::channel::<()>();
            let task = tokio::spawn(serve(listener, args, reporter, async {
                let _ = rx.await;
            }));
            Server {
                base,
                stop: Some(tx),
                task,
                http: reqwest::Client::new(),
            }
        }

        async fn get(&self, path: &str) -> reqwest::Result<(u16, String)> {
            let r = self
                .http
                .get(format!("{}{path}", self.base))
                .timeout(Duration::from_secs(5))
                .send()
                .await?;
            Ok((r.status().as_u16(), r.text().await?))
        }

        fn complete(&self, body: &str) -> impl Future<Output = reqwest::Result<(u16, Value)>> {
            let req = self
                .http
                .post(format!("{}/v1/completions", self.base))
                .header("content-type", "application/json")
                .body(body.to_string())
                .timeout(Duration::from_secs(10));
            async move {
                let r = req.send().await?;
                let status = r.status().as_u16();
                let text = r.text().await?;
                Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
            }
        }

        async fn metrics(&self) -> HashMap<String, f64> {
            let (status, text) = self.get("/metrics").await.unwrap();
            assert_eq!(status, 200);
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
                .collect()
        }

        async fn stop(mut self) -> anyhow::Result<()> {
            let _ = self.stop.take().unwrap().send(());
            tokio::time::timeout(Duration::from_secs(10), &mut self.task)
                .await
                .expect("serve returns after shutdown")
                .unwrap()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// Polls `f` until it yields `Some`, failing the test after `limit`.
    async fn until<T, Fut: Future<Output = Option<T>>>(
        what: &str,
        limit: Duration,
        mut f: impl FnMut() -> Fut,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = f().await {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

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
    async fn health_is_503_while_loading_then_200() {
        let started = Instant::now();
        let s = Server::start(
            ToyArgs {
                load_time: Duration::from_millis(400),
                ..args()
            },
            None,
        )
        .await;
        let (status, body) = s.get("/health").await.unwrap();
        assert_eq!((status, body.as_str()), (503, r#"{"status":"loading"}"#));
        assert_eq!(s.complete("{}").await.unwrap().0, 503);
        let body = until("health 200", Duration::from_secs(5), || async {
            match s.get("/health").await.unwrap() {
                (200, body) => Some(body),
                _ => None,
            }
        })
        .await;
        assert_eq!(body, r#"{"status":"ok"}"#);
        assert!(started.elapsed() >= Duration::from_millis(400));
        s.stop().await.unwrap();
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
    }

    #[tokio::test]
    async fn completion_answers_with_choices() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_millis(10),
                ..args()
            },
            None,
        )
        .await;
        let (status, v) = s
            .complete(r#"{"model":"llama","prompt":"hello there","max_tokens":8}"#)
            .await
            .unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["model"], "llama");
        assert_eq!(v["choices"][0]["text"], " toy");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], 2);
        assert!(v["id"].as_str().unwrap().starts_with("toy-"));
        // Missing fields and an empty body are tolerated; malformed JSON is not.
        assert_eq!(s.complete("{}").await.unwrap().0, 200);
        assert_eq!(s.complete("").await.unwrap().0, 200);
        assert_eq!(s.complete("{nope").await.unwrap().0, 400);
        assert_eq!(s.get("/nowhere").await.unwrap().0, 404);
        let m = s.metrics().await;
        assert_eq!(m["toy_requests_arrived_total"], 3.0);
        assert_eq!(m["toy_requests_completed_total"], 3.0);
        assert_eq!(m["toy_requests_waiting"], 0.0);
        assert_eq!(m["toy_requests_running"], 0.0);
        assert_eq!(m["toy_oldest_wait_seconds"], 0.0);
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn fail_warmup_answers_500() {
        let s = Server::start(
            ToyArgs {
                fail_warmup: true,
                ..args()
            },
            None,
        )
        .await;
        let (status, v) = s.complete(r#"{"prompt":"x"}"#).await.unwrap();
        assert_eq!(status, 500);
        assert_eq!(v["error"], "toy-server: --fail-warmup");
        assert_eq!(s.get("/health").await.unwrap().0, 200);
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn requests_queue_for_slots_and_oldest_wait_grows() {
        let s = Server::start(
            ToyArgs {
                concurrency: 1,
                service_time: Duration::from_millis(700),
                ..args()
            },
            None,
        )
        .await;
        let reqs: Vec<_> = (0..3).map(|_| tokio::spawn(s.complete("{}"))).collect();
        let first = until("2 waiting, 1 running", Duration::from_secs(5), || async {
            let m = s.metrics().await;
            (m["toy_requests_waiting"] == 2.0 && m["toy_requests_running"] == 1.0)
                .then_some(m["toy_oldest_wait_seconds"])
        })
        .await;
        until("oldest wait to grow", Duration::from_secs(5), || async {
            let m = s.metrics().await;
            (m["toy_oldest_wait_seconds"] >= first + 0.1).then_some(())
        })
        .await;
        assert_eq!(s.state_stats_via_metrics().await, (3.0, 0.0));
        for r in reqs {
            assert_eq!(r.await.unwrap().unwrap().0, 200);
        }
        let m = s.metrics().await;
        assert_eq!(m["toy_requests_completed_total"], 3.0);
        assert_eq!(m["toy_requests_waiting"], 0.0);
        assert_eq!(m["toy_oldest_wait_seconds"], 0.0);
        s.stop().await.unwrap();
    }

    impl Server {
        /// (arrived, completed)
        async fn state_stats_via_metrics(&self) -> (f64, f64) {
            let m = self.metrics().await;
            (
                m["toy_requests_arrived_total"],
                m["toy_requests_completed_total"],
            )
        }
    }

    #[tokio::test]
    async fn client_gone_while_waiting_leaves_the_queue() {
        let s = Server::start(
            ToyArgs {
                concurrency: 1,
                service_time: Duration::from_secs(3),
                ..args()
            },
            None,
        )
        .await;
        let holder = tokio::spawn(s.complete("{}"));
        let mut raw = TcpStream::connect(s.base.trim_start_matches("http://"))
            .await
            .unwrap();
        raw.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            .await
            .unwrap();
        until("1 waiting", Duration::from_secs(2), || async {
            (s.metrics().await["toy_requests_waiting"] == 1.0).then_some(())
        })
        .await;
        drop(raw);
        // Well before the holder's 3 s are up, the abandoned entry must be gone.
        until(
            "abandoned entry to leave",
            Duration::from_millis(1500),
            || async {
                let m = s.metrics().await;
                (m["toy_requests_waiting"] == 0.0 && m["toy_requests_running"] == 1.0).then_some(())
            },
        )
        .await;
        assert_eq!(holder.await.unwrap().unwrap().0, 200);
        assert_eq!(s.state_stats_via_metrics().await, (2.0, 1.0));
        s.stop().await.unwrap();
    }

    async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
        lines: &mut tokio::io::Lines<R>,
    ) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(3), lines.next_line())
            .await
            .expect("a report within 3 s")
            .unwrap()
            .expect("connection open");
        serde_json::from_str(&line).unwrap()
    }

    #[tokio::test]
    async fn reports_arrive_on_the_socket_after_loading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hearth.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let started = Instant::now();
        let s = Server::start(
            ToyArgs {
                load_time: Duration::from_millis(300),
                service_time: Duration::from_millis(10),
                ..args()
            },
            Some(Reporter {
                socket: path.clone(),
                model: "m".into(),
                replica: Some("m-1".into()),
            }),
        )
        .await;
        let (conn, _) = tokio::time::timeout(Duration::from_secs(3), listener.accept())
            .await
            .unwrap()
            .unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "nothing before loading"
        );
        let (rd, mut wr) = conn.into_split();
        let rd = BufReader::new(rd);
        let mut lines = rd.lines();
        let r = next_line(&mut lines).await;
        assert_eq!(r["op"], "report");
        assert_eq!(r["model"], "m");
        assert_eq!(r["replica"], "m-1");
        for k in [
            "oldest_wait_ms",
            "queue_depth",
            "in_flight",
            "arrived",
            "completed",
        ] {
            assert_eq!(r[k], 0, "{k} in {r}");
        }
        wr.write_all(b"{\"ok\":true}\n").await.unwrap();
        assert_eq!(s.complete("{}").await.unwrap().0, 200);
        // Reports keep coming every 200 ms; one of the next few must count the completion.
        let mut counted = false;
        for _ in 0..10 {
            let r = next_line(&mut lines).await;
            if r["arrived"] == 1 && r["completed"] == 1 && r["in_flight"] == 0 {
                counted = true;
                break;
            }
        }
        assert!(counted, "no report counted the completion");
        wr.write_all(b"{\"ok\":false,\"error\":\"bad_request\",\"message\":\"x\"}\n")
            .await
            .unwrap();
        next_line(&mut lines).await;

        // The daemon goes away: the reporter comes back on a new connection.
        drop(lines);
        drop(wr);
        let (conn, _) = tokio::time::timeout(Duration::from_secs(3), listener.accept())
            .await
            .expect("reconnects within 3 s")
            .unwrap();
        let mut lines = BufReader::new(conn).lines();
        assert_eq!(next_line(&mut lines).await["op"], "report");
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn report_omits_replica_when_unset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hearth.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let s = Server::start(
            args(),
            Some(Reporter {
                socket: path,
                model: "m".into(),
                replica: None,
            }),
        )
        .await;
        let (conn, _) = tokio::time::timeout(Duration::from_secs(3), listener.accept())
            .await
            .unwrap()
            .unwrap();
        let r = next_line(&mut BufReader::new(conn).lines()).await;
        assert_eq!(r["model"], "m");
        assert!(r.get("replica").is_none(), "{r}");
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn hang_after_stops_answering_but_accepts() {
        let s = Server::start(
            ToyArgs {
                hang_after: Some(Duration::from_millis(1000)),
                ..args()
            },
            None,
        )
        .await;
        assert_eq!(s.get("/health").await.unwrap().0, 200);
        // Keep-alive connections opened (and answered) before the hang.
        let addr = s.base.trim_start_matches("http://").to_string();
        const GET: &[u8] = b"GET /health HTTP/1.1\r\nHost: toy\r\n\r\n";
        let mut before = Vec::new();
        for _ in 0..8 {
            let mut c = TcpStream::connect(&addr).await.unwrap();
            c.write_all(GET).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = c.read(&mut buf).await.unwrap();
            let answer = String::from_utf8_lossy(&buf[..n]).to_string();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            before.push(c);
        }
        let short = |c: &reqwest::Client| {
            c.get(format!("{}/health", s.base))
                .timeout(Duration::from_millis(300))
                .send()
        };
        until(
            "a request to go unanswered",
            Duration::from_secs(5),
            || async { short(&s.http).await.err().filter(|e| e.is_timeout()) },
        )
        .await;
        // A new connection is accepted (TCP connect succeeds) but never answered.
        let fresh = reqwest::Client::new();
        let err = short(&fresh).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
        // Nor is a request on a connection from before the hang, not even one the server could
        // answer at once (/health).
        for (i, mut c) in before.into_iter().enumerate() {
            c.write_all(GET).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let r = tokio::time::timeout(Duration::from_millis(300), c.read(&mut buf)).await;
            if let Ok(Ok(n)) = r {
                panic!(
                    "kept-alive connection {i} answered after the hang: {:?}",
                    String::from_utf8_lossy(&buf[..n])
                );
            }
        }
        // No graceful stop here: hung requests would hold it for 30 s; Drop aborts the task.
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
        let base = s.base.clone();
        s.stop().await.unwrap();
        assert_eq!(inflight.await.unwrap().unwrap().0, 200);
        // The listener is gone.
        assert!(TcpStream::connect(base.trim_start_matches("http://"))
            .await
            .is_err());
    }
}
