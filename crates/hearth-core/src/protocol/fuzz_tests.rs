//! The request parser under arbitrary lines and under mutations of valid requests (proptest).
//! Whatever a client sends: no panic, and either a request or a clear error (a code, a message
//! that is not empty and fits on the wire, never an echo of the whole line). What a mutation
//! certainly breaks (an unknown field, a cut line, a value of the wrong type) must be refused.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::*;

/// One valid request of each op, with every field it takes.
fn valid() -> Vec<Value> {
    vec![
        json!({"op":"version"}),
        json!({"op":"status"}),
        json!({"op":"status","model":"llama"}),
        json!({"op":"gpus"}),
        json!({"op":"watch","model":"llama"}),
        json!({"op":"report","model":"llama","replica":"llama-3","oldest_wait_ms":12.5,
               "queue_depth":3,"in_flight":4,"arrived":100,"completed":90}),
        json!({"op":"scale","model":"llama","min":1,"max":4,"warm_pool":"auto"}),
        json!({"op":"scale","model":"llama","reset":true}),
        json!({"op":"drain","replica":"llama-3","force":true}),
        json!({"op":"cordon","gpu":"0","reason":"xid 79","evacuate":true}),
        json!({"op":"uncordon","gpu":"GPU-abc"}),
        json!({"op":"reload"}),
    ]
}

/// Values of every JSON type and the edges of each.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(i64::MIN)),
        Just(json!(1e308)),
        Just(json!(-0.0)),
        Just(json!(4294967296u64)),
        any::<i64>().prop_map(|v| json!(v)),
        any::<f64>().prop_map(|v| json!(v)),
        ".{0,40}".prop_map(Value::String),
        Just(Value::String("x".repeat(60_000))),
        Just(json!([])),
        Just(json!({})),
        Just(json!([1, "a", null])),
        Just(json!({"op":"version"})),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Replace one field's value (by index) with a hostile one.
    Replace(usize, Value),
    /// Drop one field.
    Remove(usize),
    /// Add a field no op takes.
    Unknown(String, Value),
    /// Cut the line short (at a fraction of its length).
    Cut(f64),
    /// Change one byte.
    Byte(f64, u8),
    /// Nest the request this deep in arrays.
    Nest(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), hostile_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        2 => any::<usize>().prop_map(Mutation::Remove),
        2 => ("[a-z_]{1,12}|.{1,80}", hostile_value()).prop_map(|(k, v)| Mutation::Unknown(k, v)),
        2 => (0.0f64..1.0).prop_map(Mutation::Cut),
        2 => (0.0f64..1.0, any::<u8>()).prop_map(|(at, b)| Mutation::Byte(at, b)),
        1 => prop_oneof![1usize..10, Just(200usize), Just(50_000usize)].prop_map(Mutation::Nest),
    ]
}

/// A refusal a client can act on: a message, short enough for the wire.
fn assert_clear(line: &str, f: &Failure) {
    assert!(
        !f.message.trim().is_empty(),
        "{:?}: an empty message",
        f.code
    );
    let wire = encode_answer(&Err(f.clone()));
    assert!(
        wire.len() <= MAX_MESSAGE + 128,
        "a {}-byte error line for a {}-byte request",
        wire.len(),
        line.len()
    );
    assert!(
        matches!(f.code, ErrorCode::BadRequest | ErrorCode::UnknownOp),
        "{:?} for a line that did not parse",
        f.code
    );
}

/// Parses, checks the answer is clear, and returns whether it was refused.
fn parse(line: &str) -> Result<Request, Failure> {
    let r = parse_request(line);
    if let Err(f) = &r {
        assert_clear(line, f);
    }
    r
}

fn cut_at(s: &str, at: f64) -> usize {
    let mut i = ((s.len() as f64) * at) as usize;
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 3000,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn any_line_is_a_request_or_a_clear_error(line in prop_oneof![
        any::<String>(),
        "\\{.{0,200}\\}",
        "\\{\"op\":\"[a-z]{0,10}\".{0,100}",
        prop::collection::vec(any::<u8>(), 0..300)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]) {
        let _ = parse(&line);
    }

    #[test]
    fn a_mutated_request_is_a_request_or_a_clear_error(
        which in any::<usize>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let all = valid();
        let base = all[which % all.len()].clone();
        let mut obj: Map<String, Value> = base.as_object().cloned().unwrap_or_default();
        // Fields the mutations certainly made invalid (a value of another type, a name no op
        // takes), and what the text-level mutations decided: refused for certain or no claim.
        let mut bad: std::collections::BTreeSet<String> = Default::default();
        let mut text_fails: Option<bool> = None;
        let mut text: Option<String> = None;
        // Once a byte is changed, what the line says is anyone's guess: no claim about it.
        let mut mangled = false;
        for m in mutations {
            let keys: Vec<String> = obj.keys().cloned().collect();
            match m {
                // Field mutations apply while the line is still an object this test built.
                Mutation::Replace(i, v) if text.is_none() => {
                    if let Some(k) = keys.get(i % keys.len().max(1)) {
                        // A value of another type (a number where a string goes, an object for
                        // a flag) is certainly refused; `warm_pool` takes "auto" or a count.
                        // Compared with the valid request's value (a field this test added has
                        // none: no claim).
                        let wrong = base.get(k).is_some_and(|old| {
                            std::mem::discriminant(old) != std::mem::discriminant(&v)
                                && !(old.is_number() && v.is_number())
                        });
                        if wrong && !v.is_null() && k != "warm_pool" {
                            bad.insert(k.clone());
                        } else {
                            bad.remove(k);
                        }
                        obj.insert(k.clone(), v);
                    }
                }
                Mutation::Remove(i) if text.is_none() => {
                    if let Some(k) = keys.get(i % keys.len().max(1)) {
                        obj.remove(k);
                        bad.remove(k);
                    }
                }
                Mutation::Unknown(k, v) if text.is_none() => {
                    let known = [
                        "op", "model", "replica", "oldest_wait_ms", "queue_depth", "in_flight",
                        "arrived", "completed", "min", "max", "warm_pool", "reset", "force",
                        "gpu", "reason", "evacuate",
                    ];
                    if known.contains(&k.as_str()) {
                        bad.remove(&k);
                    } else {
                        bad.insert(k.clone());
                    }
                    obj.insert(k, v);
                }
                Mutation::Replace(..) | Mutation::Remove(_) | Mutation::Unknown(..) => {}
                Mutation::Cut(at) => {
                    let s = text.take().unwrap_or_else(|| Value::Object(obj.clone()).to_string());
                    let i = cut_at(&s, at);
                    // A strict prefix of one JSON object is never a whole one.
                    text_fails = Some(!mangled);
                    text = Some(s[..i].to_string());
                }
                Mutation::Byte(at, b) => {
                    let s = text.take().unwrap_or_else(|| Value::Object(obj.clone()).to_string());
                    let mut bytes = s.into_bytes();
                    if !bytes.is_empty() {
                        let i = ((bytes.len() as f64) * at) as usize % bytes.len();
                        bytes[i] = b;
                    }
                    mangled = true;
                    text_fails = Some(false);
                    text = Some(String::from_utf8_lossy(&bytes).into_owned());
                }
                Mutation::Nest(depth) => {
                    let s = text.take().unwrap_or_else(|| Value::Object(obj.clone()).to_string());
                    // An array is never a request.
                    text_fails = Some(true);
                    text = Some(format!("{}{s}{}", "[".repeat(depth), "]".repeat(depth)));
                }
            }
        }
        let must_fail = text_fails.unwrap_or(!bad.is_empty() || !obj.contains_key("op"));
        let line = text.unwrap_or_else(|| Value::Object(obj).to_string());
        let r = parse(&line);
        if must_fail {
            prop_assert!(r.is_err(), "accepted {line:.200}: {r:?}");
        }
    }
}

#[test]
fn every_valid_request_parses() {
    for v in valid() {
        let line = v.to_string();
        assert!(
            parse_request(&line).is_ok(),
            "{line}: {:?}",
            parse_request(&line)
        );
    }
}
