use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use super::*;

const TIMEOUT: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(2);

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}

fn cap(drained: bool) -> Capacity {
    Capacity {
        drained,
        max: 2,
        warm: 0,
        can_start: true,
        asleep: 0,
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ready() -> Answer {
    Answer::Ready {
        weight: 50,
        maxconn: 10,
    }
}

#[test]
fn the_view_of_the_daemon_ages_from_the_start_and_from_each_loss() {
    let t0 = Instant::now();
    let mut f = Fleet::new(1, TIMEOUT, GRACE, t0);
    assert_eq!(f.daemon_gone_for(t0 + ms(300)), Some(ms(300)));
    f.set_daemon(true, t0 + ms(300));
    assert_eq!(f.daemon_gone_for(t0 + ms(5000)), None);
    f.set_daemon(false, t0 + ms(6000));
    // A second loss before a reconnect keeps the first instant.
    f.set_daemon(false, t0 + ms(7000));
    assert_eq!(f.daemon_gone_for(t0 + ms(9000)), Some(ms(3000)));
}

#[test]
fn an_operator_drain_ends_once_every_balancer_was_told_and_a_grace_passed_quiet() {
    let t0 = Instant::now();
    let mut f = Fleet::new(2, TIMEOUT, GRACE, t0);
    // Two balancers poll model 0, one polls model 1.
    for b in [1, 2] {
        f.polled(ip(b), Target::Model(0), &ready(), t0);
    }
    f.polled(ip(3), Target::Model(1), &ready(), t0);
    assert!(!f.draining(0));
    assert!(!f.drain_done(0, None, t0));
    let t1 = t0 + ms(1000);
    f.set_capacity(0, cap(true), t1);
    assert!(f.draining(0) && !f.draining(1));
    // One told; the other not yet: not done, however long it is quiet.
    f.polled(ip(1), Target::Model(0), &Answer::Drain, t1 + ms(100));
    assert!(!f.drain_done(0, None, t1 + ms(10_000)));
    // Both told at t1 + 500; a request at t1 + 1500 (sent before its balancer read the answer).
    f.polled(ip(2), Target::Model(0), &Answer::Drain, t1 + ms(500));
    let last = Some(t1 + ms(1500));
    assert!(!f.drain_done(0, last, t1 + ms(3000)));
    assert!(f.drain_done(0, last, t1 + ms(3500)));
    // Model 1 is no part of it.
    assert!(!f.drain_done(1, None, t1 + ms(3500)));
    // Undrained: answered ready again, and nothing refuses.
    f.set_capacity(0, cap(false), t1 + ms(4000));
    assert!(!f.draining(0));
    assert!(!f.drain_done(0, None, t1 + ms(9000)));
}

#[test]
fn a_drain_without_balancers_waits_only_for_quiet() {
    let t0 = Instant::now();
    let mut f = Fleet::new(1, TIMEOUT, GRACE, t0);
    f.set_capacity(0, cap(true), t0);
    assert!(!f.drain_done(0, None, t0 + ms(1999)));
    assert!(f.drain_done(0, None, t0 + ms(2000)));
}

#[test]
fn a_balancer_that_stopped_polling_holds_a_drain_no_longer_than_seen_for_or_the_timeout() {
    let t0 = Instant::now();
    let long = Fleet::new(1, Duration::from_secs(600), GRACE, t0);
    let mut f = long;
    f.polled(ip(1), Target::Model(0), &ready(), t0);
    f.set_capacity(0, cap(true), t0 + ms(10));
    assert!(!f.drain_done(0, None, t0 + SEEN_FOR - ms(1)));
    assert!(f.drain_done(0, None, t0 + SEEN_FOR + GRACE));
    let mut g = Fleet::new(1, TIMEOUT, GRACE, t0);
    g.polled(ip(1), Target::Model(0), &ready(), t0);
    g.set_capacity(0, cap(true), t0);
    for s in 1..40 {
        // Still polled, never told (it asks about the model as answered before the drain): the
        // timeout ends it.
        g.polled(
            ip(1),
            Target::Model(0),
            &ready(),
            t0 + Duration::from_secs(s),
        );
        let done = g.drain_done(0, None, t0 + Duration::from_secs(s));
        assert_eq!(done, Duration::from_secs(s) >= TIMEOUT, "at {s} s");
    }
}

#[test]
fn a_stop_drains_every_model_and_waits_for_the_host_s_pollers_too() {
    let t0 = Instant::now();
    let mut f = Fleet::new(2, TIMEOUT, GRACE, t0);
    f.polled(ip(1), Target::Host, &ready(), t0);
    f.polled(ip(1), Target::Model(1), &ready(), t0);
    f.polled(ip(9), Target::Unknown, &Answer::Down("x".into()), t0);
    f.begin_stop(t0 + ms(100));
    assert!(f.stopping() && f.draining(0) && f.draining(1));
    f.polled(ip(1), Target::Model(1), &Answer::Drain, t0 + ms(200));
    // The host's poller not told yet.
    assert!(!f.drain_done(1, None, t0 + ms(5000)));
    assert!(!f.drain_done(0, None, t0 + ms(5000)));
    f.polled(ip(1), Target::Host, &Answer::Drain, t0 + ms(5100));
    assert!(f.drain_done(0, None, t0 + ms(7100)));
    assert!(f.drain_done(1, Some(t0 + ms(6000)), t0 + ms(8000)));
    assert!(!f.drain_done(1, Some(t0 + ms(6500)), t0 + ms(8000)));
    assert_eq!(f.balancers_seen(t0 + ms(8000)), 2);
}

#[test]
fn a_poller_answered_ready_again_must_be_told_again() {
    let t0 = Instant::now();
    let mut f = Fleet::new(1, TIMEOUT, GRACE, t0);
    f.set_capacity(0, cap(true), t0);
    f.polled(ip(1), Target::Model(0), &Answer::Drain, t0);
    f.set_capacity(0, cap(false), t0 + ms(100));
    f.polled(ip(1), Target::Model(0), &ready(), t0 + ms(200));
    f.set_capacity(0, cap(true), t0 + ms(300));
    assert!(!f.drain_done(0, None, t0 + ms(5000)));
    f.polled(ip(1), Target::Model(0), &Answer::Drain, t0 + ms(5000));
    assert!(f.drain_done(0, None, t0 + ms(7000)));
}

#[test]
fn pollers_are_bounded() {
    let t0 = Instant::now();
    let mut f = Fleet::new(1, TIMEOUT, GRACE, t0);
    for i in 0..(MAX_POLLERS as u32 + 100) {
        let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
        f.polled(ip, Target::Model(0), &ready(), t0 + ms(u64::from(i)));
    }
    assert!(f.pollers.len() <= MAX_POLLERS);
}
