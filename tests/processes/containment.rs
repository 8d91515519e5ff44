//! Containment against the real daemon: where replicas' processes live, that nothing a replica
//! forked (setsid'd workers included) survives its stop or the daemon's, that an orphan of an
//! earlier run neither survives a restart (cgroups) nor ever answers for a new replica (process
//! groups), that a squatter never passes a warm-up, that models run as an unprivileged account
//! unless they ask for root, and that status shows what replicas use.
//!
//! The cgroup tests need root and a writable cgroup v2 (CI has both); elsewhere they fail saying
//! so, unless HEARTH_ALLOW_SKIP=1 (testkit::needs): then they test what they can.
//! `HEARTH_CONTAINMENT=groups` forces the fallback on the same host.

use std::path::PathBuf;
use std::time::Duration;

use testkit::procs::{alive, cgroup, signal, uid};
use testkit::status::{addr, id, pid};
use testkit::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cgroup,
    Groups,
}

/// The mode the daemon says it chose.
fn mode(d: &Daemon) -> Mode {
    let chosen = d.containment();
    if chosen.starts_with("cgroup2 subtree at") {
        Mode::Cgroup
    } else if chosen.starts_with("process groups") {
        Mode::Groups
    } else {
        panic!("no containment line in the log:\n{}", d.log())
    }
}

/// A daemon with one toy model (1 routed, no pool) whose replicas fork a detached worker.
fn with_workers(groups: bool, args: &[&str]) -> Daemon {
    let mut toy_args = vec![
        "--fork-worker",
        "--concurrency",
        "4",
        "--service-time",
        "20ms",
    ];
    toy_args.extend_from_slice(args);
    let mut b = Daemon::builder()
        .model(Model::toy("toy", &toy_args).scale(1, 2, 0).stop_grace("1s"))
        .tick("100ms");
    if groups {
        b = b.env("HEARTH_CONTAINMENT", "groups");
    }
    b.start()
}

/// The worker a replica's toy server forked, as the toy said in its output (its log file).
fn worker_of(d: &Daemon, replica: &str) -> i32 {
    let what = format!("worker of {replica}");
    wait_until(&what, Duration::from_secs(20), || {
        d.replica_log(replica).lines().find_map(|l| {
            let rest = l.split("forked detached worker pid ").nth(1)?;
            rest.split_whitespace().next()?.parse::<i32>().ok()
        })
    })
}

fn routed_one(d: &Daemon) -> Value {
    let m = d.wait_settled("toy", 1, 0, Duration::from_secs(30));
    testkit::status::replicas_of(&m)
        .into_iter()
        .find(|r| r["state"] == "routed")
        .unwrap()
}

/// Who answered a completion at `addr`: (pid, replica) from the toy's headers.
fn answered_by(addr: &str) -> (i32, String) {
    let r = complete(addr, Duration::from_secs(10)).expect("a completion");
    assert_eq!(r.status, 200, "{r:?}");
    let pid = r.header("x-toy-pid").and_then(|p| p.parse().ok()).unwrap();
    (pid, r.header("x-toy-replica").unwrap_or("").to_string())
}

/// The process answering belongs to the replica: the leader, a process in its group, or (with
/// cgroups) in the leader's cgroup.
fn belongs(answering: i32, leader: i32, m: Mode) -> bool {
    if answering == leader {
        return true;
    }
    match m {
        Mode::Cgroup => cgroup(answering).is_some() && cgroup(answering) == cgroup(leader),
        // Its group, or its descendants (a setsid'd worker has a group of its own).
        Mode::Groups => {
            let mut p = answering;
            for _ in 0..64 {
                let Some(s) = testkit::procs::stat(p) else {
                    return false;
                };
                if s.pgrp == leader || s.ppid == leader {
                    return true;
                }
                if s.ppid <= 1 {
                    return false;
                }
                p = s.ppid;
            }
            false
        }
    }
}

/// Root, so that the daemon can make a cgroup2 subtree (each test checks it did).
fn cgroups_here() -> bool {
    needs_root("the cgroup2 containment")
}

#[test]
fn an_orphan_of_a_killed_daemon_is_stopped_when_the_daemon_starts_again() {
    if !cgroups_here() {
        return;
    }
    let mut d = with_workers(false, &[]);
    if !needs_cgroup2(&d) {
        return;
    }
    let r = routed_one(&d);
    let worker = worker_of(&d, &id(&r));
    let port_addr = addr(&r);
    let dir = cgroups::subtree(&d.dir.path().join("state"))
        .unwrap()
        .join(id(&r));
    assert!(
        cgroups::procs(&dir).contains(&worker),
        "the worker is in the replica's cgroup"
    );
    // The reproduction: kill -9 the daemon. In a cgroup the replica outlives it (issue
    // 14); its leader then dies while no daemon runs, the setsid'd worker does not, and keeps
    // answering on the replica's port: what the next run finds is not the replica it started.
    d.signal(Signal::SIGKILL);
    assert!(d.wait_exit(Duration::from_secs(10)).is_some());
    assert!(
        alive(pid(&r)),
        "the leader outlives the daemon in its cgroup"
    );
    testkit::procs::signal(pid(&r), Signal::SIGKILL);
    wait_until("the leader gone", Duration::from_secs(10), || {
        (!alive(pid(&r))).then_some(())
    });
    assert!(alive(worker), "the setsid'd worker outlived the daemon");
    assert_eq!(
        answered_by(&port_addr).0,
        worker,
        "and answers on the old port"
    );
    d.restart();
    // At start, before any replica of the new run: what the earlier run left is stopped.
    wait_until("the orphan stopped", Duration::from_secs(10), || {
        (!alive(worker)).then_some(())
    });
    // The kill comes before the line that says so: wait for the line, not just the kill.
    let said = testkit::poll(Duration::from_secs(10), || {
        let log = d.log();
        (log.contains("stopped what an earlier run left in") && log.contains("is gone"))
            .then_some(())
    });
    assert!(said.is_some(), "{}", d.log_tail(30));
    let r2 = routed_one(&d);
    let (who, _) = answered_by(&addr(&r2));
    assert!(
        belongs(who, pid(&r2), Mode::Cgroup),
        "{who} answers for {}",
        id(&r2)
    );
}

#[test]
fn without_cgroups_an_orphan_never_answers_for_a_new_replica() {
    let mut d = with_workers(true, &[]);
    assert_eq!(mode(&d), Mode::Groups);
    let r = routed_one(&d);
    let worker = worker_of(&d, &id(&r));
    let old_port = addr(&r);
    d.signal(Signal::SIGKILL);
    assert!(d.wait_exit(Duration::from_secs(10)).is_some());
    assert!(alive(worker));
    assert_eq!(answered_by(&old_port).0, worker);
    d.restart();
    // Without cgroups the orphan cannot be found at start: it lives on, holding its port. The
    // new run passes the port over, and whatever is routed is answered by its own replica.
    let watch = d.watch(Some("toy"));
    let r2 = routed_one(&d);
    assert!(alive(worker), "nothing could stop it without a cgroup");
    assert_ne!(addr(&r2), old_port, "the orphan's port is passed over");
    assert!(
        d.log().contains(&format!(
            "port {} is in use by pid {worker}",
            old_port.rsplit(':').next().unwrap()
        )),
        "{}",
        d.log_tail(30)
    );
    for _ in 0..20 {
        let (who, _) = answered_by(&addr(&r2));
        assert!(
            belongs(who, pid(&r2), Mode::Groups),
            "{who} answers for {}",
            id(&r2)
        );
    }
    for v in watch.values() {
        for (_, a) in endpoints(&v) {
            assert_ne!(a, old_port, "the orphan's address was never routed");
        }
    }
}

/// A replica that never listens; a squatter (started here) takes its port after the spawn.
fn squatted(groups: bool) {
    let mut b = Daemon::builder()
        .model(
            Model::toy("toy", &[])
                // Mentions {port} (as check-config wants) and never listens on it.
                .command(&["sh", "-c", "exec sleep 600", "sh", "{port}"])
                .scale(1, 1, 0)
                .startup_timeout("1m"),
        )
        .tick("100ms");
    if groups {
        b = b.env("HEARTH_CONTAINMENT", "groups");
    }
    let d = b.start();
    if !groups && !needs_cgroup2(&d) {
        return;
    }
    let starting = d.wait_model(
        "toy",
        "a started replica with a port",
        Duration::from_secs(20),
        |m| {
            // Spawned (a pid), not only given a port: a squatter that came before the spawn
            // would be found by the spawn's port check and passed over, never asked.
            testkit::status::replicas_of(m)
                .iter()
                .any(|r| r["state"] == "starting" && r["port"].is_u64() && r["pid"].is_u64())
        },
    );
    let r = testkit::status::replicas_of(&starting)[0].clone();
    let port = r["port"].as_u64().unwrap().to_string();
    let watch = d.watch(Some("toy"));
    let mut squatter = d.squatter(&port);
    // The squatter answers the warm-up with 200; hearth sees it is not the replica's process.
    let m = d.wait_model("toy", "the squatter named", Duration::from_secs(20), |m| {
        testkit::status::replicas_of(m).iter().any(|r| {
            r["reason"].as_str().is_some_and(|s| {
                s.contains(&format!("pid {}", squatter.id()))
                    && s.contains("not by a process of this replica")
            })
        })
    });
    eprintln!("{}", testkit::status::replicas_of(&m)[0]["reason"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(d.model("toy")["warm"], 0);
    assert_eq!(d.model("toy")["routed"], 0);
    assert!(
        !watch
            .values()
            .iter()
            .any(|v| v["state"] == "warm" || !endpoints(v).is_empty()),
        "never warm, never routed: {:?}",
        watch.values()
    );
    let _ = squatter.kill();
    let _ = squatter.wait();
}

#[test]
fn a_squatter_on_a_replicas_port_never_passes_its_warm_up() {
    if cgroups_here() {
        squatted(false);
    }
    squatted(true);
}

/// Drain the routed replica: its worker dies with it; then SIGTERM: nothing of any replica is
/// left once the daemon has exited, counted before any cleanup.
fn workers_die(groups: bool, ignore_term: bool) {
    let args: &[&str] = if ignore_term {
        &["--ignore-sigterm"]
    } else {
        &[]
    };
    let mut d = with_workers(groups, args);
    if !groups && !needs_cgroup2(&d) {
        return;
    }
    let m = mode(&d);
    let r = routed_one(&d);
    let worker = worker_of(&d, &id(&r));
    d.cli_ok(&["drain", &id(&r)]);
    wait_until(
        "the drained replica's worker gone",
        Duration::from_secs(30),
        || (!alive(worker) && !alive(pid(&r))).then_some(()),
    );
    let r2 = routed_one(&d);
    let worker2 = worker_of(&d, &id(&r2));
    d.signal(Signal::SIGTERM);
    let st = d
        .wait_exit(Duration::from_secs(30))
        .expect("the daemon exits");
    assert!(st.success(), "{st}");
    // Before any cleanup: no process of any replica, nor its cgroup.
    assert!(
        !alive(worker2) && !alive(pid(&r2)),
        "worker {worker2} or leader survived"
    );
    assert_eq!(d.children(), Vec::<i32>::new(), "marked processes left");
    if m == Mode::Cgroup {
        let sub = cgroups::subtree(&d.dir.path().join("state")).unwrap();
        assert!(
            !sub.exists() || cgroups::procs(&sub).is_empty(),
            "{sub:?} holds processes"
        );
        assert!(!sub.exists(), "the subtree is removed at exit");
    }
    if ignore_term {
        assert!(
            d.log().contains("did not stop within stop_grace: SIGKILL"),
            "{}",
            d.log_tail(30)
        );
    }
}

#[test]
fn setsid_workers_die_with_their_replica_and_with_the_daemon() {
    if cgroups_here() {
        workers_die(false, false);
        workers_die(false, true);
    }
    workers_die(true, false);
    workers_die(true, true);
}

/// On a machine without hearth's accounts (testkit runs a root daemon with a model on the
/// default account on a private /etc without them: `FreshAccounts`), a root daemon makes the
/// `hearth` account and says so; a model without `user` runs as it, never as a shared account
/// such as `nobody`, and `user = "root"` as root.
#[test]
fn a_root_daemon_runs_models_unprivileged_unless_they_ask_for_root() {
    if !needs_root("a daemon that runs models as other accounts") {
        return;
    }
    let d = Daemon::builder()
        .model(Model::toy("toy", &[]).scale(1, 1, 0).default_account())
        .model(Model::toy("admin", &[]).scale(1, 1, 0).user("root"))
        .tick("100ms")
        .start();
    let fresh = d.fresh.as_ref().expect("a private /etc for a root daemon");
    let (expected, expected_gid) = fresh
        .account("hearth")
        .unwrap_or_else(|| panic!("no account hearth was made:\n{}", d.log()));
    assert_ne!(expected, 65534, "not nobody's uid");
    assert!(
        d.log().contains("no account \"hearth\": created it with"),
        "says so: {}",
        d.log()
    );
    let toy = d.wait_settled("toy", 1, 0, Duration::from_secs(30));
    let r = &testkit::status::replicas_of(&toy)[0];
    assert_eq!(uid(pid(r)), Some(expected), "a model without `user`");
    let admin = d.wait_settled("admin", 1, 0, Duration::from_secs(30));
    assert_eq!(
        uid(pid(&testkit::status::replicas_of(&admin)[0])),
        Some(0),
        "user = \"root\""
    );
    // The unprivileged replica reports for itself (the toy server does, every 200 ms) ...
    d.wait_model("toy", "its own reports", Duration::from_secs(10), |m| {
        m["signal"]["age_ms"].is_u64()
    });
    // ... and for nothing else: as the same account, from inside its cgroup or group but
    // naming another replica, or asking for an admin's op.
    let other = id(&testkit::status::replicas_of(&admin)[0]);
    let inside = |args: &[&str]| -> CliOutput {
        let leader = pid(r);
        let join = match cgroup(leader) {
            Some(cg) if cg != "/" => {
                let dir = cgroups::mount().unwrap().join(cg.trim_start_matches('/'));
                format!("echo $$ > {}/cgroup.procs && ", dir.display())
            }
            _ => String::new(),
        };
        // In the cgroup (by its own hand, as root), in a session of its own (not the group),
        // then as the replica's account.
        let script = format!(
            "{join}exec setpriv --reuid={expected} --regid={expected_gid} --clear-groups -- \"$@\""
        );
        let mut cmd = std::process::Command::new("setsid");
        cmd.args(["sh", "-c", &script, "sh"])
            .arg(hearth())
            .args(args)
            .arg("--socket")
            .arg(&d.socket);
        let (k, v) = d.mark();
        cmd.env(k, v).env_remove("HEARTH_SOCKET");
        run(&mut cmd, Duration::from_secs(20))
    };
    if mode(&d) == Mode::Cgroup {
        let ok = inside(&["report", "toy", "--wait-ms", "5"]);
        assert!(ok.status.success(), "{ok:?}");
        let theirs = inside(&["report", "admin", "--replica", &other, "--wait-ms", "5"]);
        assert!(
            !theirs.status.success() && theirs.stderr.contains("forbidden"),
            "{theirs:?}"
        );
        // Its account is in group hearth, which `[access] readers` names by default (as
        // systemd/hearth.sysusers has it): it may read, and nothing more.
        let scale = inside(&["scale", "admin", "--max", "1"]);
        assert!(
            !scale.status.success() && scale.stderr.contains("forbidden"),
            "{scale:?}"
        );
    }
}

/// A root daemon whose every model names its account makes no account (on a private /etc
/// without hearth's, as on a fresh machine).
#[test]
fn a_root_daemon_whose_models_all_name_their_account_makes_none() {
    let Some(fresh) = FreshAccounts::needed() else {
        return;
    };
    let d = Daemon::builder()
        .model(Model::toy("admin", &[]).scale(1, 1, 0).user("root"))
        .wrapper(
            &fresh
                .wrapper()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .start();
    d.wait_settled("admin", 1, 0, Duration::from_secs(30));
    assert_eq!(fresh.account("hearth"), None, "{}", d.log());
}

/// A program in a directory only root may enter (0700), for a model without `user`: the
/// daemon refuses to start (check-config's refusal: tests/cli/check_config.rs). Started while the
/// directory was open and closed later, the starts fail: the model is `unavailable` (nothing
/// routed, none can be) with the directory named, until the crash loop trips.
#[test]
fn a_model_account_that_cannot_reach_its_program_is_said_plainly() {
    if !needs_root("a model account other than the test's") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let chmod = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let b = Daemon::builder();
    let private: PathBuf = b.dir().join("private");
    std::fs::create_dir(&private).unwrap();
    let program = private.join("server");
    std::fs::copy(hearth(), &program).unwrap();
    chmod(&private, 0o700);
    let p = program.display().to_string();
    let mut d = b
        .model(
            Model::toy("toy", &[])
                .command(&[&p, "toy-server", "--port", "{port}"])
                .scale(1, 1, 0)
                .default_account(),
        )
        .tick("100ms")
        .spawn();
    let status = d
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the daemon started:\n{}", d.log()));
    let log = d.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("{} is not searchable by", private.display()))
            && log.contains("user = \"root\""),
        "names the directory and says how to run it as root: {log}"
    );
    assert!(!d.socket.exists(), "nothing was bound");

    // Open at start, closed later: the replica's next start fails.
    chmod(&private, 0o755);
    d.restart();
    d.wait_settled("toy", 1, 0, Duration::from_secs(30));
    assert_eq!(d.model("toy")["health"], "ok");
    chmod(&private, 0o700);
    signal(pid(&d.replicas("toy")[0]), Signal::SIGKILL);
    let blocked = format!("{} is not searchable by", private.display());
    let m = d.wait_model(
        "toy",
        "unavailable, naming the directory",
        Duration::from_secs(30),
        |m| {
            m["health"] == "unavailable"
                && m["health_reason"]
                    .as_str()
                    .is_some_and(|s| s.contains(&blocked))
        },
    );
    assert_eq!(m["routed"], 0);
    // It stays so while starts keep failing (health says what the replicas wait for), and
    // turns to crash_loop once enough have failed.
    let m = d.wait_model("toy", "the back-off named", Duration::from_secs(30), |m| {
        m["health"] == "unavailable"
            && m["health_reason"]
                .as_str()
                .is_some_and(|s| s.contains("restart back-off"))
    });
    eprintln!("{}", m["health_reason"]);
}

/// Every port of `daemon.ports` held by other processes: nothing can start, and health says
/// the model is `unavailable` (not `ok`) and why.
#[test]
fn a_model_whose_every_port_is_taken_is_unavailable() {
    let b = Daemon::builder()
        .model(Model::toy("toy", &[]).scale(1, 2, 0))
        .tick("100ms")
        .ports(2);
    let (home, launch) = b.prepare();
    let (first, last) = home.ports;
    let mut squatters: Vec<_> = (first..=last)
        .map(|p| home.squatter(&p.to_string()))
        .collect();
    for p in first..=last {
        wait_until("the squatter listens", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", p))
                .ok()
                .map(drop)
        });
    }
    let d = launch.start(home);
    let m = d.wait_model("toy", "unavailable", Duration::from_secs(20), |m| {
        m["health"] == "unavailable"
    });
    let why = m["health_reason"].as_str().unwrap();
    assert!(
        why.contains("no free port") || why.contains("is in use by"),
        "{m}"
    );
    assert_eq!(
        (m["routed"].as_u64(), m["warm"].as_u64()),
        (Some(0), Some(0))
    );
    for s in &mut squatters {
        let _ = s.kill();
        let _ = s.wait();
    }
}

#[test]
fn status_shows_what_each_replica_uses() {
    let d = with_workers(false, &[]);
    let m = d.wait_model("toy", "memory and CPU", Duration::from_secs(30), |m| {
        testkit::status::replicas_of(m)
            .iter()
            .any(|r| r["state"] == "routed" && r["rss_bytes"].as_u64().is_some_and(|b| b > 1 << 20))
    });
    let r = testkit::status::replicas_of(&m)
        .into_iter()
        .find(|r| r["state"] == "routed")
        .unwrap();
    assert!(r["cpu_seconds"].as_f64().is_some_and(|c| c >= 0.0), "{r}");
    // The worker counts too: at least the leader's own resident memory.
    let own = testkit::rss_kib(pid(&r)).unwrap_or(0) * 1024;
    assert!(
        r["rss_bytes"].as_u64().unwrap() >= own / 2,
        "{r} vs leader {own}"
    );
}
