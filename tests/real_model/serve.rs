//! A real model server: llama.cpp's server with a tiny GGUF on the CPU (scripts/real-model.sh).
//! Readiness is a real completion; a warm-up whose expected answer never comes never routes.

use std::time::Duration;

use testkit::*;

/// llama.cpp's server with its OpenAI-shaped endpoint as the warm-up, expecting `expect_body`.
fn llama_model(name: &str, expect_body: &str) -> Model {
    let mut m = Model::llama(name, &["-np", "1", "--metrics"]);
    m.warmup.path = "/v1/completions".into();
    m.warmup.body = r#"{"prompt":"Hello","max_tokens":4}"#.into();
    m.warmup.expect_body = expect_body.into();
    m.warmup.timeout = "30s".into();
    m.warmup.startup_timeout = "5m".into();
    m.liveness = None;
    m
}

#[test]
fn a_real_llama_server_becomes_routed_through_a_real_completion() {
    let d = Daemon::start([
        llama_model("tiny", "choices"),
        llama_model("never", "NEVER-IN-ANSWER"),
    ]);
    let w = d.watch(None);

    let (_, ev) = w
        .wait_for(0, Duration::from_secs(90), |v| {
            v["event"] == "routed" && v["model"] == "tiny" && endpoint_ids(v).len() == 1
        })
        .expect("the real model routed");
    assert_eq!(endpoint_ids(&ev.v), ["tiny-1"], "{}", ev.v);
    let (_, addr) = endpoints(&ev.v).remove(0);
    // The warm-up passed before routing.
    assert!(
        w.wait_for(0, Duration::ZERO, replica_event("tiny-1", "warm"))
            .is_some(),
        "routed without a warm state first: {:?}",
        w.values()
    );
    let r = http(
        &addr,
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"Once upon a time","max_tokens":8}"#),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("completion at {addr}: {e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    assert!(v["choices"][0]["text"].is_string(), "{}", r.body);
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{}",
        r.body
    );

    // The other model answers too, but never what its warm-up expects: it stays starting, and
    // status quotes the answer.
    let reason = wait_until(
        "never-1's reason quoting the real answer",
        Duration::from_secs(30),
        || {
            d.replicas("never")
                .into_iter()
                .find(|r| r["id"] == "never-1" && r["state"] == "starting")
                .and_then(|r| r["reason"].as_str().map(str::to_string))
                .filter(|r| r.contains("NEVER-IN-ANSWER"))
        },
    );
    assert!(
        reason.contains("HTTP 200") && reason.contains("choices"),
        "the reason should quote the answer: {reason}"
    );
    // Watch it for a few seconds more: it never becomes warm or routed.
    let bad = w.wait_for(0, Duration::from_secs(4), |v| {
        (v["event"] == "replica"
            && v["model"] == "never"
            && (v["state"] == "warm" || v["state"] == "routed"))
            || (v["event"] == "routed" && v["model"] == "never" && !endpoint_ids(v).is_empty())
    });
    assert!(
        bad.is_none(),
        "the never model got routed: {:?}",
        bad.map(|b| b.1.v)
    );
    let m = d.model("never");
    assert_eq!(m["routed"], 0, "{m}");
    assert_eq!(m["warm"], 0, "{m}");
    assert_eq!(m["starting"], 1, "{m}");
    // And the good model is still routed.
    assert_eq!(d.model("tiny")["routed"], 1);
}
