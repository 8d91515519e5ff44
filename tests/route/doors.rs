//! Two front doors (two real `hearth route` processes) on one model and one daemon: their
//! reports combine (the oldest wait of either, depths summed) instead of taking the signal from
//! each other twenty times a second, the daemon logs the pair once rather than a line per
//! switch, a report from anyone else is answered as not counted, and one door stopping leaves
//! the other's signal without a gap.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::route::*;

const T: Duration = Duration::from_secs(60);

fn signal(daemon: &Daemon) -> Value {
    daemon.model("d")["signal"].clone()
}

fn front_door_lines(daemon: &Daemon) -> usize {
    daemon
        .log()
        .lines()
        .filter(|l| l.contains("front door"))
        .count()
}

#[test]
fn two_front_doors_on_one_model_combine_and_do_not_flap() {
    // One routed replica with one slot, answers taking 3 s: each door sends it one request
    // and queues the next.
    let m = Model::front_toy("d", &["--service-time", "3s"])
        .scale(1, 1, 0)
        .stale_after("2s");
    let (daemon, a, _) = front_door([m], "");
    let mut b = Router::another(&daemon);
    daemon.wait_routed("d", 1, T);
    let names = wait_until("both front doors in the signal", T, || {
        let routers = signal(&daemon)["routers"].as_array()?.clone();
        (routers.len() == 2).then_some(routers)
    });
    let name_a = format!("hearth route {}", a.addr);
    let name_b = format!("hearth route {}", b.addr);
    let mut want = vec![json!(name_a), json!(name_b)];
    want.sort_by_key(|v| v.to_string());
    assert_eq!(names, want);

    // Two requests through each door: one at the replica and one queued, per door.
    let clients: Vec<_> = [a.addr, a.addr, b.addr, b.addr]
        .into_iter()
        .map(|addr| spawn(move || complete(addr, "d", T)))
        .collect();
    let depth = wait_until("the doors' queues summed", T, || {
        let s = signal(&daemon);
        (s["queue_depth"].as_u64()? >= 2).then_some(s)
    });
    assert_eq!(depth["queue_depth"], 2, "one waiting at each door: {depth}");
    for c in clients {
        let r = c.join().unwrap().expect("an answer");
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // Both doors kept reporting every 100 ms all along: the probe saw a switch each time, and
    // a log line each. Now the pair is said once (a line at the first door, one at the second,
    // within the log's ten-second limit).
    let lines = front_door_lines(&daemon);
    assert!(
        lines <= 3,
        "{lines} front-door lines:\n{}",
        daemon.log_tail(40)
    );

    // A report from anyone else is not counted, and the CLI says so.
    let out = daemon.cli(&["report", "d", "--wait-ms", "5000", "--depth", "9"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("report not counted"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&name_a) && out.stderr.contains(&name_b),
        "{}",
        out.stderr
    );
    let answer = daemon.request(json!({"op": "report", "model": "d", "queue_depth": 9}));
    assert_eq!(answer["ok"], true, "{answer}");
    assert_eq!(answer["superseded_by"], json!(want), "{answer}");

    // Door b stops: door a's reports alone are the signal, with no moment without one.
    b.kill();
    let alone = wait_until("door a alone", Duration::from_secs(20), || {
        let s = signal(&daemon);
        assert!(s["age_ms"].is_u64(), "a moment without a fresh signal: {s}");
        (s["routers"] == json!([name_a])).then_some(s)
    });
    assert_eq!(alone["router"], json!(name_a), "{alone}");
    let r = complete(a.addr, "d", T).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}
