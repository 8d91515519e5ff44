//! The replica queueing model and the router, shared by every policy.
//!
//! A replica has `concurrency` slots; a request holds a slot for its service time. How a request
//! reaches a slot is the `Router`'s:
//! - `Committed` (the default, every policy): the router sends each arrival to the routable
//!   replica with the least work (waiting + running; the oldest replica among equals) and
//!   commits it to that replica's own FIFO queue. While no replica is routable, arrivals wait at
//!   the router (as in Knative's activator or a Ray handle) and go out, oldest first, the moment
//!   one becomes routable.
//! - `FrontDoor` (hearth's `hearth route`, docs/front-door.md): one FIFO per model at the router;
//!   a request leaves it only for a free slot (the least busy routable replica with one, the
//!   oldest among equals), so a replica made routable takes the oldest waiting work at once and
//!   no request waits behind a long one on a replica while another has room.
//!
//! A replica *holds a GPU* from its spawn to its exit, whatever the policy calls its state in
//! between (starting, warm, routed, draining, stopping): that is what replica-seconds count.

use std::collections::VecDeque;

use super::Us;

pub const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct Replica {
    /// The id the policy knows it by (`MODEL-N` for hearth, `pod-N` for the baselines).
    pub name: String,
    pub spawned: Us,
    /// Became able to serve (warm-up passed / pod ready).
    pub ready: Option<Us>,
    pub exited: Option<Us>,
    /// In the policy's routed set; the router uses it once `routable`.
    pub routed: bool,
    /// Receiving traffic: routed, and the promotion delay has passed.
    pub routable: bool,
    /// Bumped whenever `routed` changes, so a stale "now routable" event is recognised.
    pub epoch: u32,
    /// Told to finish its work and go (a draining hearth replica, a terminating pod).
    pub draining: bool,
    pub waiting: VecDeque<u32>,
    pub running: Vec<u32>,
    /// Monotonic counters, as a real server would report them.
    pub arrived: u64,
    pub completed: u64,
    /// Intervals spent asleep (sleeping tier), the last open while it sleeps.
    pub asleep: Vec<(Us, Option<Us>)>,
    // Integrals over time (µs-weighted), brought up to date by `touch`.
    last: Us,
    area_in_flight: u64,
    area_any_busy: u64,
    area_busy_slots: u64,
}

impl Replica {
    pub fn in_flight(&self) -> u64 {
        (self.waiting.len() + self.running.len()) as u64
    }
    pub fn alive(&self) -> bool {
        self.exited.is_none()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqState {
    Arrived,
    Running,
    Done,
    Killed,
}

#[derive(Debug, Clone, Copy)]
pub struct Req {
    pub arrival: Us,
    pub service: Us,
    pub start: Option<Us>,
    /// When it was killed (scale-down with work in flight), if it was.
    pub killed: Option<Us>,
    pub state: ReqState,
    pub replica: u32,
}

#[derive(Debug, Default)]
pub struct Cluster {
    pub concurrency: u32,
    pub replicas: Vec<Replica>,
    pub reqs: Vec<Req>,
    /// Routable replicas, in creation order.
    routable: Vec<u32>,
    /// What a sleeping replica is charged of a replica-second (`gpu_memory_asleep` ÷
    /// `gpu_memory`), and the host memory it holds (bytes).
    pub asleep_charge: f64,
    pub asleep_host_memory: u64,
    pub router: Router,
    /// Arrivals with nowhere to go yet (`FrontDoor`: every request not yet given a slot).
    pub router_queue: VecDeque<u32>,
    router_last: Us,
    router_area: u64,
    /// Requests not yet started or killed.
    pub unresolved: u64,
    /// Slot-time spent serving, all replicas, all time (µs).
    busy_slot_us_done: u64,
}

/// How arrivals reach replicas' slots (module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Router {
    #[default]
    Committed,
    FrontDoor,
}

impl Router {
    /// As `--router` names it.
    pub fn name(self) -> &'static str {
        match self {
            Router::Committed => "committed",
            Router::FrontDoor => "front-door",
        }
    }
}

/// What the engine must do after a change: schedule completions.
pub type Starts = Vec<(u32, Us)>;

impl Cluster {
    pub fn new(concurrency: u32, router: Router) -> Cluster {
        Cluster {
            concurrency,
            router,
            ..Default::default()
        }
    }

    pub fn spawn(&mut self, name: String, now: Us) -> u32 {
        self.replicas.push(Replica {
            name,
            spawned: now,
            ready: None,
            exited: None,
            routed: false,
            routable: false,
            epoch: 0,
            draining: false,
            waiting: VecDeque::new(),
            running: Vec::new(),
            arrived: 0,
            completed: 0,
            asleep: Vec::new(),
            last: now,
            area_in_flight: 0,
            area_any_busy: 0,
            area_busy_slots: 0,
        });
        (self.replicas.len() - 1) as u32
    }

    fn touch(&mut self, r: u32, now: Us) {
        let x = &mut self.replicas[r as usize];
        let dt = now.saturating_sub(x.last);
        if dt > 0 {
            let running = x.running.len() as u64;
            x.area_in_flight += (x.waiting.len() as u64 + running) * dt;
            x.area_busy_slots += running * dt;
            if running > 0 {
                x.area_any_busy += dt;
            }
            x.last = now;
        }
    }

    fn touch_router(&mut self, now: Us) {
        let dt = now.saturating_sub(self.router_last);
        self.router_area += self.router_queue.len() as u64 * dt;
        self.router_last = now;
    }

    /// ∫ in-flight dt up to `now` (request·µs).
    pub fn in_flight_area(&self, r: u32, now: Us) -> u64 {
        let x = &self.replicas[r as usize];
        x.area_in_flight + x.in_flight() * now.saturating_sub(x.last)
    }

    /// Time with at least one request in service up to `now` (µs): what a GPU-utilisation
    /// counter measures (share of time any kernel runs), saturating at one request.
    pub fn any_busy_area(&self, r: u32, now: Us) -> u64 {
        let x = &self.replicas[r as usize];
        x.area_any_busy
            + if x.running.is_empty() {
                0
            } else {
                now.saturating_sub(x.last)
            }
    }

    /// ∫ busy slots dt up to `now` (slot·µs).
    pub fn busy_slot_area(&self, r: u32, now: Us) -> u64 {
        let x = &self.replicas[r as usize];
        x.area_busy_slots + x.running.len() as u64 * now.saturating_sub(x.last)
    }

    /// ∫ requests waiting at the router dt up to `now`.
    pub fn router_area(&self, now: Us) -> u64 {
        self.router_area + self.router_queue.len() as u64 * now.saturating_sub(self.router_last)
    }

    /// Total busy slot-time of completed and running work up to `now` (slot·µs).
    pub fn busy_slot_total(&self, now: Us) -> u64 {
        (0..self.replicas.len() as u32)
            .map(|r| self.busy_slot_area(r, now))
            .sum()
    }

    pub fn new_request(&mut self, arrival: Us, service: Us) -> u32 {
        self.reqs.push(Req {
            arrival,
            service,
            start: None,
            killed: None,
            state: ReqState::Arrived,
            replica: NONE,
        });
        self.unresolved += 1;
        (self.reqs.len() - 1) as u32
    }

    /// The routable replica with the least work, the oldest among equals; with `free_slot`, only
    /// among those with a slot free (`FrontDoor`).
    fn least_loaded(&self, free_slot: bool) -> Option<u32> {
        let c = self.concurrency as usize;
        self.routable
            .iter()
            .copied()
            .filter(|&r| !free_slot || self.replicas[r as usize].running.len() < c)
            .min_by_key(|&r| (self.replicas[r as usize].in_flight(), r))
    }

    /// Routes an arrival: to the least-loaded routable replica (`FrontDoor`: with a free slot),
    /// else to the router's queue.
    pub fn arrive(&mut self, q: u32, now: Us, starts: &mut Starts) {
        match self.least_loaded(self.router == Router::FrontDoor) {
            Some(r) => self.enqueue(r, q, now, starts),
            None => {
                self.touch_router(now);
                self.router_queue.push_back(q);
            }
        }
    }

    fn enqueue(&mut self, r: u32, q: u32, now: Us, starts: &mut Starts) {
        self.touch(r, now);
        let c = self.concurrency as usize;
        let x = &mut self.replicas[r as usize];
        x.arrived += 1;
        self.reqs[q as usize].replica = r;
        if x.running.len() < c && x.waiting.is_empty() {
            self.start(r, q, now, starts);
        } else {
            self.replicas[r as usize].waiting.push_back(q);
        }
    }

    fn start(&mut self, r: u32, q: u32, now: Us, starts: &mut Starts) {
        let req = &mut self.reqs[q as usize];
        req.start = Some(now);
        req.state = ReqState::Running;
        self.unresolved -= 1;
        starts.push((q, now + req.service));
        self.replicas[r as usize].running.push(q);
    }

    /// A request's service ended. Returns its replica if the request was still running there
    /// (not killed meanwhile), after starting the next waiting one.
    pub fn complete(&mut self, q: u32, now: Us, starts: &mut Starts) -> Option<u32> {
        let req = self.reqs[q as usize];
        if req.state != ReqState::Running {
            return None;
        }
        let r = req.replica;
        self.touch(r, now);
        self.reqs[q as usize].state = ReqState::Done;
        self.busy_slot_us_done += req.service;
        let x = &mut self.replicas[r as usize];
        let i = x
            .running
            .iter()
            .position(|&v| v == q)
            .expect("running here");
        x.running.swap_remove(i);
        x.completed += 1;
        if let Some(next) = x.waiting.pop_front() {
            self.start(r, next, now, starts);
        } else if self.router == Router::FrontDoor && x.routable && !self.router_queue.is_empty() {
            // The slot freed is the front door's to give: to the oldest request waiting.
            self.touch_router(now);
            if let Some(next) = self.router_queue.pop_front() {
                self.enqueue(r, next, now, starts);
            }
        }
        Some(r)
    }

    /// Starts sending traffic to `r`, and hands it what waits at the router.
    pub fn set_routable(&mut self, r: u32, now: Us, starts: &mut Starts) {
        let x = &mut self.replicas[r as usize];
        if x.routable || !x.routed || !x.alive() {
            return;
        }
        x.routable = true;
        let pos = self.routable.partition_point(|&v| v < r);
        self.routable.insert(pos, r);
        if self.router_queue.is_empty() {
            return;
        }
        self.touch_router(now);
        match self.router {
            Router::Committed => {
                while let Some(q) = self.router_queue.pop_front() {
                    let to = self.least_loaded(false).expect("one is routable");
                    self.enqueue(to, q, now, starts);
                }
            }
            // The others' slots were full (else nothing would wait): only this one's are free.
            Router::FrontDoor => {
                while self.replicas[r as usize].running.len() < self.concurrency as usize {
                    let Some(q) = self.router_queue.pop_front() else {
                        break;
                    };
                    self.enqueue(r, q, now, starts);
                }
            }
        }
    }

    /// Marks `r` routed; the caller makes it routable now or after the promotion delay.
    pub fn set_routed(&mut self, r: u32) -> u32 {
        let x = &mut self.replicas[r as usize];
        x.routed = true;
        x.epoch += 1;
        x.epoch
    }

    /// Stops sending traffic to `r` (its queue stays with it).
    pub fn unroute(&mut self, r: u32) {
        let x = &mut self.replicas[r as usize];
        x.routed = false;
        x.epoch += 1;
        if x.routable {
            x.routable = false;
            self.routable.retain(|&v| v != r);
        }
    }

    /// The replica is asleep from `now` (`true`) or no longer (`false`).
    pub fn set_asleep(&mut self, r: u32, asleep: bool, now: Us) {
        let x = &mut self.replicas[r as usize];
        let open = x.asleep.last().is_some_and(|i| i.1.is_none());
        match (asleep, open) {
            (true, false) => x.asleep.push((now, None)),
            (false, true) => {
                if let Some(last) = x.asleep.last_mut() {
                    last.1 = Some(now);
                }
            }
            _ => {}
        }
    }

    /// Time asleep within `[from, to)`, all replicas (µs).
    pub fn asleep_within(&self, from: Us, to: Us) -> u64 {
        self.replicas
            .iter()
            .flat_map(|x| x.asleep.iter())
            .map(|&(a, b)| b.unwrap_or(to).min(to).saturating_sub(a.max(from)))
            .sum()
    }

    /// The most replicas asleep at one instant within `[from, to)`.
    pub fn peak_asleep(&self, from: Us, to: Us) -> u32 {
        // (instant, +1 asleep from it / -1 awake from it); at one instant wakes come first, as
        // the intervals are half-open.
        let mut edges: Vec<(Us, i32)> = self
            .replicas
            .iter()
            .flat_map(|x| x.asleep.iter())
            .map(|&(a, b)| (a.max(from), b.unwrap_or(to).min(to)))
            .filter(|(a, b)| a < b)
            .flat_map(|(a, b)| [(a, 1), (b, -1)])
            .collect();
        edges.sort_unstable();
        let (mut now, mut peak) = (0i32, 0i32);
        for (_, d) in edges {
            now += d;
            peak = peak.max(now);
        }
        peak as u32
    }

    /// The process is gone: whatever it still had (waiting or running) is killed. Returns how
    /// many requests were killed.
    pub fn exit(&mut self, r: u32, now: Us) -> u64 {
        self.unroute(r);
        self.touch(r, now);
        let x = &mut self.replicas[r as usize];
        if x.exited.is_some() {
            return 0;
        }
        x.exited = Some(now);
        if let Some(last) = x.asleep.last_mut() {
            last.1.get_or_insert(now);
        }
        let waiting: Vec<u32> = x.waiting.drain(..).collect();
        let running: Vec<u32> = std::mem::take(&mut x.running);
        let killed = (waiting.len() + running.len()) as u64;
        for q in waiting {
            let req = &mut self.reqs[q as usize];
            req.state = ReqState::Killed;
            req.killed = Some(now);
            self.unresolved -= 1;
        }
        for q in running {
            let req = &mut self.reqs[q as usize];
            // The part of the service it got still occupied the slot.
            self.busy_slot_us_done += now - req.start.unwrap_or(now);
            req.state = ReqState::Killed;
            req.killed = Some(now);
        }
        killed
    }

    /// Age of the oldest request waiting anywhere (replica queues and the router), µs.
    pub fn oldest_wait(&self, now: Us) -> Us {
        let mut oldest = self
            .router_queue
            .front()
            .map_or(0, |&q| now - self.reqs[q as usize].arrival);
        for x in self.replicas.iter().filter(|x| x.alive()) {
            if let Some(&q) = x.waiting.front() {
                oldest = oldest.max(now - self.reqs[q as usize].arrival);
            }
        }
        oldest
    }

    /// Replicas that hold a GPU now.
    pub fn holding(&self) -> u32 {
        self.replicas.iter().filter(|x| x.alive()).count() as u32
    }

    /// Slot-time of all finished service (completed, and the served part of killed work), µs.
    pub fn busy_slot_done(&self) -> u64 {
        self.busy_slot_us_done
    }
}
