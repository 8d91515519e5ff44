//! Replicas outlive the daemon (issue 14), against the real binary and real toy servers in a
//! cgroup2 subtree: a `kill -9` of the daemon under load (replicas keep answering, the next run
//! adopts them all, none cold-starts), a replica replaced while the daemon was down (not
//! adopted, never routed), a configuration changed while it was down (the changed model rolls
//! out, the untouched one is adopted), a rehearsal of PID reuse (a live process with the saved
//! pid but another start time, or outside the cgroup, is not adopted and not touched), the one
//! command that stops what no daemon came back for, and SIGTERM (nothing of any replica left in
//! the cgroups by the time the daemon has exited).
//!
//! They need root and a writable cgroup v2 (CI has both); elsewhere they fail saying so, unless
//! HEARTH_ALLOW_SKIP=1 (testkit::needs).

use std::time::{Duration, Instant};

use testkit::procs::alive;
use testkit::status::{addr, id, pid};
use testkit::*;

/// A daemon with `models` in a cgroup2 subtree. Where this host has none the test fails saying
/// so; None only with HEARTH_ALLOW_SKIP=1.
fn daemon(models: Vec<Model>) -> Option<Daemon> {
    in_cgroup(Daemon::builder().models(models).tick("100ms"))
}

/// `builder`'s daemon, started where replicas can outlive it (a cgroup2 subtree). Where this
/// host has none the test fails saying so; None only with HEARTH_ALLOW_SKIP=1.
fn in_cgroup(builder: DaemonBuilder) -> Option<Daemon> {
    if !needs_root("replicas outlive the daemon only in a cgroup") {
        return None;
    }
    let d = builder.start();
    needs_cgroup2(&d).then_some(d)
}

/// (id, pid, state) of each replica of `model`, sorted.
fn roster(d: &Daemon, model: &str) -> Roster {
    let mut v: Vec<_> = d
        .replicas(model)
        .iter()
        .map(|r| {
            let pid = r["pid"].as_i64().unwrap_or(0) as i32;
            (id(r), pid, r["state"].as_str().unwrap_or("").to_string())
        })
        .collect();
    v.sort();
    v
}

type Roster = Vec<(String, i32, String)>;

/// Models a and b (1 routed each, up to 2) settled in a cgroup2 subtree, their rosters, then the
/// daemon killed with SIGKILL; None where this host has no cgroup (and skips are allowed).
fn two_models_then_kill_9() -> Option<(Daemon, Roster, Roster)> {
    let models = vec![
        Model::toy("a", &[]).scale(1, 2, 0),
        Model::toy("b", &[]).scale(1, 2, 0),
    ];
    let mut d = daemon(models)?;
    d.wait_settled("a", 1, 0, Duration::from_secs(30));
    d.wait_settled("b", 1, 0, Duration::from_secs(30));
    let (a, b) = (roster(&d, "a"), roster(&d, "b"));
    kill_9(&mut d);
    Some((d, a, b))
}

fn spawned_lines(d: &Daemon) -> usize {
    d.log().matches("spawned: ").count()
}

/// Completions sent round-robin to `addrs` until stopped.
fn round_robin(addrs: Vec<String>) -> Load {
    let mut i = 0;
    Load::start(move || {
        let a = &addrs[i % addrs.len()];
        i += 1;
        match complete(a, Duration::from_secs(10)) {
            Ok(r) if r.status == 200 => Ok(()),
            other => Err(format!("{a}: {other:?}")),
        }
    })
}

fn kill_9(d: &mut Daemon) {
    d.signal(Signal::SIGKILL);
    assert!(d.wait_exit(Duration::from_secs(10)).is_some());
}

fn routed_addrs(d: &Daemon, model: &str) -> Vec<String> {
    d.in_state(model, "routed").iter().map(addr).collect()
}

#[test]
fn kill_9_under_load_replicas_keep_answering_and_are_all_adopted_without_a_cold_start() {
    // A cold start of 3 s would show; an adoption is a warm-up request.
    let toy = Model::toy("a", &["--load-time", "3s"]).scale(2, 4, 1);
    let Some(mut d) = daemon(vec![toy]) else {
        return;
    };
    d.wait_settled("a", 2, 1, Duration::from_secs(60));
    let before = roster(&d, "a");
    let load = round_robin(routed_addrs(&d, "a"));
    load.more(20);
    let spawned = spawned_lines(&d);
    let killed = Instant::now();
    kill_9(&mut d);
    // Nobody supervises them now; they keep serving.
    load.more(50);
    for (_, p, _) in &before {
        assert!(alive(*p), "replica pid {p} outlived the daemon");
    }
    let down = killed.elapsed();
    let restarted = Instant::now();
    d.restart();
    let m = d.wait_settled("a", 2, 1, Duration::from_secs(60));
    let routed_again = restarted.elapsed();
    assert_eq!(roster(&d, "a"), before, "the same replicas, pids and roles");
    assert_eq!(
        spawned_lines(&d),
        spawned,
        "no replica cold-started:\n{}",
        d.log_tail(40)
    );
    assert!(
        d.log().contains("adopted 3 replica(s), stopping 0"),
        "{}",
        d.log_tail(40)
    );
    load.more(20);
    let (ok, failed, errors) = load.finish();
    println!(
        "kill -9, {:.1} s with no daemon, then restart → routed again: {:.0} ms (3 replicas); {ok} completions, {failed} failed",
        down.as_secs_f64(),
        routed_again.as_secs_f64() * 1e3
    );
    assert_eq!(failed, 0, "{errors:?}");
    let _ = m;
}

/// Completions of `TOKENS` tokens through the front door, one after the other until stopped.
fn load_through(front_door: std::net::SocketAddr) -> Load {
    Load::start(move || {
        let body = json!({"model": "a", "prompt": "Hello there", "max_tokens": TOKENS});
        match testkit::route::post(
            front_door,
            "/v1/completions",
            &body,
            Duration::from_secs(60),
        ) {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(format!("{} {}", r.status, r.text())),
            Err(e) => Err(e.to_string()),
        }
    })
}

/// Tokens a request of `load_through` asks for: 4 s at the toy's `--token-time 50ms`. The
/// warm-up asks for 4 (200 ms), as a real server's short warm-up beside long generations.
const TOKENS: u32 = 80;

/// Issue 24, item 11, the probe's setup: one replica with one slot, two clients sending 4-s
/// requests through the front door (`queue_timeout` 6 s), the daemon killed with SIGKILL and
/// started again. The replica was routed by a warm-up its own process passed: the new daemon's
/// routed set holds it from its first snapshot on while the warm-up (waiting behind live work)
/// re-verifies it, so no request waits out its `queue_timeout`.
#[test]
fn kill_9_with_a_busy_one_slot_model_behind_the_front_door_fails_no_request() {
    let toy = Model::front_toy(
        "a",
        &[
            "--load-time",
            "3s",
            "--service-time",
            "0s",
            "--token-time",
            "50ms",
        ],
    )
    .slots(1)
    .scale(1, 1, 0);
    let builder = testkit::route::front_door_daemon([toy], "queue_timeout = \"6s\"\n");
    let Some(mut d) = in_cgroup(builder) else {
        return;
    };
    let router = testkit::route::Router::start(&d);
    d.wait_settled("a", 1, 0, Duration::from_secs(60));
    let before = roster(&d, "a");
    let connected = |router: &testkit::route::Router| {
        wait_until(
            "the router following the daemon",
            Duration::from_secs(30),
            || (router.metric("hearth_route_daemon_connected")? == 1.0).then_some(()),
        )
    };
    connected(&router);
    let clients = [load_through(router.addr), load_through(router.addr)];
    for c in &clients {
        c.more(1);
    }
    wait_until("the replica busy", Duration::from_secs(10), || {
        router.busy_replica("a")
    });
    let spawned = spawned_lines(&d);
    kill_9(&mut d);
    d.restart();
    let watch = d.watch(Some("a"));
    let (_, first) = watch
        .wait_for(0, Duration::from_secs(10), |v| v["event"] == "routed")
        .expect("the routed snapshot");
    assert_eq!(
        endpoint_ids(&first.v),
        vec![before[0].0.clone()],
        "the adopted replica is routed from the first snapshot on:\n{}",
        d.log_tail(30)
    );
    let verified = Instant::now();
    wait_until(
        "the warm-up re-verified it",
        Duration::from_secs(60),
        || {
            d.log()
                .contains("adopted: warm-up passed; it kept its place throughout")
                .then_some(())
        },
    );
    println!(
        "kill -9 and restart under load: re-verified {:.1} s after the snapshot, routed throughout",
        verified.elapsed().as_secs_f64()
    );
    connected(&router);
    for c in &clients {
        c.more(2);
    }
    let mut failed = Vec::new();
    let mut ok = 0;
    for c in clients {
        let (n, f, errors) = c.finish();
        ok += n;
        if f > 0 {
            failed.extend(errors);
        }
    }
    println!(
        "kill -9 with a busy 1-slot model: {ok} completions, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}\n{}", d.log_tail(40));
    assert!(
        watch.routed_sets("a").iter().all(|s| !s.is_empty()),
        "never an empty routed set: {:?}",
        watch.routed_sets("a")
    );
    assert_eq!(roster(&d, "a"), before, "the same replica, pid and role");
    assert_eq!(
        spawned_lines(&d),
        spawned,
        "no cold start:\n{}",
        d.log_tail(40)
    );
}

#[test]
fn a_replica_replaced_while_the_daemon_was_down_is_not_adopted_and_never_routed() {
    let toy = Model::toy("a", &[]).scale(1, 2, 0);
    let Some(mut d) = daemon(vec![toy]) else {
        return;
    };
    d.wait_settled("a", 1, 0, Duration::from_secs(30));
    let old = d.in_state("a", "routed").remove(0);
    let old_addr = addr(&old);
    kill_9(&mut d);
    // The replica dies while no daemon runs; another process takes its port.
    testkit::procs::signal(pid(&old), Signal::SIGKILL);
    wait_until("the old replica gone", Duration::from_secs(10), || {
        (!alive(pid(&old))).then_some(())
    });
    let port = old_addr.rsplit(':').next().unwrap().to_string();
    let mut squatter = d.squatter(&port);
    wait_until("the squatter listening", Duration::from_secs(10), || {
        complete(&old_addr, Duration::from_secs(2)).ok()
    });
    d.restart();
    let watch = d.watch(Some("a"));
    d.wait_settled("a", 1, 0, Duration::from_secs(30));
    let new = d.in_state("a", "routed").remove(0);
    // A new process (numbering starts afresh when nothing is taken back).
    assert_ne!(pid(&new), pid(&old), "not adopted: {}", d.log_tail(30));
    assert_ne!(addr(&new), old_addr, "the squatter's port is passed over");
    assert!(
        d.log().contains("its leader") && d.log().contains("is gone"),
        "{}",
        d.log_tail(30)
    );
    let routed: Vec<String> = watch.routed("a").into_iter().map(|(_, a)| a).collect();
    assert!(
        !routed.contains(&old_addr),
        "the squatter was routed: {routed:?}"
    );
    assert!(
        squatter.try_wait().unwrap().is_none(),
        "a stranger is never stopped"
    );
    let _ = squatter.kill();
    let _ = squatter.wait();
}

#[test]
fn a_model_changed_while_the_daemon_was_down_rolls_out_and_the_untouched_one_is_adopted() {
    let Some((mut d, a, b)) = two_models_then_kill_9() else {
        return;
    };
    d.rewrite_config(|c| {
        let m = c.models.iter_mut().find(|m| m.name == "a").unwrap();
        m.version = "2".into();
    });
    d.restart();
    d.wait_settled("b", 1, 0, Duration::from_secs(30));
    assert_eq!(roster(&d, "b"), b, "b is adopted as it was");
    let a2 = wait_until("a rolled out", Duration::from_secs(30), || {
        let r = roster(&d, "a");
        (r.len() == 1 && r[0].2 == "routed" && r[0].1 != a[0].1).then_some(r)
    });
    wait_until("the old a stopped", Duration::from_secs(15), || {
        (!alive(a[0].1)).then_some(())
    });
    assert!(
        d.log().contains("its launch spec differs"),
        "{}",
        d.log_tail(30)
    );
    assert_ne!(a2[0].1, a[0].1);
}

#[test]
fn pid_reuse_a_live_process_with_the_saved_pid_but_another_start_time_is_not_adopted() {
    let Some((mut d, a, b)) = two_models_then_kill_9() else {
        return;
    };
    // a: its own live leader, saved with another start time (as a reused pid would have).
    // b: the saved pid rewritten to a live stranger outside the cgroup, with its true start.
    let (k, v) = d.mark();
    let mut stranger = std::process::Command::new("sleep")
        .arg("600")
        .env(k, v)
        .spawn()
        .unwrap();
    let spid = stranger.id();
    let sticks = testkit::procs::stat(spid as i32).unwrap().start_ticks;
    let path = d.dir.path().join("state/replicas.json");
    let mut saved: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ticks = saved["proofs"][&a[0].0]["start_ticks"].as_u64().unwrap();
    saved["proofs"][&a[0].0]["start_ticks"] = json!(ticks + 1);
    saved["proofs"][&b[0].0]["pid"] = json!(spid);
    saved["proofs"][&b[0].0]["start_ticks"] = json!(sticks);
    for r in saved["ledger"]["replicas"].as_array_mut().unwrap() {
        if r["replica"] == json!(b[0].0) {
            r["pid"] = json!(spid);
        }
    }
    std::fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();
    d.restart();
    for (name, old) in [("a", &a), ("b", &b)] {
        wait_until("a new replica routed", Duration::from_secs(30), || {
            let r = roster(&d, name);
            (r.len() == 1 && r[0].2 == "routed" && r[0].1 != old[0].1).then_some(())
        });
        wait_until(
            "the unproven replica stopped",
            Duration::from_secs(15),
            || (!alive(old[0].1)).then_some(()),
        );
    }
    assert!(
        d.log().contains("started at another time"),
        "{}",
        d.log_tail(30)
    );
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "a stranger with a saved pid is never signalled"
    );
    let _ = stranger.kill();
    let _ = stranger.wait();
}

#[test]
fn when_hearth_does_not_come_back_one_command_stops_every_replica() {
    let toy = Model::toy("a", &["--fork-worker"]).scale(2, 4, 1);
    let Some(mut d) = daemon(vec![toy]) else {
        return;
    };
    d.wait_settled("a", 2, 1, Duration::from_secs(30));
    let log = d.log();
    let cmd = log
        .lines()
        .find_map(|l| l.split("stop them all with: ").nth(1))
        .expect("the daemon says the command at start")
        .trim()
        .to_string();
    let subtree = cgroups::subtree(&d.dir.path().join("state")).unwrap();
    let count = || -> usize {
        cgroups::children(&subtree)
            .iter()
            .map(|c| cgroups::procs(c).len())
            .sum()
    };
    kill_9(&mut d);
    let n = count();
    assert!(
        n >= 6,
        "3 replicas and their workers outlive the daemon: {n}"
    );
    let st = std::process::Command::new("sh")
        .args(["-c", &cmd])
        .status()
        .unwrap();
    assert!(st.success(), "{cmd}");
    wait_until("nothing left", Duration::from_secs(10), || {
        (count() == 0).then_some(())
    });
    assert!(d.children().is_empty(), "{:?}", d.children());
}

#[test]
fn sigterm_after_an_adoption_leaves_no_process_of_any_replica() {
    let toy = Model::toy("a", &["--fork-worker"])
        .scale(2, 4, 1)
        .stop_grace("1s");
    let Some(mut d) = daemon(vec![toy]) else {
        return;
    };
    d.wait_settled("a", 2, 1, Duration::from_secs(30));
    kill_9(&mut d);
    d.restart();
    d.wait_settled("a", 2, 1, Duration::from_secs(30));
    let subtree = cgroups::subtree(&d.dir.path().join("state")).unwrap();
    d.signal(Signal::SIGTERM);
    let st = d
        .wait_exit(Duration::from_secs(40))
        .expect("exits after SIGTERM");
    // Counted before any cleanup of the harness.
    let left: Vec<i32> = cgroups::children(&subtree)
        .iter()
        .flat_map(|c| cgroups::procs(c))
        .chain(cgroups::procs(&subtree))
        .collect();
    assert!(st.success(), "{st}");
    assert!(left.is_empty(), "left in the cgroups: {left:?}");
    assert!(d.children().is_empty(), "left: {:?}", d.children());
}

#[test]
fn upgrade_under_load_keeps_every_replica_pid_role_and_the_routed_set() {
    let toy = Model::toy("a", &["--load-time", "3s"]).scale(2, 4, 1);
    let Some(d) = daemon(vec![toy]) else {
        return;
    };
    d.wait_settled("a", 2, 1, Duration::from_secs(60));
    let before = roster(&d, "a");
    let daemon_pid = d.pid();
    let spawned = spawned_lines(&d);
    let first = d.watch(Some("a"));
    first
        .wait_for(0, Duration::from_secs(10), |v| v["event"] == "routed")
        .expect("the routed snapshot");
    let load = round_robin(routed_addrs(&d, "a"));
    load.more(20);
    let t = Instant::now();
    let out = d.cli_ok(&["upgrade"]);
    let took = t.elapsed();
    assert!(out.contains("upgraded"), "{out}");
    wait_until(
        "the old watch closed by the exec",
        Duration::from_secs(10),
        || first.closed().then_some(()),
    );
    let second = d.watch(Some("a"));
    second
        .wait_for(0, Duration::from_secs(10), |v| v["event"] == "routed")
        .expect("the routed snapshot");
    load.more(50);
    let (ok, failed, errors) = load.finish();
    println!(
        "upgrade: {:.0} ms from the op to the new binary answering; {ok} completions, {failed} failed",
        took.as_secs_f64() * 1e3
    );
    assert_eq!(failed, 0, "{errors:?}");
    assert_eq!(d.pid(), daemon_pid);
    assert!(
        testkit::procs::alive(daemon_pid),
        "the same process runs on"
    );
    assert_eq!(roster(&d, "a"), before, "the same replicas, pids and roles");
    assert_eq!(
        spawned_lines(&d),
        spawned,
        "no replica started:\n{}",
        d.log_tail(40)
    );
    assert!(d.log().contains("handed over"), "{}", d.log_tail(40));
    for r in d.replicas("a") {
        assert_eq!(r["restarts"], json!(0));
    }
    let last_before = first.routed_sets("a").last().cloned().unwrap();
    let after = second.routed_sets("a");
    assert_eq!(
        after[0], last_before,
        "the snapshot after the reconnect is the last one"
    );
    for s in &after {
        assert!(
            last_before.iter().all(|r| s.contains(r)),
            "no removal after the upgrade: {after:?}"
        );
    }
}
