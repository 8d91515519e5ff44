//! Tests of the configuration: values and their errors (`values`), the deeper checks
//! (`checks`: declared models, ports, GPU fit, programs) and placeholders.

mod checks;
mod fuzz;
mod launch;
mod placeholders;
mod route;
mod sleep;
mod values;

use std::path::Path;

use super::*;

/// The example of docs/design.md, "Configuration" (held equal to it below).
pub(super) const EXAMPLE: &str = r#"[daemon]
socket = "/run/hearth/hearth.sock"   # control and report socket
state_dir = "/var/lib/hearth"         # runtime overrides that survive restarts
ports = "20000-20999"                 # {port} handed to replicas
tick = "250ms"
metrics = "127.0.0.1:9464"            # Prometheus exposition; omit to disable
shutdown_timeout = "60s"

[access]                              # who may do what on the socket (SO_PEERCRED)
admins = ["root", "@hearth-admin"]    # every op
reporters = ["@hearth-report"]        # report + read ops; replicas may always report for themselves
readers = ["@hearth"]                 # status, watch, gpus, version

[gpus]
backend = "auto"                      # auto | nvml | static
[[gpus.device]]                       # used by static, and by auto when NVML is absent
uuid = "GPU-static-0"
memory = "80GiB"

[[model]]
name = "llama-8b"
version = "1"                         # a change rolls replicas over
command = ["vllm", "serve", "/models/llama-8b", "--port", "{port}"]
env = { HF_HOME = "/models/cache" }
user = "hearth-model"                 # optional; drop privileges before exec
gpus = 1
gpu_memory = "40GiB"
placement = "pack"                    # pack | spread
priority = 0
stop_grace = "30s"

[model.warmup]                        # readiness = a real inference
method = "POST"
url = "http://127.0.0.1:{port}/v1/completions"
body = '{"model":"llama-8b","prompt":"Hello","max_tokens":4}'
headers = { "content-type" = "application/json" }
expect_status = 200
expect_body = "choices"               # substring the answer must contain
timeout = "30s"                       # one attempt
startup_timeout = "10m"               # give up, kill, back off, retry
recheck = "5m"                        # re-verify warm replicas

[model.liveness]
url = "http://127.0.0.1:{port}/health"
interval = "10s"
timeout = "5s"
failures = 3

[model.signal]                        # optional: for servers that cannot report on the socket
scrape = "http://127.0.0.1:{port}/metrics"   # polled on every routed replica
format = "llamacpp"                   # vllm | llamacpp | tgi | triton
interval = "1s"

[model.scaling]
min = 1
max = 8
warm_pool = 1                         # or "auto"
target_wait = "500ms"
down_below = 0.5
down_stabilization = "5m"
down_step = "2m"
max_up_step = 4
idle_to_zero = "30m"                  # only with min = 0
drain_timeout = "5m"
stale_after = "5s"
"#;

/// A minimal valid model block, named `name`; lines appended to it are model-level keys.
pub(super) fn model(name: &str) -> String {
    format!(
        "[[model]]\nname = \"{name}\"\ncommand = [\"srv\", \"--port\", \"{{port}}\"]\n\
         warmup.url = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
    )
}

/// A minimal valid model block whose last section is `[model.warmup]`, so lines appended to
/// it are warmup keys.
pub(super) fn model_w(name: &str) -> String {
    format!(
        "[[model]]\nname = \"{name}\"\ncommand = [\"srv\", \"--port\", \"{{port}}\"]\n\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
    )
}

pub(super) const FILE: &str = "/etc/hearth/hearth.toml";

/// `text` with its values checked (what `Config::parse` checks).
pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(FILE))
}

/// `text` checked to depth `checks`.
pub(super) fn parse_at(checks: Checks, text: &str) -> Result<Config, ConfigError> {
    Config::parse_with(text, Path::new(FILE), checks)
}

/// Parse `text`, expecting an error at `line` for `key`; returns the message.
#[track_caller]
pub(super) fn fails(text: &str, key: &str, line: usize) -> String {
    fails_at(Checks::Values, text, key, line)
}

/// Check `text` to depth `checks`, expecting an error at `line` for `key`; returns the message.
#[track_caller]
pub(super) fn fails_at(checks: Checks, text: &str, key: &str, line: usize) -> String {
    let err = match parse_at(checks, text) {
        Ok(_) => panic!("expected an error for {key} in:\n{text}"),
        Err(e) => e,
    };
    assert_eq!(err.key, key, "wrong key in {err}\n---\n{text}");
    assert_eq!(err.line, Some(line), "wrong line in {err}\n---\n{text}");
    assert_eq!(err.file, Path::new(FILE));
    err.message
}

/// 1-based line of the first line of `text` that starts with `prefix` (after the nth match).
pub(super) fn line_of(text: &str, prefix: &str, nth: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with(prefix))
        .nth(nth)
        .map(|(i, _)| i + 1)
        .unwrap_or_else(|| panic!("{prefix:?} not in text"))
}

/// docs/design.md shows the example this module checks value by value: the two say the same
/// (comments and spacing aside), so the page cannot drift from what is tested.
#[test]
fn the_design_pages_example_is_the_one_tested() {
    let page = include_str!("../../../../../docs/design.md");
    let block = page
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/design.md has a ```toml block");
    let shown: toml::Value = toml::from_str(block).expect("docs/design.md's example is TOML");
    let tested: toml::Value = toml::from_str(EXAMPLE).expect("EXAMPLE is TOML");
    assert_eq!(
        shown, tested,
        "docs/design.md's example differs from EXAMPLE"
    );
}
