//! The key a "duplicate key" syntax error is about. toml reports only the span of the second
//! occurrence's last segment (`tick`, `daemon`), not the table it is in; the operator needs the
//! whole path, in the form every other error uses (`daemon.tick`, `model[1].name`).

use std::collections::HashMap;

/// The full key of the duplicate whose last segment is `text[start..end]`.
pub(super) fn key_path(text: &str, start: usize, end: usize) -> String {
    let start = floor(text, start);
    let end = floor(text, end.max(start));
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let mut tables = Tables::default();
    for line in text[..line_start].lines() {
        tables.header(line);
    }
    let on_line = text[line_start..start].trim_start();
    let segment = unquote(&text[start..end]);
    if let Some(header) = on_line.strip_prefix('[') {
        // A table header given twice: its own path, up to the segment.
        let mut parts = dotted(header.trim_start_matches('['));
        parts.push(segment);
        return tables.path(&parts);
    }
    let mut path = tables.current;
    for p in keys_open(on_line).into_iter().chain([segment]) {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(&p);
    }
    path
}

/// The largest char boundary of `text` at or below `i`.
fn floor(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The table headers read so far: the table they leave open and how many of each array of
/// tables (`[[model]]`) there were.
#[derive(Default)]
struct Tables {
    current: String,
    arrays: HashMap<String, usize>,
}

impl Tables {
    fn header(&mut self, line: &str) {
        let line = line.trim_start();
        if let Some(name) = line.strip_prefix("[[") {
            let parts = dotted(name.split("]]").next().unwrap_or(""));
            *self.arrays.entry(parts.join(".")).or_insert(0) += 1;
            self.current = self.path(&parts);
        } else if let Some(name) = line.strip_prefix('[') {
            self.current = self.path(&dotted(name.split(']').next().unwrap_or("")));
        }
    }

    /// `parts` joined with `.`, each prefix that names an array of tables given its last index.
    fn path(&self, parts: &[String]) -> String {
        let mut out = String::new();
        let mut name = String::new();
        for p in parts {
            for s in [&mut out, &mut name] {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(p);
            }
            if let Some(n) = self.arrays.get(&name) {
                out.push_str(&format!("[{}]", n - 1));
            }
        }
        out
    }
}

/// The keys still open at the end of `line`: dotted keys before the duplicate (`a.` of `a.b`)
/// and the keys of inline tables it is inside (`x` of `x = { a = 1, a`).
fn keys_open(line: &str) -> Vec<String> {
    let mut levels: Vec<Vec<String>> = Vec::new();
    let mut key = String::new();
    // The key whose value is being read, from its `=` to the `,` or `}` that ends the value.
    let mut valued: Option<Vec<String>> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                let quoted: String = chars.by_ref().take_while(|&q| q != c).collect();
                if valued.is_none() {
                    key.push_str(&quoted);
                }
            }
            '=' if valued.is_none() => valued = Some(dotted(&std::mem::take(&mut key))),
            '{' => levels.extend(valued.take()),
            ',' => {
                valued = None;
                key.clear();
            }
            '}' => {
                levels.pop();
                valued = None;
            }
            c if valued.is_none() => key.push(c),
            _ => {}
        }
    }
    levels.into_iter().flatten().chain(dotted(&key)).collect()
}

/// `a . "b"` → [a, b].
fn dotted(key: &str) -> Vec<String> {
    key.split('.')
        .map(unquote)
        .filter(|s| !s.is_empty())
        .collect()
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches(['"', '\'']).to_string()
}
