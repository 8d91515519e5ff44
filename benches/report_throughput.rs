//! Report throughput: how many queue reports per second the daemon acknowledges, and how long
//! each acknowledgement takes, with many reporting clients at once (goal: ≥ 100,000 reports/s,
//! p99 ≤ 1 ms).
//!
//! The daemon (release build) runs one toy-server model with 2 routed replicas (which report
//! every 200 ms themselves). 256 clients, each on its own socket connection, send reports (half
//! model-wide, half for one of the routed replicas; this program's uid is root or the daemon's,
//! the admin role) for ~10 s each run:
//! - `1 outstanding`: each client writes one report and waits for its answer before the next;
//! - `N outstanding` (pipelined, `--depth N`, default 8): each client keeps N reports in flight
//!   and writes one more for each answer (the protocol answers in order);
//! - `paced` (`--paced R`, default 25,600/s in all, 100/s per client): each client writes one
//!   report every clients/R seconds (phases spread evenly), or at once after a late answer —
//!   the answer latency at a rate the daemon can sustain.
//!
//! The first two saturate the daemon: with C clients each waiting for its answers, Little's law
//! makes the mean latency C × depth ÷ throughput (256 clients at 100,000 reports/s: 2.56 ms),
//! so their latency is queueing in the clients' own backlog; `paced` shows the latency itself.
//!
//! Latency is from a report's write to its answer's arrival. The clients run on a tokio runtime
//! in this process, on the same 2 cores as the daemon: the output gives the client's CPU time
//! beside the daemon's (from /proc/PID/stat), so the daemon's cost per report can be read off.
//!
//! Run: `cargo bench --bench report_throughput` (`-- --seconds S --clients N --depth N
//! --threads N`). Without `--bench` it is a smoke run: 16 clients, 1 s per variant.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const GOAL_RATE: f64 = 100_000.0;
const GOAL_P99_MS: f64 = 1.0;

/// What one client measured: acknowledgement latencies in µs.
struct ClientResult {
    lat_us: Vec<u32>,
    errors: u64,
}

/// One client: `depth` reports in flight on its own connection until `stop`.
async fn client(
    socket: PathBuf,
    line: Vec<u8>,
    depth: usize,
    pace: Option<(Duration, Duration)>,
    mut go: tokio::sync::watch::Receiver<bool>,
    connected: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> ClientResult {
    let mut s = UnixStream::connect(&socket).await.expect("connect");
    connected.fetch_add(1, Ordering::SeqCst);
    let mut out = ClientResult {
        lat_us: Vec::with_capacity(1 << 16),
        errors: 0,
    };
    let mut sent: VecDeque<Instant> = VecDeque::with_capacity(depth);
    let mut buf = vec![0u8; 64 * 1024];
    let mut filled = 0usize;
    let mut wbuf: Vec<u8> = Vec::with_capacity(line.len() * depth);
    let _ = go.wait_for(|g| *g).await;
    if let Some((period, phase)) = pace {
        return paced(s, line, period, phase, stop, out).await;
    }
    // The first `depth` reports in one write.
    for _ in 0..depth {
        wbuf.extend_from_slice(&line);
    }
    let now = Instant::now();
    sent.extend(std::iter::repeat_n(now, depth));
    s.write_all(&wbuf).await.expect("write");
    loop {
        let n = s.read(&mut buf[filled..]).await.expect("read");
        assert!(n > 0, "the daemon closed the connection");
        let at = Instant::now();
        filled += n;
        // Every complete answer line settles the oldest report in flight.
        let mut answered = 0;
        let mut start = 0;
        while let Some(pos) = buf[start..filled].iter().position(|&b| b == b'\n') {
            let ans = &buf[start..start + pos];
            if ans != b"{\"ok\":true}" {
                out.errors += 1;
                if out.errors <= 3 {
                    eprintln!("answer: {}", String::from_utf8_lossy(ans));
                }
            }
            let t = sent.pop_front().expect("an answer for a report sent");
            out.lat_us
                .push((at - t).as_micros().min(u32::MAX as u128) as u32);
            answered += 1;
            start += pos + 1;
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
        if stop.load(Ordering::Relaxed) {
            if sent.is_empty() {
                return out;
            }
            continue;
        }
        if answered > 0 {
            wbuf.clear();
            for _ in 0..answered {
                wbuf.extend_from_slice(&line);
            }
            let now = Instant::now();
            sent.extend(std::iter::repeat_n(now, answered));
            s.write_all(&wbuf).await.expect("write");
        }
    }
}

/// One report at a time, one every `period` (the first after `phase`), or at once when the last
/// answer came late.
async fn paced(
    mut s: UnixStream,
    line: Vec<u8>,
    period: Duration,
    phase: Duration,
    stop: Arc<AtomicBool>,
    mut out: ClientResult,
) -> ClientResult {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + phase, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let t = Instant::now();
        s.write_all(&line).await.expect("write");
        let mut filled = 0;
        loop {
            let n = s.read(&mut buf[filled..]).await.expect("read");
            assert!(n > 0, "the daemon closed the connection");
            filled += n;
            if buf[..filled].ends_with(b"\n") {
                break;
            }
        }
        out.lat_us
            .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        if &buf[..filled] != b"{\"ok\":true}\n" {
            out.errors += 1;
        }
    }
    out
}

#[derive(Clone, Copy)]
struct Variant {
    clients: usize,
    /// Reports in flight per client.
    depth: usize,
    /// Offered reports/s in all, when paced.
    paced: Option<f64>,
    secs: f64,
}

struct RunResult {
    reports: u64,
    secs: f64,
    lat_ms: Vec<f64>,
    errors: u64,
    daemon_cpu_s: f64,
    client_cpu_s: f64,
}

fn run(
    rt: &tokio::runtime::Runtime,
    socket: &Path,
    lines: &[Vec<u8>],
    v: Variant,
    daemon_pid: i32,
) -> RunResult {
    let Variant {
        clients,
        depth,
        paced: paced_rate,
        secs,
    } = v;
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let connected = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            rt.spawn(client(
                socket.to_path_buf(),
                lines[i % lines.len()].clone(),
                depth,
                paced_rate.map(|r| {
                    let period = Duration::from_secs_f64(clients as f64 / r);
                    (period, period.mul_f64(i as f64 / clients as f64))
                }),
                go.clone(),
                connected.clone(),
                stop.clone(),
            ))
        })
        .collect();
    // Every client connects before the clock starts.
    wait_until("every client connected", Duration::from_secs(30), || {
        (connected.load(Ordering::SeqCst) == clients).then_some(())
    });
    let me = std::process::id() as i32;
    let (d0, c0) = (cpu_ticks(daemon_pid).unwrap(), cpu_ticks(me).unwrap());
    let t0 = Instant::now();
    go_tx.send_replace(true);
    // The measured span (not a wait for a condition).
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let results: Vec<ClientResult> = rt.block_on(async {
        let mut v = Vec::new();
        for h in handles {
            v.push(h.await.expect("client task"));
        }
        v
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let (d1, c1) = (cpu_ticks(daemon_pid).unwrap(), cpu_ticks(me).unwrap());
    let mut lat_ms: Vec<f64> = results
        .iter()
        .flat_map(|r| r.lat_us.iter().map(|&u| u as f64 / 1000.0))
        .collect();
    lat_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    RunResult {
        reports: lat_ms.len() as u64,
        secs: elapsed,
        errors: results.iter().map(|r| r.errors).sum(),
        lat_ms,
        daemon_cpu_s: (d1 - d0) as f64 / clk_tck(),
        client_cpu_s: (c1 - c0) as f64 / clk_tck(),
    }
}

fn main() {
    let full = bench_full();
    let secs = bench_arg::<f64>("--seconds").unwrap_or(if full { 10.0 } else { 1.0 });
    let clients = bench_arg::<f64>("--clients").unwrap_or(if full { 256.0 } else { 16.0 }) as usize;
    let depth = bench_arg::<f64>("--depth").unwrap_or(8.0) as usize;
    let threads = bench_arg::<f64>("--threads").unwrap_or(2.0) as usize;
    println!(
        "report_throughput: {clients} clients, one connection each, {secs} s per variant; client \
         runtime: tokio, {threads} worker threads, in this process, sharing the machine's CPUs \
         with the daemon; binary {}",
        hearth().display()
    );
    let d = Daemon::builder()
        .ports(12)
        .model(Model::toy("tp", &["--service-time", "10ms"]).scale(2, 2, 0))
        .start();
    let routed = wait_until("2 routed", Duration::from_secs(60), || {
        let r = d.in_state("tp", "routed");
        (r.len() == 2).then_some(r)
    });
    let ids: Vec<String> = routed
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    // Half model-wide, half per replica; calm values (no scaling, so what is measured is the
    // report path itself).
    let lines: Vec<Vec<u8>> = vec![
        json!({"op":"report","model":"tp","oldest_wait_ms":12,"queue_depth":0,"in_flight":1}),
        json!({"op":"report","model":"tp","replica":ids[0],"oldest_wait_ms":12,"queue_depth":0,"in_flight":1}),
        json!({"op":"report","model":"tp","oldest_wait_ms":12,"queue_depth":0,"in_flight":1}),
        json!({"op":"report","model":"tp","replica":ids[1],"oldest_wait_ms":12,"queue_depth":0,"in_flight":1}),
    ]
    .into_iter()
    .map(|v| format!("{v}\n").into_bytes())
    .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let rss0 = rss_kib(d.pid()).unwrap_or(0);
    let paced_rate = bench_arg::<f64>("--paced").unwrap_or(25_600.0);
    for (depth, paced) in [(1, None), (depth, None), (1, Some(paced_rate))] {
        let load = machine_load();
        let v = Variant {
            clients,
            depth,
            paced,
            secs,
        };
        let r = run(&rt, &d.socket, &lines, v, d.pid());
        let rate = r.reports as f64 / r.secs;
        let p99 = percentile(&r.lat_ms, 99.0);
        match paced {
            None => println!("--- {depth} outstanding per client ({load} before the run)"),
            Some(p) => println!(
                "--- paced: {p:.0} reports/s offered in all, 1 outstanding ({load} before the run)"
            ),
        }
        println!(
            "  {} reports in {:.2} s: {:.0} reports/s (goal ≥ {GOAL_RATE:.0}: {}); {} error answers",
            r.reports,
            r.secs,
            rate,
            if rate >= GOAL_RATE { "met" } else { "NOT met" },
            r.errors
        );
        println!(
            "  answer latency: p50 {:.3} ms, p90 {:.3} ms, p99 {p99:.3} ms, max {:.3} ms \
             (goal p99 ≤ {GOAL_P99_MS} ms: {})",
            percentile(&r.lat_ms, 50.0),
            percentile(&r.lat_ms, 90.0),
            r.lat_ms.last().copied().unwrap_or(f64::NAN),
            if p99 <= GOAL_P99_MS { "met" } else { "NOT met" }
        );
        println!(
            "  CPU during the run: daemon {:.2} s ({:.0} % of one core, {:.1} µs per report), \
             clients {:.2} s ({:.0} % of one core)",
            r.daemon_cpu_s,
            100.0 * r.daemon_cpu_s / r.secs,
            1e6 * r.daemon_cpu_s / r.reports.max(1) as f64,
            r.client_cpu_s,
            100.0 * r.client_cpu_s / r.secs,
        );
    }
    println!(
        "daemon RSS: {} KiB before, {} KiB after; machine at end: {}",
        rss0,
        rss_kib(d.pid()).unwrap_or(0),
        machine_load()
    );
    drop(rt);
    drop(d);
}
