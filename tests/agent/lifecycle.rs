//! Replica lifecycle against the real daemon and real toy-server processes: readiness and the
//! warm pool, promotion after a crash, warm-up failures, liveness, and operator drains.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use testkit::procs::{alive, signal};
use testkit::status::{addr, id, ids, pid, replicas_of};
use testkit::*;

#[test]
fn replicas_become_routed_and_warm_within_load_time_and_serve() {
    let load = Duration::from_secs(1);
    let d = Daemon::start([Model::toy(
        "toy",
        &[
            "--load-time",
            "1s",
            "--concurrency",
            "4",
            "--service-time",
            "100ms",
        ],
    )]);
    // Poll longer than the limit so a failure says how late it was.
    let m = d.wait_settled("toy", 2, 1, Duration::from_secs(20));
    let took = d.started.elapsed();
    eprintln!("2 routed + 1 warm {took:?} after the daemon started");
    assert!(
        took <= load + Duration::from_secs(2),
        "2 routed + 1 warm took {took:?} from daemon start; the limit is load time + 2 s"
    );
    assert_eq!(m["health"], "ok", "{m}");
    let replicas = replicas_of(&m);
    let routed: Vec<Value> = replicas
        .iter()
        .filter(|r| r["state"] == "routed")
        .cloned()
        .collect();
    assert_eq!(routed.len(), 2, "{m}");
    assert_eq!(
        replicas.iter().filter(|r| r["state"] == "warm").count(),
        1,
        "{m}"
    );
    // Every replica is a live process on its own port in the daemon's range.
    let mut ports = HashSet::new();
    for r in &replicas {
        assert!(alive(pid(r)), "{} pid {} is not alive", id(r), pid(r));
        let port = r["port"].as_u64().unwrap() as u16;
        assert!((d.ports.0..=d.ports.1).contains(&port), "{r}");
        assert!(ports.insert(port), "port {port} given twice: {m}");
    }

    // `hearth watch` (the CLI) lists the routed set first.
    let mut watch = d
        .command(&["watch", "toy"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(10));
    let _ = watch.kill();
    let _ = watch.wait();
    let line = line.expect("hearth watch printed nothing within 10 s");
    let ev: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(ev["event"], "routed", "{ev}");
    assert_eq!(ev["model"], "toy", "{ev}");
    assert_eq!(endpoint_ids(&ev), ids(&routed), "watch: {ev}\nstatus: {m}");
    for (replica, a) in endpoints(&ev) {
        let r = routed.iter().find(|r| id(r) == replica).unwrap();
        assert_eq!(a, addr(r), "{ev}");
    }

    // A watch on the socket says the same.
    let w = d.watch(Some("toy"));
    let (_, snap) = w
        .wait_for(0, Duration::from_secs(5), |v| v["event"] == "routed")
        .expect("routed snapshot");
    assert_eq!(endpoint_ids(&snap.v), ids(&routed), "{}", snap.v);

    // Every routed address answers a real completion.
    for (_, a) in endpoints(&ev) {
        let r = complete(&a, Duration::from_secs(10))
            .unwrap_or_else(|err| panic!("completion at {a}: {err}"));
        assert_eq!(r.status, 200, "{a}: {}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
        assert!(v["choices"][0]["text"].is_string(), "{a}: {}", r.body);
    }
}

#[test]
fn kill_9_of_a_routed_replica_promotes_a_warm_one_within_1s_and_refills_the_pool() {
    let d = Daemon::start([Model::toy("toy", &["--load-time", "500ms"])]);
    let replicas = replicas_of(&d.wait_settled("toy", 2, 1, Duration::from_secs(20)));
    let initial: HashSet<String> = replicas.iter().map(id).collect();
    let routed: Vec<&Value> = replicas.iter().filter(|r| r["state"] == "routed").collect();
    let warm_id = id(replicas.iter().find(|r| r["state"] == "warm").unwrap());
    let (victim_id, victim_pid) = (id(routed[0]), pid(routed[0]));
    let survivor = id(routed[1]);

    let w = d.watch(Some("toy"));
    w.wait_for(0, Duration::from_secs(5), |v| v["event"] == "routed")
        .expect("routed snapshot");
    let mark = w.len();
    signal(victim_pid, Signal::SIGKILL);
    let killed = Instant::now();

    let (_, ev) = w
        .wait_for(mark, Duration::from_secs(10), |v| {
            v["event"] == "routed" && !endpoint_ids(v).contains(&victim_id)
        })
        .expect("a routed set without the killed replica");
    let took = ev.at.duration_since(killed);
    eprintln!("warm replica routed {took:?} after kill -9");
    let mut want = vec![survivor.clone(), warm_id.clone()];
    want.sort();
    assert_eq!(
        endpoint_ids(&ev.v),
        want,
        "the warm replica should replace the killed one: {}",
        ev.v
    );
    assert!(
        took <= Duration::from_secs(1),
        "warm replica routed {took:?} after kill -9; the limit is 1 s"
    );
    // Never was there a routed set of one: the promotion came with the removal.
    for e in w.events().iter().skip(mark) {
        if e.v["event"] == "routed" {
            assert_eq!(endpoint_ids(&e.v).len(), 2, "routed set shrank: {}", e.v);
        }
    }
    let (_, promoted_addr) = endpoints(&ev.v)
        .into_iter()
        .find(|(r, _)| *r == warm_id)
        .unwrap();
    let r = complete(&promoted_addr, Duration::from_secs(10)).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    // The pool refills: a new replica becomes warm (after the 1 s restart back-off).
    let (_, refill) = w
        .wait_for(mark, Duration::from_secs(15), |v| {
            v["event"] == "replica"
                && v["state"] == "warm"
                && !initial.contains(v["replica"].as_str().unwrap_or(""))
        })
        .expect("a new warm replica");
    let new_id = refill.v["replica"].as_str().unwrap().to_string();
    w.wait_for(
        mark,
        Duration::from_secs(5),
        replica_event(&victim_id, "gone"),
    )
    .expect("the killed replica is gone");
    let m = d.wait_settled("toy", 2, 1, Duration::from_secs(5));
    let mut want = vec![survivor, warm_id, new_id];
    want.sort();
    assert_eq!(ids(&replicas_of(&m)), want, "{m}");
    assert!(!alive(victim_pid), "killed pid {victim_pid} still alive");
}

/// "restart back-off: starts in 1.5s" / "… in 750ms" → seconds.
fn backoff_secs(reason: &str) -> Option<f64> {
    let rest = reason.strip_prefix("restart back-off: starts in ")?;
    if let Some(ms) = rest.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|v| v / 1000.0);
    }
    rest.strip_suffix('s')?.parse().ok()
}

#[test]
fn failing_warmup_is_never_routed_backs_off_and_reaches_crash_loop() {
    let m = Model::toy("bad", &["--fail-warmup"])
        .scale(1, 1, 0)
        .startup_timeout("1s");
    let d = Daemon::start([m]);
    let w = d.watch(Some("bad"));

    // While starting, the replica says why it is not warm: the warm-up's answer.
    let reason = wait_until(
        "a starting replica whose reason quotes the failed warm-up",
        Duration::from_secs(15),
        || {
            d.in_state("bad", "starting")
                .into_iter()
                .filter_map(|r| r["reason"].as_str().map(str::to_string))
                .find(|r| r.contains("warm-up") && r.contains("HTTP 500"))
        },
    );
    assert!(reason.contains("--fail-warmup"), "{reason}");

    // Each failure is followed by a longer restart back-off, until the model is in crash_loop.
    let mut backoffs: Vec<(String, f64)> = Vec::new();
    let last = wait_until("health crash_loop", Duration::from_secs(90), || {
        let m = d.model("bad");
        for r in replicas_of(&m) {
            if let Some(s) = r["reason"].as_str().and_then(backoff_secs) {
                let rid = id(&r);
                match backoffs.iter_mut().find(|(i, _)| *i == rid) {
                    Some((_, v)) => *v = v.max(s),
                    None => backoffs.push((rid, s)),
                }
            }
        }
        (m["health"] == "crash_loop").then_some(m)
    });
    let reason = last["health_reason"].as_str().unwrap();
    eprintln!("back-offs seen: {backoffs:?}; crash_loop: {reason}");
    assert!(
        reason.contains("warm-up did not pass within 1.0s") && reason.contains("HTTP 500"),
        "crash_loop reason should quote the warm-up failure: {reason}"
    );
    assert!(
        backoffs.len() >= 3,
        "expected to see at least 3 replicas waiting out a back-off: {backoffs:?}"
    );
    for pair in backoffs.windows(2) {
        assert!(
            pair[1].1 > pair[0].1 * 1.5,
            "back-off should double after each failure: {backoffs:?}"
        );
    }
    let newest = replicas_of(&last).last().unwrap().clone();
    assert!(
        newest["restarts"].as_u64().unwrap() >= 4,
        "restarts should count the failures: {newest}"
    );

    // Never warm, never routed.
    for v in w.values() {
        if v["event"] == "routed" {
            assert!(endpoint_ids(&v).is_empty(), "routed a failing replica: {v}");
        }
        if v["event"] == "replica" {
            assert!(
                v["state"] != "warm" && v["state"] != "routed",
                "a failing replica became {}: {v}",
                v["state"]
            );
        }
    }
    assert_eq!(last["routed"], 0, "{last}");
    assert_eq!(last["warm"], 0, "{last}");
}

#[test]
fn a_hung_routed_replica_is_replaced_after_liveness_failures() {
    let m = Model::toy("hang", &["--hang-after", "3s"])
        .scale(1, 1, 0)
        .liveness("300ms", "200ms", 3)
        .stop_grace("1s");
    let d = Daemon::builder().tick("100ms").model(m).start();
    let w = d.watch(Some("hang"));
    let first = wait_until("hang-1 routed", Duration::from_secs(10), || {
        d.in_state("hang", "routed").into_iter().next()
    });
    assert_eq!(first["id"], "hang-1", "{first}");
    let (first_addr, first_pid) = (addr(&first), pid(&first));

    // See the hang from outside: /health stops answering.
    let hung_at = wait_until(
        "hang-1 stops answering",
        Duration::from_secs(10),
        || match http(
            &first_addr,
            "GET",
            "/health",
            None,
            Duration::from_millis(100),
        ) {
            Ok(r) if r.status == 200 => None,
            _ => Some(Instant::now()),
        },
    );
    // After a miss, the replica is still routed and status says its probe is failing: one miss
    // does not replace it.
    let probe_reason = wait_until(
        "hang-1 routed with a failing probe in status",
        Duration::from_secs(10),
        || {
            let r = d
                .replicas("hang")
                .into_iter()
                .find(|r| r["id"] == "hang-1")?;
            assert_eq!(
                r["state"], "routed",
                "hang-1 left the routed set before a miss was seen: {r}"
            );
            let reason = r["reason"].as_str().unwrap_or("");
            reason
                .starts_with("probe failing")
                .then(|| reason.to_string())
        },
    );
    assert!(
        probe_reason.contains("no answer within 200ms"),
        "{probe_reason}"
    );
    let (was_routed, _) = w
        .wait_for(0, Duration::from_secs(5), |v| {
            v["event"] == "routed" && endpoint_ids(v) == ["hang-1"]
        })
        .expect("hang-1 in a routed event");
    let (_, unrouted) = w
        .wait_for(was_routed, Duration::from_secs(10), |v| {
            v["event"] == "routed" && !endpoint_ids(v).iter().any(|r| r == "hang-1")
        })
        .expect("hang-1 unrouted");
    let after = unrouted.at.saturating_duration_since(hung_at);
    eprintln!("hung replica unrouted {after:?} after it was seen hung");
    // Three misses take at least 2 intervals + 1 timeout (0.8 s); one miss would be ≤ 0.2 s plus
    // a tick. Allow generously for a loaded machine above.
    assert!(
        after >= Duration::from_millis(500),
        "hang-1 unrouted {after:?} after it hung: sooner than 3 misses allow"
    );
    assert!(
        after <= Duration::from_secs(5),
        "hang-1 unrouted {after:?} after it hung; 3 misses at 300 ms + 200 ms should take ~2 s"
    );
    // The hung process is killed after stop_grace.
    wait_until("the hung process gone", Duration::from_secs(5), || {
        (!alive(first_pid)).then_some(())
    });
    // A new replica takes its place in the routed set and serves.
    let (_, ev) = w
        .wait_for(0, Duration::from_secs(15), |v| {
            v["event"] == "routed" && endpoint_ids(v) == ["hang-2"]
        })
        .expect("hang-2 routed");
    // The replacement counts hang-1's end as a failure.
    let r2 = d
        .replicas("hang")
        .into_iter()
        .find(|r| r["id"] == "hang-2")
        .expect("hang-2 in status");
    assert_eq!(r2["restarts"], 1, "{r2}");
    let (_, a) = endpoints(&ev.v).remove(0);
    let r = complete(&a, Duration::from_secs(5)).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn drain_lets_requests_in_flight_finish_then_stops_and_replaces_the_replica() {
    let m = Model::toy("dr", &["--service-time", "1500ms", "--concurrency", "8"]).scale(1, 2, 1);
    let d = Daemon::start([m]);
    let replicas = replicas_of(&d.wait_settled("dr", 1, 1, Duration::from_secs(20)));
    let target = replicas.iter().find(|r| r["state"] == "routed").unwrap();
    let warm_id = id(replicas.iter().find(|r| r["state"] == "warm").unwrap());
    let (target_id, target_addr, target_pid) = (id(target), addr(target), pid(target));
    let w = d.watch(Some("dr"));

    // Four requests straight to the replica, all in flight before the drain.
    let requests: Vec<_> = (0..4)
        .map(|_| {
            let a = target_addr.clone();
            std::thread::spawn(move || (complete(&a, Duration::from_secs(20)), Instant::now()))
        })
        .collect();
    wait_until("4 requests running", Duration::from_secs(5), || {
        let r = http(
            &target_addr,
            "GET",
            "/metrics",
            None,
            Duration::from_secs(2),
        )
        .ok()?;
        r.body
            .lines()
            .any(|l| l.trim() == "toy_requests_running 4")
            .then_some(())
    });

    d.cli_ok(&["drain", &target_id]);
    w.wait_for(
        0,
        Duration::from_secs(2),
        replica_event(&target_id, "draining"),
    )
    .expect("the replica is draining");
    w.wait_for(0, Duration::from_secs(2), |v| {
        v["event"] == "routed" && endpoint_ids(v) == [warm_id.clone()]
    })
    .expect("the warm replica routed in the drained one's place");
    assert!(
        alive(target_pid),
        "the draining replica was stopped with requests in flight"
    );

    let mut last_done = None::<Instant>;
    for h in requests {
        let (r, at) = h.join().unwrap();
        let r = r.expect("a request in flight during the drain failed");
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.contains("choices"), "{}", r.body);
        last_done = Some(last_done.map_or(at, |l: Instant| l.max(at)));
    }
    let last_done = last_done.unwrap();
    let gone_at = wait_until("the drained process exits", Duration::from_secs(10), || {
        (!alive(target_pid)).then(Instant::now)
    });
    assert!(gone_at >= last_done);
    eprintln!(
        "drained process gone {:?} after its last request completed",
        gone_at.duration_since(last_done)
    );
    assert!(
        gone_at.duration_since(last_done) <= Duration::from_secs(3),
        "the drained process lingered {:?} after its last request",
        gone_at.duration_since(last_done)
    );
    w.wait_for(0, Duration::from_secs(5), replica_event(&target_id, "gone"))
        .expect("the drained replica is gone");

    // Replaced: a new replica refills the pool, and the drained one is not counted a failure.
    let (_, refill) = w
        .wait_for(0, Duration::from_secs(10), |v| {
            v["event"] == "replica"
                && v["state"] == "warm"
                && v["replica"] != target_id.as_str()
                && v["replica"] != warm_id.as_str()
        })
        .expect("a new warm replica");
    let m = d.wait_settled("dr", 1, 1, Duration::from_secs(5));
    assert_eq!(m["health"], "ok", "{m}");
    let mut want = vec![warm_id, refill.v["replica"].as_str().unwrap().to_string()];
    want.sort();
    assert_eq!(ids(&replicas_of(&m)), want, "{m}");
    for r in replicas_of(&m) {
        assert_eq!(r["restarts"], 0, "a drain is not a failure: {m}");
    }
}
