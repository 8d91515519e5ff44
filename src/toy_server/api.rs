//! The OpenAI endpoints of the toy server: completions and chat (whole, or streamed as
//! server-sent events), embeddings, and the model list. Every inference waits in the FIFO for a
//! slot and holds it for `--service-time`; a stream spreads its tokens over that time and holds
//! the slot until its last event (or until its client leaves). Errors are OpenAI-shaped.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{json_response, mark, ToyBody};
use super::openai::{self, Ask, EmbedAsk, Invalid, Kind};
use super::State;

/// Largest request body we accept; a toy has no use for more.
const MAX_BODY: usize = 1 << 20;
/// Events a stream may have written ahead of a slow client.
const STREAM_AHEAD: usize = 16;

/// An OpenAI error answer.
pub(super) fn failure(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response<ToyBody> {
    json_response(status, openai::error(message, kind, param, code))
}

fn bad_request(e: Invalid) -> Response<ToyBody> {
    failure(
        StatusCode::BAD_REQUEST,
        &e.message,
        "invalid_request_error",
        e.param,
        None,
    )
}

/// What every inference checks first: loaded, not failing on purpose, a JSON body (an empty one
/// is `null`).
async fn read_json(state: &State, req: Request<Incoming>) -> Result<Value, Response<ToyBody>> {
    if !*state.loaded.borrow() {
        return Err(failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is loading",
            "server_error",
            None,
            Some("model_loading"),
        ));
    }
    if let Some(why) = state.sleeper.refusal() {
        // As vLLM does while asleep: an error, with /health still 200.
        return Err(failure(
            StatusCode::SERVICE_UNAVAILABLE,
            why,
            "server_error",
            None,
            Some("model_sleeping"),
        ));
    }
    if state.fail_warmup {
        return Err(failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            "toy-server: --fail-warmup",
            "server_error",
            None,
            None,
        ));
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Err(failure(
                StatusCode::BAD_REQUEST,
                &format!("reading the body (at most {MAX_BODY} bytes): {e}"),
                "invalid_request_error",
                None,
                None,
            ))
        }
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            &format!("invalid JSON body: {e}"),
            "invalid_request_error",
            None,
            Some("invalid_json"),
        )
    })
}

/// Who answered (tests check it against the replica the address was routed for).
fn who(state: &State, resp: &mut Response<ToyBody>) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&state.pid.to_string()) {
        h.insert("x-toy-pid", v);
    }
    if let Ok(v) = HeaderValue::from_str(&state.replica) {
        h.insert("x-toy-replica", v);
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `POST /v1/completions` and `/v1/chat/completions`.
pub(super) async fn generate(
    state: Arc<State>,
    req: Request<Incoming>,
    kind: Kind,
) -> Response<ToyBody> {
    let body = match read_json(&state, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let ask = match Ask::parse(kind, &body, &state.model) {
        Ok(a) => a,
        Err(e) => return bad_request(e),
    };
    let n = state.responses.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let id = openai::response_id(prefix, state.pid, n, state.started_nanos);
    let slot = state.queue.enter().await;
    mark(&state);
    let mut resp = if ask.stream {
        let (tx, rx) = mpsc::channel(STREAM_AHEAD);
        let events = ask.events(&id, unix_now());
        // Tokens evenly over the service time; the slot is held until the last event.
        let pace = hold(&state, &ask) / u32::try_from(ask.max_tokens).unwrap_or(u32::MAX);
        let mut hung = state.hung.subscribe();
        tokio::spawn(async move {
            let mut slot = Some(slot);
            for (event, paced) in events {
                if paced {
                    tokio::select! {
                        biased;
                        _ = async { let _ = hung.wait_for(|h| *h).await; } => {
                            // Hung: no more events, the connection stays open.
                            drop(slot.take());
                            std::future::pending::<()>().await;
                        }
                        _ = tokio::time::sleep(pace) => {}
                    }
                }
                if tx.send(Bytes::from(event)).await.is_err() {
                    // The client left: the slot goes back unanswered.
                    return;
                }
            }
            if let Some(slot) = slot {
                slot.finish();
            }
        });
        let mut r = Response::new(Events(rx).boxed());
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        r.headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        r
    } else {
        tokio::time::sleep(hold(&state, &ask)).await;
        slot.finish();
        json_response(StatusCode::OK, ask.answer(&id, unix_now()))
    };
    who(&state, &mut resp);
    resp
}

/// How long a generation holds its slot: `--service-time`, plus `--token-time` per token asked
/// for, as a real server generates (a 4-token warm-up is then short beside long generations).
/// `max_tokens` is bounded by `Ask::parse`.
fn hold(state: &State, ask: &Ask) -> std::time::Duration {
    let tokens = u32::try_from(ask.max_tokens).unwrap_or(u32::MAX);
    state.service_time + state.token_time.saturating_mul(tokens)
}

/// `POST /v1/embeddings`: a deterministic unit vector per input.
pub(super) async fn embeddings(state: Arc<State>, req: Request<Incoming>) -> Response<ToyBody> {
    let body = match read_json(&state, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let ask = match EmbedAsk::parse(&body, &state.model) {
        Ok(a) => a,
        Err(e) => return bad_request(e),
    };
    let slot = state.queue.enter().await;
    mark(&state);
    tokio::time::sleep(state.service_time).await;
    slot.finish();
    let mut resp = json_response(StatusCode::OK, ask.answer());
    who(&state, &mut resp);
    resp
}

fn model_entry(state: &State) -> Value {
    json!({
        "id": state.model,
        "object": "model",
        "created": state.started_unix,
        "owned_by": "hearth-toy-server",
    })
}

/// `GET /v1/models`: the one model this server serves.
pub(super) fn models(state: &State) -> Response<ToyBody> {
    json_response(
        StatusCode::OK,
        json!({"object": "list", "data": [model_entry(state)]}),
    )
}

/// `GET /v1/models/{id}`.
pub(super) fn model(state: &State, id: &str) -> Response<ToyBody> {
    if id == state.model {
        return json_response(StatusCode::OK, model_entry(state));
    }
    failure(
        StatusCode::NOT_FOUND,
        &format!("the model {id:?} does not exist"),
        "invalid_request_error",
        Some("model"),
        Some("model_not_found"),
    )
}

/// A stream's events as a response body.
struct Events(mpsc::Receiver<Bytes>);

impl Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|e| e.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_server::{args, until, Server};
    use crate::toy_server::ToyArgs;
    use serde_json::Value;
    use std::time::{Duration, Instant};

    async fn post(s: &Server, path: &str, body: Value) -> reqwest::Response {
        s.http
            .post(format!("{}{path}", s.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_stream_spreads_its_tokens_over_the_service_time_and_ends_with_done() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_millis(800),
                ..args()
            },
            None,
        )
        .await;
        let started = Instant::now();
        let mut r = post(
            &s,
            "/v1/chat/completions",
            serde_json::json!({"model": "m", "max_tokens": 4, "stream": true,
                               "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let mut text = String::new();
        let mut first_at = None;
        while let Some(c) = r.chunk().await.unwrap() {
            first_at.get_or_insert_with(|| started.elapsed());
            text.push_str(std::str::from_utf8(&c).unwrap());
        }
        let done_at = started.elapsed();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(text.matches("data: ").count(), 1 + 4 + 1 + 1, "{text}");
        // The role chunk goes at once; the tokens over the 800 ms.
        assert!(
            first_at.unwrap() < Duration::from_millis(400),
            "{first_at:?}"
        );
        assert!(done_at >= Duration::from_millis(800), "{done_at:?}");
        assert_eq!(s.arrived_and_completed().await, (1.0, 1.0));
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_client_that_leaves_mid_stream_gives_the_slot_back() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_secs(20),
                ..args()
            },
            None,
        )
        .await;
        let mut r = post(
            &s,
            "/v1/completions",
            serde_json::json!({"prompt": "x", "max_tokens": 4, "stream": true}),
        )
        .await;
        assert_eq!(r.status(), 200);
        r.chunk().await.unwrap();
        assert_eq!(s.metrics().await["toy_requests_running"], 1.0);
        drop(r);
        until("the slot to come back", Duration::from_secs(5), || async {
            (s.metrics().await["toy_requests_running"] == 0.0).then_some(())
        })
        .await;
        assert_eq!(s.arrived_and_completed().await, (1.0, 0.0));
    }

    #[tokio::test]
    async fn embeddings_models_and_errors_speak_openai() {
        let s = Server::start(
            ToyArgs {
                service_time: Duration::from_millis(10),
                model: Some("toy-model".into()),
                ..args()
            },
            None,
        )
        .await;
        let r = post(
            &s,
            "/v1/embeddings",
            serde_json::json!({"input": ["a", "b"]}),
        )
        .await;
        assert_eq!(r.status(), 200);
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 2, "{v}");
        assert_eq!(v["model"], "toy-model");
        let (status, body) = s.get("/v1/models").await.unwrap();
        assert_eq!(status, 200);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"][0]["id"], "toy-model", "{v}");
        let (status, body) = s.get("/v1/models/toy-model").await.unwrap();
        assert_eq!(status, 200, "{body}");
        let (status, body) = s.get("/v1/models/other").await.unwrap();
        assert_eq!(status, 404);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found", "{v}");
        let r = post(
            &s,
            "/v1/chat/completions",
            serde_json::json!({"max_tokens": 2}),
        )
        .await;
        assert_eq!(r.status(), 400);
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!(v["error"]["param"], "messages", "{v}");
        let r = s
            .http
            .get(format!("{}/v1/embeddings", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405);
        s.stop().await.unwrap();
    }
}
