//! The planner's replica model serving: a request starts in a slot, is routed (committed to a
//! replica's own queue, or behind the front door held at the router until a slot is free), is
//! handed out to a replica made routable, and completes. It must route, queue and serve exactly
//! as `cluster` does, for the replay to miss what the plan expected (`sim::tests`,
//! `sim::front_door_tests`).

use super::{Model, State, NO_END};

impl State {
    pub(super) fn start(&mut self, m: &Model, r: usize, q: u32) {
        let req = m.reqs[q as usize];
        if self.now - req.t > m.target {
            self.misses += 1;
        }
        let end = self.now + req.service;
        self.started += 1;
        let x = &mut self.reps[r];
        x.running.push((end, self.started));
        x.next_end = x.next_end.min((end, self.started));
    }

    /// The routable replica with the least work, the first among equals (as `cluster` picks);
    /// with `free_of` slots, only among those with one free (`FrontDoor`).
    pub(super) fn least_loaded(&self, free_of: Option<usize>) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (i, x) in self.reps.iter().enumerate() {
            let free = free_of.is_none_or(|slots| x.running.len() < slots);
            if x.routable && free && best.is_none_or(|(_, load)| x.in_flight() < load) {
                best = Some((i, x.in_flight()));
            }
        }
        best.map(|b| b.0)
    }

    pub(super) fn route(&mut self, m: &Model, q: u32) {
        if m.front_door {
            match self.least_loaded(Some(m.slots)) {
                Some(r) => self.start(m, r, q),
                None => {
                    self.router.push_back(q);
                    self.waiting += 1;
                }
            }
            return;
        }
        match self.least_loaded(None) {
            None => {
                self.router.push_back(q);
                self.waiting += 1;
            }
            Some(r) => {
                let x = &self.reps[r];
                if x.running.len() < m.slots && x.waiting.is_empty() {
                    self.start(m, r, q);
                } else {
                    self.reps[r].waiting.push_back(q);
                    self.waiting += 1;
                }
            }
        }
    }

    /// `FrontDoor`: a replica just made routable takes the oldest waiting requests into its free
    /// slots, as the cluster's router hands them over the moment it becomes routable (one
    /// replica at a time, in the order they became routable; the others' slots were full).
    pub(super) fn hand_out(&mut self, m: &Model, i: usize) {
        if !m.front_door {
            return;
        }
        while self.reps[i].running.len() < m.slots {
            let Some(q) = self.router.pop_front() else {
                break;
            };
            self.waiting -= 1;
            self.start(m, i, q);
        }
    }

    pub(super) fn complete(&mut self, m: &Model, r: usize) {
        let x = &mut self.reps[r];
        let i = x
            .running
            .iter()
            .position(|&e| e == x.next_end)
            .expect("the earliest end is running");
        x.running.swap_remove(i);
        let routable = x.routable;
        if let Some(q) = x.waiting.pop_front() {
            self.waiting -= 1;
            self.start(m, r, q);
        } else if m.front_door && routable {
            if let Some(q) = self.router.pop_front() {
                self.waiting -= 1;
                self.start(m, r, q);
            }
        }
        let x = &mut self.reps[r];
        x.next_end = x.running.iter().copied().min().unwrap_or(NO_END);
        if !x.routable && x.in_flight() == 0 {
            self.exit(m, r);
        }
    }
}
