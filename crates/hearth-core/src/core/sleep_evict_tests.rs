//! More models than GPUs: a model that must wake or start where other models' replicas hold
//! the device puts their idle ones to sleep (reclaim.rs), never a pinned model's nor one of
//! higher priority, never one with work in flight, within `[daemon] host_memory`; and the
//! model put to sleep wakes only for a request that waits for it.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use std::time::Duration;

use super::harness::*;
use super::*;

const GIB: u64 = 1 << 30;

/// A vLLM model on one GPU with a sleeping tier: 60 GiB awake, 1 GiB asleep, one replica.
fn sleepy(name: &str, extra: &str) -> String {
    gpu_model(
        name,
        "60GiB",
        extra,
        "min = 1\nmax = 1\nwarm_pool = 0\nidle_to_zero = \"10m\"\n\
         [model.sleep]\nformat = \"vllm\"\nsleep_timeout = \"5s\"\nwake_timeout = \"10s\"\n\
         gpu_memory_asleep = \"1GiB\"\n",
    )
    .replace(
        r#"["server", "--port""#,
        r#"["server", "--host", "127.0.0.1", "--port""#,
    )
}

/// The device's reservations never pass its memory: checked after every step.
fn within_device(h: &Harness) {
    let (reserved, _) = h.reserved_on("GPU-a").unwrap();
    assert!(reserved <= 100 * GIB, "over-committed: {reserved}");
}

/// The model's queue as a front door reports it (model-wide), and each of its replicas idle.
fn door(h: &mut Harness, model: &str, queued: u64) {
    h.report(
        model,
        None,
        if queued > 0 { 200.0 } else { 0.0 },
        queued,
        queued,
    );
    for r in h
        .node
        .held
        .replicas()
        .of_model(model)
        .map(|r| r.id.clone())
        .collect::<Vec<_>>()
    {
        h.report(model, Some(r.as_str()), 0.0, 0, 0);
    }
}

/// A second of front-door reports for every model, `queued` waiting for `busy`.
fn second(h: &mut Harness, busy: Option<&str>, queued: u64) -> Vec<Action> {
    // What the reports led to is in the log, with what the ticks did.
    let mark = h.log.len();
    for _ in 0..4 {
        h.now = h.now + Duration::from_millis(250);
        let models: Vec<String> = h.node.models.keys().cloned().collect();
        for m in models {
            let q = if Some(m.as_str()) == busy { queued } else { 0 };
            door(h, &m, q);
        }
        h.send(Event::Tick);
        within_device(h);
    }
    h.log[mark..].to_vec()
}

/// Answers every sleep, state, wake and warm-up probe among `actions` (and those they lead
/// to), every spawn, and every stop (the process exits), until nothing more is asked.
fn play(h: &mut Harness, mut actions: Vec<Action>) -> Vec<Action> {
    let mut all = Vec::new();
    for _ in 0..50 {
        let mut next = Vec::new();
        for id in h.spawn_all(&actions) {
            next.extend(h.warm(&id));
        }
        for id in signals(&actions, StopSignal::Term) {
            next.extend(h.exit(&id, exit::ExitStatus::Code(0)));
        }
        for a in &actions {
            if let Action::Probe { replica, kind, .. } = a {
                if matches!(
                    kind,
                    ProbeKind::Sleep | ProbeKind::SleepState | ProbeKind::Wake | ProbeKind::Warmup
                ) {
                    next.extend(h.passed(replica, *kind));
                }
            }
        }
        within_device(h);
        all.extend(actions);
        if next.is_empty() {
            return all;
        }
        actions = next;
    }
    panic!("did not settle");
}

fn state(h: &Harness, model: &str) -> Vec<ReplicaState> {
    let mut v: Vec<ReplicaState> = h
        .node
        .held
        .replicas()
        .of_model(model)
        .map(|r| r.state)
        .collect();
    v.sort_by_key(|s| format!("{s:?}"));
    v
}

/// `a` routed on the device; `b`, which cannot fit beside it awake, pending.
fn a_routed_b_waiting(toml: &str) -> Harness {
    let mut h = Harness::new(toml);
    let first = h.log.clone();
    play(&mut h, first);
    assert_eq!(state(&h, "a"), [ReplicaState::Routed]);
    assert_eq!(state(&h, "b"), [ReplicaState::Pending]);
    h
}

#[test]
fn a_start_puts_an_idle_model_to_sleep_and_a_request_for_it_wakes_it_back() {
    let mut h = a_routed_b_waiting(&format!(
        "{}{}{}",
        one_device("100GiB"),
        sleepy("a", ""),
        sleepy("b", "")
    ));
    // Without a signal, `a` is not known to be idle: nothing is taken (never on silence).
    let out = h.advance(Duration::from_secs(5));
    assert_eq!(spawns(&out), 0);
    assert_eq!(state(&h, "a"), [ReplicaState::Routed]);
    // The front door says `a` has nothing to do: it is put to sleep, and `b` starts in its room.
    let out = second(&mut h, None, 0);
    let out = play(&mut h, out);
    assert_eq!(spawns(&out), 1, "b's cold start");
    assert_eq!(state(&h, "a"), [ReplicaState::Sleeping]);
    assert_eq!(state(&h, "b"), [ReplicaState::Routed]);
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 61 * GIB);
    let a = h.node.models["a"].last_scale.clone().unwrap();
    assert!(
        a.reason.contains("put to sleep for a start of model b"),
        "{}",
        a.reason
    );
    assert_eq!(h.node.models["a"].desired_routed, 0);
    let a = h
        .status()
        .models
        .into_iter()
        .find(|m| m.name == "a")
        .unwrap();
    assert_eq!(a.gave_way_total, 1);
    let why = a.last_gave_way.unwrap_or_default();
    assert!(
        why.starts_with("a-1: put to sleep for a start of model b"),
        "{why}"
    );

    // A minute of quiet, with `a`'s arrival rate gone or not: `a` stays asleep, `b` routed.
    for _ in 0..60 {
        let out = second(&mut h, None, 0);
        assert_eq!(spawns(&play(&mut h, out)), 0);
        assert_eq!(state(&h, "a"), [ReplicaState::Sleeping]);
    }
    assert_eq!(state(&h, "a"), [ReplicaState::Sleeping]);
    assert_eq!(state(&h, "b"), [ReplicaState::Routed]);

    // A request waits for `a`: `b` (idle) is put to sleep, `a` wakes through its warm-up and is
    // routed; no cold start.
    let mut all = Vec::new();
    for _ in 0..5 {
        let out = second(&mut h, Some("a"), 1);
        all.extend(play(&mut h, out));
    }
    assert_eq!(
        spawns(&all),
        0,
        "a switch is sleep and wake, never a cold start"
    );
    assert_eq!(state(&h, "a"), [ReplicaState::Routed]);
    assert_eq!(state(&h, "b"), [ReplicaState::Sleeping]);
    let b = h.node.models["b"].last_scale.clone().unwrap();
    assert!(
        b.reason.contains("put to sleep for a wake of model a"),
        "{}",
        b.reason
    );
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 61 * GIB);
}

#[test]
fn work_in_flight_keeps_a_replica_awake_until_it_is_done() {
    let mut h = a_routed_b_waiting(&format!(
        "{}{}{}",
        one_device("100GiB"),
        sleepy("a", ""),
        sleepy("b", "")
    ));
    for _ in 0..5 {
        let out = second(&mut h, Some("a"), 1);
        let out = play(&mut h, out);
        assert_eq!(spawns(&out), 0);
        assert_eq!(
            state(&h, "a"),
            [ReplicaState::Routed],
            "busy: it keeps serving"
        );
    }
    let out = second(&mut h, None, 0);
    let out = play(&mut h, out);
    assert_eq!(spawns(&out), 1);
    assert_eq!(state(&h, "a"), [ReplicaState::Sleeping]);
}

#[test]
fn a_pinned_model_or_one_of_higher_priority_is_never_put_to_sleep_for_another() {
    for a_extra in ["pin = true", "priority = 5"] {
        let a = if a_extra == "pin = true" {
            // A pinned model has no sleeping tier.
            gpu_model("a", "60GiB", a_extra, "min = 1\nmax = 1\nwarm_pool = 0")
        } else {
            sleepy("a", a_extra)
        };
        let mut h = a_routed_b_waiting(&format!("{}{a}{}", one_device("100GiB"), sleepy("b", "")));
        for _ in 0..10 {
            let out = second(&mut h, None, 0);
            let out = play(&mut h, out);
            assert_eq!(spawns(&out), 0, "{a_extra}");
        }
        assert_eq!(state(&h, "a"), [ReplicaState::Routed], "{a_extra}");
        assert_eq!(state(&h, "b"), [ReplicaState::Pending], "{a_extra}");
    }
}

#[test]
fn a_higher_priority_model_puts_a_lower_one_to_sleep_and_it_cannot_take_the_room_back() {
    let a = format!("{}{}", one_device("100GiB"), sleepy("a", ""));
    let mut h = Harness::new(&a);
    let first = h.log.clone();
    play(&mut h, first);
    let out = h.reload(&format!("{a}{}", sleepy("b", "priority = 5")));
    play(&mut h, out);
    assert_eq!(state(&h, "b"), [ReplicaState::Pending]);
    let out = second(&mut h, None, 0);
    play(&mut h, out);
    assert_eq!(state(&h, "b"), [ReplicaState::Routed]);
    assert_eq!(state(&h, "a"), [ReplicaState::Sleeping]);
    // A request for `a` waits; `b` is idle but of higher priority: `a` waits asleep, and says
    // why (within a cold start's time: 30 s).
    h.node.models.get_mut("a").unwrap().time_to_ready = Some(Duration::from_secs(30));
    for _ in 0..5 {
        let out = second(&mut h, Some("a"), 1);
        let out = play(&mut h, out);
        assert_eq!(spawns(&out), 0);
    }
    assert_eq!(state(&h, "b"), [ReplicaState::Routed]);
    assert_eq!(state(&h, "a"), [ReplicaState::Sleeping]);
    let r = h.node.held.replicas().of_model("a").next().unwrap();
    assert!(
        r.reason.contains("waiting for room on GPU GPU-a to wake"),
        "{}",
        r.reason
    );
}

#[test]
fn the_one_quickest_to_wake_back_is_put_to_sleep_first() {
    // `c` and `d` are 30 GiB each; `z` needs 60 beside them on 100: one of them must sleep.
    let small = |name: &str| sleepy(name, "").replace("60GiB", "30GiB");
    let toml = format!(
        "{}{}{}{}",
        one_device("100GiB"),
        small("c"),
        small("d"),
        sleepy("z", "")
    );
    for (c_wake, d_wake, expect) in [(5, 1, "d"), (1, 5, "c")] {
        let mut h = Harness::new(&toml);
        let first = h.log.clone();
        play(&mut h, first);
        assert_eq!(state(&h, "z"), [ReplicaState::Pending]);
        for _ in 0..3 {
            let mut w = |m: &str, s: u64| {
                h.node
                    .models
                    .get_mut(m)
                    .unwrap()
                    .wakes
                    .record(Duration::from_secs(s))
            };
            w("c", c_wake);
            w("d", d_wake);
        }
        // Both shown idle while neither has been routed long enough to give way: then both may.
        for m in ["c", "d", "z"] {
            door(&mut h, m, 0);
        }
        let out = second(&mut h, None, 0);
        play(&mut h, out);
        assert_eq!(state(&h, "z"), [ReplicaState::Routed]);
        assert_eq!(
            state(&h, expect),
            [ReplicaState::Sleeping],
            "{c_wake} {d_wake}"
        );
        let other = if expect == "c" { "d" } else { "c" };
        assert_eq!(
            state(&h, other),
            [ReplicaState::Routed],
            "only as many as needed"
        );
    }
}

#[test]
fn host_memory_bounds_the_sleepers_and_a_replica_that_cannot_sleep_is_not_taken() {
    // Each replica asleep holds 8 GiB of host RAM; the budget is 10: one may sleep.
    let with_host = |name: &str, scaling_min: u32| {
        sleepy(name, "")
            .replace("min = 1\nmax = 1", &format!("min = {scaling_min}\nmax = 3"))
            .replace(
                "gpu_memory_asleep",
                "host_memory = \"8GiB\"\ngpu_memory_asleep",
            )
            .replace("60GiB", "20GiB")
    };
    let toml = format!("{}{}", one_device("100GiB"), with_host("a", 3)).replace(
        "ports = \"30000-30099\"",
        "ports = \"30000-30099\"\nhost_memory = \"10GiB\"",
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    play(&mut h, first);
    for _ in 0..5 {
        let out = second(&mut h, None, 0);
        play(&mut h, out);
    }
    // min 3: one routed, one asleep, and the third stays awake in the pool: no room to sleep.
    assert_eq!(
        state(&h, "a"),
        [
            ReplicaState::Routed,
            ReplicaState::Sleeping,
            ReplicaState::Warm
        ]
    );
    assert_eq!(h.node.host_memory_held(), 8 * GIB);
    let shown = h.status().daemon.sleeping_host_memory;
    assert_eq!(
        (shown.held_bytes, shown.budget_bytes),
        (8 * GIB, Some(10 * GIB))
    );
    let warm = h.in_state("a", ReplicaState::Warm);
    let r = &h.node.held.replicas()[&warm[0]];
    assert!(
        r.reason.contains("not put to sleep") || r.reason.is_empty(),
        "{}",
        r.reason
    );

    // A model that needs the room cannot put the warm one to sleep (no host RAM for it): it is
    // stopped instead, as a warm replica of equal priority may be; the one asleep stays.
    let toml2 = format!("{toml}{}", sleepy("b", "").replace("60GiB", "70GiB"));
    let out = h.reload(&toml2);
    let mut all = play(&mut h, out);
    for _ in 0..5 {
        let out = second(&mut h, None, 0);
        all.extend(play(&mut h, out));
        assert!(h.node.host_memory_held() <= 10 * GIB);
    }
    assert_eq!(state(&h, "b"), [ReplicaState::Routed]);
    assert_eq!(
        signals(&all, StopSignal::Term),
        warm,
        "the warm one, stopped"
    );
    assert_eq!(h.in_state("a", ReplicaState::Sleeping).len(), 1);
    assert_eq!(h.in_state("a", ReplicaState::Routed).len(), 1);
}

#[test]
fn without_daemon_host_memory_sleepers_may_hold_half_of_the_hosts_ram() {
    let toml = format!("{}{}", one_device("100GiB"), sleepy("a", ""));
    let mut h = Harness::new(&toml);
    assert_eq!(h.status().daemon.sleeping_host_memory.budget_bytes, None);
    h.node.host_ram = Some(20 * GIB);
    assert_eq!(
        h.status().daemon.sleeping_host_memory.budget_bytes,
        Some(10 * GIB)
    );
    // Set in the file, the file's bound is the budget.
    let set = toml.replace(
        "ports = \"30000-30099\"",
        "ports = \"30000-30099\"\nhost_memory = \"4GiB\"",
    );
    let mut h = Harness::new(&set);
    h.node.host_ram = Some(20 * GIB);
    assert_eq!(
        h.status().daemon.sleeping_host_memory.budget_bytes,
        Some(4 * GIB)
    );
}

#[test]
fn a_sleeper_whose_device_never_frees_waits_no_longer_than_a_cold_start_then_starts_elsewhere() {
    // `a` and `b` on a device each; then a pinned `p` takes `a`'s device (it outranks it).
    let two = format!("{BASE}{}{}", sleepy("a", ""), sleepy("b", ""));
    let mut h = Harness::new(&two);
    let first = h.log.clone();
    play(&mut h, first);
    let out = second(&mut h, None, 0);
    play(&mut h, out);
    assert_eq!(state(&h, "a"), [ReplicaState::Routed]);
    assert_eq!(state(&h, "b"), [ReplicaState::Routed]);
    let pinned = gpu_model(
        "p",
        "60GiB",
        "pin = true\npriority = 10",
        "min = 1\nmax = 1",
    );
    let out = h.reload(&format!("{two}{pinned}"));
    let mut all = play(&mut h, out);
    for _ in 0..3 {
        let out = second(&mut h, None, 0);
        all.extend(play(&mut h, out));
    }
    assert_eq!(state(&h, "p"), [ReplicaState::Routed]);
    let asleep: Vec<ReplicaState> = [state(&h, "a"), state(&h, "b")].concat();
    assert!(asleep.contains(&ReplicaState::Sleeping), "{asleep:?}");
    let (sleeper_model, other) = if state(&h, "a") == [ReplicaState::Sleeping] {
        ("a", "b")
    } else {
        ("b", "a")
    };
    let sleeper = h.in_state(sleeper_model, ReplicaState::Sleeping)[0].clone();
    assert_eq!(
        h.gpus_of(&sleeper),
        h.gpus_of(&h.in_state("p", ReplicaState::Routed)[0])
    );
    // A cold start of it takes 30 s: a request waits that long for room beside `p` (nothing
    // there may give way), and no longer.
    h.node.models.get_mut(sleeper_model).unwrap().time_to_ready = Some(Duration::from_secs(30));
    for _ in 0..25 {
        let out = second(&mut h, Some(sleeper_model), 1);
        play(&mut h, out);
    }
    assert_eq!(
        h.node.held.replicas()[&sleeper].state,
        ReplicaState::Sleeping
    );
    assert!(
        h.node.held.replicas()[&sleeper]
            .reason
            .contains("waiting for room"),
        "{}",
        h.node.held.replicas()[&sleeper].reason
    );
    let mut all = Vec::new();
    for _ in 0..10 {
        let out = second(&mut h, Some(sleeper_model), 1);
        all.extend(play(&mut h, out));
    }
    // Replaced: stopped (not as a failure), and a start on the other device, where the other
    // model (idle) was put to sleep for it.
    assert!(!h.node.held.replicas().contains_key(&sleeper));
    assert_eq!(
        signals(&all, StopSignal::Term),
        std::slice::from_ref(&sleeper)
    );
    assert_eq!(spawns(&all), 1);
    assert_eq!(state(&h, sleeper_model), [ReplicaState::Routed]);
    assert_eq!(state(&h, other), [ReplicaState::Sleeping]);
    assert_eq!(
        h.node.models[sleeper_model].total_restarts, 0,
        "not a failure"
    );
    assert_eq!(state(&h, "p"), [ReplicaState::Routed]);
}
