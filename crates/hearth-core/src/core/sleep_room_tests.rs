//! A sleeping replica's GPU memory counted at `gpu_memory_asleep`: shrunk once asleep, grown
//! before a wake, and a wake that finds no room waits asleep.
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use super::harness::*;
use super::*;

const GIB: u64 = 1 << 30;

/// `m`: 30 GiB awake, 1 GiB asleep, min 3 (one routed, two asleep); `b`: 60 GiB, scaled by
/// hand.
fn config() -> String {
    let m = gpu_model(
        "m",
        "30GiB",
        "start_alone = false",
        "min = 3\nmax = 3\nwarm_pool = 0\nidle_to_zero = \"1m\"\n\
         [model.sleep]\nformat = \"vllm\"\nsleep_timeout = \"5s\"\nwake_timeout = \"10s\"\n\
         gpu_memory_asleep = \"1GiB\"\n",
    )
    .replace(
        r#"["server", "--port""#,
        r#"["server", "--host", "127.0.0.1", "--port""#,
    );
    let b = gpu_model(
        "b",
        "60GiB",
        "start_alone = false",
        "min = 0\nmax = 1\nwarm_pool = 0",
    );
    format!("{}{m}{b}", one_device("100GiB"))
}

fn wakes(actions: &[Action]) -> Vec<ReplicaId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Probe { replica, kind, .. } if *kind == ProbeKind::Wake => {
                Some(replica.clone())
            }
            _ => None,
        })
        .collect()
}

/// One of `m` routed, two asleep, each asleep holding 1 GiB.
fn two_asleep() -> (Harness, Vec<ReplicaId>) {
    let mut h = Harness::new(&config());
    let first = h.log.clone();
    h.settle(first);
    let falling = h.in_state("m", ReplicaState::FallingAsleep);
    assert_eq!(falling.len(), 2, "{:?}", h.all_replicas());
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 90 * GIB, "all awake");
    for id in &falling {
        h.passed(id, ProbeKind::Sleep);
        h.passed(id, ProbeKind::SleepState);
        assert_eq!(h.node.held.replicas()[id].state, ReplicaState::Sleeping);
        assert_eq!(h.node.held.replicas()[id].gpu_bytes, GIB);
    }
    (h, falling)
}

#[test]
fn a_sleeping_replica_holds_its_asleep_memory_and_grows_back_to_wake() {
    let (mut h, asleep) = two_asleep();
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 32 * GIB);
    let view = h.node.gpu_views().remove(0);
    let mut shown = view.asleep.clone();
    shown.sort();
    let want: Vec<String> = asleep.iter().map(|id| id.0.clone()).collect();
    assert_eq!(shown, want, "gpus shows who is asleep there");
    assert_eq!(view.replicas.len(), 3);
    h.node.models.get_mut("m").unwrap().desired_routed = 3;
    let out = h.send(Event::Tick);
    let mut woken = wakes(&out);
    woken.sort();
    assert_eq!(woken, asleep, "{out:?}");
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 90 * GIB);
    for id in &asleep {
        assert_eq!(h.node.held.replicas()[id].gpu_bytes, 30 * GIB);
    }
}

#[test]
fn another_model_takes_the_room_sleepers_left_and_a_wake_without_room_waits() {
    let (mut h, asleep) = two_asleep();
    // 60 GiB would not fit beside three awake replicas of 30; beside one, and two asleep, it does.
    h.node.models.get_mut("b").unwrap().desired_routed = 1;
    let out = h.send(Event::Tick);
    assert_eq!(spawns(&out), 1, "{out:?}");
    h.settle(out);
    assert_eq!(h.in_state("b", ReplicaState::Routed).len(), 1);
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 92 * GIB);
    // Now a wake of `m` needs 29 GiB more, and 8 are free: it waits, asleep, and says why
    // (for up to a cold start's time, 30 s here: sleep_evict_tests.rs has what follows it).
    h.node.models.get_mut("m").unwrap().time_to_ready = Some(std::time::Duration::from_secs(30));
    h.node.models.get_mut("m").unwrap().desired_routed = 3;
    let out = h.send(Event::Tick);
    assert!(wakes(&out).is_empty(), "{out:?}");
    assert_eq!(h.reserved_on("GPU-a").unwrap().0, 92 * GIB);
    for id in &asleep {
        let r = &h.node.held.replicas()[id];
        assert_eq!(r.state, ReplicaState::Sleeping);
        assert!(
            r.reason.contains("waiting for room on GPU GPU-a"),
            "{}",
            r.reason
        );
    }
    assert_eq!(
        spawns(&out),
        0,
        "no cold start in its place: it would not fit either"
    );
    // Once `b` is gone, the wakes go ahead.
    let b = h.in_state("b", ReplicaState::Routed);
    let out = h.exit(&b[0], crate::core::exit::ExitStatus::Code(0));
    let mut woken = wakes(&out);
    woken.extend(wakes(&h.send(Event::Tick)));
    assert!(!woken.is_empty(), "{out:?}");
}

#[test]
fn a_restart_takes_the_sleeping_replicas_back_asleep_and_a_wake_needs_no_cold_start() {
    for how in [Adoption::Found, Adoption::HandedOver] {
        let (old, asleep) = two_asleep();
        let ledger = old.node.ledger();
        let mut h = Harness::bare(&config());
        let mut out = h.send(Event::Adopt { how, ledger });
        assert!(
            signals(&out, StopSignal::Term).is_empty(),
            "{how:?}: none stopped: {out:?}"
        );
        for id in &asleep {
            let r = &h.node.held.replicas()[id];
            assert_eq!(r.state, ReplicaState::Sleeping, "{how:?}");
            assert_eq!(r.gpu_bytes, GIB, "{how:?}: what it held asleep");
        }
        assert_eq!(h.reserved_on("GPU-a").unwrap().0, 32 * GIB, "{how:?}");
        // Their state is asked at the first tick (never their warm-up, which would wake them).
        out.extend(h.send(Event::Tick));
        let mut asked: Vec<ReplicaId> = out
            .iter()
            .filter_map(|a| match a {
                Action::Probe { replica, kind, .. } if *kind == ProbeKind::SleepState => {
                    Some(replica.clone())
                }
                Action::Probe { replica, kind, .. } if *kind == ProbeKind::Warmup => {
                    assert!(
                        !asleep.contains(replica),
                        "{how:?}: a warm-up would wake it"
                    );
                    None
                }
                _ => None,
            })
            .collect();
        asked.sort();
        assert_eq!(asked, asleep, "{how:?}: {out:?}");
        for id in &asleep {
            h.passed(id, ProbeKind::SleepState);
            assert_eq!(h.node.held.replicas()[id].state, ReplicaState::Sleeping);
        }
        // A burst: both wake, and nothing is started.
        h.node.models.get_mut("m").unwrap().desired_routed = 3;
        let out = h.send(Event::Tick);
        let mut woken = wakes(&out);
        woken.sort();
        assert_eq!(woken, asleep, "{how:?}: {out:?}");
        assert_eq!(spawns(&out), 0, "{how:?}");
    }
}

#[test]
fn a_replica_found_half_way_to_sleep_or_asleep_without_a_sleeping_tier_is_replaced() {
    let (mut old, asleep) = two_asleep();
    // One of them was waking when the previous run ended.
    let waking = asleep[0].clone();
    old.node.models.get_mut("m").unwrap().desired_routed = 2;
    let out = old.send(Event::Tick);
    assert_eq!(wakes(&out), std::slice::from_ref(&waking));
    let ledger = old.node.ledger();
    let mut h = Harness::bare(&config());
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger: ledger.clone(),
    });
    assert_eq!(
        signals(&out, StopSignal::Term),
        std::slice::from_ref(&waking)
    );
    // The other is taken back (and, as the model wanted two routed, woken in its place).
    assert!(matches!(
        h.node.held.replicas()[&asleep[1]].state,
        ReplicaState::Sleeping | ReplicaState::Waking
    ));
    // And where the file no longer gives the model a sleeping tier, the one asleep goes too.
    let plain = config().replace(
        "[model.sleep]\nformat = \"vllm\"\nsleep_timeout = \"5s\"\nwake_timeout = \"10s\"\n\
         gpu_memory_asleep = \"1GiB\"\n",
        "",
    );
    assert!(!plain.contains("[model.sleep]"), "{plain}");
    let mut h = Harness::bare(&plain);
    let out = h.send(Event::Adopt {
        how: Adoption::Found,
        ledger,
    });
    let mut stopped = signals(&out, StopSignal::Term);
    stopped.sort();
    assert_eq!(stopped, asleep);
}
