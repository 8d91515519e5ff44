//! The many-replica family: a port range (`BIG_PORTS`) that lets one event find hundreds of
//! replicas surplus or departing, so that the per-event stop batch is met by stopping a batch,
//! not by never being asked for more.

use std::time::Duration;

use proptest::prelude::*;

use super::inputs::{big_steps, Step, BIG, BIG_PORTS};
use super::{cases, run_to_rest, World};
use crate::core::{Event, ReplicaState};

/// Model `a` scaled to the whole range by an admin, every replica made and started (a batch per
/// event) and none answered yet (a spawn takes its time); nothing stopped so far.
fn hundreds_starting() -> World {
    let mut w = World::new(BIG);
    w.send(Event::Tick);
    w.step(&Step::admin_scale(BIG_PORTS, BIG_PORTS));
    for _ in 0..8 {
        w.step(&Step::Advance(100));
    }
    let starting = w
        .node
        .held
        .replicas()
        .of_model("a")
        .filter(|r| r.state == ReplicaState::Starting && &*r.version == "1")
        .count();
    assert_eq!(starting, BIG_PORTS as usize, "replicas of a starting");
    assert_eq!(w.most_idle_stops, 0);
    w
}

proptest! {
    // Fewer cases (50 of the 2,000): each walks hundreds of replicas through every event.
    #![proptest_config(ProptestConfig {
        cases: cases().div_ceil(40),
        max_shrink_iters: 2000,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    /// The same promises where one event finds far more surplus replicas than it may stop (a
    /// scale from hundreds down to a few, `max` shrunk by a reload): the bound on surplus stops
    /// is met by stopping a batch, not by never being asked for more (the family of mod.rs, within
    /// 32 ports, never is).
    #[test]
    fn surplus_stops_stay_a_batch_per_event_when_hundreds_are_surplus(
        config in BIG..BIG + 2,
        steps in prop::collection::vec(big_steps(), 1..16).prop_map(|v| v.concat()),
    ) {
        run_to_rest(config, &steps);
    }
}

/// What the family is for, in one sequence: a scale down to one, while six batches' worth
/// of replicas start, finds them all surplus in one event, which stops exactly a batch; the
/// rest follow.
#[test]
fn a_scale_down_from_hundreds_stops_exactly_a_batch_in_one_event() {
    let mut w = hundreds_starting();
    let batch = super::super::reconcile::STOPS_PER_EVENT as usize;
    w.step(&Step::admin_scale(1, 1));
    assert_eq!(w.most_idle_stops, batch, "one event, one batch");
    w.behave(Duration::from_secs(15 * 60));
    w.check_min_routed();
    assert_eq!(w.node.held.replicas().of_model("a").count(), 1);
}

/// A new version rolled out over six batches' worth of replicas still starting: the reload's
/// event stops a batch of them, the next events the rest, and the rollout completes.
#[test]
fn a_rollout_over_hundreds_stops_a_batch_per_event_and_completes() {
    let mut w = hundreds_starting();
    let n = BIG_PORTS;
    w.step(&Step::ReloadAsk(true));
    w.step(&Step::ConfigRead(BIG as u8 + 2));
    let batch = super::super::reconcile::STOPS_PER_EVENT as usize;
    assert_eq!(w.most_idle_stops, batch, "the reload's event: one batch");
    let left = |w: &World| {
        w.node
            .held
            .replicas()
            .of_model("a")
            .filter(|r| w.node.idle_departing(r))
            .count()
    };
    assert_eq!(left(&w), n as usize - batch);
    // Ticks alone finish them, a batch each (nothing else happens meanwhile).
    for i in 1..n as usize / batch {
        w.step(&Step::Advance(100));
        assert_eq!(
            left(&w),
            (n as usize).saturating_sub((i + 1) * batch),
            "tick {i}"
        );
    }
    assert_eq!(left(&w), 0);
    w.behave(Duration::from_secs(15 * 60));
    w.check_min_routed();
    let a: Vec<_> = w.node.held.replicas().of_model("a").collect();
    assert!(
        a.iter().all(|r| &*r.version == "2"),
        "every replica of version 2"
    );
    assert_eq!(
        a.iter().filter(|r| r.state == ReplicaState::Routed).count(),
        n as usize
    );
    assert!(w.node.models["a"].rollout.is_none(), "the rollout is done");
}
