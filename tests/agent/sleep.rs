//! The sleeping tier end to end (docs/sleep.md), with the real binary and real toy servers that
//! speak vLLM's sleep endpoints: a cold start of 30 s, a sleep of 1 s, a wake of 2 s. A model
//! with `min = 3` and one routed holds two asleep (memory freed: the toys' `--hold-memory`);
//! a burst that needs three wakes both, routes them, and starts no process. The wake time
//! (first wake request → warm-up passed, as status says, and the wall clock from the burst to
//! three routed) is printed, never asserted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use testkit::status::{id, replicas_of};
use testkit::*;

/// What the toys hold awake and free asleep.
const HELD: u64 = 96 << 20;

fn model() -> Model {
    Model::toy(
        "m",
        &[
            "--host",
            "127.0.0.1",
            "--load-time",
            "30s",
            "--sleep-time",
            "1s",
            "--wake-time",
            "2s",
            "--service-time",
            "500ms",
            "--hold-memory",
            "96MiB",
        ],
    )
    .scale(3, 3, 0)
    .startup_timeout("2m")
    .sleep("format = \"vllm\"\nsleep_timeout = \"30s\"\nwake_timeout = \"30s\"")
}

/// Each replica's (state, pid, rss), by id.
fn table(m: &Value) -> BTreeMap<String, (String, Option<u64>, Option<u64>)> {
    replicas_of(m)
        .iter()
        .map(|r| {
            (
                id(r),
                (
                    r["state"].as_str().unwrap_or("").to_string(),
                    r["pid"].as_u64(),
                    r["rss_bytes"].as_u64(),
                ),
            )
        })
        .collect()
}

/// The server at `addr` answers as vLLM asleep: asleep on `/is_sleeping`, completions refused,
/// health 200.
fn assert_asleep_as_vllm_says(addr: &str) {
    let state = http(addr, "GET", "/is_sleeping", None, Duration::from_secs(5)).unwrap();
    assert_eq!(state.body, r#"{"is_sleeping":true}"#);
    assert_eq!(complete(addr, Duration::from_secs(5)).unwrap().status, 503);
    let health = http(addr, "GET", "/health", None, Duration::from_secs(5)).unwrap();
    assert_eq!(health.status, 200);
}

#[test]
fn a_burst_wakes_the_sleeping_replicas_and_starts_none() {
    let d = Daemon::builder().model(model()).start();
    let m = d.wait_model(
        "m",
        "1 routed and 2 asleep",
        Duration::from_secs(120),
        |m| {
            let asleep = table(m)
                .values()
                .filter(|(s, _, _)| s == "sleeping")
                .count();
            m["routed"] == 1 && asleep == 2
        },
    );
    let before = table(&m);
    let asleep: Vec<String> = before
        .iter()
        .filter(|(_, (s, _, _))| s == "sleeping")
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(asleep.len(), 2, "{m:#}");
    let routed_id = before
        .iter()
        .find(|(_, (s, _, _))| s == "routed")
        .map(|(id, _)| id.clone())
        .unwrap();
    // The toys asked answer like vLLM: asleep, completions refused, health 200.
    let addr_of = |id: &str| {
        replicas_of(&m)
            .into_iter()
            .find(|r| testkit::status::id(r) == id)
            .and_then(|r| r["addr"].as_str().map(str::to_string))
            .unwrap()
    };
    let sleeper = addr_of(&asleep[0]);
    assert_asleep_as_vllm_says(&sleeper);
    // Their memory is freed: the sleeping ones hold less than the routed one by about HELD
    // (usage is sampled every 2 s, so the first samples may be from before they slept).
    let freed = |m: &Value| {
        let t = table(m);
        let awake = t.get(&routed_id).and_then(|r| r.2)?;
        let slept: Option<Vec<u64>> = asleep
            .iter()
            .map(|id| t.get(id).and_then(|r| r.2))
            .collect();
        let slept = slept?;
        slept
            .iter()
            .all(|s| s + HELD / 2 < awake)
            .then_some((awake, slept))
    };
    let m_rss = d.wait_model(
        "m",
        "the sleeping ones' memory freed",
        Duration::from_secs(20),
        |m| freed(m).is_some(),
    );
    let (awake, slept) = freed(&m_rss).unwrap();
    println!("rss: routed {routed_id} {awake} B; asleep {asleep:?} {slept:?} B");

    // The burst: 16 clients on the routed replica (one slot, 500 ms each): a wait of seconds,
    // over the 2 s target, which needs three replicas.
    let routed_addr = addr_of(&routed_id);
    let burst = Instant::now();
    let loads: Vec<Load> = (0..16)
        .map(|_| {
            let addr = routed_addr.clone();
            Load::start(move || {
                complete(&addr, Duration::from_secs(60))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    d.wait_model("m", "a wake", Duration::from_secs(60), |m| {
        m["waking"].as_u64().unwrap_or(0) > 0 || m["routed"].as_u64().unwrap_or(0) > 1
    });
    let woke_at = burst.elapsed();
    let m = d.wait_model("m", "3 routed", Duration::from_secs(60), |m| {
        m["routed"] == 3
    });
    let routed_at = burst.elapsed();
    for l in loads {
        l.finish();
    }
    let after = table(&m);
    // No cold start: the same three replicas, the same processes.
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "no replica was added: {m:#}"
    );
    for (id, (state, pid, _)) in &after {
        assert_eq!(state, "routed", "{id}: {m:#}");
        assert_eq!(*pid, before[id].1, "{id} is the same process");
    }
    let wake = &m["wake"];
    assert_eq!(wake["wakes"], 2, "{m:#}");
    assert_eq!(wake["failed"], 0, "{m:#}");
    for id in &asleep {
        let woke = addr_of(id);
        assert_eq!(
            complete(&woke, Duration::from_secs(10)).unwrap().status,
            200
        );
    }
    println!(
        "wake → routed: status wake last {} ms, p50 {} ms, p99 {} ms; wall clock: burst → first \
         wake seen {:.1} s, burst → 3 routed {:.1} s (cold start: 30 s)",
        wake["last_ms"],
        wake["p50_ms"],
        wake["p99_ms"],
        woke_at.as_secs_f64(),
        routed_at.as_secs_f64()
    );
    assert!(
        d.log().contains("awake and warm after"),
        "{}",
        d.log_tail(40)
    );
}

/// `idle_to_sleep`: with no work for 3 s the routed replica drains and sleeps (nothing routed);
/// a request through the front door waits in its queue while that same process wakes, and is
/// answered by it.
#[test]
fn idle_to_sleep_puts_the_model_to_sleep_and_a_request_at_the_front_door_wakes_it() {
    let m = Model::front_toy(
        "m",
        &[
            "--host",
            "127.0.0.1",
            "--sleep-time",
            "500ms",
            "--wake-time",
            "1s",
        ],
    )
    .scale(1, 1, 0)
    .sleep(
        "format = \"vllm\"\nsleep_timeout = \"30s\"\nwake_timeout = \"30s\"\nidle_to_sleep = \"3s\"",
    );
    let (d, _router, addr) = testkit::route::front_door([m], "");
    let m = d.wait_model(
        "m",
        "asleep, nothing routed",
        Duration::from_secs(60),
        |m| m["routed"] == 0 && replicas_of(m).iter().any(|r| r["state"] == "sleeping"),
    );
    let sleeper = replicas_of(&m)[0].clone();
    let reason = m["last_scale"]["reason"].as_str().unwrap_or("").to_string();
    assert!(reason.contains("idle_to_sleep"), "{m:#}");
    let asked = Instant::now();
    let r = testkit::route::complete(addr, "m", Duration::from_secs(60)).unwrap();
    let took = asked.elapsed();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let m = d.model("m");
    let woken = replicas_of(&m)
        .into_iter()
        .find(|r| id(r) == id(&sleeper))
        .unwrap_or_else(|| panic!("{m:#}"));
    assert_eq!(
        woken["pid"], sleeper["pid"],
        "the same process, woken: {m:#}"
    );
    assert_eq!(woken["state"], "routed", "{m:#}");
    assert_eq!(m["wake"]["wakes"], 1, "{m:#}");
    println!(
        "asleep → answered through the front door in {:.2} s (wake 1 s)",
        took.as_secs_f64()
    );
}

/// The pool of a model with a sleeping tier is held asleep from boot (cold starts fill it, then
/// it sleeps), with scripts/gpu-sleep-standin.py as the replicas: the stand-in that
/// gpu-smoke.sh runs on a GPU, here on `--device cpu`. It answers hearth's vLLM requests
/// (sleep, state, wake) and refuses completions while asleep; a queue reported for the model
/// wakes the pool's replica through its warm-up, with no process started.
#[test]
fn the_pool_boots_asleep_and_the_gpu_smoke_standin_sleeps_and_wakes() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-sleep-standin.py");
    let m = Model::toy("m", &[])
        .command(&[
            "python3",
            script,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--gib",
            "0.0625",
            "--device",
            "cpu",
        ])
        .scale(1, 2, 1)
        .target_wait("500ms")
        .sleep("format = \"vllm\"\nsleep_timeout = \"30s\"\nwake_timeout = \"30s\"");
    let d = Daemon::builder().model(m).start();
    let m = d.wait_model(
        "m",
        "one routed and its pool of one asleep",
        Duration::from_secs(60),
        |m| {
            let mut states: Vec<String> = table(m).into_values().map(|r| r.0).collect();
            states.sort();
            states == ["routed", "sleeping"]
        },
    );
    let before = table(&m);
    let sleeper = replicas_of(&m)
        .into_iter()
        .find(|r| r["state"] == "sleeping")
        .and_then(|r| r["addr"].as_str().map(str::to_string))
        .unwrap();
    assert_asleep_as_vllm_says(&sleeper);

    // A queue over target, reported model-wide as a front door would: the pool wakes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let woken = loop {
        d.cli_ok(&[
            "report",
            "m",
            "--wait-ms",
            "5000",
            "--depth",
            "16",
            "--in-flight",
            "16",
        ]);
        let m = d.model("m");
        if table(&m).values().all(|r| r.0 == "routed") {
            break m;
        }
        assert!(Instant::now() < deadline, "no wake: {m:#}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let after = table(&woken);
    let pids = |t: &BTreeMap<String, (String, Option<u64>, Option<u64>)>| {
        t.iter()
            .map(|(id, r)| (id.clone(), r.1))
            .collect::<Vec<_>>()
    };
    assert_eq!(pids(&after), pids(&before), "the same processes: {woken:#}");
    assert_eq!(woken["wake"]["wakes"], 1, "{woken:#}");
    assert_eq!(
        complete(&sleeper, Duration::from_secs(5)).unwrap().status,
        200,
        "awake, its allocation restored"
    );
    println!(
        "stand-in woken in {} ms (wake request → warm-up passed)",
        woken["wake"]["last_ms"]
    );
}
