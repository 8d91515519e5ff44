//! The front door and the daemon together: the router's reports are the signal hearth scales
//! on (a model at zero with a warm pool serves its first request as soon as the pool's replica
//! is promoted, no cold start; a wait over the target promotes at once), and the router can
//! restart without touching a replica.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::route::*;

const T: Duration = Duration::from_secs(60);

#[test]
fn the_first_request_for_a_model_at_zero_waits_only_for_the_promotion() {
    // Cold starts take 3 s here (the toy's load time); a promotion takes milliseconds.
    let mut m =
        Model::front_toy("z", &["--load-time", "3s", "--service-time", "50ms"]).scale(0, 2, 1);
    m.scaling.idle_to_zero = Some("30m".into());
    let (daemon, router, addr) = front_door([m], "");
    let warm = wait_until("one warm replica, none routed", T, || {
        let model = daemon.model("z");
        let warm = daemon.in_state("z", "warm");
        (model["routed"] == 0 && warm.len() == 1)
            .then(|| warm[0]["id"].as_str().unwrap().to_string())
    });
    let watch = daemon.watch(None);
    wait_until("the router following the daemon", T, || {
        (router.metric("hearth_route_daemon_connected")? == 1.0).then_some(())
    });
    assert_eq!(
        router.metric("hearth_route_routed_replicas{model=\"z\"}"),
        Some(0.0)
    );

    // Nothing is routed: the request is held, the daemon hears of it at once, promotes the warm
    // replica, and the request goes there.
    let sent = Instant::now();
    let r = complete(addr, "z", T).unwrap();
    let answered = sent.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-hearth-replica"),
        Some(warm.as_str()),
        "served by the pool's replica"
    );
    let (routed_at, ev) = watch
        .wait_for(0, Duration::ZERO, |v| {
            v["event"] == "routed" && endpoint_ids(v).contains(&warm)
        })
        .map(|(_, e)| (e.at, e.v))
        .expect("the warm replica was routed");
    assert!(routed_at >= sent, "routed only after the request: {ev}");
    // The wait was the promotion's, far below a cold start's 3 s (the pool's refill starts
    // cold behind the promotion; the request does not wait for it).
    let waited = router
        .metric("hearth_route_queue_wait_seconds_sum{model=\"z\"}")
        .unwrap();
    assert!(waited < 3.0, "waited {waited} s, as long as a cold start");
    let model = daemon.model("z");
    assert_eq!(
        model["last_scale"]["reason"], "work arrived for a model at zero",
        "{model}"
    );
    eprintln!(
        "first request at zero: answered in {answered:?}, queue wait {:.1} ms",
        waited * 1000.0
    );
}

#[test]
fn a_wait_over_the_target_promotes_a_warm_replica_from_the_routers_report() {
    let m = Model::front_toy("w", &["--service-time", "1s"])
        .scale(1, 2, 1)
        .target_wait("300ms");
    let (daemon, router, addr) = front_door([m], "");
    daemon.wait_routed("w", 1, T);
    wait_until("one warm", T, || {
        (daemon.in_state("w", "warm").len() == 1).then_some(())
    });
    wait_until("the router routing one replica", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"w\"}")? == 1.0).then_some(())
    });
    // One slot, three requests: two wait, and the oldest wait crosses 300 ms long before the
    // first request's second of service ends.
    let reqs: Vec<_> = (0..3)
        .map(|_| spawn(move || complete(addr, "w", T)))
        .collect();
    let routed = daemon.wait_routed("w", 2, T);
    let mut served = std::collections::BTreeSet::new();
    for h in reqs {
        let r = h.join().unwrap().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        served.insert(r.header("x-hearth-replica").unwrap().to_string());
    }
    assert_eq!(
        served.len(),
        2,
        "the promoted replica served too: {served:?}"
    );
    let model = daemon.model("w");
    let reason = model["last_scale"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains("oldest wait"), "{model}");
    assert_eq!(routed.len(), 2);
}

#[test]
fn the_router_restarts_without_touching_a_replica() {
    let (daemon, mut router, addr) = front_door(
        [Model::front_toy("r", &["--service-time", "20ms"]).scale(2, 2, 0)],
        "",
    );
    let before: Vec<Value> = daemon.wait_routed("r", 2, T);
    let pids = |v: &[Value]| -> Vec<(String, i64)> {
        let mut p: Vec<(String, i64)> = v
            .iter()
            .map(|r| {
                (
                    r["id"].as_str().unwrap().to_string(),
                    r["pid"].as_i64().unwrap(),
                )
            })
            .collect();
        p.sort();
        p
    };
    wait_until("the router routing", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"r\"}")? == 2.0).then_some(())
    });
    assert_eq!(complete(addr, "r", T).unwrap().status, 200);
    router.kill();
    assert!(
        complete(addr, "r", Duration::from_secs(2)).is_err(),
        "the router is gone"
    );
    let router = Router::start(&daemon);
    let r = wait_until("an answer through the new router", T, || {
        complete(addr, "r", T).ok().filter(|r| r.status == 200)
    });
    assert!(r.header("x-hearth-replica").unwrap().starts_with("r-"));
    let after = daemon.in_state("r", "routed");
    assert_eq!(
        pids(&after),
        pids(&before),
        "the same replicas, the same processes"
    );
    assert_eq!(daemon.model("r")["restarts_total"], json!(0));
    drop(router);
}

#[test]
fn sigterm_lets_requests_in_progress_finish_and_takes_no_new_connection() {
    let (daemon, mut router, addr) = front_door(
        [Model::front_toy("g", &["--service-time", "2s"]).scale(1, 1, 0)],
        "shutdown_grace = \"20s\"\n",
    );
    daemon.wait_routed("g", 1, T);
    wait_until("the router routing", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"g\"}")? == 1.0).then_some(())
    });
    let held = spawn(move || complete(addr, "g", T));
    wait_until("the request at the replica", T, || {
        (router.metric("hearth_route_in_flight{model=\"g\"}")? == 1.0).then_some(())
    });
    router.signal(Signal::SIGTERM);
    wait_until("the listener closed", T, || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
            .is_err()
            .then_some(())
    });
    let r = held.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let status = router.wait_exit(T).expect("the router's exit");
    assert!(status.success(), "{status}");
}
