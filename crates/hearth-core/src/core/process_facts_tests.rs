//! The core's side of containment: ports found busy before a spawn, replicas known by their
//! cgroup on the socket, usage samples in status, warm-ups that must prove their listener.

use std::time::Duration;

use super::harness::{error_code, model, Harness, BASE};
use super::*;
use crate::protocol::{ErrorCode, Report, Request, Role};

fn one_model(min: u32) -> Harness {
    let toml = format!(
        "{BASE}{}",
        model("m", "", &format!("min = {min}\nmax = 4\nwarm_pool = 0"))
    );
    Harness::new(&toml)
}

fn spawn_specs(actions: &[Action]) -> Vec<SpawnSpec> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Spawn(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_busy_port_is_passed_over_and_the_replica_starts_on_the_next_without_a_failure() {
    let mut h = one_model(1);
    let first = spawn_specs(&h.log);
    assert_eq!(first.len(), 1);
    let (id, port) = (first[0].replica.clone(), first[0].port);
    let out = h.send(Event::PortBusy {
        replica: id.clone(),
        port,
        holder: "pid 4242 (toy)".into(),
    });
    // Placed again in the same event, on another port, with no back-off.
    let again = spawn_specs(&out);
    assert_eq!(again.len(), 1, "{out:?}");
    assert_eq!(again[0].replica, id, "the same replica, not a new one");
    assert_ne!(again[0].port, port);
    assert!(h.node.models["m"].failures.is_empty(), "not a failure");
    assert!(h.node.held.ports().busy().any(|p| p == port));
    let logged = out.iter().any(|a| {
        matches!(a, Action::Log { message, .. } if message.contains(&format!("port {port} is in use by pid 4242")))
    });
    assert!(logged, "{out:?}");
    // The port is not handed out again while held, even when every other is taken...
    for _ in 0..200 {
        if let Some(p) = h.node.held.ports_mut().take() {
            assert_ne!(p, port);
        }
    }
    // ...and comes back once the hold has passed.
    let mut h = one_model(1);
    let s = spawn_specs(&h.log)[0].clone();
    h.send(Event::PortBusy {
        replica: s.replica.clone(),
        port: s.port,
        holder: "someone".into(),
    });
    h.advance(ports::BUSY_PORT_HOLD + Duration::from_secs(1));
    let mut seen = false;
    for _ in 0..200 {
        if h.node.held.ports_mut().take() == Some(s.port) {
            seen = true;
            break;
        }
    }
    assert!(seen, "the busy port is tried again after its hold");
}

#[test]
fn a_late_or_stale_port_busy_changes_nothing() {
    let mut h = one_model(1);
    let s = spawn_specs(&h.log)[0].clone();
    h.send(Event::Spawned {
        replica: s.replica.clone(),
        pid: 77,
    });
    let out = h.send(Event::PortBusy {
        replica: s.replica.clone(),
        port: s.port,
        holder: "x".into(),
    });
    assert!(spawn_specs(&out).is_empty());
    assert_eq!(
        h.node.held.replicas()[&s.replica].state,
        ReplicaState::Starting
    );
    assert_eq!(h.node.held.replicas()[&s.replica].port, Some(s.port));
    // Another port than the one it holds, or a replica that does not exist.
    let out = h.send(Event::PortBusy {
        replica: s.replica.clone(),
        port: s.port.wrapping_add(1),
        holder: "x".into(),
    });
    assert!(out.iter().all(|a| !matches!(a, Action::Log { .. })));
    h.send(Event::PortBusy {
        replica: ReplicaId("m-99".into()),
        port: 1,
        holder: "x".into(),
    });
    assert!(h.node.held.ports().busy().next().is_none());
}

#[test]
fn a_replica_asked_to_stop_before_its_port_turned_out_busy_is_simply_gone() {
    let mut h = one_model(1);
    let s = spawn_specs(&h.log)[0].clone();
    h.send(Event::Shutdown { immediate: false });
    let out = h.send(Event::PortBusy {
        replica: s.replica.clone(),
        port: s.port,
        holder: "x".into(),
    });
    assert!(!h.node.held.replicas().contains_key(&s.replica));
    assert!(out.contains(&Action::ShutdownComplete), "{out:?}");
    assert!(h
        .node
        .held
        .gpus()
        .views()
        .iter()
        .all(|g| g.replicas.is_empty()));
}

#[test]
fn a_process_in_a_replicas_cgroup_reports_for_that_replica_only() {
    let mut h = one_model(2);
    let first = h.log.clone();
    h.settle(first);
    let ids = h.in_state("m", ReplicaState::Routed);
    assert_eq!(ids.len(), 2);
    // A worker that left the process group (setsid) but not the cgroup.
    let worker = Peer {
        uid: 65534,
        pid: Some(9999),
        pgid: Some(9999),
        replica: Some(ids[0].clone()),
        role: Role::None,
    };
    let rep = |replica: Option<&str>| {
        Request::Report(Report {
            model: "m".into(),
            replica: replica.map(String::from),
            oldest_wait_ms: Some(3.0),
            ..Default::default()
        })
    };
    assert!(h.ask(worker.clone(), rep(None)).is_ok());
    assert!(h.ask(worker.clone(), rep(Some(&ids[0].0))).is_ok());
    assert_eq!(
        error_code(&h.ask(worker.clone(), rep(Some(&ids[1].0)))),
        Some(ErrorCode::Forbidden),
        "never for another replica"
    );
    assert_eq!(
        error_code(&h.ask(worker.clone(), Request::Status { model: None })),
        Some(ErrorCode::Forbidden),
        "and nothing else"
    );
    // The cgroup decides over the process group: a peer in another replica's group but in
    // this replica's cgroup is this replica's.
    let pid1 = h.pid(&ids[1]);
    let confused = Peer {
        pgid: Some(pid1),
        ..worker.clone()
    };
    assert_eq!(
        error_code(&h.ask(confused, rep(Some(&ids[1].0)))),
        Some(ErrorCode::Forbidden)
    );
    // A replica that has gone no longer vouches for anyone.
    h.exit(&ids[0], crate::core::ExitStatus::Code(0));
    assert_eq!(
        error_code(&h.ask(worker, rep(None))),
        Some(ErrorCode::Forbidden)
    );
}

#[test]
fn usage_samples_show_in_status_and_unknown_is_null() {
    let mut h = one_model(1);
    let first = h.log.clone();
    h.settle(first);
    let id = h.in_state("m", ReplicaState::Routed)[0].clone();
    let view = |h: &Harness| {
        let st = h.node.status(Some("m"), h.now);
        serde_json::to_value(&st.models[0].replicas[0]).unwrap()
    };
    assert!(view(&h)["rss_bytes"].is_null() && view(&h)["cpu_seconds"].is_null());
    h.send(Event::Usage(vec![
        (
            id.clone(),
            Usage {
                rss_bytes: Some(12 << 20),
                cpu_seconds: Some(1.5),
            },
        ),
        (ReplicaId("m-404".into()), Usage::default()),
    ]));
    let v = view(&h);
    assert_eq!(v["rss_bytes"], 12 << 20);
    assert_eq!(v["cpu_seconds"], 1.5);
}

#[test]
fn warm_ups_and_rechecks_must_prove_their_listener_and_liveness_need_not() {
    let mut h = one_model(1);
    let probes: Vec<_> = {
        let first = h.log.clone();
        let ids = h.spawn_all(&first);
        assert_eq!(ids.len(), 1);
        h.log
            .iter()
            .filter_map(|a| match a {
                Action::Probe { kind, spec, .. } => Some((*kind, spec.verify_owner)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(probes, vec![(ProbeKind::Warmup, true)]);
    let id = h.in_state("m", ReplicaState::Starting)[0].clone();
    // A squatter's answer, as the shell reports it: not warm, and status says why.
    h.send(Event::Probed {
        replica: id.clone(),
        kind: ProbeKind::Warmup,
        outcome: ProbeOutcome {
            ok: false,
            not_ready: false,
            detail: "port 30000 is answered by pid 5 (toy), not by a process of this replica"
                .into(),
        },
    });
    assert_eq!(h.node.held.replicas()[&id].state, ReplicaState::Starting);
    let st = h.node.status(Some("m"), h.now);
    assert!(
        st.models[0].replicas[0]
            .reason
            .contains("not by a process of this replica"),
        "{:?}",
        st.models[0].replicas[0].reason
    );
    assert_eq!(
        h.node
            .probe_spec(&id, ProbeKind::Recheck)
            .map(|s| s.verify_owner),
        Some(true)
    );
    assert_eq!(
        h.node
            .probe_spec(&id, ProbeKind::Liveness)
            .map(|s| s.verify_owner),
        Some(false)
    );
}
