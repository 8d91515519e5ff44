//! The official `openai` Python client against the front door, with llama.cpp's server and a
//! tiny model as the replica: chat and completions, streaming and not, the model list, and the
//! errors the client maps to its own exceptions.

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
