//! `hearth upgrade` (issue 24, items 1 and 2), against the real binary and real toy servers in a
//! cgroup2 subtree:
//!
//! - a configuration file edited and not reloaded: the upgrade carries the running configuration
//!   across, under load through the front door 0 requests fail, every replica keeps its pid and
//!   no replica starts; status (JSON and the table) says the file differs; `hearth reload` then
//!   rolls it out as any reload does (new replicas warm before the old drain), still 0 failed;
//! - a file at the binary's path that is not hearth (random bytes; a script that exits 1):
//!   refused before the hand-over with the reason and exit 1, the old daemon serving on with the
//!   same pid and replicas; the real binary put back, the upgrade succeeds;
//! - a new binary that fails while it adopts (the test-only fault `HEARTH_FAULT_INJECT_FAIL_
//!   HANDOVER`: it panics, or its start returns an error): the previous binary, kept open by
//!   fd, takes the replicas back (the daemon's executable is then the replaced file), exit 1
//!   with the reason; the fault trips once, so the next upgrade succeeds.
//!
//! They need root and a writable cgroup v2 (CI has both); elsewhere they fail saying so, unless
//! HEARTH_ALLOW_SKIP=1 (testkit::needs).

use std::time::{Duration, Instant};

use testkit::status::{addr, id, pid};
use testkit::*;

/// `builder`'s daemon, started where replicas can outlive it (a cgroup2 subtree), from a copy of
/// the binary the test may replace. None only with HEARTH_ALLOW_SKIP=1 on a host without one.
fn in_cgroup(builder: DaemonBuilder) -> Option<Daemon> {
    if !needs_root("replicas outlive the daemon only in a cgroup") {
        return None;
    }
    let d = builder.own_binary().start();
    needs_cgroup2(&d).then_some(d)
}

/// (id, pid, state) of each replica of `model`, sorted.
fn roster(d: &Daemon, model: &str) -> Vec<(String, i32, String)> {
    let mut v: Vec<_> = d
        .replicas(model)
        .iter()
        .map(|r| (id(r), pid(r), r["state"].as_str().unwrap_or("").to_string()))
        .collect();
    v.sort();
    v
}

fn spawned_lines(d: &Daemon) -> usize {
    d.log().matches("spawned: ").count()
}

/// What the daemon's process runs now (`/proc/PID/exe`).
fn exe_of(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
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

/// Completions through the front door, one after the other until stopped.
fn through(front_door: std::net::SocketAddr) -> Load {
    Load::start(move || {
        let body = json!({"model": "a", "prompt": "Hello there", "max_tokens": 4});
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

fn config_file(d: &Daemon) -> Value {
    d.status()["daemon"]["config_file"].clone()
}

/// Item 1: the file edited (another argument, another version) and not reloaded. On main at
/// 183ffe9 the new binary compared the replicas with the file and replaced every one.
#[test]
fn an_upgrade_runs_the_running_configuration_and_leaves_an_edited_file_to_reload() {
    let toy = Model::front_toy("a", &["--service-time", "30ms"]).scale(3, 3, 0);
    let builder = testkit::route::front_door_daemon([toy], "");
    let Some(mut d) = in_cgroup(builder) else {
        return;
    };
    let router = testkit::route::Router::start(&d);
    d.wait_settled("a", 3, 0, Duration::from_secs(60));
    wait_until(
        "the router following the daemon",
        Duration::from_secs(30),
        || (router.metric("hearth_route_daemon_connected")? == 1.0).then_some(()),
    );
    let before = roster(&d, "a");
    let daemon_pid = d.pid();
    let clients: Vec<Load> = (0..4).map(|_| through(router.addr)).collect();
    for c in &clients {
        c.more(5);
    }
    d.rewrite_config(|c| {
        let m = &mut c.models[0];
        m.version = "2".into();
        let at = m.command.iter().position(|a| a == "30ms").unwrap();
        m.command[at] = "20ms".into();
    });
    assert_ne!(config_file(&d)["state"], "differs", "not read yet");
    let spawned = spawned_lines(&d);

    let t = Instant::now();
    let out = d.cli_ok(&["upgrade"]);
    let took = t.elapsed();
    for c in &clients {
        c.more(10);
    }
    let after = roster(&d, "a");
    let model = d.model("a");
    let file = config_file(&d);
    println!(
        "upgrade with an edited file: {:.0} ms; file {}: {}",
        took.as_secs_f64() * 1e3,
        file["state"],
        file["reason"]
    );
    assert_eq!(d.pid(), daemon_pid, "the same process");
    assert_eq!(after, before, "every replica kept its pid and role");
    assert_eq!(model["version"], "1", "the running configuration runs");
    assert!(
        model["rollout"].is_null(),
        "nothing rolls out: {}",
        model["rollout"]
    );
    assert_eq!(spawned_lines(&d), spawned, "no replica started");
    assert!(out.contains("every one kept"), "{out}");
    assert_eq!(file["state"], "differs", "{file}");
    assert_eq!(file["path"], json!(d.config_path.display().to_string()));
    assert!(
        file["reason"].as_str().unwrap().contains("hearth reload"),
        "{file}"
    );
    let table = d.cli_ok(&["status"]);
    assert!(table.contains("differs from what runs"), "{table}");
    let upgrade = &d.status()["daemon"]["upgrade"];
    assert_eq!(upgrade["outcome"], "done", "{upgrade}");
    assert_eq!(upgrade["kept"], 3, "{upgrade}");

    // The edit applies as any reload: a rollout, the new version warm before the old drain.
    d.cli_ok(&["reload"]);
    let rolled = d.wait_model(
        "a",
        "rolled out to version 2",
        Duration::from_secs(90),
        |m| {
            let r = testkit::status::replicas_of(m);
            m["rollout"].is_null()
                && r.len() == 3
                && r.iter()
                    .all(|r| r["state"] == "routed" && r["version"] == "2")
        },
    );
    for c in &clients {
        c.more(10);
    }
    let mut failed = Vec::new();
    let mut ok = 0;
    for c in clients {
        let (n, _, errors) = c.finish();
        ok += n;
        failed.extend(errors);
    }
    println!(
        "upgrade, then reload, under load through the front door: {ok} completions, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}\n{}", d.log_tail(40));
    let old: Vec<i32> = before.iter().map(|r| r.1).collect();
    for r in testkit::status::replicas_of(&rolled) {
        assert!(!old.contains(&pid(&r)), "replaced by the rollout: {r}");
    }
    assert!(
        d.log().contains("rolling out version 2"),
        "{}",
        d.log_tail(30)
    );
    assert_eq!(config_file(&d)["state"], "applied");
}

/// Item 2: garbage at the binary's path is refused before the hand-over, and the daemon serves
/// on. On main at 183ffe9 `hearth upgrade` printed "upgraded … every replica handed over" after
/// 60 s and exited 0.
#[test]
fn a_file_that_is_not_hearth_is_refused_before_the_hand_over() {
    let toy = Model::toy("a", &[]).scale(2, 2, 0);
    let Some(d) = in_cgroup(Daemon::builder().model(toy).tick("100ms")) else {
        return;
    };
    d.wait_settled("a", 2, 0, Duration::from_secs(60));
    let before = roster(&d, "a");
    let daemon_pid = d.pid();
    let load = round_robin(d.in_state("a", "routed").iter().map(addr).collect());
    load.more(10);
    // Random bytes (a fixed xorshift sequence), then a script that fails.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..65536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let garbage: [(&str, &[u8]); 2] = [
        ("random bytes", &noise),
        ("a script that exits 1", b"#!/bin/sh\necho nope\nexit 1\n"),
    ];
    for (what, content) in garbage {
        d.replace_binary(content, 0o755);
        let t = Instant::now();
        let out = d.cli(&["upgrade"]);
        println!(
            "upgrade to {what}: exit {:?} after {:.0} ms: {}",
            out.status.code(),
            t.elapsed().as_secs_f64() * 1e3,
            out.stderr.trim()
        );
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        assert!(
            out.stderr.contains("--version") && out.stderr.contains("carries on"),
            "{what}: the reason: {}",
            out.stderr
        );
        assert!(!out.stdout.contains("upgraded"), "{what}: {}", out.stdout);
        load.more(10);
        assert_eq!(d.pid(), daemon_pid);
        assert!(
            testkit::procs::alive(daemon_pid),
            "{what}: the old daemon runs on"
        );
        assert_eq!(
            roster(&d, "a"),
            before,
            "{what}: the same replicas, pids and roles"
        );
    }
    // The real binary back: the upgrade goes through.
    d.replace_binary(&std::fs::read(hearth()).unwrap(), 0o755);
    let out = d.cli_ok(&["upgrade"]);
    assert!(out.contains("upgraded"), "{out}");
    load.more(10);
    let (ok, failed, errors) = load.finish();
    println!("refused upgrades, then one: {ok} completions, {failed} failed");
    assert_eq!(failed, 0, "{errors:?}");
    assert_eq!(d.pid(), daemon_pid);
    assert_eq!(roster(&d, "a"), before);
    assert!(
        !exe_of(daemon_pid).ends_with("(deleted)"),
        "the new file runs: {}",
        exe_of(daemon_pid)
    );
}

/// Item 2: a new binary that fails while adopting (`fault`: it panics, or its start returns an
/// error) falls back to the previous binary, which takes the replicas back.
fn a_failed_adoption_falls_back(fault: &str) {
    let toy = Model::toy("a", &[]).scale(2, 2, 0);
    let builder = Daemon::builder()
        .model(toy)
        .tick("100ms")
        .env("HEARTH_FAULT_INJECT_FAIL_HANDOVER", fault);
    let Some(d) = in_cgroup(builder) else {
        return;
    };
    d.wait_settled("a", 2, 0, Duration::from_secs(60));
    let before = roster(&d, "a");
    let daemon_pid = d.pid();
    let spawned = spawned_lines(&d);
    let load = round_robin(d.in_state("a", "routed").iter().map(addr).collect());
    load.more(10);
    // Another file at the path (the same build, as an install would put it): what runs after
    // the fallback is the file that was replaced.
    d.replace_binary(&std::fs::read(hearth()).unwrap(), 0o755);
    let out = d.cli(&["upgrade"]);
    println!(
        "upgrade to a binary whose adoption fails ({fault}): exit {:?}: {}",
        out.status.code(),
        out.stderr.trim()
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}\n{}", d.log_tail(40));
    assert!(
        out.stderr
            .contains("failed before it had adopted the hand-over")
            && out.stderr.contains("fault injected"),
        "the reason: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("2 of 2 replica(s) kept"),
        "{}",
        out.stderr
    );
    load.more(10);
    assert_eq!(d.pid(), daemon_pid);
    assert!(
        exe_of(daemon_pid).ends_with("(deleted)"),
        "the previous binary runs again: {}",
        exe_of(daemon_pid)
    );
    assert_eq!(roster(&d, "a"), before, "the same replicas, pids and roles");
    assert_eq!(spawned_lines(&d), spawned, "no replica started");
    let upgrade = &d.status()["daemon"]["upgrade"];
    assert_eq!(upgrade["outcome"], "fell_back", "{upgrade}");
    assert!(
        d.log().contains("back after a failed upgrade"),
        "{}",
        d.log_tail(40)
    );
    // The fault trips once: the next upgrade takes.
    let out = d.cli_ok(&["upgrade"]);
    assert!(out.contains("upgraded"), "{out}");
    load.more(10);
    let (ok, failed, errors) = load.finish();
    println!("fallback, then an upgrade: {ok} completions, {failed} failed");
    assert_eq!(failed, 0, "{errors:?}");
    assert_eq!(roster(&d, "a"), before);
    assert!(!exe_of(daemon_pid).ends_with("(deleted)"));
    assert_eq!(d.status()["daemon"]["upgrade"]["outcome"], "done");
}

#[test]
fn a_new_binary_that_panics_while_adopting_falls_back_to_the_previous_one() {
    a_failed_adoption_falls_back("panic");
}

#[test]
fn a_new_binary_whose_start_fails_while_adopting_falls_back_to_the_previous_one() {
    a_failed_adoption_falls_back("error");
}

/// A sleeping tier across `hearth upgrade`: the replicas asleep are taken back asleep (their
/// state asked, not their warm-up, which would wake them), the same processes, none started.
#[test]
fn an_upgrade_keeps_sleeping_replicas_asleep_and_starts_none() {
    let toy = Model::toy(
        "s",
        &[
            "--host",
            "127.0.0.1",
            "--load-time",
            "3s",
            "--sleep-time",
            "500ms",
            "--wake-time",
            "1s",
        ],
    )
    .scale(3, 3, 0)
    .sleep("format = \"vllm\"\nsleep_timeout = \"30s\"\nwake_timeout = \"30s\"");
    let Some(d) = in_cgroup(Daemon::builder().model(toy)) else {
        return;
    };
    let asleep = |r: &Vec<(String, i32, String)>| r.iter().filter(|x| x.2 == "sleeping").count();
    let before = wait_until("1 routed, 2 asleep", Duration::from_secs(90), || {
        // (`roster` wants a pid of each: only once none is pending.)
        let started = d.replicas("s").iter().all(|r| r["pid"].is_u64());
        let r = started.then(|| roster(&d, "s"))?;
        (asleep(&r) == 2 && r.iter().any(|x| x.2 == "routed")).then_some(r)
    });
    let spawned = spawned_lines(&d);
    d.cli_ok(&["upgrade"]);
    let upgrade = &d.status()["daemon"]["upgrade"];
    assert_eq!(upgrade["outcome"], "done", "{upgrade}");
    assert_eq!(upgrade["kept"], 3, "{upgrade}");
    // Taken back as they were: the same processes in the same states, for a while.
    for _ in 0..10 {
        assert_eq!(roster(&d, "s"), before, "{}", d.log_tail(40));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        d.log().contains("was sleeping"),
        "adopted asleep: {}",
        d.log_tail(40)
    );
    // Still asleep as the servers themselves say, and nothing was started.
    for r in d.replicas("s") {
        if r["state"] == "sleeping" {
            let said = http(
                &addr(&r),
                "GET",
                "/is_sleeping",
                None,
                Duration::from_secs(5),
            )
            .unwrap();
            assert_eq!(said.body, r#"{"is_sleeping":true}"#, "{r}");
        }
    }
    assert_eq!(
        spawned_lines(&d),
        spawned,
        "no cold start across the upgrade"
    );
}
