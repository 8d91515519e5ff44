//! Legitimate requests through the front door while others try to starve it (issue 24, item 14),
//! against the real daemon and router (release build) with two toy replicas (4 slots each,
//! 50 ms a request) and `[route] max_body = "1MiB"`, `max_buffered = "4MiB"`, the rest at their
//! defaults (`max_connections` 4096).
//!
//! Legitimate load: `--clients` (default 8) clients on 127.0.0.1, each sending completions one
//! after the other, each on a new connection. Phases of `--seconds` (default 20 with `--bench`;
//! 2 without, a smoke run) each, in one run:
//!
//! 1. unattacked;
//! 2. 10,000 idle connections from 127.0.0.2: TCP connects that never send a byte, each opened
//!    again as soon as the router closes it;
//! 3. four stalled uploads from 127.0.0.3: each declares 1 MiB, sends all but its last byte and
//!    stalls, opened again as soon as it is answered or closed;
//! 4. both attacks at once;
//! 5. unattacked again (how much the machine drifted over the run).
//!
//! Printed per phase: requests, refused (any answer but 200, or none), p50 / p99 / max latency,
//! and p99 ÷ the first phase's p99. The goal: 0 refused and p99 ≤ 2× unattacked under every
//! attack. Run: `cargo bench --bench route_starve` (`-- --seconds S --clients N --idle N`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::route::*;
use testkit::{bench_arg, bench_full, machine_load, percentile};

const BODY: &str = r#"{"model":"s","prompt":"Hello there","max_tokens":4}"#;

/// One completion on a new connection: its latency, or None when refused or failed.
fn one(addr: SocketAddr) -> Option<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(30)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).ok()?;
    answer.starts_with(b"HTTP/1.1 200").then(|| t.elapsed())
}

/// The legitimate clients for `length`: (latencies in ms, sorted; refused).
fn legitimate(addr: SocketAddr, clients: usize, length: Duration) -> (Vec<f64>, u64) {
    let end = Instant::now() + length;
    let refused = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let refused = refused.clone();
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                while Instant::now() < end {
                    match one(addr) {
                        Some(d) => lat.push(d.as_secs_f64() * 1000.0),
                        None => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    lat.sort_by(f64::total_cmp);
    (lat, refused.load(Ordering::Relaxed))
}

/// A connection from `src` to `addr` on the attackers' runtime.
async fn connect(src: Ipv4Addr, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let s = tokio::net::TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((src, 0)))?;
    s.connect(addr).await
}

/// `n` connections from 127.0.0.2 that never send a byte, each opened again once closed.
fn idle_attack(rt: &tokio::runtime::Runtime, addr: SocketAddr, n: usize, stop: Arc<AtomicBool>) {
    for _ in 0..n {
        let stop = stop.clone();
        rt.spawn(async move {
            use tokio::io::AsyncReadExt;
            while !stop.load(Ordering::Relaxed) {
                match connect(Ipv4Addr::new(127, 0, 0, 2), addr).await {
                    Ok(mut s) => {
                        let mut b = [0u8; 64];
                        tokio::select! {
                            _ = s.read(&mut b) => {}
                            _ = wait_for(&stop) => return,
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        });
    }
}

/// Four uploads from 127.0.0.3 declaring 1 MiB and stalling one byte short, each opened again
/// once answered or closed.
fn upload_attack(rt: &tokio::runtime::Runtime, addr: SocketAddr, stop: Arc<AtomicBool>) {
    for _ in 0..4 {
        let stop = stop.clone();
        rt.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let len = 1 << 20;
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: {len}\r\n\r\n"
            );
            let body = vec![b' '; len - 1];
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = connect(Ipv4Addr::new(127, 0, 0, 3), addr).await else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&body).await.is_err()
                {
                    continue;
                }
                let mut b = [0u8; 256];
                tokio::select! {
                    _ = s.read(&mut b) => {}
                    _ = wait_for(&stop) => return,
                }
            }
        });
    }
}

async fn wait_for(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn main() {
    let full = bench_full();
    let seconds: u64 = bench_arg("--seconds").unwrap_or(if full { 20 } else { 2 });
    let clients: usize = bench_arg("--clients").unwrap_or(8);
    let idle: usize = bench_arg("--idle").unwrap_or(10_000);
    let length = Duration::from_secs(seconds);
    let m = Model::front_toy("s", &["--concurrency", "4", "--service-time", "50ms"])
        .slots(4)
        .scale(2, 2, 0);
    let (daemon, router, addr) = front_door([m], "max_body = \"1MiB\"\nmax_buffered = \"4MiB\"\n");
    daemon.wait_routed("s", 2, Duration::from_secs(60));
    wait_until("the router routing both", Duration::from_secs(30), || {
        (router.metric("hearth_route_routed_replicas{model=\"s\"}")? == 2.0).then_some(())
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "front door under starvation attacks: {clients} clients, a new connection per request, \
         {seconds} s a phase; {}",
        machine_load()
    );
    // Warm-up, not counted.
    legitimate(addr, clients, Duration::from_secs(2));
    println!(
        "{:<34} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8}",
        "phase", "requests", "refused", "p50 ms", "p99 ms", "max ms", "p99 ×"
    );
    let mut base_p99 = None;
    let phases: [(&str, bool, bool); 5] = [
        ("unattacked", false, false),
        ("idle connects", true, false),
        ("stalled 1 MiB uploads", false, true),
        ("both attacks", true, true),
        ("unattacked again", false, false),
    ];
    for (name, idle_on, uploads_on) in phases {
        let stop = Arc::new(AtomicBool::new(false));
        if idle_on {
            idle_attack(&rt, addr, idle, stop.clone());
        }
        if uploads_on {
            upload_attack(&rt, addr, stop.clone());
        }
        if idle_on || uploads_on {
            // Let the attack reach its strength before measuring.
            std::thread::sleep(Duration::from_secs(2));
        }
        let (lat, refused) = legitimate(addr, clients, length);
        stop.store(true, Ordering::Relaxed);
        let p99 = percentile(&lat, 99.0);
        let base = *base_p99.get_or_insert(p99);
        let label = match (idle_on, uploads_on) {
            (true, _) => format!("{name} ({idle})"),
            _ => name.to_string(),
        };
        println!(
            "{label:<34} {:>8} {refused:>8} {:>9.1} {p99:>9.1} {:>9.1} {:>8.2}",
            lat.len(),
            percentile(&lat, 50.0),
            lat.last().copied().unwrap_or(f64::NAN),
            p99 / base
        );
        // The attackers' connections close before the next phase.
        std::thread::sleep(Duration::from_secs(1));
    }
    rt.shutdown_timeout(Duration::from_secs(5));
    drop(router);
}
