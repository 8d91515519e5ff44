//! GPU logic through a scripted fake inventory: evacuation on XIDs and cordons, priority
//! arbitration, foreign memory, overruns.

use std::time::Duration;

use super::harness::{
    error_code, gpu_model, on_device, one_device, routed_sets, signals, spawns, Harness, BASE,
};
use super::*;
use crate::protocol::Health;
use crate::protocol::{ErrorCode, Request};

pub(crate) fn xid(uuid: &str, xid: u64, recovery: Option<RecoveryAction>) -> Event {
    Event::GpuXid {
        uuid: uuid.into(),
        xid,
        recovery,
    }
}

/// A reading of `uuid`: `used` bytes, with (pid, bytes, leaders) processes.
pub(crate) fn reading(uuid: &str, used: u64, processes: &[(u32, Option<u64>, &[u32])]) -> Event {
    Event::GpuReading(GpuReading {
        uuid: uuid.into(),
        used,
        driver_reserved: 0,
        processes: processes
            .iter()
            .map(|&(pid, bytes, leaders)| GpuProcess {
                pid,
                bytes,
                replica: None,
                leaders: leaders.to_vec(),
            })
            .collect(),
        recovery: None,
    })
}

fn routed_total(h: &Harness, m: &str) -> usize {
    h.in_state(m, ReplicaState::Routed).len()
}

fn evacuation_keeps_min_routed(trigger: impl FnOnce(&mut Harness) -> Vec<Action>) {
    let toml = format!(
        "{BASE}{}",
        gpu_model(
            "m",
            "30GiB",
            "start_alone = false",
            "min = 2\nmax = 4\nwarm_pool = 0"
        )
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    // pack: both on the first device (started together: start_alone is off).
    assert_eq!(on_device(&h, "GPU-a").len(), 2);
    let old = h.in_state("m", ReplicaState::Routed);
    let out = trigger(&mut h);
    assert_eq!(spawns(&out), 2, "replacements start at once, elsewhere");
    assert!(
        routed_sets(&out).is_empty(),
        "the old replicas keep serving meanwhile"
    );
    let new: Vec<ReplicaId> = h.in_state("m", ReplicaState::Starting);
    assert_eq!(on_device(&h, "GPU-b"), new);
    let ids = h.spawn_all(&out);
    let mut min_routed = usize::MAX;
    for id in ids {
        h.warm(&id);
        min_routed = min_routed.min(routed_total(&h, "m"));
    }
    assert!(min_routed >= 2, "routed never below min during the move");
    // Both old ones drain once both replacements are routed.
    let draining = h.in_state("m", ReplicaState::Draining);
    assert_eq!(draining, old);
    assert_eq!(h.in_state("m", ReplicaState::Routed), new);
    // Nothing new goes to the device.
    let a = h.node.held.gpus().slot("GPU-a").unwrap();
    assert!(!a.healthy || a.cordoned);
}

#[test]
fn a_critical_xid_evacuates_a_device_with_routed_capacity_never_below_min() {
    evacuation_keeps_min_routed(|h| h.send(xid("GPU-a", 79, None)));
}

#[test]
fn a_recovery_action_that_needs_a_reset_evacuates_the_same_way() {
    // XID 94 is contained to the faulting application, unless the driver says otherwise.
    evacuation_keeps_min_routed(|h| h.send(xid("GPU-a", 94, Some(RecoveryAction::GpuReset))));
}

#[test]
fn cordon_with_evacuate_moves_replicas_the_same_way() {
    evacuation_keeps_min_routed(|h| {
        let before = h.log.len();
        let r = h.ask(
            Peer::trusted(),
            Request::Cordon {
                gpu: "0".into(),
                reason: Some("maintenance".into()),
                evacuate: true,
            },
        );
        assert!(r.is_ok(), "{r:?}");
        h.log[before..].to_vec()
    });
}

#[test]
fn application_xids_are_logged_only_and_cordon_without_evacuate_moves_nothing() {
    let toml = format!(
        "{BASE}{}",
        gpu_model("m", "30GiB", "start_alone = false", "min = 2\nmax = 4")
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    // Application errors, contained ECC, row remapping, a rate warning: none is the device's.
    for (x, r) in [
        (13, None),
        (94, Some(RecoveryAction::None)),
        (63, None),
        (92, None),
        (48, Some(RecoveryAction::None)),
    ] {
        let out = h.send(xid("GPU-a", x, r));
        assert_eq!(spawns(&out), 0, "XID {x}");
        assert!(h.node.held.gpus().slots[0].healthy, "XID {x}");
    }
    let r = h.ask(
        Peer::trusted(),
        Request::Cordon {
            gpu: "GPU-a".into(),
            reason: None,
            evacuate: false,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        on_device(&h, "GPU-a").len(),
        2,
        "cordon alone keeps what runs"
    );
    let r = h.ask(
        Peer::trusted(),
        Request::Cordon {
            gpu: "GPU-z".into(),
            reason: None,
            evacuate: false,
        },
    );
    assert_eq!(error_code(&r), Some(ErrorCode::UnknownGpu));
    // New replicas avoid it.
    let r = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "m".into(),
            min: Some(3),
            max: None,
            warm_pool: None,
            reset: false,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        h.in_state("m", ReplicaState::Starting)
            .iter()
            .map(|id| h.node.held.replicas()[id].gpus.clone())
            .collect::<Vec<_>>(),
        vec![vec!["GPU-b".to_string()]]
    );
}

#[test]
fn an_unhealthy_device_stays_unhealthy_until_uncordon() {
    let toml = format!("{BASE}{}", gpu_model("m", "30GiB", "", "min = 1\nmax = 4"));
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    h.send(xid("GPU-b", 48, None));
    h.run_for(Duration::from_secs(600));
    assert!(!h.node.held.gpus().slots[1].healthy);
    let r = h.ask(
        Peer::trusted(),
        Request::Uncordon {
            gpu: "GPU-b".into(),
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert!(h.node.held.gpus().slots[1].healthy && !h.node.held.gpus().slots[1].evacuate);
}

fn reload(h: &mut Harness, toml: &str) -> Vec<Action> {
    h.reload(toml)
}

#[test]
fn a_higher_priority_model_reclaims_a_lower_priority_warm_replica_on_a_full_device() {
    let low = gpu_model(
        "low",
        "40GiB",
        "priority = 0\nstart_alone = false",
        "min = 1\nmax = 2\nwarm_pool = 1",
    );
    let mut h = Harness::new(&format!("{}{low}", one_device("80GiB")));
    let first = h.log.clone();
    h.settle(first);
    assert_eq!(on_device(&h, "GPU-a").len(), 2, "the device is full");
    let warm = h.in_state("low", ReplicaState::Warm);
    let high = gpu_model("high", "40GiB", "priority = 10", "min = 1\nmax = 2");
    let out = reload(&mut h, &format!("{}{low}{high}", one_device("80GiB")));
    assert_eq!(
        signals(&out, StopSignal::Term),
        warm,
        "the warm one goes, routed capacity stays"
    );
    assert_eq!(spawns(&out), 0, "the GPU is free only once it exited");
    let out = h.exit(&warm[0], crate::core::ExitStatus::Code(0));
    let spawned: Vec<String> = out
        .iter()
        .filter_map(|a| match a {
            Action::Spawn(s) => Some(s.model.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        spawned,
        vec!["high"],
        "the reclaimed GPU goes to the model that reclaimed it"
    );
    let st = h.node.status(Some("low"), h.now);
    assert_eq!(st.models[0].routed, 1);
    assert_eq!(
        st.models[0].health,
        Health::NoCapacity,
        "its pool cannot refill: {}",
        st.models[0].health_reason
    );
}

#[test]
fn routed_replicas_are_reclaimed_only_above_min_and_only_by_higher_priority() {
    let low = gpu_model(
        "low",
        "40GiB",
        "priority = 0\nstart_alone = false",
        "min = 1\nmax = 2\nwarm_pool = 0",
    );
    let mut h = Harness::new(&format!("{}{low}", one_device("80GiB")));
    let first = h.log.clone();
    h.settle(first);
    h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "low".into(),
            min: None,
            max: None,
            warm_pool: None,
            reset: false,
        },
    )
    .expect("the request is answered ok");
    // Push low to 2 routed (above its min of 1).
    h.node.models.get_mut("low").unwrap().desired_routed = 2;
    let out = h.send(Event::Tick);
    h.settle(out);
    assert_eq!(routed_total(&h, "low"), 2);
    // An equal-priority model may not take routed capacity.
    let same = gpu_model("same", "40GiB", "priority = 0", "min = 1\nmax = 1");
    let out = reload(&mut h, &format!("{}{low}{same}", one_device("80GiB")));
    assert!(signals(&out, StopSignal::Term).is_empty());
    assert!(h.in_state("low", ReplicaState::Draining).is_empty());
    assert_eq!(
        h.node.status(Some("same"), h.now).models[0].health,
        Health::NoCapacity
    );
    // A higher-priority one drains one routed replica (never killed), down to low's min only.
    let high = gpu_model("high", "40GiB", "priority = 5", "min = 2\nmax = 2");
    reload(&mut h, &format!("{}{low}{high}", one_device("80GiB")));
    let draining = h.in_state("low", ReplicaState::Draining);
    assert_eq!(draining.len(), 1);
    assert_eq!(h.node.models["low"].desired_routed, 1);
    h.report("low", Some(&draining[0].0), 0.0, 0, 0);
    let out = h.exit(&draining[0], crate::core::ExitStatus::Code(0));
    assert_eq!(spawns(&out), 1);
    h.settle(out);
    assert_eq!(routed_total(&h, "low"), 1, "min holds");
    assert_eq!(
        h.node.status(Some("high"), h.now).models[0].health,
        Health::NoCapacity
    );
}

#[test]
fn memory_held_by_others_is_not_capacity_and_overruns_are_reported() {
    let toml = format!(
        "{}{}",
        one_device("80GiB"),
        gpu_model("m", "30GiB", "", "min = 1\nmax = 3")
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    let leader = h.pid(&r);
    const GIB: u64 = 1 << 30;
    // 75 GiB used: 35 by our replica's worker (over its 30), 40 by someone else.
    let worker: &[u32] = &[4242, 4242, leader];
    let out = h.send(reading(
        "GPU-a",
        75 * GIB,
        &[
            (4242, Some(35 * GIB), worker),
            (99999, Some(40 * GIB), &[99999]),
        ],
    ));
    let warned = out.iter().any(|a| matches!(a, Action::Log { level: LogLevel::Warn, message, .. } if message.contains("35.0GiB") && message.contains("30.0GiB")));
    assert!(warned, "{out:?}");
    let again = h.send(reading(
        "GPU-a",
        75 * GIB,
        &[
            (4242, Some(35 * GIB), worker),
            (99999, Some(40 * GIB), &[99999]),
        ],
    ));
    assert!(
        !again.iter().any(|a| matches!(
            a,
            Action::Log {
                level: LogLevel::Warn,
                ..
            }
        )),
        "once per episode"
    );
    assert_eq!(h.node.held.gpus().slots[0].memory_foreign, 40 * GIB);
    // 80 − 40 foreign − 30 reserved = 10 GiB: a second 30 GiB replica does not fit.
    let r = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "m".into(),
            min: Some(2),
            max: None,
            warm_pool: None,
            reset: false,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    let st = h.node.status(Some("m"), h.now);
    assert_eq!(st.models[0].health, Health::NoCapacity);
    // The other process leaves: the room is there again.
    let out = h.send(reading(
        "GPU-a",
        30 * GIB,
        &[(leader, Some(30 * GIB), &[leader])],
    ));
    let out2 = h.send(Event::Tick);
    assert_eq!(spawns(&out) + spawns(&out2), 1);
}

#[test]
fn prefetch_progress_shows_in_the_starting_replicas_reason_and_late_reports_are_ignored() {
    const GIB: u64 = 1 << 30;
    let toml = format!(
        "{}{}",
        one_device("80GiB"),
        gpu_model(
            "m",
            "30GiB",
            "prefetch = [\"/w/*.safetensors\", \"/w/missing*\"]",
            "min = 1\nmax = 1\nwarm_pool = 0"
        )
    );
    let mut h = Harness::new(&toml);
    // The prefetch is asked for when the replica is created, before (and beside) its spawn.
    let prefetch_at = h
        .log
        .iter()
        .position(|a| matches!(a, Action::Prefetch { .. }))
        .expect("a prefetch");
    let spawn_at = h
        .log
        .iter()
        .position(|a| matches!(a, Action::Spawn(_)))
        .expect("a spawn");
    assert!(prefetch_at < spawn_at);
    let Action::Prefetch { globs, .. } = &h.log[prefetch_at] else {
        unreachable!()
    };
    assert_eq!(globs, &vec!["/w/*.safetensors", "/w/missing*"]);
    let Action::Spawn(spec) = h.log[spawn_at].clone() else {
        unreachable!()
    };
    let id = spec.replica.clone();
    let reason = |h: &Harness| {
        h.node.status(Some("m"), h.now).models[0].replicas[0]
            .reason
            .to_string()
    };
    let progress = |h: &mut Harness, done: u64, missing: &[&str]| {
        let out = h.send(Event::Prefetch {
            replica: id.clone(),
            done_bytes: done,
            total_bytes: 2 * GIB,
            missing: missing.iter().map(|s| s.to_string()).collect(),
        });
        assert!(
            out.iter()
                .all(|a| !matches!(a, Action::Spawn(_) | Action::Signal { .. })),
            "progress decides nothing: {out:?}"
        );
    };
    progress(&mut h, 0, &[]);
    assert_eq!(reason(&h), "prefetching weights: 0MiB of 2.0GiB");
    progress(&mut h, 1288490189, &["/w/missing*"]);
    assert_eq!(
        reason(&h),
        "prefetching weights: 1.2GiB of 2.0GiB; not found: /w/missing*"
    );
    progress(&mut h, 2 * GIB, &["/w/missing*"]);
    assert_eq!(
        reason(&h),
        "weights prefetched: 2.0GiB; not found: /w/missing*"
    );
    h.spawn_all(&[Action::Spawn(spec.clone())]);
    h.warm(&id);
    assert_eq!(h.in_state("m", ReplicaState::Routed), vec![id.clone()]);
    assert_eq!(reason(&h), "", "warm clears the reason");
    progress(&mut h, 2 * GIB, &[]);
    assert_eq!(
        reason(&h),
        "",
        "a late report for a routed replica changes nothing"
    );
    // A report for a replica that no longer exists is harmless.
    let out = h.send(Event::Prefetch {
        replica: ReplicaId("m-99".into()),
        done_bytes: 1,
        total_bytes: 2,
        missing: vec![],
    });
    assert_eq!(spawns(&out), 0);
}

#[test]
fn unavailable_process_memory_is_the_replica_s_once_and_never_foreign_as_well() {
    const GIB: u64 = 1 << 30;
    // An 80 GiB card and 38 GiB replicas: two fit only if the first one's bytes count once.
    let toml = format!(
        "{}{}",
        one_device("80GiB"),
        gpu_model("m", "38GiB", "", "min = 1\nmax = 2\nwarm_pool = 0")
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    let leader = h.pid(&r);
    // The driver says "Unavailable" for the replica's process (a MIG parent without
    // privilege): 37 GiB are in use, the replica's own, plus 1 GiB someone else holds.
    h.send(reading(
        "GPU-a",
        38 * GIB,
        &[(leader, None, &[leader]), (99999, Some(GIB), &[99999])],
    ));
    assert_eq!(
        h.node.held.gpus().slots[0].memory_foreign,
        GIB,
        "only the other process's"
    );
    // Across PID namespaces the replica's processes cannot be seen at all: the same.
    h.send(reading(
        "GPU-a",
        38 * GIB,
        &[(424242, None, &[]), (99999, Some(GIB), &[99999])],
    ));
    assert_eq!(h.node.held.gpus().slots[0].memory_foreign, GIB);
    // Never more than the replica reserved: the rest of an unknowable 60 GiB is foreign.
    h.send(reading("GPU-a", 60 * GIB, &[(424242, None, &[])]));
    assert_eq!(h.node.held.gpus().slots[0].memory_foreign, 22 * GIB);
    // Back to 38 GiB used: a second 38 GiB replica fits (80 − 38 reserved − 1 foreign).
    h.send(reading(
        "GPU-a",
        38 * GIB,
        &[(leader, None, &[leader]), (99999, Some(GIB), &[99999])],
    ));
    let before = h.log.len();
    let r = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "m".into(),
            min: Some(2),
            max: None,
            warm_pool: None,
            reset: false,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    h.send(Event::Tick);
    let after = h.log.get(before..).unwrap_or_default().to_vec();
    assert_eq!(spawns(&after), 1, "the second replica fits: {after:?}");
}

#[test]
fn one_replica_starts_on_a_device_at_a_time_and_pack_waits_for_it() {
    // start_alone (the default): vLLM profiles the whole device's free memory at start, so a
    // second start beside the first would size its cache on memory the first is still taking.
    let toml = format!(
        "{BASE}{}",
        gpu_model("m", "30GiB", "", "min = 2\nmax = 2\nwarm_pool = 0")
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    assert_eq!(spawns(&first), 1, "one start at a time");
    let ids = h.spawn_all(&first);
    let waiting = h.in_state("m", ReplicaState::Pending);
    assert_eq!(waiting.len(), 1);
    let st = h.node.status(Some("m"), h.now);
    let reason = st.models[0]
        .replicas
        .iter()
        .find(|r| *r.id == *waiting[0].0)
        .map(|r| r.reason.to_string())
        .unwrap_or_default();
    assert!(reason.contains("start_alone"), "{reason}");
    // Pack: the second waits for GPU-a rather than starting on the empty GPU-b.
    h.advance(Duration::from_secs(5));
    assert_eq!(h.in_state("m", ReplicaState::Pending).len(), 1);
    let out = h.warm(&ids[0]);
    assert_eq!(spawns(&out), 1, "{out:?}");
    let second = h.spawn_all(&out);
    assert_eq!(on_device(&h, "GPU-a").len(), 2);
    assert!(on_device(&h, "GPU-b").is_empty());
    drop(second);

    // Off: both start at once.
    let toml = format!(
        "{BASE}{}",
        gpu_model(
            "m",
            "30GiB",
            "start_alone = false",
            "min = 2\nmax = 2\nwarm_pool = 0"
        )
    );
    let h = Harness::new(&toml);
    assert_eq!(spawns(&h.log), 2);
}
