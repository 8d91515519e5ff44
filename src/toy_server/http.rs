//! The toy server's HTTP surface: `GET /health` (503 while loading, 200 after), the OpenAI API
//! (`api.rs`: completions, chat, embeddings, models), `GET /metrics` (the queue, in Prometheus
//! text), and the connection loop that goes silent when the server hangs.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::api;
use super::openai::Kind;
use super::State;

/// Every answer's body: whole, or a stream of events.
pub(super) type ToyBody = BoxBody<Bytes, Infallible>;

/// Serves one connection (keep-alive) until it closes or shutdown asks it to finish.
pub(super) async fn serve_conn(stream: TcpStream, state: Arc<State>, stop: CancellationToken) {
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
                resp = handle(state.clone(), req) => Ok::<_, Infallible>(resp),
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

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<ToyBody> {
    let loaded = *state.loaded.borrow();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    if let Some(resp) = super::sleep::route(&state, req.method(), &path, query.as_deref()).await {
        return resp;
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/health") if loaded => {
            json_response(StatusCode::OK, json!({"status":"ok"}))
        }
        (&Method::GET, "/health") => {
            json_response(StatusCode::SERVICE_UNAVAILABLE, json!({"status":"loading"}))
        }
        (&Method::GET, "/metrics") => metrics(&state),
        (&Method::POST, "/v1/completions") => api::generate(state, req, Kind::Completion).await,
        (&Method::POST, "/v1/chat/completions") => api::generate(state, req, Kind::Chat).await,
        (&Method::POST, "/v1/embeddings") => api::embeddings(state, req).await,
        (&Method::GET, "/v1/models") => api::models(&state),
        (&Method::GET, p) if p.starts_with("/v1/models/") => {
            api::model(&state, &p["/v1/models/".len()..])
        }
        (_, "/health" | "/metrics") => json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error":"method not allowed"}),
        ),
        (_, p)
            if matches!(
                p,
                "/v1/completions" | "/v1/chat/completions" | "/v1/embeddings" | "/v1/models"
            ) || p.starts_with("/v1/models/") =>
        {
            api::failure(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{p}: method not allowed"),
                "invalid_request_error",
                None,
                Some("method_not_allowed"),
            )
        }
        (_, p) => api::failure(
            StatusCode::NOT_FOUND,
            &format!("no route for {p}"),
            "invalid_request_error",
            None,
            Some("not_found"),
        ),
    }
}

/// `--marks DIR`: DIR/REPLICA.PID, with this process's cgroup, before the first answer leaves.
pub(super) fn mark(state: &State) {
    let Some(dir) = &state.marks else {
        return;
    };
    if state.marked.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cgroup = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("")
        .to_string();
    let path = dir.join(format!("{}.{}", state.replica, state.pid));
    if let Err(e) = std::fs::write(&path, cgroup) {
        eprintln!("toy-server: --marks: writing {}: {e}", path.display());
    }
}

/// The queue as OpenMetrics text: one snapshot, so the five numbers agree with each other.
fn metrics(state: &State) -> Response<ToyBody> {
    let s = state.queue.stats();
    let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    let mut registry = Registry::default();
    registry.register(
        "toy_requests_waiting",
        "Completion requests waiting for a slot",
        gauge(s.waiting),
    );
    registry.register(
        "toy_requests_running",
        "Completion requests holding a slot",
        gauge(s.running),
    );
    // Counters get their `_total` suffix from the encoder.
    registry.register(
        "toy_requests_arrived",
        "Completion requests admitted to the queue",
        ConstCounter::new(s.arrived),
    );
    registry.register(
        "toy_requests_completed",
        "Completion requests answered",
        ConstCounter::new(s.completed),
    );
    registry.register(
        "toy_oldest_wait_seconds",
        "Age of the oldest request still waiting for a slot",
        ConstGauge::new(s.oldest_wait.as_secs_f64()),
    );
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        return json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": format!("encoding metrics: {e}")}),
        );
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(
            hyper::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
        .body(Full::new(Bytes::from(out)).boxed())
        .expect("static response parts are valid")
}

pub(super) fn json_response(status: StatusCode, body: Value) -> Response<ToyBody> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::super::test_server::{args, until, Server};
    use super::*;
    use crate::toy_server::ToyArgs;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        let text = v["choices"][0]["text"].as_str().unwrap();
        assert_eq!(
            text.split_whitespace().count(),
            8,
            "max_tokens words: {text:?}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], 2);
        assert_eq!(v["usage"]["completion_tokens"], 8);
        assert_eq!(v["usage"]["total_tokens"], 10);
        assert!(v["id"].as_str().unwrap().starts_with("cmpl-"), "{v}");
        // Missing fields and an empty body are tolerated; malformed JSON is not.
        assert_eq!(s.complete("{}").await.unwrap().0, 200);
        assert_eq!(s.complete("").await.unwrap().0, 200);
        let (status, v) = s.complete("{nope").await.unwrap();
        assert_eq!(status, 400);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let (status, body) = s.get("/nowhere").await.unwrap();
        assert_eq!(status, 404);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{v}");
        let m = s.metrics().await;
        assert_eq!(m["toy_requests_arrived_total"], 3.0);
        assert_eq!(m["toy_requests_completed_total"], 3.0);
        assert_eq!(m["toy_requests_waiting"], 0.0);
        assert_eq!(m["toy_requests_running"], 0.0);
        assert_eq!(m["toy_oldest_wait_seconds"], 0.0);
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text_with_help_and_type() {
        let s = Server::start(args(), None).await;
        let (status, text) = s.get("/metrics").await.unwrap();
        assert_eq!(status, 200);
        for line in [
            "# HELP toy_requests_waiting Completion requests waiting for a slot.",
            "# TYPE toy_requests_waiting gauge",
            "toy_requests_waiting 0",
            "# TYPE toy_requests_arrived counter",
            "toy_requests_arrived_total 0",
            "# TYPE toy_oldest_wait_seconds gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in:\n{text}"
            );
        }
        assert_eq!(text.lines().last(), Some("# EOF"), "{text}");
        assert_eq!(text.matches("# TYPE ").count(), 5, "{text}");
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn token_time_holds_the_slot_per_token_asked_for() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::ZERO,
                token_time: Duration::from_millis(50),
                ..args()
            },
            None,
        )
        .await;
        let timed = |body: &'static str| {
            let s = &s;
            async move {
                let t = std::time::Instant::now();
                assert_eq!(s.complete(body).await.unwrap().0, 200);
                t.elapsed()
            }
        };
        let long = timed(r#"{"max_tokens":20}"#).await;
        assert!(long >= Duration::from_millis(1000), "{long:?}");
        let short = timed(r#"{"max_tokens":2}"#).await;
        assert!(short >= Duration::from_millis(100), "{short:?}");
        // Bounded: an absurd max_tokens holds the slot for 4096 tokens, not for ever (not
        // waited for here), and the default is 16.
        let default = timed("{}").await;
        assert!(default >= Duration::from_millis(800), "{default:?}");
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
        assert_eq!(v["error"]["message"], "toy-server: --fail-warmup");
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(s.get("/health").await.unwrap().0, 200);
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
        const GET: &[u8] = b"GET /health HTTP/1.1\r\nHost: toy\r\n\r\n";
        let mut before = Vec::new();
        for _ in 0..8 {
            let mut c = TcpStream::connect(s.addr()).await.unwrap();
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
}
