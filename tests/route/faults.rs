//! Faults through the front door, with real processes: a replica killed with -9 before any byte
//! (retried once, on another replica), after bytes reached the client (never retried: the event
//! stream ends with an error event), a client that leaves (its slot and its request at the
//! replica are freed), and a replica that leaves the routed set (its request finishes, nothing
//! new reaches it). Streams pass chunk by chunk.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::route::*;

const T: Duration = Duration::from_secs(60);

fn pid_of(daemon: &Daemon, model: &str, id: &str) -> i32 {
    daemon
        .replica(model, id)
        .and_then(|r| r["pid"].as_i64())
        .unwrap_or_else(|| panic!("no pid for {id}")) as i32
}

fn addr_of(daemon: &Daemon, model: &str, id: &str) -> std::net::SocketAddr {
    daemon
        .replica(model, id)
        .and_then(|r| r["addr"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no addr for {id}"))
        .parse()
        .unwrap()
}

fn routed_at_router(router: &Router, model: &str, n: f64) {
    wait_until(
        &format!("the router to route {n} replica(s) of {model}"),
        T,
        || {
            (router.metric(&format!(
                "hearth_route_routed_replicas{{model=\"{model}\"}}"
            ))? == n)
                .then_some(())
        },
    );
}

#[test]
fn a_replica_killed_before_any_byte_is_retried_once_on_another() {
    let (daemon, router, addr) = front_door(
        [Model::front_toy("m", &["--service-time", "4s"]).scale(2, 2, 0)],
        "",
    );
    daemon.wait_routed("m", 2, T);
    routed_at_router(&router, "m", 2.0);

    let req = spawn(move || complete(addr, "m", T));
    let first = wait_until("the request at a replica", T, || router.busy_replica("m"));
    signal(pid_of(&daemon, "m", &first), Signal::SIGKILL);
    let r = req.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let served = r.header("x-hearth-replica").unwrap();
    assert_ne!(served, first, "served by another replica");
    assert_eq!(
        router.metric("hearth_route_retries_total{model=\"m\"}"),
        Some(1.0)
    );

    // Once only: a request whose second replica fails too gets 502.
    daemon.wait_routed("m", 2, T);
    routed_at_router(&router, "m", 2.0);
    wait_until("both replicas idle at the router", T, || {
        router.busy_replica("m").is_none().then_some(())
    });
    let req = spawn(move || complete(addr, "m", T));
    let a = wait_until("the request at a replica", T, || router.busy_replica("m"));
    let a_pid = pid_of(&daemon, "m", &a);
    signal(a_pid, Signal::SIGKILL);
    let b = wait_until("the retry at another replica", T, || {
        router.busy_replica("m").filter(|b| *b != a)
    });
    signal(pid_of(&daemon, "m", &b), Signal::SIGKILL);
    let r = req.join().unwrap().unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_failed", "{}", r.text());
    assert_eq!(
        router.metric("hearth_route_retries_total{model=\"m\"}"),
        Some(2.0)
    );
}

#[test]
fn streams_pass_unbuffered_and_a_stream_cut_after_bytes_ends_with_an_error_event() {
    let (daemon, router, addr) = front_door([Model::streaming("s").scale(2, 2, 0)], "");
    daemon.wait_routed("s", 2, T);
    routed_at_router(&router, "s", 2.0);
    let stream = |gate: &std::path::Path, chat: bool| {
        let (path, body) = if chat {
            (
                "/v1/chat/completions",
                json!({"model": "s", "stream": true, "messages": [{"role": "user", "content": "hi"}],
                       "test": {"gate": gate}}),
            )
        } else {
            (
                "/v1/completions",
                json!({"model": "s", "stream": true, "prompt": "hi", "test": {"gate": gate}}),
            )
        };
        send(
            addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
            T,
        )
        .unwrap()
    };

    // The replica sends its first event and then waits for the gate: the client has that event
    // before the gate opens, or it was held back somewhere.
    for chat in [false, true] {
        let gate = daemon.dir.path().join(format!("gate-{chat}"));
        let mut s = stream(&gate, chat);
        assert_eq!(s.status, 200);
        assert!(s
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        let first = String::from_utf8(s.next_piece().unwrap().expect("an event")).unwrap();
        assert!(first.contains("part0"), "{first:?}");
        assert!(!gate.exists());
        std::fs::write(&gate, b"").unwrap();
        let rest = String::from_utf8(s.rest().unwrap()).unwrap();
        assert!(rest.contains("part1") && rest.contains("part2"), "{rest:?}");
        assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest:?}");
    }

    // Cut after the first event: kill -9 the replica that is streaming.
    let gate = daemon.dir.path().join("gate-never");
    let mut s = stream(&gate, false);
    let first = String::from_utf8(s.next_piece().unwrap().expect("an event")).unwrap();
    assert!(first.contains("part0"), "{first:?}");
    let victim = s.header("x-hearth-replica").unwrap().to_string();
    let other = daemon
        .in_state("s", "routed")
        .into_iter()
        .find_map(|r| {
            r["id"]
                .as_str()
                .filter(|id| *id != victim)
                .map(str::to_string)
        })
        .expect("the other replica");
    let other_addr = addr_of(&daemon, "s", &other);
    let stats = || {
        get(other_addr, "/stats").unwrap().json()["requests"]
            .as_u64()
            .unwrap()
    };
    let before = stats();
    signal(pid_of(&daemon, "s", &victim), Signal::SIGKILL);
    let rest = String::from_utf8(s.rest().expect("the stream ends cleanly")).unwrap();
    let error_event = rest
        .split("\n\n")
        .filter_map(|ev| ev.trim().strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v.get("error").is_some())
        .unwrap_or_else(|| panic!("no error event in {rest:?}"));
    assert_eq!(
        error_event["error"]["code"], "upstream_failed",
        "{error_event}"
    );
    assert!(!rest.contains("[DONE]"), "{rest:?}");
    // Never retried: the other replica got nothing, and no retry was counted.
    assert_eq!(stats(), before, "the other replica got the request");
    assert_eq!(
        router.metric("hearth_route_retries_total{model=\"s\"}"),
        None
    );
    assert_eq!(
        router.metric("hearth_route_requests_total{model=\"s\",status=\"502\"}"),
        Some(1.0)
    );
}

#[test]
fn a_client_that_leaves_frees_its_slot_and_its_request_at_the_replica() {
    let (daemon, router, addr) = front_door(
        [Model::front_toy("m", &["--service-time", "5s"]).scale(1, 1, 0)],
        "",
    );
    let replica = daemon.wait_routed("m", 1, T)[0].clone();
    routed_at_router(&router, "m", 1.0);
    let toy: std::net::SocketAddr = replica["addr"].as_str().unwrap().parse().unwrap();
    let toy_metric = |s: &str| sample(&get(toy, "/metrics").unwrap().text(), s);
    let completed_before = toy_metric("toy_requests_completed_total").unwrap();
    let body = json!({"model": "m", "prompt": "hi"});

    // At the replica, then gone.
    let a = open(addr, "/v1/completions", &body);
    wait_until("the request running at the replica", T, || {
        (toy_metric("toy_requests_running")? == 1.0).then_some(())
    });
    assert_eq!(
        router.metric("hearth_route_in_flight{model=\"m\"}"),
        Some(1.0)
    );
    drop(a);
    wait_until("the slot free at the router", T, || {
        (router.metric("hearth_route_in_flight{model=\"m\"}")? == 0.0).then_some(())
    });
    wait_until("the request gone from the replica", T, || {
        (toy_metric("toy_requests_running")? == 0.0).then_some(())
    });
    assert_eq!(
        toy_metric("toy_requests_completed_total"),
        Some(completed_before),
        "the replica stopped the request rather than finishing it"
    );

    // The slot is free: the next request takes it at once; one queued behind it and gone
    // leaves the queue.
    let b = open(addr, "/v1/completions", &body);
    wait_until("the next request at the replica", T, || {
        (router.metric("hearth_route_in_flight{model=\"m\"}")? == 1.0).then_some(())
    });
    assert_eq!(
        router.metric("hearth_route_queue_depth{model=\"m\"}"),
        Some(0.0)
    );
    let c = open(addr, "/v1/completions", &body);
    wait_until("a request queued", T, || {
        (router.metric("hearth_route_queue_depth{model=\"m\"}")? == 1.0).then_some(())
    });
    drop(c);
    wait_until("the queue empty", T, || {
        (router.metric("hearth_route_queue_depth{model=\"m\"}")? == 0.0).then_some(())
    });
    drop(b);
    wait_until("the slot free again", T, || {
        (router.metric("hearth_route_in_flight{model=\"m\"}")? == 0.0).then_some(())
    });
    assert_eq!(
        router.metric("hearth_route_requests_total{model=\"m\",status=\"499\"}"),
        Some(3.0)
    );
    let r = complete(addr, "m", T).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_replica_leaving_the_routed_set_finishes_its_requests_and_gets_no_new_one() {
    let (daemon, router, addr) = front_door(
        [Model::front_toy("m", &["--service-time", "3s"]).scale(2, 2, 0)],
        "",
    );
    daemon.wait_routed("m", 2, T);
    routed_at_router(&router, "m", 2.0);
    let watch = daemon.watch(None);

    let held = spawn(move || complete(addr, "m", T));
    let x = wait_until("the request at a replica", T, || router.busy_replica("m"));
    // Forced: at `min` 2, a plain drain would first bring a replacement up (routed ≥ min).
    let a = daemon.request(json!({"op": "drain", "replica": x, "force": true}));
    assert_eq!(a["ok"], json!(true), "{a}");
    routed_at_router(&router, "m", 1.0);
    // New requests go elsewhere while x finishes.
    let later: Vec<_> = (0..2)
        .map(|_| spawn(move || complete(addr, "m", T)))
        .collect();
    let r = held.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-hearth-replica"), Some(x.as_str()));
    for h in later {
        let r = h.join().unwrap().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_ne!(r.header("x-hearth-replica"), Some(x.as_str()));
    }
    // The drain ends once its request has (that request was answered by x, so x was not
    // stopped before): x stops.
    watch
        .wait_for(0, T, |v| {
            v["event"] == "replica"
                && v["replica"] == x.as_str()
                && (v["state"] == "stopping" || v["state"] == "gone")
        })
        .unwrap_or_else(|| panic!("{x} never stopped: {:?}", watch.events()));
    wait_until("the router to forget the drained replica", T, || {
        let page = get(addr, "/metrics").ok()?.text();
        (!page.contains(&format!("replica=\"{x}\""))).then_some(())
    });
}
