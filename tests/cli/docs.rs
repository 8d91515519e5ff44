//! The docs name only what exists. Every repository path that README.md, docs/**/*.md,
//! tests/README.md and BENCHMARKS.md name in backticks or in a link is in the repository (a
//! link's `#anchor` is a heading of its page), and the configuration keys docs/configuration.md
//! documents are exactly the keys `hearth check-config` accepts, table by table: a misnamed key
//! in the docs, and a key the code reads that the docs leave out, both fail here.
//!
//! No daemon: the repository is read from the file system, and the schema from the binary's own
//! error message for a key it does not know (`unknown field `x`, expected one of …`), so the
//! check is what a user's file meets, whatever module the schema lives in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};
use std::process::Command;

const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");

/// The key written into each table to make `check-config` list the ones it knows.
const PROBE: &str = "zz_not_a_key";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pages checked, as paths relative to the root.
fn pages() -> Vec<String> {
    let mut pages = vec![
        "README.md".to_string(),
        "BENCHMARKS.md".to_string(),
        "tests/README.md".to_string(),
    ];
    let repo = Repo::read();
    pages.extend(
        repo.files
            .iter()
            .filter(|f| f.starts_with("docs/") && f.ends_with(".md"))
            .cloned(),
    );
    pages
}

/// What the repository holds: every file and directory below the root, as `/`-separated
/// relative paths, without build output (`target/`) and version control (`.git/`).
struct Repo {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
    /// The root's own entries: a path that starts with one of these names a repository path.
    top: BTreeSet<String>,
    /// The last component of every directory: a relative path that starts with one of these
    /// (`core/gpu.rs`, `containment/`) names a file below some directory.
    dir_names: BTreeSet<String>,
    base_names: BTreeSet<String>,
}

impl Repo {
    fn read() -> Repo {
        let mut repo = Repo {
            files: BTreeSet::new(),
            dirs: BTreeSet::new(),
            top: BTreeSet::new(),
            dir_names: BTreeSet::new(),
            base_names: BTreeSet::new(),
        };
        repo.walk(root(), "");
        repo
    }

    fn walk(&mut self, dir: &Path, rel: &str) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if rel.is_empty() && (name == "target" || name == ".git") {
                continue;
            }
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if rel.is_empty() {
                self.top.insert(name.clone());
            }
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                self.dir_names.insert(name);
                self.dirs.insert(path.clone());
                self.walk(&entry.path(), &path);
            } else {
                self.base_names.insert(name);
                self.files.insert(path);
            }
        }
    }

    fn exists(&self, path: &str) -> bool {
        match path.strip_suffix('/') {
            Some(dir) => self.dirs.contains(dir),
            None => self.files.contains(path) || self.dirs.contains(path),
        }
    }

    /// Whether `token`, as a page names it in backticks, is what it seems to name. `Some(false)`:
    /// it names a repository path that is not there; `None`: it is not a repository path
    /// (a runtime file such as `state_dir/overrides.json`, a command, a number).
    fn names_existing(&self, token: &str) -> Option<bool> {
        // A command (`scripts/real-model.sh DIR`): its program.
        if let Some((program, _)) = token.split_once(' ') {
            return self
                .names_existing(program)
                .filter(|_| program.contains('/'));
        }
        let path_chars = |c: char| c.is_ascii_alphanumeric() || "._-/*".contains(c);
        if token.is_empty() || !token.chars().all(path_chars) || token.starts_with("..") {
            return None;
        }
        if token.starts_with('/') || token.starts_with('-') || token.starts_with("*") {
            return None;
        }
        let first = token.split('/').next().unwrap_or_default();
        if token.contains('/') {
            if self.top.contains(first) {
                return Some(self.matches(token, true));
            }
            if self.dir_names.contains(first) {
                return Some(self.matches(token, false));
            }
            return None;
        }
        if self.top.contains(token) {
            return Some(true);
        }
        // A file named alone (`daemon.rs`, `hearth.service`), by its kind: runtime files
        // (`overrides.json`, `hearth.slice`) are other kinds.
        let kinds = [".rs", ".md", ".sh", ".service", ".sysusers", ".tmpfiles"];
        if kinds.iter().any(|k| token.ends_with(k)) {
            return Some(self.base_names.iter().any(|n| wildcard(token, n)));
        }
        None
    }

    /// Whether a file or directory (a directory only, for `token/`) is `token`, component by
    /// component (`*` for part of one): the whole path when `anchored`, else its last components.
    fn matches(&self, token: &str, anchored: bool) -> bool {
        let (dirs_only, t) = match token.strip_suffix('/') {
            Some(t) => (true, t),
            None => (false, token),
        };
        let want: Vec<&str> = t.split('/').collect();
        let files = self.files.iter().filter(|_| !dirs_only);
        self.dirs.iter().chain(files).any(|candidate| {
            let parts: Vec<&str> = candidate.split('/').collect();
            if parts.len() < want.len() || anchored && parts.len() != want.len() {
                return false;
            }
            let tail = &parts[parts.len() - want.len()..];
            tail.iter().zip(&want).all(|(p, w)| wildcard(w, p))
        })
    }
}

/// `pattern` (with `*` for any run of characters) against `name`, whole.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(after) = name.strip_prefix(head) else {
                return false;
            };
            (0..=after.len())
                .filter(|&i| after.is_char_boundary(i))
                .any(|i| wildcard(rest, &after[i..]))
        }
    }
}

/// A page read for what it names: code spans and link targets outside fenced blocks, with
/// the line each starts on, and the anchors its headings make.
#[derive(Default)]
struct Page {
    spans: Vec<(usize, String)>,
    links: Vec<(usize, String)>,
    headings: Vec<(usize, String)>,
}

impl Page {
    fn read(text: &str) -> Page {
        let mut page = Page::default();
        let mut fenced = false;
        let mut prose = String::new();
        let mut starts = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                prose.push('\n');
                starts.push(i + 1);
                continue;
            }
            if fenced {
                prose.push('\n');
                starts.push(i + 1);
                continue;
            }
            if line.starts_with('#') {
                page.headings
                    .push((i + 1, line.trim_start_matches('#').trim().to_string()));
            }
            for _ in line.chars() {
                starts.push(i + 1);
            }
            prose.push_str(line);
            prose.push('\n');
            starts.push(i + 1);
        }
        page.scan(&prose, &starts);
        page
    }

    /// Code spans (which may run across a line break) and `](target)` outside them.
    fn scan(&mut self, prose: &str, line_of: &[usize]) {
        let chars: Vec<char> = prose.chars().collect();
        let line = |i: usize| line_of.get(i).copied().unwrap_or(0);
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '`' {
                let start = i + 1;
                let Some(len) = chars[start..].iter().position(|&c| c == '`') else {
                    break;
                };
                let span: String = chars[start..start + len].iter().collect();
                self.spans.push((line(start), span));
                i = start + len + 1;
                continue;
            }
            if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
                let start = i + 2;
                if let Some(len) = chars[start..].iter().position(|&c| c == ')') {
                    let target: String = chars[start..start + len].iter().collect();
                    self.links.push((line(start), target));
                }
            }
            i += 1;
        }
    }

    fn anchors(&self) -> BTreeSet<String> {
        self.headings.iter().map(|(_, h)| slug(h)).collect()
    }
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped but `-` and `_`, spaces
/// as `-`.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect::<String>()
        .to_lowercase()
}

/// `base/target` with `.` and `..` resolved, relative to the root; None when it leaves it.
fn resolve(base: &Path, target: &str) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in base.join(target).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn every_path_and_link_the_docs_name_exists() {
    let repo = Repo::read();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for rel in pages() {
        let page = Page::read(&read(&rel));
        for (line, span) in &page.spans {
            match repo.names_existing(span.trim()) {
                Some(true) => checked += 1,
                Some(false) => wrong.push(format!("{rel}:{line}: `{span}`: no such path")),
                None => {}
            }
        }
        let dir = Path::new(&rel).parent().unwrap_or(Path::new(""));
        for (line, link) in &page.links {
            let link = link.trim();
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (target, anchor) = match link.split_once('#') {
                Some((t, a)) => (t, Some(a)),
                None => (link, None),
            };
            let path = if target.is_empty() {
                Some(rel.clone())
            } else {
                resolve(dir, target)
            };
            let Some(path) = path.filter(|p| repo.exists(p) || repo.dirs.contains(p)) else {
                wrong.push(format!("{rel}:{line}: ({link}): no such path"));
                continue;
            };
            if let Some(anchor) = anchor {
                let anchors = if path.ends_with(".md") {
                    Page::read(&read(&path)).anchors()
                } else {
                    BTreeSet::new()
                };
                if !anchors.contains(anchor) {
                    wrong.push(format!(
                        "{rel}:{line}: ({link}): {path} has no heading #{anchor}"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the docs name what is not there:\n{}",
        wrong.join("\n")
    );
    // The check saw the docs at all: they name hundreds of files.
    assert!(checked > 200, "only {checked} paths and links found");
}

/// The tables docs/configuration.md documents (`## `[daemon]``, `### `[[gpus.device]]``: the
/// first code span of a heading that is a TOML table header), each with the keys of its
/// `| key | … |` tables. Which tables are arrays (`[[model]]`) is said by their headings.
struct Documented {
    keys: BTreeMap<String, BTreeSet<String>>,
    arrays: BTreeSet<String>,
}

impl Documented {
    fn read(text: &str) -> Documented {
        let mut doc = Documented {
            keys: BTreeMap::new(),
            arrays: BTreeSet::new(),
        };
        doc.keys.insert(String::new(), BTreeSet::new());
        let mut table: Option<String> = None;
        let mut in_keys = false;
        let mut fenced = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            if line.starts_with('#') {
                table = header_of(line).map(|(name, array)| {
                    if array {
                        doc.arrays.insert(name.clone());
                    }
                    doc.keys.entry(name.clone()).or_default();
                    name
                });
                continue;
            }
            if !line.starts_with('|') {
                in_keys = false;
                continue;
            }
            let first = line
                .trim_matches('|')
                .split('|')
                .next()
                .unwrap_or("")
                .trim();
            if first == "key" {
                assert!(
                    table.is_some(),
                    "docs/configuration.md:{}: a key table under a heading that names no table",
                    i + 1
                );
                in_keys = true;
                continue;
            }
            if !in_keys || first.starts_with("---") {
                continue;
            }
            let key = first.split('`').nth(1).unwrap_or_else(|| {
                panic!("docs/configuration.md:{}: a key row without a `key`", i + 1)
            });
            let t = table.clone().unwrap_or_default();
            doc.keys.entry(t).or_default().insert(key.to_string());
        }
        // A documented table documents its own name in the nearest documented table above it
        // (`[model.warmup]`: the key `warmup` of `[[model]]`; `[route.model.NAME]`: `model` of
        // `[route]`; `[daemon]`: `daemon` at the top).
        let tables: Vec<String> = doc.keys.keys().filter(|t| !t.is_empty()).cloned().collect();
        for t in &tables {
            let parts: Vec<&str> = t.split('.').collect();
            let parent = (0..parts.len())
                .rev()
                .map(|n| parts[..n].join("."))
                .find(|p| doc.keys.contains_key(p))
                .unwrap_or_default();
            let depth = if parent.is_empty() {
                0
            } else {
                parent.split('.').count()
            };
            let child = parts[depth].to_string();
            doc.keys.entry(parent).or_default().insert(child);
        }
        doc
    }

    /// A file in which `PROBE` is a key of `table`, and nothing else is set.
    fn probe(&self, table: &str) -> String {
        let mut text = String::new();
        let parts: Vec<&str> = table.split('.').collect();
        for n in 1..parts.len() {
            let ancestor = parts[..n].join(".");
            if self.arrays.contains(&ancestor) {
                text.push_str(&format!("[[{ancestor}]]\n"));
            }
        }
        if !table.is_empty() {
            if self.arrays.contains(table) {
                text.push_str(&format!("[[{table}]]\n"));
            } else {
                text.push_str(&format!("[{table}]\n"));
            }
        }
        text.push_str(&format!("{PROBE} = 0\n"));
        text
    }
}

/// `(name, is an array)` of the table a heading names: its first code span, when that is
/// `[name]` or `[[name]]`.
fn header_of(heading: &str) -> Option<(String, bool)> {
    let span = heading.split('`').nth(1)?;
    let (inner, array) = match span.strip_prefix("[[").and_then(|s| s.strip_suffix("]]")) {
        Some(inner) => (inner, true),
        None => (span.strip_prefix('[')?.strip_suffix(']')?, false),
    };
    let name_chars = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    (!inner.is_empty() && inner.chars().all(name_chars)).then(|| (inner.to_string(), array))
}

/// The keys `hearth check-config` accepts in the table `probe` sets `PROBE` in, read off its
/// error for that key; None when it takes any key there (`[route.aliases]`, `env`).
fn schema(dir: &Path, probe: &str) -> Option<BTreeSet<String>> {
    let file = dir.join("probe.toml");
    std::fs::write(&file, probe).unwrap();
    let out = Command::new(HEARTH)
        .arg("check-config")
        .arg("--no-binaries")
        .arg(&file)
        .output()
        .expect("run hearth check-config");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let unknown = format!("unknown field `{PROBE}`");
    let at = err.find(&unknown)?;
    let rest = &err[at + unknown.len()..];
    let rest = rest.lines().next().unwrap_or("");
    if rest.contains("there are no fields") {
        return Some(BTreeSet::new());
    }
    let listed = rest
        .split_once("expected")
        .map_or("", |(_, l)| l)
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect::<BTreeSet<_>>();
    assert!(!listed.is_empty(), "no key list in: {err}");
    Some(listed)
}

#[test]
fn the_configuration_page_documents_exactly_the_keys_check_config_accepts() {
    let doc = Documented::read(&read("docs/configuration.md"));
    assert!(
        doc.keys.len() >= 10 && doc.keys.values().map(BTreeSet::len).sum::<usize>() > 60,
        "docs/configuration.md: too few tables or keys found: {:?}",
        doc.keys
    );
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    let mut free = Vec::new();
    for (table, documented) in &doc.keys {
        let shown = if table.is_empty() {
            "the top level".to_string()
        } else {
            format!("[{table}]")
        };
        let Some(accepted) = schema(dir.path(), &doc.probe(table)) else {
            // A table of names (aliases): no key of its own to check.
            assert!(
                documented.is_empty(),
                "docs/configuration.md documents keys of {shown}, which takes any name: {documented:?}"
            );
            free.push(shown);
            continue;
        };
        for key in documented.difference(&accepted) {
            wrong.push(format!(
                "{shown} `{key}`: documented, but check-config does not know it (it knows {accepted:?})"
            ));
        }
        for key in accepted.difference(documented) {
            wrong.push(format!(
                "{shown} `{key}`: check-config accepts it, but docs/configuration.md does not document it"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md and the configuration's schema differ:\n{}",
        wrong.join("\n")
    );
    assert!(free.len() <= 2, "too many tables take any key: {free:?}");
}

#[test]
fn the_checks_themselves_tell_a_misnamed_key_and_a_missing_path() {
    // The test of the test: a key the schema lacks is refused, and the docs' tokens and links
    // are told apart from what they are not.
    let dir = tempfile::tempdir().unwrap();
    let keys = schema(dir.path(), "[daemon]\nzz_not_a_key = 0\n").expect("a daemon key list");
    assert!(
        keys.contains("socket") && !keys.contains("sockett"),
        "{keys:?}"
    );
    let repo = Repo::read();
    assert_eq!(repo.names_existing("src/main.rs"), Some(true));
    assert_eq!(repo.names_existing("src/mian.rs"), Some(false));
    assert_eq!(repo.names_existing("docs/decisions/"), Some(true));
    assert_eq!(repo.names_existing("agent/supervisor.rs"), Some(true));
    assert_eq!(repo.names_existing("agent/supervisr.rs"), Some(false));
    assert_eq!(repo.names_existing("route_*.rs"), Some(true));
    assert_eq!(repo.names_existing("nowhere_*.rs"), Some(false));
    assert_eq!(repo.names_existing("state_dir/overrides.json"), None);
    assert_eq!(repo.names_existing("1.5s"), None);
    assert_eq!(repo.names_existing("scripts/test.sh --all"), Some(true));
    assert_eq!(repo.names_existing("scripts/tset.sh --all"), Some(false));
    assert_eq!(repo.names_existing("hearth status --json"), None);
    assert_eq!(repo.names_existing("hearth.service"), Some(true));
    assert_eq!(
        slug("The front door and the daemon's signal"),
        "the-front-door-and-the-daemons-signal"
    );
    assert_eq!(slug("`[model.scaling]`"), "modelscaling");
}
