//! HTTP/1.1 to replicas and servers on loopback, one request per connection, as a client or a
//! router would send it: the shapes tests ask for most, over the one client of
//! `crate::route` (route/http.rs).

use std::io;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::route::{send, Resp};

/// An answer: status, the header lines, the body as text.
#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    /// The first header called `name` (any case), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl From<Resp> for HttpReply {
    fn from(r: Resp) -> Self {
        HttpReply {
            status: r.status,
            body: String::from_utf8_lossy(&r.body).into_owned(),
            headers: r.headers,
        }
    }
}

/// One request on a fresh connection (`Connection: close`), each read and write bounded by
/// `timeout`. A body is sent as JSON.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<HttpReply> {
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("no address for {addr}")))?;
    let headers: &[(&str, &str)] = match body {
        Some(_) => &[("Content-Type", "application/json")],
        None => &[],
    };
    let body = body.unwrap_or("").as_bytes();
    Ok(send(sa, method, path, headers, body, timeout)?
        .whole()?
        .into())
}

/// A completion request like a client's, to a toy server (or any OpenAI-shaped server).
pub fn complete(addr: &str, timeout: Duration) -> io::Result<HttpReply> {
    http(
        addr,
        "POST",
        "/v1/completions",
        Some(r#"{"model":"toy","prompt":"Hello there","max_tokens":4}"#),
        timeout,
    )
}

/// One non-streamed completion of `n_predict` tokens from llama.cpp's server (`/completion`,
/// end-of-sequence ignored): (HTTP status, tokens predicted, body).
pub fn llama_complete(addr: &str, n_predict: u32) -> io::Result<(u16, u64, String)> {
    let body = format!(r#"{{"prompt":"hello","n_predict":{n_predict},"ignore_eos":true}}"#);
    let r = http(
        addr,
        "POST",
        "/completion",
        Some(&body),
        Duration::from_secs(120),
    )?;
    let tokens = serde_json::from_str::<Value>(&r.body)
        .ok()
        .and_then(|v| v["tokens_predicted"].as_u64())
        .unwrap_or(0);
    Ok((r.status, tokens, r.body))
}

/// How many tokens (at most `max`, at least 32) one llama.cpp request must generate to hold a
/// slot about `hold` on this machine now, measured with an unloaded request of `max` tokens (a
/// token costs more as the context fills, so a short probe would overstate the speed).
pub fn tokens_for(addr: &str, hold: Duration, max: u32) -> u32 {
    let started = Instant::now();
    let (status, tokens, body) = llama_complete(addr, max).expect("the probe request");
    assert_eq!(status, 200, "{body}");
    let per_token = started.elapsed().as_secs_f64() / tokens.max(1) as f64;
    ((hold.as_secs_f64() / per_token) as u32).clamp(32, max)
}
