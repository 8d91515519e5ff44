//! `expand` and the placeholder scanner.

use crate::config::placeholders::placeholders_in;
use crate::config::*;

#[test]
fn expand_replaces_only_known_placeholders() {
    let vars = Placeholders {
        port: 20001,
        replica: "llama-8b-3".into(),
        model: "llama-8b".into(),
        gpus: "GPU-a,GPU-b".into(),
    };
    assert_eq!(
        expand("http://127.0.0.1:{port}/v1/completions", &vars),
        "http://127.0.0.1:20001/v1/completions"
    );
    assert_eq!(
        expand(
            r#"{"model":"{model}","prompt":"Hello","max_tokens":4}"#,
            &vars
        ),
        r#"{"model":"llama-8b","prompt":"Hello","max_tokens":4}"#
    );
    assert_eq!(
        expand(
            r#"{ "r": "{replica}", "g": "{gpus}", "x": {"y": "{other}"} }{"#,
            &vars
        ),
        r#"{ "r": "llama-8b-3", "g": "GPU-a,GPU-b", "x": {"y": "{other}"} }{"#
    );
    assert_eq!(expand("{port}{port}", &vars), "2000120001");
    assert_eq!(expand("{{port}}", &vars), "{20001}");
    assert_eq!(expand("", &vars), "");
    assert_eq!(expand("plain é {", &vars), "plain é {");
}

#[test]
fn placeholder_scanner() {
    assert_eq!(
        placeholders_in(r#"{"a":{b}} {_x1} {1x} { y} {z"#),
        vec!["b", "_x1"]
    );
}
