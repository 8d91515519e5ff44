//! The router's own answers: OpenAI-shaped errors `{"error":{"message","type","code"}}`, and
//! small JSON or text bodies.

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::relay::RouteBody;

/// Why the router answered instead of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    BadJson,
    /// A request that cannot be passed on as it is.
    BadRequest,
    Unauthorized,
    NotFound,
    UnknownModel,
    MethodNotAllowed,
    TooLarge,
    BodyTimeout,
    QueueFull,
    QueueTimeout,
    /// The router holds as much request data as it may.
    Busy,
    /// This client address holds as much request data as one address may.
    ClientBusy,
    /// A replica could not be reached, or failed, and no other could take the request.
    Upstream,
    /// The model is drained here (an operator's drain, or a stop) and its balancers were told:
    /// another host takes it (`retry-on 503`).
    Drained,
}

impl Failure {
    pub fn status(self) -> StatusCode {
        match self {
            Failure::BadJson | Failure::BadRequest => StatusCode::BAD_REQUEST,
            Failure::Unauthorized => StatusCode::UNAUTHORIZED,
            Failure::NotFound | Failure::UnknownModel => StatusCode::NOT_FOUND,
            Failure::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Failure::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Failure::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Failure::QueueFull | Failure::ClientBusy => StatusCode::TOO_MANY_REQUESTS,
            Failure::QueueTimeout | Failure::Busy | Failure::Drained => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Failure::Upstream => StatusCode::BAD_GATEWAY,
        }
    }

    fn kind(self) -> (&'static str, &'static str) {
        match self {
            Failure::BadJson => ("invalid_request_error", "invalid_json"),
            Failure::BadRequest => ("invalid_request_error", "invalid_request"),
            Failure::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            Failure::NotFound => ("invalid_request_error", "not_found"),
            Failure::UnknownModel => ("invalid_request_error", "model_not_found"),
            Failure::MethodNotAllowed => ("invalid_request_error", "method_not_allowed"),
            Failure::TooLarge => ("invalid_request_error", "request_too_large"),
            Failure::BodyTimeout => ("invalid_request_error", "request_timeout"),
            Failure::QueueFull => ("rate_limit_error", "queue_full"),
            Failure::QueueTimeout => ("server_error", "queue_timeout"),
            Failure::Busy => ("server_error", "overloaded"),
            Failure::ClientBusy => ("rate_limit_error", "client_overloaded"),
            Failure::Upstream => ("server_error", "upstream_failed"),
            Failure::Drained => ("server_error", "drained"),
        }
    }
}

/// An OpenAI-style error answer.
pub fn error(f: Failure, message: impl Into<String>) -> Response<RouteBody> {
    let (kind, code) = f.kind();
    let body = json!({"error": {"message": message.into(), "type": kind, "code": code}});
    let mut r = json_response(f.status(), &body);
    if f == Failure::Unauthorized {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// 429 with `Retry-After` (whole seconds, at least 1).
pub fn queue_full(model: &str, max_queue: usize, retry_after_secs: u64) -> Response<RouteBody> {
    let mut r = error(
        Failure::QueueFull,
        format!("the queue for model {model:?} is full ({max_queue} waiting); retry later"),
    );
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_secs.max(1)),
    );
    r
}

/// 503 for a model drained here, with `Retry-After: 1`: a balancer sends it elsewhere.
pub fn drained(model: &str) -> Response<RouteBody> {
    let mut r = error(
        Failure::Drained,
        format!("model {model:?} is drained on this host; another host serves it"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// 429 for a client address over its share of request bodies, with `Retry-After: 1` (its own
/// uploads, once done, make room).
pub fn client_overloaded(message: String) -> Response<RouteBody> {
    let mut r = error(Failure::ClientBusy, message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

pub fn json_response(status: StatusCode, body: &Value) -> Response<RouteBody> {
    let mut r = Response::new(RouteBody::full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub fn text_response(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<RouteBody> {
    let mut r = Response::new(RouteBody::full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Bearer-token check. Every key is compared in full whatever the input, so the time taken says
/// nothing about how much of a key matched.
pub fn authorized(keys: &[String], header: Option<&HeaderValue>) -> bool {
    if keys.is_empty() {
        return true;
    }
    let Some(token) = header
        .and_then(|h| h.to_str().ok())
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(str::trim)
    else {
        return false;
    };
    let mut ok = false;
    for k in keys {
        ok |= constant_time_eq(k.as_bytes(), token.as_bytes());
    }
    ok
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_match_whole_keys_only() {
        let keys = vec![
            "0123456789abcdef".to_string(),
            "fedcba9876543210".to_string(),
        ];
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert!(authorized(&keys, Some(&h("Bearer 0123456789abcdef"))));
        assert!(authorized(&keys, Some(&h("Bearer fedcba9876543210"))));
        assert!(!authorized(&keys, Some(&h("Bearer 0123456789abcde"))));
        assert!(!authorized(&keys, Some(&h("Bearer 0123456789abcdef0"))));
        assert!(!authorized(&keys, Some(&h("Basic 0123456789abcdef"))));
        assert!(!authorized(&keys, Some(&h("Bearer "))));
        assert!(!authorized(&keys, None));
        assert!(authorized(&[], None), "no keys: no authentication");
    }

    #[test]
    fn errors_are_openai_shaped() {
        let r = queue_full("m", 3, 0);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = error(Failure::UnknownModel, "no");
        assert_eq!(r.status(), 404);
    }
}
