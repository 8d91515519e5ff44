//! Watchdog pings: how regularly the daemon sends `WATCHDOG=1`, idle and while clients flood it
//! with queue reports (goal: every gap under WATCHDOG_USEC, or systemd kills the service; the
//! daemon pings every WATCHDOG_USEC / 2).
//!
//! The program plays systemd: it owns the datagram socket named by NOTIFY_SOCKET, starts the
//! daemon (release build) with WATCHDOG_USEC and WATCHDOG_PID set as systemd sets them, with one
//! toy-server model of 2 routed + 1 warm replicas, and stamps every ping on arrival. Phases:
//! `idle` (the toys' own reports only, every 200 ms), then `flood`: `--clients` threads, each on
//! its own connection, send model-wide reports back to back (one outstanding each) as fast as
//! the daemon answers. Printed per phase: pings, gaps p50 / p99 / max against the interval and
//! the timeout, the reports answered, and the machine's load.
//!
//! Run: `cargo bench --bench watchdog` (`-- --seconds S --clients N --watchdog-ms MS`). Without
//! `--bench` it is a smoke run of 3 s a phase. This is where the figure the systemd test used to
//! assert (about one ping a second, gaps under 1.9 s) is measured.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::*;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Pings between `from` and `to`, and the gaps between them in ms, sorted.
fn gaps(pings: &[Instant], from: Instant, to: Instant) -> (usize, Vec<f64>) {
    let inside: Vec<Instant> = pings
        .iter()
        .copied()
        .filter(|&p| p >= from && p <= to)
        .collect();
    let mut g: Vec<f64> = inside.windows(2).map(|w| ms(w[1] - w[0])).collect();
    g.sort_by(f64::total_cmp);
    (inside.len(), g)
}

fn main() {
    let full = bench_full();
    let secs = bench_arg::<f64>("--seconds").unwrap_or(if full { 20.0 } else { 3.0 });
    let clients = bench_arg::<f64>("--clients").unwrap_or(16.0) as usize;
    let timeout_ms = bench_arg::<f64>("--watchdog-ms").unwrap_or(2000.0) as u64;
    let interval_ms = timeout_ms as f64 / 2.0;
    println!(
        "watchdog: WATCHDOG_USEC {} ms (pings due every {interval_ms:.0} ms); {secs} s idle, \
         then {secs} s with {clients} clients reporting back to back; binary {}",
        timeout_ms,
        hearth().display()
    );
    let notify_dir = tempfile::tempdir().expect("a temporary directory");
    let notify = notify_dir.path().join("notify.sock");
    let recorder = NotifyRecorder::bind(&notify, None);
    let d = Daemon::builder()
        .notify_socket(&notify)
        .env("WATCHDOG_USEC", &(timeout_ms * 1000).to_string())
        .watchdog_pid_self()
        .model(Model::toy("wd", &["--service-time", "10ms"]))
        .start();
    d.wait_settled("wd", 2, 1, Duration::from_secs(60));
    recorder.wait_line(0, "READY=1", Duration::from_secs(10));

    let span = Duration::from_secs_f64(secs);
    // The measured spans (not waits for a condition).
    let idle_from = Instant::now();
    let idle_load = machine_load();
    std::thread::sleep(span);
    let idle_to = Instant::now();

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let flood_load = machine_load();
    let flood_from = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (socket, stop, answered) = (d.socket.clone(), stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let mut c = Conn::connect(&socket).expect("connect");
                let report = json!({"op": "report", "model": "wd", "oldest_wait_ms": 5,
                                    "queue_depth": 0, "in_flight": 1});
                while !stop.load(Ordering::Relaxed) {
                    let a = c.call(&report).expect("a report's answer");
                    assert_eq!(a["ok"], true, "{a}");
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(span);
    let flood_to = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread");
    }
    let reports = answered.load(Ordering::Relaxed);

    let pings = recorder.pings();
    for (phase, from, to, load, extra) in [
        ("idle", idle_from, idle_to, idle_load, String::new()),
        (
            "flood",
            flood_from,
            flood_to,
            flood_load,
            format!(
                "; {reports} reports answered ({:.0}/s)",
                reports as f64 / (flood_to - flood_from).as_secs_f64()
            ),
        ),
    ] {
        let (n, g) = gaps(&pings, from, to);
        let max = g.last().copied().unwrap_or(f64::NAN);
        println!(
            "{phase}: {n} pings in {:.1} s ({load} before){extra}",
            (to - from).as_secs_f64()
        );
        println!(
            "  gap p50 {:.1} ms, p99 {:.1} ms, max {max:.1} ms = {:.2}× the interval, {:.2}× \
             WATCHDOG_USEC (goal < 1: {})",
            percentile(&g, 50.0),
            percentile(&g, 99.0),
            max / interval_ms,
            max / timeout_ms as f64,
            if max < timeout_ms as f64 {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    println!("machine at end: {}", machine_load());
}
