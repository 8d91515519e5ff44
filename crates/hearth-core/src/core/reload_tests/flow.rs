//! Who decides: the reload flow. A request reads the file, the shell applies its part before the
//! answer; a bad file is answered with its error and changes nothing; non-admins and reloads
//! during shutdown are refused; reloads asked during a read share the next; a read nobody asked
//! for changes nothing.

use std::path::Path;

use super::super::harness::Harness;
use super::super::*;
use super::cfg;
use crate::config::Config;
use crate::protocol::ErrorCode;

fn read_ok(toml: &str, warnings: &[&str]) -> Event {
    let config = Config::parse(toml, Path::new("reload.toml")).unwrap();
    Event::ConfigRead(Ok(Box::new(NewConfig {
        config,
        warnings: warnings.iter().map(|w| w.to_string()).collect(),
        text: "".into(),
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
    let before: Vec<ReplicaId> = h.node.held.replicas().keys().cloned().collect();
    reload_request(&mut h, 3, Peer::trusted());
    let out = h.send(Event::ConfigRead(Err(crate::core::harness::refused(
        "reload.toml",
        Some(9),
        "max",
        "not a number",
    ))));
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
    assert_eq!(
        h.node.held.replicas().keys().cloned().collect::<Vec<_>>(),
        before
    );
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
