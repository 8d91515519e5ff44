//! Several front doors combined, in virtual time.

use std::time::Duration;

use super::*;

const STALE: Duration = Duration::from_secs(2);

fn at(ms: u64) -> Time {
    Time::from_millis(ms)
}

fn wide(ms: u64, wait: f64, depth: u64, arrived: u64, completed: u64) -> Sample {
    Sample {
        at: at(ms),
        oldest_wait_ms: wait,
        queue_depth: depth,
        in_flight: depth + 1,
        arrived: Some(arrived),
        completed: Some(completed),
    }
}

fn on(ms: u64, in_flight: u64, arrived: u64) -> Sample {
    Sample {
        at: at(ms),
        oldest_wait_ms: 0.0,
        queue_depth: 0,
        in_flight,
        arrived: Some(arrived),
        completed: Some(arrived.saturating_sub(in_flight)),
    }
}

#[test]
fn the_oldest_wait_is_the_max_and_depths_add_up() {
    let mut d = FrontDoors::default();
    let (a, change) = d.record("a", None, wide(1000, 300.0, 4, 100, 90), STALE);
    assert_eq!(change, Change::Began);
    assert_eq!(
        (a.oldest_wait_ms, a.queue_depth, a.in_flight),
        (300.0, 4, 5)
    );
    let (b, change) = d.record("b", None, wide(1050, 120.0, 3, 7, 7), STALE);
    assert_eq!(change, Change::Members);
    assert_eq!(
        (b.oldest_wait_ms, b.queue_depth, b.in_flight),
        (300.0, 7, 9)
    );
    let (c, change) = d.record("a", None, wide(1100, 50.0, 1, 110, 100), STALE);
    assert_eq!(change, Change::None);
    assert_eq!((c.oldest_wait_ms, c.queue_depth), (120.0, 4));
    assert_eq!(d.active(at(1100), STALE), ["a", "b"]);
}

#[test]
fn counters_add_up_by_how_far_each_door_moved() {
    let mut d = FrontDoors::default();
    // First reports set each door's base: nothing counted yet.
    assert_eq!(
        d.record("a", None, wide(0, 0.0, 0, 1000, 1000), STALE)
            .0
            .arrived,
        Some(0)
    );
    assert_eq!(
        d.record("b", None, wide(10, 0.0, 0, 50, 50), STALE)
            .0
            .arrived,
        Some(0)
    );
    assert_eq!(
        d.record("a", None, wide(100, 0.0, 0, 1010, 1008), STALE)
            .0
            .arrived,
        Some(10)
    );
    let s = d.record("b", None, wide(110, 0.0, 0, 55, 54), STALE).0;
    assert_eq!((s.arrived, s.completed), (Some(15), Some(12)));
    // Door a restarts: its counter starts again from zero, and what it counts since adds on.
    let s = d.record("a", None, wide(200, 0.0, 0, 3, 2), STALE).0;
    assert_eq!((s.arrived, s.completed), (Some(18), Some(14)));
}

#[test]
fn per_replica_in_flight_is_what_every_door_has_there() {
    let mut d = FrontDoors::default();
    let r = ReplicaId("m-1".into());
    assert_eq!(d.record("a", Some(&r), on(0, 2, 10), STALE).0.in_flight, 2);
    assert_eq!(d.record("b", Some(&r), on(50, 1, 4), STALE).0.in_flight, 3);
    // Door a's requests come back; b still has one there.
    let s = d.record("a", Some(&r), on(100, 0, 10), STALE).0;
    assert_eq!((s.in_flight, s.arrived), (1, Some(0)));
    let s = d.record("b", Some(&r), on(150, 0, 6), STALE).0;
    assert_eq!((s.in_flight, s.arrived, s.completed), (0, Some(2), Some(5)));
    // Another replica has counters of its own.
    let r2 = ReplicaId("m-2".into());
    assert_eq!(
        d.record("a", Some(&r2), on(200, 1, 1), STALE).0.arrived,
        Some(0)
    );
}

#[test]
fn a_silent_door_drops_out_after_stale_after_and_the_last_ends_it() {
    let mut d = FrontDoors::default();
    d.record("a", None, wide(0, 900.0, 5, 0, 0), STALE);
    d.record("b", None, wide(1000, 10.0, 1, 0, 0), STALE);
    assert_eq!(d.expire(at(1500), STALE), Change::None);
    // a's last report is older than stale_after: no longer in the max or the sum.
    let s = d.record("b", None, wide(2500, 10.0, 1, 0, 0), STALE).0;
    assert_eq!((s.oldest_wait_ms, s.queue_depth), (10.0, 1));
    assert_eq!(d.expire(at(2500), STALE), Change::Members);
    assert_eq!(d.active(at(2500), STALE), ["b"]);
    assert!(d.has_room_for("c", at(2500), STALE));
    assert_eq!(d.expire(at(5000), STALE), Change::Ended);
    assert!(d.is_empty());
    let (_, change) = d.record("c", None, wide(5000, 0.0, 0, 9, 9), STALE);
    assert_eq!(change, Change::Began, "a door after the end begins again");
}

#[test]
fn a_reporter_alternating_names_logs_a_line_per_ten_seconds_not_per_switch() {
    let mut d = FrontDoors::default();
    let mut lines = 0;
    // 20,000 reports over 20 s from a reporter alternating two names, and a third name that
    // appears and disappears every 3 s.
    for i in 0..20_000u64 {
        let now = at(i);
        if d.expire(now, STALE) != Change::None && d.note_change(now).is_some() {
            lines += 1;
        }
        let name = match i % 2 {
            _ if i % 3000 < 10 => "c",
            0 => "a",
            _ => "b",
        };
        let (_, change) = d.record(name, None, wide(i, 0.0, 0, i, i), STALE);
        if change != Change::None && d.note_change(now).is_some() {
            lines += 1;
        }
        if d.log_due(now).is_some() {
            lines += 1;
        }
    }
    assert!(lines <= 3, "{lines} lines");
    assert!(lines >= 1);
    assert_eq!(d.active(at(19_999), STALE), ["a", "b", "c"]);
}

#[test]
fn names_are_bounded_and_a_known_door_always_has_room() {
    let mut d = FrontDoors::default();
    for i in 0..MAX_FRONT_DOORS {
        let name = format!("door-{i}");
        assert!(d.has_room_for(&name, at(0), STALE));
        d.record(&name, None, wide(0, 0.0, 0, 0, 0), STALE);
    }
    assert!(!d.has_room_for("one-more", at(100), STALE));
    assert!(d.has_room_for("door-3", at(100), STALE));
    // Once the others fall silent, there is room again.
    d.record("door-3", None, wide(2500, 0.0, 0, 0, 0), STALE);
    d.expire(at(2500), STALE);
    assert!(d.has_room_for("one-more", at(2500), STALE));
}
