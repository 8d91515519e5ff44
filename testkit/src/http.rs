//! HTTP/1.1 to replicas and servers on loopback, one request per connection, as a client or a
//! router would send it.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde_json::Value;

/// An answer: status, the header lines, the body.
#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl HttpReply {
    /// The first header called `name` (any case), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
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
    let mut s = TcpStream::connect_timeout(&sa, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no status in {head:?}")))?;
    Ok(HttpReply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
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
