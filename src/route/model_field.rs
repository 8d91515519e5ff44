//! The `model` of an OpenAI-style request body, and the check that the body is JSON.
//!
//! The whole body is checked in one pass, without building it: every string valid UTF-8 with
//! its escapes paired (no lone surrogates), every number within f64, nesting at most
//! `MAX_DEPTH` (serde_json's recursion bound), nothing after the value. A replica never gets
//! what its own parser might read otherwise or choke on. Only `model` is kept; when it names
//! an alias it is replaced in place by the model's name, so that the replica gets exactly the
//! bytes the client sent except that one value.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Deepest nesting of arrays and objects a body may have, the top-level object included:
/// serde_json's own bound (its recursion limit of 128 allows 127 levels), which keeps its
/// recursive descent within a few KiB of stack. Far beyond what any request nests (tool
/// schemas run to tens of levels).
pub const MAX_DEPTH: usize = 127;

#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    NotJson(String),
    NoModel,
    ModelNotString,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::NotJson(e) => write!(f, "the body is not valid JSON: {e}"),
            BodyError::NoModel => f.write_str("the body has no \"model\""),
            BodyError::ModelNotString => f.write_str("\"model\" must be a string"),
        }
    }
}

/// The top-level object: `model` kept as it lies in the body, every other value checked.
struct Probe<'a> {
    model: Option<&'a RawValue>,
}

impl<'de> Deserialize<'de> for Probe<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ProbeVisitor)
    }
}

struct ProbeVisitor;

impl<'de> Visitor<'de> for ProbeVisitor {
    type Value = Probe<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probe<'de>, A::Error> {
        let mut model = None;
        while let Some(IsModel(is_model)) = map.next_key()? {
            if !is_model {
                map.next_value::<Checked>()?;
            } else if model.is_some() {
                return Err(de::Error::duplicate_field("model"));
            } else {
                // Kept raw (its place in the body is what an alias replaces); read as a
                // string, which checks it, by `model_of`.
                model = Some(map.next_value::<&RawValue>()?);
            }
        }
        Ok(Probe { model })
    }
}

/// A key of the top-level object: whether it is `model` (escapes decoded), nothing kept.
struct IsModel(bool);

impl<'de> Deserialize<'de> for IsModel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = IsModel;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<IsModel, E> {
                Ok(IsModel(s == "model"))
            }
        }
        d.deserialize_str(V)
    }
}

/// Any JSON value, read in full (strings decoded and checked, numbers parsed, nesting counted
/// against serde_json's recursion bound) and then dropped: nothing is allocated for it.
/// `IgnoredAny` would skip it unchecked, at any depth.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        // Keys are strings: checked like any string.
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

/// The model a body asks for, and where its value (quotes included) lies in the body; an
/// error unless the whole body is one valid JSON object within `MAX_DEPTH`.
pub fn model_of(body: &[u8]) -> Result<(Cow<'_, str>, std::ops::Range<usize>), BodyError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let probe = Probe::deserialize(&mut de)
        .and_then(|p| de.end().map(|()| p))
        .map_err(|e| {
            // A top-level array, or a second "model", is valid JSON but not a request we can
            // route without guessing.
            if e.classify() == serde_json::error::Category::Data {
                BodyError::NotJson(format!("not a request object with one \"model\": {e}"))
            } else if e.to_string().starts_with("recursion limit exceeded") {
                BodyError::NotJson(format!("nested deeper than {MAX_DEPTH} levels: {e}"))
            } else {
                BodyError::NotJson(e.to_string())
            }
        })?;
    let raw = probe.model.ok_or(BodyError::NoModel)?;
    // Borrowed from the body unless it has escapes to decode.
    let name = match serde_json::from_str::<&str>(raw.get()) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(
            serde_json::from_str::<String>(raw.get()).map_err(|_| BodyError::ModelNotString)?,
        ),
    };
    // The raw value borrows from `body`: its offset there is where the value starts.
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    Ok((name, start..start + raw.get().len()))
}

/// `body` with the value at `span` replaced by `name` as a JSON string.
pub fn replace_model(body: &[u8], span: std::ops::Range<usize>, name: &str) -> Vec<u8> {
    let quoted = serde_json::to_string(name).expect("a string serializes");
    let mut out = Vec::with_capacity(body.len() + quoted.len());
    out.extend_from_slice(&body[..span.start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[span.end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_model_and_replaces_only_its_value() {
        let body = br#"{"messages":[{"role":"user","content":"model"}], "model" : "gpt-4o","n":1}"#;
        let (name, span) = model_of(body).unwrap();
        assert_eq!(name, "gpt-4o");
        let out = replace_model(body, span, "llama-8b");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"messages":[{"role":"user","content":"model"}], "model" : "llama-8b","n":1}"#
        );
        let (name, _) = model_of(br#"{"model":"a\u002db"}"#).unwrap();
        assert_eq!(name, "a-b", "escapes are decoded");
    }

    #[test]
    fn bad_bodies_are_told_apart() {
        assert!(matches!(model_of(b"{nope"), Err(BodyError::NotJson(_))));
        assert!(matches!(model_of(b"[1,2]"), Err(BodyError::NotJson(_))));
        assert!(matches!(model_of(b""), Err(BodyError::NotJson(_))));
        assert!(matches!(
            model_of(br#"{"model":"m","x":}"#),
            Err(BodyError::NotJson(_))
        ));
        assert!(matches!(
            model_of(br#"{"model":"a","model":"b"}"#),
            Err(BodyError::NotJson(_))
        ));
        assert_eq!(model_of(br#"{"prompt":"x"}"#), Err(BodyError::NoModel));
        assert_eq!(model_of(br#"{"model":7}"#), Err(BodyError::ModelNotString));
        let unbalanced = format!("{{\"model\":\"m\",\"a\":{}}}", "[".repeat(100_000));
        assert!(matches!(
            model_of(unbalanced.as_bytes()),
            Err(BodyError::NotJson(_))
        ));
    }

    /// `{"a":[[…]],"model":"m"}` nested `depth` deep, the top-level object included.
    fn nested(depth: usize) -> String {
        let inner = depth - 1;
        format!(
            "{{\"a\":{}{},\"model\":\"m\"}}",
            "[".repeat(inner),
            "]".repeat(inner)
        )
    }

    #[test]
    fn nesting_is_bounded_in_fields_the_router_does_not_read() {
        assert_eq!(model_of(nested(MAX_DEPTH).as_bytes()).unwrap().0, "m");
        let e = model_of(nested(MAX_DEPTH + 1).as_bytes()).unwrap_err();
        assert!(
            e.to_string().contains(&format!("deeper than {MAX_DEPTH}")),
            "{e}"
        );
        // The issue's probe: 100,000 deep, balanced.
        assert!(matches!(
            model_of(nested(100_000).as_bytes()),
            Err(BodyError::NotJson(_))
        ));
        // Objects count as arrays do.
        let objects = format!(
            "{{\"model\":\"m\",\"a\":{}1{}}}",
            "{\"k\":".repeat(MAX_DEPTH),
            "}".repeat(MAX_DEPTH)
        );
        assert!(matches!(
            model_of(objects.as_bytes()),
            Err(BodyError::NotJson(_))
        ));
    }

    #[test]
    fn strings_the_router_does_not_read_are_checked_too() {
        let bad: [&[u8]; 6] = [
            b"{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}",
            b"{\"model\":\"m\",\"x\":[\"ok\",\"\xc3\"]}",
            b"{\"model\":\"m\",\"\xe2\x82\":1}",
            br#"{"model":"m","prompt":"\ud800"}"#,
            br#"{"model":"m","prompt":"\udc00x"}"#,
            br#"{"model":"m","k":{"\ud83d":1}}"#,
        ];
        for body in bad {
            assert!(
                matches!(model_of(body), Err(BodyError::NotJson(_))),
                "{:?} passed",
                String::from_utf8_lossy(body)
            );
        }
        // A lone surrogate in the model itself is no model name.
        assert!(model_of(br#"{"model":"\ud800"}"#).is_err());
        // What is valid passes: paired surrogates, UTF-8, escapes, every kind of value.
        let good = r#"{"prompt":"caf\u00e9 \ud83d\ude00 ☕","n":-1.5e10,"b":[true,false,null,{}],"model":"m"}"#;
        assert_eq!(model_of(good.as_bytes()).unwrap().0, "m");
        assert!(matches!(
            model_of(br#"{"model":"m"} {}"#),
            Err(BodyError::NotJson(_))
        ));
    }
}
