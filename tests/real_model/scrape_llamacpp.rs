//! End to end with llama.cpp's real server: hearth scrapes `llamacpp:requests_deferred` from the
//! routed replica, sees the queue that a burst of long completions builds behind its single slot,
//! and promotes the warm replica; every request succeeds, and the promotion refills the pool.
//! How long the promotion took is printed, not asserted: a loaded machine makes it whatever it
//! is, and a latency belongs in a benchmark (the 10 s wait only bounds the test).
//!
//! The burst is closed-loop (testkit's `Burst`) and stops once the promotion is seen, so the
//! queue lasts as long as hearth needs to see it, however fast this machine is at the moment.
//!
//! Nothing reports on the socket here (llama.cpp knows nothing of hearth): scraping is the only
//! signal there is, so the promotion shows the scrape path works.

use std::time::{Duration, Instant};

use testkit::status::{ids, replicas_of};
use testkit::*;

const MODEL: &str = "tiny";
const BURST: usize = 5;
/// How long the burst's clients go on if no promotion stops them (the wait below is 10 s).
const BURST_LONGEST: Duration = Duration::from_secs(15);

#[test]
fn deferred_requests_scraped_from_llama_cpp_promote_the_warm_replica() {
    let model = Model::llama_one_slot(MODEL)
        .scale(1, 3, 1)
        .target_wait("300ms");
    let d = Daemon::builder().tick("100ms").model(model).start();
    let status = d.wait_model(MODEL, "1 routed + 1 warm", Duration::from_secs(90), |m| {
        m["routed"] == 1 && m["warm"] == 1
    });
    assert_eq!(status["desired_routed"], 1, "{status}");
    let initial = ids(&replicas_of(&status));

    // Watch from here on: the first event is the routed set as it is.
    let watch = d.watch(Some(MODEL));
    let (_, first) = watch
        .wait_for(0, Duration::from_secs(5), |v| v["event"] == "routed")
        .expect("a routed snapshot");
    let routed = endpoints(&first.v);
    assert_eq!(routed.len(), 1, "{}", first.v);
    let addr = routed[0].1.clone();

    // Long enough that each request keeps the only slot for ~0.6 s on this machine today.
    let n_predict = tokens_for(&addr, Duration::from_millis(600), 1900);

    // The burst: all at once at the routed replica; all but one wait behind the single slot,
    // and go on waiting there until hearth has promoted.
    let mark = watch.len();
    let sent = Instant::now();
    let burst = Burst::start(&addr, n_predict, BURST, BURST_LONGEST);

    // hearth only knows of the queue by scraping; watch it see the queue, then promote.
    let promoted = watch.wait_for(mark, Duration::from_secs(10), |v| {
        v["event"] == "routed" && endpoints(v).len() >= 2
    });
    burst.stop();
    let (i_promoted, promoted) = promoted.unwrap_or_else(|| {
        panic!(
            "no promotion within 10 s of a burst of {BURST} clients of {n_predict} tokens; status: {}\nlog:\n{}",
            d.model(MODEL),
            d.log_tail(60)
        )
    });
    assert!(
        endpoints(&promoted.v).iter().any(|(_, a)| *a == addr),
        "the busy replica stays routed: {}",
        promoted.v
    );
    let scale_reason = watch.values()[mark..i_promoted]
        .iter()
        .rev()
        .find(|v| v["event"] == "scale")
        .and_then(|v| v["reason"].as_str().map(String::from));
    let took = promoted.at.duration_since(sent);
    eprintln!(
        "n_predict {n_predict}: first deferred request -> promotion in {} ms; scale reason: {:?}; \
         signal then: {}",
        took.as_millis(),
        scale_reason,
        d.model(MODEL)["signal"]
    );
    let reason = scale_reason.expect("a scale event names the reason");
    assert!(reason.contains("wait"), "{reason}");

    // Every request of the burst is answered in full.
    let answers = burst.answers();
    assert!(answers.len() >= BURST, "{} answers", answers.len());
    for (i, (code, tokens, body)) in answers.iter().enumerate() {
        assert_eq!(*code, 200, "request {i}: {body}");
        assert_eq!(
            *tokens, n_predict as u64,
            "request {i} generated all its tokens"
        );
    }

    // The promotion refills the pool: a replica started for it becomes warm. While the burst's
    // queue lasts (longer on a slow machine) the policy may step up again and route that
    // replica as well; `max` then leaves no room for a pool, as it must. So the refill shows as
    // the new replica's `warm` event (routed only ever follows warm), and the fleet settles with
    // the pool `max` leaves room for, however many steps there were.
    watch
        .wait_for(i_promoted, Duration::from_secs(60), |v| {
            v["event"] == "replica"
                && v["state"] == "warm"
                && !initial.iter().any(|id| v["replica"] == id.as_str())
        })
        .expect("a replica started after the promotion becomes warm");
    d.wait_model(
        MODEL,
        "settled, the warm pool as full as max allows",
        Duration::from_secs(60),
        |m| {
            let n = |k: &str| m[k].as_u64().unwrap_or(0);
            n("starting") + n("pending") == 0
                && n("routed") >= 2
                && n("routed") == n("desired_routed")
                && n("warm") == 1.min(n("max").saturating_sub(n("routed")))
        },
    );
}
