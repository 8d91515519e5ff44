//! The test harness itself (testkit/): it runs the binary cargo built, its port blocks are
//! exclusive across processes, and its cleanup leaves no process behind, also when a test
//! panics.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use testkit::ports::{is_held, ports};
use testkit::procs::{alive, procs_with_env, MARK};
use testkit::*;

#[test]
fn the_harness_runs_the_binary_cargo_built() {
    assert_eq!(hearth(), Path::new(env!("CARGO_BIN_EXE_hearth")));
}

#[test]
fn port_blocks_are_bindable_disjoint_and_locked_until_dropped() {
    let a = ports(10);
    let b = ports(3);
    assert!(
        a.last - a.first + 1 >= 10 && b.last - b.first + 1 >= 3,
        "{a:?} {b:?}"
    );
    assert!(a.last < b.first || b.last < a.first, "{a:?} overlaps {b:?}");
    // Another process asking for these slots is refused: a lock is per open file, so this
    // fresh open stands for any other test binary or checkout on the machine.
    assert!(is_held(a.first) && is_held(b.first));
    let first = a.first;
    drop(a);
    assert!(!is_held(first), "the lock outlived its block");
}

/// Every process of a daemon (the daemon, its replicas, and a grandchild that left the
/// replica's session) is killed when a test panics with the daemon in scope; none is left.
#[test]
fn a_panicking_test_leaves_no_process_behind() {
    // The replica's shell forks a detached sleeper in a session of its own, then becomes the
    // toy server.
    let script = format!(
        "setsid sleep 600 & exec '{}' toy-server --port {{port}}",
        hearth().display()
    );
    let d = Daemon::start([Model::toy("toy", &[])
        .scale(1, 1, 0)
        .command(&["/bin/sh", "-c", &script])]);
    d.wait_settled("toy", 1, 0, Duration::from_secs(20));
    let mark = format!("{MARK}={}", d.dir.path().display());
    let daemon = d.pid();
    let all = wait_until("the sleeper and the toy", Duration::from_secs(10), || {
        let v = procs_with_env(&mark);
        (v.len() >= 3).then_some(v)
    });
    assert!(
        all.contains(&daemon),
        "the daemon carries the mark: {all:?}"
    );

    let outcome = catch_unwind(AssertUnwindSafe(move || {
        let _d = d;
        panic!("a test fails with its daemon running");
    }));
    assert!(outcome.is_err());
    let left: Vec<i32> = all.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        left.is_empty(),
        "alive after the panic: {left:?} of {all:?}"
    );
    assert!(procs_with_env(&mark).is_empty());
    // The daemon was reaped, not left a zombie: its pid is gone.
    assert!(
        !Path::new(&format!("/proc/{daemon}")).exists(),
        "the daemon {daemon} was not reaped"
    );
}

/// The configuration the harness renders is what `hearth check-config` accepts, every option
/// of the builder included.
#[test]
fn every_rendered_option_passes_check_config() {
    let mut m = Model::toy("full", &["--load-time", "1s"])
        .gpus(1, "10GiB")
        .liveness("1s", "1s", 3)
        .scrape("vllm", "1s")
        .stale_after("5s");
    m.placement = Some("spread".into());
    m.priority = Some(3);
    m.prefetch = vec!["/nonexistent/*.bin".into()];
    m.env.push(("EXTRA".into(), "a \"quoted\" value".into()));
    m.scaling.max_up_step = Some(2);
    let (home, _) = Daemon::builder()
        .metrics(9)
        .log_level("debug")
        .gpus("static", &[("GPU-a", "80GiB")])
        .models([m, Model::toy("plain", &[])])
        .prepare();
    let mut cmd = std::process::Command::new(hearth());
    cmd.arg("check-config").arg(&home.config_path);
    let out = run(&mut cmd, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}\n{}",
        out.stderr,
        home.config_text()
    );
}

/// Where the harness looks for a daemon's replica cgroups (to count them and to clean up) is
/// where the daemon puts them, as its log says.
#[test]
fn the_harness_finds_the_daemons_replica_cgroups() {
    let d = Daemon::start([Model::toy("toy", &[]).scale(1, 1, 0)]);
    d.wait_settled("toy", 1, 0, Duration::from_secs(30));
    let log = d.log();
    if !needs_cgroup2(&d) {
        return;
    }
    let line = log
        .lines()
        .find(|l| l.contains("containment: cgroup2 subtree at "))
        .expect("the containment line");
    let expected = testkit::cgroups::subtree(&d.dir.path().join("state")).unwrap();
    assert!(
        line.contains(&format!("at {} (", expected.display())),
        "{line} vs {expected:?}"
    );
    let r = &d.replicas("toy")[0];
    let procs = testkit::cgroups::procs(&expected.join(testkit::status::id(r)));
    assert!(procs.contains(&testkit::status::pid(r)), "{procs:?}");
}

/// A test that lacks what it needs fails, naming it; it passes with a SKIPPED note only when
/// HEARTH_ALLOW_SKIP=1 is set (and "1" only). Run on this binary's own `a_test_that_needs_…`.
#[test]
fn a_test_that_cannot_run_here_fails_unless_skips_are_allowed() {
    // The probe's name as libtest knows it: its path in this test binary, without the crate's.
    let name = format!(
        "{}::a_test_that_needs_what_no_host_has",
        module_path!().split_once("::").map_or("", |(_, m)| m)
    );
    let run = |allow: Option<&str>| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            name.as_str(),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env_remove(testkit::needs::ALLOW_SKIP);
        if let Some(v) = allow {
            cmd.env(testkit::needs::ALLOW_SKIP, v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    for allow in [None, Some("0"), Some("yes")] {
        let (passed, text) = run(allow);
        assert!(!passed, "{allow:?}: passed:\n{text}");
        assert!(
            text.contains("a_test_that_needs_what_no_host_has cannot run here")
                && text.contains("lacks a unicorn (for the probe)")
                && text.contains("HEARTH_ALLOW_SKIP=1"),
            "{allow:?}: says what is missing and how to skip:\n{text}"
        );
        assert!(!text.contains("got past"), "{text}");
    }
    let (passed, text) = run(Some("1"));
    assert!(passed, "HEARTH_ALLOW_SKIP=1: failed:\n{text}");
    assert!(
        text.contains(&format!("SKIPPED (HEARTH_ALLOW_SKIP=1): {name}:"))
            && !text.contains("got past"),
        "{text}"
    );
}

/// The probe the test above runs (ignored in a normal run: it cannot pass without the variable).
#[test]
#[ignore = "run by a_test_that_cannot_run_here_fails_unless_skips_are_allowed"]
fn a_test_that_needs_what_no_host_has() {
    if !needs(false, || "a unicorn (for the probe)".into()) {
        return;
    }
    println!("got past the check");
}
