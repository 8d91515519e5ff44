//! The supersede rule in virtual time: a front door's reports are the model's signal while
//! they are fresh; replicas' own reports, other reporters and scrapes count again after.

use std::time::Duration;

use super::tests::{model, Harness, BASE};
use super::*;
use crate::protocol::{Report, Request, Role};

/// Model `m`: 2 routed, scraped every 250 ms, reports stale after 2 s.
fn config() -> String {
    format!(
        "{BASE}{}",
        model(
            "m",
            "",
            "min = 2\nmax = 4\nwarm_pool = 0\ntarget_wait = \"500ms\"\nstale_after = \"2s\"\n\
             down_stabilization = \"1h\"\n\
             [model.signal]\nscrape = \"http://127.0.0.1:{port}/metrics\"\nformat = \"vllm\"\n\
             interval = \"250ms\"\n"
        )
    )
}

fn running() -> (Harness, Vec<ReplicaId>) {
    let mut h = Harness::new(&config());
    let first = h.log.clone();
    h.settle(first);
    let routed = h.in_state("m", ReplicaState::Routed);
    assert_eq!(routed.len(), 2);
    (h, routed)
}

fn report(replica: Option<&ReplicaId>, in_flight: u64, router: Option<&str>) -> Request {
    Request::Report(Report {
        model: "m".into(),
        replica: replica.map(|r| r.0.clone()),
        oldest_wait_ms: Some(0.0),
        queue_depth: Some(0),
        in_flight: Some(in_flight),
        arrived: None,
        completed: None,
        router: router.map(String::from),
    })
}

/// The replica's own process (its process group).
fn own(h: &Harness, r: &ReplicaId) -> Peer {
    let pid = h.pid(r);
    Peer {
        uid: 1234,
        pid: Some(pid + 1),
        pgid: Some(pid),
        replica: None,
        role: Role::None,
    }
}

fn reporter() -> Peer {
    Peer {
        uid: 1234,
        pid: None,
        pgid: None,
        replica: None,
        role: Role::Reporter,
    }
}

fn last_in_flight(h: &Harness, r: &ReplicaId) -> Option<u64> {
    h.node.replicas[r].signal.last().map(|s| s.in_flight)
}

fn scrapes(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Scrape { .. }))
        .count()
}

#[test]
fn while_a_front_door_reports_the_replicas_own_reports_are_answered_but_not_counted() {
    let (mut h, routed) = running();
    let r = &routed[0];
    let door = Some("hearth route 127.0.0.1:8080");
    assert_eq!(h.request(own(&h, r), report(None, 7, None))["ok"], true);
    assert_eq!(last_in_flight(&h, r), Some(7), "no front door yet: counted");
    assert_eq!(h.request(reporter(), report(Some(r), 2, door))["ok"], true);
    assert_eq!(last_in_flight(&h, r), Some(2));
    // The replica says idle while the router has two requests there: not counted.
    h.now = h.now + Duration::from_millis(100);
    assert_eq!(h.request(own(&h, r), report(None, 0, None))["ok"], true);
    assert_eq!(last_in_flight(&h, r), Some(2));
    // Nor another reporter's, model-wide or per replica.
    assert_eq!(h.request(reporter(), report(None, 50, None))["ok"], true);
    assert_eq!(h.request(reporter(), report(Some(r), 0, None))["ok"], true);
    assert_eq!(last_in_flight(&h, r), Some(2));
    assert!(h.node.models["m"].model_wide.last().is_none());
    let status = h.request(Peer::trusted(), Request::Status { model: None });
    assert_eq!(
        status["status"]["models"][0]["signal"]["router"], "hearth route 127.0.0.1:8080",
        "{status}"
    );
    // Silent for longer than stale_after: the replica's own reports count again.
    h.now = h.now + Duration::from_millis(2100);
    assert_eq!(h.request(own(&h, r), report(None, 3, None))["ok"], true);
    assert_eq!(last_in_flight(&h, r), Some(3));
    let status = h.request(Peer::trusted(), Request::Status { model: None });
    assert!(
        status["status"]["models"][0]["signal"]
            .get("router")
            .is_none(),
        "{status}"
    );
}

#[test]
fn a_drain_ends_when_the_front_door_says_idle_not_when_the_replica_does() {
    let (mut h, routed) = running();
    let r = routed[0].clone();
    let door = Some("door");
    h.request(reporter(), report(Some(&r), 1, door));
    // Forced: at `min` with no warm pool, a plain drain would first start a replacement.
    let out = h.request(
        Peer::trusted(),
        Request::Drain {
            replica: r.0.clone(),
            force: true,
        },
    );
    assert_eq!(out["ok"], true);
    assert_eq!(h.node.replicas[&r].state, ReplicaState::Draining);
    // The replica thinks it is idle (the request is still on its way): it keeps draining.
    h.now = h.now + Duration::from_millis(100);
    h.request(own(&h, &r), report(None, 0, None));
    assert_eq!(h.node.replicas[&r].state, ReplicaState::Draining);
    // The front door keeps the model's signal alive and still counts the request.
    h.now = h.now + Duration::from_millis(100);
    h.request(reporter(), report(None, 1, door));
    h.request(reporter(), report(Some(&r), 1, door));
    assert_eq!(h.node.replicas[&r].state, ReplicaState::Draining);
    // The answer came back through the front door: the drain ends at once.
    h.now = h.now + Duration::from_millis(100);
    h.request(reporter(), report(Some(&r), 0, door));
    assert_ne!(h.node.replicas[&r].state, ReplicaState::Draining);
}

#[test]
fn scrapes_stop_while_a_front_door_reports_and_resume_after() {
    let (mut h, routed) = running();
    assert_eq!(scrapes(&h.advance(Duration::from_millis(250))), 2);
    for r in &routed {
        h.send(Event::Scraped {
            replica: r.clone(),
            outcome: Ok(ScrapedQueue {
                in_flight: 4,
                ..Default::default()
            }),
        });
        assert_eq!(last_in_flight(&h, r), Some(4));
    }
    let door = Some("door");
    h.request(reporter(), report(None, 0, door));
    // A scrape asked for before is not counted; none is asked for while the door reports.
    let mut asked = 0;
    for _ in 0..8 {
        h.request(reporter(), report(None, 0, door));
        asked += scrapes(&h.advance(Duration::from_millis(250)));
    }
    assert_eq!(asked, 0);
    // The door falls silent: after stale_after, scrapes are asked for and count again.
    let out = h.run_for(Duration::from_millis(2500));
    assert!(scrapes(&out) >= 2, "{out:?}");
    let r = &routed[0];
    h.send(Event::Scraped {
        replica: r.clone(),
        outcome: Ok(ScrapedQueue {
            in_flight: 9,
            ..Default::default()
        }),
    });
    assert_eq!(last_in_flight(&h, r), Some(9));
}

#[test]
fn a_scrape_in_flight_when_the_door_begins_is_not_counted() {
    let (mut h, routed) = running();
    assert_eq!(scrapes(&h.advance(Duration::from_millis(250))), 2);
    let r = &routed[0];
    h.request(reporter(), report(Some(r), 1, Some("door")));
    h.send(Event::Scraped {
        replica: r.clone(),
        outcome: Ok(ScrapedQueue {
            in_flight: 0,
            ..Default::default()
        }),
    });
    assert_eq!(last_in_flight(&h, r), Some(1));
}

#[test]
fn only_reporters_may_speak_as_a_front_door_and_names_are_bounded() {
    let (mut h, routed) = running();
    let r = &routed[0];
    let a = h.request(own(&h, r), report(None, 0, Some("door")));
    assert_eq!(a["error"], "forbidden", "{a}");
    for bad in [String::new(), "x".repeat(129), "a\nb".into()] {
        let a = h.request(reporter(), report(None, 0, Some(&bad)));
        assert_eq!(a["error"], "bad_request", "{bad:?}: {a}");
    }
    assert!(h.node.models["m"].router.is_none(), "nothing changed");
}

#[test]
fn protocol_1_reporters_without_router_work_as_before() {
    let (mut h, routed) = running();
    let r = &routed[0];
    h.request(reporter(), report(Some(r), 5, None));
    assert_eq!(last_in_flight(&h, r), Some(5));
    h.request(reporter(), report(None, 6, None));
    assert_eq!(h.node.models["m"].model_wide.last().unwrap().in_flight, 6);
    let line = r#"{"op":"report","model":"m","oldest_wait_ms":1,"queue_depth":1}"#;
    let req = crate::protocol::parse_request(line).unwrap();
    assert_eq!(h.request(reporter(), req)["ok"], true);
}
