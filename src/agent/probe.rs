//! Runs one probe attempt (warm-up, recheck, liveness) over HTTP and says how it went.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method};

use super::containment::Containment;
use crate::core::{ProbeOutcome, ProbeSpec, ReplicaId};

/// Longest piece of an answer quoted back in a failure.
const QUOTE: usize = 200;
/// The most of an answer that is read (and searched for `expect_body`): an answer is from
/// outside, and a server that streams without end must not hold a probe or its memory.
const MAX_ANSWER: usize = 1 << 20;

pub fn client() -> Client {
    Client::builder()
        // Probes go to loopback replicas: never through a proxy from the environment.
        .no_proxy()
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client with no TLS and no proxy builds")
}

pub async fn run(client: &Client, spec: &ProbeSpec) -> ProbeOutcome {
    let method = Method::from_bytes(spec.method.as_bytes()).unwrap_or(Method::POST);
    let mut req = client.request(method, &spec.url).timeout(spec.timeout);
    for (k, v) in &spec.headers {
        req = req.header(k, v);
    }
    if let Some(body) = &spec.body {
        req = req.body(body.clone());
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            let what = if e.is_timeout() {
                format!("no answer within {:?}", spec.timeout)
            } else if e.is_connect() {
                "connection refused (not listening yet?)".to_string()
            } else {
                format!("request failed: {}", root_cause(&e))
            };
            return ProbeOutcome {
                ok: false,
                not_ready: true,
                detail: what,
            };
        }
    };
    let status = resp.status().as_u16();
    let body = match bounded_text(resp, MAX_ANSWER).await {
        Ok(b) => b,
        Err(e) => {
            let detail = format!("HTTP {status}, body unreadable: {}", root_cause(&e));
            return ProbeOutcome {
                ok: false,
                not_ready: true,
                detail,
            };
        }
    };
    let status_ok = if spec.accept_2xx {
        (200..300).contains(&status)
    } else {
        status == spec.expect_status
    };
    if !status_ok {
        return ProbeOutcome {
            ok: false,
            // 503 is how servers say they are still loading.
            not_ready: status == 503,
            detail: format!(
                "HTTP {status} (expected {}): {}",
                if spec.accept_2xx {
                    "2xx".to_string()
                } else {
                    spec.expect_status.to_string()
                },
                quote(&body)
            ),
        };
    }
    if let Some(want) = &spec.expect_body {
        if !body.contains(want.as_str()) {
            return ProbeOutcome {
                ok: false,
                not_ready: false,
                detail: format!(
                    "HTTP {status} but the answer lacks {want:?}: {}",
                    quote(&body)
                ),
            };
        }
    }
    ProbeOutcome {
        ok: true,
        not_ready: false,
        detail: format!("HTTP {status}"),
    }
}

/// A passing answer counts only if the process listening on the URL's port is the replica's
/// (its cgroup, or its process group): an orphan of an earlier run or any other squatter that
/// answers in its place fails, and the detail names it. URLs to another host are not checked.
pub async fn verify_owner(
    containment: Arc<Containment>,
    replica: &ReplicaId,
    spec: &ProbeSpec,
    passed: ProbeOutcome,
) -> ProbeOutcome {
    let Some(port) = local_port(&spec.url) else {
        return passed;
    };
    let r = replica.clone();
    let checked = tokio::task::spawn_blocking(move || containment.verify_listener(&r, port)).await;
    match checked {
        Ok(Ok(())) => passed,
        Ok(Err(why)) => ProbeOutcome {
            ok: false,
            // Not "still loading": retried at the slower pace of a wrong answer.
            not_ready: false,
            detail: why.to_string(),
        },
        Err(e) => ProbeOutcome {
            ok: false,
            not_ready: false,
            detail: format!("checking who listens on port {port}: {e}"),
        },
    }
}

/// The port of a URL whose host is this machine's loopback or wildcard address.
fn local_port(url: &str) -> Option<u16> {
    let u = reqwest::Url::parse(url).ok()?;
    let host = u.host_str()?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let local = match bare.parse::<std::net::IpAddr>() {
        Ok(a) => a.is_loopback() || a.is_unspecified(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    };
    local.then(|| u.port_or_known_default()).flatten()
}

/// The answer's first `limit` bytes, as text (a character cut at the limit is replaced).
async fn bounded_text(mut resp: reqwest::Response, limit: usize) -> reqwest::Result<String> {
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < limit {
        let Some(chunk) = resp.chunk().await? else {
            break;
        };
        let take = chunk.len().min(limit - buf.len());
        buf.extend_from_slice(chunk.get(..take).unwrap_or_default());
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn quote(body: &str) -> String {
    let one_line: String = body
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match one_line.char_indices().nth(QUOTE) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_urls_to_this_machine_are_checked() {
        assert_eq!(
            local_port("http://127.0.0.1:21000/v1/completions"),
            Some(21000)
        );
        assert_eq!(local_port("http://localhost:8/x"), Some(8));
        assert_eq!(local_port("http://[::1]:9/x"), Some(9));
        assert_eq!(local_port("http://0.0.0.0/x"), Some(80));
        assert_eq!(local_port("http://10.0.0.5:9/x"), None);
        assert_eq!(local_port("http://example.com:9/x"), None);
        assert_eq!(local_port("not a url"), None);
    }
}
