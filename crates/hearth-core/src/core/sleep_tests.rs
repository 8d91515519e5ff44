//! The sleeping tier in the core, with virtual time: `min` counting replicas awake or asleep,
//! sleep after a drain, wakes before cold starts, the wake time, and every way a sleep or a
//! wake fails.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use std::time::Duration;

use super::harness::*;
use super::*;

/// A vLLM model with a sleeping tier: `min` replicas awake or asleep, no warm pool.
fn config(min: u32, max: u32, sleep: &str) -> String {
    let scaling = format!(
        "min = {min}\nmax = {max}\nwarm_pool = 0\nidle_to_zero = \"1m\"\n\
         [model.sleep]\nformat = \"vllm\"\nsleep_timeout = \"5s\"\nwake_timeout = \"10s\"\n{sleep}"
    );
    let m = model("m", "", &scaling).replace(
        r#"["server", "--port""#,
        r#"["server", "--host", "127.0.0.1", "--port""#,
    );
    format!("{BASE}{m}")
}

fn ok() -> ProbeOutcome {
    ProbeOutcome {
        ok: true,
        not_ready: false,
        detail: "HTTP 200".into(),
    }
}

fn bad(detail: &str) -> ProbeOutcome {
    ProbeOutcome {
        ok: false,
        not_ready: false,
        detail: detail.into(),
    }
}

/// The probes of `kind` among `actions`: (replica, url).
fn probes(actions: &[Action], kind: ProbeKind) -> Vec<(ReplicaId, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Probe {
                replica,
                kind: k,
                spec,
                ..
            } if *k == kind => Some((replica.clone(), spec.url.clone())),
            _ => None,
        })
        .collect()
}

fn answer(h: &mut Harness, id: &ReplicaId, kind: ProbeKind, o: ProbeOutcome) -> Vec<Action> {
    h.send(Event::Probed {
        replica: id.clone(),
        kind,
        outcome: o,
    })
}

/// Falls asleep: the sleep request answered, then the state request saying asleep.
fn fall_asleep(h: &mut Harness, id: &ReplicaId) {
    let out = answer(h, id, ProbeKind::Sleep, ok());
    let state = probes(&out, ProbeKind::SleepState);
    assert_eq!(state.len(), 1, "{out:?}");
    assert!(state[0].1.ends_with("/is_sleeping"), "{state:?}");
    answer(h, id, ProbeKind::SleepState, ok());
    assert_eq!(h.node.held.replicas()[id].state, ReplicaState::Sleeping);
}

fn status_of(h: &Harness) -> crate::protocol::ModelView {
    h.node.status(Some("m"), h.now).models.remove(0)
}

/// min 3 from cold: three starts; one routed, two put to sleep with vLLM's requests.
fn one_routed_two_asleep() -> (Harness, ReplicaId, Vec<ReplicaId>) {
    one_routed_two_asleep_in(&config(3, 4, ""))
}

fn one_routed_two_asleep_in(toml: &str) -> (Harness, ReplicaId, Vec<ReplicaId>) {
    let mut h = Harness::new(toml);
    let first = h.log.clone();
    assert_eq!(spawns(&first), 3, "min counts replicas awake or asleep");
    h.settle(first);
    let routed = h.in_state("m", ReplicaState::Routed);
    assert_eq!(routed.len(), 1, "one stays awake, routed");
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    assert_eq!(falling.len(), 2);
    let sleeps = probes(&h.log, ProbeKind::Sleep);
    assert_eq!(sleeps.len(), 2, "{sleeps:?}");
    for (_, url) in &sleeps {
        assert!(url.ends_with("/sleep?level=1"), "{url}");
    }
    for id in &falling {
        fall_asleep(&mut h, id);
    }
    (h, routed[0].clone(), falling)
}

#[test]
fn min_counts_replicas_awake_or_asleep() {
    let (h, _, asleep) = one_routed_two_asleep();
    let v = status_of(&h);
    assert_eq!((v.routed, v.warm, v.sleeping, v.waking), (1, 0, 2, 0));
    assert_eq!(v.min, 3);
    assert_eq!(h.in_state("m", ReplicaState::Sleeping), asleep);
    let line = serde_json::to_value(&v).unwrap();
    assert_eq!(line["replicas"][1]["state"], "sleeping", "{line}");
    assert_eq!(line["wake"]["wakes"], 0, "{line}");
}

#[test]
fn a_scale_up_wakes_sleeping_replicas_before_any_cold_start() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    h.node.models.get_mut("m").unwrap().desired_routed = 3;
    let out = h.send(Event::Tick);
    assert_eq!(spawns(&out), 0, "no cold start while replicas sleep");
    let wakes = probes(&out, ProbeKind::Wake);
    assert_eq!(wakes.len(), 2, "{out:?}");
    assert!(wakes.iter().all(|(_, u)| u.ends_with("/wake_up")));
    assert_eq!(status_of(&h).waking, 2);
    // The wake request answers after 2 s; then the real warm-up, which routes it.
    h.now = h.now + Duration::from_secs(2);
    let out = answer(&mut h, &asleep[0], ProbeKind::Wake, ok());
    assert_eq!(probes(&out, ProbeKind::Warmup).len(), 1, "{out:?}");
    assert_eq!(
        h.node.held.replicas()[&asleep[0]].state,
        ReplicaState::Waking
    );
    h.now = h.now + Duration::from_millis(500);
    let out = answer(&mut h, &asleep[0], ProbeKind::Warmup, ok());
    assert_eq!(
        h.node.held.replicas()[&asleep[0]].state,
        ReplicaState::Routed
    );
    assert!(out.contains(&Action::Ready {
        model: "m".into(),
        replica: asleep[0].clone(),
        how: Readiness::Woken(Duration::from_millis(2500)),
    }));
    // The other takes longer.
    h.now = h.now + Duration::from_secs(1);
    answer(&mut h, &asleep[1], ProbeKind::Wake, ok());
    answer(&mut h, &asleep[1], ProbeKind::Warmup, ok());
    let v = status_of(&h);
    assert_eq!((v.routed, v.sleeping, v.waking), (3, 0, 0));
    let w = v.wake.unwrap();
    assert_eq!((w.wakes, w.failed), (2, 0));
    assert_eq!(w.last_ms, Some(3500));
    assert_eq!((w.p50_ms, w.p99_ms), (Some(2500), Some(3500)));
    assert_eq!(spawns(&h.log), 3, "only the first three ever started");
}

/// The warm pool of a model with a sleeping tier is held asleep from boot, and a wake that
/// takes one of it for the routed set is refilled by a cold start that then sleeps: without
/// them, the pool existed only once a scale down had fed it, and a rise before that waited
/// for cold starts that a model without the tier would not (its pool is built at boot).
#[test]
fn the_warm_pool_is_held_asleep_from_boot_and_refilled_after_a_wake() {
    let mut h = Harness::new(&config(1, 6, "").replace("warm_pool = 0", "warm_pool = 2"));
    let first = h.log.clone();
    assert_eq!(spawns(&first), 3, "min 1 routed and a pool of 2");
    h.settle(first);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 1);
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    assert_eq!(falling.len(), 2, "the pool sleeps: wakes stand in for it");
    for id in &falling {
        fall_asleep(&mut h, id);
    }
    let v = status_of(&h);
    assert_eq!((v.routed, v.warm, v.sleeping), (1, 0, 2));

    h.node.models.get_mut("m").unwrap().desired_routed = 2;
    let out = h.send(Event::Tick);
    assert_eq!(probes(&out, ProbeKind::Wake).len(), 1, "{out:?}");
    assert_eq!(spawns(&out), 1, "the pool refilled behind the wake");
    let woken = h.in_state("m", ReplicaState::Waking);
    let refill = h.in_state("m", ReplicaState::Starting);
    assert_eq!((woken.len(), refill.len()), (1, 1), "{out:?}");
    answer(&mut h, &woken[0], ProbeKind::Wake, ok());
    answer(&mut h, &woken[0], ProbeKind::Warmup, ok());
    h.settle(out);
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    assert_eq!(falling, refill, "the refill warms, then sleeps");
    fall_asleep(&mut h, &refill[0]);
    let v = status_of(&h);
    assert_eq!((v.routed, v.warm, v.sleeping, v.starting), (2, 0, 2, 0));
    assert_eq!(spawns(&h.log), 4);
}

#[test]
fn a_replica_that_leaves_the_routed_set_drains_then_sleeps() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    h.node.models.get_mut("m").unwrap().desired_routed = 3;
    h.send(Event::Tick);
    for id in &asleep {
        answer(&mut h, id, ProbeKind::Wake, ok());
        answer(&mut h, id, ProbeKind::Warmup, ok());
    }
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 3);
    h.node.models.get_mut("m").unwrap().desired_routed = 1;
    let out = h.send(Event::Tick);
    let draining = h.in_state("m", ReplicaState::Draining);
    assert_eq!(draining.len(), 2, "the tier keeps 3: {out:?}");
    assert!(
        probes(&out, ProbeKind::Sleep).is_empty(),
        "not before drained"
    );
    // One still has work in flight: it drains first.
    h.report("m", Some(draining[0].as_str()), 0.0, 0, 1);
    assert_eq!(
        h.node.held.replicas()[&draining[0]].state,
        ReplicaState::Draining
    );
    h.report("m", Some(draining[0].as_str()), 0.0, 0, 0);
    assert_eq!(
        h.node.held.replicas()[&draining[0]].state,
        ReplicaState::FallingAsleep
    );
    fall_asleep(&mut h, &draining[0]);
    h.report("m", Some(draining[1].as_str()), 0.0, 0, 0);
    fall_asleep(&mut h, &draining[1]);
    let v = status_of(&h);
    assert_eq!((v.routed, v.sleeping, v.draining), (1, 2, 0));
    assert!(
        signals(&h.log, StopSignal::Term).is_empty(),
        "nothing stopped"
    );
}

#[test]
fn a_drain_that_times_out_stops_rather_than_sleeps() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    h.node.models.get_mut("m").unwrap().desired_routed = 2;
    h.send(Event::Tick);
    answer(&mut h, &asleep[0], ProbeKind::Wake, ok());
    answer(&mut h, &asleep[0], ProbeKind::Warmup, ok());
    h.node.models.get_mut("m").unwrap().desired_routed = 1;
    h.send(Event::Tick);
    let draining = h.in_state("m", ReplicaState::Draining);
    assert_eq!(draining.len(), 1);
    let out = h.run_for(Duration::from_secs(400));
    assert!(
        signals(&out, StopSignal::Term).contains(&draining[0]),
        "drain_timeout passed: stopped, with work possibly in flight"
    );
}

#[test]
fn after_idle_to_zero_the_tier_shrinks_to_min() {
    // min 1: the two that slept did so because the model needed three within idle_to_zero.
    let mut h = Harness::new(&config(1, 4, ""));
    let first = h.log.clone();
    h.settle(first);
    h.node.models.get_mut("m").unwrap().desired_routed = 3;
    let out = h.send(Event::Tick);
    h.settle(out);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 3);
    h.node.models.get_mut("m").unwrap().desired_routed = 1;
    h.send(Event::Tick);
    for id in h.in_state("m", ReplicaState::Draining) {
        h.report("m", Some(id.as_str()), 0.0, 0, 0);
        fall_asleep(&mut h, &id);
    }
    assert_eq!(h.in_state("m", ReplicaState::Sleeping).len(), 2);
    let out = h.run_for(Duration::from_secs(30));
    assert!(signals(&out, StopSignal::Term).is_empty());
    // Recent enough: a wake would have been cheaper than a start. Past it, they stop.
    let out = h.run_for(Duration::from_secs(31));
    assert_eq!(signals(&out, StopSignal::Term).len(), 2, "{out:?}");
    assert_eq!(status_of(&h).sleeping, 0);
}

#[test]
fn a_failed_sleep_request_stops_the_replica_and_says_why() {
    let mut h = Harness::new(&config(2, 2, ""));
    let first = h.log.clone();
    h.settle(first);
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    assert_eq!(falling.len(), 1);
    let out = answer(
        &mut h,
        &falling[0],
        ProbeKind::Sleep,
        bad("HTTP 404: no route"),
    );
    assert_eq!(signals(&out, StopSignal::Term), vec![falling[0].clone()]);
    let r = &h.node.held.replicas()[&falling[0]];
    assert_eq!(r.state, ReplicaState::Stopping);
    assert!(r.reason.contains("sleep request 1"), "{}", r.reason);
    assert!(r.reason.contains("/sleep?level=1"), "{}", r.reason);
    assert!(h.node.models["m"].last_failure.contains("HTTP 404"));
    // It is replaced: a cold start after the back-off, since min counts it.
    h.exit(&falling[0], crate::core::ExitStatus::Code(0));
    let out = h.run_for(Duration::from_secs(3));
    assert_eq!(spawns(&out), 1);
}

#[test]
fn a_sleep_that_passes_sleep_timeout_stops_the_replica() {
    let mut h = Harness::new(&config(2, 2, ""));
    let first = h.log.clone();
    h.settle(first);
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    // The request went out and never came back.
    let out = h.run_for(Duration::from_secs(4));
    assert!(signals(&out, StopSignal::Term).is_empty());
    let out = h.run_for(Duration::from_millis(1500));
    assert_eq!(signals(&out, StopSignal::Term), vec![falling[0].clone()]);
    let r = &h.node.held.replicas()[&falling[0]];
    assert!(
        r.reason.contains("within sleep_timeout (5.0s)"),
        "{}",
        r.reason
    );
}

#[test]
fn a_state_that_never_says_asleep_is_a_sleep_timeout() {
    let mut h = Harness::new(&config(2, 2, ""));
    let first = h.log.clone();
    h.settle(first);
    let id = h.in_state("m", ReplicaState::FallingAsleep)[0].clone();
    answer(&mut h, &id, ProbeKind::Sleep, ok());
    let mut asked = 0;
    for _ in 0..30 {
        h.now = h.now + Duration::from_millis(250);
        let out = answer(
            &mut h,
            &id,
            ProbeKind::SleepState,
            bad(r#"HTTP 200 but the answer lacks "\"is_sleeping\":true""#),
        );
        asked += probes(&out, ProbeKind::SleepState).len();
        h.send(Event::Tick);
    }
    assert!(asked >= 19, "asked again until the deadline: {asked}");
    let r = &h.node.held.replicas()[&id];
    assert_eq!(r.state, ReplicaState::Stopping);
    assert!(r.reason.contains("is_sleeping"), "{}", r.reason);
}

#[test]
fn a_failed_wake_stops_the_replica_and_the_reconciler_replaces_it() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    h.node.models.get_mut("m").unwrap().desired_routed = 2;
    h.send(Event::Tick);
    let out = answer(
        &mut h,
        &asleep[0],
        ProbeKind::Wake,
        bad("HTTP 500 (expected 2xx): engine dead"),
    );
    assert_eq!(signals(&out, StopSignal::Term), vec![asleep[0].clone()]);
    let r = &h.node.held.replicas()[&asleep[0]];
    assert!(r.reason.contains("wake request 1"), "{}", r.reason);
    assert!(r.reason.contains("engine dead"), "{}", r.reason);
    // The other sleeping replica is woken in its place, not a cold start.
    assert_eq!(probes(&out, ProbeKind::Wake).len(), 1, "{out:?}");
    assert_eq!(spawns(&out), 0);
    assert_eq!(status_of(&h).wake.unwrap().failed, 1);
}

#[test]
fn a_wake_whose_warm_up_does_not_pass_within_wake_timeout_stops_it() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    h.node.models.get_mut("m").unwrap().desired_routed = 2;
    h.send(Event::Tick);
    let id = asleep[0].clone();
    answer(&mut h, &id, ProbeKind::Wake, ok());
    for _ in 0..9 {
        h.now = h.now + Duration::from_secs(1);
        let out = answer(
            &mut h,
            &id,
            ProbeKind::Warmup,
            bad("HTTP 503: the model is asleep"),
        );
        assert_eq!(probes(&out, ProbeKind::Warmup).len(), 1, "tried again");
        h.send(Event::Tick);
    }
    assert_eq!(h.node.held.replicas()[&id].state, ReplicaState::Waking);
    let out = h.advance(Duration::from_millis(1500));
    assert!(signals(&out, StopSignal::Term).contains(&id), "{out:?}");
    let r = &h.node.held.replicas()[&id];
    assert!(
        r.reason.contains("within wake_timeout (10.0s)"),
        "{}",
        r.reason
    );
    assert!(r.reason.contains("the model is asleep"), "{}", r.reason);
}

#[test]
fn a_sleeping_replica_is_checked_by_its_state_request_not_the_warm_up() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    let id = asleep[0].clone();
    // recheck is 1m: the state request is asked at that pace, and three misses replace it.
    let out = h.run_for(Duration::from_secs(61));
    assert!(
        probes(&out, ProbeKind::Warmup).is_empty() && probes(&out, ProbeKind::Recheck).is_empty()
    );
    let asks: Vec<_> = probes(&out, ProbeKind::SleepState)
        .into_iter()
        .filter(|(r, _)| *r == id)
        .collect();
    assert_eq!(asks.len(), 1, "{asks:?}");
    answer(
        &mut h,
        &id,
        ProbeKind::SleepState,
        bad(r#""is_sleeping":false"#),
    );
    for _ in 0..2 {
        h.run_for(Duration::from_secs(60));
        answer(
            &mut h,
            &id,
            ProbeKind::SleepState,
            bad(r#""is_sleeping":false"#),
        );
    }
    let r = &h.node.held.replicas()[&id];
    assert_eq!(r.state, ReplicaState::Stopping);
    assert!(r.reason.contains("failed 3 times"), "{}", r.reason);
}

#[test]
fn shutdown_stops_sleeping_replicas() {
    let (mut h, routed, asleep) = one_routed_two_asleep();
    let out = h.send(Event::Shutdown { immediate: false });
    let stopped = signals(&out, StopSignal::Term);
    for id in &asleep {
        assert!(stopped.contains(id), "{out:?}");
    }
    assert_eq!(
        h.node.held.replicas()[&routed].state,
        ReplicaState::Draining
    );
}

#[test]
fn a_model_without_sleep_keeps_min_routed() {
    let toml = format!(
        "{BASE}{}",
        model("m", "", "min = 3\nmax = 4\nwarm_pool = 0")
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 3);
    assert!(probes(&h.log, ProbeKind::Sleep).is_empty());
    assert_eq!(status_of(&h).wake, None);
}

#[test]
fn a_pinned_model_is_never_reclaimed_for_another() {
    let one_device = BASE.replace(
        "[[gpus.device]]\nuuid = \"GPU-b\"\nmemory = \"80GiB\"\n",
        "",
    );
    let low = |pin: &str| {
        gpu_model(
            "low",
            "40GiB",
            &format!("priority = 0\nstart_alone = false\n{pin}"),
            "min = 1\nmax = 2\nwarm_pool = 1",
        )
    };
    let high = gpu_model("high", "40GiB", "priority = 10", "min = 1\nmax = 2");
    for (pin, reclaimed) in [("", 1), ("pin = true", 0)] {
        let mut h = Harness::new(&format!("{one_device}{}", low(pin)));
        let first = h.log.clone();
        h.settle(first);
        assert_eq!(on_device(&h, "GPU-a").len(), 2, "the device is full");
        let out = h.reload(&format!("{one_device}{}{high}", low(pin)));
        assert_eq!(signals(&out, StopSignal::Term).len(), reclaimed, "{pin:?}");
    }
}

#[test]
fn without_its_sleep_table_a_model_stops_its_sleeping_replicas() {
    let (mut h, _, asleep) = one_routed_two_asleep();
    let plain = config(3, 4, "").replace(
        "[model.sleep]\nformat = \"vllm\"\nsleep_timeout = \"5s\"\nwake_timeout = \"10s\"\n",
        "",
    );
    assert!(!plain.contains("[model.sleep]"));
    // Within max: one replaced per event while the stopping ones hold their places.
    let mut out = h.reload(&plain);
    out.extend(h.send(Event::Tick));
    let mut stopped = signals(&out, StopSignal::Term);
    stopped.sort();
    assert_eq!(stopped, asleep, "{out:?}");
    assert_eq!(spawns(&out), 2, "min counts routed replicas again");
}

/// Idle reports from the routed replica, one a second, for `secs` seconds.
fn idle_for(h: &mut Harness, id: &ReplicaId, secs: u64) {
    for _ in 0..secs {
        h.now = h.now + Duration::from_secs(1);
        h.report("m", Some(id.as_str()), 0.0, 0, 0);
        h.send(Event::Tick);
    }
}

#[test]
fn idle_to_sleep_puts_the_routed_replica_to_sleep_and_work_wakes_one() {
    let mut h = Harness::new(&config(2, 2, "idle_to_sleep = \"30s\"\n"));
    let first = h.log.clone();
    h.settle(first);
    let routed = h.in_state("m", ReplicaState::Routed);
    assert_eq!(routed.len(), 1);
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    assert_eq!(falling.len(), 1);
    fall_asleep(&mut h, &falling[0]);

    // Short of idle_to_sleep: it stays routed.
    idle_for(&mut h, &routed[0], 25);
    assert_eq!(h.in_state("m", ReplicaState::Routed), routed);
    assert_eq!(h.node.models["m"].desired_routed, 1);
    // Past it: nothing is kept routed; the replica drains (nothing in flight) and sleeps.
    let mark = h.log.len();
    idle_for(&mut h, &routed[0], 10);
    assert_eq!(h.node.models["m"].desired_routed, 0, "{:?}", &h.log[mark..]);
    assert!(h.in_state("m", ReplicaState::Routed).is_empty());
    let reason = &h.node.models["m"].last_scale.as_ref().unwrap().reason;
    assert!(reason.contains("idle_to_sleep"), "{reason}");
    h.report("m", Some(routed[0].as_str()), 0.0, 0, 0);
    h.send(Event::Tick);
    assert_eq!(
        h.node.held.replicas()[&routed[0]].state,
        ReplicaState::FallingAsleep,
        "drained, then put to sleep: {:?}",
        &h.log[mark..]
    );
    fall_asleep(&mut h, &routed[0]);
    let v = status_of(&h);
    assert_eq!((v.routed, v.warm, v.sleeping), (0, 0, 2));
    // Idle on: nothing is started, stopped or woken.
    let mark = h.log.len();
    h.run_for(Duration::from_secs(20));
    assert_eq!(spawns(&h.log[mark..]), 0);
    assert!(probes(&h.log[mark..], ProbeKind::Wake).is_empty());
    assert!(
        signals(&h.log, StopSignal::Term).is_empty(),
        "nothing stopped"
    );

    // A request waits (the front door's queue, model-wide): one wakes, no cold start.
    let mark = h.log.len();
    h.report("m", None, 200.0, 1, 0);
    h.send(Event::Tick);
    let wakes = probes(&h.log[mark..], ProbeKind::Wake);
    assert_eq!(wakes.len(), 1, "{:?}", &h.log[mark..]);
    assert_eq!(spawns(&h.log[mark..]), 0);
    assert_eq!(h.node.models["m"].desired_routed, 1);
    let woken = wakes[0].0.clone();
    answer(&mut h, &woken, ProbeKind::Wake, ok());
    answer(&mut h, &woken, ProbeKind::Warmup, ok());
    assert_eq!(h.node.held.replicas()[&woken].state, ReplicaState::Routed);
    assert!(!h.node.models["m"].idle_asleep);
}

/// The policy is told what a replica put to sleep takes to be routed again only once a wake
/// was measured, and only while one leaving the routed set could sleep: past `[daemon]
/// host_memory` it would stop, and a cold start is what it would take to get it back.
#[test]
fn the_policy_is_told_the_wake_once_measured_while_a_leaving_replica_could_sleep() {
    // Each sleeper holds 8 GiB of host RAM; the budget holds two.
    let toml = config(3, 4, "host_memory = \"8GiB\"\n").replace(
        "ports = \"30000-30099\"",
        "ports = \"30000-30099\"\nhost_memory = \"16GiB\"",
    );
    let (mut h, _, asleep) = one_routed_two_asleep_in(&toml);
    assert_eq!(h.node.pool_wake("m"), None, "no wake measured yet");
    h.node.models.get_mut("m").unwrap().desired_routed = 2;
    let out = h.send(Event::Tick);
    let wakes = probes(&out, ProbeKind::Wake);
    assert_eq!(wakes.len(), 1, "{out:?}");
    let woken = wakes[0].0.clone();
    h.now = h.now + Duration::from_millis(1200);
    assert!(asleep.contains(&woken));
    answer(&mut h, &woken, ProbeKind::Wake, ok());
    h.now = h.now + Duration::from_millis(300);
    answer(&mut h, &woken, ProbeKind::Warmup, ok());
    assert_eq!(h.node.held.replicas()[&woken].state, ReplicaState::Routed);
    // One asleep (8 GiB of 16): one more could sleep.
    assert_eq!(h.node.pool_wake("m"), Some(Duration::from_millis(1500)));
    // Back to one routed: the replica leaving drains to sleep, and its 8 GiB are spoken for.
    h.node.models.get_mut("m").unwrap().desired_routed = 1;
    h.send(Event::Tick);
    assert_eq!(h.node.host_memory_held(), 16 * 1024 * 1024 * 1024);
    assert_eq!(h.node.pool_wake("m"), None, "a third would not fit");
}
