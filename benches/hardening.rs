//! Hardening figures against the real daemon (release build), one toy-server model of 2 routed
//! replicas:
//!
//! 1. `status` latency while `--clients` (default 256) clients, each on its own connection,
//!    send model-wide reports back to back (one outstanding each) as fast as the daemon answers:
//!    p50 / p99 / max of `status` asked one at a time on its own connection, idle and under the
//!    flood (goal: p99 ≤ 5 ms under the flood).
//! 2. Memory under hostile connections: `--hostile` (default 2,000) connections each write 60 KiB
//!    of a line without its newline and hold it; RSS of the daemon before, while they hold, and
//!    after they are closed (goal: bounded while held, back near the start after).
//!
//! Run: `cargo bench --bench hardening` (`-- --seconds S --clients N --hostile N`; `--baseline
//! PATH` first measures part 1 on another build of hearth, for a before/after in one run).
//! Without `--bench` it is a smoke run (16 clients, 200 hostile connections, 2 s).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::*;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `n` status requests, one at a time, each on a fresh connection (as `hearth status` does).
fn status_latencies(socket: &std::path::Path, n: usize) -> Vec<f64> {
    let mut lat: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let a = request(socket, &json!({"op":"status","model":"hb"}));
            assert_eq!(a["ok"], json!(true), "{a}");
            let l = ms(t.elapsed());
            std::thread::sleep(Duration::from_millis(5));
            l
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    lat
}

fn show(what: &str, lat: &[f64]) {
    println!(
        "  {what}: {} asks, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lat.len(),
        percentile(lat, 50.0),
        percentile(lat, 99.0),
        lat.last().copied().unwrap_or(0.0)
    );
}

/// `status` asked idle, then under `clients` reporters: (idle, under the flood, reports/s).
fn status_under_flood(d: &Daemon, clients: usize, asks: usize) -> (Vec<f64>, Vec<f64>, f64) {
    let idle = status_latencies(&d.socket, asks);
    let stop = Arc::new(AtomicBool::new(false));
    let reports = Arc::new(AtomicU64::new(0));
    let line = format!(
        "{}\n",
        json!({"op":"report","model":"hb","oldest_wait_ms":12,"queue_depth":0,"in_flight":1})
    );
    let flood: Vec<_> = (0..clients)
        .map(|_| {
            let (stop, reports, socket, line) = (
                stop.clone(),
                reports.clone(),
                d.socket.clone(),
                line.clone(),
            );
            std::thread::spawn(move || {
                let Ok(mut c) = Conn::connect(&socket) else {
                    return;
                };
                while !stop.load(Ordering::Relaxed) {
                    if c.send_raw(line.as_bytes()).is_err() || c.read().is_err() {
                        return;
                    }
                    reports.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (r0, t0) = (reports.load(Ordering::Relaxed), Instant::now());
    let busy = status_latencies(&d.socket, asks);
    let rate = (reports.load(Ordering::Relaxed) - r0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        let _ = t.join();
    }
    (idle, busy, rate)
}

/// One toy-server model of 2 routed replicas, on this build or on `baseline` (another build of
/// hearth, run in its place through a wrapper).
fn start(baseline: Option<&str>) -> Daemon {
    let mut b = Daemon::builder()
        .ports(12)
        .model(Model::toy("hb", &["--service-time", "10ms"]).scale(2, 2, 0));
    if let Some(bin) = baseline {
        b = b.wrapper(&["sh", "-c", "shift; exec \"$0\" \"$@\"", bin]);
    }
    let d = b.start();
    wait_until("2 routed", Duration::from_secs(60), || {
        (d.in_state("hb", "routed").len() == 2).then_some(())
    });
    d
}

fn main() {
    let full = bench_full();
    let secs = bench_arg::<f64>("--seconds").unwrap_or(if full { 10.0 } else { 2.0 });
    let clients = bench_arg::<f64>("--clients").unwrap_or(if full { 256.0 } else { 16.0 }) as usize;
    let hostile =
        bench_arg::<f64>("--hostile").unwrap_or(if full { 2000.0 } else { 200.0 }) as usize;
    // Another build to compare with in the same run (`--baseline target/old/hearth`).
    let baseline = std::env::args().skip_while(|a| a != "--baseline").nth(1);
    println!(
        "hardening: {clients} reporting clients, {hostile} hostile connections; binary {}",
        hearth().display()
    );
    let asks = (secs * 100.0) as usize;

    println!(
        "--- 1. status while clients report at full speed ({})",
        machine_load()
    );
    let mut runs = Vec::new();
    if let Some(bin) = baseline.as_deref() {
        let d = start(Some(bin));
        let (idle, busy, rate) = status_under_flood(&d, clients, asks);
        println!("  baseline {bin}:");
        show("idle", &idle);
        show(
            &format!("under {clients} reporters ({rate:.0} reports/s answered meanwhile)"),
            &busy,
        );
        runs.push(percentile(&busy, 99.0));
        drop(d);
    }
    let d = start(None);
    let (idle, busy, rate) = status_under_flood(&d, clients, asks);
    if baseline.is_some() {
        println!("  this build:");
    }
    show("idle", &idle);
    show(
        &format!("under {clients} reporters ({rate:.0} reports/s answered meanwhile)"),
        &busy,
    );
    println!(
        "  p99 under load / idle: {:.1}x; goal p99 ≤ 5 ms: {}",
        percentile(&busy, 99.0) / percentile(&idle, 99.0).max(1e-9),
        if percentile(&busy, 99.0) <= 5.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    if let Some(before) = runs.first() {
        println!(
            "  p99 under load, baseline / this build: {:.1}x",
            before / percentile(&busy, 99.0).max(1e-9)
        );
    }

    println!("--- 2. {hostile} connections, each holding 60 KiB of an unfinished line");
    let pid = d.pid();
    let rss0 = rss_kib(pid).unwrap_or(0);
    let chunk = vec![b'x'; 60 * 1024];
    let t = Instant::now();
    let mut held: Vec<UnixStream> = Vec::new();
    let mut refused = 0usize;
    // As root, the flood comes from 8 unprivileged users (uids 60001…), as a hostile neighbour's
    // would: each holds what the per-user cap lets it, and the admins' reserve stays free.
    // Otherwise it comes from this user, the daemon's own, which may take every slot.
    let users: Vec<Option<u32>> = if testkit::procs::is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666))
            .expect("chmod the socket");
        (0..8).map(|i| Some(60001 + i)).collect()
    } else {
        vec![None]
    };
    let per_user = hostile.div_ceil(users.len());
    for uid in &users {
        let conns = match uid {
            Some(uid) => connect_as(&d.socket, *uid, per_user),
            None => (0..per_user)
                .filter_map(|_| UnixStream::connect(&d.socket).ok())
                .collect(),
        };
        refused += per_user - conns.len();
        for s in conns {
            s.set_nonblocking(true).ok();
            // As much of the 60 KiB as the socket takes now; the rest is the client's.
            let _ = (&s).write(&chunk);
            held.push(s);
        }
    }
    println!(
        "  from {}",
        match users.first() {
            Some(Some(_)) => format!("{} users (uids 60001…), {per_user} each", users.len()),
            _ => "this user (the daemon's own)".to_string(),
        }
    );
    std::thread::sleep(Duration::from_secs(2));
    let rss_held = rss_kib(pid).unwrap_or(0);
    // An operator's `status` meanwhile: answered, or refused as busy (the connection cap).
    let (mut answered, mut busy_refusals) = (Vec::new(), 0);
    for _ in 0..20 {
        let t = Instant::now();
        let a = request(&d.socket, &json!({"op":"status","model":"hb"}));
        if a["ok"] == json!(true) {
            answered.push(ms(t.elapsed()));
        } else {
            busy_refusals += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    answered.sort_by(f64::total_cmp);
    println!(
        "  {} connected ({} refused at connect) in {:.1} s; RSS {} KiB before, {} KiB while \
         held (+{} KiB)",
        held.len(),
        refused,
        t.elapsed().as_secs_f64(),
        rss0,
        rss_held,
        rss_held.saturating_sub(rss0)
    );
    show("status while they hold (answered)", &answered);
    println!("  status refused while they hold: {busy_refusals} of 20");
    drop(held);
    // The daemon frees as the connections close; wait for RSS to settle.
    let mut rss_after = rss_kib(pid).unwrap_or(0);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(500));
        let now = rss_kib(pid).unwrap_or(0);
        if now >= rss_after {
            rss_after = now;
            break;
        }
        rss_after = now;
    }
    println!(
        "  RSS {} KiB after they closed ({:+} KiB against before); held / before {:.2}x, after / \
         before {:.2}x",
        rss_after,
        rss_after as i64 - rss0 as i64,
        rss_held as f64 / rss0.max(1) as f64,
        rss_after as f64 / rss0.max(1) as f64
    );
}
