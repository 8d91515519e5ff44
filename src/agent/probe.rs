//! Runs one probe attempt (warm-up, recheck, liveness) over HTTP and says how it went.

use std::time::Duration;

use reqwest::{Client, Method};

use crate::core::{ProbeOutcome, ProbeSpec};

/// Longest piece of an answer quoted back in a failure.
const QUOTE: usize = 200;

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
    let body = match resp.text().await {
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
    if status != spec.expect_status {
        return ProbeOutcome {
            ok: false,
            // 503 is how servers say they are still loading.
            not_ready: status == 503,
            detail: format!(
                "HTTP {status} (expected {}): {}",
                spec.expect_status,
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
