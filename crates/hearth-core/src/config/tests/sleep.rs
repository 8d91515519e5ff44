//! `[model.sleep]` and `[daemon] host_memory`: presets written out, explicit requests, and the
//! errors that name file, line and key.

use std::time::Duration;

use super::*;
use crate::config::sleep::*;

/// A model on one GPU of 40 GiB whose server listens on loopback, then `sleep` (lines of the
/// `[model.sleep]` table and any table after it).
fn with_sleep(sleep: &str) -> String {
    format!(
        "[[model]]\nname = \"m\"\n\
         command = [\"srv\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\"]\n\
         gpu_memory = \"40GiB\"\n\
         warmup.url = \"http://127.0.0.1:{{port}}/v1/completions\"\n\
         [model.sleep]\n{sleep}"
    )
}

fn sleep_of(text: &str) -> SleepConfig {
    parse(text)
        .unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
        .models[0]
        .sleep
        .clone()
        .expect("[model.sleep] read")
}

fn urls(list: &[SleepRequest]) -> Vec<(&str, &str, Option<&str>)> {
    list.iter()
        .map(|r| (r.method.as_str(), r.url.as_str(), r.body.as_deref()))
        .collect()
}

#[test]
fn vllm_preset_is_written_out_with_its_defaults() {
    let s = sleep_of(&with_sleep("format = \"vllm\"\n"));
    assert_eq!((s.format, s.level), (Some(SleepFormat::Vllm), 1));
    assert_eq!(
        urls(&s.sleep),
        [("POST", "http://127.0.0.1:{port}/sleep?level=1", None)]
    );
    assert_eq!(
        urls(&s.wake),
        [("POST", "http://127.0.0.1:{port}/wake_up", None)]
    );
    let state = s.state.expect("vLLM says whether it sleeps");
    assert_eq!(state.request.url, "http://127.0.0.1:{port}/is_sleeping");
    assert_eq!(state.request.method, "GET");
    assert_eq!(state.asleep, r#""is_sleeping":true"#);
    // Level 1 keeps the weights in host RAM: at most what the replica held on its GPU.
    assert_eq!(s.host_memory, 40 << 30);
    assert_eq!(s.gpu_memory_asleep, DEFAULT_GPU_MEMORY_ASLEEP);
    assert_eq!(s.wake_timeout, DEFAULT_WAKE_TIMEOUT);
    assert_eq!(s.sleep_timeout, DEFAULT_SLEEP_TIMEOUT);
    assert_eq!(s.idle_to_sleep, None);

    // Level 2: the weights are read again after the wake, and the prefix cache emptied.
    let s = sleep_of(&with_sleep(
        "format = \"vllm\"\nlevel = 2\nhost_memory = \"1GiB\"\ngpu_memory_asleep = \"600MiB\"\n\
         wake_timeout = \"20s\"\nsleep_timeout = \"30s\"\nidle_to_sleep = \"10m\"\n",
    ));
    assert_eq!(
        urls(&s.wake),
        [
            ("POST", "http://127.0.0.1:{port}/wake_up", None),
            (
                "POST",
                "http://127.0.0.1:{port}/collective_rpc",
                Some(r#"{"method":"reload_weights"}"#)
            ),
            ("POST", "http://127.0.0.1:{port}/reset_prefix_cache", None),
        ]
    );
    assert_eq!(s.sleep[0].url, "http://127.0.0.1:{port}/sleep?level=2");
    assert_eq!((s.host_memory, s.gpu_memory_asleep), (1 << 30, 600 << 20));
    assert_eq!(
        (s.wake_timeout, s.sleep_timeout, s.idle_to_sleep),
        (
            Duration::from_secs(20),
            Duration::from_secs(30),
            Some(Duration::from_secs(600))
        )
    );
}

#[test]
fn sglang_pauses_before_it_releases_and_continues_after_it_resumes() {
    let s = sleep_of(&with_sleep("format = \"sglang\"\n"));
    let tags = Some(r#"{"tags":["kv_cache","weights"]}"#);
    assert_eq!(
        urls(&s.sleep),
        [
            (
                "POST",
                "http://127.0.0.1:{port}/pause_generation",
                Some("{}")
            ),
            (
                "POST",
                "http://127.0.0.1:{port}/release_memory_occupation",
                tags
            ),
        ]
    );
    assert_eq!(
        urls(&s.wake),
        [
            (
                "POST",
                "http://127.0.0.1:{port}/resume_memory_occupation",
                tags
            ),
            (
                "POST",
                "http://127.0.0.1:{port}/continue_generation",
                Some("{}")
            ),
        ]
    );
    assert_eq!(s.state, None);
    assert_eq!(s.host_memory, 0, "only vLLM's level 1 has a default");
}

#[test]
fn llamacpp_falls_asleep_on_its_own_and_says_so_in_props() {
    let s = sleep_of(&with_sleep("format = \"llamacpp\"\n"));
    assert!(s.sleep.is_empty() && s.wake.is_empty(), "{s:?}");
    let state = s.state.unwrap();
    assert_eq!(state.request.url, "http://127.0.0.1:{port}/props");
    assert_eq!(state.asleep, r#""is_sleeping":true"#);
}

#[test]
fn explicit_requests_for_any_server_and_over_a_preset() {
    let s = sleep_of(&with_sleep(
        "[[model.sleep.sleep]]\nurl = \"http://127.0.0.1:{port}/nap\"\nbody = '{\"for\":\"{model}\"}'\n\
         [[model.sleep.wake]]\nmethod = \"PUT\"\nurl = \"http://127.0.0.1:{port}/up\"\n\
         [model.sleep.state]\nurl = \"http://127.0.0.1:{port}/st\"\nasleep = \"zzz\"\n",
    ));
    assert_eq!(s.format, None);
    assert_eq!(
        urls(&s.sleep),
        [(
            "POST",
            "http://127.0.0.1:{port}/nap",
            Some(r#"{"for":"{model}"}"#)
        )]
    );
    assert_eq!(urls(&s.wake), [("PUT", "http://127.0.0.1:{port}/up", None)]);
    assert_eq!(s.state.unwrap().asleep, "zzz");
    // A preset's list replaced, its others kept; `[]` says none.
    let s = sleep_of(&with_sleep(
        "format = \"vllm\"\nwake = []\nsleep = [{ url = \"http://127.0.0.1:{port}/x\" }]\n",
    ));
    assert!(s.wake.is_empty());
    assert_eq!(
        urls(&s.sleep),
        [("POST", "http://127.0.0.1:{port}/x", None)]
    );
    assert!(s.state.is_some());
}

#[test]
fn errors_name_the_key_and_its_line() {
    let at = |text: &str, key: &str, prefix: &str| {
        let line = line_of(text, prefix, 0);
        fails(text, key, line)
    };
    let t = with_sleep("format = \"ollama\"\n");
    let msg = at(&t, "model[0].sleep.format", "format");
    assert!(
        msg.contains("\"vllm\", \"sglang\" or \"llamacpp\""),
        "{msg}"
    );

    let t = with_sleep("format = \"sglang\"\nlevel = 2\n");
    assert!(at(&t, "model[0].sleep.level", "level").contains("vLLM"));
    let t = with_sleep("format = \"vllm\"\nlevel = 3\n");
    assert!(at(&t, "model[0].sleep.level", "level").contains("1 to 2"));

    let t = with_sleep("wake = []\n");
    let msg = at(&t, "model[0].sleep.sleep", "[model.sleep]");
    assert!(msg.contains("format"), "{msg}");
    let t = with_sleep("sleep = []\nwake = []\n");
    let msg = at(&t, "model[0].sleep.state", "[model.sleep]");
    assert!(msg.contains("on its own"), "{msg}");

    let t = with_sleep("format = \"vllm\"\ngpu_memory_asleep = \"41GiB\"\n");
    let msg = at(&t, "model[0].sleep.gpu_memory_asleep", "gpu_memory_asleep");
    assert!(msg.contains("more than the model's gpu_memory"), "{msg}");
    let t = with_sleep("format = \"vllm\"\nhost_memory = \"lots\"\n");
    at(&t, "model[0].sleep.host_memory", "host_memory");
    let t = with_sleep("format = \"vllm\"\nwake_timeout = \"0s\"\n");
    at(&t, "model[0].sleep.wake_timeout", "wake_timeout");
    let t = with_sleep("format = \"vllm\"\nidle_to_sleep = \"0s\"\n");
    at(&t, "model[0].sleep.idle_to_sleep", "idle_to_sleep");
    let t = with_sleep("format = \"vllm\"\nnap = true\n");
    let msg = at(&t, "model[0].sleep.nap", "nap");
    assert!(msg.contains("unknown field"), "{msg}");

    let t = with_sleep("sleep = []\n[[model.sleep.wake]]\nurl = \"ftp://127.0.0.1:{port}/up\"\n");
    at(&t, "model[0].sleep.wake[0].url", "url = \"ftp");
    let t = with_sleep(
        "wake = []\n[[model.sleep.sleep]]\nurl = \"http://127.0.0.1:{port}/n\"\nbody = \"{level}\"\n",
    );
    let msg = at(&t, "model[0].sleep.sleep[0].body", "body");
    assert!(msg.contains("unknown placeholder"), "{msg}");
    let t = with_sleep("wake = []\n[[model.sleep.sleep]]\nmethod = \"P OST\"\nurl = \"http://127.0.0.1:{port}/n\"\n");
    at(&t, "model[0].sleep.sleep[0].method", "method");
    let t = with_sleep(
        "format = \"llamacpp\"\n[model.sleep.state]\nurl = \"http://127.0.0.1:{port}/props\"\n",
    );
    let msg = at(&t, "model[0].sleep.state.asleep", "[model.sleep.state]");
    assert!(msg.contains("while the replica sleeps"), "{msg}");

    // A pinned model is never put to sleep.
    let t = with_sleep("format = \"sglang\"\n").replace("gpu_memory =", "pin = true\ngpu_memory =");
    let msg = at(&t, "model[0].pin", "pin");
    assert!(msg.contains("never put to sleep"), "{msg}");
}

#[test]
fn vllm_sleeping_replicas_must_listen_on_loopback() {
    // /collective_rpc, which VLLM_SERVER_DEV_MODE opens, runs any method on the workers.
    let open = with_sleep("format = \"vllm\"\n").replace("\"127.0.0.1\"", "\"0.0.0.0\"");
    let line = line_of(&open, "command", 0);
    let msg = fails(&open, "model[0].command[2]", line);
    assert!(msg.contains("loopback") && msg.contains("0.0.0.0"), "{msg}");
    let unsaid = with_sleep("format = \"vllm\"\n").replace("\"--host\", \"127.0.0.1\", ", "");
    let msg = fails(&unsaid, "model[0].command", line);
    assert!(msg.contains("\"--host\", \"127.0.0.1\""), "{msg}");
    for ok in [
        "\"--host=::1\"",
        "\"--host=localhost\"",
        "\"--host\", \"127.0.0.2\"",
    ] {
        let t = with_sleep("format = \"vllm\"\n").replace("\"--host\", \"127.0.0.1\"", ok);
        parse(&t).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    // Other servers are the operator's to bind.
    parse(&open.replace("\"vllm\"", "\"sglang\"")).unwrap();
}

#[test]
fn sleep_urls_must_use_the_replicas_port() {
    let t = with_sleep("wake = []\n[[model.sleep.sleep]]\nurl = \"http://127.0.0.1:8000/sleep\"\n");
    parse(&t).expect("values are fine");
    let line = line_of(&t, "url = \"http://127.0.0.1:8000", 0);
    let msg = fails_at(Checks::Deployment, &t, "model[0].sleep.sleep[0].url", line);
    assert!(msg.contains("{port}"), "{msg}");
}

#[test]
fn daemon_host_memory_bounds_what_sleeping_replicas_hold() {
    let c = parse(&format!(
        "[daemon]\nhost_memory = \"64GiB\"\n{}",
        model("m")
    ))
    .unwrap();
    assert_eq!(c.daemon.host_memory, Some(64 << 30));
    assert_eq!(parse(&model("m")).unwrap().daemon.host_memory, None);
    let t = format!("[daemon]\nhost_memory = \"0\"\n{}", model("m"));
    fails(&t, "daemon.host_memory", 2);
    // Without [model.sleep] a model neither sleeps nor is pinned.
    let m = &parse(&model("m")).unwrap().models[0];
    assert!(m.sleep.is_none() && !m.pin);
}
