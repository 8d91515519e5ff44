//! What the front door's check of a request body costs (`route::model_field::model_of`: the whole
//! body read as JSON, strings checked, nesting bounded, nothing built), against what it replaced
//! (the same `model` lookup with every other field skipped unchecked) and against parsing the
//! body into a `serde_json::Value` (the obvious second parse).
//!
//! Bodies: a short chat request, a chat with a long history (about 100 KiB), one with a 1 MiB
//! base64 image in it, and an embeddings request with 2,048 token arrays (numbers only).
//! Printed per body: ns per body and MB/s for each way, and the check's cost as a ratio of the
//! skim's. Run: `cargo bench --bench json_check` (`--bench` runs each 5× as many times).

use std::hint::black_box;
use std::time::Instant;

use hearth::route::model_field::model_of;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The lookup before the check: a derived struct, the other fields skipped by serde_json.
#[derive(Deserialize)]
struct Skimmed<'a> {
    #[serde(borrow, default)]
    #[allow(dead_code)]
    model: Option<&'a RawValue>,
}

fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let chat = br#"{"model":"llama-8b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about GPUs waiting in a queue."}],"max_tokens":64,"temperature":0.7,"stream":true}"#.to_vec();
    let mut history = String::from(r#"{"model":"llama-8b","messages":["#);
    for i in 0..200 {
        if i > 0 {
            history.push(',');
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        history.push_str(&format!(
            r#"{{"role":"{role}","content":"Turn {i}: {} caf\u00e9 \ud83d\ude00 \"quoted\" line\nnext"}}"#,
            "lorem ipsum dolor sit amet ".repeat(16)
        ));
    }
    history.push_str(r#"],"max_tokens":256}"#);
    let image = format!(
        r#"{{"model":"llava","messages":[{{"role":"user","content":[{{"type":"text","text":"What is in this image?"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{}"}}}}]}}]}}"#,
        "iVBORw0KGgoAAAANSUhEUgAA".repeat(1 << 20 >> 4 >> 1)
    );
    let mut embed = String::from(r#"{"model":"bge","input":["#);
    for i in 0..2048 {
        if i > 0 {
            embed.push(',');
        }
        embed.push('[');
        for t in 0..16 {
            if t > 0 {
                embed.push(',');
            }
            embed.push_str(&(1000 + i * 16 + t).to_string());
        }
        embed.push(']');
    }
    embed.push_str("]}");
    vec![
        ("short chat", chat),
        ("chat history", history.into_bytes()),
        ("1 MiB image", image.into_bytes()),
        ("embeddings", embed.into_bytes()),
    ]
}

/// Mean ns per call of `f` over `n` calls, the least of 3 rounds.
fn time(n: usize, mut f: impl FnMut() -> bool) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                assert!(black_box(f()));
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let scale = if testkit::bench_full() { 5 } else { 1 };
    println!(
        "{:<14} {:>9} {:>12} {:>10} {:>12} {:>10} {:>12} {:>10} {:>7}",
        "body", "bytes", "skim ns", "MB/s", "check ns", "MB/s", "Value ns", "MB/s", "check÷skim"
    );
    for (name, body) in bodies() {
        assert!(model_of(&body).is_ok(), "{name} is a valid request");
        let n = (scale * 20_000_000 / body.len().max(1000)).max(20);
        let skim = time(n, || {
            serde_json::from_slice::<Skimmed>(black_box(&body)).is_ok()
        });
        let check = time(n, || model_of(black_box(&body)).is_ok());
        let value = time(n, || {
            serde_json::from_slice::<serde_json::Value>(black_box(&body)).is_ok()
        });
        let mbs = |ns: f64| body.len() as f64 / ns * 1e3;
        println!(
            "{name:<14} {:>9} {skim:>12.0} {:>10.0} {check:>12.0} {:>10.0} {value:>12.0} {:>10.0} {:>7.2}",
            body.len(),
            mbs(skim),
            mbs(check),
            mbs(value),
            check / skim
        );
    }
}
