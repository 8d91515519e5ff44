//! The supersede rule in virtual time: front doors' reports are the model's signal while they
//! are fresh, several combined; replicas' own reports, other reporters and scrapes count again
//! after.

use std::time::Duration;

use super::harness::{error_code, model, Harness, BASE};
use super::*;
use crate::protocol::{ErrorCode, Report, Request, Response, Role};

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
    h.node.held.replicas()[r].signal.last().map(|s| s.in_flight)
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
    assert!(h.ask(own(&h, r), report(None, 7, None)).is_ok());
    assert_eq!(last_in_flight(&h, r), Some(7), "no front door yet: counted");
    assert!(h.ask(reporter(), report(Some(r), 2, door)).is_ok());
    assert_eq!(last_in_flight(&h, r), Some(2));
    // The replica says idle while the router has two requests there: not counted, and the
    // answer says which front door holds the signal.
    h.now = h.now + Duration::from_millis(100);
    let a = h.ask(own(&h, r), report(None, 0, None));
    assert_eq!(
        a,
        Ok(Response::Superseded {
            superseded_by: vec!["hearth route 127.0.0.1:8080".into()]
        })
    );
    assert_eq!(last_in_flight(&h, r), Some(2));
    // Nor another reporter's, model-wide or per replica.
    assert!(h.ask(reporter(), report(None, 50, None)).is_ok());
    assert!(h.ask(reporter(), report(Some(r), 0, None)).is_ok());
    assert_eq!(last_in_flight(&h, r), Some(2));
    assert!(h.node.models["m"].model_wide.last().is_none());
    let status = h.status();
    assert_eq!(
        status.models[0].signal.router.as_deref(),
        Some("hearth route 127.0.0.1:8080"),
    );
    // Silent for longer than stale_after: the replica's own reports count again.
    h.now = h.now + Duration::from_millis(2100);
    assert!(h.ask(own(&h, r), report(None, 3, None)).is_ok());
    assert_eq!(last_in_flight(&h, r), Some(3));
    assert_eq!(h.status().models[0].signal.router, None);
}

#[test]
fn a_drain_ends_when_the_front_door_says_idle_not_when_the_replica_does() {
    let (mut h, routed) = running();
    let r = routed[0].clone();
    let door = Some("door");
    h.ask(reporter(), report(Some(&r), 1, door))
        .expect("the request is answered ok");
    // Forced: at `min` with no warm pool, a plain drain would first start a replacement.
    let out = h.ask(
        Peer::trusted(),
        Request::Drain {
            replica: Some(r.0.clone()),
            model: None,
            force: true,
        },
    );
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
    // The replica thinks it is idle (the request is still on its way): it keeps draining.
    h.now = h.now + Duration::from_millis(100);
    h.ask(own(&h, &r), report(None, 0, None))
        .expect("the request is answered ok");
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
    // The front door keeps the model's signal alive and still counts the request.
    h.now = h.now + Duration::from_millis(100);
    h.ask(reporter(), report(None, 1, door))
        .expect("the request is answered ok");
    h.ask(reporter(), report(Some(&r), 1, door))
        .expect("the request is answered ok");
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
    // The answer came back through the front door: the drain ends at once.
    h.now = h.now + Duration::from_millis(100);
    h.ask(reporter(), report(Some(&r), 0, door))
        .expect("the request is answered ok");
    assert_ne!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
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
    h.ask(reporter(), report(None, 0, door))
        .expect("the request is answered ok");
    // A scrape asked for before is not counted; none is asked for while the door reports.
    let mut asked = 0;
    for _ in 0..8 {
        h.ask(reporter(), report(None, 0, door))
            .expect("the request is answered ok");
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
    h.ask(reporter(), report(Some(r), 1, Some("door")))
        .expect("the request is answered ok");
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
    let a = h.ask(own(&h, r), report(None, 0, Some("door")));
    assert_eq!(error_code(&a), Some(ErrorCode::Forbidden), "{a:?}");
    for bad in [String::new(), "x".repeat(129), "a\nb".into()] {
        let a = h.ask(reporter(), report(None, 0, Some(&bad)));
        assert_eq!(
            error_code(&a),
            Some(ErrorCode::BadRequest),
            "{bad:?}: {a:?}"
        );
    }
    assert!(h.node.models["m"].front_doors.is_empty(), "nothing changed");
}

#[test]
fn protocol_1_reporters_without_router_work_as_before() {
    let (mut h, routed) = running();
    let r = &routed[0];
    h.ask(reporter(), report(Some(r), 5, None))
        .expect("the request is answered ok");
    assert_eq!(last_in_flight(&h, r), Some(5));
    h.ask(reporter(), report(None, 6, None))
        .expect("the request is answered ok");
    assert_eq!(h.node.models["m"].model_wide.last().unwrap().in_flight, 6);
    let line = r#"{"op":"report","model":"m","oldest_wait_ms":1,"queue_depth":1}"#;
    let req = crate::protocol::parse_request(line).unwrap();
    assert!(h.ask(reporter(), req).is_ok());
}

/// A front door's report with counters: model-wide (depth, wait) or for a replica (in flight).
fn door_report(
    door: &str,
    replica: Option<&ReplicaId>,
    wait_ms: f64,
    depth: u64,
    in_flight: u64,
    arrived: u64,
) -> Request {
    Request::Report(Report {
        model: "m".into(),
        replica: replica.map(|r| r.0.clone()),
        oldest_wait_ms: Some(wait_ms),
        queue_depth: Some(depth),
        in_flight: Some(in_flight),
        arrived: Some(arrived),
        completed: Some(arrived.saturating_sub(in_flight)),
        router: Some(door.into()),
    })
}

fn front_door_lines(h: &Harness) -> usize {
    h.log
        .iter()
        .filter(|a| matches!(a, Action::Log { message, .. } if message.contains("front door")))
        .count()
}

#[test]
fn two_front_doors_combine_max_wait_and_summed_depth_and_keep_their_rates() {
    let (mut h, _) = running();
    // Two doors on one model, 100 ms apart each, each taking 10 requests a second: before,
    // every report from the other door switched the signal and cleared the rate history.
    for i in 0..120u64 {
        h.now = h.now + Duration::from_millis(50);
        let (door, wait, depth) = if i % 2 == 0 {
            ("door-a", 300.0, 2)
        } else {
            ("door-b", 100.0, 3)
        };
        let a = h.ask(
            reporter(),
            door_report(door, None, wait, depth, depth, i / 2),
        );
        assert!(a.is_ok(), "{a:?}");
    }
    let s = h.node.model_signal("m", h.now).unwrap();
    assert_eq!(
        (s.oldest_wait_ms, s.queue_depth, s.in_flight),
        (300.0, 5, 5)
    );
    let rate = s.arrival_rate.expect("rates survive a second front door");
    assert!((rate - 20.0).abs() < 1.0, "{rate}/s: both doors' 10/s");
    let signal = h.status().models[0].signal.clone();
    assert_eq!(signal.routers, ["door-a", "door-b"]);
    assert_eq!(signal.router.as_deref(), Some("door-a"));
    assert!(front_door_lines(&h) <= 2, "{} lines", front_door_lines(&h));
}

#[test]
fn a_reporter_alternating_router_names_costs_a_line_per_ten_seconds() {
    let (mut h, _) = running();
    // 20,000 reports over 20 s, alternating names (the probe's 3,071 lines).
    for i in 0..20_000u64 {
        h.now = h.now + Duration::from_millis(1);
        let door = if i % 2 == 0 { "x" } else { "y" };
        h.ask(reporter(), door_report(door, None, 0.0, 0, 0, i))
            .expect("the request is answered ok");
        if i % 250 == 0 {
            h.send(Event::Tick);
        }
    }
    let lines = front_door_lines(&h);
    assert!((1..=3).contains(&lines), "{lines} lines");
}

#[test]
fn a_front_door_that_restarts_leaves_no_gap_and_the_other_door_counts_on() {
    let (mut h, _) = running();
    let mut seen_signal = 0;
    for i in 0..60u64 {
        h.now = h.now + Duration::from_millis(100);
        // door-a restarts at 3 s: silent for a second, then its counters start from zero.
        let a_arrived = if i < 30 { 1000 + i } else { i - 40 };
        if !(30..40).contains(&i) {
            h.ask(
                reporter(),
                door_report("door-a", None, 50.0, 1, 1, a_arrived),
            )
            .expect("the request is answered ok");
        }
        h.ask(reporter(), door_report("door-b", None, 20.0, 1, 1, i))
            .expect("the request is answered ok");
        // Every moment has a fresh combined signal, and nobody else's reports count.
        if h.node.model_signal("m", h.now).is_some() {
            seen_signal += 1;
        }
        let own = own_of_first(&h);
        assert!(
            matches!(
                h.ask(own, report(None, 9, None)),
                Ok(Response::Superseded { .. })
            ),
            "the front doors hold the signal throughout"
        );
    }
    assert_eq!(seen_signal, 60);
    // door-b's 10/s and door-a's, less the second it was down (about 18/s): its restart, a
    // counter from zero, subtracted nothing.
    let rate = h
        .node
        .model_signal("m", h.now)
        .unwrap()
        .arrival_rate
        .unwrap();
    assert!((16.0..20.5).contains(&rate), "{rate}/s");
}

fn own_of_first(h: &Harness) -> Peer {
    let r = h.in_state("m", ReplicaState::Routed)[0].clone();
    own(h, &r)
}

#[test]
fn a_drain_ends_when_every_front_door_has_its_requests_back() {
    let (mut h, routed) = running();
    let r = routed[0].clone();
    h.ask(reporter(), door_report("door-a", Some(&r), 0.0, 0, 1, 1))
        .expect("the request is answered ok");
    h.ask(reporter(), door_report("door-b", Some(&r), 0.0, 0, 1, 1))
        .expect("the request is answered ok");
    let out = h.ask(
        Peer::trusted(),
        Request::Drain {
            replica: Some(r.0.clone()),
            model: None,
            force: true,
        },
    );
    assert!(out.is_ok(), "{out:?}");
    h.now = h.now + Duration::from_millis(100);
    h.ask(reporter(), door_report("door-a", Some(&r), 0.0, 0, 0, 1))
        .expect("the request is answered ok");
    assert_eq!(
        h.node.held.replicas()[&r].state,
        ReplicaState::Draining,
        "door-b still has a request there"
    );
    h.now = h.now + Duration::from_millis(100);
    h.ask(reporter(), door_report("door-b", Some(&r), 0.0, 0, 0, 1))
        .expect("the request is answered ok");
    assert_ne!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
}

#[test]
fn front_doors_are_bounded_per_model() {
    let (mut h, _) = running();
    for i in 0..crate::core::front_doors::MAX_FRONT_DOORS {
        let a = h.ask(
            reporter(),
            door_report(&format!("d{i}"), None, 0.0, 0, 0, 0),
        );
        assert!(a.is_ok(), "{a:?}");
    }
    let a = h.ask(reporter(), door_report("one-more", None, 0.0, 0, 0, 0));
    assert_eq!(error_code(&a), Some(ErrorCode::Busy), "{a:?}");
    assert_eq!(
        h.node.front_doors("m", h.now).len(),
        crate::core::front_doors::MAX_FRONT_DOORS
    );
    // After stale_after of silence from the others, a new one is taken.
    h.now = h.now + Duration::from_secs(3);
    let a = h.ask(reporter(), door_report("one-more", None, 0.0, 0, 0, 0));
    assert!(a.is_ok(), "{a:?}");
    assert_eq!(h.node.front_doors("m", h.now), ["one-more"]);
}
