//! The toy server's queue reports to the daemon: a `report` request on the daemon's socket
//! every 200 ms once loaded, as docs/design.md's protocol has it, written with the protocol
//! module's own types.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LinesCodec};

use super::State;
use crate::protocol::{self, Report};

/// How often a report goes to the daemon (the contract says 200 ms).
const REPORT_EVERY: Duration = Duration::from_millis(200);
/// How long to wait before reconnecting to an unreachable or closed socket.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

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

    /// The report line for the queue as it is now.
    fn line(&self, state: &State) -> Result<String, serde_json::Error> {
        let s = state.queue.stats();
        let report = protocol::Request::Report(Report {
            model: self.model.clone(),
            replica: self.replica.clone(),
            oldest_wait_ms: Some(s.oldest_wait.as_secs_f64() * 1000.0),
            queue_depth: Some(s.waiting),
            in_flight: Some(s.waiting + s.running),
            arrived: Some(s.arrived),
            completed: Some(s.completed),
            router: None,
        });
        let mut line = serde_json::to_string(&report)?;
        line.push('\n');
        Ok(line)
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
pub(super) async fn report_loop(state: Arc<State>, reporter: Reporter) {
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
    // Answers are bounded like every line on the socket; the codec skips past a longer one.
    let mut answers = LinesCodec::new_with_max_length(protocol::MAX_LINE);
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut hung = state.hung.subscribe();
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let line = match reporter.line(state) {
                    Ok(line) => line,
                    Err(e) => return format!("encoding report: {e}"),
                };
                if let Err(e) = stream.write_all(line.as_bytes()).await {
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
                    match answers.decode(&mut rbuf) {
                        Ok(Some(line)) => check_answer(&line, log),
                        Ok(None) => break,
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

/// What a reporter needs of the daemon's answer: whether it was refused, and why. The rest of
/// an answer is ignored.
#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Answers are read only to notice refusals; `{"ok":true}` needs nothing.
fn check_answer(line: &str, log: &mut LogOnce) {
    match serde_json::from_str::<Answer>(line) {
        Ok(Answer { ok: true, .. }) => {}
        Ok(Answer { error, message, .. }) => log.log(format!(
            "daemon answered {}: {}",
            error.as_deref().unwrap_or("error"),
            message.as_deref().unwrap_or(line)
        )),
        Err(_) => log.log(format!("unparsable answer: {line}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_server::{args, Server};
    use super::*;
    use crate::toy_server::ToyArgs;
    use serde_json::Value;
    use std::time::Instant;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixListener;

    /// The next report line, as JSON and as the daemon parses it.
    async fn next_report<R: tokio::io::AsyncBufRead + Unpin>(
        lines: &mut tokio::io::Lines<R>,
    ) -> (Value, Report) {
        let line = tokio::time::timeout(Duration::from_secs(3), lines.next_line())
            .await
            .expect("a report within 3 s")
            .unwrap()
            .expect("connection open");
        let report = match serde_json::from_str::<protocol::Request>(&line) {
            Ok(protocol::Request::Report(r)) => r,
            other => panic!("not a report: {line} ({other:?})"),
        };
        (serde_json::from_str(&line).unwrap(), report)
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
        let (json, r) = next_report(&mut lines).await;
        assert_eq!(json["op"], "report");
        assert_eq!(
            r,
            Report {
                model: "m".into(),
                replica: Some("m-1".into()),
                oldest_wait_ms: Some(0.0),
                queue_depth: Some(0),
                in_flight: Some(0),
                arrived: Some(0),
                completed: Some(0),
                router: None,
            }
        );
        wr.write_all(b"{\"ok\":true}\n").await.unwrap();
        assert_eq!(s.complete("{}").await.unwrap().0, 200);
        // Reports keep coming every 200 ms; one of the next few must count the completion.
        let mut counted = false;
        for _ in 0..10 {
            let (_, r) = next_report(&mut lines).await;
            if (r.arrived, r.completed, r.in_flight) == (Some(1), Some(1), Some(0)) {
                counted = true;
                break;
            }
        }
        assert!(counted, "no report counted the completion");
        // A refusal, an over-long line and garbage are logged; the reports go on.
        wr.write_all(b"{\"ok\":false,\"error\":\"bad_request\",\"message\":\"x\"}\n")
            .await
            .unwrap();
        let long = vec![b'x'; protocol::MAX_LINE + 10];
        wr.write_all(&long).await.unwrap();
        wr.write_all(b"\nnot json\n").await.unwrap();
        next_report(&mut lines).await;
        next_report(&mut lines).await;

        // The daemon goes away: the reporter comes back on a new connection.
        drop(lines);
        drop(wr);
        let (conn, _) = tokio::time::timeout(Duration::from_secs(3), listener.accept())
            .await
            .expect("reconnects within 3 s")
            .unwrap();
        let mut lines = BufReader::new(conn).lines();
        assert_eq!(next_report(&mut lines).await.0["op"], "report");
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
        let (json, r) = next_report(&mut BufReader::new(conn).lines()).await;
        assert_eq!(r.model, "m");
        assert!(json.get("replica").is_none(), "{json}");
        s.stop().await.unwrap();
    }

    #[test]
    fn answers_are_checked_by_type() {
        let mut log = LogOnce::default();
        check_answer(r#"{"ok":true}"#, &mut log);
        check_answer(r#"{"ok":true,"extra":1}"#, &mut log);
        assert!(log.0.is_empty(), "{:?}", log.0);
        check_answer(
            r#"{"ok":false,"error":"forbidden","message":"reporters only"}"#,
            &mut log,
        );
        check_answer(r#"{"ok":false}"#, &mut log);
        check_answer("[1,2]", &mut log);
        let mut logged: Vec<_> = log.0.into_iter().collect();
        logged.sort();
        assert_eq!(
            logged,
            vec![
                r#"daemon answered error: {"ok":false}"#.to_string(),
                "daemon answered forbidden: reporters only".to_string(),
                "unparsable answer: [1,2]".to_string(),
            ]
        );
    }
}
