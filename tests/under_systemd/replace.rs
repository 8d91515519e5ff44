//! Replacing and stopping the daemon under systemd, with load through hearth-route.service:
//! `systemctl reload` (good and bad files), `hearth upgrade`, kill -9, the watchdog's kill of
//! a stalled loop, and `systemctl stop`. Replicas are adopted, never cold-started; no request
//! fails.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use testkit::{wait_until, Load, Value};

use crate::host::{toy, Host, CONFIG, STALL_OP, WATCHDOG_SEC};

/// Completions through the front door from `clients` threads, one after another each.
pub struct FrontDoorLoad(Vec<Load>);

impl FrontDoorLoad {
    pub fn start(h: &Host, clients: usize) -> FrontDoorLoad {
        let loads = (0..clients)
            .map(|_| {
                let addr: SocketAddr = h.route;
                Load::start(move || {
                    match testkit::route::complete(addr, "toy", Duration::from_secs(90)) {
                        Ok(r) if r.status == 200 => Ok(()),
                        Ok(r) => Err(format!("{} {}", r.status, r.text())),
                        Err(e) => Err(e.to_string()),
                    }
                })
            })
            .collect();
        let load = FrontDoorLoad(loads);
        load.more(3);
        load
    }

    /// Waits for `n` more answers on every client.
    pub fn more(&self, n: u64) {
        for l in &self.0 {
            l.more(n);
        }
    }

    /// Stops it, and fails the test if a request failed; returns the answers.
    pub fn finish_without_failures(self, what: &str) -> u64 {
        let mut ok = 0;
        let mut errors = Vec::new();
        for l in self.0 {
            let (o, _, e) = l.finish();
            ok += o;
            errors.extend(e);
        }
        assert!(
            errors.is_empty(),
            "{what}: {} of {} requests failed: {errors:?}",
            errors.len(),
            ok + errors.len() as u64
        );
        eprintln!("{what}: {ok} requests through hearth-route.service, 0 failed");
        ok
    }
}

/// Each replica's (id, pid, state), sorted.
fn roles(h: &Host) -> Vec<(String, i64, String)> {
    let st = h.status();
    let mut v: Vec<(String, i64, String)> = testkit::status::replicas(&st, "toy")
        .iter()
        .map(|r| {
            (
                testkit::status::id(r),
                r["pid"].as_i64().unwrap_or(0),
                r["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// After a new daemon took over (a restart or a re-exec): the same replicas, same pids, in the
/// same roles, and no replica spawned since `cursor` (no cold start).
fn adopted(h: &Host, cursor: &str, before: &[(String, i64, String)]) {
    let mut last = Vec::new();
    testkit::poll(Duration::from_secs(30), || {
        last = roles(h);
        (last == before).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "replicas not adopted in their roles: {before:?} then {last:?}\n{}",
            h.journal_tail()
        )
    });
    let spawned: Vec<Value> = h
        .daemon_log(cursor)
        .into_iter()
        .filter(|e| {
            e["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.starts_with("spawned"))
        })
        .collect();
    assert!(spawned.is_empty(), "a cold start: {spawned:?}");
}

/// RELOADING=1 then READY=1, from the main process, in systemd's log after `cursor`.
fn reload_announced(h: &Host, cursor: &str) {
    let main = h.main_pid();
    let from = format!("Got notification message from PID {main} (");
    let log = h.wait_manager(
        cursor,
        "hearth.service",
        "Reloaded hearth.service",
        Duration::from_secs(10),
    );
    let at = |what: &str| {
        log.iter()
            .position(|m| m.contains(&format!("{from}{what}")))
    };
    let reloading =
        at("RELOADING=1").unwrap_or_else(|| panic!("no RELOADING=1:\n{}", log.join("\n")));
    let ready = log
        .iter()
        .skip(reloading + 1)
        .any(|m| m.contains(&format!("{from}READY=1")));
    assert!(ready, "no READY=1 after RELOADING=1:\n{}", log.join("\n"));
    wait_until(
        "hearth active after the reload",
        Duration::from_secs(10),
        || (h.show("hearth", "SubState") == "running").then_some(()),
    );
}

/// A good file (the pool 1 → 2) applies with every replica kept; a bad one (`tick = "soon"`)
/// is refused, the error in the journal naming file, line and key, the old configuration runs
/// on. Both say RELOADING=1, then READY=1.
pub fn reload_good_and_bad(h: &Host) {
    let kept = h.replica_pids("toy");
    let cursor = h.cursor();
    let good = h.config(&[toy(2, 4, 2)]);
    h.write_config(&good);
    h.sh_ok("systemctl reload hearth");
    reload_announced(h, &cursor);
    h.wait_status_line("toy", 2, 2);
    let now = h.replica_pids("toy");
    assert!(
        kept.iter().all(|r| now.contains(r)),
        "{kept:?} kept in {now:?}"
    );

    let cursor = h.cursor();
    let bad = good.replace("tick = \"100ms\"", "tick = \"soon\"");
    let line = bad
        .lines()
        .position(|l| l.starts_with("tick = "))
        .expect("tick")
        + 1;
    h.write_config(&bad);
    h.sh_ok("systemctl reload hearth");
    reload_announced(h, &cursor);
    let error = h.wait_daemon_line(
        &cursor,
        &format!("{CONFIG}:{line}"),
        Duration::from_secs(10),
    );
    let message = error["MESSAGE"].as_str().unwrap_or_default();
    assert!(message.contains("tick"), "{error}");
    assert_eq!(error["PRIORITY"], "3", "an error: {error}");
    assert_eq!(h.replica_pids("toy"), now, "a refused file changes nothing");
    h.wait_status_line("toy", 2, 2);
    h.write_config(&good);
}

/// `hearth upgrade`: the same MainPID (no restart as far as systemd knows), every replica in
/// its role, 0 failed requests.
pub fn upgrade_under_load(h: &Host) {
    let load = FrontDoorLoad::start(h, 4);
    let (main, restarts, before) = (h.main_pid(), h.restarts(), roles(h));
    let cursor = h.cursor();
    let out = h.hearth("upgrade");
    assert!(out.status.success(), "hearth upgrade: {}", out.stderr);
    h.wait_daemon_line(
        &cursor,
        "taking over from the previous binary",
        Duration::from_secs(20),
    );
    adopted(h, &cursor, &before);
    assert_eq!(h.main_pid(), main, "the same main process");
    assert_eq!(h.restarts(), restarts, "not a restart");
    assert_eq!(h.show("hearth", "SubState"), "running");
    load.more(5);
    load.finish_without_failures("hearth upgrade");
}

/// Waits for systemd to have started hearth again after `main` died: a new MainPID, running,
/// one restart more.
fn restarted(h: &Host, main: i32, restarts: u32) -> i32 {
    wait_until("systemd to restart hearth", Duration::from_secs(30), || {
        let now = h.main_pid();
        (now != main && now != 0 && h.show("hearth", "SubState") == "running").then_some(now)
    });
    assert_eq!(h.restarts(), restarts + 1);
    h.main_pid()
}

/// kill -9 of the main process: systemd restarts it (Restart=on-failure), it adopts every
/// replica without a cold start, 0 failed requests.
pub fn kill_9_under_load(h: &Host) {
    let load = FrontDoorLoad::start(h, 4);
    let (main, restarts, before) = (h.main_pid(), h.restarts(), roles(h));
    let cursor = h.cursor();
    h.sh_ok(&format!("kill -9 {main}"));
    restarted(h, main, restarts);
    adopted(h, &cursor, &before);
    load.more(5);
    load.finish_without_failures("kill -9 of the main process");
}

/// The watchdog: an admin's `hearth gpus` trips the stall the drop-in armed; the loop sends no
/// more pings; systemd kills the daemon at WatchdogSec and restarts it; the new run adopts
/// every replica without a cold start. Returns how long from the stall to systemd's verdict.
pub fn watchdog_kills_a_stalled_loop(h: &Host) -> Duration {
    let (main, restarts, before) = (h.main_pid(), h.restarts(), roles(h));
    let cursor = h.cursor();
    // The client never gets its answer; it ends when the killed daemon's socket closes.
    h.sh_ok(&format!(
        "setsid {}/hearth {STALL_OP} >/dev/null 2>&1 < /dev/null &",
        crate::host::BUILD
    ));
    h.wait_daemon_line(
        &cursor,
        "the event loop stops here for good",
        Duration::from_secs(10),
    );
    let stalled = Instant::now();
    // Twice WatchdogSec: the last ping came at most half of it before the stall.
    let limit = Duration::from_secs(2 * WATCHDOG_SEC + 2);
    let log = h.wait_manager(&cursor, "hearth.service", "Watchdog timeout", limit);
    let took = stalled.elapsed();
    assert!(
        log.iter()
            .any(|m| m.contains(&format!("Watchdog timeout (limit {WATCHDOG_SEC}s)"))),
        "{}",
        log.join("\n")
    );
    restarted(h, main, restarts);
    let log = h.manager_log(&cursor, "hearth.service");
    assert!(
        log.iter()
            .any(|m| m.contains("Failed with result 'watchdog'")),
        "{}",
        log.join("\n")
    );
    adopted(h, &cursor, &before);
    took
}

/// [`watchdog_kills_a_stalled_loop`] with load through the front door: 0 failed.
pub fn watchdog_under_load(h: &Host) {
    let load = FrontDoorLoad::start(h, 4);
    let took = watchdog_kills_a_stalled_loop(h);
    eprintln!("watchdog: killed {took:?} after the stall (WatchdogSec={WATCHDOG_SEC}s)");
    load.more(5);
    load.finish_without_failures("the watchdog's kill");
}

/// TimeoutStopSec= of the shipped unit, in seconds.
fn timeout_stop_sec() -> u64 {
    let unit = include_str!("../../systemd/hearth.service");
    unit.lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim().trim_end_matches('s').parse().ok())
        .expect("TimeoutStopSec= in systemd/hearth.service")
}

/// `systemctl stop hearth` under load: the stop returns within TimeoutStopSec with every scope
/// and every replica's process gone and the unit inactive (not failed); the requests that
/// arrive meanwhile wait at the front door, and are answered once `between` is done and hearth
/// has started again: 0 failed.
pub fn stop_under_load(h: &Host, between: impl FnOnce(&Host)) {
    let load = FrontDoorLoad::start(h, 4);
    let scopes = h.scopes();
    assert!(!scopes.is_empty());
    let procs: Vec<i32> = scopes.iter().flat_map(|s| h.unit_procs(s)).collect();
    let t0 = Instant::now();
    h.sh_ok("systemctl stop hearth");
    let took = t0.elapsed();
    let limit = timeout_stop_sec();
    assert!(
        took < Duration::from_secs(limit),
        "stop took {took:?}, TimeoutStopSec={limit}s"
    );
    assert_eq!(
        h.scopes(),
        Vec::<String>::new(),
        "every scope gone by the end of the stop"
    );
    let left: Vec<i32> = procs.iter().copied().filter(|&p| h.alive(p)).collect();
    assert!(left.is_empty(), "alive after the stop: {left:?}");
    assert_eq!(h.show("hearth", "ActiveState"), "inactive");
    assert_eq!(h.show("hearth", "Result"), "success");
    eprintln!("systemctl stop hearth: {took:?} (TimeoutStopSec={limit}s)");
    between(h);
    // Nothing is routed now: the clients' requests are held in the front door's queue, not
    // failed.
    wait_until(
        "requests held at the front door",
        Duration::from_secs(10),
        || {
            let page = testkit::route::get(h.route, "/metrics").ok()?.text();
            let depth = testkit::route::sample(&page, "hearth_route_queue_depth{model=\"toy\"}")?;
            (depth >= 1.0).then_some(())
        },
    );
    h.sh_ok("systemctl start hearth");
    load.more(5);
    load.finish_without_failures("systemctl stop hearth, then start");
}
