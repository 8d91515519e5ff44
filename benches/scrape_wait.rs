//! How well hearth's scraped estimate of the oldest wait follows the true one, on llama.cpp's
//! real server (`cargo bench --bench scrape_wait`).
//!
//! The daemon runs one routed replica (`-np 1`, no scaling) scraped every 250 ms. An open-loop
//! load generator sends streamed completions in three phases — under capacity, over capacity
//! (the queue grows), then light (it drains) — and stamps each request when sent and when its
//! first token arrives (the instant it left the queue for the slot). A sampler polls the
//! daemon's status for the signal it holds and the instant it was recorded (`age_ms`).
//!
//! Afterwards, at every recorded signal instant, the true oldest wait is the age of the oldest
//! request sent but not yet started, and the true depth is how many such requests there were.
//! Printed: one row per second, then error statistics of estimated − true.
//!
//! Options after `--`: `--seconds-scale X` stretches the phases (default 1.0; 0.25 without
//! `--bench`, a smoke run of about 6 s of load), `--hold-ms N` the slot time per request
//! (default 300). Needs llama.cpp's server: `HEARTH_REAL_MODEL_DIR`, or made in
//! `target/real-model` by `scripts/real-model.sh` on first use.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::{bench_arg, llama_complete, tokens_for, Daemon, Model};

const MODEL: &str = "tiny";

#[derive(Debug, Clone, Copy)]
struct Req {
    sent: Instant,
    started: Option<Instant>,
    done: Option<Instant>,
    ok: bool,
}

#[derive(Debug, Clone, Copy)]
struct Estimate {
    at: Instant,
    wait_ms: f64,
    depth: u64,
}

/// xorshift64*: a seeded, dependency-free source for exponential inter-arrival times.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn exp(&mut self, rate: f64) -> Duration {
        Duration::from_secs_f64(-(1.0 - self.next_f64()).ln() / rate)
    }
}

async fn streamed(
    client: reqwest::Client,
    addr: String,
    n_predict: u32,
    log: Arc<Mutex<Vec<Req>>>,
) {
    let sent = Instant::now();
    let i = {
        let mut l = log.lock().unwrap();
        l.push(Req {
            sent,
            started: None,
            done: None,
            ok: false,
        });
        l.len() - 1
    };
    let body =
        format!(r#"{{"prompt":"hello","n_predict":{n_predict},"ignore_eos":true,"stream":true}}"#);
    let resp = client
        .post(format!("http://{addr}/completion"))
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(300))
        .send()
        .await;
    let Ok(mut resp) = resp else {
        return;
    };
    let ok = resp.status().is_success();
    let mut first = true;
    while let Ok(Some(_)) = resp.chunk().await {
        if first {
            log.lock().unwrap()[i].started = Some(Instant::now());
            first = false;
        }
    }
    let mut l = log.lock().unwrap();
    l[i].done = Some(Instant::now());
    l[i].ok = ok && !first;
}

/// The truth at `t`: (age of the oldest request sent and not yet started, how many there are).
fn truth(reqs: &[Req], t: Instant) -> (f64, u64) {
    let waiting = reqs
        .iter()
        .filter(|r| r.sent <= t && r.started.is_none_or(|s| s > t));
    let mut oldest: Option<Instant> = None;
    let mut n = 0;
    for r in waiting {
        n += 1;
        oldest = Some(oldest.map_or(r.sent, |o| o.min(r.sent)));
    }
    (
        oldest.map_or(0.0, |o| t.duration_since(o).as_secs_f64() * 1000.0),
        n,
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let scale = bench_arg::<f64>("--seconds-scale").unwrap_or(if testkit::bench_full() {
        1.0
    } else {
        0.25
    });
    let hold = Duration::from_millis(bench_arg::<f64>("--hold-ms").unwrap_or(300.0) as u64);
    let daemon = Daemon::builder()
        .tick("100ms")
        .model(Model::llama_one_slot(MODEL))
        .start();
    let status = daemon.wait_model(MODEL, "routed", Duration::from_secs(90), |m| {
        m["routed"] == 1
    });
    let addr = status["replicas"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["state"] == "routed"))
        .and_then(|r| r["addr"].as_str())
        .expect("the routed replica's address")
        .to_string();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("HTTP client");
    let n_predict = tokens_for(&addr, hold, 1900);
    // Measure the service rate the phases are scaled to: a few requests back to back.
    let started = Instant::now();
    for _ in 0..4 {
        llama_complete(&addr, n_predict).expect("calibration");
    }
    let mu = 4.0 / started.elapsed().as_secs_f64();
    let phases = [
        ("under", 6.0 * scale, 0.6 * mu),
        ("over", 8.0 * scale, 1.6 * mu),
        ("drain", 10.0 * scale, 0.3 * mu),
    ];
    println!(
        "llama.cpp -np 1, n_predict {n_predict} (service ≈ {:.0} ms, μ ≈ {mu:.2}/s); \
         scrape every 250 ms; phases: {}",
        1000.0 / mu,
        phases
            .iter()
            .map(|(n, s, l)| format!("{n} {s:.0} s at λ {l:.2}/s"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let log: Arc<Mutex<Vec<Req>>> = Arc::default();
    let estimates: Arc<Mutex<Vec<Estimate>>> = Arc::default();
    let start = Instant::now();
    let total: f64 = phases.iter().map(|p| p.1).sum();
    let end = start + Duration::from_secs_f64(total);

    std::thread::scope(|scope| {
        // The sampler: the daemon's signal and when it was recorded.
        let sampler = {
            let (daemon, estimates) = (&daemon, estimates.clone());
            scope.spawn(move || {
                let mut last: Option<Instant> = None;
                while Instant::now() < end + Duration::from_secs(3) {
                    let polled = Instant::now();
                    let s = daemon.model(MODEL);
                    let sig = &s["signal"];
                    if let (Some(w), Some(age), Some(d)) = (
                        sig["oldest_wait_ms"].as_f64(),
                        sig["age_ms"].as_u64(),
                        sig["queue_depth"].as_u64(),
                    ) {
                        let at = polled - Duration::from_millis(age);
                        if last.is_none_or(|l| at > l + Duration::from_millis(20)) {
                            estimates.lock().unwrap().push(Estimate {
                                at,
                                wait_ms: w,
                                depth: d,
                            });
                            last = Some(at);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(40));
                }
            })
        };
        // The load: open-loop Poisson arrivals per phase.
        rt.block_on(async {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
            let mut tasks = Vec::new();
            let mut next = start;
            let mut phase_end = start;
            for (_, secs, rate) in phases {
                phase_end += Duration::from_secs_f64(secs);
                loop {
                    next += rng.exp(rate);
                    if next >= phase_end {
                        next = phase_end;
                        break;
                    }
                    tokio::time::sleep_until(next.into()).await;
                    tasks.push(tokio::spawn(streamed(
                        http.clone(),
                        addr.clone(),
                        n_predict,
                        log.clone(),
                    )));
                }
            }
            for t in tasks {
                let _ = t.await;
            }
        });
        sampler.join().expect("sampler");
    });
    drop(daemon);

    let reqs = log.lock().unwrap().clone();
    let ests = estimates.lock().unwrap().clone();
    let failed = reqs.iter().filter(|r| !r.ok).count();
    println!(
        "{} requests ({failed} failed), {} signal samples",
        reqs.len(),
        ests.len()
    );
    println!(
        "{:>4} {:>5} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "sec", "sent", "true depth", "est depth", "true wait ms", "est wait ms", "err ms",
    );
    let secs = (total.ceil() as u64) + 3;
    let mut errs = Vec::new();
    let mut errs_queued = Vec::new();
    let mut depth_errs = Vec::new();
    for s in 0..secs {
        let lo = start + Duration::from_secs(s);
        let hi = lo + Duration::from_secs(1);
        let sent = reqs.iter().filter(|r| r.sent >= lo && r.sent < hi).count();
        let rows: Vec<usize> = (0..ests.len())
            .filter(|&i| ests[i].at >= lo && ests[i].at < hi)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let (mut tw, mut ew, mut td, mut ed) = (0.0, 0.0, 0.0, 0.0);
        for &i in &rows {
            let e = &ests[i];
            let (w, d) = truth(&reqs, e.at);
            tw += w;
            ew += e.wait_ms;
            td += d as f64;
            ed += e.depth as f64;
            errs.push(e.wait_ms - w);
            if d > 0 {
                errs_queued.push(e.wait_ms - w);
            }
            depth_errs.push(e.depth as f64 - d as f64);
        }
        let n = rows.len() as f64;
        println!(
            "{s:>4} {sent:>5} {:>10.1} {:>10.1} {:>12.0} {:>12.0} {:>+10.0}",
            td / n,
            ed / n,
            tw / n,
            ew / n,
            (ew - tw) / n,
        );
    }
    let stats = |name: &str, v: &[f64]| {
        let mut abs: Vec<f64> = v.iter().map(|e| e.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        let bias = v.iter().sum::<f64>() / n;
        let mae = abs.iter().sum::<f64>() / n;
        let rmse = (v.iter().map(|e| e * e).sum::<f64>() / n).sqrt();
        println!(
            "{name}: n {} · bias {bias:+.0} · MAE {mae:.0} · RMSE {rmse:.0} · |err| p50 {:.0} p90 {:.0} max {:.0}",
            v.len(),
            percentile(&abs, 0.5),
            percentile(&abs, 0.9),
            abs.last().copied().unwrap_or(f64::NAN),
        );
    };
    println!("estimated − true oldest wait (ms), at each recorded scrape:");
    stats("  all samples", &errs);
    stats("  queue non-empty", &errs_queued);
    println!("estimated − true queue depth (requests):");
    stats("  all samples", &depth_errs);
    let exact = depth_errs.iter().filter(|e| e.abs() < 0.5).count();
    println!("  depth exact at {exact} of {} samples", depth_errs.len());
}
