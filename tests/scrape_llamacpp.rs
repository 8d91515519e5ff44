//! End to end with llama.cpp's real server: hearth scrapes `llamacpp:requests_deferred` from the
//! routed replica, sees the queue a burst of long completions builds behind its single slot, and
//! promotes the warm replica within 2 s; every request succeeds.
//!
//! Nothing reports on the socket here (llama.cpp knows nothing of hearth): scraping is the only
//! signal there is, so the promotion shows the scrape path works.

mod support;

use std::time::{Duration, Instant};

use hearth::client::Client;
use hearth::protocol::Request;
use serde_json::Value;
use support::{complete, port_range, real_model_dir, tokens_for, Daemon, LlamaModel};

const MODEL: &str = "tiny";
const BURST: usize = 5;

fn routed_addrs(event: &Value) -> Option<Vec<String>> {
    if event["event"] != "routed" {
        return None;
    }
    Some(
        event["endpoints"]
            .as_array()?
            .iter()
            .filter_map(|e| e["addr"].as_str().map(String::from))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_requests_scraped_from_llama_cpp_promote_the_warm_replica() {
    let real = real_model_dir();
    let ports = port_range(20);
    let model = LlamaModel {
        name: MODEL,
        parallel: 1,
        ctx: 2048,
        min: 1,
        max: 3,
        warm_pool: 1,
        target_wait: "300ms",
        interval: "250ms",
    };
    let daemon = Daemon::start(&real, |dir| model.config(&real, dir, ports));
    let ready = |m: &Value| m["routed"] == 1 && m["warm"] == 1;
    let status =
        tokio::task::block_in_place(|| daemon.wait_for(MODEL, Duration::from_secs(90), ready));
    assert_eq!(status["desired_routed"], 1, "{status}");

    // Watch from here on: the first event is the routed set as it is.
    let mut watch = Client::connect(&daemon.socket).await.expect("socket");
    let ok = watch
        .call(&Request::Watch {
            model: Some(MODEL.into()),
        })
        .await
        .expect("watch");
    assert_eq!(ok["ok"], true, "{ok}");
    let first = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a routed snapshot")
        .expect("the watch stays open");
    let routed = routed_addrs(&first).unwrap_or_else(|| panic!("snapshot first: {first}"));
    assert_eq!(routed.len(), 1, "{first}");
    let addr = routed[0].clone();

    let http = support::http();
    // Long enough that each request keeps the only slot for ~0.6 s on this machine today.
    let n_predict = tokens_for(&http, &addr, Duration::from_millis(600), 1900).await;

    // Events as they come, stamped on arrival.
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<(Instant, Value)>();
    tokio::spawn(async move {
        while let Some(ev) = watch.next().await {
            if tx.send((Instant::now(), ev)).is_err() {
                break;
            }
        }
    });

    // The burst: all at once at the routed replica; all but one wait behind the single slot.
    let sent = Instant::now();
    let burst: Vec<_> = (0..BURST)
        .map(|_| {
            let http = http.clone();
            let addr = addr.clone();
            tokio::spawn(async move { complete(&http, &addr, n_predict).await })
        })
        .collect();

    // hearth only knows of the queue by scraping; watch it see the queue, then promote.
    let mut scale_reason = None;
    let promoted_at = loop {
        let left = Duration::from_secs(10).saturating_sub(sent.elapsed());
        let Ok(Some((at, ev))) = tokio::time::timeout(left, events.recv()).await else {
            panic!(
                "no promotion within 10 s of the burst; status: {}\nlog:\n{}",
                daemon.status(MODEL),
                daemon.log_tail()
            );
        };
        if ev["event"] == "scale" {
            scale_reason = ev["reason"].as_str().map(String::from);
        }
        if let Some(set) = routed_addrs(&ev) {
            if set.len() >= 2 {
                assert!(set.contains(&addr), "the busy replica stays routed: {ev}");
                break at;
            }
        }
    };
    let took = promoted_at.duration_since(sent);
    let status = daemon.status(MODEL);
    eprintln!(
        "n_predict {n_predict}: first deferred request -> promotion in {} ms; scale reason: {:?}; \
         signal then: {}",
        took.as_millis(),
        scale_reason,
        status["signal"]
    );
    assert!(
        took <= Duration::from_secs(2),
        "promotion took {took:?} (more than 2 s)\nlog:\n{}",
        daemon.log_tail()
    );
    let reason = scale_reason.expect("a scale event names the reason");
    assert!(reason.contains("wait"), "{reason}");

    // Every request of the burst is answered in full.
    for (i, h) in burst.into_iter().enumerate() {
        let (code, tokens, body) = h.await.expect("request task").expect("request");
        assert_eq!(code, 200, "request {i}: {body}");
        assert_eq!(
            tokens, n_predict as u64,
            "request {i} generated all its tokens"
        );
    }
    // The pool is refilled after the promotion.
    tokio::task::block_in_place(|| {
        daemon.wait_for(MODEL, Duration::from_secs(60), |m| {
            m["routed"].as_u64() >= Some(2) && m["warm"] == 1
        })
    });
}
