//! Adoption after an unplanned death, for replicas that were routed: they keep their places in
//! the routed set while their warm-ups re-verify them (the rule: routed only after a warm-up
//! passed by this process identity, in this run or in the run it was adopted from), also while
//! a busy server answers late; they leave, drained, when the check fails or never passes.

use std::time::Duration;

use super::adopt_tests::{earlier_run, probes, stopped_undrained, two_models};
use super::harness::{routed_sets, signals, Harness};
use super::*;

fn found(toml: &str, ledger: Ledger) -> (Harness, Vec<Action>) {
    let mut h = Harness::bare(toml);
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger,
    });
    (h, out)
}

fn busy() -> ProbeOutcome {
    ProbeOutcome {
        ok: false,
        not_ready: true,
        detail: "no answer within 5s".into(),
    }
}

fn answer(h: &mut Harness, id: &str, outcome: ProbeOutcome) -> Vec<Action> {
    h.send(Event::Probed {
        replica: ReplicaId(id.into()),
        kind: ProbeKind::Warmup,
        outcome,
    })
}

fn routed(h: &Harness, model: &str) -> Vec<String> {
    h.node
        .routed_endpoints(model)
        .into_iter()
        .map(|e| e.replica)
        .collect()
}

#[test]
fn a_busy_adopted_replica_keeps_its_place_while_its_warm_up_waits_behind_its_work() {
    let toml = two_models("server");
    let (_, ledger) = earlier_run(&toml);
    let (mut h, out) = found(&toml, ledger);
    assert_eq!(routed(&h, "b"), ["b-1"]);
    assert!(probes(&out, ProbeKind::Warmup).contains(&ReplicaId("b-1".into())));
    // Its warm-up times out behind live work, again and again: it is asked again, soon, and
    // stays routed throughout.
    for _ in 0..5 {
        let again = answer(&mut h, "b-1", busy());
        let retries: Vec<&Action> = again
            .iter()
            .filter(|a| {
                matches!(a, Action::Probe { replica, kind: ProbeKind::Warmup, after, .. }
                    if replica.0 == "b-1" && *after == super::probes::WARMUP_RETRY_LOADING)
            })
            .collect();
        assert_eq!(retries.len(), 1, "{again:?}");
        assert!(routed_sets(&again).is_empty(), "the routed set stays");
        h.run_for(Duration::from_secs(1));
        assert_eq!(routed(&h, "b"), ["b-1"]);
    }
    let b1 = &h.node.held.replicas()[&ReplicaId("b-1".into())];
    assert!(b1.reason.contains("re-verifies"), "{}", b1.reason);
    assert!(b1.reason.contains("no answer within 5s"), "{}", b1.reason);
    // Then it answers: nothing moves, the reason goes.
    let out = answer(
        &mut h,
        "b-1",
        ProbeOutcome {
            ok: true,
            not_ready: false,
            detail: "HTTP 200".into(),
        },
    );
    assert!(routed_sets(&out).is_empty());
    let b1 = &h.node.held.replicas()[&ReplicaId("b-1".into())];
    assert!(!b1.reverifying && b1.reason.is_empty(), "{b1:?}");
    assert_eq!(b1.state, ReplicaState::Routed);
    // And its liveness probes resume.
    let later = h.run_for(Duration::from_secs(2));
    assert!(later.iter().any(|a| matches!(a, Action::Probe { replica, kind: ProbeKind::Liveness, .. } if replica.0 == "b-1")));
}

#[test]
fn an_adopted_routed_replica_whose_warm_up_never_passes_is_drained_after_startup_timeout() {
    let toml = two_models("server");
    let (_, ledger) = earlier_run(&toml);
    let (mut h, _) = found(&toml, ledger);
    // The harness's startup_timeout is 10 s; b-1 never answers.
    h.run_for(Duration::from_millis(9_500));
    let b1 = &h.node.held.replicas()[&ReplicaId("b-1".into())];
    assert_eq!(b1.state, ReplicaState::Routed, "within the timeout: {b1:?}");
    assert_eq!(routed(&h, "b"), ["b-1"]);
    h.run_for(Duration::from_secs(1));
    let b1 = &h.node.held.replicas()[&ReplicaId("b-1".into())];
    assert_eq!(b1.state, ReplicaState::Draining, "{b1:?}");
    assert!(
        b1.reason.contains("did not pass within 10"),
        "{}",
        b1.reason
    );
    assert!(!routed(&h, "b").contains(&"b-1".to_string()));
    assert!(h.node.models["b"].failures.is_empty(), "not a failure");
    assert_eq!(
        stopped_undrained(&h.log, &["a-1", "a-2", "b-1"]),
        Vec::<String>::new()
    );
}

#[test]
fn a_record_that_says_routed_without_a_warm_up_passed_is_not_routed_before_one() {
    let toml = two_models("server");
    let (_, mut ledger) = earlier_run(&toml);
    for r in &mut ledger.replicas {
        if r.replica == "b-1" {
            r.ever_warm = false;
        }
    }
    let (mut h, out) = found(&toml, ledger);
    assert!(
        routed_sets(&out)
            .iter()
            .all(|s| !s.contains(&"b-1".to_string())),
        "{out:?}"
    );
    assert_eq!(
        h.node.held.replicas()[&ReplicaId("b-1".into())].state,
        ReplicaState::Starting
    );
    let out = h.warm(&ReplicaId("b-1".into()));
    assert_eq!(
        routed_sets(&out),
        vec![vec!["b-1".to_string()]],
        "its place back once warm"
    );
}

#[test]
fn a_replica_found_draining_goes_on_draining_and_is_never_stopped_with_work_in_flight() {
    let toml = two_models("server");
    let (mut old, _) = earlier_run(&toml);
    old.ask(
        Peer::trusted(),
        crate::protocol::Request::Drain {
            replica: Some("b-1".into()),
            model: None,
            force: true,
        },
    )
    .expect("the request is answered ok");
    assert_eq!(
        old.node.held.replicas()[&ReplicaId("b-1".into())].state,
        ReplicaState::Draining
    );
    let (mut h, out) = found(&toml, old.node.ledger());
    assert!(signals(&out, StopSignal::Term).is_empty(), "{out:?}");
    let b1 = &h.node.held.replicas()[&ReplicaId("b-1".into())];
    assert_eq!(b1.state, ReplicaState::Draining);
    h.report("b", Some("b-1"), 0.0, 0, 1);
    assert_eq!(
        h.node.held.replicas()[&ReplicaId("b-1".into())].state,
        ReplicaState::Draining,
        "work in flight"
    );
    let out = {
        h.report("b", Some("b-1"), 0.0, 0, 0);
        h.log.clone()
    };
    assert!(signals(&out, StopSignal::Term).contains(&ReplicaId("b-1".into())));
}

#[test]
fn an_adopted_replica_sent_back_to_the_pool_before_its_warm_up_passed_is_not_promoted() {
    let toml = two_models("server");
    let (_, ledger) = earlier_run(&toml);
    let (mut h, _) = found(&toml, ledger);
    let a1 = ReplicaId("a-1".into());
    h.node.held.replicas_mut().get_mut(&a1).unwrap().state = ReplicaState::Warm;
    assert!(
        !h.node.held.replicas()[&a1].promotable(),
        "under re-verification"
    );
    answer(
        &mut h,
        "a-1",
        ProbeOutcome {
            ok: true,
            not_ready: false,
            detail: "HTTP 200".into(),
        },
    );
    let a1 = &h.node.held.replicas()[&a1];
    assert!(!a1.reverifying, "{a1:?}");
    assert!(
        a1.promotable() || a1.state == ReplicaState::Routed,
        "promotable, or promoted already: {a1:?}"
    );
}
