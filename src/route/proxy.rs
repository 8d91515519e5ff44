//! One request's way through the router once its model is known: a slot from the model's queue,
//! the replica's answer, and at most one retry on another replica while nothing has reached the
//! client.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{self, HeaderMap};
use hyper::{Method, Response, StatusCode, Uri};

use super::body::Buffered;
use super::errors::{self, Failure};
use super::pool::{self, Conn};
use super::relay::{Relay, RouteBody};
use super::router::{Lease, Refused, Router};
use super::upstream;

/// Which replica answered, on every answer relayed.
const REPLICA_HEADER: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static("x-hearth-replica");

/// What one attempt at a replica gave.
enum Attempt {
    /// An answer, with its first frame when the body had one: committed to, unless its status
    /// calls for another replica.
    Answer(Box<Answer>),
    /// Refused, reset or closed before any byte of the answer's body: safe to send elsewhere.
    ConnectionFailed(String),
    /// Anything else (an answer that is not HTTP): not retried.
    Failed(String),
}

struct Answer {
    parts: hyper::http::response::Parts,
    first: Option<Frame<Bytes>>,
    rest: Option<Incoming>,
    /// The connection it came on, for the next request once the answer was read to its end.
    conn: Conn,
}

/// Whether a status says the replica could not take the request (its own proxy failed, or it is
/// loading or full), so another replica may.
fn unavailable(status: StatusCode) -> bool {
    status == StatusCode::BAD_GATEWAY || status == StatusCode::SERVICE_UNAVAILABLE
}

async fn attempt(
    addr: std::net::SocketAddr,
    req: hyper::Request<http_body_util::Full<Bytes>>,
) -> Attempt {
    let (resp, conn) = match pool::send(addr, req).await {
        Ok(r) => r,
        Err(e) if upstream::connection_failed(&e) => {
            return Attempt::ConnectionFailed(upstream::describe(&e))
        }
        Err(e) => return Attempt::Failed(upstream::describe(&e)),
    };
    let (parts, mut body) = resp.into_parts();
    if unavailable(parts.status) || body.is_end_stream() {
        return Attempt::Answer(Box::new(Answer {
            parts,
            first: None,
            rest: (!body.is_end_stream()).then_some(body),
            conn,
        }));
    }
    // Nothing goes to the client before the first frame: a replica that dies before it still
    // leaves the request free to go elsewhere.
    match body.frame().await {
        None => Attempt::Answer(Box::new(Answer {
            parts,
            first: None,
            rest: None,
            conn,
        })),
        Some(Ok(f)) => Attempt::Answer(Box::new(Answer {
            parts,
            first: Some(f),
            rest: (!body.is_end_stream()).then_some(body),
            conn,
        })),
        Some(Err(e)) if upstream::connection_failed(&e) => {
            Attempt::ConnectionFailed(upstream::describe(&e))
        }
        Some(Err(e)) => Attempt::Failed(upstream::describe(&e)),
    }
}

/// Sends the request to a replica of `model` and relays the answer. `uri`: what the replica is
/// asked for, in origin form.
pub async fn forward(
    router: &Arc<Router>,
    model: usize,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Buffered,
    arrived: Instant,
) -> Response<RouteBody> {
    let m = &router.settings.models[model];
    let timeout = router.settings.queue_timeout;
    let refused = |r: Refused, why: &str| -> Response<RouteBody> {
        let resp = match r {
            Refused::Full => errors::queue_full(
                &m.name,
                m.max_queue,
                m.target_wait.as_secs_f64().ceil() as u64,
            ),
            Refused::Timeout => errors::error(
                Failure::QueueTimeout,
                format!(
                    "no replica of model {:?} was free within {}{why}",
                    m.name,
                    crate::units::format_duration(timeout)
                ),
            ),
        };
        router.metrics.request(Some(model), resp.status().as_u16());
        resp
    };
    if router.refusing(model) {
        let resp = errors::drained(&m.name);
        router.metrics.request(Some(model), resp.status().as_u16());
        return resp;
    }
    // Counts the request as 499 if its client leaves (this future is dropped) before an answer
    // was made; every answer made here is counted with its status instead.
    let mut left = ClientLeft(Some((router.clone(), model)));
    let mut lease = match router.acquire(model, timeout).await {
        Ok(l) => l,
        Err(r) => {
            left.0 = None;
            return refused(r, "");
        }
    };
    router.metrics.queue_wait(
        model,
        lease.granted_at.duration_since(arrived).as_secs_f64(),
    );
    let headers = upstream::headers(
        headers,
        !router.settings.api_keys.is_empty(),
        body.bytes.len(),
    );
    let mut retried = false;
    loop {
        let req = upstream::request(
            &method,
            &uri,
            &headers,
            lease.grant.host.clone(),
            body.bytes.clone(),
        );
        let sent = Instant::now();
        let why = match attempt(lease.grant.addr, req).await {
            Attempt::Answer(a)
                if !(unavailable(a.parts.status)
                    && !retried
                    && router.has_other(model, lease.grant.replica)) =>
            {
                left.0 = None;
                return relay(router, model, lease, *a, arrived, sent);
            }
            Attempt::Answer(a) => format!("answered {}", a.parts.status),
            Attempt::ConnectionFailed(why) if !retried => why,
            Attempt::ConnectionFailed(why) | Attempt::Failed(why) => {
                lease.eject();
                left.0 = None;
                tracing::warn!(model = %m.name, replica = %lease.grant.id, "request failed: {why}");
                router.metrics.request(Some(model), 502);
                return errors::error(
                    Failure::Upstream,
                    format!(
                        "replica {} of model {:?} failed: {why}",
                        lease.grant.id, m.name
                    ),
                );
            }
        };
        // Nothing reached the client: once, another replica.
        tracing::info!(
            model = %m.name,
            replica = %lease.grant.id,
            "replica failed before answering ({why}); retrying on another"
        );
        lease.eject();
        router.metrics.retry(model);
        retried = true;
        let failed_id = lease.grant.id.clone();
        lease = match router.reacquire(lease, timeout).await {
            Ok(l) => l,
            Err(r) => {
                left.0 = None;
                return refused(
                    r,
                    &format!("; replica {failed_id} failed before answering: {why}"),
                );
            }
        };
    }
}

/// Armed while a request has no answer yet.
struct ClientLeft(Option<(Arc<Router>, usize)>);

impl Drop for ClientLeft {
    fn drop(&mut self) {
        if let Some((router, model)) = self.0.take() {
            router.metrics.request(Some(model), 499);
        }
    }
}

fn relay(
    router: &Arc<Router>,
    model: usize,
    lease: Lease,
    answer: Answer,
    arrived: Instant,
    sent: Instant,
) -> Response<RouteBody> {
    let Answer {
        mut parts,
        first,
        rest,
        conn,
    } = answer;
    upstream::strip_hop_by_hop(&mut parts.headers);
    // An error event can be appended only where the length is not fixed.
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
        && !parts.headers.contains_key(header::CONTENT_LENGTH);
    if let Some(v) = lease.grant.id_header.clone() {
        parts.headers.insert(REPLICA_HEADER, v);
    }
    let status = parts.status.as_u16();
    let body = Relay::new(
        router.clone(),
        model,
        status,
        first,
        rest,
        conn,
        lease,
        sse,
        arrived,
        sent,
    );
    Response::from_parts(parts, RouteBody::Relay(Box::new(body)))
}
