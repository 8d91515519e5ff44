//! Golden outputs: what a command printed, committed under `tests/golden/`, and the check that it
//! still prints exactly that. A difference fails with a unified diff (`diff -u`, diffutils) and
//! the command that rewrites the files; a change of policy rewrites them in the same commit, on
//! purpose, and the diff in that commit is the review of what the change did.
//!
//! The files are JSON laid out one leaf object a line (an object or array that holds no other is
//! written whole on its line), keys sorted, so that a diff names the policy and the figure that
//! moved. Wall-clock fields (`seconds`, `jobs`) are left out before anything is compared.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Set to 1 to write the current outputs over the committed ones instead of comparing.
pub const UPDATE: &str = "HEARTH_UPDATE_GOLDEN";

/// Fields that depend on the machine or the moment, not on the program.
const WALL_CLOCK: [&str; 2] = ["seconds", "jobs"];

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// `v` without its wall-clock fields, laid out as the golden files are.
pub fn render(v: &Value) -> String {
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        for k in WALL_CLOCK {
            m.remove(k);
        }
    }
    let mut out = String::new();
    lay_out(&v, 0, &mut out);
    out.push('\n');
    out
}

fn lay_out(v: &Value, indent: usize, out: &mut String) {
    let nested = |x: &Value| matches!(x, Value::Array(_) | Value::Object(_));
    let pad = |n: usize| " ".repeat(n);
    match v {
        Value::Object(m) if m.values().any(nested) => {
            out.push_str("{\n");
            for (i, (k, x)) in m.iter().enumerate() {
                out.push_str(&format!("{}{}: ", pad(indent + 2), Value::from(k.as_str())));
                lay_out(x, indent + 2, out);
                out.push_str(if i + 1 < m.len() { ",\n" } else { "\n" });
            }
            out.push_str(&format!("{}}}", pad(indent)));
        }
        Value::Array(a) if a.iter().any(nested) => {
            out.push_str("[\n");
            for (i, x) in a.iter().enumerate() {
                out.push_str(&pad(indent + 2));
                lay_out(x, indent + 2, out);
                out.push_str(if i + 1 < a.len() { ",\n" } else { "\n" });
            }
            out.push_str(&format!("{}]", pad(indent)));
        }
        leaf => out.push_str(&leaf.to_string()),
    }
}

/// Compares `actual` (as `render` lays it out) with `tests/golden/NAME`, or writes it there
/// when `HEARTH_UPDATE_GOLDEN=1`. Returns what differs, as a message with the diff, or None.
pub fn check(name: &str, how: &str, actual: &Value) -> Option<String> {
    let path = dir().join(name);
    let text = render(actual);
    if std::env::var_os(UPDATE).is_some_and(|v| v == "1") {
        std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("rewrote {}", path.display());
        return None;
    }
    let golden = match std::fs::read_to_string(&path) {
        Ok(g) if g == text => return None,
        Ok(g) => g,
        Err(e) => format!("({} unreadable: {e})\n", path.display()),
    };
    Some(format!(
        "{name} ({how}) differs from the committed output:\n{}\nIf the change is meant (a policy \
         change), rewrite the goldens and commit them with it:\n  {UPDATE}=1 cargo test \
         --release --test simulate golden",
        diff(name, &golden, &text)
    ))
}

/// `diff -u` of the two texts, at most 120 lines of it.
fn diff(name: &str, golden: &str, actual: &str) -> String {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let (g, a) = (tmp.path().join("golden"), tmp.path().join("actual"));
    std::fs::write(&g, golden).unwrap();
    std::fs::write(&a, actual).unwrap();
    let out = std::process::Command::new("diff")
        .args(["-u", "--label", &format!("tests/golden/{name}"), "--label"])
        .arg("now")
        .arg(&g)
        .arg(&a)
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let lines: Vec<&str> = text.lines().collect();
            let mut shown = lines[..lines.len().min(120)].join("\n");
            if lines.len() > 120 {
                shown.push_str(&format!("\n… {} more lines of diff", lines.len() - 120));
            }
            shown
        }
        Err(e) => format!("(no diff: {e}; install diffutils)"),
    }
}
