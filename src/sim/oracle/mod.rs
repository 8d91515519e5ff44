//! `--policy oracle`: a clairvoyant yardstick that every online policy is measured against.
//!
//! It knows every future arrival and service time. It decides which replicas are routable at
//! each `STEP`; the replicas, router and slots are the same as every other policy's, and so is
//! the bill: a replica costs from its spawn — one cold start and the promotion delay before it
//! first serves — to its exit once drained.
//!
//! How the schedule is computed:
//! 1. **Plan greedily in time, on a fork of the replica model.** At each step the planner holds
//!    the exact state of the fleet — each replica's running requests and FIFO queue, requests
//!    waiting at the router — and tries candidate routable counts. A candidate is followed for
//!    the step (for a lower count than the step before: for the `hold`, so that a decrease is
//!    one that lasts) and then, with `max` routable (the most any policy could have), until
//!    nothing waits any more at least one target wait later (or for `LOOKAHEAD` at most). The
//!    count chosen is the smallest whose misses (requests that wait longer than `target_wait`,
//!    including those still waiting past it) are no more than with `max` routable for the step,
//!    and which leaves no longer a queue when the queue does not empty. So misses come first —
//!    no fewer are possible within `max` at that step — and cost second. The fork is the
//!    planner's own copy of the replica model (`State`): it routes, queues and serves exactly as
//!    `cluster` does but holds only the work in flight, so trying a candidate does not copy the
//!    run.
//! 2. **Replicas, as the count moves.** When the count rises, replicas still draining are routed
//!    again first (they cost nothing more), then new ones are added, each spawned one cold start
//!    (and the promotion delay) before the step it must serve in. When it falls, the least busy
//!    routed replica (the newest among equals) is unrouted and exits the moment its work is done.
//!    Before a replica spawned at 0 could be ready, only the initial `min` replicas exist.
//! 3. **Keep replicas through short gaps.** A replica that exited no longer than a cold start
//!    plus the promotion delay before a new one must serve is kept instead (idle, unrouted) and
//!    routed again in the new one's place: a restart would bill that long before serving. Where
//!    the model has `[model.sleep]`, longer gaps too, asleep, while the sleep costs less than
//!    the restart (`oracle_keep::keep`); the replay puts it to sleep and wakes it one wake time before it
//!    is routed again. Under a host-memory budget (`Params::max_asleep`) a replica may sleep
//!    only if fewer than that many of those kept may when it exits; the others are kept only as
//!    long as a restart, awake, so the replay never has more asleep at once than the budget
//!    holds.
//! 4. **Replay, and keep the best plan.** Each schedule is replayed through the same engine as
//!    every policy (`OracleDriver`); the figures reported are what the replay measured, not what
//!    the planner predicted (the two agree exactly: `sim::tests` checks it). One plan is made
//!    per `HOLDS` value — a short hold packs work onto fewer replicas, a long one avoids
//!    unrouting replicas that will be wanted again — and the replay with the fewest misses, then
//!    the fewest replica-seconds, is the oracle's.
//!
//! It is a greedy heuristic, not a proven optimum: misses step by step with a bounded look-ahead,
//! then cost. Being clairvoyant, it should not be beaten on both axes (as few misses for fewer
//! replica-seconds) by any online policy; `tests/grid.rs` checks that on a sample of the grid.

use std::collections::VecDeque;

use super::engine::{self, Params, Router};
use super::report;
use super::workload::{Request, Workload};
use super::{Us, SEC};

pub(super) use super::oracle_keep::keep;
use super::oracle_keep::Kept;
pub use super::oracle_replay::OracleDriver;

mod serve;

/// The routable set may change at multiples of this.
pub const STEP: Us = SEC;
/// How far past a step (and its target wait) a candidate is followed while a queue persists.
const LOOKAHEAD: Us = 60 * SEC;
/// How long a lower count must serve without extra misses before the planner takes it, one
/// plan per value; the replay with the fewest misses, then replica-seconds, is kept.
pub const HOLDS: [Us; 3] = [5 * SEC, 30 * SEC, 120 * SEC];

/// `Rep::next_end` of a replica running nothing.
const NO_END: (Us, u64) = (Us::MAX, 0);

/// One replica of the planner's model: its running requests (end times) and FIFO queue.
#[derive(Debug, Clone)]
struct Rep {
    id: u32,
    routable: bool,
    /// When it was last unrouted (it may be routed again only a promotion delay later).
    unrouted_at: Us,
    /// (end time, start order): the engine's heap takes completions at one instant in the order
    /// they were scheduled, and so does the planner, so that behind the front door the slots
    /// they free go to the same waiting requests.
    running: Vec<(Us, u64)>,
    /// The earliest of `running`, `NO_END` if none.
    next_end: (Us, u64),
    waiting: VecDeque<u32>,
}

impl Rep {
    fn new(id: u32) -> Rep {
        Rep {
            id,
            routable: true,
            unrouted_at: 0,
            running: Vec::new(),
            next_end: NO_END,
            waiting: VecDeque::new(),
        }
    }
    fn in_flight(&self) -> usize {
        self.running.len() + self.waiting.len()
    }
}

/// A change to the routable set, as planned (`at` is when it takes effect at the router).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// A new replica, routable from `at`.
    New {
        id: u32,
    },
    /// A draining (or kept) replica, routable again from `at`.
    Reroute {
        id: u32,
    },
    Unroute {
        id: u32,
    },
    /// Drained: it exits. `may_sleep`: it may be kept asleep until it is routed again (the
    /// host-memory budget had room for it); otherwise it is kept only awake-long.
    Exit {
        id: u32,
        may_sleep: bool,
    },
}

/// Why `State::advance` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// It reached the time asked for.
    Reached,
    /// Nothing waited any more, after the instant given.
    Empty,
    /// More misses than the limit.
    TooMany,
}

/// The planner's copy of the replica model: the same routing (least in flight, the oldest
/// replica among equals), slots and FIFO queues as `cluster::Cluster`, holding only the work in
/// flight so that a fork is cheap.
#[derive(Debug, Clone)]
struct State {
    now: Us,
    /// Live replicas (routable or draining), in creation order.
    reps: Vec<Rep>,
    routable: u32,
    router: VecDeque<u32>,
    /// Requests waiting anywhere (replica queues and the router).
    waiting: usize,
    /// The next arrival.
    next: usize,
    /// Requests that waited longer than the target so far.
    misses: u64,
    next_id: u32,
    /// Replicas that exited recently enough to stand in for a new one, in exit order.
    exited: VecDeque<Kept>,
    /// Changes since the caller last took them (only the committed state keeps them).
    log: Option<Vec<(Us, Plan)>>,
    /// Requests started so far: the order of their completions at one instant.
    started: u64,
}

struct Model<'a> {
    reqs: &'a [Request],
    slots: usize,
    target: Us,
    promotion: Us,
    /// A replica idle no longer than this is kept rather than restarted: `keep`.
    keep: Us,
    /// As long, where it may not sleep: a cold start and the promotion delay.
    keep_awake: Us,
    /// The most kept replicas that may sleep at once (`Params::max_asleep`).
    max_asleep: Option<u32>,
    /// `Router::FrontDoor`: one FIFO at the router, a request leaves it for a free slot.
    front_door: bool,
}

impl Model<'_> {
    fn keeps(&self, e: &Kept) -> Us {
        if e.may_sleep {
            self.keep
        } else {
            self.keep_awake
        }
    }
}

impl State {
    fn new(routable: u32) -> State {
        State {
            now: 0,
            reps: (0..routable).map(Rep::new).collect(),
            routable,
            router: VecDeque::new(),
            waiting: 0,
            next: 0,
            misses: 0,
            next_id: routable,
            exited: VecDeque::new(),
            log: None,
            started: 0,
        }
    }

    fn fork(&self) -> State {
        State {
            reps: self.reps.clone(),
            router: self.router.clone(),
            exited: self.exited.clone(),
            log: None,
            ..*self
        }
    }

    /// A replica has no work left and is not routed: it exits (and may stand in later). It may
    /// sleep while fewer than `max_asleep` of those kept may: the replay sleeps only those, so
    /// its sleepers at any instant are among them.
    fn exit(&mut self, m: &Model, i: usize) {
        let x = self.reps.remove(i);
        let may_sleep = match m.max_asleep {
            None => true,
            Some(n) => {
                self.expire(m);
                self.exited.iter().filter(|e| e.may_sleep).count() < n as usize
            }
        };
        self.exited.push_back(Kept {
            exit: self.now,
            unrouted: x.unrouted_at,
            id: x.id,
            may_sleep,
        });
        self.note(Plan::Exit {
            id: x.id,
            may_sleep,
        });
    }

    /// Forgets the kept replicas idle for longer than they may be kept.
    fn expire(&mut self, m: &Model) {
        let now = self.now;
        if m.max_asleep.is_none() {
            // One lifetime, and the entries are in exit order.
            while self
                .exited
                .front()
                .is_some_and(|e| e.exit + m.keeps(e) < now)
            {
                self.exited.pop_front();
            }
        } else {
            self.exited.retain(|e| e.exit + m.keeps(e) >= now);
        }
    }

    fn note(&mut self, p: Plan) {
        if let Some(log) = &mut self.log {
            log.push((self.now, p));
        }
    }

    fn in_flight(&self) -> usize {
        self.reps.iter().map(Rep::in_flight).sum::<usize>() + self.router.len()
    }

    /// Draining replicas that may be routed again now.
    fn reroutable(&self, m: &Model) -> u32 {
        self.reps
            .iter()
            .filter(|x| !x.routable && x.unrouted_at + m.promotion <= self.now)
            .count() as u32
    }

    /// Sets the routable count: draining replicas are routed again first (the least busy
    /// first), then recently exited ones (kept instead, the most recent first), then new ones
    /// added; removed ones are the least busy (the newest among equals) and drain what they
    /// hold.
    fn set_routable(&mut self, m: &Model, n: u32) {
        self.expire(m);
        while self.routable < n {
            let back = self
                .reps
                .iter()
                .enumerate()
                .filter(|(_, x)| !x.routable && x.unrouted_at + m.promotion <= self.now)
                .min_by_key(|(_, x)| x.in_flight())
                .map(|(i, _)| i);
            match back {
                Some(i) => {
                    self.reps[i].routable = true;
                    let id = self.reps[i].id;
                    self.note(Plan::Reroute { id });
                    self.hand_out(m, i);
                }
                None => {
                    let now = self.now;
                    let stand_in = self
                        .exited
                        .iter()
                        .rposition(|e| e.unrouted + m.promotion <= now)
                        .and_then(|i| self.exited.remove(i));
                    match stand_in {
                        Some(Kept { id, .. }) => {
                            // Kept all along: back in its place among the replicas.
                            let at = self.reps.partition_point(|x| x.id < id);
                            self.reps.insert(at, Rep::new(id));
                            self.note(Plan::Reroute { id });
                            self.hand_out(m, at);
                        }
                        None => {
                            let id = self.next_id;
                            self.next_id += 1;
                            self.reps.push(Rep::new(id));
                            self.note(Plan::New { id });
                            self.hand_out(m, self.reps.len() - 1);
                        }
                    }
                }
            }
            self.routable += 1;
        }
        while self.routable > n {
            let mut pick: Option<(usize, usize)> = None;
            for (i, x) in self.reps.iter().enumerate() {
                if x.routable && pick.is_none_or(|(_, load)| x.in_flight() <= load) {
                    pick = Some((i, x.in_flight()));
                }
            }
            let (i, load) = pick.expect("a routable replica");
            self.routable -= 1;
            let id = self.reps[i].id;
            self.note(Plan::Unroute { id });
            self.reps[i].routable = false;
            self.reps[i].unrouted_at = self.now;
            if load == 0 {
                self.exit(m, i);
            }
        }
        if m.front_door {
            // Handed out as each became routable (`hand_out`).
        } else if self.routable > 0 {
            while let Some(q) = self.router.pop_front() {
                self.waiting -= 1;
                self.route(m, q);
            }
        }
    }

    /// Replays arrivals and completions before `until` (events at `until` belong to the next
    /// step). Stops early once nothing waits after `empty_after`, or once the misses exceed
    /// `miss_limit`.
    fn advance(&mut self, m: &Model, until: Us, empty_after: Us, miss_limit: u64) -> Stop {
        loop {
            let ta = m.reqs.get(self.next).map_or(Us::MAX, |r| r.t);
            let (mut first, mut rc) = (NO_END, 0);
            for (i, x) in self.reps.iter().enumerate() {
                if x.next_end < first {
                    (first, rc) = (x.next_end, i);
                }
            }
            let tc = first.0;
            let t = ta.min(tc);
            if self.waiting == 0 && t > empty_after && self.now <= empty_after {
                self.now = self.now.max(empty_after);
                return Stop::Empty;
            }
            if t >= until {
                self.now = until;
                return Stop::Reached;
            }
            self.now = t;
            if tc <= ta {
                self.complete(m, rc);
            } else {
                let q = self.next as u32;
                self.next += 1;
                self.route(m, q);
            }
            if self.misses > miss_limit {
                return Stop::TooMany;
            }
            if self.waiting == 0 && self.now >= empty_after {
                return Stop::Empty;
            }
        }
    }

    /// Requests waiting now that have already waited longer than the target.
    fn overdue(&self, m: &Model) -> u64 {
        let late = |q: &u32| self.now - m.reqs[*q as usize].t > m.target;
        let queued: usize = self
            .reps
            .iter()
            .map(|x| x.waiting.iter().filter(|q| late(q)).count())
            .sum();
        (queued + self.router.iter().filter(|q| late(q)).count()) as u64
    }
}

/// What following one candidate led to.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    misses: u64,
    emptied: bool,
    waiting: usize,
}

/// The planner's changes to the routable set, in time order, and its own count of misses.
pub(super) fn plan(w: &Workload, p: &Params, hold: Us) -> (Vec<(Us, Plan)>, u64) {
    let m = Model {
        reqs: &w.requests,
        slots: p.concurrency.max(1) as usize,
        target: p.target_wait,
        promotion: p.promotion,
        keep: keep(p),
        keep_awake: p.cold_start + p.promotion,
        max_asleep: p.max_asleep,
        front_door: p.router == Router::FrontDoor,
    };
    let (min, max) = (p.min.min(p.max), p.max);
    // New replicas exist only once one spawned at 0 could serve.
    let ready_from = p.cold_start + p.promotion;
    let mut st = State::new(min);
    st.log = Some(Vec::new());
    let mut log = Vec::new();
    let mut prev = min;
    let limit = w.horizon + 24 * 3600 * SEC;
    let mut k: Us = 0;
    loop {
        let t = k * STEP;
        let idle = st.next >= m.reqs.len() && st.in_flight() == 0;
        if (t >= w.horizon && idle) || t > limit {
            break;
        }
        let cap_at = |t: Us, st: &State| {
            if t >= ready_from {
                max
            } else {
                (st.routable + st.reroutable(&m)).clamp(min, max)
            }
        };
        let cap = cap_at(t, &st);
        let next_arrival = m.reqs.get(st.next).map_or(Us::MAX, |r| r.t);
        let n = if st.in_flight() == 0 && next_arrival >= t + STEP + m.target {
            // Nothing to serve before the next step could act: the fewest.
            min
        } else {
            let after = cap_at(t + STEP, &st).max(cap);
            choose(&m, &st, t, (min, cap, after), prev, hold)
        };
        st.set_routable(&m, n);
        st.advance(&m, t + STEP, Us::MAX, u64::MAX);
        log.append(st.log.as_mut().expect("committed"));
        prev = n;
        k += 1;
    }
    (log, st.misses)
}

/// The smallest count in `[floor, cap]` for the step at `t` that does as well as `cap` (`after`
/// is the most that can serve once the step is over); a count below `prev` must do so for
/// `hold`.
fn choose(m: &Model, st: &State, t: Us, bounds: (u32, u32, u32), prev: u32, hold: Us) -> u32 {
    let (floor, cap, after) = bounds;
    let follow = |n: u32, miss_limit: u64| -> Option<Outcome> {
        let mut s = st.fork();
        s.set_routable(m, n);
        let until = t + if n < prev { hold.max(STEP) } else { STEP };
        if s.advance(m, until, Us::MAX, miss_limit) == Stop::TooMany {
            return None;
        }
        s.set_routable(m, after.max(n));
        let empty_after = until + m.target;
        let stop = s.advance(m, empty_after + LOOKAHEAD, empty_after, miss_limit);
        if stop == Stop::TooMany {
            return None;
        }
        let misses = s.misses + s.overdue(m);
        (misses <= miss_limit).then_some(Outcome {
            misses,
            emptied: stop == Stop::Empty,
            waiting: s.waiting,
        })
    };
    let best = follow(cap, u64::MAX).expect("no miss limit");
    let ok = |n: u32| -> bool {
        if n >= cap {
            return true;
        }
        match follow(n, best.misses) {
            Some(o) => o.emptied || (!best.emptied && o.waiting <= best.waiting),
            None => false,
        }
    };
    let g = prev.clamp(floor, cap);
    let (mut lo, mut hi) = if ok(g) {
        if g == floor || !ok(g - 1) {
            return g;
        }
        (floor, g - 1)
    } else {
        (g + 1, cap)
    };
    // The smallest acceptable in [lo, hi]; hi is acceptable.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// The oracle's run: a plan per `HOLDS`, each replayed through the engine; the replay with the
/// fewest misses (requests arriving after the warm-up), then the fewest replica-seconds.
pub fn run(w: &Workload, p: Params) -> engine::Outcome {
    let score = |o: &engine::Outcome| {
        let r = report::policy_report("oracle", o, w, &p, 0.0);
        (r.over_target, r.replica_seconds)
    };
    HOLDS
        .iter()
        .map(|&hold| {
            let mut d = OracleDriver::new(w, &p, hold);
            let out = engine::run(&mut d, w, p);
            (score(&out), out)
        })
        .min_by(|a, b| a.0 .0.total_cmp(&b.0 .0).then(a.0 .1.total_cmp(&b.0 .1)))
        .expect("at least one plan")
        .1
}
