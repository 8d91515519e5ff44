//! The official `openai` Python client against the front door: on config.toml.example as it
//! ships (the toy replicas: chat and completions, streaming and not, with `max_tokens` honoured
//! and counted, embeddings, the model list and one model, OpenAI-shaped errors), and with
//! llama.cpp's server and a tiny model as the replica.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use testkit::route::*;

const KEY: &str = "sk-route-test-0123456789";

#[test]
fn the_openai_client_works_through_the_router_with_a_real_llama_server() {
    let dir = real_model_dir();
    let python = openai_python();
    let server = dir.join("llama-server").display().to_string();
    let gguf = dir.join("tiny-llama.gguf").display().to_string();
    let mut m = Model::front_toy("tiny", &[])
        .command(&[&server, "-m", &gguf, "--port", "{port}", "-np", "1"])
        .scale(1, 1, 0)
        .startup_timeout("5m")
        .stop_grace("5s");
    m.warmup.body = r#"{"prompt":"Hello","max_tokens":2}"#.into();
    let (daemon, router, addr) = front_door(
        [m],
        &format!("api_keys = [\"{KEY}\"]\n[route.aliases]\n\"gpt-4o-mini\" = \"tiny\"\n"),
    );
    daemon.wait_routed("tiny", 1, Duration::from_secs(300));
    wait_until("the router routing tiny", Duration::from_secs(30), || {
        let bearer = format!("Bearer {KEY}");
        let r = send(
            addr,
            "GET",
            "/metrics",
            &[("Authorization", &bearer)],
            b"",
            Duration::from_secs(10),
        )
        .and_then(Streaming::whole)
        .ok()?;
        (sample(&r.text(), "hearth_route_routed_replicas{model=\"tiny\"}")? == 1.0).then_some(())
    });

    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openai_client.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}/v1"))
        .arg(KEY)
        .arg("tiny")
        .arg("gpt-4o-mini")
        .output()
        .expect("run the openai client");
    assert!(
        out.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    eprintln!("openai client saw: {v}");
    assert_eq!(
        v["models"],
        serde_json::json!(["tiny", "gpt-4o-mini"]),
        "{v}"
    );
    assert_eq!(v["chat"]["content_is_str"], true, "{v}");
    assert!(
        v["chat"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{v}"
    );
    assert!(
        v["chat_stream"]["chunks"].as_u64().unwrap() >= 2,
        "streamed in pieces: {v}"
    );
    assert_eq!(v["chat_stream"]["finish_reason"], "length", "{v}");
    assert_eq!(v["completion"]["text_is_str"], true, "{v}");
    assert!(
        v["completion_stream"]["chunks"].as_u64().unwrap() >= 2,
        "{v}"
    );
    assert_eq!(v["unknown_model"]["status"], 404, "{v}");
    assert_eq!(v["unknown_model"]["code"], "model_not_found", "{v}");
    assert_eq!(v["bad_key"]["status"], 401, "{v}");
    drop(router);
}

#[test]
fn the_openai_client_works_through_the_front_door_on_the_example_configuration() {
    let python = openai_python();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("config.toml.example")).unwrap();
    // As the README says: `hearth` on PATH, for the example's `command`.
    let bin = hearth().parent().unwrap().display().to_string();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let daemon = Daemon::builder().file(&example).env("PATH", &path).start();
    let router = Router::start(&daemon);
    let addr = router.addr;
    daemon.wait_routed("toy", 2, Duration::from_secs(60));
    wait_until("the router routing toy", Duration::from_secs(30), || {
        (router.metric("hearth_route_routed_replicas{model=\"toy\"}")? >= 1.0).then_some(())
    });
    let script = root.join("tests/fixtures/openai_toy_client.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}/v1"))
        .arg("toy")
        .output()
        .expect("run the openai client");
    assert!(
        out.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    eprintln!("openai client saw: {v}");
    assert_eq!(v["models"], serde_json::json!(["toy"]), "{v}");
    assert_eq!(v["retrieve"]["id"], "toy", "{v}");
    assert_eq!(v["retrieve_unknown"]["status"], 404, "{v}");
    assert_eq!(v["retrieve_unknown"]["code"], "model_not_found", "{v}");
    // max_tokens = 8: eight tokens generated, and counted.
    assert_eq!(v["chat"]["object"], "chat.completion", "{v}");
    assert_eq!(v["chat"]["role"], "assistant", "{v}");
    assert_eq!(v["chat"]["words"], 8, "{v}");
    assert_eq!(v["chat"]["finish_reason"], "length", "{v}");
    assert_eq!(v["chat"]["usage"], serde_json::json!([5, 8, 13]), "{v}");
    assert!(
        v["chat"]["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "{v}"
    );
    // Streamed: a role chunk, 8 token chunks, the finish, the usage.
    assert_eq!(v["chat_stream"]["chunks"], 11, "{v}");
    assert_eq!(v["chat_stream"]["words"], 8, "{v}");
    assert_eq!(v["chat_stream"]["finish_reason"], "length", "{v}");
    assert_eq!(v["chat_stream"]["usage"], 8, "{v}");
    assert_eq!(v["chat_stream"]["ids"], 1, "one id per stream: {v}");
    assert_eq!(v["completion"]["object"], "text_completion", "{v}");
    assert_eq!(v["completion"]["words"], 8, "{v}");
    assert_eq!(v["completion"]["usage"], serde_json::json!([4, 8]), "{v}");
    let id = v["completion"]["id"].as_str().unwrap();
    assert!(id.starts_with("cmpl-"), "{v}");
    assert!(
        daemon.replica("toy", id).is_none() && !id.starts_with("toy-"),
        "a response id is no replica's name: {id}"
    );
    assert_eq!(
        v["completion_stream"]["chunks"], 9,
        "8 tokens and the finish: {v}"
    );
    assert_eq!(v["completion_stream"]["words"], 8, "{v}");
    assert_eq!(v["embeddings"]["n"], 3, "{v}");
    assert_eq!(v["embeddings"]["dim"], 64, "{v}");
    assert_eq!(v["embeddings"]["same"], true, "deterministic: {v}");
    assert_eq!(v["embeddings"]["differ"], true, "{v}");
    let norm = v["embeddings"]["norm"].as_f64().unwrap();
    assert!((norm - 1.0).abs() < 1e-3, "{v}");
    assert_eq!(v["embeddings"]["tokens"], 6, "{v}");
    assert_eq!(v["embeddings_float"]["dim"], 16, "{v}");
    assert_eq!(v["unknown_model"]["status"], 404, "{v}");
    assert_eq!(v["unknown_model"]["code"], "model_not_found", "{v}");
    assert_eq!(v["bad_request"]["status"], 400, "{v}");
    assert_eq!(v["bad_request"]["param"], "messages", "{v}");
    drop(router);
}
