//! Hugging Face Text Generation Inference: the router's `/metrics`.
//!
//! - `queue_depth` = `tgi_queue_size`: requests in the router's queue, not yet in a batch.
//! - `in_flight` = queue + `tgi_batch_current_size` (requests in the running batch).
//! - `queue_time` = `tgi_request_queue_duration_sum` (seconds, in ms) and `…_count`: the
//!   histogram of time each request spent in the queue, observed when it enters a batch. As for
//!   vLLM, the core turns two scrapes into the mean wait of the requests batched in between and
//!   caps it by the non-empty bound; with no request batched in between, the bound alone.
//! - `arrived` = `tgi_request_count` (every request the router received).
//! - `completed` = `tgi_request_success` + Σ `tgi_request_failure` (all `err` labels): every
//!   request that has finished, one way or the other.
//! - `oldest_wait_ms`: none; TGI does not show the age of its oldest queued request.

use super::{Exposition, ScrapeError};
use crate::core::{QueueTime, ScrapedQueue};

const FORMAT: &str = "TGI (text-generation-inference)";

pub fn queue(e: &Exposition) -> Result<ScrapedQueue, ScrapeError> {
    let queued = e.require_count("tgi_queue_size", FORMAT)?;
    let batch = e.require_count("tgi_batch_current_size", FORMAT)?;
    let queue_time = match (
        e.sum("tgi_request_queue_duration_sum"),
        e.count("tgi_request_queue_duration_count"),
    ) {
        (Some(seconds), Some(count)) if seconds >= 0.0 => Some(QueueTime {
            total_ms: seconds * 1000.0,
            count,
        }),
        _ => None,
    };
    // Failures are counted only once one happened: no series is no failure.
    let completed = e
        .count("tgi_request_success")
        .map(|ok| ok + e.count("tgi_request_failure").unwrap_or(0));
    Ok(ScrapedQueue {
        queue_depth: queued,
        in_flight: queued + batch,
        oldest_wait_ms: None,
        queue_time,
        arrived: e.count("tgi_request_count"),
        completed,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::TGI;
    use super::*;

    /// `tests/fixtures/scrape/tgi.prom`: the router's page as metrics-exporter-prometheus
    /// renders it (blank line after each family, integers, some families without HELP).
    #[test]
    fn queue_batch_counters_and_the_queue_time_histogram() {
        let q = queue(&Exposition::parse(TGI).unwrap()).unwrap();
        assert_eq!(q.queue_depth, 4);
        assert_eq!(q.in_flight, 20);
        assert_eq!(q.arrived, Some(1200));
        assert_eq!(q.completed, Some(1150 + 3 + 27));
        assert_eq!(q.oldest_wait_ms, None);
        let qt = q.queue_time.unwrap();
        assert_eq!(qt.count, 1176);
        assert!((qt.total_ms - 27_500.0).abs() < 1e-6, "{}", qt.total_ms);
    }

    #[test]
    fn a_page_without_failures_or_histogram_still_gives_the_queue() {
        let minimal = "# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n\n\
                       # TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 2\n\n\
                       # TYPE tgi_request_success counter\ntgi_request_success 7\n\n";
        let q = queue(&Exposition::parse(minimal).unwrap()).unwrap();
        assert_eq!((q.queue_depth, q.in_flight), (0, 2));
        assert_eq!(
            (q.completed, q.arrived, q.queue_time),
            (Some(7), None, None)
        );
    }
}
