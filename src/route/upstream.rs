//! The router's side of a replica connection: a pooled HTTP/1 client, the request as the replica
//! gets it (hop-by-hop headers dropped, the router's own credentials never passed on), and which
//! failures leave a request safe to send to another replica.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// A replica that does not accept a connection in this time is failing, not busy (the router
/// never sends it more than its slots).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections to a replica are kept this long for the next request.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// Largest response head a replica may send.
const MAX_RESPONSE_HEAD: usize = 256 * 1024;

thread_local! {
    /// Each of the router's threads has its own pool of replica connections, used only by the
    /// connections that thread serves: no lock or hand-off between threads on the way.
    static CLIENT: UpstreamClient = client();
}

/// Sends a request to a replica on this thread's connection pool.
pub fn send(req: Request<Full<Bytes>>) -> hyper_util::client::legacy::ResponseFuture {
    CLIENT.with(|c| c.request(req))
}

fn client() -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http1_max_buf_size(MAX_RESPONSE_HEAD)
        // A pooled connection the replica closed before the request went out is retried on a
        // fresh one by the client itself: nothing was sent.
        .retry_canceled_requests(true)
        .build(connector)
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus those the
/// router sets itself.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for h in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(h);
    }
}

/// The request as the replica gets it. `strip_auth`: the client's `Authorization` was for the
/// router (api_keys) and is not passed on.
pub fn request(
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    addr: SocketAddr,
    body: Bytes,
    strip_auth: bool,
) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
    let mut h = headers.clone();
    strip_hop_by_hop(&mut h);
    // The body was read whole: the replica gets it with its length, at once.
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::EXPECT);
    h.remove(header::HOST);
    if strip_auth {
        h.remove(header::AUTHORIZATION);
    }
    if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
        h.insert(header::HOST, v);
    }
    let mut req = Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}{path_and_query}"))
        .body(Full::new(body))?;
    *req.headers_mut() = h;
    Ok(req)
}

/// Whether a failure on the way to a replica, or while waiting for the first byte of its answer,
/// means the replica never served the request: it refused the connection, reset it, or closed
/// it. Such a request is safe to send elsewhere.
pub fn connection_failed(e: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(c) = err.downcast_ref::<hyper_util::client::legacy::Error>() {
            if c.is_connect() {
                return true;
            }
        }
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return true;
            }
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | BrokenPipe
                    | UnexpectedEof
            ) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// The first line of an error and its causes, for messages.
pub fn describe(e: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(err) = cur {
        let s = err.to_string();
        if !parts.contains(&s) {
            parts.push(s);
        }
        cur = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_router_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::HOST, HeaderValue::from_static("front.example"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let r = request(
            &Method::POST,
            "/v1/x?a=1",
            &h,
            addr,
            Bytes::from_static(b"{}"),
            true,
        )
        .unwrap();
        assert_eq!(r.uri().to_string(), "http://127.0.0.1:9/v1/x?a=1");
        let h = r.headers();
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert!(h.get(header::CONTENT_LENGTH).is_none());
        assert_eq!(h[header::HOST], "127.0.0.1:9");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let mut h2 = HeaderMap::new();
        h2.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer replica-key"),
        );
        let r = request(&Method::GET, "/", &h2, addr, Bytes::new(), false).unwrap();
        assert_eq!(r.headers()[header::AUTHORIZATION], "Bearer replica-key");
    }

    #[test]
    fn refused_and_reset_connections_are_safe_to_retry_and_others_not() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(connection_failed(&refused));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(connection_failed(&reset));
        let other = std::io::Error::other("bad response");
        assert!(!connection_failed(&other));
    }
}
