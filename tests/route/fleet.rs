//! A real fleet on one machine (docs/fleet.md): three hosts on 127.0.0.2, .3 and .4, each a
//! daemon with `hearth toy-server` replicas and a front door answering agent checks, from
//! `examples/fleet/hearth.toml`; Debian's HAProxy 2.6 in front (`examples/fleet/haproxy.cfg`)
//! and Prometheus over them (`prometheus.yml`, `fleet-rules.yml`), every file rendered with
//! only its addresses changed. HAProxy's view is read through its runtime API (`show servers
//! state`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::route::fleet::{needs_fleet_tools, Fleet};
use testkit::route::*;
use testkit::{needs_cgroup2, repo_dir};

/// `agent-inter` in the example.
const AGENT_INTER: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(60);

/// Clients sending one request after another through HAProxy until stopped: small prompts,
/// prompts over HAProxy's default 16 KiB buffer, and streams, in turn. Counts answers and
/// failures, with what each failure was.
struct Clients {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Clients {
    fn start(frontend: std::net::SocketAddr, n: usize, max_tokens: u32) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..n)
            .map(|t| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                std::thread::spawn(move || {
                    let big = "x".repeat(24 * 1024);
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let prompt = if i % 3 == 1 { big.as_str() } else { "Hello" };
                        let body = json!({
                            "model": "toy", "prompt": prompt, "max_tokens": max_tokens,
                            "stream": i % 3 == 2,
                        });
                        match post(frontend, "/v1/completions", &body, Duration::from_secs(60)) {
                            Ok(r) if r.status == 200 && !r.text().contains("\"error\"") => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(r) => {
                                failures
                                    .lock()
                                    .unwrap()
                                    .push(format!("{}: {}", r.status, r.text()))
                            }
                            Err(e) => failures.lock().unwrap().push(e.to_string()),
                        }
                    }
                })
            })
            .collect();
        Clients {
            stop,
            ok,
            failures,
            threads,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn failed(&self) -> usize {
        self.failures.lock().unwrap().len()
    }

    /// Waits for `n` more answers.
    fn more(&self, n: u64) {
        let target = self.ok() + n;
        wait_until("answers through HAProxy", WAIT, || {
            (self.ok() >= target).then_some(())
        });
    }

    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let ok = self.ok.load(Ordering::Relaxed);
        let f = self.failures.lock().unwrap().clone();
        (ok, f)
    }
}

fn fleet_with_haproxy() -> Fleet {
    fleet_with_haproxy_and(|_| String::new())
}

/// The fleet behind HAProxy on the example's file, with `extra(fleet)` appended to it.
fn fleet_with_haproxy_and(extra: impl Fn(&Fleet) -> String) -> Fleet {
    let mut fleet = Fleet::start(3);
    let cfg = fleet.haproxy_cfg() + &extra(&fleet);
    fleet.start_haproxy(&cfg);
    fleet
}

#[test]
fn haproxy_reads_ready_saturated_drained_maintenance_and_stopping_from_the_agents() {
    if !needs_fleet_tools() {
        return;
    }
    // Beside the example's backends, one for a model no host has: its agent says `down`.
    let mut fleet = fleet_with_haproxy_and(|f| {
        let h = &f.hosts[0];
        format!(
            "\nbackend ghost\n    server h1 {} check inter 1s agent-check agent-inter 1s \
             agent-port {} agent-send \"ghost\\n\"\n",
            h.listen,
            h.agent.port()
        )
    });
    fleet.wait_server("ghost", 0, "down by its agent", WAIT, |s| s.op_state == 0);
    // Ready: 2 routed × 4 free slots + 1 warm × 4, of max 6 × 4 = 24: HAProxy's weight 12.
    for i in 0..3 {
        fleet.wait_server("toy", i, "ready at weight 12 of 24", WAIT, |s| {
            s.up() && s.uweight == 12 && s.iweight == 24
        });
    }
    assert_eq!(
        fleet.hosts[0].agent("nope\n").unwrap(),
        "down #unknown model nope\n"
    );

    // Saturated: clients straight at host 1's front door hold every slot it has and queue;
    // its weight drops to one slot's worth, and requests through HAProxy go elsewhere.
    let h1 = fleet.hosts[0].listen;
    let flood_stop = Arc::new(AtomicBool::new(false));
    let flood: Vec<_> = (0..40)
        .map(|_| {
            let stop = flood_stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"model": "toy", "prompt": "x", "max_tokens": 150});
                    let _ = post(h1, "/v1/completions", &body, Duration::from_secs(60));
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    wait_until("host 1's queue non-empty", WAIT, || {
        (fleet.hosts[0].metric("hearth_route_queue_depth{model=\"toy\"}")? > 0.0).then_some(())
    });
    let saturated = Instant::now();
    let s = fleet.wait_server("toy", 0, "at one slot's worth", WAIT, |s| s.uweight <= 1);
    eprintln!(
        "host 1 saturated {:?} after the flood began; HAProxy's weight {} of {} {:?} later \
         (agent-inter {AGENT_INTER:?})",
        saturated - t0,
        s.uweight,
        s.iweight,
        saturated.elapsed()
    );
    assert!(s.up(), "saturated is never drain or down: {s:?}");
    let before: Vec<f64> = fleet.hosts.iter().map(|h| h.answered("toy", 200)).collect();
    let shifted = Clients::start(fleet.frontend, 4, 4);
    shifted.more(40);
    let (ok, failed) = shifted.finish();
    assert!(failed.is_empty(), "{failed:?}");
    let through: Vec<f64> = fleet
        .hosts
        .iter()
        .zip(&before)
        .map(|(h, b)| h.answered("toy", 200) - b)
        .collect();
    let elsewhere = through[1] + through[2];
    eprintln!(
        "through HAProxy while host 1 was saturated: hosts 2 and 3 answered {elsewhere} of {ok}"
    );
    assert!(
        elsewhere >= 0.9 * ok as f64,
        "load did not move away from the saturated host: {through:?} of {ok}"
    );
    flood_stop.store(true, Ordering::Relaxed);
    for t in flood {
        let _ = t.join();
    }
    fleet.wait_server("toy", 0, "weighed up again", WAIT, |s| s.uweight > 1);

    // An operator's drain of the model: DRAIN in HAProxy, then refusing; undrained: ready.
    fleet.hosts[0].daemon.cli_ok(&["drain", "--model", "toy"]);
    fleet.wait_server("toy", 0, "drained", WAIT, |s| s.drain() && s.op_state == 2);
    wait_until("host 1 refusing", WAIT, || {
        (fleet.hosts[0].metric("hearth_route_draining{model=\"toy\"}")? == 2.0).then_some(())
    });
    assert_eq!(
        fleet.hosts[0].model("toy")["drained"],
        true,
        "status shows it"
    );
    fleet.hosts[0].daemon.cli_ok(&["undrain", "--model", "toy"]);
    fleet.wait_server("toy", 0, "ready again", WAIT, |s| s.up() && s.uweight > 1);

    // The daemon briefly gone keeps the last view; gone past stale_after (5 s): MAINT.
    let lost = Instant::now();
    fleet.hosts[1].daemon.signal(Signal::SIGKILL);
    fleet.hosts[1].daemon.wait_exit(Duration::from_secs(10));
    std::thread::sleep(AGENT_INTER * 2);
    let brief = fleet.server("toy", 1).unwrap();
    assert!(
        lost.elapsed() < Duration::from_secs(5) && brief.up(),
        "a daemon gone for {:?} is not maintenance: {brief:?}",
        lost.elapsed()
    );
    let s = fleet.wait_server("toy", 1, "in maintenance", WAIT, |s| s.maint());
    eprintln!("MAINT {:?} after the daemon died: {s:?}", lost.elapsed());
    fleet.hosts[1].daemon.restart();
    fleet.wait_server("toy", 1, "back from maintenance", WAIT, |s| s.up());

    // Stopping (SIGTERM): DRAIN first, then the process leaves; the health check marks it
    // down; started again, it is back.
    fleet.hosts[2].router().signal(Signal::SIGTERM);
    fleet.wait_server("toy", 2, "drained by the stop", WAIT, |s| s.drain());
    let exited = fleet.hosts[2]
        .router
        .as_mut()
        .unwrap()
        .wait_exit(Duration::from_secs(40));
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    fleet.wait_server("toy", 2, "down once gone", WAIT, |s| s.op_state == 0);
    fleet.hosts[2].start_router();
    fleet.wait_server("toy", 2, "up again", WAIT, |s| s.up());
}

#[test]
fn drain_stop_and_upgrade_of_one_host_under_load_fail_no_request() {
    if !needs_fleet_tools() {
        return;
    }
    let mut fleet = fleet_with_haproxy();
    // `hearth upgrade` hands replicas over only where they live in a cgroup.
    if !needs_cgroup2(&fleet.hosts[1].daemon) {
        return;
    }
    let clients = Clients::start(fleet.frontend, 6, 8);
    clients.more(30);

    // `hearth drain --model` of host 1, until it refuses; then back.
    fleet.hosts[0].daemon.cli_ok(&["drain", "--model", "toy"]);
    wait_until("host 1 drained and refusing", WAIT, || {
        (fleet.hosts[0].metric("hearth_route_draining{model=\"toy\"}")? == 2.0).then_some(())
    });
    clients.more(20);
    fleet.hosts[0].daemon.cli_ok(&["undrain", "--model", "toy"]);
    fleet.wait_server("toy", 0, "ready again", WAIT, |s| s.up());
    assert_eq!(clients.failed(), 0, "drain: {:?}", clients.failures);

    // `hearth upgrade` of host 2's daemon: no drain, and never MAINT.
    let pid = fleet.hosts[1].daemon.pid();
    fleet.hosts[1].daemon.cli_ok(&["upgrade"]);
    let upgraded = Instant::now();
    while upgraded.elapsed() < Duration::from_secs(8) {
        let s = fleet.server("toy", 1).unwrap();
        assert!(!s.maint() && !s.drain(), "upgrade: {s:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        fleet.hosts[1].daemon.pid(),
        pid,
        "the same process, re-executed"
    );
    let routed = fleet.hosts[1].model("toy")["routed"].as_u64().unwrap();
    assert!(routed >= 2, "replicas kept their roles: {routed} routed");
    clients.more(20);
    assert_eq!(clients.failed(), 0, "upgrade: {:?}", clients.failures);

    // SIGTERM of host 3's front door, as `systemctl stop` sends it.
    fleet.hosts[2].router().signal(Signal::SIGTERM);
    let exited = fleet.hosts[2]
        .router
        .as_mut()
        .unwrap()
        .wait_exit(Duration::from_secs(40));
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    clients.more(20);
    fleet.hosts[2].start_router();
    fleet.wait_server("toy", 2, "up again", WAIT, |s| s.up());
    clients.more(20);
    let (ok, failed) = clients.finish();
    eprintln!("{ok} answers through HAProxy across drain, upgrade and stop");
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
}

#[test]
fn kill_9_of_a_front_door_is_marked_down_and_fails_at_most_what_it_held() {
    if !needs_fleet_tools() {
        return;
    }
    let mut fleet = fleet_with_haproxy();
    let clients = Clients::start(fleet.frontend, 6, 60);
    clients.more(20);
    let h = &fleet.hosts[0];
    // Killed while it holds requests (streams among them, whose first bytes went out).
    let held = wait_until("host 1 holding requests", WAIT, || {
        let n = h.metric("hearth_route_in_flight{model=\"toy\"}")?
            + h.metric("hearth_route_queue_depth{model=\"toy\"}")?;
        (n >= 1.0).then_some(n)
    });
    fleet.hosts[0].router.as_mut().unwrap().kill();
    let killed = Instant::now();
    let s = fleet.wait_server("toy", 0, "down", WAIT, |s| s.op_state == 0);
    eprintln!("marked down {:?} after kill -9: {s:?}", killed.elapsed());
    clients.more(30);
    let (ok, failed) = clients.finish();
    eprintln!(
        "kill -9: {} failed of {ok}, host 1 held {held} just before: {failed:?}",
        failed.len()
    );
    // One more than sampled: a request may reach it between the sample and the kill.
    assert!(
        failed.len() as f64 <= held + 1.0,
        "{} failures, host 1 held {held}: {failed:?}",
        failed.len()
    );
}

#[test]
fn prometheus_records_the_fleet_and_the_openai_client_works_through_haproxy() {
    if !needs_fleet_tools() {
        return;
    }
    let python = openai_python();
    let mut fleet = fleet_with_haproxy();
    fleet.start_prometheus();
    // Traffic while Prometheus scrapes: the queue-wait quantiles are rates.
    let clients = Clients::start(fleet.frontend, 3, 8);

    let script = repo_dir().join("tests/fixtures/openai_toy_client.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}/v1", fleet.frontend))
        .arg("toy")
        .output()
        .expect("run the openai client");
    assert!(
        out.status.success(),
        "openai client through HAProxy failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["models"], json!(["toy"]), "{v}");
    assert_eq!(v["retrieve"]["id"], "toy", "{v}");

    // Refusals on host 1: drained, and asked directly.
    let h1 = &fleet.hosts[0];
    h1.daemon.cli_ok(&["drain", "--model", "toy"]);
    wait_until("host 1 refusing", WAIT, || {
        (h1.metric("hearth_route_draining{model=\"toy\"}")? == 2.0).then_some(())
    });
    for _ in 0..3 {
        let r = complete(h1.listen, "toy", Duration::from_secs(10)).unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "drained");
    }
    h1.daemon.cli_ok(&["undrain", "--model", "toy"]);

    // The recording rules' fleet values against the hosts' own.
    let one = |q: &str, labels: &str| -> Option<f64> {
        let rs = fleet.query(q);
        rs.iter()
            .find(|(m, _)| labels.is_empty() || m.to_string().contains(labels))
            .map(|(_, v)| *v)
    };
    let sum = |state: &str| -> f64 {
        fleet
            .hosts
            .iter()
            .map(|h| h.model("toy")[state].as_f64().unwrap())
            .sum()
    };
    for (rule, state) in [
        ("model:hearth_replicas_routed:sum", "routed"),
        ("model:hearth_replicas_warm:sum", "warm"),
    ] {
        let got = wait_until(&format!("{rule} = Σ status {state}"), WAIT, || {
            let v = one(rule, "\"model\":\"toy\"")?;
            (v == sum(state)).then_some(v)
        });
        eprintln!("{rule} = {got}");
    }
    for (i, h) in fleet.hosts.iter().enumerate() {
        let own: f64 = [429, 503].iter().map(|s| h.answered("toy", *s)).sum();
        let instance = format!("\"instance\":\"{}\"", h.ip);
        let got = wait_until(&format!("host {} refusals recorded", i + 1), WAIT, || {
            let v = one("instance:hearth_route_requests_refused:total", &instance).unwrap_or(0.0);
            (v == own).then_some(v)
        });
        if i == 0 {
            assert!(got >= 3.0, "host 1 refused 3: {got}");
        }
    }
    for q in [
        "model:hearth_route_queue_wait_seconds:p50_1m",
        "model:hearth_route_queue_wait_seconds:p99_1m",
    ] {
        let v = wait_until(q, WAIT, || {
            one(q, "\"model\":\"toy\"").filter(|v| v.is_finite())
        });
        eprintln!("{q} = {v}");
    }
    let (ok, failed) = clients.finish();
    assert!(failed.is_empty(), "{failed:?} of {ok}");
}
