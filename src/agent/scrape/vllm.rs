//! vLLM's `/metrics` (`vllm serve`; the V1 engine, and V0's names where they differ).
//!
//! Every series carries `model_name`, and with data parallelism one set per engine (`engine`
//! label); the replica's figures are the sums over all of them.
//!
//! - `queue_depth` = Σ `vllm:num_requests_waiting`: requests the scheduler has not admitted.
//! - `in_flight` = waiting + Σ `vllm:num_requests_running` (+ Σ `vllm:num_requests_swapped`
//!   on V0, preempted requests parked on the CPU that still hold their admission).
//! - `queue_time` = Σ `vllm:request_queue_time_seconds_sum` (in ms) and Σ `…_count`: the
//!   histogram of time spent WAITING, observed when a request leaves the queue. Between two
//!   scrapes the core divides the deltas — the mean wait of the requests that started service
//!   in between — and uses it as the server's estimate of the oldest wait, never above the bound
//!   of how long the queue has been non-empty. When no request left the queue, no estimate: the
//!   bound speaks alone (a queue that is not moving is aging). The mean of departed requests
//!   trails the head of a growing queue and matches it in a steady one.
//! - `completed` = Σ `vllm:request_success_total` over every `finished_reason` (stop, length,
//!   abort…): every request that finished.
//! - `arrived`: none; vLLM counts no arrivals.
//! - `oldest_wait_ms`: none; vLLM does not show the age of its oldest waiting request.

use super::{Exposition, ScrapeError};
use crate::core::{QueueTime, ScrapedQueue};

const FORMAT: &str = "vLLM";

pub fn queue(e: &Exposition) -> Result<ScrapedQueue, ScrapeError> {
    let waiting = e.require_count("vllm:num_requests_waiting", FORMAT)?;
    let running = e.require_count("vllm:num_requests_running", FORMAT)?;
    let swapped = e.count("vllm:num_requests_swapped").unwrap_or(0);
    let queue_time = match (
        e.sum("vllm:request_queue_time_seconds_sum"),
        e.count("vllm:request_queue_time_seconds_count"),
    ) {
        (Some(seconds), Some(count)) if seconds >= 0.0 => Some(QueueTime {
            total_ms: seconds * 1000.0,
            count,
        }),
        _ => None,
    };
    Ok(ScrapedQueue {
        queue_depth: waiting,
        in_flight: waiting + running + swapped,
        oldest_wait_ms: None,
        queue_time,
        arrived: None,
        completed: e.count("vllm:request_success_total"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::VLLM;
    use super::*;

    /// `tests/fixtures/scrape/vllm.prom`: vLLM V1 with two data-parallel engines, as Python's
    /// client renders it (sorted labels, `.0` floats, `_created` gauges after each family).
    #[test]
    fn engines_are_summed_and_the_queue_time_histogram_is_read() {
        let q = queue(&Exposition::parse(VLLM).unwrap()).unwrap();
        assert_eq!(q.queue_depth, 5 + 2);
        assert_eq!(q.in_flight, 7 + 8 + 8);
        assert_eq!(q.completed, Some(100 + 20 + 1 + 90 + 10));
        assert_eq!(q.arrived, None);
        assert_eq!(q.oldest_wait_ms, None);
        let qt = q.queue_time.unwrap();
        assert_eq!(qt.count, 129 + 108);
        assert!((qt.total_ms - 37_500.0).abs() < 1e-6, "{}", qt.total_ms);
    }

    #[test]
    fn two_scrapes_give_the_mean_wait_of_the_requests_admitted_between_them() {
        let before = queue(&Exposition::parse(VLLM).unwrap()).unwrap();
        // Engine 0 admits four more requests that waited 2.5 s in all.
        let later = VLLM
            .replace(
                "vllm:request_queue_time_seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 129.0",
                "vllm:request_queue_time_seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 133.0",
            )
            .replace(
                "vllm:request_queue_time_seconds_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 29.25",
                "vllm:request_queue_time_seconds_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 31.75",
            );
        assert_ne!(later, VLLM, "the fixture holds the lines replaced");
        let after = queue(&Exposition::parse(&later).unwrap()).unwrap();
        let mean = after
            .queue_time
            .unwrap()
            .mean_since(&before.queue_time.unwrap())
            .unwrap();
        assert!((mean - 625.0).abs() < 1e-6, "{mean}");
    }

    #[test]
    fn v0_pages_without_the_histogram_still_give_the_queue() {
        let v0 = "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n\
                  # TYPE vllm:num_requests_running gauge\n\
                  vllm:num_requests_running{model_name=\"facebook/opt-125m\"} 3.0\n\
                  # HELP vllm:num_requests_swapped Number of requests swapped to CPU.\n\
                  # TYPE vllm:num_requests_swapped gauge\n\
                  vllm:num_requests_swapped{model_name=\"facebook/opt-125m\"} 1.0\n\
                  # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
                  # TYPE vllm:num_requests_waiting gauge\n\
                  vllm:num_requests_waiting{model_name=\"facebook/opt-125m\"} 6.0\n";
        let q = queue(&Exposition::parse(v0).unwrap()).unwrap();
        assert_eq!((q.queue_depth, q.in_flight), (6, 10));
        assert_eq!((q.queue_time, q.completed), (None, None));
    }
}
