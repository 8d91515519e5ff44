//! Which server paths `/m/{model}/…` passes. A rule is a path of literal segments where `*`
//! stands for exactly one segment. A request path that could mean something other than what it
//! spells once the server decodes it (dot segments, empty segments, encoded slashes, dots or
//! backslashes) matches nothing: the check must hold for the path the server will see.

use std::fmt;

/// Longest rule or request path considered, in bytes and in segments.
const MAX_PATH_LEN: usize = 2048;
const MAX_SEGMENTS: usize = 32;

/// Inference endpoints of the servers hearth runs, and nothing that changes a server's state:
/// no llama.cpp `/slots` (save, restore, erase), `/lora-adapters` or `/props`, no vLLM LoRA
/// loading, `/sleep` or cache resets, no Triton repository, shared-memory, logging or trace
/// control.
pub const DEFAULT_INFERENCE_PATHS: &[&str] = &[
    // OpenAI-shaped (vLLM, llama.cpp, TGI's Messages API)
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/score",
    // llama.cpp's own
    "/completion",
    "/completions",
    "/embedding",
    "/embeddings",
    "/infill",
    "/rerank",
    "/reranking",
    "/tokenize",
    "/detokenize",
    // vLLM's own
    "/pooling",
    "/classify",
    "/score",
    // TGI
    "/generate",
    "/generate_stream",
    "/chat_tokenize",
    // Triton (KServe v2): inference only
    "/v2/models/*/generate",
    "/v2/models/*/generate_stream",
    "/v2/models/*/infer",
    "/v2/models/*/versions/*/generate",
    "/v2/models/*/versions/*/generate_stream",
    "/v2/models/*/versions/*/infer",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRules {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

/// A path rule that is not of the form rules take ([`RULE_FORM`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPathRule(pub String);

impl std::fmt::Display for BadPathRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {RULE_FORM}", self.0)
    }
}

impl std::error::Error for BadPathRule {}

impl PathRules {
    pub fn default_inference() -> PathRules {
        PathRules::parse(DEFAULT_INFERENCE_PATHS.iter().copied())
            .expect("the default paths are valid rules")
    }

    /// Rules from their text; the first bad one is the error.
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<PathRules, BadPathRule> {
        let mut rules = Vec::new();
        for text in texts {
            let segments = segments(text)
                .ok_or_else(|| BadPathRule(text.to_string()))?
                .into_iter()
                .map(|s| {
                    if s == "*" {
                        Segment::Any
                    } else {
                        Segment::Literal(s.to_string())
                    }
                })
                .collect();
            rules.push(Rule {
                text: text.to_string(),
                segments,
            });
        }
        Ok(PathRules { rules })
    }

    /// Whether a server path (what follows `/m/{model}`, with its leading slash, without the
    /// query) is allowed.
    pub fn allows(&self, path: &str) -> bool {
        let Some(segs) = segments(path) else {
            return false;
        };
        if segs.contains(&"*") {
            return false;
        }
        self.rules.iter().any(|r| {
            r.segments.len() == segs.len()
                && r.segments.iter().zip(&segs).all(|(rule, seg)| match rule {
                    Segment::Any => true,
                    Segment::Literal(l) => l == seg,
                })
        })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

impl fmt::Display for PathRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<&str> = self.rules.iter().map(|r| r.text.as_str()).collect();
        write!(f, "{}", texts.join(", "))
    }
}

const RULE_FORM: &str = "a path starts with /, has no empty, \".\" or \"..\" segment, no \
    percent-encoded slash, dot or backslash, and no backslash; * stands for one segment";

/// The segments of an absolute path, or None if the path is not one that means what it spells.
fn segments(path: &str) -> Option<Vec<&str>> {
    if path.len() > MAX_PATH_LEN || path.contains('\\') {
        return None;
    }
    let rest = path.strip_prefix('/')?;
    let lower = rest.to_ascii_lowercase();
    if ["%2f", "%2e", "%5c", "%00"]
        .iter()
        .any(|e| lower.contains(e))
    {
        return None;
    }
    let segs: Vec<&str> = rest.split('/').collect();
    if segs.len() > MAX_SEGMENTS
        || segs
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == ".." || s.chars().any(char::is_control))
    {
        return None;
    }
    Some(segs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_inference_and_nothing_that_administers_a_server() {
        let r = PathRules::default_inference();
        for ok in [
            "/v1/chat/completions",
            "/completion",
            "/generate_stream",
            "/v2/models/ensemble/generate",
            "/v2/models/ensemble/versions/3/infer",
        ] {
            assert!(r.allows(ok), "{ok}");
        }
        for admin in [
            "/slots/0",
            "/slots",
            "/lora-adapters",
            "/props",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/sleep",
            "/reset_prefix_cache",
            "/v2/repository/models/x/load",
            "/v2/systemsharedmemory/region/r/register",
            "/v2/logging",
            "/metrics",
            "/",
        ] {
            assert!(!r.allows(admin), "{admin}");
        }
    }

    #[test]
    fn paths_that_decode_to_something_else_match_nothing() {
        let r = PathRules::parse(["/v2/models/*/infer", "/generate"]).unwrap();
        for bad in [
            "/v2/models/../infer",
            "/v2/models/./infer",
            "/v2/models/a%2Fb/infer",
            "/v2/models/%2e%2e/infer",
            "/v2/models/a%5cb/infer",
            "/v2//models/x/infer",
            "/generate/",
            "//generate",
            "/v2/models/x\\..\\y/infer",
            "generate",
            "/v2/models/*/infer",
            "/gen%65rate",
        ] {
            assert!(!r.allows(bad), "{bad}");
        }
        assert!(r.allows("/v2/models/ensemble/infer"));
        assert!(r.allows("/generate"));
        let long = format!("/{}", "a/".repeat(40));
        assert!(!r.allows(&long));
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in ["generate", "/a/../b", "/a//b", "/a%2fb", ""] {
            assert!(PathRules::parse([bad]).is_err(), "{bad}");
        }
        assert!(PathRules::parse(Vec::<&str>::new()).unwrap().is_empty());
    }
}
