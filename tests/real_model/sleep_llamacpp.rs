//! The sleeping tier with the genuine llama.cpp server (scripts/llama-server.sh builds it) and
//! its own `--sleep-idle-seconds`: hearth neither sends it to sleep nor wakes it by a request of
//! its own (the `llamacpp` preset: no sleep or wake requests, `/props` says `is_sleeping`). A
//! model with `min = 2` keeps one routed and one pooled asleep; the pooled one falls asleep by
//! itself, status says `sleeping`, `/props` agrees and its RSS (from /proc) drops. A burst queued
//! behind the routed replica's single slot (scraped, `llamacpp:requests_deferred`) makes the
//! policy want two: the sleeper is woken by the warm-up's completion and routed, without a cold
//! start (max = 2). The wake time is printed, never asserted.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::status::{id, replicas_of};
use testkit::*;

const MODEL: &str = "drowsy";

/// VmRSS of a process, in bytes, from /proc.
fn rss(pid: u64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

fn props_sleeping(addr: &str) -> Option<bool> {
    let r = http(addr, "GET", "/props", None, Duration::from_secs(5)).ok()?;
    let v: Value = serde_json::from_str(&r.body).ok()?;
    v["is_sleeping"].as_bool()
}

fn model(bin: &Path) -> Model {
    let mut m = Model::llama_one_slot(MODEL)
        .scale(2, 2, 0)
        .target_wait("300ms")
        .sleep("format = \"llamacpp\"\nsleep_timeout = \"30s\"\nwake_timeout = \"30s\"");
    m.command[0] = bin.display().to_string();
    m.command
        .extend(["--sleep-idle-seconds".into(), "2".into()]);
    m
}

#[test]
fn a_pooled_llama_server_falls_asleep_by_itself_and_a_burst_wakes_and_routes_it() {
    let bin = genuine_llama_server();
    if !needs(bin.is_some(), || {
        "the genuine llama-server (scripts/llama-server.sh builds it into target/llama-server; \
         HEARTH_LLAMA_SERVER names another)"
            .into()
    }) {
        return;
    }
    let bin = bin.unwrap();
    let d = Daemon::builder().tick("100ms").model(model(&bin)).start();
    let m = d.wait_model(
        MODEL,
        "1 routed and 1 asleep",
        Duration::from_secs(120),
        |m| {
            m["routed"] == 1
                && replicas_of(m)
                    .iter()
                    .filter(|r| r["state"] == "sleeping")
                    .count()
                    == 1
        },
    );
    let find = |m: &Value, state: &str| {
        replicas_of(m)
            .into_iter()
            .find(|r| r["state"] == state)
            .unwrap_or_else(|| panic!("a {state} replica: {m:#}"))
    };
    let (sleeper, routed) = (find(&m, "sleeping"), find(&m, "routed"));
    let sleeper_id = id(&sleeper);
    let sleeper_addr = sleeper["addr"].as_str().unwrap().to_string();
    let routed_addr = routed["addr"].as_str().unwrap().to_string();
    let sleeper_pid = sleeper["pid"].as_u64().expect("the sleeper's pid");
    assert_eq!(props_sleeping(&sleeper_addr), Some(true), "{m:#}");
    // /health stays 200 asleep: it is what keeps it alive in hearth's eyes.
    assert_eq!(
        http(
            &sleeper_addr,
            "GET",
            "/health",
            None,
            Duration::from_secs(5)
        )
        .unwrap()
        .status,
        200
    );

    // Its memory is freed: against the routed one's just after a completion (awake, model loaded).
    let (code, _, body) = llama_complete(&routed_addr, 8).expect("a completion on the routed one");
    assert_eq!(code, 200, "{body}");
    let awake = rss(routed["pid"].as_u64().unwrap()).expect("the routed one's RSS");
    let asleep = rss(sleeper_pid).expect("the sleeper's RSS");
    println!("rss: awake (routed, after a completion) {awake} B; asleep {sleeper_id} {asleep} B");
    assert!(
        asleep < awake,
        "asleep {asleep} B is not below awake {awake} B"
    );
    assert_eq!(
        props_sleeping(&sleeper_addr),
        Some(true),
        "asking did not wake it"
    );

    // The burst: long completions at the routed replica's single slot; all but one queue, and
    // go on queueing (closed-loop) until the sleeper is woken and routed.
    let n_predict = tokens_for(&routed_addr, Duration::from_millis(600), 1900);
    let burst = Instant::now();
    let load = Burst::start(&routed_addr, n_predict, 6, Duration::from_secs(70));
    let m = d.wait_model(MODEL, "2 routed", Duration::from_secs(60), |m| {
        m["routed"] == 2
    });
    let routed_at = burst.elapsed();
    let answers = load.answers();
    assert!(answers.len() >= 6, "{} answers", answers.len());
    for (i, (code, tokens, body)) in answers.iter().enumerate() {
        assert_eq!(*code, 200, "request {i}: {body}");
        assert_eq!(*tokens, n_predict as u64, "request {i}");
    }
    // The same process, woken: no cold start.
    let woken = replicas_of(&m)
        .into_iter()
        .find(|r| id(r) == sleeper_id)
        .unwrap_or_else(|| panic!("{sleeper_id} is still there: {m:#}"));
    assert_eq!(woken["state"], "routed", "{m:#}");
    assert_eq!(woken["pid"].as_u64(), Some(sleeper_pid), "the same process");
    let wake = &m["wake"];
    assert_eq!(wake["wakes"], 1, "{m:#}");
    assert_eq!(wake["failed"], 0, "{m:#}");
    let (code, _, body) = llama_complete(&sleeper_addr, 4).expect("a completion on the woken one");
    assert_eq!(code, 200, "{body}");
    println!(
        "wake → routed: status wake last {} ms; wall clock burst → 2 routed {:.2} s; \
         RSS asleep {asleep} B, awake {awake} B",
        wake["last_ms"],
        routed_at.as_secs_f64()
    );
}
