//! The configuration as the shell reads it: the file (a reload's empty or truncated file, the
//! shipped files), and programs looked up on this host as the daemon does ([`Checks::Host`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;

const FILE: &str = "/etc/hearth/hearth.toml";

/// A minimal valid model block.
fn model(name: &str) -> String {
    format!(
        "[[model]]\nname = \"{name}\"\ncommand = [\"srv\", \"--port\", \"{{port}}\"]\n\
         warmup.url = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
    )
}

/// A model whose command is `command` (a TOML array body) and whose other keys are `extra`.
fn with_command(command: &str, extra: &str) -> String {
    format!(
        "[[model]]\nname = \"m\"\ncommand = [{command}]\n{extra}\
         [model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n"
    )
}

/// `text` checked to depth `checks`, with the daemon's own lookup of programs.
fn parse_at(checks: Checks, text: &str) -> Result<Config, ConfigError> {
    Config::parse_on(text, Path::new(FILE), checks, &DaemonLookup)
}

/// Check `text` to depth `checks`, expecting an error at `line` for `key`; returns the message.
#[track_caller]
fn fails_at(checks: Checks, text: &str, key: &str, line: usize) -> String {
    let err = match parse_at(checks, text) {
        Ok(_) => panic!("expected an error for {key} in:\n{text}"),
        Err(e) => e,
    };
    assert_eq!(err.key, key, "wrong key in {err}\n---\n{text}");
    assert_eq!(err.line, Some(line), "wrong line in {err}\n---\n{text}");
    assert_eq!(err.file, Path::new(FILE));
    err.message
}

#[test]
fn load_refuses_an_empty_or_truncated_file_as_a_reload_reads_it() {
    // The daemon's reload reads the file with config::load; its error keeps the running models.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hearth.toml");
    let full = format!("[daemon]\nports = \"20000-20099\"\n{}", model("a"));
    let cut = &full[..full.find("[[model]]").unwrap()];
    for text in ["", cut] {
        std::fs::write(&file, text).unwrap();
        let err = load_with(&file, Checks::Deployment).unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.file.as_path()),
            ("model", file.as_path())
        );
    }
    std::fs::write(&file, format!("model = []\n{cut}")).unwrap();
    let c = load_with(&file, Checks::Deployment).unwrap();
    assert!(c.models.is_empty());
}

// ---- programs exist on this host --------------------------------------------------------------

/// A temporary directory with an executable `name` in it (and a non-executable `plain`).
fn bin_dir(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join(name);
    std::fs::write(&exe, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "not a program\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    dir
}

fn program_model(program: &str, extra: &str) -> String {
    with_command(&format!("{program:?}, \"--port\", \"{{port}}\""), extra)
}

#[test]
fn a_missing_program_is_refused_naming_key_and_binary() {
    let name = format!("hearth-test-no-such-server-{}", std::process::id());
    let text = program_model(&name, "");
    assert!(parse_at(Checks::Deployment, &text).is_ok(), "not looked up");
    let m = fails_at(Checks::Host, &text, "model[0].command[0]", 3);
    assert!(m.contains(&name) && m.contains("PATH"), "{m}");
    assert!(
        m.contains("--no-binaries"),
        "says how to check elsewhere: {m}"
    );

    let dir = bin_dir("srv");
    let path = |f: &str| dir.path().join(f).display().to_string();
    parse_at(Checks::Host, &program_model(&path("srv"), "")).unwrap();
    for (file, why) in [
        ("missing", "does not exist"),
        ("plain", "is not executable"),
        ("", "is a directory"),
    ] {
        let text = program_model(&path(file), "");
        let m = fails_at(Checks::Host, &text, "model[0].command[0]", 3);
        assert!(m.contains(&path(file)) && m.contains(why), "{m}");
    }
    // A relative path starts from the current directory, and the message says so.
    let m = fails_at(
        Checks::Host,
        &program_model("./bin/no-such-server", ""),
        "model[0].command[0]",
        3,
    );
    assert!(m.contains("current directory"), "{m}");
}

#[test]
fn a_bare_program_is_looked_up_on_the_models_own_path() {
    let dir = bin_dir("hearth-test-srv");
    let on_path = format!(
        "env = {{ PATH = {:?} }}\n",
        dir.path().display().to_string()
    );
    let text = program_model("hearth-test-srv", &on_path);
    parse_at(Checks::Host, &text).unwrap();
    let m = fails_at(
        Checks::Host,
        &program_model("hearth-test-srv", ""),
        "model[0].command[0]",
        3,
    );
    assert!(m.contains("hearth-test-srv"), "{m}");
    // Found on the model's PATH but not executable: said so.
    let text = program_model("plain", &on_path);
    let m = fails_at(Checks::Host, &text, "model[0].command[0]", 3);
    assert!(
        m.contains("env.PATH") && m.contains("not executable"),
        "{m}"
    );
    // `sh` is on any PATH this test runs with.
    parse_at(Checks::Host, &program_model("sh", "")).unwrap();
}

#[test]
fn a_program_named_by_placeholders_is_looked_up_when_it_can_be() {
    let dir = bin_dir("m");
    let base: PathBuf = dir.path().to_path_buf();
    // {model} is known now: checked as it will be run.
    let text = program_model(&format!("{}/{{model}}", base.display()), "");
    parse_at(Checks::Host, &text).unwrap();
    let text = program_model(&format!("{}/{{model}}-x", base.display()), "");
    let m = fails_at(Checks::Host, &text, "model[0].command[0]", 3);
    assert!(m.contains(&format!("{}/m-x", base.display())), "{m}");
    // {replica} is not: nothing to look up before a replica exists.
    let text = program_model("/opt/{replica}/server", "");
    parse_at(Checks::Host, &text).unwrap();
}

#[test]
fn load_looks_up_programs_as_the_daemon_does() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hearth.toml");
    std::fs::write(&file, program_model("hearth-test-no-such-server", "")).unwrap();
    let err = load(&file).unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.line),
        ("model[0].command[0]", Some(3))
    );
    load_with(&file, Checks::Deployment).unwrap();
}

// ---- the shipped files --------------------------------------------------------------------------

fn shipped() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("config.toml.example")];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root.join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    examples.sort();
    files.extend(examples);
    files
}

#[test]
fn every_shipped_configuration_passes_the_deployment_checks() {
    let files = shipped();
    assert!(files.len() >= 5, "{files:?}");
    for f in files {
        load_with(&f, Checks::Deployment).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn the_example_says_to_run_the_readmes_first_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("config.toml.example")).unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for command in [
        "cargo build --release && export PATH=\"$PWD/target/release:$PATH\"",
        "hearth daemon --config config.toml.example & hearth route --config config.toml.example",
        "curl -s localhost:8080/v1/completions",
    ] {
        assert!(example.contains(command), "config.toml.example: {command}");
        assert!(readme.contains(command), "README.md: {command}");
    }
    assert!(
        !example.contains("cargo run"),
        "cargo run puts no `hearth` on PATH"
    );
}

#[test]
fn load_reads_files_and_reports_unreadable_ones() {
    let dir = std::env::temp_dir().join(format!("hearth-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("hearth.toml");
    std::fs::write(&file, include_str!("../../config.toml.example")).unwrap();
    let c = load_with(&file, Checks::Deployment).unwrap();
    assert_eq!(c.path, file);
    assert_eq!(c.models[0].name, "toy");

    let missing = dir.join("missing.toml");
    let err = load(&missing).unwrap_err();
    assert_eq!(err.file, missing);
    assert_eq!(err.line, None);
    assert_eq!(err.key, "-");
    assert!(err
        .to_string()
        .starts_with(&format!("{}: -: ", missing.display())));
    std::fs::remove_dir_all(&dir).unwrap();
}
