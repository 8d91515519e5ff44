//! Start-up and containment under systemd: active only after READY=1, STATUS= following the
//! counts, every replica (and what it forked) in its own transient scope under hearth.slice,
//! gone with it on a scale-down, and `systemctl stop hearth.slice` as the last resort.

use std::collections::BTreeMap;
use std::time::Duration;

use testkit::wait_until;

use crate::host::Host;

/// `systemctl enable --now hearth` returns once systemd took READY=1, and not before: PID 1
/// logged the notification before it changed the unit from start to running, and at that
/// moment the daemon's socket already answers with the start-up replicas placed. Then STATUS=
/// follows the counts to 2 routed + 1 warm.
pub fn start_is_ready_after_ready_1(h: &Host) {
    let cursor = h.cursor();
    h.sh_ok("systemctl enable --now hearth");
    // At once, without waiting: Type=notify made the start wait for READY=1.
    assert_eq!(h.show("hearth", "ActiveState"), "active");
    let st = h.status();
    let placed = testkit::status::replicas(&st, "toy").len();
    assert_eq!(
        placed, 3,
        "READY=1 after the start-up replicas are placed: {st}"
    );
    let main = h.main_pid();
    let log = h.manager_log(&cursor, "hearth.service");
    let ready = log
        .iter()
        .position(|m| {
            m.contains(&format!(
                "Got notification message from PID {main} (READY=1"
            ))
        })
        .unwrap_or_else(|| panic!("systemd took no READY=1 from {main}:\n{}", log.join("\n")));
    let running = log
        .iter()
        .position(|m| m.contains("Changed start -> running"))
        .unwrap_or_else(|| panic!("hearth never went start -> running:\n{}", log.join("\n")));
    assert!(
        ready < running,
        "active only after READY=1:\n{}",
        log.join("\n")
    );
    h.wait_status_line("toy", 2, 1);
}

/// (pid, session) of each process in each replica's scope, by replica id, after checking that
/// every replica has a scope `hearth-ID.scope` in hearth.slice holding its server, a setsid'd
/// child (a session of its own) and a double-forked one (its parent gone: not the server).
pub fn replicas_live_in_scopes(h: &Host) -> BTreeMap<String, Vec<i32>> {
    let replicas = h.replica_pids("toy");
    assert!(!replicas.is_empty());
    let mut out = BTreeMap::new();
    for (id, pid) in replicas {
        let unit = format!("hearth-{id}.scope");
        assert_eq!(h.show(&unit, "Slice"), "hearth.slice", "{unit}");
        assert_eq!(h.show(&unit, "ActiveState"), "active", "{unit}");
        // The children start a moment after the server: wait for both.
        let procs = wait_until(
            &format!("the server and its two children in {unit}"),
            Duration::from_secs(10),
            || {
                let procs = h.unit_procs(&unit);
                (procs.len() >= 3).then_some(procs)
            },
        );
        assert!(
            procs.contains(&pid),
            "{unit} holds the server {pid}: {procs:?}"
        );
        let ps = h.ps();
        let of = |want: &str| {
            ps.iter()
                .find(|(p, _, _, args)| procs.contains(p) && args == want)
                .cloned()
                .unwrap_or_else(|| panic!("no `{want}` in {unit}: {procs:?} {ps:?}"))
        };
        let server_sid = ps
            .iter()
            .find(|p| p.0 == pid)
            .map(|p| p.2)
            .expect("the server in ps");
        let (_, _, sid, _) = of("sleep 600");
        assert_ne!(
            sid, server_sid,
            "the setsid'd child has a session of its own"
        );
        let (_, ppid, _, _) = of("sleep 601");
        assert_ne!(ppid, pid, "the double-forked child's parent is gone");
        out.insert(id, procs);
    }
    out
}

/// `hearth scale toy --min 1 --max 1 --warm 0`: the surplus replicas drain and stop, and each
/// takes its scope and every process in it (setsid'd and double-forked children included).
pub fn scale_down_takes_the_children(h: &Host) {
    let before = replicas_live_in_scopes(h);
    assert!(before.len() >= 2, "{before:?}");
    let out = h.hearth("scale toy --min 1 --max 1 --warm 0");
    assert!(out.status.success(), "{}", out.stderr);
    h.wait_status_line("toy", 1, 0);
    let kept = h.replica_pids("toy");
    assert_eq!(kept.len(), 1, "{kept:?}");
    for (id, procs) in before.iter().filter(|(id, _)| **id != kept[0].0) {
        let unit = format!("hearth-{id}.scope");
        wait_until(
            &format!("{unit} and its processes {procs:?} gone"),
            Duration::from_secs(15),
            || {
                let left: Vec<i32> = procs.iter().copied().filter(|&p| h.alive(p)).collect();
                (left.is_empty() && !h.scopes().contains(&unit)).then_some(())
            },
        );
    }
}

/// The operator's last resort when hearth will not come back: with the daemon dead and not
/// restarting (a drop-in with Restart=no, then kill -9), `systemctl stop hearth.slice` stops
/// every replica and everything each forked.
pub fn stopping_the_slice_stops_every_replica(h: &Host) {
    let scopes = h.scopes();
    assert!(!scopes.is_empty(), "replicas to stop");
    let procs: Vec<i32> = scopes.iter().flat_map(|s| h.unit_procs(s)).collect();
    assert!(procs.len() >= 3 * scopes.len().min(1), "{procs:?}");
    h.c.write(
        "/etc/systemd/system/hearth.service.d/90-no-restart.conf",
        "[Service]\nRestart=no\n",
    );
    h.sh_ok("systemctl daemon-reload && systemctl kill -s KILL --kill-whom=main hearth");
    wait_until("hearth dead", Duration::from_secs(10), || {
        (h.show("hearth", "ActiveState") == "failed").then_some(())
    });
    assert!(
        procs.iter().all(|&p| h.alive(p)),
        "the replicas outlive the daemon until the slice is stopped"
    );
    h.sh_ok("systemctl stop hearth.slice");
    let left: Vec<i32> = procs.iter().copied().filter(|&p| h.alive(p)).collect();
    assert!(
        left.is_empty(),
        "alive after stopping hearth.slice: {left:?}"
    );
    assert_eq!(h.scopes(), Vec::<String>::new());
}
