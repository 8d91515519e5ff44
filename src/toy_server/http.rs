//! The toy server's HTTP surface: `GET /health` (503 while loading, 200 after),
//! `POST /v1/completions` (OpenAI shape, through the queue), `GET /metrics` (the queue, in
//! Prometheus text), and the connection loop that goes silent when the server hangs.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
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

use super::State;

/// Largest completion request body we accept; a toy has no use for more.
const MAX_BODY: usize = 1 << 20;

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

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let loaded = *state.loaded.borrow();
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") if loaded => {
            json_response(StatusCode::OK, json!({"status":"ok"}))
        }
        (&Method::GET, "/health") => {
            json_response(StatusCode::SERVICE_UNAVAILABLE, json!({"status":"loading"}))
        }
        (&Method::GET, "/metrics") => metrics(&state),
        (&Method::POST, "/v1/completions") => completion(state, req).await,
        (_, "/health" | "/metrics" | "/v1/completions") => json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error":"method not allowed"}),
        ),
        _ => json_response(StatusCode::NOT_FOUND, json!({"error":"not found"})),
    }
}

async fn completion(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if !*state.loaded.borrow() {
        return json_response(StatusCode::SERVICE_UNAVAILABLE, json!({"status":"loading"}));
    }
    if state.fail_warmup {
        return json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error":"toy-server: --fail-warmup"}),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return json_response(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
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

    let id = state.queue.serve(hold_time(&state, &body)).await;
    mark(&state);

    let mut resp = json_response(
        StatusCode::OK,
        json!({
            "id": format!("toy-{id}"),
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
    );
    // Who answered: tests check it against the replica the address was routed for.
    let h = resp.headers_mut();
    if let Ok(v) = hyper::header::HeaderValue::from_str(&state.pid.to_string()) {
        h.insert("x-toy-pid", v);
    }
    if let Ok(v) = hyper::header::HeaderValue::from_str(&state.replica) {
        h.insert("x-toy-replica", v);
    }
    resp
}

/// `--marks DIR`: DIR/REPLICA.PID, with this process's cgroup, before the first answer leaves.
fn mark(state: &State) {
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
fn metrics(state: &State) -> Response<Full<Bytes>> {
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
        .body(Full::new(Bytes::from(out)))
        .expect("static response parts are valid")
}

/// A rough token count for `usage`: words in the prompt (string or list of strings).
fn prompt_tokens(prompt: Option<&Value>) -> u64 {
    match prompt {
        Some(Value::String(s)) => s.split_whitespace().count() as u64,
        Some(Value::Array(items)) => items.iter().map(|v| prompt_tokens(Some(v))).sum(),
        _ => 0,
    }
}

fn json_response(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static response parts are valid")
}

/// How long a completion holds its slot: `--service-time`, plus `--token-time` per token
/// asked for (OpenAI's default of 16 when the body names none; at most `MAX_TOKENS`).
fn hold_time(state: &State, body: &Value) -> std::time::Duration {
    const MAX_TOKENS: u64 = 4096;
    let tokens = body
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(16)
        .min(MAX_TOKENS);
    state.service_time + state.token_time * tokens as u32
}

#[cfg(test)]
mod tests {
    use super::super::test_server::{args, until, Server};
    use super::*;
    use crate::toy_server::ToyArgs;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn prompt_tokens_counts_words_in_strings_and_lists() {
        assert_eq!(prompt_tokens(Some(&json!("hello  there world"))), 3);
        assert_eq!(prompt_tokens(Some(&json!(["a b", "c", ["d e"]]))), 5);
        assert_eq!(prompt_tokens(Some(&json!(17))), 0);
        assert_eq!(prompt_tokens(None), 0);
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
        assert_eq!(v["error"], "toy-server: --fail-warmup");
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
