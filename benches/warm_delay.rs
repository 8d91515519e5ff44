//! Warm-detection delay: how long after a replica becomes able to answer its warm-up does hearth
//! show it warm?
//!
//! Starts the real daemon (release build) with 20 toy-server replicas whose load times are
//! staggered from 1.0 s to 2.9 s. For each replica, this program itself polls
//! `POST /v1/completions` every few milliseconds on a keep-alive connection and records the
//! moment the first successful answer's request was sent (the replica could answer then); a watch
//! connection records when the `replica … warm` event arrives. The difference, per replica, is
//! the delay; p50 / p99 / max are printed against the goal (≤ 100 ms).
//!
//! Run: `cargo bench --bench warm_delay` (WARM_DELAY_ROUNDS=N for N daemons in a row). Without
//! cargo bench's `--bench` argument (`cargo test --all-targets`), it is a quick smoke run with 4
//! replicas.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::*;

/// Replicas per round (with `--bench`; a smoke run has 4).
const REPLICAS: u32 = 20;
const GOAL: Duration = Duration::from_millis(100);
/// Time between two polls of one replica.
const POLL_EVERY: Duration = Duration::from_millis(3);

/// A keep-alive HTTP/1.1 connection to one replica.
struct Poller {
    addr: String,
    conn: Option<(BufReader<TcpStream>, TcpStream)>,
}

impl Poller {
    /// One completion attempt; Ok(true) on 200.
    fn attempt(&mut self) -> io::Result<bool> {
        if self.conn.is_none() {
            let s = TcpStream::connect(&self.addr)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            self.conn = Some((BufReader::new(s.try_clone()?), s));
        }
        let (reader, writer) = self.conn.as_mut().unwrap();
        let body = r#"{"model":"w","prompt":"Hello","max_tokens":4}"#;
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let r = (|| {
            writer.write_all(req.as_bytes())?;
            let mut status_line = String::new();
            if reader.read_line(&mut status_line)? == 0 {
                return Err(io::Error::other("closed"));
            }
            let status: u16 = status_line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| io::Error::other("bad status line"))?;
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                reader.read_line(&mut h)?;
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; len];
            reader.read_exact(&mut body)?;
            Ok(status == 200 && String::from_utf8_lossy(&body).contains("choices"))
        })();
        if r.is_err() {
            self.conn = None;
        }
        r
    }
}

/// One daemon with `n` replicas; returns (replica, load time ms, delay ms) for each.
fn round(n: u32) -> Vec<(String, u64, f64)> {
    // Replica N loads for 1000 + 100·(N−1) ms: 1.0 s … 2.9 s, one model, min = max = n.
    let script = format!(
        "n=${{HEARTH_REPLICA##*-}}; exec '{}' toy-server --port {{port}} --service-time 0s \
         --concurrency 4 --load-time $((1000 + (n - 1) * 100))ms",
        hearth().display()
    );
    let m = Model::toy("w", &[])
        .scale(n, n, 0)
        .command(&["/bin/sh", "-c", &script]);
    let d = Daemon::builder().ports(n as u16 + 4).model(m).start();
    let w = d.watch(Some("w"));

    // Poll every port of the daemon's range: the replicas take ports from it.
    let stop = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (d.ports.0..=d.ports.1)
        .map(|port| {
            let stop = stop.clone();
            std::thread::spawn(move || -> (u16, Option<Instant>) {
                let mut p = Poller {
                    addr: format!("127.0.0.1:{port}"),
                    conn: None,
                };
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    if let Ok(true) = p.attempt() {
                        return (port, Some(sent));
                    }
                    std::thread::sleep(POLL_EVERY);
                }
                (port, None)
            })
        })
        .collect();

    let warm_events = wait_until(
        "every replica's warm event",
        Duration::from_secs(60),
        || {
            let warm: BTreeMap<String, Instant> = w
                .events()
                .into_iter()
                .filter(|e| e.v["event"] == "replica" && e.v["state"] == "warm")
                .map(|e| (e.v["replica"].as_str().unwrap().to_string(), e.at))
                .collect();
            (warm.len() as u32 >= n).then_some(warm)
        },
    );
    let ports: BTreeMap<u16, String> = d
        .replicas("w")
        .iter()
        .map(|r| {
            (
                r["port"].as_u64().unwrap() as u16,
                r["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    let mut out = Vec::new();
    for p in pollers {
        let (port, able) = p.join().unwrap();
        let (Some(able), Some(id)) = (able, ports.get(&port)) else {
            continue;
        };
        let Some(warm) = warm_events.get(id) else {
            continue;
        };
        let delay_ms = if *warm >= able {
            warm.duration_since(able).as_secs_f64() * 1000.0
        } else {
            -(able.duration_since(*warm).as_secs_f64() * 1000.0)
        };
        let n: u64 = id.rsplit('-').next().unwrap().parse().unwrap();
        out.push((id.clone(), 1000 + (n - 1) * 100, delay_ms));
    }
    assert_eq!(
        out.len() as u32,
        n,
        "measured {} of {n} replicas: {out:?}",
        out.len()
    );
    drop(w);
    drop(d);
    out
}

fn main() {
    let rounds: usize = std::env::var("WARM_DELAY_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let n = if bench_full() { REPLICAS } else { 4 };
    println!(
        "warm_delay: {n} toy replicas, load times 1.0–{:.1} s, polled every {} ms; binary {}",
        1.0 + 0.1 * (n - 1) as f64,
        POLL_EVERY.as_millis(),
        hearth().display()
    );
    let mut all = Vec::new();
    for r in 0..rounds {
        let mut res = round(n);
        res.sort_by_key(|(id, _, _)| id.rsplit('-').next().unwrap().parse::<u64>().unwrap());
        println!("round {}:", r + 1);
        println!("  {:<8} {:>9} {:>14}", "REPLICA", "LOAD ms", "ABLE→WARM ms");
        for (id, load, d) in &res {
            println!("  {id:<8} {load:>9} {d:>14.1}");
        }
        all.extend(res.into_iter().map(|(_, _, d)| d));
    }
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (p50, p99, max) = (
        percentile(&all, 50.0),
        percentile(&all, 99.0),
        *all.last().unwrap(),
    );
    println!(
        "able→warm over {} replicas: p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms \
         (goal ≤ {} ms: {})",
        all.len(),
        GOAL.as_millis(),
        if max <= GOAL.as_millis() as f64 {
            "met"
        } else {
            "NOT met"
        }
    );
}
