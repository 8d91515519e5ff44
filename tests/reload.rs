//! Live reload with the real binary: SIGHUP and `hearth reload` re-read the file; scaling-only
//! changes keep every process, a broken file changes nothing, a new version rolls over without
//! dropping below `min` routed, and a version that never warms halts and latches.

mod systemd_support;

use std::time::Duration;

use serde_json::Value;
use systemd_support::*;

fn reload_ok(d: &Daemon) {
    let out = d.cli(&["reload"]);
    assert!(
        out.status.success(),
        "hearth reload: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
}

/// Routed replicas (id, pid) of `model`.
fn routed(d: &Daemon, model: &str) -> Vec<(String, Option<i64>)> {
    d.replicas(model)
        .into_iter()
        .filter(|r| r.1 == "routed")
        .map(|r| (r.0, r.2))
        .collect()
}

/// The smallest routed set a watch saw, and the routed events it saw.
fn routed_sets(w: &Watch) -> Vec<Vec<String>> {
    w.events()
        .iter()
        .filter(|e| e["event"] == "routed")
        .map(endpoint_ids)
        .collect()
}

#[test]
fn a_scaling_only_change_keeps_every_replica_and_daemon_changes_apply_or_warn() {
    let mut opts = Opts::new(vec![Toy::new("toy")]);
    let mut d = Daemon::start(opts.clone());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    let before = d.replicas("toy");
    let watch = d.watch("toy");

    opts.models[0].max = 5;
    opts.models[0].target_wait = "20s".into();
    opts.tick = "200ms".into();
    // Not live: the metrics listener is bound at start.
    let metrics_port = free_ports(1).0;
    opts.metrics = Some(metrics_port);
    d.write_config(opts.clone());
    reload_ok(&d);

    let m = d.model("toy");
    assert_eq!(m["max"], 5, "the scaling change applied: {m}");
    assert_eq!(m["target_wait_ms"], 20000);
    assert!(m["rollout"].is_null(), "no rollout for scaling: {m}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.replicas("toy"), before, "same replicas, same pids");
    assert!(
        watch.events().iter().all(|e| e["event"] != "replica"),
        "no replica changed state: {:?}",
        watch.events()
    );
    let log = d.log();
    assert!(log.contains("daemon.tick 100ms → 200ms"), "{log}");
    assert!(
        log.contains(&format!(
            "daemon.metrics changed from none to 127.0.0.1:{metrics_port}: not applied, takes a restart"
        )),
        "{log}"
    );
    assert!(
        http_get(metrics_port, "/metrics").is_err(),
        "nothing listens on a metrics address that needs a restart"
    );
}

#[test]
fn a_broken_file_keeps_the_running_configuration_and_every_replica() {
    let mut opts = Opts::new(vec![Toy::new("toy")]);
    let mut d = Daemon::start(opts.clone());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    let before = d.replicas("toy");

    // A bad value on a line the error must name.
    let good = std::fs::read_to_string(&d.config_path).unwrap();
    let line = good
        .lines()
        .position(|l| l == "max = 4")
        .expect("the max line")
        + 1;
    let broken = good.replace("max = 4", "max = \"four\"");
    std::fs::write(&d.config_path, &broken).unwrap();

    let out = d.cli(&["reload"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "hearth reload fails on a bad file"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let at = format!("{}:{line}:", d.config_path.display());
    assert!(
        err.contains(&at) && err.contains("max"),
        "the error names the file, line {line} and key: {err}"
    );
    assert!(err.contains("not reloaded"), "{err}");

    // The same by SIGHUP: logged, nothing else happens.
    d.signal(libc::SIGHUP);
    wait_until(
        "the refused SIGHUP in the log",
        Duration::from_secs(5),
        || {
            d.log()
                .contains("SIGHUP: configuration not reloaded, the running one is kept")
                .then_some(())
        },
    );
    assert!(d.running());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(d.replicas("toy"), before, "the fleet is untouched");
    assert_eq!(d.model("toy")["max"], 4, "the old configuration runs");

    // A good file afterwards reloads as usual.
    opts.models[0].max = 6;
    d.write_config(opts);
    reload_ok(&d);
    assert_eq!(d.model("toy")["max"], 6);
    assert_eq!(d.replicas("toy"), before);
}

#[test]
fn a_new_version_rolls_over_without_dropping_below_min_routed() {
    let mut opts = Opts::new(vec![Toy::new("toy")]);
    let mut d = Daemon::start(opts.clone());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    let old: Vec<String> = d.replicas("toy").into_iter().map(|r| r.0).collect();
    // Watched from before the reload to the end: every routed set the routers were given.
    let watch = d.watch("toy");
    wait_until("the routed snapshot", Duration::from_secs(5), || {
        (!routed_sets(&watch).is_empty()).then_some(())
    });

    opts.models[0].version = "2".into();
    d.write_config(opts);
    reload_ok(&d);
    let rollout = d.model("toy")["rollout"].clone();
    assert!(
        rollout["version"] == "2" && rollout["from"] == "1" && rollout["halted"].is_null(),
        "status says so: {rollout}"
    );

    let m = wait_until("the rollout to finish", Duration::from_secs(60), || {
        let m = d.model("toy");
        let reps = m["replicas"].as_array().unwrap().clone();
        (m["rollout"].is_null()
            && m["routed"] == 2
            && m["warm"] == 1
            && reps.len() == 3
            && reps.iter().all(|r| r["version"] == "2"))
        .then_some(m)
    });
    let new: Vec<String> = m["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert!(new.iter().all(|id| !old.contains(id)), "all replaced");

    let sets = routed_sets(&watch);
    assert!(sets.len() >= 2, "the routed set changed: {sets:?}");
    for set in &sets {
        assert!(set.len() >= 2, "routed fell below min = 2: {sets:?}");
    }
    // New replicas were routed before the first old one left the routed set.
    let events = watch.events();
    let first = |pred: &dyn Fn(&Value) -> bool| events.iter().position(pred);
    let new_routed = first(&|e| {
        e["event"] == "replica"
            && e["state"] == "routed"
            && !old.iter().any(|o| e["replica"] == o.as_str())
    })
    .expect("a new replica routed");
    let old_draining = first(&|e| {
        e["event"] == "replica"
            && e["state"] == "draining"
            && old.iter().any(|o| e["replica"] == o.as_str())
    })
    .expect("an old replica drained");
    assert!(new_routed < old_draining, "warm before drain: {events:#?}");
}

#[test]
fn a_version_that_never_warms_halts_and_the_old_one_keeps_serving() {
    let mut opts = Opts::new(vec![Toy::new("toy")]);
    let mut d = Daemon::start(opts.clone());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    let serving = routed(&d, "toy");
    assert_eq!(serving.len(), 2);
    let watch = d.watch("toy");

    opts.models[0].version = "2".into();
    opts.models[0].args.push("--fail-warmup".into());
    opts.models[0].startup_timeout = "2s".into();
    d.write_config(opts);
    reload_ok(&d);

    let m = wait_until("the rollout to halt", Duration::from_secs(60), || {
        let m = d.model("toy");
        m["rollout"]["halted"].is_string().then_some(m)
    });
    let why = m["rollout"]["halted"].as_str().unwrap().to_string();
    assert!(
        why.starts_with("rollout of version 2 halted after 3 replicas failed to warm up")
            && why.contains("version 1 keeps serving"),
        "{why}"
    );
    assert_eq!(
        routed(&d, "toy"),
        serving,
        "same routed replicas, same pids"
    );

    // Latched: the pool refills with version 1, and version 2 is not tried again.
    let settled = d.wait_settled("toy", 2, 1, Duration::from_secs(60));
    assert!(settled["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["version"] == "1"));
    let after = d.replicas("toy");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(d.replicas("toy"), after, "no further attempts");
    assert_eq!(
        d.model("toy")["rollout"]["halted"].as_str(),
        Some(why.as_str())
    );
    assert_eq!(routed(&d, "toy"), serving);
    for set in routed_sets(&watch) {
        assert_eq!(set.len(), 2, "routed stayed at 2 throughout");
    }
}

#[test]
fn the_log_level_follows_the_file_on_reload() {
    let mut opts = Opts::new(vec![Toy::new("toy")]);
    opts.log_level = Some("info".into());
    let mut d = Daemon::start(opts.clone());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    opts.log_level = Some("warn".into());
    d.write_config(opts);
    reload_ok(&d);
    let log = d.log();
    assert!(log.contains(r#"log level "info" → "warn""#), "{log}");
    let lines = log.lines().count();
    // Churn that logs at info level: a drained warm replica and its replacement.
    let warm = d
        .replicas("toy")
        .into_iter()
        .find(|r| r.1 == "warm")
        .unwrap()
        .0;
    let out = d.cli(&["drain", &warm]);
    assert!(out.status.success());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    assert!(d.replicas("toy").iter().all(|r| r.0 != warm), "replaced");
    let after: Vec<String> = d.log().lines().skip(lines).map(str::to_string).collect();
    assert!(
        after.iter().all(|l| !l.contains(" INFO ")),
        "no info lines at level warn: {after:#?}"
    );
}

#[test]
fn a_fifo_at_the_config_path_stalls_nothing() {
    let opts = Opts::new(vec![Toy::new("toy")]);
    let mut d = Daemon::start(opts.clone());
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    // Opening a FIFO for reading waits for a writer, and none ever comes.
    std::fs::remove_file(&d.config_path).unwrap();
    nix::unistd::mkfifo(
        &d.config_path,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();

    // SIGHUP, then status at once: the connection gives up after 10 s, the FIFO never would.
    d.signal(libc::SIGHUP);
    for _ in 0..5 {
        assert_eq!(d.model("toy")["routed"], 2, "status answers");
    }
    wait_until(
        "the refused SIGHUP in the log",
        Duration::from_secs(10),
        || {
            let log = d.log();
            (log.contains("SIGHUP: configuration not reloaded, the running one is kept")
                && log.contains("not a regular file"))
            .then_some(())
        },
    );
    let out = d.cli(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "hearth reload fails");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&d.config_path.display().to_string()) && err.contains("not a regular file"),
        "{err}"
    );
    assert!(d.running());

    // A file back in its place reloads as usual.
    std::fs::remove_file(&d.config_path).unwrap();
    let mut opts = opts;
    opts.models[0].max = 6;
    d.write_config(opts);
    reload_ok(&d);
    assert_eq!(d.model("toy")["max"], 6);
}
