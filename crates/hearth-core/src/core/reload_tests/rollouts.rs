//! What a changed configuration does to the replicas running: a scaling change keeps them, a
//! new version warms new replicas before the old ones drain, a rollout that cannot warm up halts
//! and latches, and the version serving can be configured back.

use std::time::Duration;

use super::super::harness::{signals, spawns, Harness};
use super::super::*;
use super::cfg;

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
        .held
        .replicas()
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
        .held
        .replicas()
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
    let old: Vec<ReplicaId> = h.node.held.replicas().keys().cloned().collect();
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
            actions.extend(h.exit(&id, crate::core::ExitStatus::Code(0)));
            min_routed = min_routed.min(routed(&h));
        }
        actions.extend(h.advance(Duration::from_millis(250)));
    }
    assert!(min_routed >= 2, "routed never below min during the rollout");
    let versions: Vec<String> = h
        .node
        .held
        .replicas()
        .values()
        .map(|r| r.version.to_string())
        .collect();
    assert_eq!(versions, vec!["2"; 3], "2 routed + 1 warm, all new");
    assert!(h.node.held.replicas().keys().all(|id| !old.contains(id)));
    assert!(
        h.node.status(Some("m"), h.now).models[0].rollout.is_none(),
        "complete"
    );
}

/// Reloads `toml` and lets every replica of the new version time out in warm-up (startup_timeout
/// 10 s) until the rollout halts.
fn roll_out_until_halted(h: &mut Harness, toml: &str) {
    let mut actions = reload(h, toml);
    for _ in 0..400 {
        h.spawn_all(&actions);
        actions.clear();
        for id in h.in_state("m", ReplicaState::Stopping) {
            actions.extend(h.exit(&id, crate::core::ExitStatus::Code(143)));
        }
        actions.extend(h.advance(Duration::from_millis(250)));
        if h.node.models["m"]
            .rollout
            .as_ref()
            .is_some_and(|r| r.halted.is_some())
        {
            return;
        }
    }
    panic!("the rollout did not halt");
}

#[test]
fn after_a_halted_rollout_the_version_serving_can_be_configured_back() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let old = h.in_state("m", ReplicaState::Routed);
    roll_out_until_halted(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 0"));
    let out = reload(&mut h, &cfg("1", "min = 2\nmax = 6\nwarm_pool = 0"));
    assert!(h.node.models["m"].rollout.is_none());
    assert!(signals(&out, StopSignal::Term).is_empty() && spawns(&out) == 0);
    assert_eq!(h.in_state("m", ReplicaState::Routed), old);
    for r in h.node.held.replicas().values() {
        // What is left of version 2 (a replica stopping after its failed warm-up) goes.
        assert_eq!(
            h.node.departing(r),
            &*r.version == "2",
            "{} {:?}",
            r.id,
            r.state
        );
    }
    assert!(h.node.status(Some("m"), h.now).models[0].rollout.is_none());
}

#[test]
fn a_new_version_that_cannot_warm_up_halts_the_rollout_and_latches() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let old = h.in_state("m", ReplicaState::Routed);
    roll_out_until_halted(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 0"));
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
    let out = h.exit(&old[0], crate::core::harness::KILLED);
    let out2 = h.run_for(Duration::from_secs(400));
    let spec = out.iter().chain(out2.iter()).find_map(|a| match a {
        Action::Spawn(s) => Some(s.replica.clone()),
        _ => None,
    });
    let replacement = spec.expect("replaced");
    assert_eq!(&*h.node.held.replicas()[&replacement].version, "1");
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
        .held
        .replicas()
        .values()
        .filter(|r| r.state == ReplicaState::Pending)
        .map(|r| &*r.version)
        .collect();
    assert_eq!(
        new,
        vec!["3", "3"],
        "version 3 replicas are on their way (after the back-off)"
    );
}
