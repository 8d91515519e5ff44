//! The daemon process itself: orderly shutdown on SIGTERM, no orphans after SIGKILL, and
//! configuration errors that stop it before anything starts.

mod common;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::*;

/// Starts 2 routed + 1 warm toy replicas and returns their pids once they are all up.
fn three_replicas(d: &Daemon) -> Vec<i32> {
    wait_until("2 routed + 1 warm", Duration::from_secs(20), || {
        let m = d.model("toy");
        (m["routed"] == 2 && m["warm"] == 1 && m["starting"] == 0 && m["pending"] == 0)
            .then_some(())
    });
    let mut pids: Vec<i32> = d
        .replicas("toy")
        .iter()
        .map(|r| r["pid"].as_i64().unwrap() as i32)
        .collect();
    pids.sort();
    // The environment mark finds exactly these: the harness's sweep relies on it.
    let mut marked = d.children();
    marked.sort();
    assert_eq!(
        marked, pids,
        "processes carrying the daemon's HEARTH_SOCKET"
    );
    pids
}

#[test]
fn sigterm_stops_every_replica_removes_the_socket_and_exits_0() {
    let mut d = Daemon::start(&[ModelSpec::toy("toy", &["--load-time", "300ms"])]);
    let pids = three_replicas(&d);
    assert!(d.socket.exists());

    d.signal(libc::SIGTERM);
    let asked = Instant::now();
    // shutdown_timeout is 10 s: the grace within which every replica must be gone.
    let grace = Duration::from_secs(10);
    let status = d
        .wait_exit(grace + Duration::from_secs(5))
        .expect("the daemon did not exit after SIGTERM");
    let took = asked.elapsed();
    eprintln!("SIGTERM → exit in {took:?}");
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}\n{}",
        d.log()
    );
    assert!(
        took <= grace,
        "shutdown took {took:?}, past the {grace:?} grace"
    );
    for p in &pids {
        let left = group_members(*p);
        assert!(left.is_empty(), "process group {p} still has {left:?}");
    }
    assert!(d.children().is_empty(), "left behind: {:?}", d.children());
    assert!(
        !d.socket.exists(),
        "socket {} not removed",
        d.socket.display()
    );
}

#[test]
fn sigkill_of_the_daemon_leaves_no_replica_alive_2s_later() {
    let mut d = Daemon::start(&[ModelSpec::toy("toy", &["--load-time", "300ms"])]);
    let pids = three_replicas(&d);

    d.signal(libc::SIGKILL);
    let killed = Instant::now();
    let status = d
        .wait_exit(Duration::from_secs(2))
        .expect("the daemon survived SIGKILL");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let left = poll_for(
        Duration::from_secs(2).saturating_sub(killed.elapsed()),
        || {
            let mut alive_now: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
            alive_now.extend(d.children());
            alive_now.is_empty().then_some(())
        },
    );
    eprintln!(
        "no replica alive {:?} after SIGKILL of the daemon",
        killed.elapsed()
    );
    assert!(
        left.is_some(),
        "2 s after SIGKILL of the daemon, still alive: {:?} (replicas were {pids:?})",
        pids.iter()
            .copied()
            .filter(|p| alive(*p))
            .chain(d.children())
            .collect::<Vec<_>>()
    );
}

/// A model whose command leaves a mark when it runs: if the daemon starts anything, it shows.
fn marked_model(marker: &std::path::Path) -> ModelSpec {
    let mut m = ModelSpec::toy("toy", &[]).scale(1, 2, 0);
    m.command = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "touch '{}'; exec '{}' toy-server --port {{port}}",
            marker.display(),
            HEARTH
        ),
    ];
    m
}

/// 1-based line of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(prefix))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{text}"))
}

#[test]
fn a_bad_config_exits_1_naming_the_line_and_starts_nothing() {
    struct Case {
        what: &'static str,
        edit: fn(String) -> String,
        line_prefix: &'static str,
        key: &'static str,
    }
    let cases = [
        Case {
            what: "min > max",
            edit: |t| t.replace("min = 1\nmax = 2\n", "min = 3\nmax = 2\n"),
            line_prefix: "min = 3",
            key: "model[0].scaling.min",
        },
        Case {
            what: "an unknown key",
            edit: |t| t.replace("gpus = 0\n", "gpus = 0\nbogus_key = true\n"),
            line_prefix: "bogus_key",
            key: "model[0].bogus_key",
        },
    ];
    for case in cases {
        let dir = tempfile::Builder::new()
            .prefix("hearth-it-")
            .tempdir()
            .unwrap();
        let marker = dir.path().join("replica-ran");
        let ports = free_ports(4);
        let good = config_text(
            dir.path(),
            ports,
            &DaemonOpts::default(),
            &[marked_model(&marker)],
        );
        let bad = (case.edit)(good.clone());
        assert_ne!(bad, good, "{}: the edit did not apply", case.what);
        let path = dir.path().join("config.toml");
        fs::write(&path, &bad).unwrap();
        let line = line_of(&bad, case.line_prefix);
        let want = format!("{}:{line}:", path.display());

        let out = std::process::Command::new(HEARTH)
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: check-config: {stderr}",
            case.what
        );
        assert!(
            stderr.contains(&want) && stderr.contains(case.key),
            "{}: check-config should name {want} and {}: {stderr}",
            case.what,
            case.key
        );

        let mut d = Daemon::spawn(dir, path.clone(), ports);
        let status = d
            .wait_exit(Duration::from_secs(10))
            .expect("the daemon kept running with a bad configuration");
        let log = d.log();
        assert_eq!(status.code(), Some(1), "{}: {log}", case.what);
        assert!(
            log.contains(&want) && log.contains(case.key),
            "{}: the daemon should name {want} and {}: {log}",
            case.what,
            case.key
        );
        assert!(!d.socket.exists(), "{}: a socket was bound", case.what);
        assert!(!marker.exists(), "{}: a replica was started", case.what);
        assert!(d.children().is_empty(), "{}: {:?}", case.what, d.children());
    }

    // The same file, corrected, passes check-config; and the marker does show a started replica
    // (so its absence above means something).
    let dir = tempfile::Builder::new()
        .prefix("hearth-it-")
        .tempdir()
        .unwrap();
    let marker = dir.path().join("replica-ran");
    let ports = free_ports(4);
    let good = config_text(
        dir.path(),
        ports,
        &DaemonOpts::default(),
        &[marked_model(&marker)],
    );
    let path = dir.path().join("config.toml");
    fs::write(&path, &good).unwrap();
    let out = std::process::Command::new(HEARTH)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "check-config of the good file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    let mut d = Daemon::spawn(dir, path, ports);
    wait_until("the marked replica runs", Duration::from_secs(10), || {
        marker.exists().then_some(())
    });
    assert!(d.running());
}
