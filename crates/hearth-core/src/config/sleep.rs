//! `[model.sleep]`: how a replica of the model is put to sleep and woken, as the typed
//! configuration holds it, and the presets for the servers that can sleep (vLLM's sleep mode,
//! SGLang's memory saver, llama.cpp's `--sleep-idle-seconds`).
//!
//! A preset is written out into plain requests at validation, so the core and the shell see the
//! same thing whatever the file said: a list of requests that puts a replica to sleep, one that
//! wakes it, and optionally one that says whether it sleeps.

use std::time::Duration;

/// The servers hearth knows how to put to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepFormat {
    /// vLLM with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`: `POST /sleep?level=N`,
    /// `POST /wake_up`, `GET /is_sleeping` (after a level-2 wake, the weights are reloaded and
    /// the prefix cache reset).
    Vllm,
    /// SGLang with `--enable-memory-saver`: generation paused, then the memory released; on
    /// waking the memory resumed, then generation continued.
    Sglang,
    /// llama.cpp's `llama-server --sleep-idle-seconds N`: it falls asleep on its own once idle
    /// and the next request wakes it; hearth only reads `GET /props`' `is_sleeping`.
    Llamacpp,
}

impl SleepFormat {
    pub fn name(self) -> &'static str {
        match self {
            SleepFormat::Vllm => "vllm",
            SleepFormat::Sglang => "sglang",
            SleepFormat::Llamacpp => "llamacpp",
        }
    }
}

/// One HTTP request of a sleep or a wake. Templates: `{port}`, `{replica}`, `{model}`, `{gpus}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SleepRequest {
    pub method: String,
    pub url: String,
    pub body: Option<String>,
}

/// The request that says whether a replica sleeps: asleep when its 200 answer holds `asleep`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRequest {
    pub request: SleepRequest,
    pub asleep: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SleepConfig {
    /// The preset the requests came from; None: the file wrote them out.
    pub format: Option<SleepFormat>,
    /// vLLM's sleep level: 1 moves the weights to host RAM, 2 drops them too.
    pub level: u8,
    /// Sent in order to put a replica to sleep, each answered 2xx; empty: it falls asleep on its
    /// own once idle (llama.cpp), which `state` confirms.
    pub sleep: Vec<SleepRequest>,
    /// Sent in order to wake it; empty: the warm-up's own request wakes it.
    pub wake: Vec<SleepRequest>,
    pub state: Option<StateRequest>,
    /// What a sleeping replica holds in host RAM (bytes), counted against `[daemon] host_memory`.
    pub host_memory: u64,
    /// What a sleeping replica still holds on each of its GPUs (bytes): the CUDA context.
    pub gpu_memory_asleep: u64,
    /// The wake requests, then the warm-up, must pass within this; else the replica is stopped.
    pub wake_timeout: Duration,
    /// The sleep requests (and, where the server falls asleep on its own, the wait for `state`
    /// to say so) must pass within this; else the replica is stopped.
    pub sleep_timeout: Duration,
    /// After this long with no work, the model's awake replicas go to sleep; None: only a scale
    /// down puts them to sleep.
    pub idle_to_sleep: Option<Duration>,
}

impl SleepConfig {
    /// What a replica holding `awake` bytes on a device still holds there asleep.
    pub fn held_asleep(&self, awake: u64) -> u64 {
        self.gpu_memory_asleep.min(awake)
    }
}

/// The CUDA context a sleeping process keeps on its device, when the file does not say.
pub const DEFAULT_GPU_MEMORY_ASLEEP: u64 = 512 << 20;
pub const DEFAULT_WAKE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_SLEEP_TIMEOUT: Duration = Duration::from_secs(120);

fn post(path: &str, body: Option<&str>) -> SleepRequest {
    SleepRequest {
        method: "POST".into(),
        url: format!("http://127.0.0.1:{{port}}{path}"),
        body: body.map(str::to_string),
    }
}

fn get(path: &str) -> SleepRequest {
    SleepRequest {
        method: "GET".into(),
        url: format!("http://127.0.0.1:{{port}}{path}"),
        body: None,
    }
}

/// SGLang releases and resumes both: what it keeps in host RAM is its weights' backup.
const SGLANG_TAGS: &str = r#"{"tags":["kv_cache","weights"]}"#;

/// The requests of a preset: (sleep, wake, state).
pub fn preset(
    format: SleepFormat,
    level: u8,
) -> (Vec<SleepRequest>, Vec<SleepRequest>, Option<StateRequest>) {
    match format {
        SleepFormat::Vllm => {
            let mut wake = vec![post("/wake_up", None)];
            if level >= 2 {
                // Level 2 dropped the weights: they are read again, and the prefix cache,
                // which described the old ones, is emptied.
                wake.push(post(
                    "/collective_rpc",
                    Some(r#"{"method":"reload_weights"}"#),
                ));
                wake.push(post("/reset_prefix_cache", None));
            }
            (
                vec![post(&format!("/sleep?level={level}"), None)],
                wake,
                // Starlette writes JSON without spaces.
                Some(StateRequest {
                    request: get("/is_sleeping"),
                    asleep: r#""is_sleeping":true"#.into(),
                }),
            )
        }
        SleepFormat::Sglang => (
            // Release requires that nothing is in flight: generation is paused first.
            vec![
                post("/pause_generation", Some("{}")),
                post("/release_memory_occupation", Some(SGLANG_TAGS)),
            ],
            vec![
                post("/resume_memory_occupation", Some(SGLANG_TAGS)),
                post("/continue_generation", Some("{}")),
            ],
            None,
        ),
        SleepFormat::Llamacpp => (
            Vec::new(),
            Vec::new(),
            Some(StateRequest {
                request: get("/props"),
                asleep: r#""is_sleeping":true"#.into(),
            }),
        ),
    }
}
