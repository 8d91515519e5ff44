//! llama.cpp's `llama-server --metrics`.
//!
//! - `queue_depth` = `llamacpp:requests_deferred`: requests the server accepted but could not
//!   give a slot yet (all `-np` slots busy); they wait in its deferred queue.
//! - `in_flight` = deferred + `llamacpp:requests_processing` (requests holding a slot).
//! - `oldest_wait_ms`: none. llama.cpp measures no queue time, so the core bounds the oldest wait
//!   by how long the deferred queue has been non-empty across scrapes, tightened by FIFO
//!   departures (the core's `oldest_wait_bound`).
//! - `queue_time`, `arrived`, `completed`: none. Its counters count tokens
//!   (`prompt_tokens_total`, `tokens_predicted_total`) and decode calls (`n_decode_total`), not
//!   requests, so no request rate can be read from them.
//!
//! Both gauges are plain (unlabelled) and are read once per `/metrics` call from the server's
//! task loop, so they are consistent with each other.

use super::{Exposition, ScrapeError};
use crate::core::ScrapedQueue;

const FORMAT: &str = "llama.cpp (llama-server --metrics)";

pub fn queue(e: &Exposition) -> Result<ScrapedQueue, ScrapeError> {
    let deferred = e.require_count("llamacpp:requests_deferred", FORMAT)?;
    let processing = e.require_count("llamacpp:requests_processing", FORMAT)?;
    Ok(ScrapedQueue {
        queue_depth: deferred,
        in_flight: deferred + processing,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::LLAMACPP;
    use super::*;

    /// `tests/fixtures/scrape/llamacpp.prom` is a capture of llama.cpp's own server with
    /// `-np 1` while five long completions were sent at once: one in its slot, two deferred
    /// (two had finished).
    #[test]
    fn deferred_requests_are_the_queue() {
        let q = queue(&Exposition::parse(LLAMACPP).unwrap()).unwrap();
        assert_eq!(
            q,
            ScrapedQueue {
                queue_depth: 2,
                in_flight: 3,
                oldest_wait_ms: None,
                queue_time: None,
                arrived: None,
                completed: None,
            }
        );
    }

    #[test]
    fn an_idle_server_has_an_empty_queue() {
        let idle = LLAMACPP
            .replace(
                "llamacpp:requests_processing 1",
                "llamacpp:requests_processing 0",
            )
            .replace(
                "llamacpp:requests_deferred 2",
                "llamacpp:requests_deferred 0",
            );
        let q = queue(&Exposition::parse(&idle).unwrap()).unwrap();
        assert_eq!((q.queue_depth, q.in_flight), (0, 0));
    }

    #[test]
    fn a_server_without_the_gauges_is_an_error() {
        let old = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n";
        let err = queue(&Exposition::parse(old).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("llamacpp:requests_deferred"), "{err}");
    }
}
