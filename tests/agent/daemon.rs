//! The daemon process itself: orderly shutdown on SIGTERM, no orphans after SIGKILL where
//! replicas have no cgroup, configuration errors that stop it before anything starts, and the
//! README's quick start as written, by root, with unprivileged replicas that all report.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use testkit::procs::{alive, group_members, signal};
use testkit::status::pid;
use testkit::*;

/// Starts 2 routed + 1 warm toy replicas and returns their pids once they are all up.
fn three_replicas(d: &Daemon) -> Vec<i32> {
    d.wait_settled("toy", 2, 1, Duration::from_secs(20));
    let mut pids: Vec<i32> = d.replicas("toy").iter().map(pid).collect();
    pids.sort();
    // The environment mark finds exactly these: the harness's sweep relies on it.
    assert_eq!(d.children(), pids, "processes carrying the daemon's mark");
    pids
}

#[test]
fn sigterm_stops_every_replica_removes_the_socket_and_exits_0() {
    let mut d = Daemon::start([Model::toy("toy", &["--load-time", "300ms"])]);
    let pids = three_replicas(&d);
    assert!(d.socket.exists());

    d.signal(Signal::SIGTERM);
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

/// Without a cgroup (process groups only) a replica could not be found again by the next run,
/// so it dies with the daemon (PDEATHSIG). In a cgroup it outlives the daemon and is adopted
/// (tests/processes/outlive.rs).
#[test]
fn without_a_cgroup_sigkill_of_the_daemon_leaves_no_replica_alive_2s_later() {
    let mut d = Daemon::builder()
        .model(Model::toy("toy", &["--load-time", "300ms"]))
        .env("HEARTH_CONTAINMENT", "groups")
        .start();
    let pids = three_replicas(&d);

    d.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let status = d
        .wait_exit(Duration::from_secs(2))
        .expect("the daemon survived SIGKILL");
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    let still = || -> Vec<i32> {
        let mut v: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        v.extend(d.children());
        v
    };
    let left = poll(
        Duration::from_secs(2).saturating_sub(killed.elapsed()),
        || still().is_empty().then_some(()),
    );
    eprintln!(
        "no replica alive {:?} after SIGKILL of the daemon",
        killed.elapsed()
    );
    assert!(
        left.is_some(),
        "2 s after SIGKILL of the daemon, still alive: {:?} (replicas were {pids:?})",
        still()
    );
}

/// A model whose command leaves a mark when it runs: if the daemon starts anything, it shows.
fn marked_model(marker: &std::path::Path) -> Model {
    let script = format!(
        "touch '{}'; exec '{}' toy-server --port {{port}}",
        marker.display(),
        hearth().display()
    );
    Model::toy("toy", &[])
        .scale(1, 2, 0)
        .command(&["/bin/sh", "-c", &script])
}

/// 1-based line of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(prefix))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{text}"))
}

/// A daemon about to start `marked_model`, with its configuration edited by `edit`: the
/// configuration's path, what `check-config` says about it, and the marker's path.
fn check_config(
    edit: impl FnOnce(String) -> String,
) -> (Home, Launch, CliOutput, std::path::PathBuf) {
    let b = Daemon::builder().ports(4);
    let marker = b.dir().join("replica-ran");
    let (home, launch) = b.model(marked_model(&marker)).prepare();
    let good = home.config_text();
    let text = edit(good.clone());
    std::fs::write(&home.config_path, &text).unwrap();
    let mut cmd = std::process::Command::new(hearth());
    cmd.arg("check-config").arg(&home.config_path);
    let out = run(&mut cmd, Duration::from_secs(30));
    (home, launch, out, marker)
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
        let (home, launch, out, marker) = check_config(|good| {
            let bad = (case.edit)(good.clone());
            assert_ne!(bad, good, "{}: the edit did not apply", case.what);
            bad
        });
        let bad = std::fs::read_to_string(&home.config_path).unwrap();
        let want = format!(
            "{}:{}:",
            home.config_path.display(),
            line_of(&bad, case.line_prefix)
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: check-config: {}",
            case.what,
            out.stderr
        );
        assert!(
            out.stderr.contains(&want) && out.stderr.contains(case.key),
            "{}: check-config should name {want} and {}: {}",
            case.what,
            case.key,
            out.stderr
        );

        let mut d = launch.spawn(home);
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
    let (home, launch, out, marker) = check_config(|good| good);
    assert_eq!(
        out.status.code(),
        Some(0),
        "check-config of the good file: {}",
        out.stderr
    );
    assert!(out.stdout.contains("ok"));
    let mut d = launch.spawn(home);
    wait_until("the marked replica runs", Duration::from_secs(10), || {
        marker.exists().then_some(())
    });
    assert!(d.running());
}

/// The README's quick start as written (`hearth daemon --config config.toml.example` from a
/// fresh clone, its `target/release` on PATH), run by root on a machine without hearth's
/// accounts: the daemon makes the `hearth` account and says so, the replicas run as it, are
/// told an absolute `HEARTH_SOCKET`, and every one of them reports for itself (its log says
/// nothing about its reports: no "Permission denied"); `hearth status` answers as the README
/// runs it; one SIGTERM stops it in order, without drains waiting out their timeout.
#[test]
fn the_quick_start_as_written_by_root_gets_reports_from_every_unprivileged_replica() {
    let Some(fresh) = FreshAccounts::needed() else {
        eprintln!("note: not root: replicas run as the test's own account");
        return;
    };
    let co = Checkout::new();
    let mut daemon = co.daemon(
        &fresh.wrapper(),
        &[("HEARTH_REPLICA_LOGS", "files"), ("RUST_LOG", "info")],
    );
    let model = wait_until("2 routed + 1 warm", Duration::from_secs(60), || {
        if let Ok(Some(st)) = daemon.try_wait() {
            panic!("the daemon exited ({st}):\n{}", co.log());
        }
        let out = co.cli(&["status", "--json"]);
        let st: Value = serde_json::from_str(&out.stdout).ok()?;
        let m = st["models"][0].clone();
        (m["routed"] == 2 && m["warm"] == 1).then_some(m)
    });
    let (hearth_uid, _) = fresh
        .account("hearth")
        .unwrap_or_else(|| panic!("no account hearth was made:\n{}", co.log()));
    assert!(
        co.log().contains("no account \"hearth\": created it with"),
        "{}",
        co.log()
    );
    let socket = co.socket().display().to_string();
    let replicas = testkit::status::replicas_of(&model);
    for r in &replicas {
        let p = pid(r);
        assert_eq!(testkit::procs::uid(p), Some(hearth_uid), "{r}");
        assert_eq!(
            testkit::procs::env_var(p, "HEARTH_SOCKET").as_deref(),
            Some(socket.as_str()),
            "the absolute socket path"
        );
    }
    // Reports every 200 ms from each since it loaded; a failed connection or a refused report
    // is logged by the replica (once per distinct message).
    wait_until("the replicas' own reports", Duration::from_secs(10), || {
        let out = co.cli(&["status", "toy", "--json"]);
        let st: Value = serde_json::from_str(&out.stdout).ok()?;
        st["models"][0]["signal"]["age_ms"]
            .as_u64()
            .filter(|age| *age < 1000)
    });
    std::thread::sleep(Duration::from_secs(2));
    let logs = co.path().join("target/hearth-example/state/logs");
    for r in &replicas {
        let id = r["id"].as_str().unwrap();
        let text = std::fs::read_to_string(logs.join(format!("{id}.log")))
            .unwrap_or_else(|e| panic!("{id}'s log: {e}"));
        assert!(
            !text.contains("Permission denied") && !text.contains("toy-server: report:"),
            "{id} could not report:\n{text}"
        );
    }
    let shown = co.cli(&["status"]);
    assert!(
        shown.status.success() && shown.stdout.contains("toy"),
        "{shown:?}"
    );
    signal(daemon.id() as i32, Signal::SIGTERM);
    let asked = Instant::now();
    let status = poll(Duration::from_secs(40), || daemon.try_wait().ok().flatten())
        .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", co.log()));
    let took = asked.elapsed();
    eprintln!("SIGTERM → exit in {took:?}");
    assert_eq!(status.code(), Some(0), "{}", co.log());
    // Drains end once the replicas report nothing in flight; without reports each would wait
    // out its deadline (20 s here: shutdown_timeout less stop_grace).
    assert!(took < Duration::from_secs(15), "{took:?}:\n{}", co.log());
}
