//! Reload and rollout tests of the core with virtual time.

use std::path::Path;
use std::time::Duration;

use super::tests::{model, signals, spawns, Harness, BASE};
use super::*;
use crate::config::Config;
use crate::protocol::ErrorCode;

fn cfg(version: &str, scaling: &str) -> String {
    format!(
        "{BASE}{}",
        model("m", &format!("version = \"{version}\""), scaling)
    )
}

fn reload(h: &mut Harness, toml: &str) -> Vec<Action> {
    h.reload(toml)
}

fn routed(h: &Harness) -> usize {
    h.in_state("m", ReplicaState::Routed).len()
}

#[test]
fn a_scaling_only_change_keeps_every_replica() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 6\nwarm_pool = 1"));
    let first = h.log.clone();
    h.settle(first);
    let before: Vec<(ReplicaId, u32)> = h
        .node
        .replicas
        .values()
        .map(|r| (r.id.clone(), r.pid.unwrap()))
        .collect();
    let out = reload(
        &mut h,
        &cfg("1", "min = 2\nmax = 8\nwarm_pool = 1\ntarget_wait = \"2s\""),
    );
    assert!(signals(&out, StopSignal::Term).is_empty() && spawns(&out) == 0);
    let after: Vec<(ReplicaId, u32)> = h
        .node
        .replicas
        .values()
        .map(|r| (r.id.clone(), r.pid.unwrap()))
        .collect();
    assert_eq!(before, after);
    assert_eq!(h.node.models["m"].config.scaling.max, 8);
}

#[test]
fn a_version_change_warms_new_replicas_before_old_ones_drain() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 1"));
    let first = h.log.clone();
    h.settle(first);
    let old: Vec<ReplicaId> = h.node.replicas.keys().cloned().collect();
    let out = reload(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 1"));
    // The old warm one serves nothing: it goes at once. Routed ones stay.
    assert_eq!(signals(&out, StopSignal::Term).len(), 1);
    assert_eq!(routed(&h), 2);
    let st = h.node.status(Some("m"), h.now);
    let rollout = st.models[0].rollout.clone().unwrap();
    assert_eq!(
        (
            rollout.version.as_str(),
            rollout.from.as_str(),
            rollout.halted.as_deref()
        ),
        ("2", "1", None)
    );
    assert!(rollout
        .to_string()
        .starts_with("rolling out version 2 (from 1)"));
    let mut actions = out;
    let mut min_routed = routed(&h);
    for _ in 0..10 {
        let ids = h.spawn_all(&actions);
        actions.clear();
        for id in ids {
            actions.extend(h.warm(&id));
            min_routed = min_routed.min(routed(&h));
        }
        for id in h.in_state("m", ReplicaState::Draining) {
            let before = h.log.len();
            h.report("m", Some(&id.0), 0.0, 0, 0);
            actions.extend(h.log[before..].iter().cloned());
        }
        for id in h.in_state("m", ReplicaState::Stopping) {
            actions.extend(h.exit(&id, "exit status 0"));
            min_routed = min_routed.min(routed(&h));
        }
        actions.extend(h.advance(Duration::from_millis(250)));
    }
    assert!(min_routed >= 2, "routed never below min during the rollout");
    let versions: Vec<String> = h
        .node
        .replicas
        .values()
        .map(|r| r.version.clone())
        .collect();
    assert_eq!(versions, vec!["2"; 3], "2 routed + 1 warm, all new");
    assert!(h.node.replicas.keys().all(|id| !old.contains(id)));
    assert!(
        h.node.status(Some("m"), h.now).models[0].rollout.is_none(),
        "complete"
    );
}

#[test]
fn a_new_version_that_cannot_warm_up_halts_the_rollout_and_latches() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let old = h.in_state("m", ReplicaState::Routed);
    let mut actions = reload(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 0"));
    // Every new replica times out in warm-up (startup_timeout 10 s).
    for _ in 0..400 {
        h.spawn_all(&actions);
        actions.clear();
        for id in h.in_state("m", ReplicaState::Stopping) {
            actions.extend(h.exit(&id, "exit status 143"));
        }
        actions.extend(h.advance(Duration::from_millis(250)));
        if h.node.models["m"]
            .rollout
            .as_ref()
            .is_some_and(|r| r.halted.is_some())
        {
            break;
        }
    }
    let st = h.node.status(Some("m"), h.now);
    let text = st.models[0].rollout.clone().unwrap().halted.unwrap();
    assert!(
        text.contains("halted") && text.contains("version 1 keeps serving"),
        "{text}"
    );
    assert_eq!(
        h.in_state("m", ReplicaState::Routed),
        old,
        "the old version keeps serving"
    );
    // Latched: no more new-version launches, however long we wait.
    let later = h.run_for(Duration::from_secs(600));
    assert_eq!(spawns(&later), 0);
    // An old replica that dies is replaced with the old version.
    let out = h.exit(&old[0], "killed by SIGKILL");
    let out2 = h.run_for(Duration::from_secs(400));
    let spec = out.iter().chain(out2.iter()).find_map(|a| match a {
        Action::Spawn(s) => Some(s.replica.clone()),
        _ => None,
    });
    let replacement = spec.expect("replaced");
    assert_eq!(h.node.replicas[&replacement].version, "1");
    // A new configuration resumes.
    let out = reload(&mut h, &cfg("3", "min = 2\nmax = 4\nwarm_pool = 0"));
    assert!(h.node.models["m"]
        .rollout
        .as_ref()
        .unwrap()
        .halted
        .is_none());
    let _ = out;
    let new: Vec<&str> = h
        .node
        .replicas
        .values()
        .filter(|r| r.state == ReplicaState::Pending)
        .map(|r| r.version.as_str())
        .collect();
    assert_eq!(
        new,
        vec!["3", "3"],
        "version 3 replicas are on their way (after the back-off)"
    );
}

// ---- who decides: the reload flow ------------------------------------------------------------

fn read_ok(toml: &str, warnings: &[&str]) -> Event {
    let config = Config::parse(toml, Path::new("reload.toml")).unwrap();
    Event::ConfigRead(Ok(Box::new(NewConfig {
        config,
        warnings: warnings.iter().map(|w| w.to_string()).collect(),
    })))
}

fn reload_request(h: &mut Harness, id: RequestId, peer: Peer) -> Vec<Action> {
    h.send(Event::Request {
        id,
        peer,
        request: crate::protocol::Request::Reload {},
    })
}

fn reads(actions: &[Action]) -> Vec<ReloadCause> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ReadConfig { cause } => Some(*cause),
            _ => None,
        })
        .collect()
}

/// The answers in `actions`, by request id, as `Ok(())` or the error code.
fn answers(actions: &[Action]) -> Vec<(RequestId, Result<(), ErrorCode>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Reply { id, answer } => {
                Some((*id, answer.clone().map(|_| ()).map_err(|f| f.code)))
            }
            _ => None,
        })
        .collect()
}

fn logged(actions: &[Action], level: LogLevel) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Log {
                level: l, message, ..
            } if *l == level => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn reader() -> Peer {
    Peer {
        role: crate::protocol::Role::Reporter,
        ..Peer::trusted()
    }
}

#[test]
fn a_reload_request_reads_the_file_then_the_shell_applies_its_part_before_the_answer() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let out = reload_request(&mut h, 7, Peer::trusted());
    assert_eq!(reads(&out), [ReloadCause::Request]);
    assert!(answers(&out).is_empty(), "answered once the file is read");

    let out = h.send(read_ok(
        &cfg("1", "min = 1\nmax = 6\nwarm_pool = 0"),
        &["daemon.socket changed from a to b: not applied"],
    ));
    let done = out
        .iter()
        .position(|a| matches!(a, Action::ReloadDone { applied: Some(c), cause: ReloadCause::Request } if c.models[0].scaling.max == 6))
        .expect("the configuration in force goes to the shell");
    let answered = out
        .iter()
        .position(|a| {
            matches!(
                a,
                Action::Reply {
                    id: 7,
                    answer: Ok(_)
                }
            )
        })
        .expect("the request is answered");
    assert!(
        done < answered,
        "in force everywhere before the answer: {out:?}"
    );
    assert_eq!(h.node.models["m"].config.scaling.max, 6);
    assert_eq!(
        logged(&out, LogLevel::Warn),
        ["reload: daemon.socket changed from a to b: not applied"]
    );
}

#[test]
fn a_bad_file_is_answered_with_its_error_and_changes_nothing() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let before: Vec<ReplicaId> = h.node.replicas.keys().cloned().collect();
    reload_request(&mut h, 3, Peer::trusted());
    let out = h.send(Event::ConfigRead(Err(
        "reload.toml:9: max: not a number".into()
    )));
    assert_eq!(answers(&out), [(3, Err(ErrorCode::BadRequest))]);
    let Some(Action::Reply { answer: Err(f), .. }) =
        out.iter().find(|a| matches!(a, Action::Reply { .. }))
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        f.message,
        "configuration not reloaded: reload.toml:9: max: not a number"
    );
    assert!(out.contains(&Action::ReloadDone {
        cause: ReloadCause::Request,
        applied: None
    }));
    assert_eq!(
        logged(&out, LogLevel::Error),
        ["reload: configuration not reloaded, the running one is kept: reload.toml:9: max: not a number"]
    );
    assert_eq!(h.node.replicas.keys().cloned().collect::<Vec<_>>(), before);
    assert_eq!(h.node.models["m"].config.scaling.max, 4);
}

#[test]
fn only_admins_may_reload_and_nothing_is_read_for_others() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let out = reload_request(&mut h, 1, reader());
    assert_eq!(answers(&out), [(1, Err(ErrorCode::Forbidden))]);
    assert!(reads(&out).is_empty());
}

#[test]
fn while_shutting_down_reloads_are_refused_and_a_read_out_is_not_applied() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    // A read is out when the stop comes; one more request waits behind it.
    assert_eq!(reads(&reload_request(&mut h, 1, Peer::trusted())).len(), 1);
    assert!(reads(&reload_request(&mut h, 2, Peer::trusted())).is_empty());
    let out = h.send(Event::Shutdown { immediate: false });
    let mut refused = answers(&out);
    refused.sort_by_key(|(id, _)| *id);
    assert_eq!(
        refused,
        [(1, Err(ErrorCode::Busy)), (2, Err(ErrorCode::Busy))],
        "answered at once, not when the read comes back"
    );
    // The read comes back: the reload ends for the shell, nothing is applied, nobody answered twice.
    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 8\nwarm_pool = 0"), &[]));
    assert!(out.contains(&Action::ReloadDone {
        cause: ReloadCause::Request,
        applied: None
    }));
    assert!(answers(&out).is_empty());
    assert_eq!(h.node.models["m"].config.scaling.max, 4);
    // Asked now: refused, and no read.
    let out = reload_request(&mut h, 3, Peer::trusted());
    assert_eq!(answers(&out), [(3, Err(ErrorCode::Busy))]);
    let out = h.send(Event::ReloadSignal);
    assert!(reads(&out).is_empty());
    assert_eq!(
        logged(&out, LogLevel::Warn),
        ["SIGHUP ignored: shutting down"]
    );
}

#[test]
fn reloads_asked_during_a_read_share_the_next_read() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    assert_eq!(
        reads(&reload_request(&mut h, 1, Peer::trusted())),
        [ReloadCause::Request]
    );
    // A storm while the file is being read: no second read yet.
    let mut during = Vec::new();
    for _ in 0..50 {
        during.extend(h.send(Event::ReloadSignal));
    }
    during.extend(reload_request(&mut h, 2, Peer::trusted()));
    assert!(reads(&during).is_empty(), "one read at a time");

    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 5\nwarm_pool = 0"), &[]));
    assert_eq!(answers(&out), [(1, Ok(()))]);
    assert_eq!(
        reads(&out),
        [ReloadCause::Signal],
        "one more read, for everything asked meanwhile: the file may have changed since"
    );
    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 7\nwarm_pool = 0"), &[]));
    assert_eq!(answers(&out), [(2, Ok(()))]);
    assert!(reads(&out).is_empty());
    assert_eq!(h.node.models["m"].config.scaling.max, 7);
}

#[test]
fn a_read_nobody_asked_for_changes_nothing() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 8\nwarm_pool = 0"), &[]));
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::ReloadDone { .. } | Action::Reply { .. })));
    assert_eq!(h.node.models["m"].config.scaling.max, 4);
}
