//! Live reload with the real binary: SIGHUP and `hearth reload` re-read the file; scaling-only
//! changes keep every process, a broken file changes nothing, a new version rolls over without
//! dropping below `min` routed, and a version that never warms halts and latches.

use std::time::Duration;

use testkit::ports::ports;
use testkit::status::{id, ids, replicas_of};
use testkit::*;

/// 2 routed + 1 warm (max 4) of a toy server that loads for 1 s, settled.
fn started() -> Daemon {
    let d = Daemon::builder()
        .tick("100ms")
        .model(Model::toy("toy", &["--load-time", "1s"]).scale(2, 4, 1))
        .start();
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    d
}

/// (id, state, pid) of each replica of `model`, sorted by id: what a reload must keep.
fn fleet(d: &Daemon, model: &str) -> Vec<(String, String, Option<i64>)> {
    let mut v: Vec<_> = d
        .replicas(model)
        .iter()
        .map(|r| {
            (
                id(r),
                r["state"].as_str().unwrap_or_default().to_string(),
                r["pid"].as_i64(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Routed replicas (id, pid) of `model`.
fn routed(d: &Daemon, model: &str) -> Vec<(String, Option<i64>)> {
    fleet(d, model)
        .into_iter()
        .filter(|r| r.1 == "routed")
        .map(|r| (r.0, r.2))
        .collect()
}

#[test]
fn a_scaling_only_change_keeps_every_replica_and_daemon_changes_apply_or_warn() {
    let mut d = started();
    let before = fleet(&d, "toy");
    let watch = d.watch(Some("toy"));

    // Not live: the metrics listener is bound at start.
    let metrics = ports(1);
    let metrics_port = metrics.first;
    d.rewrite_config(|c| {
        c.models[0].scaling.max = 5;
        c.models[0].scaling.target_wait = Some("20s".into());
        c.tick = "200ms".into();
        c.metrics = Some(metrics_port);
    });
    d.cli_ok(&["reload"]);

    let m = d.model("toy");
    assert_eq!(m["max"], 5, "the scaling change applied: {m}");
    assert_eq!(m["target_wait_ms"], 20000);
    assert!(m["rollout"].is_null(), "no rollout for scaling: {m}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fleet(&d, "toy"), before, "same replicas, same pids");
    assert!(
        watch.values().iter().all(|e| e["event"] != "replica"),
        "no replica changed state: {:?}",
        watch.values()
    );
    let log = d.log();
    assert!(log.contains("daemon.tick 100ms → 200ms"), "{log}");
    assert!(
        log.contains(&format!(
            "daemon.metrics changed from none to 127.0.0.1:{metrics_port}: not applied, takes a restart"
        )),
        "{log}"
    );
    let scrape = http(
        &format!("127.0.0.1:{metrics_port}"),
        "GET",
        "/metrics",
        None,
        Duration::from_secs(10),
    );
    assert!(
        scrape.is_err(),
        "nothing listens on a metrics address that needs a restart"
    );
}

#[test]
fn a_broken_file_keeps_the_running_configuration_and_every_replica() {
    let mut d = started();
    let before = fleet(&d, "toy");

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
    let err = &out.stderr;
    let at = format!("{}:{line}:", d.config_path.display());
    assert!(
        err.contains(&at) && err.contains("max"),
        "the error names the file, line {line} and key: {err}"
    );
    assert!(err.contains("not reloaded"), "{err}");

    // The same by SIGHUP: logged, nothing else happens.
    d.signal(Signal::SIGHUP);
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
    assert_eq!(fleet(&d, "toy"), before, "the fleet is untouched");
    assert_eq!(d.model("toy")["max"], 4, "the old configuration runs");

    // A good file afterwards reloads as usual.
    d.rewrite_config(|c| c.models[0].scaling.max = 6);
    d.cli_ok(&["reload"]);
    assert_eq!(d.model("toy")["max"], 6);
    assert_eq!(fleet(&d, "toy"), before);
}

#[test]
fn a_new_version_rolls_over_without_dropping_below_min_routed() {
    let mut d = started();
    let old = ids(&d.replicas("toy"));
    // Watched from before the reload to the end: every routed set the routers were given.
    let watch = d.watch(Some("toy"));
    wait_until("the routed snapshot", Duration::from_secs(5), || {
        (!watch.routed_sets("toy").is_empty()).then_some(())
    });

    d.rewrite_config(|c| c.models[0].version = "2".into());
    d.cli_ok(&["reload"]);
    let rollout = d.model("toy")["rollout"].clone();
    assert!(
        rollout["version"] == "2" && rollout["from"] == "1" && rollout["halted"].is_null(),
        "status says so: {rollout}"
    );

    let m = d.wait_model(
        "toy",
        "the rollout to finish",
        Duration::from_secs(60),
        |m| {
            let reps = replicas_of(m);
            m["rollout"].is_null()
                && m["routed"] == 2
                && m["warm"] == 1
                && reps.len() == 3
                && reps.iter().all(|r| r["version"] == "2")
        },
    );
    let new = ids(&replicas_of(&m));
    assert!(new.iter().all(|id| !old.contains(id)), "all replaced");

    let sets = watch.routed_sets("toy");
    assert!(sets.len() >= 2, "the routed set changed: {sets:?}");
    for set in &sets {
        assert!(set.len() >= 2, "routed fell below min = 2: {sets:?}");
    }
    // New replicas were routed before the first old one left the routed set.
    let events = watch.values();
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
    let mut d = started();
    let serving = routed(&d, "toy");
    assert_eq!(serving.len(), 2);
    let watch = d.watch(Some("toy"));

    d.rewrite_config(|c| {
        let m = &mut c.models[0];
        m.version = "2".into();
        m.command.push("--fail-warmup".into());
        m.warmup.startup_timeout = "2s".into();
    });
    d.cli_ok(&["reload"]);

    let m = d.wait_model("toy", "the rollout to halt", Duration::from_secs(60), |m| {
        m["rollout"]["halted"].is_string()
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
    assert!(replicas_of(&settled).iter().all(|r| r["version"] == "1"));
    let after = fleet(&d, "toy");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(fleet(&d, "toy"), after, "no further attempts");
    assert_eq!(
        d.model("toy")["rollout"]["halted"].as_str(),
        Some(why.as_str())
    );
    assert_eq!(routed(&d, "toy"), serving);
    for set in watch.routed_sets("toy") {
        assert_eq!(set.len(), 2, "routed stayed at 2 throughout");
    }
}

#[test]
fn the_log_level_follows_the_file_on_reload() {
    let mut d = Daemon::builder()
        .tick("100ms")
        .log_level("info")
        .model(Model::toy("toy", &["--load-time", "1s"]).scale(2, 4, 1))
        .start();
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    d.rewrite_config(|c| c.log_level = Some("warn".into()));
    d.cli_ok(&["reload"]);
    let log = d.log();
    assert!(log.contains(r#"log level "info" → "warn""#), "{log}");
    let lines = log.lines().count();
    // Churn that logs at info level: a drained warm replica and its replacement.
    let warm = id(&d.in_state("toy", "warm")[0]);
    d.cli_ok(&["drain", &warm]);
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    assert!(d.replicas("toy").iter().all(|r| id(r) != warm), "replaced");
    let after: Vec<String> = d.log().lines().skip(lines).map(str::to_string).collect();
    assert!(
        after.iter().all(|l| !l.contains(" INFO ")),
        "no info lines at level warn: {after:#?}"
    );
}

#[test]
fn a_fifo_at_the_config_path_stalls_nothing() {
    let mut d = started();
    // Opening a FIFO for reading waits for a writer, and none ever comes.
    std::fs::remove_file(&d.config_path).unwrap();
    nix::unistd::mkfifo(
        &d.config_path,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();

    // SIGHUP, then status at once: the connection gives up after 10 s, the FIFO never would.
    d.signal(Signal::SIGHUP);
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
    assert!(
        out.stderr.contains(&d.config_path.display().to_string())
            && out.stderr.contains("not a regular file"),
        "{}",
        out.stderr
    );
    assert!(d.running());

    // A file back in its place reloads as usual.
    std::fs::remove_file(&d.config_path).unwrap();
    d.rewrite_config(|c| c.models[0].scaling.max = 6);
    d.cli_ok(&["reload"]);
    assert_eq!(d.model("toy")["max"], 6);
}
