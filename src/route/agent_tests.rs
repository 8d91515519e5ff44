use std::time::Duration;

use super::*;

const STALE: Duration = Duration::from_secs(5);

/// 2 routed replicas of 4 slots, `max` 4, 1 warm, a FIFO of 100, the daemon followed.
fn model() -> ModelInput {
    ModelInput {
        load: Load {
            routed: 2,
            slots: 4,
            free: 8,
            queued: 0,
            max_queue: 100,
        },
        capacity: Some(Capacity {
            drained: false,
            max: 4,
            warm: 1,
            can_start: true,
            asleep: 0,
        }),
        draining: false,
        daemon_gone_for: None,
        stale_after: STALE,
    }
}

fn line(a: &Answer) -> String {
    a.to_string()
}

#[test]
fn ready_weighs_free_and_promotable_slots_against_max_times_slots() {
    // (8 free + 4 promotable) / (4 × 4) = 75 %; holds (2 + 1) × 4 + 100.
    let a = model_answer("m", &model(), 1);
    assert_eq!(line(&a), "up ready 75% maxconn:112");
    // Half the routed slots busy: (4 + 4) / 16.
    let mut m = model();
    m.load.free = 4;
    assert_eq!(line(&model_answer("m", &m, 1)), "up ready 50% maxconn:112");
}

#[test]
fn maxconn_is_shared_among_the_balancers_rounding_up() {
    assert_eq!(
        line(&model_answer("m", &model(), 3)),
        "up ready 75% maxconn:38"
    );
    assert_eq!(
        line(&model_answer("m", &model(), 1024)),
        "up ready 75% maxconn:1"
    );
}

#[test]
fn saturated_never_reads_as_drain_from_load_alone() {
    let mut m = model();
    m.load.free = 0;
    m.load.queued = 40;
    m.capacity = Some(Capacity {
        drained: false,
        max: 2,
        warm: 0,
        can_start: false,
        asleep: 0,
    });
    assert_eq!(line(&model_answer("m", &m, 1)), "up ready 13% maxconn:108");
    // One slot's worth (of 2 × 4): HAProxy's weight 8 × 13 % = 1, never 0 (DRAIN).
    // At zero (min 0) with a replica it can start: one slot's worth, still up and ready.
    let mut zero = model();
    zero.load = Load {
        max_queue: 100,
        slots: 4,
        ..Load::default()
    };
    zero.capacity = Some(Capacity {
        drained: false,
        max: 4,
        warm: 0,
        can_start: true,
        asleep: 0,
    });
    assert_eq!(
        line(&model_answer("m", &zero, 1)),
        "up ready 7% maxconn:100"
    );
    // Queued requests use up free slots first: 1 of 16.
    let mut busy = model();
    busy.load.free = 2;
    busy.load.queued = 1;
    busy.capacity = Some(Capacity {
        drained: false,
        max: 4,
        warm: 0,
        can_start: true,
        asleep: 0,
    });
    assert_eq!(
        line(&model_answer("m", &busy, 1)),
        "up ready 7% maxconn:108"
    );
}

#[test]
fn weight_stays_within_100_when_routed_is_over_max() {
    let mut m = model();
    m.load.routed = 6;
    m.load.free = 24;
    assert!(matches!(
        model_answer("m", &m, 1),
        Answer::Ready { weight: 100, .. }
    ));
}

#[test]
fn draining_answers_drain_before_anything_else() {
    let mut m = model();
    m.draining = true;
    assert_eq!(line(&model_answer("m", &m, 1)), "up drain");
    // Also with a stale view of the daemon: a stop tells the balancers to drain.
    m.daemon_gone_for = Some(STALE * 10);
    assert_eq!(line(&model_answer("m", &m, 1)), "up drain");
}

#[test]
fn a_daemon_briefly_gone_keeps_the_last_view() {
    let mut m = model();
    m.daemon_gone_for = Some(STALE);
    assert_eq!(line(&model_answer("m", &m, 1)), "up ready 75% maxconn:112");
}

#[test]
fn a_daemon_gone_past_stale_after_is_maintenance() {
    let mut m = model();
    m.daemon_gone_for = Some(STALE + Duration::from_millis(1));
    assert_eq!(line(&model_answer("m", &m, 1)), "up maint");
}

#[test]
fn unknown_model_is_down_with_a_bounded_printable_reason() {
    assert_eq!(line(&unknown_answer("nope")), "down #unknown model nope");
    let hostile = format!("a\u{7}b\n{}", "x".repeat(500));
    let l = line(&unknown_answer(&hostile));
    assert!(l.len() < 100, "{l}");
    assert!(l.bytes().all(|b| b.is_ascii_graphic() || b == b' '), "{l}");
}

#[test]
fn a_model_nothing_can_serve_is_down() {
    let mut m = model();
    m.load = Load {
        slots: 4,
        max_queue: 100,
        ..Load::default()
    };
    m.capacity = Some(Capacity {
        drained: false,
        max: 4,
        warm: 0,
        can_start: false,
        asleep: 0,
    });
    assert!(line(&model_answer("m", &m, 1)).starts_with("down #m: no replica"));
    // Before the daemon said anything of it, with nothing routed: the same.
    m.capacity = None;
    assert!(matches!(model_answer("m", &m, 1), Answer::Down(_)));
    // A warm replica to promote is capacity.
    m.capacity = Some(Capacity {
        drained: false,
        max: 4,
        warm: 1,
        can_start: false,
        asleep: 0,
    });
    assert_eq!(line(&model_answer("m", &m, 1)), "up ready 25% maxconn:104");
}

#[test]
fn the_host_as_a_whole_adds_its_models_up() {
    let a = model();
    // 1 slot per replica, max 2, both routed and idle: 2 of 2.
    let b = ModelInput {
        load: Load {
            routed: 2,
            slots: 1,
            free: 2,
            queued: 0,
            max_queue: 10,
        },
        capacity: Some(Capacity {
            drained: false,
            max: 2,
            warm: 0,
            can_start: false,
            asleep: 0,
        }),
        ..model()
    };
    // (12 + 2) / (16 + 2), rounded up; holds 112 + 12.
    assert_eq!(line(&host_answer(&[a, b], 2)), "up ready 78% maxconn:62");
    // A drained model leaves the host's answer; all drained: drain.
    let mut da = a;
    da.draining = true;
    assert_eq!(line(&host_answer(&[da, b], 1)), "up ready 100% maxconn:12");
    let mut db = b;
    db.draining = true;
    assert_eq!(line(&host_answer(&[da, db], 1)), "up drain");
    // Stopping: every model drains.
    let mut sa = a;
    sa.daemon_gone_for = Some(STALE * 2);
    let mut sb = b;
    sb.daemon_gone_for = Some(STALE * 2);
    assert_eq!(line(&host_answer(&[sa, sb], 1)), "up maint");
    assert!(matches!(host_answer(&[], 1), Answer::Down(_)));
}

#[test]
fn haproxy_turns_the_percentage_back_into_the_usable_slots_and_never_zero() {
    // HAProxy: configured weight × percent ÷ 100, rounded down.
    for base in 1..=256u64 {
        for usable in 0..=base + 3 {
            let pct = u64::from(weight(base, usable));
            let effective = base * pct / 100;
            assert!(
                effective >= usable.clamp(1, base),
                "{usable}/{base}: {pct}%"
            );
            assert!((1..=100).contains(&pct), "{usable}/{base}: {pct}%");
        }
    }
}
