//! Small files with one job: no source file of the product is over 600 lines, tests apart
//! (issue 25's bar). A file that grows past it is two files.

use std::path::{Path, PathBuf};

const MOST_LINES: usize = 600;

/// A unit-test file or directory, as tests/README.md names them: `tests`, `tests.rs` or a
/// `*_tests` one (`src/toy_server/test_server.rs` is the product's toy server, not a test).
fn is_tests(name: &str) -> bool {
    let stem = name.strip_suffix(".rs").unwrap_or(name);
    stem == "tests" || stem.ends_with("_tests")
}

/// Source files under `dir`, tests left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if is_tests(&name) {
            continue;
        }
        if path.is_dir() {
            sources(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn over(roots: &[PathBuf]) -> Vec<String> {
    let mut files = Vec::new();
    for r in roots {
        sources(r, &mut files);
    }
    assert!(files.len() > 10, "found only {files:?}");
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            (lines > MOST_LINES).then(|| format!("{}: {lines} lines", f.display()))
        })
        .collect();
    long.sort();
    long
}

#[test]
fn no_source_file_is_over_600_lines() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let roots: Vec<PathBuf> = ["src", "crates/hearth-core/src", "testkit/src"]
        .iter()
        .map(|d| repo.join(d))
        .collect();
    let long = over(&roots);
    assert!(long.is_empty(), "over {MOST_LINES} lines: {long:#?}");
}

/// The test of the test: a file of 601 lines is found, one of 600 is not, nor a long test file
/// or one in a tests directory; a name that merely holds "test" is checked.
#[test]
fn the_size_check_finds_a_long_file() {
    let dir = tempfile::tempdir().unwrap();
    let write =
        |name: &str, n: usize| std::fs::write(dir.path().join(name), "x\n".repeat(n)).unwrap();
    for i in 0..11 {
        write(&format!("short{i}.rs"), 10);
    }
    write("exact.rs", MOST_LINES);
    write("long.rs", MOST_LINES + 1);
    write("long_tests.rs", 2 * MOST_LINES);
    write("latest.rs", MOST_LINES + 2);
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    write("tests/long.rs", 2 * MOST_LINES);
    let long = over(&[dir.path().to_path_buf()]);
    assert_eq!(long.len(), 2, "{long:?}");
    assert!(long[0].ends_with("latest.rs: 602 lines"), "{long:?}");
    assert!(long[1].ends_with("/long.rs: 601 lines"), "{long:?}");
}
