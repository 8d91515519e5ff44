//! The toy server's FIFO queue in front of its completion slots, and the accounting that
//! `/metrics` and the socket reports read.
//!
//! tokio's semaphore is fair (first come, first served), so waiting on it is the FIFO queue; the
//! accounting beside it records who waits since when, who runs, and how many arrived and
//! completed, under one lock so that a snapshot is consistent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots and the queue for them.
pub(super) struct Queue {
    slots: Arc<Semaphore>,
    book: Mutex<Book>,
}

/// Queue accounting.
#[derive(Default)]
struct Book {
    /// Arrival instants of requests waiting for a slot, by request id (ids grow, so the first
    /// entry is the oldest).
    waiting: BTreeMap<u64, Instant>,
    running: u64,
    arrived: u64,
    completed: u64,
    next_id: u64,
}

/// A consistent view of the queue, for `/metrics` and for reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Stats {
    pub oldest_wait: Duration,
    pub waiting: u64,
    pub running: u64,
    pub arrived: u64,
    pub completed: u64,
}

impl Queue {
    /// A queue in front of `slots` slots (at least one; `serve` checks the flag).
    pub fn new(slots: usize) -> Queue {
        Queue {
            slots: Arc::new(Semaphore::new(slots)),
            book: Mutex::new(Book::default()),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // The lock guards plain counters that every holder leaves consistent, so a holder that
        // panicked left nothing half-done: carry on rather than take the server down.
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn stats(&self) -> Stats {
        let q = self.book();
        Stats {
            oldest_wait: q
                .waiting
                .values()
                .next()
                .map(|t| t.elapsed())
                .unwrap_or_default(),
            waiting: q.waiting.len() as u64,
            running: q.running,
            arrived: q.arrived,
            completed: q.completed,
        }
    }

    /// Serves one request: waits in line for a slot, holds it for `service`, and returns the
    /// request's id. If this future is dropped (client gone, shutdown timeout), the request
    /// leaves the queue, or gives its slot back, at once.
    #[cfg(test)]
    pub async fn serve(self: &Arc<Self>, service: Duration) -> u64 {
        let slot = self.enter().await;
        tokio::time::sleep(service).await;
        slot.finish()
    }

    /// Waits in line for a slot and takes it: held until `finish` (answered) or until the
    /// `Slot` is dropped (the client left, or the server hung), which gives it back either way.
    pub async fn enter(self: &Arc<Self>) -> Slot {
        let mut ticket = self.admit();
        let Ok(permit) = self.slots.clone().acquire_owned().await else {
            unreachable!("the semaphore is never closed");
        };
        ticket.start();
        Slot {
            ticket,
            _permit: permit,
        }
    }

    /// Admits a request into the queue.
    fn admit(self: &Arc<Self>) -> Ticket {
        let mut q = self.book();
        // The id is taken under the lock so id order is arrival order (oldest = first entry).
        q.next_id += 1;
        let id = q.next_id;
        q.waiting.insert(id, Instant::now());
        q.arrived += 1;
        Ticket {
            queue: self.clone(),
            id,
            phase: Phase::Waiting,
        }
    }
}

/// A slot held by one request.
pub(super) struct Slot {
    ticket: Ticket,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The request is answered: counted as completed; returns its id.
    pub fn finish(mut self) -> u64 {
        self.ticket.finish();
        self.ticket.id
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Waiting,
    Running,
    Done,
}

/// One admitted request's place in the accounting; dropping it at any phase undoes exactly
/// what is still counted for it.
struct Ticket {
    queue: Arc<Queue>,
    id: u64,
    phase: Phase,
}

impl Ticket {
    fn start(&mut self) {
        let mut q = self.queue.book();
        q.waiting.remove(&self.id);
        q.running += 1;
        self.phase = Phase::Running;
    }

    fn finish(&mut self) {
        let mut q = self.queue.book();
        q.running -= 1;
        q.completed += 1;
        self.phase = Phase::Done;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut q = self.queue.book();
        match self.phase {
            Phase::Waiting => {
                q.waiting.remove(&self.id);
            }
            Phase::Running => q.running -= 1,
            Phase::Done => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_server::{args, until, Server};
    use super::*;
    use crate::toy_server::ToyArgs;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    fn counts(s: Stats) -> (u64, u64, u64, u64) {
        (s.waiting, s.running, s.arrived, s.completed)
    }

    #[tokio::test]
    async fn a_dropped_request_leaves_nothing_counted_at_any_phase() {
        let q = Arc::new(Queue::new(1));
        // Waiting, then dropped: gone from the queue, still counted as arrived.
        let t = q.admit();
        assert_eq!(counts(q.stats()), (1, 0, 1, 0));
        drop(t);
        assert_eq!(counts(q.stats()), (0, 0, 1, 0));
        // Running, then dropped: the slot count goes back.
        let mut t = q.admit();
        t.start();
        assert_eq!(counts(q.stats()), (0, 1, 2, 0));
        drop(t);
        assert_eq!(counts(q.stats()), (0, 0, 2, 0));
        // Done: dropping it changes nothing more.
        let mut t = q.admit();
        t.start();
        t.finish();
        drop(t);
        assert_eq!(counts(q.stats()), (0, 0, 3, 1));
        assert_eq!(q.stats().oldest_wait, Duration::ZERO);
    }

    #[tokio::test]
    async fn requests_are_served_in_arrival_order() {
        let q = Arc::new(Queue::new(1));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for i in 0..5u64 {
            let (mine, tx) = (q.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let id = mine.serve(Duration::from_millis(20)).await;
                let _ = tx.send((i, id));
            }));
            // Each is in line before the next arrives.
            until("the request to be admitted", Duration::from_secs(5), || {
                let arrived = q.stats().arrived;
                async move { (arrived == i + 1).then_some(()) }
            })
            .await;
        }
        drop(tx);
        let mut order = Vec::new();
        while let Some((i, id)) = rx.recv().await {
            order.push(i);
            assert_eq!(id, i + 1, "ids are given in arrival order");
        }
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
        assert_eq!(counts(q.stats()), (0, 0, 5, 5));
    }

    #[tokio::test]
    async fn requests_queue_for_slots_and_oldest_wait_grows() {
        let s = Server::start(
            ToyArgs {
                concurrency: 1,
                service_time: Duration::from_millis(700),
                ..args()
            },
            None,
        )
        .await;
        let reqs: Vec<_> = (0..3).map(|_| tokio::spawn(s.complete("{}"))).collect();
        let first = until("2 waiting, 1 running", Duration::from_secs(5), || async {
            let m = s.metrics().await;
            (m["toy_requests_waiting"] == 2.0 && m["toy_requests_running"] == 1.0)
                .then_some(m["toy_oldest_wait_seconds"])
        })
        .await;
        until("oldest wait to grow", Duration::from_secs(5), || async {
            let m = s.metrics().await;
            (m["toy_oldest_wait_seconds"] >= first + 0.1).then_some(())
        })
        .await;
        assert_eq!(s.arrived_and_completed().await, (3.0, 0.0));
        for r in reqs {
            assert_eq!(r.await.unwrap().unwrap().0, 200);
        }
        let m = s.metrics().await;
        assert_eq!(m["toy_requests_completed_total"], 3.0);
        assert_eq!(m["toy_requests_waiting"], 0.0);
        assert_eq!(m["toy_oldest_wait_seconds"], 0.0);
        s.stop().await.unwrap();
    }

    #[tokio::test]
    async fn client_gone_while_waiting_leaves_the_queue() {
        let s = Server::start(
            ToyArgs {
                concurrency: 1,
                service_time: Duration::from_secs(3),
                ..args()
            },
            None,
        )
        .await;
        let holder = tokio::spawn(s.complete("{}"));
        let mut raw = TcpStream::connect(s.addr()).await.unwrap();
        raw.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            .await
            .unwrap();
        until("1 waiting", Duration::from_secs(2), || async {
            (s.metrics().await["toy_requests_waiting"] == 1.0).then_some(())
        })
        .await;
        drop(raw);
        // Well before the holder's 3 s are up, the abandoned entry must be gone.
        until(
            "abandoned entry to leave",
            Duration::from_millis(1500),
            || async {
                let m = s.metrics().await;
                (m["toy_requests_waiting"] == 0.0 && m["toy_requests_running"] == 1.0).then_some(())
            },
        )
        .await;
        assert_eq!(holder.await.unwrap().unwrap().0, 200);
        assert_eq!(s.arrived_and_completed().await, (2.0, 1.0));
        s.stop().await.unwrap();
    }
}
