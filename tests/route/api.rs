//! The front door's HTTP API against the real daemon and toy replicas: routing by the body's
//! model (and aliases), the prefix route, `/v1/models`, authentication, and the OpenAI-shaped
//! errors for bad requests, a full queue and a queue timeout, none of which disturbs other
//! clients.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::route::*;

const KEY: &str = "test-key-0123456789abcdef";
const T: Duration = Duration::from_secs(30);

fn authed(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> Resp {
    let bearer = format!("Bearer {KEY}");
    send(
        addr,
        method,
        path,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &bearer),
        ],
        body,
        T,
    )
    .and_then(Streaming::whole)
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn completion(model: &str) -> Vec<u8> {
    json!({"model": model, "prompt": "Hello there", "max_tokens": 4})
        .to_string()
        .into_bytes()
}

fn assert_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(v["error"]["type"].is_string(), "{v}");
}

#[test]
fn requests_go_to_their_models_replicas_and_bad_ones_get_openai_errors() {
    let (daemon, router, addr) = front_door(
        [
            Model::front_toy("alpha", &["--concurrency", "4", "--service-time", "10ms"])
                .scale(1, 1, 0),
            Model::front_toy("beta", &["--concurrency", "4", "--service-time", "10ms"])
                .scale(2, 2, 0),
        ],
        &format!(
            "max_body = \"1KiB\"\napi_keys = [\"{KEY}\"]\n\
         [route.aliases]\n\"gpt-x\" = \"beta\"\n\
         [route.model.alpha]\npaths = [\"/v1/completions\"]\n"
        ),
    );
    daemon.wait_routed("alpha", 1, T);
    daemon.wait_routed("beta", 2, T);
    wait_until("the router to see both routed sets", T, || {
        let v = authed(addr, "GET", "/v1/models", b"").json();
        let routed = |id: &str| {
            v["data"]
                .as_array()?
                .iter()
                .find(|m| m["id"] == id)
                .map(|m| m["hearth"]["routed"].clone())
        };
        (routed("alpha")? == json!(1) && routed("beta")? == json!(2)).then_some(())
    });

    // By model: alpha's requests to alpha's replica, beta's spread over both of beta's.
    let mut beta_seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let r = authed(addr, "POST", "/v1/completions", &completion("alpha"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            r.header("x-hearth-replica").unwrap().starts_with("alpha-"),
            "{:?}",
            r.headers
        );
        let r = authed(addr, "POST", "/v1/completions", &completion("beta"));
        assert_eq!(r.status, 200, "{}", r.text());
        let id = r.header("x-hearth-replica").unwrap().to_string();
        assert!(id.starts_with("beta-"), "{id}");
        beta_seen.insert(id);
    }
    assert_eq!(
        beta_seen.len(),
        2,
        "both beta replicas served: {beta_seen:?}"
    );
    // An alias reaches its model, and the replica gets the model's own name.
    let r = authed(addr, "POST", "/v1/completions", &completion("gpt-x"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "beta", "the body's model was rewritten");
    // Embeddings are routed the same way (alpha's replica answers them).
    let r = authed(
        addr,
        "POST",
        "/v1/embeddings",
        json!({"model": "alpha", "input": "hi"})
            .to_string()
            .as_bytes(),
    );
    assert!(
        r.header("x-hearth-replica").unwrap().starts_with("alpha-"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "list", "{}", r.text());
    assert!(r.json()["data"][0]["embedding"].is_array(), "{}", r.text());
    let models = authed(addr, "GET", "/v1/models", b"").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["alpha", "beta", "gpt-x"], "{models}");
    assert_eq!(models["data"][2]["hearth"]["alias_of"], "beta");

    // Authentication: everything but /health.
    let r = complete(addr, "alpha", T).unwrap();
    assert_error(&r, 401, "invalid_api_key");
    let r = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer test-key-0123456789abcdeX")],
        &completion("alpha"),
        T,
    )
    .and_then(Streaming::whole)
    .unwrap();
    assert_error(&r, 401, "invalid_api_key");
    assert_eq!(get(addr, "/v1/models").unwrap().status, 401);
    assert_eq!(get(addr, "/metrics").unwrap().status, 401);
    let h = get(addr, "/health").unwrap();
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["daemon"], "connected");

    // Bad requests, each in the OpenAI shape.
    assert_error(
        &authed(addr, "POST", "/v1/completions", &completion("nope")),
        404,
        "model_not_found",
    );
    assert_error(
        &authed(addr, "POST", "/v1/chat/completions", b"{\"model\":"),
        400,
        "invalid_json",
    );
    assert_error(
        &authed(addr, "POST", "/v1/embeddings", b"{\"input\":\"x\"}"),
        400,
        "invalid_json",
    );
    assert_error(
        &authed(addr, "POST", "/v1/completions", b"[1,2]"),
        400,
        "invalid_json",
    );
    assert_error(
        &authed(addr, "POST", "/v1/completions", b"{\"model\":7}"),
        400,
        "invalid_json",
    );
    let big = json!({"model": "alpha", "prompt": "x".repeat(2000)}).to_string();
    assert_error(
        &authed(addr, "POST", "/v1/completions", big.as_bytes()),
        413,
        "request_too_large",
    );
    // Over the limit without a declared length (chunked): refused once the limit is crossed.
    let mut chunked = Vec::new();
    for piece in big.as_bytes().chunks(300) {
        chunked.extend(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend(piece);
        chunked.extend(b"\r\n");
    }
    chunked.extend(b"0\r\n\r\n");
    let bearer = format!("Bearer {KEY}");
    let r = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Authorization", &bearer), ("Transfer-Encoding", "chunked")],
        &chunked,
        T,
    )
    .and_then(Streaming::whole)
    .unwrap();
    assert_error(&r, 413, "request_too_large");
    assert_error(
        &authed(addr, "GET", "/v1/completions", b""),
        405,
        "method_not_allowed",
    );
    assert_error(&authed(addr, "GET", "/v2/anything", b""), 404, "not_found");

    // The prefix route: alpha allows only /v1/completions; beta has the inference defaults,
    // which include no admin endpoint.
    let r = authed(
        addr,
        "POST",
        "/m/alpha/v1/completions",
        &completion("alpha"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-hearth-replica").unwrap().starts_with("alpha-"));
    assert_error(
        &authed(addr, "GET", "/m/alpha/health", b""),
        404,
        "not_found",
    );
    assert_error(
        &authed(addr, "POST", "/m/alpha/completion", b"{}"),
        404,
        "not_found",
    );
    let r = authed(addr, "POST", "/m/beta/v1/completions", &completion("beta"));
    assert_eq!(r.status, 200, "{}", r.text());
    for admin in [
        "/m/beta/slots/0?action=save",
        "/m/beta/lora-adapters",
        "/m/beta/v1/load_lora_adapter",
    ] {
        assert_error(&authed(addr, "POST", admin, b"{}"), 404, "not_found");
    }
    assert_error(
        &authed(addr, "POST", "/m/beta/v1/../v1/completions", b"{}"),
        404,
        "not_found",
    );
    assert_error(
        &authed(addr, "POST", "/m/ghost/v1/completions", b"{}"),
        404,
        "model_not_found",
    );

    // What happened is counted by model and status.
    let m = |s: &str| {
        let bearer = format!("Bearer {KEY}");
        let r = send(
            addr,
            "GET",
            "/metrics",
            &[("Authorization", &bearer)],
            b"",
            T,
        )
        .and_then(Streaming::whole)
        .unwrap();
        r.text()
            .lines()
            .find_map(|l| l.strip_prefix(s)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    assert_eq!(
        m("hearth_route_requests_total{model=\"alpha\",status=\"200\"}"),
        Some(10.0)
    );
    // alpha's 404s: two prefix-route paths it does not allow.
    assert_eq!(
        m("hearth_route_requests_total{model=\"alpha\",status=\"404\"}"),
        Some(2.0)
    );
    assert_eq!(
        m("hearth_route_requests_total{model=\"beta\",status=\"200\"}"),
        Some(10.0)
    );
    assert_eq!(
        m("hearth_route_requests_total{model=\"\",status=\"404\"}"),
        Some(3.0)
    );
    assert!(m("hearth_route_queue_wait_seconds_count{model=\"beta\"}").unwrap() >= 10.0);
    assert!(m("hearth_route_time_to_first_byte_seconds_count{model=\"beta\"}").unwrap() >= 10.0);
    assert!(m("hearth_route_upstream_seconds_count{model=\"beta\"}").unwrap() >= 10.0);
    assert_eq!(m("hearth_route_daemon_connected"), Some(1.0));
    drop(router);
}

#[test]
fn a_full_queue_answers_429_and_a_long_wait_503_and_other_clients_do_not_notice() {
    let (daemon, router, addr) = front_door(
        [
            Model::front_toy("slow", &["--service-time", "6s"]).scale(1, 1, 0),
            Model::front_toy("fast", &["--concurrency", "2", "--service-time", "10ms"])
                .scale(1, 1, 0)
                .slots(2),
        ],
        "queue_timeout = \"1s\"\n[route.model.slow]\nmax_queue = 1\n",
    );
    daemon.wait_routed("slow", 1, T);
    daemon.wait_routed("fast", 1, T);
    wait_until("the router to see the routed sets", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"slow\"}")? == 1.0
            && router.metric("hearth_route_routed_replicas{model=\"fast\"}")? == 1.0)
            .then_some(())
    });

    // The slot.
    let first = spawn(move || complete(addr, "slow", T));
    wait_until("the first request at the replica", T, || {
        (router.metric("hearth_route_in_flight{model=\"slow\"}")? == 1.0).then_some(())
    });
    // The queue's one place.
    let second = spawn(move || complete(addr, "slow", T));
    wait_until("the second request queued", T, || {
        (router.metric("hearth_route_queue_depth{model=\"slow\"}")? == 1.0).then_some(())
    });
    // No place left: 429 at once, with Retry-After.
    let r = complete(addr, "slow", T).unwrap();
    assert_error(&r, 429, "queue_full");
    let after: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(after >= 1, "{after}");
    // Meanwhile another model is served as ever.
    for _ in 0..5 {
        let r = complete(addr, "fast", T).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The queued request gives up after queue_timeout: 503, while the first still runs.
    let r = second.join().unwrap().unwrap();
    assert_error(&r, 503, "queue_timeout");
    assert_eq!(
        router.metric("hearth_route_in_flight{model=\"slow\"}"),
        Some(1.0)
    );
    assert_eq!(
        router.metric("hearth_route_queue_depth{model=\"slow\"}"),
        Some(0.0)
    );
    let r = first.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // And the slot is free again.
    let r = spawn(move || complete(addr, "slow", T));
    assert_eq!(r.join().unwrap().unwrap().status, 200);
    let counts: Value = json!({
        "429": router.metric("hearth_route_requests_total{model=\"slow\",status=\"429\"}"),
        "503": router.metric("hearth_route_requests_total{model=\"slow\",status=\"503\"}"),
        "200": router.metric("hearth_route_requests_total{model=\"slow\",status=\"200\"}"),
    });
    assert_eq!(counts, json!({"429": 1.0, "503": 1.0, "200": 2.0}));
}

#[test]
fn request_bodies_together_stay_within_max_buffered() {
    let (daemon, router, addr) = front_door(
        [Model::front_toy("b", &["--service-time", "3s"]).scale(1, 1, 0)],
        // The test's address is trusted (a balancer's), so that the global bound is what is
        // shown here (the per-address bound: tests/route/limits.rs).
        "max_body = \"4KiB\"\nmax_buffered = \"8KiB\"\ntrusted_proxies = [\"127.0.0.1\"]\n",
    );
    daemon.wait_routed("b", 1, T);
    wait_until("the router routing", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"b\"}")? == 1.0).then_some(())
    });
    let big = || json!({"model": "b", "prompt": "x".repeat(3900)});
    // One at the replica and one queued hold 4 KiB each: the bound is reached.
    let a = spawn(move || post(addr, "/v1/completions", &big(), T));
    wait_until("one at the replica", T, || {
        (router.metric("hearth_route_in_flight{model=\"b\"}")? == 1.0).then_some(())
    });
    let b = spawn(move || post(addr, "/v1/completions", &big(), T));
    wait_until("one queued", T, || {
        (router.metric("hearth_route_queue_depth{model=\"b\"}")? == 1.0).then_some(())
    });
    let r = post(addr, "/v1/completions", &big(), T).unwrap();
    assert_error(&r, 503, "overloaded");
    let r = complete(addr, "b", T).unwrap();
    assert_error(&r, 503, "overloaded");
    assert_eq!(a.join().unwrap().unwrap().status, 200);
    assert_eq!(b.join().unwrap().unwrap().status, 200);
    // Given back: the next one is read and served.
    let r = post(addr, "/v1/completions", &big(), T).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}
