//! The toy server's requests and answers, without a server.

use super::*;

fn ask(kind: Kind, body: Value) -> Result<Ask, Invalid> {
    Ask::parse(kind, &body, "toy")
}

#[test]
fn max_tokens_words_are_generated_and_counted() {
    let a = ask(
        Kind::Completion,
        json!({"model": "m", "prompt": "hello there world", "max_tokens": 8}),
    )
    .unwrap();
    let v = a.answer("cmpl-1", 7);
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text.split_whitespace().count(), 8, "{text:?}");
    assert!(text.starts_with(' '), "completions continue the prompt");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11})
    );
    assert_eq!(v["model"], "m");
    assert_eq!(v["object"], "text_completion");
    // The same request gets the same text; another prompt another.
    assert_eq!(a.tokens(0), a.tokens(0));
    let b = ask(
        Kind::Completion,
        json!({"prompt": "other", "max_tokens": 8}),
    )
    .unwrap();
    assert_ne!(a.tokens(0), b.tokens(0));
    assert_eq!(b.model, "toy", "no model: the server's own");
    // Without max_tokens, OpenAI's default; an empty body asks for the defaults.
    let d = ask(Kind::Completion, Value::Null).unwrap();
    assert_eq!(
        (d.max_tokens, d.choices, d.stream),
        (DEFAULT_MAX_TOKENS, 1, false)
    );
}

#[test]
fn prompts_of_every_shape_count_their_tokens() {
    for (prompt, tokens) in [
        (json!("hello  there world"), 3),
        (json!(["a b", "c"]), 3),
        (json!([1, 2, 3, 4]), 4),
        (json!([[1, 2], [3]]), 3),
        (json!(null), 0),
    ] {
        let a = ask(Kind::Completion, json!({"prompt": prompt})).unwrap();
        assert_eq!(a.prompt_tokens, tokens, "{prompt}");
    }
    for bad in [json!(17), json!([[["deep"]]]), json!({"a": 1})] {
        let e = ask(Kind::Completion, json!({"prompt": bad})).unwrap_err();
        assert_eq!(e.param, Some("prompt"), "{bad}");
    }
}

#[test]
fn chat_answers_as_the_assistant() {
    let a = ask(
        Kind::Chat,
        json!({"model": "m", "max_completion_tokens": 3, "max_tokens": 9,
               "messages": [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": [{"type": "text", "text": "say hi"}]}]}),
    )
    .unwrap();
    assert_eq!(a.max_tokens, 3, "max_completion_tokens wins");
    assert_eq!(a.prompt_tokens, 4);
    let v = a.answer("chatcmpl-1", 7);
    assert_eq!(v["object"], "chat.completion");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["role"], "assistant");
    let content = m["content"].as_str().unwrap();
    assert_eq!(content.split_whitespace().count(), 3);
    assert!(!content.starts_with(' '), "{content:?}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    for bad in [
        json!({}),
        json!({"messages": []}),
        json!({"messages": "hi"}),
        json!({"messages": [{"content": "no role"}]}),
    ] {
        let e = ask(Kind::Chat, bad.clone()).unwrap_err();
        assert_eq!(e.param, Some("messages"), "{bad}");
    }
}

#[test]
fn numbers_from_the_client_are_bounded() {
    for (body, param) in [
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": MAX_TOKENS + 1}), "max_tokens"),
        (json!({"max_tokens": -1}), "max_tokens"),
        (json!({"max_tokens": 2.5}), "max_tokens"),
        (json!({"max_tokens": "8"}), "max_tokens"),
        (json!({"n": 0}), "n"),
        (json!({"n": MAX_CHOICES + 1}), "n"),
        (json!({"stream": "yes"}), "stream"),
        (json!({"model": 3}), "model"),
    ] {
        let e = ask(Kind::Completion, body.clone()).unwrap_err();
        assert_eq!(e.param, Some(param), "{body}: {e:?}");
    }
    let a = ask(Kind::Completion, json!({"max_tokens": MAX_TOKENS, "n": 2})).unwrap();
    assert_eq!(a.usage()["completion_tokens"], 2 * MAX_TOKENS);
}

/// The `data:` payloads of a stream, `[DONE]` as a string.
fn payloads(a: &Ask) -> Vec<Value> {
    a.events("id-1", 7)
        .into_iter()
        .map(|(e, _)| {
            let data = e
                .strip_prefix("data: ")
                .and_then(|d| d.strip_suffix("\n\n"))
                .unwrap_or_else(|| panic!("not one SSE event: {e:?}"));
            serde_json::from_str(data).unwrap_or(Value::String(data.into()))
        })
        .collect()
}

#[test]
fn a_chat_stream_is_openai_chunks_ending_in_done() {
    let a = ask(
        Kind::Chat,
        json!({"messages": [{"role": "user", "content": "count"}], "max_tokens": 4,
               "stream": true, "stream_options": {"include_usage": true}}),
    )
    .unwrap();
    let p = payloads(&a);
    assert_eq!(p.len(), 1 + 4 + 1 + 1 + 1, "{p:?}");
    assert_eq!(p[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = p[1..5]
        .iter()
        .map(|c| {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["id"], "id-1");
            assert!(c["choices"][0]["finish_reason"].is_null());
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        text,
        a.answer("x", 0)["choices"][0]["message"]["content"],
        "the stream says what the whole answer says"
    );
    assert_eq!(p[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(p[6]["choices"], json!([]));
    assert_eq!(p[6]["usage"]["completion_tokens"], 4);
    assert_eq!(p[7], "[DONE]");
    // Only the tokens are paced.
    let paced: Vec<bool> = a.events("i", 0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(paced.iter().filter(|t| **t).count(), 4);
}

#[test]
fn a_completion_stream_carries_text_pieces() {
    let a = ask(
        Kind::Completion,
        json!({"prompt": "once", "max_tokens": 3, "stream": true, "n": 2}),
    )
    .unwrap();
    let p = payloads(&a);
    // 3 tokens × 2 choices, one chunk with both finish reasons, [DONE]; no usage unless asked.
    assert_eq!(p.len(), 6 + 1 + 1, "{p:?}");
    let mut text = [String::new(), String::new()];
    for c in &p[..6] {
        assert_eq!(c["object"], "text_completion");
        let i = c["choices"][0]["index"].as_u64().unwrap() as usize;
        text[i].push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    let whole = a.answer("x", 0);
    assert_eq!(text[0], whole["choices"][0]["text"]);
    assert_eq!(text[1], whole["choices"][1]["text"]);
    assert_eq!(p[6]["choices"][1]["finish_reason"], "length");
    assert_eq!(p[7], "[DONE]");
}

#[test]
fn embeddings_are_deterministic_unit_vectors() {
    let e = EmbedAsk::parse(&json!({"model": "e", "input": ["a", "b", "a"]}), "toy").unwrap();
    let v = e.answer();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vec_of = |i: usize| -> Vec<f64> {
        data[i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    assert_eq!(vec_of(0).len(), EMBEDDING_DIM);
    assert_eq!(vec_of(0), vec_of(2), "same input, same vector");
    assert_ne!(vec_of(0), vec_of(1));
    let norm: f64 = vec_of(1).iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "{norm}");
    assert_eq!(data[1]["index"], 1);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    // base64: little-endian f32s, the same vector.
    let b = EmbedAsk::parse(
        &json!({"input": "a", "encoding_format": "base64", "dimensions": 8}),
        "toy",
    )
    .unwrap()
    .answer();
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes.len(), 8 * 4);
    assert_eq!(b["model"], "toy");
    let single = EmbedAsk::parse(&json!({"input": [5, 6, 7]}), "toy").unwrap();
    assert_eq!(single.answer()["data"].as_array().unwrap().len(), 1);
    for bad in [
        json!({}),
        json!({"input": []}),
        json!({"input": [1, "a"]}),
        json!({"input": vec!["x"; MAX_INPUTS + 1]}),
        json!({"input": "a", "dimensions": 0}),
        json!({"input": "a", "encoding_format": "hex"}),
    ] {
        assert!(EmbedAsk::parse(&bad, "toy").is_err(), "{bad}");
    }
}

#[test]
fn response_ids_are_unique_and_never_replica_names() {
    let ids: std::collections::HashSet<String> = (0..1000)
        .map(|n| response_id("cmpl", 42, n, 123_456))
        .collect();
    assert_eq!(ids.len(), 1000);
    for id in &ids {
        assert!(id.starts_with("cmpl-") && id.len() == 5 + 24, "{id}");
    }
    assert_ne!(
        response_id("cmpl", 42, 0, 1),
        response_id("cmpl", 43, 0, 1),
        "another process, other ids"
    );
}
