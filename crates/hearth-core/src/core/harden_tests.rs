//! Hostile numbers and operator requests at the edges (issue 11): `scale` bounded by the ports,
//! overrides checked wherever they come from, `drain` keeping routed ≥ min, reports refused past
//! their bounds, and answers that quote little of what they were sent.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::harness::{error_code, model, routed_sets, spawns, Harness, BASE};
use super::*;
use crate::config::Config;
use crate::protocol::{
    Answer, ErrorCode, Report, Request, WarmPoolSetting, WatchEvent, WatchedState,
};

fn scale(h: &mut Harness, m: &str, min: Option<u32>, max: Option<u32>) -> Answer {
    h.ask(
        Peer::trusted(),
        Request::Scale {
            model: m.into(),
            min,
            max,
            warm_pool: None,
            reset: false,
        },
    )
}

fn drain(h: &mut Harness, r: &ReplicaId, force: bool) -> Answer {
    h.ask(
        Peer::trusted(),
        Request::Drain {
            replica: Some(r.0.clone()),
            model: None,
            force,
        },
    )
}

/// Two models on 100 ports: `a` (max 8) and `b` (max 1).
fn two_models() -> String {
    format!(
        "{BASE}{}{}",
        model("a", "", "min = 1\nmax = 8"),
        model("b", "", "min = 1\nmax = 1")
    )
}

fn replicas_of(h: &Harness, m: &str) -> usize {
    h.node
        .held
        .replicas()
        .values()
        .filter(|r| r.model == m)
        .count()
}

fn persisted(actions: &[Action]) -> Option<BTreeMap<String, Overrides>> {
    actions.iter().rev().find_map(|a| match a {
        Action::PersistOverrides(o) => Some(o.clone()),
        _ => None,
    })
}

#[test]
fn scale_past_what_the_ports_hold_is_refused_and_creates_nothing() {
    // The case: with two models, u32 sums of max wrapped and `--max 4294967295` was
    // accepted; `--min 100000` then created 99,991 pending replicas.
    let mut h = Harness::new(&two_models());
    let first = h.log.clone();
    h.settle(first);
    let a = scale(&mut h, "a", None, Some(u32::MAX));
    assert_eq!(error_code(&a), Some(ErrorCode::BadRequest), "{a:?}");
    let msg = &a.as_ref().unwrap_err().message;
    assert!(msg.contains("daemon.ports has 100"), "{msg}");
    assert!(msg.contains("at most 99 for this model"), "{msg}");
    let a = scale(&mut h, "a", Some(100_000), None);
    assert_eq!(error_code(&a), Some(ErrorCode::BadRequest), "{a:?}");
    let a = scale(&mut h, "a", Some(u32::MAX), None);
    assert_eq!(error_code(&a), Some(ErrorCode::BadRequest), "{a:?}");
    let a = scale(&mut h, "a", Some(u32::MAX), Some(u32::MAX));
    assert_eq!(error_code(&a), Some(ErrorCode::BadRequest), "{a:?}");
    assert!(replicas_of(&h, "a") <= 8, "{}", replicas_of(&h, "a"));
    assert!(h.node.models["a"].overrides.is_empty());
    // What fits is taken: 99 + b's 1 = 100 ports.
    let a = scale(&mut h, "a", Some(3), Some(99));
    assert!(a.is_ok(), "{a:?}");
    assert_eq!(h.node.models["a"].max(), 99);
    let a = scale(&mut h, "a", None, Some(100));
    assert_eq!(error_code(&a), Some(ErrorCode::BadRequest), "{a:?}");
}

#[test]
fn scale_reset_clears_the_overrides_and_saves_that() {
    let mut h = Harness::new(&two_models());
    let first = h.log.clone();
    h.settle(first);
    let a = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "a".into(),
            min: Some(2),
            max: Some(5),
            warm_pool: Some(WarmPoolSetting::Count(1)),
            reset: false,
        },
    );
    assert!(a.is_ok(), "{a:?}");
    assert_eq!(h.node.models["a"].min(), 2);
    let before = h.log.len();
    let a = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "a".into(),
            min: None,
            max: None,
            warm_pool: None,
            reset: true,
        },
    );
    assert!(a.is_ok(), "{a:?}");
    let m = &h.node.models["a"];
    assert!(m.overrides.is_empty(), "{:?}", m.overrides);
    assert_eq!((m.min(), m.max()), (1, 8), "the file's values again");
    let saved = persisted(&h.log[before..]).expect("the cleared overrides are saved");
    assert!(saved.is_empty(), "{saved:?}");
    // Reset with a value: cleared, then set anew.
    let a = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "a".into(),
            min: None,
            max: Some(4),
            warm_pool: None,
            reset: true,
        },
    );
    assert!(a.is_ok(), "{a:?}");
    let o = &h.node.models["a"].overrides;
    assert_eq!((o.min, o.max, o.warm_pool), (None, Some(4), None));
}

#[test]
fn overrides_are_checked_against_the_configuration_they_meet() {
    let config = Config::parse(&two_models(), Path::new("t.toml")).unwrap();
    let one = |o: Overrides| BTreeMap::from([("a".to_string(), o)]);
    let ok = |o: Overrides| check_overrides(&config, &one(o));
    assert!(ok(Overrides {
        min: Some(2),
        max: Some(99),
        warm_pool: None,
        ..Default::default()
    })
    .is_ok());
    for bad in [
        Overrides {
            min: None,
            max: Some(u32::MAX),
            warm_pool: None,
            ..Default::default()
        },
        Overrides {
            min: Some(u32::MAX),
            max: None,
            warm_pool: None,
            ..Default::default()
        },
        Overrides {
            min: Some(5),
            max: Some(4),
            warm_pool: None,
            ..Default::default()
        },
        Overrides {
            min: None,
            max: Some(0),
            warm_pool: None,
            ..Default::default()
        },
        Overrides {
            min: None,
            max: Some(100),
            warm_pool: None,
            ..Default::default()
        },
    ] {
        let e = ok(bad.clone()).unwrap_err().to_string();
        assert!(
            e.contains("model a") || e.contains("add up"),
            "{bad:?}: {e}"
        );
    }
    // A model the file no longer names: its overrides are no one's.
    let stray = BTreeMap::from([(
        "gone".to_string(),
        Overrides {
            min: None,
            max: Some(u32::MAX),
            warm_pool: None,
            ..Default::default()
        },
    )]);
    assert!(check_overrides(&config, &stray).is_ok());
    // A node handed overrides that fail the check runs the file's values.
    let hostile = one(Overrides {
        min: Some(100_000),
        max: Some(u32::MAX),
        warm_pool: None,
        ..Default::default()
    });
    let devices = GpuDevice::declared(&config.gpus);
    let mut node = Node::new(config, devices, hostile, Time::ZERO);
    node.handle(Event::Tick, Time::ZERO);
    assert_eq!(node.models["a"].max(), 8);
    assert!(node.held.replicas().len() <= 9);
}

#[test]
fn a_reload_the_overrides_do_not_fit_is_refused_and_fits_once_they_are_cleared() {
    let mut h = Harness::new(&two_models());
    let first = h.log.clone();
    h.settle(first);
    assert!(scale(&mut h, "a", None, Some(60)).is_ok());
    let narrow = two_models().replace("30000-30099", "30000-30039");
    let out = h.reload(&narrow);
    let refused = out
        .iter()
        .any(|a| matches!(a, Action::ReloadDone { applied: None, .. }));
    assert!(refused, "{out:?}");
    let said = out.iter().any(|a| {
        matches!(a, Action::Log { level: LogLevel::Error, message, .. }
            if message.contains("max 60 is more than daemon.ports holds (40)")
                && message.contains("--reset"))
    });
    assert!(said, "{out:?}");
    assert_eq!(
        h.node.config().daemon.ports.last,
        30099,
        "the running file stays"
    );
    let a = h.ask(
        Peer::trusted(),
        Request::Scale {
            model: "a".into(),
            min: None,
            max: None,
            warm_pool: None,
            reset: true,
        },
    );
    assert!(a.is_ok(), "{a:?}");
    let out = h.reload(&narrow);
    assert!(
        out.iter().any(|a| matches!(
            a,
            Action::ReloadDone {
                applied: Some(_),
                ..
            }
        )),
        "{out:?}"
    );
    assert_eq!(h.node.config().daemon.ports.last, 30039);
}

/// One model on two static devices, whole devices each.
fn whole_devices(min: u32, max: u32, pool: u32) -> String {
    format!(
        "{BASE}{}",
        model(
            "m",
            "",
            &format!("min = {min}\nmax = {max}\nwarm_pool = {pool}")
        )
        .replace("gpus = 0", "gpus = 1")
    )
}

fn routed(h: &Harness) -> Vec<ReplicaId> {
    h.in_state("m", ReplicaState::Routed)
}

#[test]
fn drain_at_min_promotes_a_warm_replica_first() {
    let mut h = Harness::new(&format!(
        "{BASE}{}",
        model("m", "", "min = 1\nmax = 4\nwarm_pool = 1")
    ));
    let first = h.log.clone();
    h.settle(first);
    let r = routed(&h)[0].clone();
    let warm = h.in_state("m", ReplicaState::Warm)[0].clone();
    let before = h.log.len();
    assert!(drain(&mut h, &r, false).is_ok());
    // In the same event: the warm one routed, then the drained one unrouted; never empty.
    let sets = routed_sets(&h.log[before..]);
    assert!(!sets.is_empty());
    assert!(sets.iter().all(|s| !s.is_empty()), "{sets:?}");
    assert_eq!(sets.last().unwrap(), &vec![warm.0.clone()]);
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
}

#[test]
fn drain_at_min_without_a_warm_replica_starts_one_and_drains_once_it_is_routed() {
    let mut h = Harness::new(&format!("{BASE}{}", model("m", "", "min = 1\nmax = 4")));
    let first = h.log.clone();
    h.settle(first);
    let r = routed(&h)[0].clone();
    let before = h.log.len();
    let a = drain(&mut h, &r, false);
    assert!(a.is_ok(), "{a:?}");
    let asked = h.log[before..].to_vec();
    assert_eq!(spawns(&asked), 1, "a replacement is started");
    assert_eq!(
        h.node.held.replicas()[&r].state,
        ReplicaState::Routed,
        "still serving"
    );
    assert!(h.node.held.replicas()[&r].reason.contains("drain asked"));
    // It keeps serving until the replacement passed its warm-up and is routed in its place.
    h.run_for(Duration::from_secs(2));
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Routed);
    let before = h.log.len();
    h.settle(asked);
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
    let sets = routed_sets(&h.log[before..]);
    assert!(sets.iter().all(|s| !s.is_empty()), "{sets:?}");
    assert_eq!(routed(&h).len(), 1);
    assert_ne!(routed(&h)[0], r);
}

#[test]
fn drain_at_min_with_no_room_for_a_replacement_is_refused_unless_forced() {
    // Two devices, two replicas on whole devices: nowhere to start a third.
    let mut h = Harness::new(&whole_devices(2, 4, 0));
    let first = h.log.clone();
    h.settle(first);
    assert_eq!(routed(&h).len(), 2);
    let r = routed(&h)[0].clone();
    let a = drain(&mut h, &r, false);
    assert_eq!(error_code(&a), Some(ErrorCode::BadRequest), "{a:?}");
    let msg = &a.as_ref().unwrap_err().message;
    assert!(
        msg.contains("below min 2") && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(
        h.node.held.replicas()[&r].state,
        ReplicaState::Routed,
        "nothing changed"
    );
    assert!(!h.node.held.replicas()[&r].drain_asked);
    let a = drain(&mut h, &r, true);
    assert!(a.is_ok(), "{a:?}");
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
}

#[test]
fn drain_above_min_drains_at_once() {
    let mut h = Harness::new(&format!("{BASE}{}", model("m", "", "min = 1\nmax = 4")));
    let first = h.log.clone();
    h.settle(first);
    assert!(scale(&mut h, "m", Some(2), None).is_ok());
    let out = h.log.clone();
    h.settle(out);
    assert_eq!(routed(&h).len(), 2);
    // Back to min 1: the two routed stay (desired is clamped, not reset).
    assert!(scale(&mut h, "m", Some(1), None).is_ok());
    assert_eq!(routed(&h).len(), 2);
    let r = routed(&h)[0].clone();
    assert!(drain(&mut h, &r, false).is_ok());
    assert_eq!(h.node.held.replicas()[&r].state, ReplicaState::Draining);
}

#[test]
fn reports_with_absurd_numbers_are_refused_and_change_nothing() {
    let mut h = Harness::new(&format!("{BASE}{}", model("m", "", "min = 1\nmax = 4")));
    let first = h.log.clone();
    h.settle(first);
    let rep = |f: &dyn Fn(&mut Report)| {
        let mut r = Report {
            model: "m".into(),
            ..Default::default()
        };
        f(&mut r);
        Request::Report(r)
    };
    let cases: Vec<(&str, Request)> = vec![
        ("oldest_wait_ms", rep(&|r| r.oldest_wait_ms = Some(1e19))),
        (
            "oldest_wait_ms",
            rep(&|r| r.oldest_wait_ms = Some(f64::MAX)),
        ),
        ("in_flight", rep(&|r| r.in_flight = Some(4_294_967_296))),
        ("queue_depth", rep(&|r| r.queue_depth = Some(u64::MAX))),
        ("arrived", rep(&|r| r.arrived = Some(u64::MAX - 1))),
        ("completed", rep(&|r| r.completed = Some(u64::MAX))),
    ];
    for (field, req) in cases {
        let before = h.log.len();
        let a = h.ask(Peer::trusted(), req);
        assert_eq!(
            error_code(&a),
            Some(ErrorCode::BadRequest),
            "{field}: {a:?}"
        );
        assert!(a.unwrap_err().message.contains(field), "{field}");
        assert!(
            h.log[before..].iter().all(|a| !matches!(
                a,
                Action::Spawn(_) | Action::Publish(_) | Action::Signal { .. }
            )),
            "{field}: a refused report changed something"
        );
    }
    assert!(h.node.models["m"].model_wide.last().is_none());
    // At the bounds: taken.
    let a = h.ask(
        Peer::trusted(),
        rep(&|r| {
            r.oldest_wait_ms = Some(crate::protocol::MAX_WAIT_MS);
            r.in_flight = Some(crate::protocol::MAX_QUEUE);
            r.arrived = Some(crate::protocol::MAX_COUNTER);
        }),
    );
    assert!(a.is_ok(), "{a:?}");
}

#[test]
fn scraped_numbers_are_clamped_to_the_report_bounds() {
    let q = ScrapedQueue {
        queue_depth: u64::MAX,
        in_flight: u64::MAX,
        oldest_wait_ms: Some(f64::INFINITY),
        queue_time: Some(QueueTime {
            total_ms: f64::NAN,
            count: u64::MAX,
        }),
        arrived: Some(u64::MAX),
        completed: Some(1),
    }
    .bounded();
    assert_eq!(q.queue_depth, crate::protocol::MAX_QUEUE);
    assert_eq!(q.in_flight, crate::protocol::MAX_QUEUE);
    assert_eq!(q.oldest_wait_ms, None);
    assert_eq!(q.queue_time, None);
    assert_eq!(q.arrived, Some(crate::protocol::MAX_COUNTER));
    assert_eq!(q.completed, Some(1));
    let q = ScrapedQueue {
        oldest_wait_ms: Some(1e300),
        ..Default::default()
    }
    .bounded();
    assert_eq!(q.oldest_wait_ms, Some(crate::protocol::MAX_WAIT_MS));
}

#[test]
fn answers_quote_little_of_what_they_were_sent() {
    // What the socket writes is what is measured, so these are read as JSON.
    let mut h = Harness::new(&format!("{BASE}{}", model("m", "", "min = 1\nmax = 4")));
    let long = "x".repeat(60_000);
    let answers = [
        h.request(
            Peer::trusted(),
            Request::Status {
                model: Some(long.clone()),
            },
        ),
        h.request(
            Peer::trusted(),
            Request::Drain {
                replica: Some(long.clone()),
                model: None,
                force: false,
            },
        ),
        h.request(Peer::trusted(), Request::Uncordon { gpu: long.clone() }),
        h.request(
            Peer::trusted(),
            Request::Cordon {
                gpu: "0".into(),
                reason: Some(long.clone()),
                evacuate: false,
            },
        ),
    ];
    for a in answers {
        assert_eq!(a["ok"], false, "{a}");
        assert!(a.to_string().len() < 512, "{}", a.to_string().len());
    }
    assert!(h.node.held.gpus().views().iter().all(|g| !g.cordoned));
}

/// `model` on 2,000 ports, `min = 2`, `max = 1000`; `extra` as `model` takes it.
fn a_thousand(gpus: &str) -> String {
    BASE.replace("30000-30099", "30000-31999")
        + &model("a", "", "min = 2\nmax = 1000").replace("gpus = 0", gpus)
}

/// Scales `a` to `n` and ticks (100 virtual ms apart), answering every spawn with a pid and
/// never warming, until the model has `n` replicas; the ticks it took.
fn grow_to(h: &mut Harness, n: u32) -> usize {
    let mark = h.log.len();
    assert!(scale(h, "a", Some(n), Some(n)).is_ok());
    let mut out = h.log.split_off(mark);
    for ticks in 0..200 {
        // Each `Spawned` may ask for more.
        while spawns(&out) > 0 {
            let mark = h.log.len();
            h.spawn_all(&out);
            out = h.log.split_off(mark);
        }
        if replicas_of(h, "a") >= n as usize {
            return ticks;
        }
        out = h.advance(Duration::from_millis(100));
    }
    panic!("{} replicas, not {n}", replicas_of(h, "a"));
}

/// Scales `a` to `to` and ticks until it has `to` replicas, checking that no event (the
/// `scale` included) stops more than a batch of them or starts one; the events it took.
fn shrink_to(h: &mut Harness, to: u32) -> usize {
    let batch = super::reconcile::STOPS_PER_EVENT as usize;
    let mark = h.log.len();
    assert!(scale(h, "a", Some(to), Some(to)).is_ok());
    // Each event's actions, in turn; a stopped process exits at once (an event of its own),
    // a pending replica is gone with the event that stopped it.
    let mut events = vec![h.log.split_off(mark)];
    let mut handled = 0;
    for _ in 0..200 {
        while let Some(out) = events.pop() {
            handled += 1;
            assert_eq!(spawns(&out), 0, "a surplus replica was started");
            let term = super::harness::signals(&out, StopSignal::Term);
            assert!(term.len() <= batch, "{} stopped by one event", term.len());
            // Pending ones stopped, and the one process that exited.
            let gone = out
                .iter()
                .filter(|a| {
                    matches!(a, Action::Publish(WatchEvent::Replica { state, .. })
                        if *state == WatchedState::GONE)
                })
                .count();
            assert!(gone <= batch + 1, "{gone} gone with one event");
            for id in term {
                events.push(h.exit(&id, crate::core::ExitStatus::Code(0)));
            }
        }
        if replicas_of(h, "a") == to as usize {
            return handled;
        }
        events.push(h.advance(Duration::from_millis(100)));
    }
    panic!("{} replicas, not {to}", replicas_of(h, "a"));
}

#[test]
fn a_scale_from_a_thousand_to_two_stops_the_surplus_over_several_events() {
    let batch = super::reconcile::STOPS_PER_EVENT as usize;
    // Pending: one GPU each on two devices, so 998 of a thousand wait for a GPU.
    let mut h = Harness::new(&a_thousand("gpus = 1"));
    let first = h.log.clone();
    h.settle(first);
    assert_eq!(h.in_state("a", ReplicaState::Routed).len(), 2);
    let events = grow_to(&mut h, 1000);
    assert!(events > 20, "a thousand created in {events} events");
    assert_eq!(h.in_state("a", ReplicaState::Pending).len(), 998);
    let events = shrink_to(&mut h, 2);
    assert!(events >= 998 / batch, "998 stopped in {events} events");
    // Exactly what was asked for, and the routed ones never touched.
    h.run_for(Duration::from_secs(2));
    assert_eq!(replicas_of(&h, "a"), 2);
    assert_eq!(h.in_state("a", ReplicaState::Routed).len(), 2);

    // Starting: processes spawned, never warm; each stop is a SIGTERM, then an exit.
    let mut h = Harness::new(&a_thousand("gpus = 0"));
    let first = h.log.clone();
    h.settle(first);
    grow_to(&mut h, 300);
    let starting = h.in_state("a", ReplicaState::Starting).len();
    assert!(starting > 200, "{starting} starting");
    let events = shrink_to(&mut h, 2);
    assert!(
        events > starting / batch,
        "{starting} stopped in {events} events"
    );
    h.run_for(Duration::from_secs(2));
    assert_eq!(replicas_of(&h, "a"), 2);
    assert_eq!(h.in_state("a", ReplicaState::Routed).len(), 2);
}
