//! Queue signal from servers that cannot report on the socket: their own Prometheus metrics,
//! scraped on every routed and draining replica at `[model.signal] interval`.

use std::time::Duration;

use super::event::{Action, LogLevel, ScrapedQueue};
use super::node::Node;
use super::replica::{ReplicaId, ReplicaState};
use super::signal::Sample;
use super::Time;

impl Node {
    /// Asks for the scrapes that are due (called on every tick).
    pub(super) fn schedule_scrapes(&mut self, now: Time, out: &mut Vec<Action>) {
        for r in self.replicas.values_mut() {
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
            let vars = crate::config::Placeholders {
                port: r.port.unwrap_or(0),
                replica: r.id.0.clone(),
                model: r.model.clone(),
                gpus: self.gpus.uuids(&r.gpus).join(","),
            };
            r.scrape_in_flight = true;
            r.scrape_next = now + sig.interval;
            out.push(Action::Scrape {
                replica: r.id.clone(),
                url: crate::config::expand(&sig.scrape, &vars),
                format: sig.format,
                timeout: sig
                    .interval
                    .clamp(Duration::from_millis(500), Duration::from_secs(5)),
            });
        }
    }

    pub(super) fn scraped(
        &mut self,
        id: &ReplicaId,
        outcome: Result<ScrapedQueue, String>,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(r) = self.replicas.get_mut(id) else {
            return;
        };
        r.scrape_in_flight = false;
        let model = r.model.clone();
        let q = match outcome {
            Ok(q) => q,
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
        // The oldest waiting request cannot have waited longer than the queue has been
        // continuously non-empty, as far as the scrapes saw it.
        let bound_ms = if q.queue_depth > 0 {
            let since = *r.queue_nonempty_since.get_or_insert(now);
            now.since(since).as_secs_f64() * 1000.0
        } else {
            r.queue_nonempty_since = None;
            0.0
        };
        let wait = q.oldest_wait_ms.map_or(bound_ms, |w| w.min(bound_ms));
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
        self.autoscale(&model, now, true, out);
    }
}
