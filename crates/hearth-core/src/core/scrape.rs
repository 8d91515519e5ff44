//! Queue signal from servers that cannot report on the socket: their own Prometheus metrics,
//! scraped on every routed and draining replica at `[model.signal] interval`.

use std::time::Duration;

use super::event::{Action, LogLevel, ScrapedQueue};
use super::front_door::Admitted;
use super::node::Node;
use super::queue_signal::Sample;
use super::replica::{ReplicaId, ReplicaState};
use super::Time;

impl Node {
    /// Asks for the scrapes that are due (called on every tick).
    pub(super) fn schedule_scrapes(&mut self, now: Time, out: &mut Vec<Action>) {
        for r in self.held.replicas_mut().values_mut() {
            if !matches!(r.state, ReplicaState::Routed | ReplicaState::Draining)
                || r.scrape_in_flight
                || now < r.scrape_next
            {
                continue;
            }
            let Some(m) = self.models.get(&r.model) else {
                continue;
            };
            let Some(sig) = &m.config.signal else {
                continue;
            };
            // A front door's reports supersede scrapes: none is asked for meanwhile.
            if m.front_doors.any_active(now, m.config.scaling.stale_after) {
                continue;
            }
            let vars = crate::config::Placeholders {
                port: r.port.unwrap_or(0),
                replica: r.id.0.clone(),
                model: r.model.clone(),
                gpus: r.gpus.join(","),
            };
            r.scrape_in_flight = true;
            r.scrape_next = now + sig.interval;
            out.push(Action::Scrape {
                replica: r.id.clone(),
                url: crate::config::expand(&sig.scrape, &vars),
                format: sig.format,
                models: sig.models.clone(),
                timeout: sig
                    .interval
                    .clamp(Duration::from_millis(500), Duration::from_secs(5)),
            });
        }
    }

    pub(super) fn scraped(
        &mut self,
        id: &ReplicaId,
        outcome: Result<ScrapedQueue, super::ScrapeError>,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        r.scrape_in_flight = false;
        let model = r.model.clone();
        let q = match outcome {
            Ok(q) => q.bounded(),
            Err(e) => {
                // No signal (staleness rules apply); said once per episode, not once per poll.
                if !r.scrape_failing {
                    r.scrape_failing = true;
                    self.log(LogLevel::Warn, &model, Some(id), format!("scraping metrics fails: {e}; no signal from this replica until it works"), out);
                }
                return;
            }
        };
        let recovered = std::mem::take(&mut r.scrape_failing);
        // One asked for before a front door began to report.
        if self.admit_signal(&model, None, now, out) != Admitted::Own {
            return;
        }
        let Some(r) = self.held.replicas_mut().get_mut(id) else {
            return;
        };
        let bound_ms = oldest_wait_bound(r, q.queue_depth, now);
        // The server's estimate: its own oldest wait where it has one, else the mean wait of
        // the requests that started service since the last scrape (none if none did: a queue
        // that is not moving says nothing about its head but what the bound says).
        let previous = std::mem::replace(&mut r.scraped_queue_time, q.queue_time);
        let departed_mean = match (q.queue_time, previous) {
            (Some(now_totals), Some(before)) => now_totals.mean_since(&before),
            _ => None,
        };
        let estimate = q.oldest_wait_ms.or(departed_mean);
        let wait = estimate.map_or(bound_ms, |w| w.clamp(0.0, bound_ms));
        let sample = Sample {
            at: now,
            oldest_wait_ms: wait,
            queue_depth: q.queue_depth,
            in_flight: q.in_flight,
            arrived: q.arrived,
            completed: q.completed,
        };
        if recovered {
            self.log(
                LogLevel::Info,
                &model,
                Some(id),
                "scraping metrics works again".into(),
                out,
            );
        }
        self.record_replica_sample(id, sample, now, out);
        self.autoscale(&model, now, out);
    }
}

/// An upper bound on the oldest wait from queue depths alone. The queue has been non-empty at
/// least since the head arrived; tighter, reading the queue as FIFO: requests that appeared
/// between two scrapes arrived at the earliest at the first of them, and a fall in depth means
/// at least that many of the oldest left. With no departures seen, this is how long the queue
/// has been continuously non-empty.
fn oldest_wait_bound(r: &mut super::replica::Replica, depth: u64, now: Time) -> f64 {
    let since = r.last_scraped.replace(now).unwrap_or(now);
    let mut seen: u64 = r.queue_cohorts.iter().map(|(_, n)| n).sum();
    if depth > seen {
        r.queue_cohorts.push_back((since, depth - seen));
    }
    while seen > depth {
        let Some(front) = r.queue_cohorts.front_mut() else {
            break;
        };
        let gone = front.1.min(seen - depth);
        front.1 -= gone;
        seen -= gone;
        if front.1 == 0 {
            r.queue_cohorts.pop_front();
        }
    }
    r.queue_cohorts
        .front()
        .map_or(0.0, |(t, _)| now.since(*t).as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::harness::{model, Harness, BASE};
    use super::super::{
        Action, Event, LogLevel, QueueTime, ReplicaId, ReplicaState, ScrapeError, ScrapedQueue,
    };

    fn scraped_config(extra_scaling: &str) -> String {
        let signal = "[model.signal]\nscrape = \"http://127.0.0.1:{port}/metrics?r={replica}\"\n\
                      format = \"llamacpp\"\ninterval = \"250ms\"\n";
        format!(
            "{BASE}{}",
            model(
                "m",
                "",
                &format!("min = 1\nmax = 4\nwarm_pool = 1\ntarget_wait = \"300ms\"\n{extra_scaling}\n{signal}")
            )
        )
    }

    fn scrapes(actions: &[Action]) -> Vec<(ReplicaId, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Scrape { replica, url, .. } => Some((replica.clone(), url.clone())),
                _ => None,
            })
            .collect()
    }

    fn warns(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Log {
                    level: LogLevel::Warn,
                    message,
                    ..
                } => Some(message.clone()),
                _ => None,
            })
            .collect()
    }

    /// A node with one routed and one warm replica of model `m`.
    fn running() -> (Harness, ReplicaId) {
        let mut h = Harness::new(&scraped_config(""));
        let first = h.log.clone();
        h.settle(first);
        let routed = h.in_state("m", ReplicaState::Routed);
        assert_eq!(routed.len(), 1);
        assert_eq!(h.in_state("m", ReplicaState::Warm).len(), 1);
        (h, routed[0].clone())
    }

    fn answer(
        h: &mut Harness,
        id: &ReplicaId,
        q: Result<ScrapedQueue, ScrapeError>,
    ) -> Vec<Action> {
        h.send(Event::Scraped {
            replica: id.clone(),
            outcome: q,
        })
    }

    fn last_wait(h: &Harness, id: &ReplicaId) -> f64 {
        h.node.held.replicas()[id]
            .signal
            .last()
            .unwrap()
            .oldest_wait_ms
    }

    #[test]
    fn only_routed_replicas_are_scraped_one_request_at_a_time() {
        let (mut h, r) = running();
        let out = h.advance(Duration::from_millis(250));
        let port = h.node.held.replicas()[&r].port.unwrap();
        assert_eq!(
            scrapes(&out),
            vec![(
                r.clone(),
                format!("http://127.0.0.1:{port}/metrics?r={}", r.0)
            )],
            "the warm replica is not scraped; placeholders expand per replica"
        );
        // Still out: no second request however long it takes.
        assert!(scrapes(&h.run_for(Duration::from_secs(2))).is_empty());
        answer(&mut h, &r, Ok(ScrapedQueue::default()));
        assert_eq!(scrapes(&h.advance(Duration::from_millis(250))).len(), 1);
    }

    #[test]
    fn without_a_server_wait_the_oldest_wait_is_how_long_the_queue_has_been_non_empty() {
        let (mut h, r) = running();
        let busy = ScrapedQueue {
            queue_depth: 2,
            in_flight: 3,
            ..Default::default()
        };
        answer(&mut h, &r, Ok(busy));
        assert_eq!(last_wait(&h, &r), 0.0, "first sight of the queue");
        h.now = h.now + Duration::from_millis(200);
        answer(&mut h, &r, Ok(busy));
        assert_eq!(last_wait(&h, &r), 200.0);
        h.now = h.now + Duration::from_millis(200);
        answer(&mut h, &r, Ok(ScrapedQueue::default()));
        assert_eq!(last_wait(&h, &r), 0.0, "an empty queue resets the bound");
        h.now = h.now + Duration::from_millis(200);
        answer(&mut h, &r, Ok(busy));
        assert_eq!(
            last_wait(&h, &r),
            200.0,
            "they arrived after the previous scrape at the earliest"
        );
    }

    #[test]
    fn departures_seen_as_falling_depth_tighten_the_bound_fifo() {
        let (mut h, r) = running();
        let depth = |d: u64| ScrapedQueue {
            queue_depth: d,
            in_flight: d + 1,
            ..Default::default()
        };
        for d in [2, 4, 6] {
            answer(&mut h, &r, Ok(depth(d)));
            h.now = h.now + Duration::from_secs(1);
        }
        // Non-empty for 3 s, but the 4 oldest have left: the head arrived after the 2nd scrape.
        answer(&mut h, &r, Ok(depth(2)));
        assert_eq!(last_wait(&h, &r), 2000.0);
    }

    #[test]
    fn the_bound_alone_promotes_the_warm_replica_once_past_target() {
        let (mut h, r) = running();
        let busy = ScrapedQueue {
            queue_depth: 3,
            in_flight: 4,
            ..Default::default()
        };
        answer(&mut h, &r, Ok(busy));
        h.now = h.now + Duration::from_millis(250);
        answer(&mut h, &r, Ok(busy));
        assert_eq!(
            h.in_state("m", ReplicaState::Routed).len(),
            1,
            "250 ms < target"
        );
        h.now = h.now + Duration::from_millis(250);
        answer(&mut h, &r, Ok(busy));
        assert_eq!(
            h.in_state("m", ReplicaState::Routed).len(),
            2,
            "500 ms > 300 ms target: the warm replica is promoted on this scrape"
        );
    }

    #[test]
    fn queue_time_totals_give_the_mean_wait_of_the_requests_that_left_the_queue() {
        let (mut h, r) = running();
        let q = |total_ms: f64, count: u64| ScrapedQueue {
            queue_depth: 4,
            in_flight: 12,
            queue_time: Some(QueueTime { total_ms, count }),
            ..Default::default()
        };
        answer(&mut h, &r, Ok(q(10_000.0, 100)));
        for _ in 0..8 {
            h.now = h.now + Duration::from_millis(250);
            answer(&mut h, &r, Ok(q(10_000.0, 100)));
        }
        assert_eq!(
            last_wait(&h, &r),
            2000.0,
            "nobody left the queue: only the bound speaks"
        );
        h.now = h.now + Duration::from_millis(250);
        answer(&mut h, &r, Ok(q(10_600.0, 103)));
        assert_eq!(last_wait(&h, &r), 200.0, "(10600 - 10000) / (103 - 100)");
        // The estimate never exceeds the bound.
        h.now = h.now + Duration::from_millis(250);
        answer(&mut h, &r, Ok(q(20_600.0, 104)));
        assert_eq!(last_wait(&h, &r), 2500.0);
        // Totals that go backwards (a restart) give no estimate until the next pair.
        h.now = h.now + Duration::from_millis(250);
        answer(&mut h, &r, Ok(q(50.0, 1)));
        assert_eq!(last_wait(&h, &r), 2750.0);
        h.now = h.now + Duration::from_millis(250);
        answer(&mut h, &r, Ok(q(150.0, 2)));
        assert_eq!(last_wait(&h, &r), 100.0);
    }

    #[test]
    fn a_failing_scrape_is_no_signal_and_is_logged_once_per_episode() {
        let (mut h, r) = running();
        answer(&mut h, &r, Ok(ScrapedQueue::default()));
        let samples = h.node.held.replicas()[&r].signal.history.len();
        let mut logged = Vec::new();
        for _ in 0..5 {
            h.now = h.now + Duration::from_millis(250);
            logged.extend(warns(&answer(&mut h, &r, Err(ScrapeError::Refused))));
        }
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(logged[0].contains("connection refused"), "{logged:?}");
        assert_eq!(h.node.held.replicas()[&r].signal.history.len(), samples);
        answer(&mut h, &r, Ok(ScrapedQueue::default()));
        let again = warns(&answer(
            &mut h,
            &r,
            Err(ScrapeError::Timeout(Duration::from_secs(2))),
        ));
        assert_eq!(again.len(), 1, "a new episode is logged again");
    }
}
