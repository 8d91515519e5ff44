//! More models than GPUs, end to end (docs/sleep.md, "More models than GPUs"): four models on
//! two declared devices that hold one awake each. `p` is pinned and keeps one device; `a`, `b`
//! and `c` have a sleeping tier (real toy servers speaking vLLM's sleep endpoints: a cold start
//! of 8 s, a sleep of 1 s, a wake of 2 s) and take turns on the other. Requests rotate over all
//! four through the front door: every one is answered, each switch puts the idle model to
//! sleep and wakes the one asked for (the same processes throughout: no cold start after the
//! first), and `p` is never put to sleep; `/v1/models` says which are routed and which
//! asleep. The switch times are printed beside the cold start, never asserted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::route::*;
use testkit::status::{self, id, replicas_of};

const T: Duration = Duration::from_secs(180);
const SLEEPY: [&str; 3] = ["a", "b", "c"];

fn sleepy(name: &str) -> Model {
    Model::front_toy(
        name,
        &[
            "--host",
            "127.0.0.1",
            "--load-time",
            "8s",
            "--sleep-time",
            "1s",
            "--wake-time",
            "2s",
        ],
    )
    .gpus(1, "8GiB")
    .scale(1, 1, 0)
    .stale_after("2s")
    .startup_timeout("1m")
    .sleep(
        "format = \"vllm\"\nsleep_timeout = \"30s\"\nwake_timeout = \"30s\"\n\
         gpu_memory_asleep = \"512MiB\"\n\
         host_memory = \"64MiB\"",
    )
}

/// Each replica of the four models: (model, state, pid), by id.
fn replicas(d: &Daemon) -> BTreeMap<String, (String, String, Option<u64>)> {
    let status = d.status();
    let mut out = BTreeMap::new();
    for m in status["models"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or("").to_string();
        for r in replicas_of(m) {
            out.insert(
                id(&r),
                (
                    name.clone(),
                    r["state"].as_str().unwrap_or("").to_string(),
                    r["pid"].as_u64(),
                ),
            );
        }
    }
    out
}

fn states(t: &BTreeMap<String, (String, String, Option<u64>)>, model: &str) -> Vec<String> {
    let mut v: Vec<String> = t
        .values()
        .filter(|(m, _, _)| m == model)
        .map(|(_, s, _)| s.clone())
        .collect();
    v.sort();
    v
}

/// One model of the three routed, the other two asleep, and `p` routed.
fn settled(t: &BTreeMap<String, (String, String, Option<u64>)>) -> bool {
    let routed = SLEEPY.iter().filter(|m| states(t, m) == ["routed"]).count();
    let asleep = SLEEPY
        .iter()
        .filter(|m| states(t, m) == ["sleeping"])
        .count();
    states(t, "p") == ["routed"] && routed == 1 && asleep == 2
}

#[test]
fn four_models_on_two_gpus_take_turns_by_sleep_and_wake_and_the_pinned_one_stays() {
    let mut pinned = Model::front_toy("p", &["--host", "127.0.0.1"])
        .gpus(1, "8GiB")
        .scale(1, 1, 0)
        .stale_after("2s");
    // Placed first, so that it has a device of its own from the start.
    pinned.priority = Some(10);
    pinned.pin = Some(true);
    let models = [pinned, sleepy("a"), sleepy("b"), sleepy("c")];
    let daemon = front_door_daemon(models, "")
        .gpus("static", &[("GPU-0", "10GiB"), ("GPU-1", "10GiB")])
        .start();
    let router = Router::start(&daemon);
    let boot = Instant::now();
    // At boot each model starts once: two fit, and the front door's reports show the idle
    // ones, which give way (asleep) to the next.
    let t = wait_until("p routed, one of a, b, c routed and two asleep", T, || {
        let t = replicas(&daemon);
        settled(&t).then_some(t)
    });
    println!("settled after {:?} (cold start 8 s each)", boot.elapsed());
    let pids: BTreeMap<String, Option<u64>> = t
        .iter()
        .map(|(id, (_, _, pid))| (id.clone(), *pid))
        .collect();
    assert!(pids.values().all(Option::is_some), "{t:?}");

    // The front door's `/v1/models` says where each is: the awake ones routed, the others
    // asleep.
    let tiers = |addr| -> Option<BTreeMap<String, String>> {
        let v: Value = serde_json::from_slice(&get(addr, "/v1/models").ok()?.body).ok()?;
        v["data"]
            .as_array()?
            .iter()
            .map(|m| {
                Some((
                    m["id"].as_str()?.to_string(),
                    m["hearth"]["tier"].as_str()?.to_string(),
                ))
            })
            .collect()
    };
    let want: BTreeMap<String, String> = t
        .values()
        .map(|(m, s, _)| {
            let tier = if s == "routed" { "routed" } else { "asleep" };
            (m.clone(), tier.to_string())
        })
        .collect();
    wait_until("/v1/models shows each model's tier", T, || {
        (tiers(router.addr)? == want).then_some(())
    });

    // Two rounds of requests over all four, one at a time.
    let mut switches: Vec<(String, Duration)> = Vec::new();
    let mut awake = SLEEPY
        .iter()
        .find(|m| states(&t, m) == ["routed"])
        .map(|m| m.to_string())
        .unwrap();
    for round in 0..2 {
        for model in ["a", "b", "c", "p"] {
            let asked = Instant::now();
            let r = complete(router.addr, model, Duration::from_secs(90))
                .unwrap_or_else(|e| panic!("round {round}, {model}: {e}\n{}", daemon.log_tail(60)));
            let took = asked.elapsed();
            assert_eq!(r.status, 200, "round {round}, {model}: {}", r.text());
            if model != "p" && model != awake {
                switches.push((format!("{awake} → {model}"), took));
                awake = model.to_string();
            }
            // The same processes throughout: no replica started, none stopped; `p` routed.
            let now = replicas(&daemon);
            let now_pids: BTreeMap<String, Option<u64>> = now
                .iter()
                .map(|(id, (_, _, pid))| (id.clone(), *pid))
                .collect();
            assert_eq!(now_pids, pids, "round {round}, {model}: {now:?}");
            assert_eq!(states(&now, "p"), ["routed"], "{now:?}");
        }
    }
    assert!(switches.len() >= 4, "{switches:?}");
    // What the daemon says of it: each switch put a model to sleep for a wake of another, and
    // nothing of `p`'s slept.
    let log = daemon.log();
    assert!(
        log.contains("put to sleep for a wake of model"),
        "{}",
        daemon.log_tail(80)
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("p-1") && (l.contains("sleep") || l.contains("reclaimed"))),
        "the pinned model gave way: {}",
        daemon.log_tail(80)
    );
    let mut times: Vec<Duration> = switches.iter().map(|s| s.1).collect();
    times.sort();
    let status: Value = daemon.status();
    let wakes: Vec<String> = SLEEPY
        .iter()
        .map(|m| format!("{m}: {}", status::model(&status, m)["wake"]))
        .collect();
    println!(
        "switches (request → answer, sleep 1 s + wake 2 s + warm-up): {switches:?}; \
         p99 (the slowest of {}) {:?}, against a cold start of 8 s plus its warm-up; wakes {wakes:?}",
        times.len(),
        times.last().unwrap()
    );
    drop(router);
}
