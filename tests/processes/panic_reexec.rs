//! A panic of the daemon's core ends in re-adoption, not in a cold start of the host (issue 11,
//! item 7), with the real binary: the daemon re-executes itself (the same pid), adopts its
//! replica from the ledger it kept saving (the same pid, routed again after its warm-up, never
//! started again) while every request is answered, sent to the replica or through the front
//! door (`hearth route`); after more panics in a row than `MAX_PANIC_REEXECS` (3) it exits
//! saying so, the replica lives on, and the next start adopts it.
//!
//! The core cannot panic by construction, so the panic is injected: the daemon runs with
//! `HEARTH_FAULT_INJECT_PANIC_ON_OP=gpus`, and its core's loop panics on every `gpus` request
//! from an admin (upgrade.rs, `PanicFault`), in every run of that daemon: a test decides by its
//! requests how many panics come in a row.
//!
//! Replicas outlive the daemon only in a cgroup: these need root and a writable cgroup v2 (CI
//! has both); elsewhere they fail saying so, unless HEARTH_ALLOW_SKIP=1 (testkit::needs).

use std::time::Duration;

use testkit::procs::alive;
use testkit::status::{addr, pid};
use testkit::*;

const FAULT_ENV: &str = "HEARTH_FAULT_INJECT_PANIC_ON_OP";
/// The op that trips the fault: nothing here sends it on its own (`hearth upgrade` waits for
/// the new binary with `version`, so not that one).
const FAULT_OP: &str = "gpus";
/// `upgrade::MAX_PANIC_REEXECS`.
const MAX_PANIC_REEXECS: usize = 3;

/// A daemon armed to panic on `gpus`, with one routed replica of a toy that takes 3 s to
/// load (a cold start would show) and no room to scale (the test's load would start a second
/// one), in a cgroup2 subtree; None where this host has none (and skips are allowed).
fn daemon() -> Option<Daemon> {
    let toy = Model::toy("a", &["--load-time", "3s"]).scale(1, 1, 0);
    armed(Daemon::builder().model(toy).tick("100ms"))
}

/// `builder` with the fault armed, started, where replicas can outlive the daemon.
fn armed(builder: DaemonBuilder) -> Option<Daemon> {
    if !needs_root("replicas outlive the daemon only in a cgroup") {
        return None;
    }
    let d = builder.env(FAULT_ENV, FAULT_OP).start();
    needs_cgroup2(&d).then_some(d)
}

/// The one routed replica of `a`: (pid, address).
fn routed_replica(d: &Daemon) -> (i32, String) {
    d.wait_settled("a", 1, 0, Duration::from_secs(60));
    let r = d.in_state("a", "routed").remove(0);
    (pid(&r), addr(&r))
}

/// Sends the op that trips the fault. The core panics on it, so the connection ends unanswered.
fn make_it_panic(d: &Daemon) {
    let answer = Conn::connect(&d.socket).and_then(|mut c| c.call(&json!({"op": FAULT_OP})));
    assert!(
        answer.is_err(),
        "`{FAULT_OP}` was answered instead of panicking the core: {answer:?}\n{}",
        d.log_tail(30)
    );
}

fn count(d: &Daemon, what: &str) -> usize {
    d.log().matches(what).count()
}

/// Waits for the `n`th re-execution after a panic, then for the re-executed daemon's answer to
/// `status` (a new connection: the old run's are gone with it).
fn wait_reexecuted(d: &mut Daemon, n: usize) {
    let line = format!("re-executing to adopt its replicas ({n} of {MAX_PANIC_REEXECS} in a row)");
    wait_until(&line, Duration::from_secs(30), || {
        (d.log().contains(&line)).then_some(())
    });
    assert!(
        d.running(),
        "the daemon process runs on:\n{}",
        d.log_tail(40)
    );
    let socket = d.socket.clone();
    poll(Duration::from_secs(30), || {
        let a = Conn::connect(&socket)
            .and_then(|mut c| c.call(&json!({"op": "status"})))
            .ok()?;
        (a["ok"] == json!(true)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "no answer to status after re-execution {n}:\n{}",
            d.log_tail(40)
        )
    });
}

/// Completions straight to a replica, one after the other until stopped.
fn load_to_replica(addr: String) -> Load {
    Load::start(move || match complete(&addr, Duration::from_secs(10)) {
        Ok(r) if r.status == 200 => Ok(()),
        other => Err(format!("{other:?}")),
    })
}

/// Completions through the front door, one after the other until stopped.
fn load_through(front_door: std::net::SocketAddr) -> Load {
    Load::start(
        move || match testkit::route::complete(front_door, "a", Duration::from_secs(30)) {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(format!("{} {}", r.status, r.text())),
            Err(e) => Err(e.to_string()),
        },
    )
}

/// The replica routed now is the one of `pid`, and no replica was spawned since `spawned` spawns
/// had been logged: it was adopted, not started again.
fn assert_adopted_without_a_cold_start(d: &Daemon, pid: i32, spawned: usize) {
    let (again_pid, _) = routed_replica(d);
    assert_eq!(again_pid, pid, "adopted:\n{}", d.log_tail(40));
    assert_eq!(
        count(d, "spawned: "),
        spawned,
        "no replica cold-started:\n{}",
        d.log_tail(40)
    );
}

#[test]
fn a_core_panic_re_executes_the_daemon_which_adopts_its_replica_without_a_cold_start() {
    let Some(mut d) = daemon() else {
        return;
    };
    assert!(
        d.log().contains(&format!(
            "fault injection ({FAULT_ENV}): the daemon panics on every `{FAULT_OP}` request"
        )),
        "the armed fault is said at start:\n{}",
        d.log_tail(20)
    );
    let daemon_pid = d.pid();
    let (replica_pid, replica_addr) = routed_replica(&d);
    let spawned = count(&d, "spawned: ");
    let adoptions = count(&d, "adopted 1 replica(s), stopping 0");
    let load = load_to_replica(replica_addr.clone());
    load.more(20);

    make_it_panic(&d);
    wait_reexecuted(&mut d, 1);
    assert_eq!(d.pid(), daemon_pid);
    assert!(alive(daemon_pid), "the same process runs on");
    let log = d.log();
    assert!(
        log.contains(&format!(
            "fault injected by {FAULT_ENV}: a `{FAULT_OP}` request"
        )),
        "the panic is in the log:\n{}",
        d.log_tail(40)
    );
    assert!(
        log.contains("the daemon panicked: re-executing to adopt its replicas"),
        "{}",
        d.log_tail(40)
    );

    // The same replica, routed again after its warm-up: adopted, never started again.
    let (again_pid, again_addr) = routed_replica(&d);
    assert_eq!(
        (again_pid, again_addr.as_str()),
        (replica_pid, replica_addr.as_str()),
        "the same replica is routed again:\n{}",
        d.log_tail(40)
    );
    assert_eq!(
        count(&d, "adopted 1 replica(s), stopping 0"),
        adoptions + 1,
        "adopted by the re-executed daemon:\n{}",
        d.log_tail(40)
    );
    assert_eq!(
        count(&d, "spawned: "),
        spawned,
        "no replica cold-started:\n{}",
        d.log_tail(40)
    );
    for r in d.replicas("a") {
        assert_eq!(r["restarts"], json!(0), "{r}");
    }
    // The re-executed daemon takes operators' requests as before.
    d.cli_ok(&["status"]);

    load.more(20);
    let (ok, failed, errors) = load.finish();
    println!("a core panic and the re-execution: {ok} completions to the replica, {failed} failed");
    assert_eq!(failed, 0, "the replica kept answering: {errors:?}");
    assert!(d.children().contains(&replica_pid));
}

#[test]
fn more_panics_in_a_row_than_the_limit_end_the_daemon_and_the_replica_lives_on_to_be_adopted() {
    let Some(mut d) = daemon() else {
        return;
    };
    let (replica_pid, replica_addr) = routed_replica(&d);
    let spawned = count(&d, "spawned: ");
    for n in 1..=MAX_PANIC_REEXECS {
        make_it_panic(&d);
        wait_reexecuted(&mut d, n);
    }
    // One more in a row: not re-executed, the process ends with the panic.
    make_it_panic(&d);
    let st = d.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "the daemon still runs after {} panics in a row:\n{}",
            MAX_PANIC_REEXECS + 1,
            d.log_tail(40)
        )
    });
    assert!(!st.success(), "{st}");
    let last = MAX_PANIC_REEXECS + 1;
    assert!(
        d.log().contains(&format!(
            "the daemon panicked {last} times in a row: exiting; its replicas keep serving until the next start adopts them"
        )),
        "{}",
        d.log_tail(40)
    );
    assert_eq!(
        count(&d, "the daemon panicked: re-executing"),
        MAX_PANIC_REEXECS,
        "{}",
        d.log_tail(40)
    );

    // Nobody supervises the replica now; it lives on and answers.
    assert!(alive(replica_pid), "the replica outlived the daemon");
    let r = complete(&replica_addr, Duration::from_secs(10)).expect("the replica answers");
    assert_eq!(r.status, 200);

    // The next start (what the service manager's restart does) adopts it.
    d.restart();
    assert_adopted_without_a_cold_start(&d, replica_pid, spawned);
    // Dropping `d` kills the daemon and the replica it adopted, and fails if either survives.
}

#[test]
fn the_fault_outlives_an_upgrade_and_the_upgraded_daemon_panics_and_adopts_the_same_way() {
    let Some(mut d) = daemon() else {
        return;
    };
    let (replica_pid, _) = routed_replica(&d);
    let spawned = count(&d, "spawned: ");
    let out = d.cli_ok(&["upgrade"]);
    assert!(out.contains("upgraded"), "{out}");
    wait_until("the upgraded daemon", Duration::from_secs(30), || {
        d.log()
            .contains("taking over from the previous binary")
            .then_some(())
    });
    assert_eq!(
        count(&d, "fault injection ("),
        2,
        "armed again in the new binary:\n{}",
        d.log_tail(20)
    );
    make_it_panic(&d);
    wait_reexecuted(&mut d, 1);
    assert_adopted_without_a_cold_start(&d, replica_pid, spawned);
}

#[test]
fn a_fault_that_names_no_op_refuses_the_start_and_nothing_runs() {
    let mut d = Daemon::builder()
        .model(Model::toy("a", &[]))
        .env(FAULT_ENV, "panic-please")
        .spawn();
    let st = d
        .wait_exit(Duration::from_secs(30))
        .expect("the daemon exits");
    assert_eq!(st.code(), Some(1), "{}", d.log());
    assert!(
        d.log()
            .contains(&format!("{FAULT_ENV}=\"panic-please\" is not an op")),
        "{}",
        d.log()
    );
    assert!(!d.socket.exists(), "nothing bound");
    assert!(
        d.children().is_empty(),
        "nothing started: {:?}",
        d.children()
    );
}

#[test]
fn requests_through_the_front_door_are_all_answered_across_a_core_panic() {
    let toy = Model::front_toy("a", &["--load-time", "3s"]).scale(1, 1, 0);
    let Some(mut d) = armed(testkit::route::front_door_daemon([toy], "")) else {
        return;
    };
    let router = testkit::route::Router::start(&d);
    let (replica_pid, _) = routed_replica(&d);
    let connected = |router: &testkit::route::Router| {
        wait_until(
            "the router following the daemon",
            Duration::from_secs(30),
            || (router.metric("hearth_route_daemon_connected")? == 1.0).then_some(()),
        )
    };
    connected(&router);
    let load = load_through(router.addr);
    load.more(20);

    make_it_panic(&d);
    wait_reexecuted(&mut d, 1);
    let (again_pid, _) = routed_replica(&d);
    assert_eq!(again_pid, replica_pid, "adopted:\n{}", d.log_tail(40));
    connected(&router);
    load.more(20);
    let (ok, failed, errors) = load.finish();
    println!("a core panic under the front door: {ok} completions, {failed} failed");
    assert_eq!(failed, 0, "{errors:?}");
}
