use super::*;
use crate::route::paths::PathRules;

fn model(name: &str, slots: u32, max_queue: usize) -> ModelRoute {
    ModelRoute {
        name: name.into(),
        slots,
        max_queue,
        target_wait: Duration::from_millis(500),
        stale_after: Duration::from_secs(5),
        paths: PathRules::default_inference(),
    }
}

fn ep(id: &str, port: u16) -> (String, SocketAddr) {
    (id.into(), SocketAddr::from(([127, 0, 0, 1], port)))
}

fn granted(a: Admit) -> Grant {
    match a {
        Admit::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn queued(a: Admit) -> u64 {
    match a {
        Admit::Queued(s) => s,
        other => panic!("expected a place in the queue, got {other:?}"),
    }
}

fn ms(t0: Instant, n: u64) -> Instant {
    t0 + Duration::from_millis(n)
}

#[test]
fn slots_bound_each_replica_and_the_least_outstanding_gets_the_next() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 2, 10)]);
    q.set_routed(0, &[ep("m-1", 1), ep("m-2", 2)], t0);
    let a = granted(q.admit(0, t0, || 0));
    let b = granted(q.admit(0, t0, || 0));
    assert_ne!(
        a.replica, b.replica,
        "the idle replica takes the second request"
    );
    let c = granted(q.admit(0, t0, || 0));
    let d = granted(q.admit(0, t0, || 0));
    assert_ne!(c.replica, d.replica);
    // Four slots taken: the fifth waits, whatever arrives.
    let s5 = queued(q.admit(0, t0, || 5));
    let _s6 = queued(q.admit(0, t0, || 6));
    let st = &q.states(t0)[0];
    assert_eq!((st.running, st.queue_depth), (4, 2));
    // A slot frees on a's replica: the oldest waiter (5) gets exactly that replica.
    let out = q.release(&a, ms(t0, 10));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 5);
    assert_eq!(out[0].1.replica, a.replica);
    assert!(q.cancel(0, s5).is_none(), "granted, so no longer waiting");
}

#[test]
fn the_fifo_is_bounded_and_cancel_removes_a_waiter() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 2)]);
    let s1 = queued(q.admit(0, t0, || 1));
    let _ = queued(q.admit(0, t0, || 2));
    assert_eq!(q.admit(0, t0, || 3), Admit::Full);
    assert_eq!(q.cancel(0, s1), Some(1));
    let _ = queued(q.admit(0, t0, || 4));
    // The routed set arrives: the first waiter in order gets the single slot.
    let out = q.set_routed(0, &[ep("m-1", 1)], ms(t0, 5));
    assert_eq!(out.iter().map(|d| d.0).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn zero_queue_answers_full_when_no_slot_is_free() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 0)]);
    q.set_routed(0, &[ep("m-1", 1)], t0);
    let _g = granted(q.admit(0, t0, || 0));
    assert_eq!(q.admit(0, t0, || 0), Admit::Full);
}

#[test]
fn a_replica_that_leaves_takes_nothing_new_and_its_idleness_is_reported_at_once() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 10)]);
    q.set_routed(0, &[ep("m-1", 1), ep("m-2", 2)], t0);
    let a = granted(q.admit(0, t0, || 0));
    let _ = q.reports(t0);
    assert!(!q.take_urgent());
    // m-1 (holding a) leaves; m-2 stays.
    let leaving = a.id.clone();
    q.set_routed(
        0,
        &[if &*leaving == "m-1" {
            ep("m-2", 2)
        } else {
            ep("m-1", 1)
        }],
        ms(t0, 1),
    );
    assert!(q.take_urgent(), "the daemon hears of the routed change");
    let b = granted(q.admit(0, ms(t0, 2), || 0));
    assert_ne!(b.replica, a.replica);
    let _ = queued(q.admit(0, ms(t0, 3), || 9));
    // The leaving replica still reports its request in flight.
    let reps = q.reports(ms(t0, 4));
    let mine = reps
        .iter()
        .find(|r| r.replica.as_deref() == Some(&*leaving))
        .expect("still reported");
    assert_eq!(mine.in_flight, Some(1));
    // Its request finishes: no grant for it (it left), an urgent report showing it idle, then
    // it is forgotten.
    let out = q.release(&a, ms(t0, 5));
    assert!(out.is_empty(), "{out:?}");
    assert!(q.take_urgent());
    let reps = q.reports(ms(t0, 6));
    let mine = reps
        .iter()
        .find(|r| r.replica.as_deref() == Some(&*leaving))
        .expect("reported idle once");
    assert_eq!((mine.in_flight, mine.completed), (Some(0), Some(1)));
    let reps = q.reports(ms(t0, 7));
    assert!(!reps.iter().any(|r| r.replica.as_deref() == Some(&*leaving)));
}

#[test]
fn reports_carry_the_exact_oldest_wait_and_depth() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 10)]);
    q.set_routed(0, &[ep("m-1", 1)], t0);
    let g = granted(q.admit(0, t0, || 0));
    let _ = queued(q.admit(0, ms(t0, 100), || 1));
    let _ = queued(q.admit(0, ms(t0, 250), || 2));
    let reps = q.reports(ms(t0, 400));
    let wide = &reps[0];
    assert_eq!(wide.replica, None);
    assert_eq!(wide.oldest_wait_ms, Some(300.0));
    assert_eq!(wide.queue_depth, Some(2));
    assert_eq!(wide.in_flight, Some(3));
    assert_eq!((wide.arrived, wide.completed), (Some(3), Some(0)));
    let rep = &reps[1];
    assert_eq!(rep.replica.as_deref(), Some("m-1"));
    assert_eq!((rep.in_flight, rep.arrived), (Some(1), Some(1)));
    let out = q.release(&g, ms(t0, 450));
    assert_eq!(out.len(), 1);
    let reps = q.reports(ms(t0, 500));
    assert_eq!(reps[0].oldest_wait_ms, Some(250.0), "the next oldest");
    assert_eq!(reps[0].completed, Some(1));
}

#[test]
fn the_crossing_of_the_target_is_scheduled_once_per_episode() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 10), model("n", 1, 10)]);
    assert_eq!(q.next_crossing(), None);
    let _ = queued(q.admit(0, ms(t0, 10), || 1));
    assert!(q.take_reschedule());
    assert!(q.take_urgent(), "work for a model with nothing routed");
    let _ = queued(q.admit(1, ms(t0, 20), || 2));
    assert_eq!(q.next_crossing(), Some(ms(t0, 510)));
    // A report under the target leaves the crossing due.
    let _ = q.reports(ms(t0, 100));
    assert_eq!(q.next_crossing(), Some(ms(t0, 510)));
    // Once a report has shown m over its target, n's crossing is next.
    let _ = q.reports(ms(t0, 515));
    assert_eq!(q.next_crossing(), Some(ms(t0, 520)));
    let _ = q.reports(ms(t0, 530));
    assert_eq!(q.next_crossing(), None);
}

#[test]
fn a_retry_goes_to_another_replica_ahead_of_the_fifo() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 10)]);
    q.set_routed(0, &[ep("m-1", 1), ep("m-2", 2)], t0);
    let a = granted(q.admit(0, t0, || 0));
    let b = granted(q.admit(0, t0, || 0));
    let _ = queued(q.admit(0, ms(t0, 1), || 7));
    // a's replica failed: the retry must not go back there, and must not go behind 7.
    q.eject(&a, ms(t0, 2));
    let out = q.release(&a, ms(t0, 2));
    assert!(out.is_empty(), "the ejected replica takes nobody: {out:?}");
    let _ = queued(q.retry(0, a.replica, ms(t0, 2), || 8));
    let out = q.release(&b, ms(t0, 3));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 8, "the retry first");
    assert_eq!(out[0].1.replica, b.replica);
    // After the ejection the failed replica serves again (the next tick grants it).
    assert!(q.tick(ms(t0, 1000)).is_empty());
    let out = q.tick(t0 + EJECT_FOR + Duration::from_millis(3));
    assert_eq!(out.iter().map(|d| d.0).collect::<Vec<_>>(), vec![7]);
    assert_eq!(out[0].1.replica, a.replica);
}

#[test]
fn a_retry_with_no_other_replica_waits_for_one_and_never_goes_back_to_the_failed_one() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 4, 10)]);
    q.set_routed(0, &[ep("m-1", 1)], t0);
    let a = granted(q.admit(0, t0, || 0));
    assert!(!q.has_other(0, a.replica));
    q.eject(&a, t0);
    assert!(q.release(&a, t0).is_empty());
    let _ = queued(q.retry(0, a.replica, t0, || 1));
    // The failed replica's ejection runs out: still not for the retry.
    assert!(q.tick(t0 + EJECT_FOR * 2).is_empty());
    // A new replica is routed: the retry goes there.
    let out = q.set_routed(0, &[ep("m-1", 1), ep("m-2", 2)], ms(t0, 5000));
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].0, &*out[0].1.id), (1, "m-2"));
}

#[test]
fn a_restarted_daemon_reusing_an_id_on_another_port_is_another_replica() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 10)]);
    q.set_routed(0, &[ep("m-1", 1)], t0);
    let a = granted(q.admit(0, t0, || 0));
    q.set_routed(0, &[ep("m-1", 9)], t0);
    let b = granted(q.admit(0, t0, || 0));
    assert_ne!(a.replica, b.replica);
    assert_eq!(b.addr.port(), 9);
    let st = &q.states(t0)[0];
    assert_eq!(st.routed, 1);
    assert_eq!(st.replicas.len(), 2);
}

#[test]
fn many_seeds_of_random_operations_keep_every_invariant() {
    // A small deterministic generator: every sequence of admits, releases, cancels, routed-set
    // changes and ejections keeps slots ≤ limit, FIFO grants in order, and the books balanced.
    for seed in 1..200u64 {
        let mut x = seed;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let t0 = Instant::now();
        let slots = 1 + rnd(3) as u32;
        let mut q: Queues<u64> = Queues::new(&[model("m", slots, 5)]);
        let mut held: Vec<Grant> = Vec::new();
        let mut waiting: Vec<u64> = Vec::new();
        let mut last_granted_seq = 0u64;
        for step in 0..300u64 {
            let now = ms(t0, step);
            let mut deliveries = Vec::new();
            match rnd(6) {
                0 | 1 => match q.admit(0, now, || 0) {
                    Admit::Granted(g) => held.push(g),
                    Admit::Queued(s) => waiting.push(s),
                    Admit::Full => assert_eq!(waiting.len(), 5, "seed {seed}"),
                },
                2 if !held.is_empty() => {
                    let g = held.swap_remove(rnd(held.len() as u64) as usize);
                    deliveries = q.release(&g, now);
                }
                3 if !waiting.is_empty() => {
                    let s = waiting.swap_remove(rnd(waiting.len() as u64) as usize);
                    assert!(q.cancel(0, s).is_some(), "seed {seed}");
                }
                4 => {
                    let n = rnd(4);
                    let eps: Vec<_> = (0..n).map(|i| ep(&format!("m-{i}"), i as u16)).collect();
                    deliveries = q.set_routed(0, &eps, now);
                }
                _ => deliveries = q.tick(now),
            }
            // Deliveries: tickets are 0 here; identify them by the waiting list's order.
            for (_, g) in deliveries {
                waiting.sort_unstable();
                let s = waiting.remove(0);
                assert!(s > last_granted_seq, "FIFO order, seed {seed}");
                last_granted_seq = s;
                held.push(g);
            }
            let st = &q.states(now)[0];
            for r in &st.replicas {
                assert!(r.in_flight <= slots, "seed {seed}: {r:?}");
            }
            assert_eq!(st.running as usize, held.len(), "seed {seed}");
            assert_eq!(st.queue_depth, waiting.len(), "seed {seed}");
            // A free slot on a routed replica never coexists with a waiter.
            if st.queue_depth > 0 {
                assert!(
                    !st.replicas.iter().any(|r| r.routed && r.in_flight < slots),
                    "seed {seed}: idle slot with waiters"
                );
            }
            let _ = q.reports(now);
        }
    }
}

#[test]
fn slots_from_the_daemon_apply_at_once_and_are_bounded() {
    let t0 = Instant::now();
    let mut q: Queues<u32> = Queues::new(&[model("m", 1, 10)]);
    q.set_routed(0, &[ep("m-1", 1)], t0);
    let _a = granted(q.admit(0, t0, || 0));
    queued(q.admit(0, t0, || 1));
    queued(q.admit(0, t0, || 2));
    queued(q.admit(0, t0, || 3));
    // A reload raised `slots` to 3: two waiters go now, in order; the third still waits.
    let out = q.set_slots(0, 3, ms(t0, 1));
    assert_eq!(out.iter().map(|d| d.0).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(q.states(ms(t0, 1))[0].slots, 3);
    // Nonsense from the socket is bounded, never zero (nothing would ever be granted).
    q.set_slots(0, 0, ms(t0, 2));
    assert_eq!(q.states(ms(t0, 2))[0].slots, 1);
    q.set_slots(0, u32::MAX, ms(t0, 2));
    assert_eq!(
        q.states(ms(t0, 2))[0].slots,
        crate::route::settings::MAX_SLOTS
    );
}
