//! Lifecycle tests of the core with virtual time: no sleeps, no processes, no sockets.

use std::time::Duration;

use super::harness::{error_code, model, routed_sets, signals, spawns, Harness, BASE};
use super::*;
use crate::protocol::Health;
use crate::protocol::{ErrorCode, Report, Request, Role};

fn static_pool(min: u32, pool: u32) -> String {
    format!(
        "{BASE}{}",
        model(
            "m",
            "",
            &format!("min = {min}\nmax = 8\nwarm_pool = {pool}")
        )
    )
}

#[test]
fn starts_min_routed_plus_the_pool_and_routes_only_after_warm_up() {
    let mut h = Harness::new(&static_pool(2, 1));
    let first = h.log.clone();
    assert_eq!(spawns(&first), 3, "2 routed + 1 warm are launched at once");
    assert!(
        h.in_state("m", ReplicaState::Routed).is_empty(),
        "nothing routed before warm-up"
    );
    let ids = h.spawn_all(&first);
    // /health answering is not readiness: only the warm-up's answer is.
    let out = h.warm(&ids[0]);
    assert_eq!(routed_sets(&out), vec![vec!["m-1".to_string()]]);
    h.warm(&ids[1]);
    h.warm(&ids[2]);
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 2);
    assert_eq!(h.in_state("m", ReplicaState::Warm).len(), 1);
    let st = h.node.status(Some("m"), h.now);
    assert_eq!((st.models[0].routed, st.models[0].warm), (2, 1));
}

#[test]
fn spawn_spec_carries_placeholders_and_hearth_environment() {
    let mut h = Harness::new(&static_pool(1, 0));
    let spec = h
        .log
        .iter()
        .find_map(|a| match a {
            Action::Spawn(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        spec.command,
        vec!["server", "--port", &spec.port.to_string()]
    );
    let env: std::collections::BTreeMap<_, _> = spec.env.iter().cloned().collect();
    assert_eq!(env["HEARTH_MODEL"], "m");
    assert_eq!(env["HEARTH_REPLICA"], "m-1");
    assert_eq!(env["HEARTH_PORT"], spec.port.to_string());
    assert_eq!(env["HEARTH_SOCKET"], "/tmp/hearth-test.sock");
    assert_eq!(
        env["CUDA_VISIBLE_DEVICES"], "",
        "a CPU-only replica sees no GPU"
    );
    h.spawn_all(&[Action::Spawn(spec)]);
}

#[test]
fn a_dead_routed_replica_is_replaced_by_promotion_at_once_and_the_pool_refills() {
    let mut h = Harness::new(&static_pool(2, 1));
    let first = h.log.clone();
    h.settle(first);
    let routed = h.in_state("m", ReplicaState::Routed);
    let warm = h.in_state("m", ReplicaState::Warm);
    let out = h.exit(&routed[0], crate::core::harness::KILLED);
    // Same event: the warm replica is routed, no tick needed.
    let sets = routed_sets(&out);
    assert_eq!(sets.len(), 1);
    assert!(
        sets[0].contains(&warm[0].0),
        "the warm replica is routed: {sets:?}"
    );
    assert_eq!(h.in_state("m", ReplicaState::Routed).len(), 2);
    // The pool refills after the restart back-off (1 s for a first failure).
    assert_eq!(h.in_state("m", ReplicaState::Pending).len(), 1);
    assert_eq!(spawns(&out), 0, "back-off: not spawned at once");
    let later = h.run_for(Duration::from_millis(1250));
    assert_eq!(spawns(&later), 1);
    h.settle(later);
    assert_eq!(h.in_state("m", ReplicaState::Warm).len(), 1);
}

fn readiness(actions: &[Action]) -> Vec<(ReplicaId, Readiness)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Ready { replica, how, .. } => Some((replica.clone(), *how)),
            _ => None,
        })
        .collect()
}

#[test]
fn time_to_ready_is_the_core_s_figure_and_a_promotion_counts_when_the_replica_was_warm_before() {
    let mut h = Harness::new(&static_pool(2, 1));
    let first = h.log.clone();
    let ids = h.spawn_all(&first);
    assert_eq!(ids.len(), 3);
    h.now = h.now + Duration::from_millis(1500);
    // Warm and routed in the same event: it filled a gap with a cold start, so cold only.
    let out = h.warm(&ids[0]);
    assert_eq!(h.in_state("m", ReplicaState::Routed), [ids[0].clone()]);
    assert_eq!(
        readiness(&out),
        [(ids[0].clone(), Readiness::Cold(Duration::from_millis(1500)))]
    );
    let st = h.node.status(Some("m"), h.now);
    assert_eq!(st.models[0].time_to_ready_ms, Some(1500), "the same figure");
    h.settle(Vec::new());
    for id in &ids[1..] {
        h.warm(id);
    }
    let routed = h.in_state("m", ReplicaState::Routed);
    let warm = h.in_state("m", ReplicaState::Warm);
    assert_eq!((routed.len(), warm.len()), (2, 1));
    // A warm replica routed by a later event is a promotion.
    let out = h.exit(&routed[0], crate::core::harness::KILLED);
    assert_eq!(readiness(&out), [(warm[0].clone(), Readiness::Promoted)]);
}

#[test]
fn warm_up_failures_retry_soon_while_loading_and_slowly_when_wrong() {
    let mut h = Harness::new(&static_pool(1, 0));
    let first = h.log.clone();
    let ids = h.spawn_all(&first);
    let probe_after = |out: &[Action]| {
        out.iter()
            .find_map(|a| match a {
                Action::Probe {
                    kind: ProbeKind::Warmup,
                    after,
                    ..
                } => Some(*after),
                _ => None,
            })
            .unwrap()
    };
    let loading = ProbeOutcome {
        ok: false,
        not_ready: true,
        detail: "connection refused".into(),
    };
    let out = h.send(Event::Probed {
        replica: ids[0].clone(),
        kind: ProbeKind::Warmup,
        outcome: loading,
    });
    assert_eq!(probe_after(&out), Duration::from_millis(50));
    let wrong = ProbeOutcome {
        ok: false,
        not_ready: false,
        detail: "HTTP 500".into(),
    };
    let out = h.send(Event::Probed {
        replica: ids[0].clone(),
        kind: ProbeKind::Warmup,
        outcome: wrong,
    });
    assert_eq!(probe_after(&out), Duration::from_secs(1));
    assert_eq!(h.in_state("m", ReplicaState::Starting), ids);
}

#[test]
fn a_replica_that_never_warms_is_stopped_and_restarts_back_off_longer_each_time() {
    let mut h = Harness::new(&static_pool(1, 0));
    let mut actions = h.log.clone();
    let mut spawn_times = Vec::new();
    for _ in 0..6 {
        // Run until a spawn happens.
        let mut guard = 0;
        while spawns(&actions) == 0 {
            actions = h.advance(Duration::from_millis(250));
            guard += 1;
            assert!(guard < 10_000);
        }
        spawn_times.push(h.now);
        let ids = h.spawn_all(&actions);
        // Never warms: after startup_timeout it is stopped (SIGTERM), then exits.
        let out = h.run_for(Duration::from_millis(10_250));
        let termed = signals(&out, StopSignal::Term);
        assert_eq!(termed, ids, "stopped after startup_timeout");
        actions = h.exit(&ids[0], crate::core::ExitStatus::Code(143));
        assert!(
            h.in_state("m", ReplicaState::Routed).is_empty(),
            "never routed"
        );
    }
    let gaps: Vec<u64> = spawn_times
        .windows(2)
        .map(|w| w[1].since(w[0]).as_millis() as u64 - 10_250)
        .collect();
    // 1 s, 2 s, 4 s, 8 s, 16 s of back-off (to the tick).
    for (g, want) in gaps.iter().zip([1000u64, 2000, 4000, 8000, 16000]) {
        assert!(*g >= want && *g < want + 500, "gaps {gaps:?}");
    }
    let st = h.node.status(Some("m"), h.now);
    assert_eq!(st.models[0].health, Health::CrashLoop);
    assert!(
        st.models[0].health_reason.contains("warm-up did not pass"),
        "{}",
        st.models[0].health_reason
    );
}

#[test]
fn liveness_misses_in_a_row_replace_a_routed_replica() {
    let mut h = Harness::new(&static_pool(1, 1));
    let first = h.log.clone();
    h.settle(first);
    let routed = h.in_state("m", ReplicaState::Routed)[0].clone();
    let warm = h.in_state("m", ReplicaState::Warm)[0].clone();
    let miss = ProbeOutcome {
        ok: false,
        not_ready: true,
        detail: "no answer".into(),
    };
    for i in 0..3 {
        let out = h.run_for(Duration::from_secs(1));
        let probed = out.iter().any(|a| matches!(a, Action::Probe { replica, kind: ProbeKind::Liveness, .. } if *replica == routed));
        assert!(probed, "a liveness probe every interval ({i})");
        let out = h.send(Event::Probed {
            replica: routed.clone(),
            kind: ProbeKind::Liveness,
            outcome: miss.clone(),
        });
        if i < 2 {
            assert!(
                signals(&out, StopSignal::Term).is_empty(),
                "one miss is not a failure"
            );
        } else {
            assert_eq!(signals(&out, StopSignal::Term), vec![routed.clone()]);
            assert_eq!(
                routed_sets(&out),
                vec![vec![warm.0.clone()]],
                "the warm one takes over at once"
            );
        }
    }
}

#[test]
fn a_warm_replica_failing_its_recheck_is_not_promoted() {
    let mut h = Harness::new(&static_pool(1, 1));
    let first = h.log.clone();
    h.settle(first);
    let warm = h.in_state("m", ReplicaState::Warm)[0].clone();
    let out = h.run_for(Duration::from_secs(61));
    assert!(out.iter().any(
        |a| matches!(a, Action::Probe { replica, kind: ProbeKind::Recheck, .. } if *replica == warm)
    ));
    let bad = ProbeOutcome {
        ok: false,
        not_ready: false,
        detail: "HTTP 500".into(),
    };
    h.send(Event::Probed {
        replica: warm.clone(),
        kind: ProbeKind::Recheck,
        outcome: bad,
    });
    let routed = h.in_state("m", ReplicaState::Routed)[0].clone();
    let out = h.exit(&routed, crate::core::ExitStatus::Code(1));
    assert!(
        routed_sets(&out).iter().all(|s| !s.contains(&warm.0)),
        "a suspect replica gets no traffic"
    );
}

#[test]
fn drain_unroutes_waits_for_in_flight_work_then_stops() {
    let mut h = Harness::new(&static_pool(2, 0));
    let first = h.log.clone();
    h.settle(first);
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    let out = h.ask(
        Peer::trusted(),
        Request::Drain {
            replica: Some(r.0.clone()),
            model: None,
            // At min: only forced does it drain before a replacement is routed.
            force: true,
        },
    );
    assert!(out.is_ok(), "{out:?}");
    let drained_sets = routed_sets(&h.log);
    assert!(
        !drained_sets.last().unwrap().contains(&r.0),
        "unrouted first"
    );
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
    h.report("m", Some(&r.0), 0.0, 0, 3);
    assert_eq!(
        h.node.held.replicas()[&r].state,
        ReplicaState::Draining,
        "work in flight: keep waiting"
    );
    let before = h.log.len();
    h.report("m", Some(&r.0), 0.0, 0, 0);
    assert_eq!(signals(&h.log[before..], StopSignal::Term), vec![r.clone()]);
    // The reconciler replaces it.
    assert_eq!(
        h.in_state("m", ReplicaState::Pending).len()
            + h.in_state("m", ReplicaState::Starting).len(),
        1
    );
    let out = h.exit(&r, crate::core::ExitStatus::Code(0));
    assert!(!h.node.held.replicas().contains_key(&r));
    assert_eq!(
        h.node.models["m"].failures.len(),
        0,
        "a drained exit is not a failure"
    );
    let _ = out;
}

#[test]
fn drain_gives_up_after_drain_timeout_and_stop_escalates_to_sigkill() {
    let toml = format!(
        "{BASE}{}",
        model("m", "", "min = 1\nmax = 2\ndrain_timeout = \"3s\"")
    );
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    h.ask(
        Peer::trusted(),
        Request::Drain {
            replica: Some(r.0.clone()),
            model: None,
            force: true,
        },
    )
    .expect("the request is answered ok");
    h.report("m", Some(&r.0), 0.0, 0, 2);
    let out = h.run_for(Duration::from_millis(2500));
    assert!(signals(&out, StopSignal::Term).is_empty());
    let out = h.run_for(Duration::from_millis(750));
    assert_eq!(signals(&out, StopSignal::Term), vec![r.clone()]);
    // stop_grace is 5 s: SIGTERM went out at 3 s, SIGKILL is due at 8 s.
    let out = h.run_for(Duration::from_millis(4500));
    assert!(signals(&out, StopSignal::Kill).is_empty());
    let out = h.run_for(Duration::from_millis(500));
    assert_eq!(signals(&out, StopSignal::Kill), vec![r.clone()]);
}

#[test]
fn shutdown_drains_routed_stops_the_rest_and_completes_when_all_exited() {
    let mut h = Harness::new(&static_pool(2, 1));
    let first = h.log.clone();
    h.settle(first);
    let routed = h.in_state("m", ReplicaState::Routed);
    let warm = h.in_state("m", ReplicaState::Warm);
    let out = h.send(Event::Shutdown { immediate: false });
    assert_eq!(
        routed_sets(&out),
        vec![Vec::<String>::new()],
        "everything unrouted"
    );
    assert_eq!(
        signals(&out, StopSignal::Term),
        warm,
        "warm replicas have no work: stopped at once"
    );
    for r in &routed {
        h.report("m", Some(&r.0), 0.0, 0, 0);
    }
    let mut done = false;
    for id in routed.iter().chain(warm.iter()) {
        let out = h.exit(id, crate::core::ExitStatus::Code(0));
        done = out.contains(&Action::ShutdownComplete);
    }
    assert!(done, "complete once the last replica is gone");
    assert!(
        spawns(&h.log[h.log.len() - 3..]) == 0,
        "nothing new during shutdown"
    );
}

#[test]
fn a_second_stop_signal_kills_everything_now() {
    let mut h = Harness::new(&static_pool(2, 1));
    let first = h.log.clone();
    h.settle(first);
    h.send(Event::Shutdown { immediate: false });
    let out = h.send(Event::Shutdown { immediate: true });
    assert_eq!(signals(&out, StopSignal::Kill).len(), 3);
}

#[test]
fn placement_reserves_gpu_memory_and_exposes_uuids() {
    let toml = format!(
        "{BASE}{}",
        model("g", "", "min = 3\nmax = 8").replace("gpus = 0", "gpus = 1\ngpu_memory = \"50GiB\"")
    );
    let mut h = Harness::new(&toml);
    let specs: Vec<SpawnSpec> = h
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Spawn(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        specs.len(),
        2,
        "two devices of 80 GiB hold two 50 GiB replicas"
    );
    let mut uuids: Vec<String> = specs.iter().map(|s| s.gpus[0].clone()).collect();
    uuids.sort();
    assert_eq!(uuids, vec!["GPU-a", "GPU-b"]);
    for s in &specs {
        let env: std::collections::BTreeMap<_, _> = s.env.iter().cloned().collect();
        // By default devices are named by index (in [[gpus.device]] order here), in PCI order.
        let index = if s.gpus[0] == "GPU-a" { "0" } else { "1" };
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], index);
        assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], s.gpus[0]);
    }
    let st = h.node.status(Some("g"), h.now);
    assert_eq!(st.models[0].health, Health::NoCapacity);
    assert!(
        st.models[0]
            .health_reason
            .contains("needs 1 GPU(s) with 50.0GiB free"),
        "{}",
        st.models[0].health_reason
    );
    assert_eq!(st.gpus[0].memory_reserved, 50 << 30);
    // A replica that exits frees its reservation; the pending one takes it.
    h.spawn_all(&specs.iter().cloned().map(Action::Spawn).collect::<Vec<_>>());
    let out = h.exit(&specs[0].replica, crate::core::ExitStatus::Code(1));
    let _ = out;
    let out = h.run_for(Duration::from_millis(1250));
    assert_eq!(spawns(&out), 1);
}

#[test]
fn no_two_live_replicas_share_a_port() {
    let toml = format!("{BASE}{}", model("m", "", "min = 3\nmax = 3"))
        .replace("30000-30099", "30000-30003");
    let mut h = Harness::new(&toml);
    let first = h.log.clone();
    h.settle(first);
    for _ in 0..5 {
        let r = h.in_state("m", ReplicaState::Routed)[0].clone();
        let before = h.log.len();
        h.ask(
            Peer::trusted(),
            Request::Drain {
                replica: Some(r.0.clone()),
                model: None,
                force: true,
            },
        )
        .expect("the request is answered ok");
        h.report("m", Some(&r.0), 0.0, 0, 0);
        // The replacement starts while the old process is still stopping.
        let out = h.log[before..].to_vec();
        assert_eq!(spawns(&out), 1);
        let live: Vec<u16> = h
            .node
            .held
            .replicas()
            .values()
            .filter_map(|r| r.port)
            .collect();
        let mut uniq = live.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), live.len(), "ports {live:?}");
        h.exit(&r, crate::core::ExitStatus::Code(0));
        h.settle(out);
    }
}

#[test]
fn reports_are_authorised_by_role_or_by_process_group() {
    let mut h = Harness::new(&static_pool(1, 0));
    let first = h.log.clone();
    h.settle(first);
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    let pid = h.pid(&r);
    let stranger = Peer {
        uid: 1234,
        pid: Some(77),
        pgid: Some(77),
        replica: None,
        role: Role::None,
    };
    let rep = |replica: Option<&str>| {
        Request::Report(Report {
            model: "m".into(),
            replica: replica.map(String::from),
            oldest_wait_ms: Some(1.0),
            ..Default::default()
        })
    };
    assert_eq!(
        error_code(&h.ask(stranger.clone(), rep(Some(&r.0)))),
        Some(ErrorCode::Forbidden)
    );
    let own = Peer {
        uid: 1234,
        pid: Some(pid + 5),
        pgid: Some(pid),
        replica: None,
        role: Role::None,
    };
    assert!(
        h.ask(own.clone(), rep(Some(&r.0))).is_ok(),
        "a replica reports for itself"
    );
    assert!(
        h.ask(own.clone(), rep(None)).is_ok(),
        "naming no replica means itself"
    );
    assert_eq!(
        h.node.held.replicas()[&r]
            .signal
            .last()
            .unwrap()
            .oldest_wait_ms,
        1.0
    );
    let reader = Peer {
        uid: 1234,
        pid: None,
        pgid: None,
        replica: None,
        role: Role::Reader,
    };
    assert_eq!(
        error_code(&h.ask(reader.clone(), rep(None))),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        error_code(&h.ask(
            reader.clone(),
            Request::Drain {
                replica: Some(r.0.clone()),
                model: None,
                force: false,
            }
        )),
        Some(ErrorCode::Forbidden)
    );
    assert!(h.ask(reader, Request::Status { model: None }).is_ok());
    let reporter = Peer {
        uid: 1234,
        pid: None,
        pgid: None,
        replica: None,
        role: Role::Reporter,
    };
    assert!(
        h.ask(reporter.clone(), rep(None)).is_ok(),
        "model-wide report"
    );
    let unknown = Request::Report(Report {
        model: "nope".into(),
        ..Default::default()
    });
    assert_eq!(
        error_code(&h.ask(reporter.clone(), unknown)),
        Some(ErrorCode::UnknownModel)
    );
    assert_eq!(
        error_code(&h.ask(reporter, rep(Some("m-99")))),
        Some(ErrorCode::UnknownReplica)
    );
}

#[test]
fn status_explains_pending_replicas() {
    let mut h = Harness::new(&static_pool(1, 0));
    let first = h.log.clone();
    let ids = h.spawn_all(&first);
    h.exit(&ids[0], crate::core::ExitStatus::Code(1));
    let st = h.node.status(Some("m"), h.now);
    let r = &st.models[0].replicas[0];
    assert_eq!(r.state, ReplicaState::Pending);
    assert!(r.reason.starts_with("restart back-off"), "{}", r.reason);
    assert!(st.models[0].replicas[0].restarts >= 1);
}
