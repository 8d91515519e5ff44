//! A request as the replica gets it (hop-by-hop headers dropped, the router's own credentials
//! never passed on), and which failures leave a request safe to send to another replica. The
//! connections themselves are `pool`'s.

use std::error::Error as StdError;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus those the
/// router sets itself.
static HOP_BY_HOP: [HeaderName; 9] = [
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
    // Most messages have none, or only `Connection: keep-alive`: a look at their few names and
    // tokens costs less than removing each of ours, and allocates nothing.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.eq_ignore_ascii_case("keep-alive") && !n.eq_ignore_ascii_case("close"))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    for h in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(h);
    }
}

/// The client's headers as every replica gets them (made once per request, whatever the
/// retries). `strip_auth`: the client's `Authorization` was for the router (api_keys) and is not
/// passed on. `body_len`: the length of the body every replica gets.
pub fn headers(mut h: HeaderMap, strip_auth: bool, body_len: usize) -> HeaderMap {
    strip_hop_by_hop(&mut h);
    // The body was read whole: the replica gets it with its length, at once (the client's own
    // value where it is that length, as it is unless an alias renamed the model).
    let len = u64::try_from(body_len).unwrap_or(u64::MAX);
    let same = h.get_all(header::CONTENT_LENGTH).iter().count() == 1
        && h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            == Some(len);
    if !same {
        h.remove(header::CONTENT_LENGTH);
        if body_len > 0 {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
    }
    h.remove(header::EXPECT);
    h.remove(header::HOST);
    if strip_auth {
        h.remove(header::AUTHORIZATION);
    }
    h
}

/// The request to one replica: `uri` in origin form (`/path?query`), `host` the replica's
/// address, `headers` from `headers`.
pub fn request(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    host: HeaderValue,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri.clone();
    let h = req.headers_mut();
    *h = headers.clone();
    h.insert(header::HOST, host);
    req
}

/// `uri` in origin form (a client may send the absolute form, which is for proxies' eyes only).
pub fn origin_form(uri: &Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri.clone();
    }
    match uri.path_and_query() {
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    }
}

/// Whether a failure on the way to a replica, or while waiting for the first byte of its answer,
/// means the replica never served the request: it refused the connection, reset it, or closed
/// it. Such a request is safe to send elsewhere.
pub fn connection_failed(e: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(super::pool::SendError::Connect(_)) = err.downcast_ref() {
            return true;
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
        let host = HeaderValue::from_static("127.0.0.1:9");
        let uri = origin_form(&"http://front.example/v1/x?a=1".parse().unwrap());
        let prepared = headers(h, true, 2);
        let r = request(
            &Method::POST,
            &uri,
            &prepared,
            host.clone(),
            Bytes::from_static(b"{}"),
        );
        assert_eq!(r.uri().to_string(), "/v1/x?a=1");
        assert_eq!(r.method(), Method::POST);
        let h = r.headers();
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert_eq!(
            h[header::CONTENT_LENGTH],
            "2",
            "the body's length, not the client's"
        );
        assert_eq!(h[header::HOST], "127.0.0.1:9");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let mut h2 = HeaderMap::new();
        h2.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer replica-key"),
        );
        let r = request(
            &Method::GET,
            &Uri::from_static("/"),
            &headers(h2, false, 0),
            host,
            Bytes::new(),
        );
        assert_eq!(r.headers()[header::AUTHORIZATION], "Bearer replica-key");
        assert_eq!(r.uri().to_string(), "/");
        assert!(r.headers().get(header::CONTENT_LENGTH).is_none());
        let mut h3 = HeaderMap::new();
        h3.insert(header::CONTENT_LENGTH, HeaderValue::from_static("17"));
        h3.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Close"),
        );
        let h3 = headers(h3, false, 17);
        assert_eq!(h3[header::CONTENT_LENGTH], "17");
        assert!(h3.get(header::CONNECTION).is_none());
        assert_eq!(h3.len(), 1);
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
