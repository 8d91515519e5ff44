//! The OpenAI API as the toy server speaks it: what a request asks for, read and bounded
//! (`Ask`), and the answers, whole or as server-sent events in OpenAI's chunk shape. Nothing here
//! waits or does I/O; `http.rs` holds the slot, paces the tokens and writes them.
//!
//! The text is a stand-in: `max_tokens` words drawn from a small vocabulary, seeded by the
//! prompt, so the same request gets the same answer. Embeddings are unit vectors seeded by their
//! input, likewise deterministic. Usage counts words of the prompt as tokens, and exactly the
//! tokens generated.

use serde_json::{json, Map, Value};

/// `max_tokens` when a request does not say (OpenAI's default for completions).
pub const DEFAULT_MAX_TOKENS: u64 = 16;
/// Most tokens one choice may ask for; a toy has no use for more, and nothing a client sends
/// sizes a loop beyond it.
pub const MAX_TOKENS: u64 = 4096;
/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: u64 = 8;
/// Vector length when `dimensions` is not given, and the most it may be.
pub const EMBEDDING_DIM: usize = 64;
pub const MAX_DIMENSIONS: u64 = 4096;
/// Most inputs one embeddings request may carry (OpenAI's own bound).
pub const MAX_INPUTS: usize = 2048;

const VOCABULARY: [&str; 16] = [
    "toy", "model", "token", "queue", "slot", "warm", "routed", "replica", "hearth", "reply",
    "stream", "chunk", "prompt", "answer", "batch", "ready",
];

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// A request that is not what the API takes: 400 with OpenAI's error body.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub message: String,
    pub param: Option<&'static str>,
}

fn invalid(param: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        message: message.into(),
        param: Some(param),
    }
}

/// What a completion or chat request asks for, bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub kind: Kind,
    pub model: String,
    pub max_tokens: u64,
    pub choices: u64,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub stream_usage: bool,
    pub prompt_tokens: u64,
    /// Seeds the words generated.
    seed: u64,
}

impl Ask {
    /// Reads a request body (an empty one, for completions, asks for the defaults).
    pub fn parse(kind: Kind, body: &Value, default_model: &str) -> Result<Ask, Invalid> {
        let obj = match body {
            Value::Object(o) => o,
            Value::Null if kind == Kind::Completion => &Map::new(),
            _ => return Err(invalid("body", "the body must be a JSON object")),
        };
        let model = match obj.get("model") {
            None | Some(Value::Null) => default_model.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(invalid("model", "model must be a string")),
        };
        let (prompt_tokens, seed) = match kind {
            Kind::Completion => prompt(obj.get("prompt"))?,
            Kind::Chat => messages(obj.get("messages"))?,
        };
        // Chat's newer name wins where both are given.
        let (param, given) = match obj.get("max_completion_tokens") {
            Some(v) if kind == Kind::Chat && !v.is_null() => ("max_completion_tokens", Some(v)),
            _ => ("max_tokens", obj.get("max_tokens").filter(|v| !v.is_null())),
        };
        let max_tokens = match given {
            None => DEFAULT_MAX_TOKENS,
            Some(v) => bounded(v, param, 1, MAX_TOKENS)?,
        };
        let choices = match obj.get("n").filter(|v| !v.is_null()) {
            None => 1,
            Some(v) => bounded(v, "n", 1, MAX_CHOICES)?,
        };
        let stream = match obj.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("stream", "stream must be a boolean")),
        };
        let stream_usage = obj
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Ask {
            kind,
            model,
            max_tokens,
            choices,
            stream,
            stream_usage,
            prompt_tokens,
            seed,
        })
    }

    /// The words of choice `index`, each with its leading space.
    pub fn tokens(&self, index: u64) -> Vec<String> {
        let mut state = self.seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..self.max_tokens)
            .map(|_| {
                let w = VOCABULARY[(splitmix(&mut state) % VOCABULARY.len() as u64) as usize];
                format!(" {w}")
            })
            .collect()
    }

    pub fn usage(&self) -> Value {
        let completion = self.max_tokens * self.choices;
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// The whole answer.
    pub fn answer(&self, id: &str, created: u64) -> Value {
        let choices: Vec<Value> = (0..self.choices)
            .map(|i| {
                let text: String = self.tokens(i).concat();
                match self.kind {
                    Kind::Completion => json!({
                        "index": i, "text": text, "logprobs": null, "finish_reason": "length",
                    }),
                    Kind::Chat => json!({
                        "index": i,
                        "message": {"role": "assistant", "content": text.trim_start()},
                        "logprobs": null,
                        "finish_reason": "length",
                    }),
                }
            })
            .collect();
        json!({
            "id": id,
            "object": self.object(false),
            "created": created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        })
    }

    /// The answer as events, in the order they go out: for chat a first chunk with the role,
    /// then one chunk per token and choice, one per choice with its `finish_reason`, the usage
    /// when asked for, and `[DONE]`. The second element says which are tokens (paced over the
    /// service time); the others follow at once.
    pub fn events(&self, id: &str, created: u64) -> Vec<(String, bool)> {
        let chunk = |choices: Vec<Value>| {
            let c = json!({
                "id": id,
                "object": self.object(true),
                "created": created,
                "model": self.model,
                "choices": choices,
            });
            format!("data: {c}\n\n")
        };
        let piece = |i: u64, text: &str, finish: Option<&str>| match self.kind {
            Kind::Completion => json!({
                "index": i, "text": text, "logprobs": null, "finish_reason": finish,
            }),
            Kind::Chat => {
                let delta = if finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut out = Vec::new();
        if self.kind == Kind::Chat {
            let first = (0..self.choices)
                .map(|i| {
                    json!({"index": i, "delta": {"role": "assistant", "content": ""},
                           "logprobs": null, "finish_reason": null})
                })
                .collect();
            out.push((chunk(first), false));
        }
        let tokens: Vec<Vec<String>> = (0..self.choices).map(|i| self.tokens(i)).collect();
        for t in 0..self.max_tokens as usize {
            for (i, words) in tokens.iter().enumerate() {
                let mut text = words[t].as_str();
                if self.kind == Kind::Chat && t == 0 {
                    text = text.trim_start();
                }
                out.push((chunk(vec![piece(i as u64, text, None)]), i == 0));
            }
        }
        let ends = (0..self.choices)
            .map(|i| piece(i, "", Some("length")))
            .collect();
        out.push((chunk(ends), false));
        if self.stream_usage {
            let c = json!({
                "id": id, "object": self.object(true), "created": created, "model": self.model,
                "choices": [], "usage": self.usage(),
            });
            out.push((format!("data: {c}\n\n"), false));
        }
        out.push(("data: [DONE]\n\n".to_string(), false));
        out
    }
}

/// An integer field within `lo..=hi`.
fn bounded(v: &Value, param: &'static str, lo: u64, hi: u64) -> Result<u64, Invalid> {
    match v.as_u64() {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(invalid(
            param,
            format!("{param} must be an integer from {lo} to {hi}, not {v}"),
        )),
    }
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists; none is
/// the empty prompt. Tokens: words, or ids. The seed: what the prompt says.
fn prompt(p: Option<&Value>) -> Result<(u64, u64), Invalid> {
    let mut seed = Fnv::default();
    let tokens = match p {
        None | Some(Value::Null) => 0,
        Some(v) => count(v, &mut seed, 0).ok_or_else(|| {
            invalid(
                "prompt",
                "prompt must be a string, a list of strings, or a list of token ids",
            )
        })?,
    };
    Ok((tokens, seed.0))
}

/// Words (or token ids) in a prompt, hashing what they say into `seed`; None for another shape.
fn count(v: &Value, seed: &mut Fnv, depth: u8) -> Option<u64> {
    match v {
        Value::String(s) => {
            seed.add(s.as_bytes());
            Some(s.split_whitespace().count() as u64)
        }
        Value::Number(n) if depth > 0 => {
            seed.add(&n.as_u64()?.to_le_bytes());
            Some(1)
        }
        Value::Array(items) if depth < 2 => items
            .iter()
            .map(|x| count(x, seed, depth + 1))
            .try_fold(0u64, |a, n| Some(a + n?)),
        _ => None,
    }
}

/// `messages`: a non-empty list of `{role, content}`, content a string, a list of parts (the
/// text ones counted), or null (an assistant's tool call).
fn messages(m: Option<&Value>) -> Result<(u64, u64), Invalid> {
    let bad = || {
        invalid(
            "messages",
            "messages must be a non-empty list of {\"role\", \"content\"} objects",
        )
    };
    let list = m.and_then(Value::as_array).filter(|l| !l.is_empty());
    let list = list.ok_or_else(bad)?;
    let mut seed = Fnv::default();
    let mut tokens = 0u64;
    for msg in list {
        let role = msg.get("role").and_then(Value::as_str).ok_or_else(bad)?;
        seed.add(role.as_bytes());
        match msg.get("content") {
            Some(Value::String(s)) => {
                seed.add(s.as_bytes());
                tokens += s.split_whitespace().count() as u64;
            }
            Some(Value::Array(parts)) => {
                for part in parts {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        seed.add(t.as_bytes());
                        tokens += t.split_whitespace().count() as u64;
                    }
                }
            }
            None | Some(Value::Null) => {}
            Some(_) => return Err(bad()),
        }
    }
    Ok((tokens, seed.0))
}

/// An embeddings request, bounded: each input's seed and token count, the vector length, and
/// whether the vectors go out as base64 (what the `openai` client asks for by default).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedAsk {
    pub model: String,
    inputs: Vec<(u64, u64)>,
    dimensions: usize,
    base64: bool,
}

impl EmbedAsk {
    pub fn parse(body: &Value, default_model: &str) -> Result<EmbedAsk, Invalid> {
        let obj = body
            .as_object()
            .ok_or_else(|| invalid("body", "the body must be a JSON object"))?;
        let model = match obj.get("model") {
            None | Some(Value::Null) => default_model.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(invalid("model", "model must be a string")),
        };
        let bad = || {
            invalid(
                "input",
                format!(
                    "input must be a string, a list of strings, a list of token ids or a list \
                     of such lists, of 1 to {MAX_INPUTS}"
                ),
            )
        };
        let one = |v: &Value| {
            let mut seed = Fnv::default();
            count(v, &mut seed, 1).map(|n| (seed.0, n))
        };
        let inputs: Vec<(u64, u64)> = match obj.get("input") {
            Some(Value::String(_)) => vec![one(&json!([obj["input"]])).ok_or_else(bad)?],
            // A list of token ids is one input.
            Some(Value::Array(a)) if a.first().is_some_and(Value::is_number) => {
                if !a.iter().all(Value::is_number) {
                    return Err(bad());
                }
                let mut seed = Fnv::default();
                let n = count(&obj["input"], &mut seed, 1).ok_or_else(bad)?;
                vec![(seed.0, n)]
            }
            Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_INPUTS => a
                .iter()
                .map(|x| match x {
                    Value::String(_) | Value::Array(_) => one(x),
                    _ => None,
                })
                .collect::<Option<_>>()
                .ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        let dimensions = match obj.get("dimensions").filter(|v| !v.is_null()) {
            None => EMBEDDING_DIM,
            Some(v) => bounded(v, "dimensions", 1, MAX_DIMENSIONS)? as usize,
        };
        let base64 = match obj.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(v) if v == "float" => false,
            Some(v) if v == "base64" => true,
            Some(_) => {
                return Err(invalid(
                    "encoding_format",
                    "encoding_format must be \"float\" or \"base64\"",
                ))
            }
        };
        Ok(EmbedAsk {
            model,
            inputs,
            dimensions,
            base64,
        })
    }

    pub fn answer(&self) -> Value {
        use base64::Engine as _;
        let data: Vec<Value> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (seed, _))| {
                let v = vector(*seed, self.dimensions);
                let embedding = if self.base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        let tokens: u64 = self.inputs.iter().map(|(_, n)| n).sum();
        json!({
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })
    }
}

/// A unit vector of `dim` components drawn from `seed`.
pub fn vector(seed: u64, dim: usize) -> Vec<f32> {
    let mut state = seed;
    let mut v: Vec<f32> = (0..dim)
        .map(|_| (splitmix(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// OpenAI's error body.
pub fn error(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// A response id (`cmpl-…`, `chatcmpl-…`): 24 hex digits unique to this process and request,
/// never a replica's name.
pub fn response_id(prefix: &str, pid: u32, n: u64, started_nanos: u64) -> String {
    let mut s = u64::from(pid) << 32 ^ started_nanos;
    let a = splitmix(&mut s) ^ n;
    let mut t = a;
    format!("{prefix}-{:016x}{:08x}", splitmix(&mut t), a as u32)
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, for seeds.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
        // A boundary, so that ["ab","c"] and ["a","bc"] differ.
        self.0 = (self.0 ^ 0xff).wrapping_mul(0x100_0000_01b3);
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
