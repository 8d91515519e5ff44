//! The router as a client of the daemon, over its Unix socket, like any reporter:
//! - it follows `watch` (all models) and applies each `routed` event to the queue;
//! - it sends reports every 100 ms, at once when a model's oldest wait crosses its target, and
//!   at once when the queue says so (work for a model with nothing routed, a replica that left
//!   became idle).
//!
//! Both reconnect with a back-off when the daemon goes away. Meanwhile the queue keeps the last
//! routed set it saw and goes on serving on it; requests for models with nothing routed wait.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::UnixStream;
use tokio_util::codec::{Framed, LinesCodec};
use tokio_util::sync::CancellationToken;

use super::agent::Capacity;
use super::router::Router;
use crate::client::Client;
use crate::protocol::{self, Request, WatchEvent};

/// Reports go out at least this often.
pub const REPORT_EVERY: Duration = Duration::from_millis(100);
/// First reconnect delay, doubled up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A report shows a wait over the target only once the wait is over it: the crossing instant
/// plus this.
const CROSSING_MARGIN: Duration = Duration::from_millis(1);

/// Follows the daemon's watch until `shutdown`.
pub async fn follow(router: Arc<Router>, socket: PathBuf, shutdown: CancellationToken) {
    let mut backoff = Backoff::default();
    let mut log = Once::default();
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = watch_once(&router, &socket, &mut backoff) => r,
        };
        if router.is_daemon_connected() {
            // A new episode: its messages are worth saying again.
            log.0.clear();
            router.set_daemon_connected(false);
        }
        if let Err(e) = result {
            log.warn(format!(
                "watch: {e}; serving on the last routed set meanwhile"
            ));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

async fn watch_once(
    router: &Router,
    socket: &std::path::Path,
    backoff: &mut Backoff,
) -> Result<(), String> {
    let mut client = Client::connect(socket).await.map_err(|e| e.to_string())?;
    let answer = client
        .call(&Request::Watch { model: None })
        .await
        .map_err(|e| e.to_string())?;
    if answer["ok"] != Value::Bool(true) {
        return Err(format!("the daemon refused: {}", failure_text(&answer)));
    }
    router.set_daemon_connected(true);
    tracing::info!("following the daemon at {}", socket.display());
    backoff.reset();
    let models: HashSet<&str> = router
        .settings
        .models
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    let mut unknown = Once::default();
    while let Some(line) = client.next().await {
        if line.get("ok") == Some(&Value::Bool(false)) {
            // The daemon gave up on this watch (it fell behind): a new one starts with a fresh
            // snapshot.
            return Err(failure_text(&line));
        }
        let (model, endpoints) = match serde_json::from_value(line) {
            Ok(WatchEvent::Routed { model, endpoints }) => (model, endpoints),
            Ok(WatchEvent::Capacity {
                model,
                drained,
                max,
                warm,
                can_start,
                asleep,
            }) => {
                if let Some(index) = router.settings.resolve_own(&model) {
                    router.set_capacity(
                        index,
                        Capacity {
                            drained,
                            max,
                            warm,
                            can_start,
                            asleep,
                        },
                    );
                }
                continue;
            }
            _ => continue,
        };
        if !models.contains(model.as_str()) {
            unknown.warn(format!(
                "the daemon routes model {model:?}, which this router's configuration lacks"
            ));
            continue;
        }
        let Some(index) = router.settings.models.iter().position(|m| m.name == model) else {
            continue;
        };
        // One model, one `slots`: every endpoint carries the same. A routed set with none (an
        // empty one, or from a daemon before `slots`) keeps the last, at first the file's.
        if let Some(slots) = endpoints.iter().filter_map(|e| e.slots).max() {
            router.set_slots(index, slots);
        }
        let parsed: Vec<(String, SocketAddr)> = endpoints
            .into_iter()
            .filter_map(|e| match e.addr.parse() {
                Ok(a) => Some((e.replica, a)),
                Err(_) => {
                    tracing::warn!(model = %model, replica = %e.replica, "unusable address {:?}", e.addr);
                    None
                }
            })
            .collect();
        tracing::debug!(model = %model, "routed: {:?}", parsed);
        router.set_routed(index, &parsed);
    }
    Err("the daemon closed the watch".into())
}

/// Sends reports until `shutdown`.
pub async fn report(router: Arc<Router>, socket: PathBuf, shutdown: CancellationToken) {
    let mut backoff = Backoff::default();
    let mut log = Once::default();
    loop {
        let why = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = report_once(&router, &socket, &mut backoff, &mut log) => r,
        };
        log.warn(format!("reports: {why}"));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

/// One connection's worth of reports; returns why it ended.
async fn report_once(
    router: &Router,
    socket: &std::path::Path,
    backoff: &mut Backoff,
    log: &mut Once,
) -> String {
    let stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return format!(
                "permission denied on the daemon's socket {}: {e} (the front door's user needs \
                 the socket's group, `hearth` under systemd)",
                socket.display()
            )
        }
        Err(e) => return format!("no daemon at {}: {e}", socket.display()),
    };
    let (mut sink, mut answers) =
        Framed::new(stream, LinesCodec::new_with_max_length(protocol::MAX_LINE)).split();
    backoff.reset();
    log.0.clear();
    let mut next_tick = tokio::time::Instant::now();
    loop {
        // Due: the 100 ms tick, a crossing of a target, or a wake from the queue.
        let crossing = router
            .next_crossing()
            .map(|t| tokio::time::Instant::from_std(t + CROSSING_MARGIN));
        let wake_at = crossing.map_or(next_tick, |c| c.min(next_tick));
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {}
            _ = router.report_wake.notified() => {}
            answer = answers.next() => match answer {
                Some(Ok(line)) => {
                    note_answer(&line, log);
                    continue;
                }
                Some(Err(e)) => return format!("reading answers: {e}"),
                None => return "the daemon closed the connection".into(),
            },
        }
        let now = tokio::time::Instant::now();
        let crossed = crossing.is_some_and(|c| c <= now);
        if !(now >= next_tick || crossed || router.take_urgent()) {
            // A wake that only moved the schedule.
            continue;
        }
        // The ticker keeps its cadence; an early report does not postpone the next one.
        if now >= next_tick {
            next_tick = now + REPORT_EVERY;
        }
        for mut r in router.reports() {
            // Marks the reports as a front door's: the daemon lets them supersede the
            // replicas' own reports and scrapes for the model.
            r.router = Some(router.name.clone());
            let line = serde_json::to_string(&Request::Report(r)).expect("a report serializes");
            if let Err(e) = sink.feed(line).await {
                return format!("writing: {e}");
            }
        }
        if let Err(e) = sink.flush().await {
            return format!("writing: {e}");
        }
    }
}

/// Answers are read to notice refusals; replicas that are gone by the time their report lands
/// are expected and not worth a line.
fn note_answer(line: &str, log: &mut Once) {
    match serde_json::from_str::<Value>(line) {
        Ok(v) if v["ok"] == Value::Bool(true) => {}
        Ok(v) if v["error"] == "unknown_replica" => {}
        Ok(v) if v["error"] == "forbidden" => log.warn(format!(
            "the daemon refuses this router's reports ({}): give its user the reporter role \
             ([access] reporters)",
            failure_text(&v)
        )),
        Ok(v) => log.warn(format!("a report was refused: {}", failure_text(&v))),
        Err(_) => log.warn(format!("unreadable answer: {line}")),
    }
}

fn failure_text(v: &Value) -> String {
    format!(
        "{}: {}",
        v["error"].as_str().unwrap_or("error"),
        v["message"].as_str().unwrap_or("")
    )
}

#[derive(Default)]
struct Backoff(Option<Duration>);

impl Backoff {
    fn next(&mut self) -> Duration {
        let d = self.0.map_or(BACKOFF_MIN, |d| (d * 2).min(BACKOFF_MAX));
        self.0 = Some(d);
        d
    }

    fn reset(&mut self) {
        self.0 = None;
    }
}

/// Says each distinct message once, so a daemon that is away for an hour costs a line, not
/// thousands.
#[derive(Default)]
struct Once(HashSet<String>);

impl Once {
    fn warn(&mut self, msg: String) {
        if self.0.len() > 64 {
            self.0.clear();
        }
        if self.0.insert(msg.clone()) {
            tracing::warn!("{msg}");
        }
    }
}
