//! The `model` of an OpenAI-style request body. The whole body is checked to be JSON (serde
//! bounds its nesting depth), but only `model` is kept; when it names an alias it is replaced in
//! place by the model's name, so that the replica gets exactly the bytes the client sent except
//! that one value.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

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

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
}

/// The model a body asks for, and where its value (quotes included) lies in the body.
pub fn model_of(body: &[u8]) -> Result<(Cow<'_, str>, std::ops::Range<usize>), BodyError> {
    let probe: Probe = serde_json::from_slice(body).map_err(|e| {
        // A top-level array, or a second "model", is valid JSON but not a request we can route
        // without guessing.
        if e.classify() == serde_json::error::Category::Data {
            BodyError::NotJson(format!("not a request object with one \"model\": {e}"))
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
        // Deep nesting in the fields skipped over costs no stack (serde_json skips them with a
        // loop), whatever the depth; the body's size is what bounds it.
        let deep = format!(
            "{{\"a\":{}{},\"model\":\"m\"}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(model_of(deep.as_bytes()).unwrap().0, "m");
        let unbalanced = format!("{{\"model\":\"m\",\"a\":{}}}", "[".repeat(100_000));
        assert!(matches!(
            model_of(unbalanced.as_bytes()),
            Err(BodyError::NotJson(_))
        ));
    }
}
