//! Adoption with virtual time: replicas of an earlier run taken back in their roles (routed ones
//! keep their places while re-verified after an unplanned death), rolled over when their model
//! changed, drained before they stop when they cannot be taken back; no cold start for any that
//! matches. `adopt_found_tests.rs`: the re-verification of routed ones in place.

use super::harness::{model, routed_sets, signals, spawns, Harness, BASE};
use super::*;

pub(super) fn two_models(a_command: &str) -> String {
    let a = model("a", "", "min = 2\nmax = 8\nwarm_pool = 1")
        .replace("gpus = 0", "gpus = 1\ngpu_memory = \"10GiB\"")
        .replace("\"server\"", &format!("\"{a_command}\""));
    let b = model("b", "", "min = 1\nmax = 4\nwarm_pool = 0");
    format!("{BASE}{a}{b}")
}

/// A settled node of `toml` (a: 2 routed + 1 warm on GPUs; b: 1 routed) and its ledger.
pub(super) fn earlier_run(toml: &str) -> (Harness, Ledger) {
    let mut h = Harness::new(toml);
    let first = h.log.clone();
    h.settle(first);
    assert_eq!(h.in_state("a", ReplicaState::Routed).len(), 2);
    assert_eq!(h.in_state("a", ReplicaState::Warm).len(), 1);
    let ledger = h.node.ledger();
    (h, ledger)
}

pub(super) fn probes(actions: &[Action], kind: ProbeKind) -> Vec<ReplicaId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Probe {
                replica,
                kind: k,
                after,
                ..
            } if *k == kind => {
                assert!(after.is_zero(), "adopted replicas are probed at once");
                Some(replica.clone())
            }
            _ => None,
        })
        .collect()
}

pub(super) fn pids(h: &Harness) -> Vec<(ReplicaId, Option<u32>, ReplicaState)> {
    h.node
        .held
        .replicas()
        .values()
        .map(|r| (r.id.clone(), r.pid, r.state))
        .collect()
}

/// The replicas sent SIGTERM in `actions` while routed: not published as draining (or
/// stopping on their own account) before. A routed replica leaves by a drain.
pub(super) fn stopped_undrained(actions: &[Action], routed: &[&str]) -> Vec<String> {
    let mut drained = std::collections::BTreeSet::new();
    let mut undrained = Vec::new();
    for a in actions {
        match a {
            Action::Publish(crate::protocol::WatchEvent::Replica { replica, state, .. })
                if *state == ReplicaState::Draining.into() =>
            {
                drained.insert(replica.clone());
            }
            Action::Signal {
                replica,
                signal: StopSignal::Term,
                ..
            } if routed.contains(&replica.as_str()) && !drained.contains(replica.as_str()) => {
                undrained.push(replica.0.clone());
            }
            _ => {}
        }
    }
    undrained
}

#[test]
fn found_replicas_keep_their_routed_places_while_re_verified_then_all_roles_without_a_cold_start() {
    let toml = two_models("server");
    let (old, ledger) = earlier_run(&toml);
    let mut h = Harness::bare(&toml);
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger: ledger.clone(),
    });
    let mut verifying = probes(&out, ProbeKind::Warmup);
    verifying.sort();
    assert_eq!(verifying.len(), 4, "every replica is re-verified: {out:?}");
    // The routed ones were routed by a warm-up their own processes passed: they keep their
    // places in the routed set while the warm-up runs again; the warm one is not promoted.
    let mut sets = routed_sets(&out);
    sets.sort();
    assert_eq!(
        sets,
        vec![vec!["a-1".to_string(), "a-2".into()], vec!["b-1".into()]],
        "the routed set is the earlier run's from the start"
    );
    let a3 = ReplicaId("a-3".into());
    assert_eq!(h.node.held.replicas()[&a3].state, ReplicaState::Starting);
    let mut all = out;
    all.extend(h.send(Event::Tick));
    // The one that was warm answers first: it must not take a routed one's place.
    let was_warm = old.in_state("a", ReplicaState::Warm);
    verifying.sort_by_key(|id| !was_warm.contains(id));
    all.extend(h.run_for(std::time::Duration::from_secs(3)));
    assert_eq!(
        spawns(&all),
        0,
        "no cold start while the adopted ones verify"
    );
    for id in &verifying {
        all.extend(h.warm(id));
    }
    all.extend(h.run_for(std::time::Duration::from_secs(3)));
    assert_eq!(spawns(&all), 0, "no cold start at all");
    assert_eq!(pids(&h), pids(&old), "the same replicas, pids and roles");
    assert_eq!(
        routed_sets(&all).len(),
        2,
        "the routed sets were published once, at the adoption, and never changed: {:?}",
        routed_sets(&all)
    );
    assert!(
        !all.iter().any(|a| matches!(
            a,
            Action::Ready {
                how: Readiness::Cold(_),
                ..
            }
        )),
        "an adopted warm-up is not a time-to-ready sample"
    );
    // GPU reservations are the earlier run's.
    let st = h.node.status(None, h.now);
    let ost = old.node.status(None, old.now);
    let reserved = |s: &crate::protocol::StatusView| {
        s.gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.memory_reserved))
            .collect::<Vec<_>>()
    };
    assert_eq!(reserved(&st), reserved(&ost));
    // A new replica continues the numbering.
    let next = h.node.models["a"].next_n;
    assert_eq!(next, old.node.models["a"].next_n);
}

#[test]
fn handed_over_replicas_keep_their_roles_in_the_same_event() {
    let toml = two_models("server");
    let (old, ledger) = earlier_run(&toml);
    let mut h = Harness::bare(&toml);
    let out = h.send(Event::Adopt {
        how: Adoption::HandedOver,
        ledger,
    });
    assert!(probes(&out, ProbeKind::Warmup).is_empty(), "{out:?}");
    assert_eq!(pids(&h), pids(&old));
    let mut sets = routed_sets(&out);
    sets.sort();
    assert_eq!(
        sets,
        vec![vec!["a-1".to_string(), "a-2".into()], vec!["b-1".into()]]
    );
    let more = h.run_for(std::time::Duration::from_secs(5));
    assert_eq!(spawns(&more), 0);
    assert!(
        routed_sets(&more).is_empty(),
        "the routed set never changes"
    );
}

#[test]
fn a_model_changed_while_down_rolls_out_draining_its_routed_replicas_and_the_untouched_one_is_adopted(
) {
    for how in [Adoption::Found, Adoption::HandedOver] {
        rolls_out_after(how);
    }
}

/// Adopted with the launch spec of an earlier file: the warm one (serving nothing) is stopped
/// at once, the routed ones keep serving until replicas of the new spec are routed in their
/// places, then drain; never a stop while routed.
fn rolls_out_after(how: Adoption) {
    let (_, ledger) = earlier_run(&two_models("server"));
    let mut h = Harness::bare(&two_models("server-v2"));
    let out = h.send(Event::Adopt { how, ledger });
    let stopped = signals(&out, StopSignal::Term);
    assert_eq!(stopped, [ReplicaId("a-3".into())], "{how:?}: {out:?}");
    let mut sets = routed_sets(&out);
    sets.sort();
    assert_eq!(
        sets,
        vec![vec!["a-1".to_string(), "a-2".into()], vec!["b-1".into()]],
        "{how:?}: the routed ones keep serving"
    );
    let verified = probes(&out, ProbeKind::Warmup);
    let expect: Vec<ReplicaId> = match how {
        // The warm one too (its warm-up goes out before the rollout stops it).
        Adoption::Found => ["a-1", "a-2", "a-3", "b-1"]
            .map(|s| ReplicaId(s.into()))
            .to_vec(),
        Adoption::HandedOver => Vec::new(),
    };
    let mut verified_sorted = verified.clone();
    verified_sorted.sort();
    assert_eq!(verified_sorted, expect, "{how:?}");
    for id in verified.iter().filter(|id| id.0 != "a-3") {
        h.warm(id);
    }
    // The stopped one exits (start_alone: nothing new starts on its GPU before).
    let mark = h.log.len();
    h.exit(&ReplicaId("a-3".into()), crate::core::ExitStatus::Code(0));
    h.send(Event::Tick);
    let tick = h.log[mark..].to_vec();
    let new: Vec<&SpawnSpec> = tick
        .iter()
        .filter_map(|a| match a {
            Action::Spawn(s) => Some(s),
            _ => None,
        })
        .collect();
    assert!(!new.is_empty(), "{how:?}");
    assert!(new
        .iter()
        .all(|s| s.model == "a" && s.command[0] == "server-v2"));
    assert!(new
        .iter()
        .all(|s| s.replica.0 != "a-1" && s.replica.0 != "a-2" && s.replica.0 != "a-3"));
    // The new version comes up; the old routed ones drain once it is routed, then stop.
    h.settle(tick);
    h.run_for(std::time::Duration::from_secs(2));
    for id in ["a-1", "a-2"] {
        let r = &h.node.held.replicas()[&ReplicaId(id.into())];
        assert_eq!(r.state, ReplicaState::Draining, "{how:?} {id}: {r:?}");
        // Its work done: it stops.
        h.report("a", Some(id), 0.0, 0, 0);
    }
    assert_eq!(
        stopped_undrained(&h.log, &["a-1", "a-2", "b-1"]),
        Vec::<String>::new(),
        "{how:?}"
    );
    let routed: Vec<String> = h
        .in_state("a", ReplicaState::Routed)
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(routed.len(), 2, "{how:?}: {routed:?}");
    assert!(routed.iter().all(|r| r != "a-1" && r != "a-2"));
    for id in ["a-1", "a-2"] {
        let r = &h.node.held.replicas()[&ReplicaId(id.into())];
        assert_eq!(
            r.state,
            ReplicaState::Stopping,
            "{how:?} {id}: drained, then stopped"
        );
    }
    assert_eq!(
        h.in_state("b", ReplicaState::Routed),
        [ReplicaId("b-1".into())]
    );
}

#[test]
fn a_field_missing_from_the_saved_spec_reads_as_its_default_and_still_matches() {
    let toml = two_models("server");
    let (_, mut ledger) = earlier_run(&toml);
    for r in &mut ledger.replicas {
        // As an older binary would have written it: without the fields that have defaults.
        let mut v = serde_json::to_value(&r.spec).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in ["placement", "prefetch", "env", "user", "version"] {
            o.remove(k);
        }
        r.spec = serde_json::from_value(v).unwrap();
    }
    let mut h = Harness::bare(&toml);
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger,
    });
    assert!(signals(&out, StopSignal::Term).is_empty(), "{out:?}");
    assert_eq!(probes(&out, ProbeKind::Warmup).len(), 4);
}

#[test]
fn records_that_do_not_fit_leave_drained_never_routed_and_numbers_are_bounded() {
    let toml = two_models("server");
    let (_, mut ledger) = earlier_run(&toml);
    let by = |l: &mut Ledger, id: &str| -> usize {
        l.replicas.iter().position(|r| r.replica == id).unwrap()
    };
    let i = by(&mut ledger, "a-1");
    ledger.replicas[i].port = 9; // outside daemon.ports
    let i = by(&mut ledger, "a-2");
    ledger.replicas[i].gpus = vec!["GPU-gone".into()];
    let i = by(&mut ledger, "a-3");
    ledger.replicas[i].gpu_bytes = u64::MAX;
    let i = by(&mut ledger, "b-1");
    let a3 = by(&mut ledger, "a-3");
    let dup_port = ledger.replicas[a3].port;
    ledger.replicas[i].port = dup_port; // the same port twice
    ledger.models.get_mut("a").unwrap().next_n = u64::MAX;
    ledger.models.get_mut("a").unwrap().desired_routed = u32::MAX;
    let mut h = Harness::bare(&toml);
    let out = h.send(Event::Adopt {
        how: Adoption::HandedOver,
        ledger,
    });
    // All three were routed: they leave by a drain, out of the routed set from the start.
    assert!(signals(&out, StopSignal::Term).is_empty(), "{out:?}");
    for id in ["a-1", "a-2", "b-1"] {
        let r = &h.node.held.replicas()[&ReplicaId(id.into())];
        assert_eq!(r.state, ReplicaState::Draining, "{id}: {r:?}");
        assert!(r.reason.starts_with("not adopted"), "{}", r.reason);
    }
    // Its process holds port 9 until it exits: booked, outside the range.
    assert_eq!(
        h.node.held.replicas()[&ReplicaId("a-1".into())].port,
        Some(9)
    );
    let a3 = &h.node.held.replicas()[&ReplicaId("a-3".into())];
    assert_eq!(a3.gpu_bytes, 80 << 30, "bounded by the device");
    let m = &h.node.models["a"];
    assert!(
        m.next_n < 20,
        "an absurd next_n is not believed: {}",
        m.next_n
    );
    assert!(
        h.node
            .held
            .replicas()
            .contains_key(&ReplicaId("a-4".into())),
        "numbering goes on from the records"
    );
    assert_eq!(m.desired_routed, 8, "clamped to max");
    let mut all = out;
    all.extend(h.run_for(std::time::Duration::from_secs(2)));
    let routed: Vec<String> = routed_sets(&all).concat();
    assert!(!routed
        .iter()
        .any(|r| r == "a-1" || r == "a-2" || r == "b-1"));
    // One reports its work done and stops at once; the others at the drain timeout (5 m).
    h.report("a", Some("a-1"), 0.0, 0, 0);
    assert_eq!(
        h.node.held.replicas()[&ReplicaId("a-1".into())].state,
        ReplicaState::Stopping
    );
    h.run_for(std::time::Duration::from_secs(5 * 60));
    for id in ["a-2", "b-1"] {
        let r = &h.node.held.replicas()[&ReplicaId(id.into())];
        assert_eq!(r.state, ReplicaState::Stopping, "{id}: {r:?}");
    }
    assert_eq!(
        stopped_undrained(&h.log, &["a-1", "a-2", "b-1"]),
        Vec::<String>::new()
    );
    // SIGKILL after stop_grace, as for any stop.
    let later = h.run_for(std::time::Duration::from_secs(6));
    let mut killed = signals(&later, StopSignal::Kill);
    killed.sort();
    assert_eq!(killed, ["a-2", "b-1"].map(|s| ReplicaId(s.into())));
}

#[test]
fn a_record_of_a_model_no_longer_configured_is_drained_then_stopped_and_killed() {
    let (_, ledger) = earlier_run(&two_models("server"));
    // b is gone from the file; its routed replica drains, then stops, then is killed.
    let only_a = format!(
        "{BASE}{}",
        model("a", "", "min = 2\nmax = 8\nwarm_pool = 1")
            .replace("gpus = 0", "gpus = 1\ngpu_memory = \"10GiB\"")
    );
    let mut h = Harness::bare(&only_a);
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger,
    });
    let b1 = ReplicaId("b-1".into());
    assert!(!signals(&out, StopSignal::Term).contains(&b1), "{out:?}");
    assert_eq!(h.node.held.replicas()[&b1].state, ReplicaState::Draining);
    let drained = h.run_for(super::lifecycle::ORPHAN_DRAIN + std::time::Duration::from_secs(1));
    assert!(signals(&drained, StopSignal::Term).contains(&b1));
    let killed = h.run_for(super::lifecycle::ORPHAN_STOP_GRACE + std::time::Duration::from_secs(1));
    assert!(signals(&killed, StopSignal::Kill).contains(&b1));
    h.exit(&b1, crate::core::harness::KILLED);
    assert!(!h.node.held.replicas().contains_key(&b1));
}

#[test]
fn an_adopted_replica_that_answers_its_warm_up_wrongly_leaves_without_a_failure_drained_if_routed()
{
    let toml = two_models("server");
    let (_, ledger) = earlier_run(&toml);
    let mut h = Harness::bare(&toml);
    h.send(Event::Adopt {
        how: Adoption::Found,
        ledger,
    });
    let wrong = |replica: &str| Event::Probed {
        replica: ReplicaId(replica.into()),
        kind: ProbeKind::Warmup,
        outcome: ProbeOutcome {
            ok: false,
            not_ready: false,
            detail: "port 30003 is answered by pid 77 (sleep), not by a process of this replica"
                .into(),
        },
    };
    // b-1 was routed and kept its place: it leaves the routed set and drains.
    let out = h.send(wrong("b-1"));
    assert!(signals(&out, StopSignal::Term).is_empty(), "{out:?}");
    let b1 = &h.node.held.replicas()[&ReplicaId("b-1".into())];
    assert_eq!(b1.state, ReplicaState::Draining);
    assert!(
        b1.reason.contains("adopted, but its warm-up failed"),
        "{}",
        b1.reason
    );
    assert_eq!(routed_sets(&out), vec![Vec::<String>::new()]);
    // a-3 was warm: it is stopped at once.
    let out = h.send(wrong("a-3"));
    assert_eq!(
        signals(&out, StopSignal::Term),
        vec![ReplicaId("a-3".into())]
    );
    assert!(h.node.models["b"].failures.is_empty());
    assert!(h.node.models["a"].failures.is_empty());
}

#[test]
fn after_an_orderly_stop_nothing_is_taken_back_and_models_start_afresh() {
    let toml = two_models("server");
    let (_, mut ledger) = earlier_run(&toml);
    ledger.replicas.clear();
    ledger.models.get_mut("a").unwrap().desired_routed = 6;
    let mut h = Harness::bare(&toml);
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger,
    });
    assert_eq!(
        h.node.models["a"].desired_routed, 2,
        "min, not the last run's count"
    );
    let ids: Vec<String> = out
        .iter()
        .filter_map(|a| match a {
            Action::Spawn(s) => Some(s.replica.0.clone()),
            _ => None,
        })
        .collect();
    assert!(ids.contains(&"a-1".to_string()), "{ids:?}");
}

/// The bursts a model's autoscaler has seen are in the ledger and come back with it, after an
/// unplanned death and a hand-over alike, and also when no replica is taken back (an orderly
/// stop leaves a ledger of models only).
#[test]
fn the_bursts_a_model_has_seen_come_back_with_the_ledger() {
    use crate::core::policy::recurrence::{Onset, Remembered};
    let toml = two_models("server");
    let (mut old, _) = earlier_run(&toml);
    let seen = Remembered {
        // Seconds before the harness's clock (which starts at 1000 s).
        onsets: [100, 400, 700]
            .iter()
            .map(|&at| Onset { at, level: 20.0 })
            .collect(),
        last_rising: Some(705),
    };
    let now = old.now;
    if let Some(m) = old.node.models.get_mut("a") {
        m.autoscaler.restore_bursts(&seen, now);
    }
    let ledger = old.node.ledger();
    assert_eq!(ledger.models["a"].bursts.as_ref(), Some(&seen));
    assert_eq!(ledger.models["b"].bursts, None, "b has seen none");
    let models_only = Ledger {
        models: ledger.models.clone(),
        replicas: Vec::new(),
    };
    for (how, ledger) in [
        (Adoption::Found, ledger.clone()),
        (Adoption::HandedOver, ledger),
        (Adoption::Found, models_only),
    ] {
        let mut h = Harness::bare(&toml);
        h.send(Event::Adopt { how, ledger });
        assert_eq!(
            h.node.models["a"].autoscaler.remembered_bursts().as_ref(),
            Some(&seen),
            "{how:?}"
        );
        assert_eq!(h.node.ledger().models["a"].bursts.as_ref(), Some(&seen));
    }
}
