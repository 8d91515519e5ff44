//! NVIDIA Triton Inference Server's metrics port (`--metrics-port`, 8002 by default).
//!
//! Series carry `model` and `version` labels; a server may hold several models and versions, and
//! the replica's figures are the sums over all of them.
//!
//! - `queue_depth` = Σ `nv_inference_pending_request_count` (requests Triton accepted that no
//!   backend has started executing) + Σ `nv_trt_llm_request_metrics{request_type="waiting"}`
//!   where the TensorRT-LLM backend runs: its in-flight batcher takes requests off Triton's queue
//!   at once and queues them inside, so Triton's own pending count stays near zero.
//! - `in_flight` = queue + Σ `nv_trt_llm_request_metrics{request_type="active"}` where present.
//!   Other backends expose no count of executing requests, so there `in_flight` is the queue
//!   alone — a lower bound (a draining replica is stopped once nothing is pending; Triton's own
//!   SIGTERM handling lets executing requests finish within `--exit-timeout-secs`).
//! - `queue_time` = Σ `nv_inference_queue_duration_us` (cumulative µs in the scheduling queue,
//!   in ms) over Σ `nv_inference_request_success` (the requests those µs belong to; both include
//!   response-cache hits). The core turns two scrapes into the mean queue time of the requests
//!   that finished in between, capped by the non-empty bound. Not given where the TensorRT-LLM
//!   batcher queues internally: Triton's queue duration does not see that wait, and a near-zero
//!   mean would hide the real queue; there the bound alone speaks.
//! - `completed` = Σ `nv_inference_request_success` + Σ `nv_inference_request_failure`.
//! - `arrived`: none; Triton counts no arrivals.
//!
//! Ensembles: Triton counts a request once for every model it passes through (the ensemble and
//! each of its steps), so summing the counters of all models counts one request several times,
//! and Σ queue time over Σ requests is a per-step mean, not a per-request one. With
//! `[model.signal] models = ["ENSEMBLE"]` the counters (`queue_time`, `completed`) are those of
//! the named models alone, the ones clients call; the ensemble's queue duration is what its
//! requests waited in its steps' queues. `queue_depth` still sums every model: a waiting request
//! waits in one queue at a time.

use super::{Exposition, Point, ScrapeError};
use crate::core::{QueueTime, ScrapedQueue};

const FORMAT: &str = "Triton (metrics port)";

fn trtllm(kind: &'static str) -> impl Fn(&Point) -> bool {
    move |p| p.label("request_type") == Some(kind)
}

#[cfg(test)]
pub fn queue(e: &Exposition) -> Result<ScrapedQueue, ScrapeError> {
    queue_of(e, &[])
}

/// The queue, with the request counters of `models` alone (empty: every model).
pub fn queue_of(e: &Exposition, models: &[String]) -> Result<ScrapedQueue, ScrapeError> {
    let called = |p: &Point| {
        models.is_empty()
            || p.label("model")
                .is_some_and(|m| models.iter().any(|n| n == m))
    };
    if !models.is_empty() && !e.points("nv_inference_request_success").iter().any(&called) {
        return Err(ScrapeError::NoModel {
            format: FORMAT.to_string(),
            models: models.to_vec(),
            series: "nv_inference_request_success".to_string(),
        });
    }
    let sum = |name: &str| e.sum_where(name, called);
    let count = |name: &str| sum(name).and_then(super::to_count);
    let pending = e.require_count("nv_inference_pending_request_count", FORMAT)?;
    let count_where = |kind| {
        e.sum_where("nv_trt_llm_request_metrics", trtllm(kind))
            .and_then(super::to_count)
    };
    let trt_waiting = count_where("waiting");
    let trt_active = count_where("active").unwrap_or(0);
    let queue_depth = pending + trt_waiting.unwrap_or(0);
    let queue_time = match (
        trt_waiting,
        sum("nv_inference_queue_duration_us"),
        count("nv_inference_request_success"),
    ) {
        (None, Some(us), Some(count)) if us >= 0.0 => Some(QueueTime {
            total_ms: us / 1000.0,
            count,
        }),
        _ => None,
    };
    let completed = count("nv_inference_request_success")
        .map(|ok| ok + count("nv_inference_request_failure").unwrap_or(0));
    Ok(ScrapedQueue {
        queue_depth,
        in_flight: queue_depth + trt_active,
        oldest_wait_ms: None,
        queue_time,
        arrived: None,
        completed,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::TRITON;
    use super::*;

    /// `tests/fixtures/scrape/triton.prom`: two versions of one model and a second model, as
    /// prometheus-cpp renders Triton's page (summaries with `_count`/`_sum` before quantiles).
    #[test]
    fn models_and_versions_are_summed() {
        let q = queue(&Exposition::parse(TRITON).unwrap()).unwrap();
        assert_eq!(q.queue_depth, 3 + 1);
        assert_eq!(q.in_flight, 4, "no executing count outside TensorRT-LLM");
        assert_eq!(q.completed, Some(100 + 20 + 120 + 2 + 1));
        assert_eq!(q.arrived, None);
        let qt = q.queue_time.unwrap();
        assert_eq!(qt.count, 240);
        assert!((qt.total_ms - 6_002.0).abs() < 1e-9, "{}", qt.total_ms);
    }

    #[test]
    fn an_ensemble_s_requests_count_once() {
        // `preprocess` → `llama` behind the ensemble `ens`: 120 requests, each counted by all
        // three models; the ensemble's queue time is its steps' together.
        let page = TRITON
            .replace(
                "nv_inference_request_success{model=\"preprocess\",version=\"1\"} 120\n",
                "nv_inference_request_success{model=\"preprocess\",version=\"1\"} 120\n\
             nv_inference_request_success{model=\"ens\",version=\"1\"} 120\n",
            )
            .replace(
                "nv_inference_queue_duration_us{model=\"preprocess\",version=\"1\"} 2000\n",
                "nv_inference_queue_duration_us{model=\"preprocess\",version=\"1\"} 2000\n\
             nv_inference_queue_duration_us{model=\"ens\",version=\"1\"} 6002000\n",
            );
        let e = Exposition::parse(&page).unwrap();
        let all = queue(&e).unwrap();
        assert_eq!(all.queue_time.unwrap().count, 360, "every step counted");
        let ens = queue_of(&e, &["ens".to_string()]).unwrap();
        let qt = ens.queue_time.unwrap();
        assert_eq!(qt.count, 120, "each request once");
        assert!((qt.total_ms - 6_002.0).abs() < 1e-9, "{}", qt.total_ms);
        assert_eq!(ens.completed, Some(120));
        assert_eq!(ens.queue_depth, 4, "waiting requests in every step's queue");
        let err = queue_of(&e, &["nope".to_string()]).unwrap_err().to_string();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn tensorrt_llm_queues_inside_the_backend() {
        let trt = format!(
            "{TRITON}# HELP nv_trt_llm_request_metrics TRT LLM request metrics\n\
             # TYPE nv_trt_llm_request_metrics gauge\n\
             nv_trt_llm_request_metrics{{model=\"tensorrt_llm\",request_type=\"waiting\",version=\"1\"}} 6\n\
             nv_trt_llm_request_metrics{{model=\"tensorrt_llm\",request_type=\"context\",version=\"1\"}} 2\n\
             nv_trt_llm_request_metrics{{model=\"tensorrt_llm\",request_type=\"scheduled\",version=\"1\"}} 9\n\
             nv_trt_llm_request_metrics{{model=\"tensorrt_llm\",request_type=\"max\",version=\"1\"}} 64\n\
             nv_trt_llm_request_metrics{{model=\"tensorrt_llm\",request_type=\"active\",version=\"1\"}} 9\n"
        );
        let q = queue(&Exposition::parse(&trt).unwrap()).unwrap();
        assert_eq!(q.queue_depth, 4 + 6);
        assert_eq!(q.in_flight, 10 + 9, "`max` and `scheduled` are not added");
        assert_eq!(
            q.queue_time, None,
            "Triton's queue time does not see the backend's queue"
        );
    }
}
