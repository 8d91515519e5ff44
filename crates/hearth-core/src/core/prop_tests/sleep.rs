//! The sleeping-tier family: more models than GPUs (`SLEEPY`, `SLEEPY + 1`), where wakes,
//! evictions and reservations that shrink and grow meet every hostile order of events; the
//! checks of mod.rs hold after each (device and host memory never over-committed among them).
//! Besides the hostile steps, a front door's reports now and then: a queue for one model (it
//! scales up, wakes, and takes room from others) or none at all (its replicas may be taken).

use proptest::prelude::*;

use super::inputs::{step, Step, SLEEPY};
use super::{cases, run_to_rest};

/// A trusted model-wide report: `load` requests waiting for a model (0: it is idle).
fn door_report() -> impl Strategy<Value = Step> {
    (any::<u8>(), prop_oneof![1 => Just(0u64), 2 => 1u64..50]).prop_map(|(model, load)| {
        Step::Report {
            model,
            replica: None,
            wait: Some(if load > 0 { 5000.0 } else { 0.0 }),
            depth: Some(load),
            in_flight: Some(load),
            arrived: None,
            completed: None,
            // An admin (see `peer`), whose reports are taken.
            peer: 0,
        }
    })
}

proptest! {
    // A quarter of the main family's cases: the family is narrower.
    #![proptest_config(ProptestConfig {
        cases: cases().div_ceil(4),
        max_shrink_iters: 2000,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn reservations_never_over_commit_a_device_or_the_host_under_hostile_sequences(
        config in SLEEPY..SLEEPY + 2,
        steps in prop::collection::vec(prop_oneof![3 => step(), 1 => door_report()], 1..80),
    ) {
        run_to_rest(config, &steps);
    }
}
