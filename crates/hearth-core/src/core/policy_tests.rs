//! Autoscaling tests of the core with virtual time.

use std::time::Duration;

use super::harness::{error_code, model, routed_sets, spawns, Harness, BASE};
use super::*;
use crate::protocol::{ErrorCode, Report, Request, WatchEvent};

fn scaled(scaling: &str) -> Harness {
    let toml = format!("{BASE}{}", model("m", "", scaling));
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    h
}

/// Like `scaled`, but the first replicas take `cold` to warm: the policy has seen a cold start
/// and knows how long one takes.
fn scaled_after_cold_start(scaling: &str, cold: Duration) -> Harness {
    let toml = format!("{BASE}{}", model("m", "", scaling));
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    let ids = h.spawn_all(&first);
    h.now = h.now + cold;
    let mut out = Vec::new();
    for id in ids {
        out.extend(h.warm(&id));
    }
    h.settle(out);
    h
}

const DEFAULT: &str = "min = 2\nmax = 10\nwarm_pool = 1\ntarget_wait = \"500ms\"\ndown_stabilization = \"5m\"\ndown_step = \"1m\"\nmax_up_step = 4";

fn desired(h: &Harness) -> u32 {
    h.node.models["m"].desired_routed
}

fn scale_events(actions: &[Action]) -> Vec<(u32, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Publish(WatchEvent::Scale { from, to, .. }) => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

/// A model-wide report with counters.
fn wide(
    h: &mut Harness,
    wait: f64,
    depth: u64,
    in_flight: u64,
    arrived: u64,
    completed: u64,
) -> Vec<Action> {
    let before = h.log.len();
    let r = Report {
        model: "m".into(),
        replica: None,
        oldest_wait_ms: Some(wait),
        queue_depth: Some(depth),
        in_flight: Some(in_flight),
        arrived: Some(arrived),
        completed: Some(completed),
        router: None,
    };
    let resp = h.ask(Peer::trusted(), Request::Report(r));
    assert!(resp.is_ok(), "{resp:?}");
    h.log[before..].to_vec()
}

/// Reports from every routed replica, each with the given queue.
fn every_routed(h: &mut Harness, wait: f64, depth: u64, in_flight: u64) -> Vec<Action> {
    let before = h.log.len();
    for id in h.in_state("m", ReplicaState::Routed) {
        h.report("m", Some(&id.0), wait, depth, in_flight);
    }
    h.log[before..].to_vec()
}

/// The reason of the model's latest scaling decision.
fn last_reason(h: &Harness) -> String {
    let st = h.node.status(Some("m"), h.now);
    st.models
        .first()
        .and_then(|m| m.last_scale.clone())
        .map_or_else(String::new, |l| l.reason)
}

/// Spawns and warms whatever `actions` started, and returns nothing.
fn bring_up(h: &mut Harness, actions: Vec<Action>) {
    h.settle(actions);
}

#[test]
fn the_report_over_target_promotes_the_warm_replica_in_the_same_event_and_starts_cold_ones_behind()
{
    let mut h = scaled(DEFAULT);
    let warm = h.in_state("m", ReplicaState::Warm)[0].clone();
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    let before = h.log.len();
    h.report("m", Some(&r.0), 1500.0, 12, 16);
    let out = h.log[before..].to_vec();
    // ×3 the target: damped to ×2 of the 2 routed.
    assert_eq!(scale_events(&out), vec![(2, 4)]);
    let sets = routed_sets(&out);
    assert!(
        sets.last().unwrap().contains(&warm.0),
        "promoted in the same event: {sets:?}"
    );
    // One more routed is needed and the pool must refill: two cold starts behind.
    assert_eq!(spawns(&out), 2);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 3);
    let st = h.node.status(Some("m"), h.now);
    let ls = st.models[0].last_scale.clone().unwrap();
    assert!(
        ls.reason.contains("oldest wait 1500 ms > target 500 ms"),
        "{}",
        ls.reason
    );
    // The cold ones, once warm, are routed (desired 4) and the pool holds one.
    bring_up(&mut h, out);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 4);
    assert_eq!(h.in_state("m", ReplicaState::Warm).len(), 1);
}

#[test]
fn a_burst_is_capped_per_step_and_steps_follow_once_the_ordered_capacity_serves() {
    let mut h = scaled_after_cold_start(
        &DEFAULT.replace("max = 10", "max = 20"),
        Duration::from_secs(40),
    );
    let out = every_routed(&mut h, 20_000.0, 200, 216);
    assert_eq!(scale_events(&out), vec![(2, 6)], "+4 at most per step");
    // Within the settle time no second step, however high the wait.
    h.now = h.now + Duration::from_secs(1);
    assert!(scale_events(&every_routed(&mut h, 21_000.0, 220, 236)).is_empty());
    // Cold replicas are on their way (a cold start takes 40 s here), and the shortfall is only
    // 2.5 s old: the wait and the count in flight grow for want of exactly them; no new order.
    h.now = h.now + Duration::from_millis(1500);
    let later = every_routed(&mut h, 22_000.0, 240, 256);
    assert!(scale_events(&later).is_empty(), "{}", last_reason(&h));
    // Once they serve and the wait is still high, the law steps again.
    bring_up(&mut h, out);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 6);
    h.now = h.now + Duration::from_millis(500);
    let out = every_routed(&mut h, 23_000.0, 240, 256);
    assert_eq!(scale_events(&out), vec![(6, 10)]);
}

#[test]
fn before_the_service_time_is_known_a_lasting_shortfall_orders_by_the_count_in_flight_while_cold_replicas_start(
) {
    let mut h = scaled_after_cold_start(
        &DEFAULT.replace("max = 10", "max = 20"),
        Duration::from_secs(40),
    );
    let out = every_routed(&mut h, 20_000.0, 200, 216);
    assert_eq!(scale_events(&out), vec![(2, 6)]);
    // No counters: the service time is unknown, and the count in flight is the only measure
    // of demand. Once the shortfall has outlasted an eighth of the 40-s cold start, the
    // hundreds in flight on 16 slots each order more, though the first order is still starting
    // (blind until it serves, a model that starts under load queues for a whole cold start).
    h.now = h.now + Duration::from_secs(5);
    let later = every_routed(&mut h, 25_000.0, 240, 256);
    assert_eq!(scale_events(&later), vec![(6, 10)], "{}", last_reason(&h));
    assert!(
        last_reason(&h).contains("in flight need"),
        "{}",
        last_reason(&h)
    );
    bring_up(&mut h, out);
    bring_up(&mut h, later);
}

#[test]
fn littles_law_sets_a_floor_from_arrival_rate_and_backlog() {
    let mut h = scaled(
        &DEFAULT
            .replace("max = 10", "max = 30")
            .replace("max_up_step = 4", "max_up_step = 20"),
    );
    let routed = h.in_state("m", ReplicaState::Routed);
    // Each routed replica saturated: queue at both ends, 4 completions/s each.
    for s in 0..=3u64 {
        for (i, id) in routed.iter().enumerate() {
            let r = Report {
                model: "m".into(),
                replica: Some(id.0.clone()),
                oldest_wait_ms: Some(100.0),
                queue_depth: Some(5),
                in_flight: Some(13),
                arrived: Some(1000 * i as u64 + 20 * s),
                completed: Some(1000 * i as u64 + 4 * s),
                router: None,
            };
            h.ask(Peer::trusted(), Request::Report(r))
                .expect("the request is answered ok");
        }
        h.now = h.now + Duration::from_secs(1);
    }
    assert_eq!(desired(&h), 2, "100 ms < target: no scale-up yet");
    // Now the wait is just over target (×1.2: the wait law alone says 3). The first replica's
    // report acts: arrivals are counted over the window every replica has reported through
    // (the other one last reported at 3 s): 60 + 60 in 3 s, 40/s; 10 wait; replicas warmed
    // instantly here, so the backlog is drained within the target: 60/s to serve. Each replica
    // runs 8 at once (seen while queued) and completes 4/s over 8 busy slot-seconds a second
    // (2 s each): Erlang C for ≤ 1 % of waits over 0.5 s at 60/s with 8 slots of 0.5/s each
    // asks for 17 replicas (Little alone: 60/4 = 15).
    let before = h.log.len();
    for (i, id) in routed.iter().enumerate() {
        let r = Report {
            model: "m".into(),
            replica: Some(id.0.clone()),
            oldest_wait_ms: Some(600.0),
            queue_depth: Some(5),
            in_flight: Some(13),
            arrived: Some(1000 * i as u64 + 20 * 4),
            completed: Some(1000 * i as u64 + 4 * 4),
            router: None,
        };
        h.ask(Peer::trusted(), Request::Report(r))
            .expect("the request is answered ok");
    }
    let ev = scale_events(&h.log[before..]);
    assert_eq!(ev, vec![(2, 17)], "{ev:?}");
}

#[test]
fn no_scale_up_while_the_queue_already_clears_within_the_target() {
    let mut h = scaled(DEFAULT);
    // The backlog falls by about 10 a second; once over target only 2 are left: clears in 0.2 s.
    for (i, depth) in [50u64, 40, 30, 20, 10].into_iter().enumerate() {
        let out = wide(&mut h, 400.0 + 10.0 * i as f64, depth, depth + 16, 0, 0);
        assert!(scale_events(&out).is_empty());
        h.now = h.now + Duration::from_secs(1);
    }
    let out = wide(&mut h, 900.0, 2, 18, 0, 0);
    assert!(scale_events(&out).is_empty(), "draining fast enough: hold");
    // A backlog that grows again is another matter.
    h.now = h.now + Duration::from_secs(2);
    let out = wide(&mut h, 1000.0, 30, 46, 0, 0);
    assert_eq!(scale_events(&out).len(), 1);
}

#[test]
fn a_noisy_signal_around_the_target_does_not_flap() {
    let mut h = scaled(DEFAULT);
    let mut events = Vec::new();
    // The wait answers capacity: 2 routed see ~500 ms, more see proportionally less; ±15 % noise.
    let mut x: u64 = 7;
    for _ in 0..(20 * 60 * 4) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let noise = ((x >> 33) % 300) as f64 / 1000.0 - 0.15;
        let routed = h.in_state("m", ReplicaState::Routed).len().max(1) as f64;
        let wait = 500.0 * 2.0 / routed * (1.0 + noise);
        let out = wide(&mut h, wait, 2, 10, 0, 0);
        events.extend(scale_events(&out));
        let out = h.advance(Duration::from_millis(250));
        events.extend(scale_events(&out));
        bring_up(&mut h, out);
        let last = h.log.clone();
        bring_up(&mut h, last[last.len().saturating_sub(40)..].to_vec());
    }
    let ups = events.iter().filter(|(f, t)| t > f).count();
    let downs = events.iter().filter(|(f, t)| t < f).count();
    assert!(ups <= 2, "{events:?}");
    assert_eq!(downs, 0, "never calm enough to scale down: {events:?}");
}

#[test]
fn scale_down_waits_for_a_calm_window_then_steps_one_replica_per_down_step() {
    let mut h = scaled(DEFAULT);
    let out = every_routed(&mut h, 1500.0, 12, 16);
    bring_up(&mut h, out);
    assert_eq!(desired(&h), 4);
    let mut events = Vec::new();
    let start = h.now;
    // Calm: low wait, no queue (no rates known: an empty queue on average is "not busy").
    for _ in 0..(8 * 60) {
        let out = every_routed(&mut h, 20.0, 0, 1);
        events.extend(
            scale_events(&out)
                .into_iter()
                .map(|e| (h.now.since(start).as_secs(), e)),
        );
        let out = h.advance(Duration::from_secs(1));
        events.extend(
            scale_events(&out)
                .into_iter()
                .map(|e| (h.now.since(start).as_secs(), e)),
        );
    }
    let downs: Vec<_> = events.iter().filter(|(_, (f, t))| t < f).collect();
    assert_eq!(downs.len(), 2, "{events:?}");
    assert!(
        downs[0].0 >= 300 && downs[0].0 <= 302,
        "first after 5 min: {downs:?}"
    );
    assert!(
        downs[1].0 - downs[0].0 >= 60 && downs[1].0 - downs[0].0 <= 62,
        "then one per minute: {downs:?}"
    );
    // The first removed replica went back to the pool (it was full: 1 warm) → drained instead.
    assert!(
        !h.in_state("m", ReplicaState::Draining).is_empty()
            || !h.in_state("m", ReplicaState::Stopping).is_empty()
    );
    assert_eq!(desired(&h), 2, "never below min");
}

#[test]
fn a_stale_signal_holds_the_size() {
    let mut h = scaled(DEFAULT);
    let out = every_routed(&mut h, 1500.0, 12, 16);
    bring_up(&mut h, out);
    assert_eq!(desired(&h), 4);
    // Silence for an hour: reports stop (stale_after is 5 s). Never read as calm, and the old
    // report is not acted on twice.
    let out = h.run_for(Duration::from_secs(3600));
    assert!(scale_events(&out).is_empty());
    assert_eq!(desired(&h), 4);
    assert_eq!(
        h.node.status(Some("m"), h.now).models[0].signal.age_ms,
        None
    );
}

#[test]
fn scale_to_zero_after_idle_and_back_on_the_next_report() {
    let mut h = scaled("min = 0\nmax = 4\nwarm_pool = 0\ntarget_wait = \"500ms\"\nidle_to_zero = \"2m\"\ndown_stabilization = \"30s\"");
    // min 0 starts at zero: demand brings the first replica at once.
    assert_eq!(desired(&h), 0);
    let out = wide(&mut h, 0.0, 1, 1, 0, 0);
    assert_eq!(scale_events(&out), vec![(0, 1)]);
    bring_up(&mut h, out);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 1);
    // Idle (reports say: nothing in flight, nothing queued) for 2 minutes.
    let mut events = Vec::new();
    for _ in 0..(3 * 60) {
        events.extend(scale_events(&wide(&mut h, 0.0, 0, 0, 0, 0)));
        events.extend(scale_events(&h.advance(Duration::from_secs(1))));
    }
    assert_eq!(events, vec![(1, 0)]);
    assert!(h.in_state("m", ReplicaState::Routed).is_empty());
    // A report at zero starts a replica at once.
    let out = wide(&mut h, 0.0, 3, 3, 0, 0);
    assert_eq!(scale_events(&out), vec![(0, 1)]);
    assert_eq!(spawns(&out), 1);
}

#[test]
fn a_model_at_zero_with_a_pool_promotes_at_once() {
    let mut h = scaled("min = 0\nmax = 4\nwarm_pool = 1\ntarget_wait = \"500ms\"");
    assert_eq!(
        h.in_state("m", ReplicaState::Warm).len(),
        1,
        "the pool exists at zero"
    );
    let out = wide(&mut h, 0.0, 1, 1, 0, 0);
    assert_eq!(routed_sets(&out).len(), 1, "promoted in the same event");
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 1);
}

#[test]
fn the_scale_op_overrides_min_max_and_pool_and_persists_them() {
    let mut h = scaled(DEFAULT);
    let resp = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "m".into(),
            min: Some(3),
            max: None,
            warm_pool: Some(crate::protocol::WarmPoolSetting::Count(2)),
            reset: false,
        },
    );
    assert!(resp.is_ok(), "{resp:?}");
    assert_eq!(desired(&h), 3);
    let persisted = h.log.iter().rev().find_map(|a| match a {
        Action::PersistOverrides(v) => Some(v.clone()),
        _ => None,
    });
    let persisted = persisted.unwrap();
    assert_eq!(persisted["m"].min, Some(3));
    assert_eq!(
        serde_json::to_string(&persisted).unwrap(),
        r#"{"m":{"min":3,"warm_pool":2}}"#,
        "overrides.json as it was"
    );
    let st = h.node.status(Some("m"), h.now);
    assert_eq!((st.models[0].min, st.models[0].desired_warm), (3, 2));
    let bad = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "m".into(),
            min: Some(12),
            max: None,
            warm_pool: None,
            reset: false,
        },
    );
    assert_eq!(
        error_code(&bad),
        Some(ErrorCode::BadRequest),
        "min above max is refused"
    );
    assert_eq!(desired(&h), 3, "and changes nothing");
}

/// Feeds every routed replica a saturated report for `secs` seconds: 8 run at once, `rate`
/// arrive per second in all, each replica completes `per_replica` a second.
fn saturated(
    h: &mut Harness,
    secs: u64,
    wait: f64,
    rate: u64,
    per_replica: u64,
    counters: &mut std::collections::BTreeMap<String, (u64, u64)>,
) -> Vec<Action> {
    let before = h.log.len();
    for _ in 0..secs {
        let routed = h.in_state("m", ReplicaState::Routed);
        let n = routed.len() as u64;
        for id in routed {
            let c = counters.entry(id.0.clone()).or_default();
            c.0 += rate / n;
            c.1 += per_replica;
            let r = Report {
                model: "m".into(),
                replica: Some(id.0.clone()),
                oldest_wait_ms: Some(wait),
                queue_depth: Some(4),
                in_flight: Some(12),
                arrived: Some(c.0),
                completed: Some(c.1),
                router: None,
            };
            h.ask(Peer::trusted(), Request::Report(r))
                .expect("the request is answered ok");
        }
        h.advance(Duration::from_secs(1));
    }
    h.log[before..].to_vec()
}

#[test]
fn a_clump_of_seconds_does_not_order_cold_replicas_twice_but_a_lasting_shortfall_does() {
    let mut h = scaled(
        &DEFAULT
            .replace("max = 10", "max = 30")
            .replace("max_up_step = 4", "max_up_step = 30"),
    );
    h.node
        .models
        .get_mut("m")
        .unwrap()
        .autoscaler
        .observe_time_to_ready(Duration::from_secs(60));
    let mut counters = Default::default();
    // Learn the service: 4/s per replica at 8 at once, just under target.
    let out = saturated(&mut h, 25, 100.0, 8, 4, &mut counters);
    bring_up(&mut h, out);
    // A clump: 40/s, over target. The first step promotes the warm one and orders cold ones.
    let out = saturated(&mut h, 3, 900.0, 40, 4, &mut counters);
    let first = scale_events(&out);
    assert_eq!(first.len(), 1, "{first:?}");
    // Cold ones are on their way; 5 s into the shortfall (< 60 s / 8) nothing more is ordered.
    let out = saturated(&mut h, 3, 1500.0, 40, 4, &mut counters);
    assert!(
        scale_events(&out).is_empty(),
        "{:?}: {}",
        scale_events(&out),
        last_reason(&h)
    );
    // Past 7.5 s the shortfall is not a clump: Little's law may order more.
    let out = saturated(&mut h, 4, 2500.0, 40, 4, &mut counters);
    let more = scale_events(&out);
    assert!(
        more.iter().all(|(f, t)| t > f) && !more.is_empty(),
        "{more:?}"
    );
}

#[test]
fn routed_headroom_beyond_the_recent_need_is_not_duplicated_in_the_pool() {
    let mut h = scaled(&DEFAULT.replace("max = 10", "max = 12"));
    let mut counters = Default::default();
    saturated(&mut h, 25, 100.0, 8, 4, &mut counters);
    // The operator asks for 9 routed; the load (8/s at 4/s each) needs 3.
    let before = h.log.len();
    h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "m".into(),
            min: Some(9),
            max: None,
            warm_pool: None,
            reset: false,
        },
    )
    .expect("the request is answered ok");
    let out = h.log[before..].to_vec();
    bring_up(&mut h, out);
    for id in h.in_state("m", ReplicaState::Starting) {
        h.warm(&id);
    }
    // The pool is not refilled while six spare routed replicas stand ready.
    let st = h.node.status(Some("m"), h.now);
    let states: Vec<_> = st.models[0].replicas.iter().map(|r| r.state).collect();
    assert!(st.models[0].routed >= 9, "{states:?}");
    assert_eq!(h.node.pool_to_fill("m"), 0);
    assert!(
        st.models[0].desired_warm > 0,
        "warm replicas there are kept, not stopped"
    );
}

/// Issue 11: one report claiming 4294967296 requests in flight was taken as a replica's slot
/// count (4294967295), and every evaluation after it looped that many times in Erlang C: the
/// daemon froze for 23 s per report. What a report says a replica runs at once is believed only
/// up to `MAX_SLOTS`, so sizing costs the same whatever a reporter sends.
#[test]
fn a_report_claiming_billions_in_flight_does_not_become_the_slot_count() {
    let mut h = scaled(DEFAULT);
    let id = h.in_state("m", ReplicaState::Routed)[0].clone();
    let send = |h: &mut Harness, i: u64, in_flight: u64| {
        h.now = h.now + Duration::from_millis(150);
        let r = Report {
            model: "m".into(),
            replica: Some(id.0.clone()),
            oldest_wait_ms: Some(10.0),
            queue_depth: Some(1),
            in_flight: Some(in_flight),
            arrived: Some(30 * i),
            completed: Some(30 * i),
            router: None,
        };
        let resp = h.ask(Peer::trusted(), Request::Report(r));
        assert!(resp.is_ok(), "{resp:?}");
    };
    for i in 0..14 {
        send(&mut h, i, 4);
    }
    let cap = h.node.models["m"].autoscaler.capacity().expect("measured");
    assert_eq!(cap.slots, Some(3));
    // The report itself is refused beyond the protocol's bound…
    let huge = Report {
        model: "m".into(),
        replica: Some(id.0.clone()),
        oldest_wait_ms: Some(10.0),
        queue_depth: Some(1),
        in_flight: Some(4_294_967_296),
        arrived: Some(30 * 14),
        completed: Some(30 * 14),
        router: None,
    };
    let resp = h.ask(Peer::trusted(), Request::Report(huge));
    assert_eq!(error_code(&resp), Some(ErrorCode::BadRequest), "{resp:?}");
    // …and the most it lets through is still not believed as a slot count.
    send(&mut h, 14, 1_000_000);
    let cap = h.node.models["m"].autoscaler.capacity().expect("measured");
    assert!(
        cap.slots
            .is_some_and(|s| s <= crate::core::capacity::MAX_SLOTS),
        "{cap:?}"
    );
    // And the next reports are handled as before.
    send(&mut h, 15, 4);
    assert!(desired(&h) <= 10);
}

/// Issue 12: a reason names the cap that applied. With `max` 3, a wait at ×40 the target asks
/// for far more; `max` stops the step before `max_up_step` would, and the reason says so.
#[test]
fn a_capped_step_names_the_cap_that_applied() {
    let mut h = scaled(&DEFAULT.replace("max = 10", "max = 3"));
    let out = every_routed(&mut h, 20_000.0, 200, 216);
    assert_eq!(scale_events(&out), vec![(2, 3)]);
    let reason = last_reason(&h);
    assert!(reason.ends_with("; capped at max 3"), "{reason}");

    let mut h = scaled(&DEFAULT.replace("max = 10", "max = 20"));
    let out = every_routed(&mut h, 20_000.0, 200, 216);
    assert_eq!(scale_events(&out), vec![(2, 6)]);
    let reason = last_reason(&h);
    assert!(reason.ends_with("; capped at +4 per step"), "{reason}");
}
