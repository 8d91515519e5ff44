//! Placeholders in templates: `{port}`, `{replica}`, `{model}` and `{gpus}` expand in commands,
//! `env` values, URLs, bodies and headers; anything else in braces (JSON) is left as written.

/// Values for `{port}`, `{replica}`, `{model}`, `{gpus}`.
#[derive(Debug, Clone, Default)]
pub struct Placeholders {
    pub port: u16,
    pub replica: String,
    pub model: String,
    /// comma-separated device UUIDs, empty for CPU-only replicas
    pub gpus: String,
}

/// The placeholders that exist in templates.
pub(super) const PLACEHOLDERS: [&str; 4] = ["port", "replica", "model", "gpus"];

/// Replace `{port}`, `{replica}`, `{model}` and `{gpus}` in `template`. Anything else, including
/// JSON braces and unknown `{names}`, is left as written.
pub fn expand(template: &str, vars: &Placeholders) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(pos) = rest.find('{') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        match placeholder_at(after) {
            Some((name, len)) if PLACEHOLDERS.contains(&name) => {
                match name {
                    "port" => out.push_str(&vars.port.to_string()),
                    "replica" => out.push_str(&vars.replica),
                    "model" => out.push_str(&vars.model),
                    _ => out.push_str(&vars.gpus),
                }
                rest = &after[len..];
            }
            _ => {
                out.push('{');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `s` starts with `{identifier}`, the identifier and the length of the whole placeholder.
fn placeholder_at(s: &str) -> Option<(&str, usize)> {
    let body = s.strip_prefix('{')?;
    let end = body.find('}')?;
    let name = &body[..end];
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first.is_ascii_alphabetic() || first == '_')
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return None;
    }
    Some((name, end + 2))
}

/// Every `{identifier}` in `template`, known or not.
pub(super) fn placeholders_in(template: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(pos) = rest.find('{') {
        let after = &rest[pos..];
        match placeholder_at(after) {
            Some((name, len)) => {
                found.push(name);
                rest = &after[len..];
            }
            None => rest = &after[1..],
        }
    }
    found
}
