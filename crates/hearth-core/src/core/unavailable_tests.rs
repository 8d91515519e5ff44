//! Health `unavailable`: nothing routed or warm, and the model's tries to get a replica ready do
//! not succeed — every port taken by other processes, or starts that fail (an account that
//! cannot execute the command) — until the crash loop trips or a replica gets ready.

use super::harness::{model, Harness, BASE};
use super::*;
use crate::protocol::Health;

fn one_model(ports: &str, scaling: &str) -> Harness {
    let base = BASE.replace("ports = \"30000-30099\"", &format!("ports = \"{ports}\""));
    Harness::new(&format!("{base}{}", model("m", "", scaling)))
}

fn health(h: &Harness) -> (Health, String) {
    let st = h.node.status(Some("m"), h.now);
    let m = &st.models[0];
    (m.health, m.health_reason.clone())
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
fn every_port_held_by_another_process_makes_the_model_unavailable_until_a_replica_is_ready() {
    let mut h = one_model("30000-30002", "min = 1\nmax = 2\nwarm_pool = 0");
    // A first start is under way: nothing has failed, nothing is wrong yet.
    assert_eq!(health(&h).0, Health::Ok);
    // Each port the replica is given is held by someone else: tried in turn, then none left.
    let mut last = h.log.clone();
    for _ in 0..3 {
        let spec = spawn_specs(&last).pop().expect("placed on the next port");
        last = h.send(Event::PortBusy {
            replica: spec.replica,
            port: spec.port,
            holder: "pid 7 (squatter)".into(),
        });
    }
    assert!(spawn_specs(&last).is_empty(), "no port is left: {last:?}");
    let (state, why) = health(&h);
    assert_eq!(state, Health::Unavailable, "{why}");
    assert!(why.contains("no free port in daemon.ports"), "{why}");
    // Ticks change nothing while the ports are held.
    h.run_for(std::time::Duration::from_secs(5));
    assert_eq!(health(&h).0, Health::Unavailable);
    // Once the holds pass, the replica starts and warms: the model is served again.
    let out = h.advance(ports::BUSY_PORT_HOLD);
    let ids = h.spawn_all(&out);
    assert_eq!(ids.len(), 1, "{out:?}");
    h.warm(&ids[0]);
    assert_eq!(health(&h), (Health::Ok, String::new()));
}

#[test]
fn starts_that_keep_failing_make_the_model_unavailable_until_the_crash_loop_trips() {
    let mut h = one_model("30000-30099", "min = 1\nmax = 2\nwarm_pool = 0");
    let why = "hearth cannot execute /srv/private/server: /srv/private is not searchable by hearth";
    let mut actions = h.log.clone();
    let mut seen_backoff = false;
    for n in 1..=model::CRASH_LOOP_FAILURES {
        let spec = loop {
            if let Some(s) = spawn_specs(&actions).pop() {
                break s;
            }
            actions = h.advance(std::time::Duration::from_millis(250));
        };
        // While the retry is being started, nothing serves still.
        if n > 1 {
            assert_eq!(health(&h).0, Health::Unavailable, "retry {n} starting");
        }
        actions = h.send(Event::SpawnFailed {
            replica: spec.replica,
            error: crate::core::SpawnError::Account(why.into()),
        });
        let (state, reason) = health(&h);
        if n < model::CRASH_LOOP_FAILURES {
            assert_eq!(state, Health::Unavailable, "failure {n}: {reason}");
            assert!(reason.contains("not searchable by hearth"), "{reason}");
            seen_backoff |= reason.contains("restart back-off");
        } else {
            assert_eq!(state, Health::CrashLoop, "{reason}");
        }
    }
    assert!(seen_backoff, "the reason says what the replicas wait for");
}

#[test]
fn a_model_that_serves_or_has_not_failed_or_wants_nothing_is_not_unavailable() {
    // Replicas routed, and an extra start failing beside them: the model is served.
    let mut h = one_model("30000-30099", "min = 1\nmax = 3\nwarm_pool = 1");
    let first = h.log.clone();
    let ids = h.spawn_all(&first);
    h.warm(&ids[0]);
    h.send(Event::Exited {
        replica: ids[1].clone(),
        status: crate::core::ExitStatus::Code(1),
    });
    assert_eq!(health(&h).0, Health::Ok, "{:?}", health(&h));
    // The only routed replica fails, its replacement is cold: nothing serves after a failure.
    let out = h.exit(&ids[0], crate::core::harness::KILLED);
    h.spawn_all(&out);
    assert_eq!(health(&h).0, Health::Unavailable);
    // A model at zero that nothing asks for is not unavailable, whatever failed before.
    let mut h = one_model("30000-30099", "min = 0\nmax = 2\nwarm_pool = 0");
    assert!(spawn_specs(&h.log).is_empty());
    h.node
        .models
        .get_mut("m")
        .expect("the model")
        .record_failure(h.now, "an earlier failure");
    assert_eq!(health(&h).0, Health::Ok);
}
