//! Replay under load: the first 10 minutes of the Azure code trace (CC-BY 4.0, data/traces),
//! compressed 10× into one minute, through the front door to toy replicas under the real daemon,
//! with a replica killed with -9, a reload that rolls out a new version, and a scale-down during
//! the run. No request fails but those the contract lets fail (429, 503); the measured share of
//! requests over the target wait and the replica-seconds are printed next to what `hearth
//! simulate` predicts for the same arrivals and knobs, and must agree within 2×.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::route::*;

const T: Duration = Duration::from_secs(90);
/// Trace time replayed, and the compression.
const TRACE_SECONDS: f64 = 600.0;
const SPEED: f64 = 10.0;
/// The toy's service time (compressed time, like everything the test runs).
const SERVICE: &str = "200ms";
const SERVICE_S: f64 = 0.2;
const SLOTS: u32 = 2;
/// The toy's load time; cold start = this plus the process start and the warm-up.
const LOAD: &str = "2s";

/// Arrival offsets (s, compressed) of the trace's first TRACE_SECONDS.
fn arrivals(csv: &Path) -> Vec<f64> {
    let text = fs::read_to_string(csv).unwrap();
    let mut out = Vec::new();
    let mut t0: Option<f64> = None;
    for line in text.lines().skip(1) {
        let stamp = line.split(',').next().unwrap();
        // "2023-11-16 18:15:46.6805900": seconds of the day are enough within one day.
        let (_, time) = stamp.split_once(' ').unwrap();
        let mut p = time.split(':');
        let h: f64 = p.next().unwrap().parse().unwrap();
        let m: f64 = p.next().unwrap().parse().unwrap();
        let s: f64 = p.next().unwrap().parse().unwrap();
        let t = h * 3600.0 + m * 60.0 + s;
        let t0 = *t0.get_or_insert(t);
        if t - t0 > TRACE_SECONDS {
            break;
        }
        out.push((t - t0) / SPEED);
    }
    out
}

#[derive(Default)]
struct Outcomes {
    ok: u64,
    /// 429 and 503: the contract's refusals.
    refused: u64,
    failed: Vec<String>,
}

#[test]
fn replay_through_the_front_door_with_a_kill_a_rollout_and_a_scale_down() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/traces/azure-llm-2023-code.csv");
    assert!(
        trace.is_file(),
        "{} is missing: the repository ships it (data/traces/README.md)",
        trace.display()
    );
    let times = arrivals(&trace);
    assert!(times.len() > 1000, "{} arrivals", times.len());
    let mut m = Model::front_toy(
        "r",
        &[
            "--load-time",
            LOAD,
            "--concurrency",
            &SLOTS.to_string(),
            "--service-time",
            SERVICE,
        ],
    )
    .scale(1, 6, 1)
    .slots(SLOTS)
    .target_wait("500ms")
    .stop_grace("2s")
    .drain_timeout("20s");
    m.scaling.down_stabilization = Some("5s".into());
    m.scaling.down_step = Some("2s".into());
    // 8 ports beyond max: a rollout at max starts its new replicas beside the old ones.
    let mut daemon = front_door_daemon([m], "queue_timeout = \"30s\"\n")
        .ports(6 + 8)
        .start();
    let router = Router::start(&daemon);
    let addr = router.addr;
    let config = daemon.config_path.clone();
    daemon.wait_routed("r", 1, T);
    wait_until("one warm replica", T, || {
        (daemon.in_state("r", "warm").len() == 1).then_some(())
    });
    wait_until("the router routing r", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"r\"}")? >= 1.0).then_some(())
    });
    let watch = daemon.watch(None);

    // Replica-seconds: every replica that holds its resources (all but pending), sampled.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let socket = daemon.socket.clone();
        spawn(move || {
            let mut total = 0.0;
            let mut last = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let n = held_replicas(&socket);
                let now = Instant::now();
                total += n as f64 * now.duration_since(last).as_secs_f64();
                last = now;
            }
            total
        })
    };

    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let start = Instant::now();
    let mut clients = Vec::with_capacity(times.len());
    let mut killed = None;
    let mut reloaded = false;
    let mut operator_scale = false;
    for (i, &t) in times.iter().enumerate() {
        let due = start + Duration::from_secs_f64(t);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let elapsed = start.elapsed().as_secs_f64();
        if killed.is_none() && elapsed >= 15.0 {
            let routed = daemon.in_state("r", "routed");
            let victim = &routed[0];
            let pid = victim["pid"].as_i64().unwrap() as i32;
            signal(pid, Signal::SIGKILL);
            killed = Some(victim["id"].as_str().unwrap().to_string());
        }
        if !reloaded && elapsed >= 25.0 {
            daemon.rewrite_config(|c| c.models[0].version = "2".into());
            let a = daemon.request(json!({"op": "reload"}));
            assert_eq!(a["ok"], true, "{a}");
            reloaded = true;
        }
        // The trace's own lulls make the autoscaler scale down; should none have by 45 s, an
        // operator's `scale` does (the report says which).
        if !operator_scale && elapsed >= 45.0 && scale_downs(&watch).is_empty() {
            let routed = daemon.model("r")["routed"].as_u64().unwrap() as u32;
            let a = daemon.request(
                json!({"op": "scale", "model": "r", "max": routed.saturating_sub(1).max(1)}),
            );
            assert_eq!(a["ok"], true, "{a}");
            operator_scale = true;
        }
        let out = outcomes.clone();
        clients.push(spawn(move || {
            let r = post(
                addr,
                "/v1/completions",
                &json!({"model": "r", "prompt": format!("request {i}"), "max_tokens": 4}),
                Duration::from_secs(60),
            );
            let mut o = out.lock().unwrap();
            match r {
                Ok(r) if r.status == 200 => o.ok += 1,
                Ok(r) if r.status == 429 || r.status == 503 => o.refused += 1,
                Ok(r) => o.failed.push(format!("#{i}: {} {}", r.status, r.text())),
                Err(e) => o.failed.push(format!("#{i}: {e}")),
            }
        }));
    }
    for c in clients {
        c.join().unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let replica_seconds = sampler.join().unwrap();

    let o = outcomes.lock().unwrap();
    let model = daemon.model("r");
    assert!(
        o.failed.is_empty(),
        "{} failed of {}: {:?}\nrouter:\n{}",
        o.failed.len(),
        times.len(),
        &o.failed[..o.failed.len().min(10)],
        router.log()
    );
    assert_eq!(o.ok + o.refused, times.len() as u64);
    // The three events happened.
    let killed = killed.expect("a replica was killed");
    assert!(daemon
        .replica("r", &killed)
        .is_none_or(|r| r["state"] != "routed"));
    assert_eq!(model["version"], "2", "{model}");
    let model = wait_until("the rollout to finish", T, || {
        let m = daemon.model("r");
        m["rollout"].is_null().then_some(m)
    });
    assert!(
        model["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["version"] == "2" || r["state"] != "routed"),
        "{model}"
    );
    let downs = scale_downs(&watch);
    assert!(!downs.is_empty(), "no scale-down");

    // Measured: the router's queue waits against the target (a bucket bound), and replica time.
    let count = router
        .metric("hearth_route_queue_wait_seconds_count{model=\"r\"}")
        .unwrap();
    let within = router
        .metric("hearth_route_queue_wait_seconds_bucket{le=\"0.5\",model=\"r\"}")
        .or_else(|| router.metric("hearth_route_queue_wait_seconds_bucket{model=\"r\",le=\"0.5\"}"))
        .unwrap();
    let over = 1.0 - within / count;

    // Predicted: the simulator on the same arrivals (compressed), service time, slots, cold
    // start and knobs.
    let csv = daemon.dir.path().join("arrivals.csv");
    let mut text = String::from("t_seconds,service_s\n");
    for t in &times {
        text.push_str(&format!("{t:.6},{SERVICE_S}\n"));
    }
    fs::write(&csv, text).unwrap();
    let cold = model["time_to_ready_ms"].as_u64().unwrap_or(2500);
    let sim = Command::new(hearth())
        .args(["simulate", "--config"])
        .arg(&config)
        .args(["--model", "r", "--trace"])
        .arg(&csv)
        .args([
            "--policy",
            "hearth",
            "--concurrency",
            &SLOTS.to_string(),
            "--cold-start",
            &format!("{cold}ms"),
            "--promotion-delay",
            "50ms",
            "--warmup",
            "0s",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let sim: Value = serde_json::from_slice(&sim.stdout).unwrap();
    let p = &sim["policies"][0];
    let (p_over, p_rs) = (
        p["over_target"].as_f64().unwrap(),
        p["replica_seconds"].as_f64().unwrap(),
    );
    eprintln!(
        "replay: {} requests over {wall:.1} s ({}× compressed {TRACE_SECONDS} s of azure-code): \
         {} ok, {} refused (429/503), 0 failed; killed {killed}; rolled out version 2; \
         scale-downs {:?}{}",
        times.len(),
        SPEED,
        o.ok,
        o.refused,
        downs,
        if operator_scale {
            " (by the operator's scale)"
        } else {
            " (by the autoscaler)"
        }
    );
    eprintln!(
        "measured: over target {:.2} %, replica-seconds {replica_seconds:.1}; \
         simulate predicts: over target {:.2} %, replica-seconds {p_rs:.1} (cold start {cold} ms)",
        over * 100.0,
        p_over * 100.0
    );
    let ratio = replica_seconds / p_rs;
    assert!(
        (0.5..=2.0).contains(&ratio),
        "replica-seconds {replica_seconds:.1} vs predicted {p_rs:.1}"
    );
    // Shares: within 2×, or within one percentage point where both are small (at 1,482
    // requests, 1 % is 15 of them).
    let close = (over - p_over).abs() <= 0.01
        || (over > 0.0 && p_over > 0.0 && (0.5..=2.0).contains(&(over / p_over)));
    assert!(close, "over target {over:.4} vs predicted {p_over:.4}");
}

/// Replicas that hold their resources now: starting, warm, routed, draining, stopping.
fn held_replicas(socket: &Path) -> usize {
    use std::io::{BufRead, BufReader, Write};
    let Ok(s) = std::os::unix::net::UnixStream::connect(socket) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut w = s.try_clone().unwrap();
    if w.write_all(b"{\"op\":\"status\",\"model\":\"r\"}\n")
        .is_err()
    {
        return 0;
    }
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok();
    let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    v["status"]["models"][0]["replicas"]
        .as_array()
        .map_or(0, |rs| {
            rs.iter().filter(|r| r["state"] != "pending").count()
        })
}

/// Scale events down, as (from, to, reason).
fn scale_downs(watch: &Watch) -> Vec<(u64, u64, String)> {
    watch
        .events()
        .into_iter()
        .map(|e| e.v)
        .filter(|v| v["event"] == "scale" && v["to"].as_u64() < v["from"].as_u64())
        .map(|v| {
            (
                v["from"].as_u64().unwrap(),
                v["to"].as_u64().unwrap(),
                v["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}
