//! `hearth check-config` and the daemon's start refuse what cannot run, as the binary says it:
//! a missing program (unless `--no-binaries`), an empty file, a program or a socket the
//! replicas' account cannot reach (as root), a socket in a directory every user shares. Every
//! shipped file passes as CI checks it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");

/// Runs `cmd` to its end, killing it if it has not ended after `limit`.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hearth");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{cmd:?} still running after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// 1-based line of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    1 + text.lines().position(|l| l.starts_with(prefix)).unwrap()
}

/// A valid daemon configuration in `dir` for one toy-like model started by `program`.
fn config(dir: &Path, program: &str) -> String {
    format!(
        "[daemon]\nsocket = \"{}/hearth.sock\"\nstate_dir = \"{}/state\"\nports = \"31900-31909\"\n\
         [[model]]\nname = \"m\"\ncommand = [\"{program}\", \"toy-server\", \"--port\", \"{{port}}\"]\n\
         gpus = 0\n[model.warmup]\nurl = \"http://127.0.0.1:{{port}}/v1/completions\"\n\
         [model.scaling]\nmin = 1\nmax = 2\n",
        dir.display(),
        dir.display()
    )
}

#[test]
fn check_config_looks_up_programs_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hearth.toml");
    let contents = config(dir.path(), "hearth-test-no-such-server");
    std::fs::write(&file, &contents).unwrap();
    let line = 1 + contents
        .lines()
        .position(|l| l.starts_with("command ="))
        .unwrap();

    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("{}:{line}: model[0].command[0]: ", file.display()))
            && err.contains("hearth-test-no-such-server"),
        "FILE:LINE: KEY: MESSAGE naming the program: {err}"
    );

    let out = run(
        Command::new(HEARTH)
            .args(["check-config", "--no-binaries"])
            .arg(&file),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("ok") && said.contains("not looked up"),
        "says what it skipped: {said}"
    );

    // The real program by its path passes the full check (its directory searchable by the
    // account replicas run as, as the socket there must be).
    chmod(dir.path(), 0o755);
    std::fs::write(&file, config(dir.path(), HEARTH)).unwrap();
    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn every_shipped_configuration_passes_check_config_as_ci_runs_it() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // config.toml.example with the binary on PATH, as the README's first command puts it.
    let bin = Path::new(HEARTH).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run(
        Command::new(HEARTH)
            .arg("check-config")
            .arg(root.join("config.toml.example"))
            .env("PATH", path),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // examples/ name servers this machine need not have.
    let mut n = 0;
    for e in std::fs::read_dir(root.join("examples")).unwrap() {
        let f = e.unwrap().path();
        if f.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let out = run(
            Command::new(HEARTH)
                .args(["check-config", "--no-binaries"])
                .arg(&f),
            Duration::from_secs(30),
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            f.display(),
            text(&out.stderr)
        );
        n += 1;
    }
    assert!(n >= 4, "{n} examples");
}

#[test]
fn the_daemon_refuses_to_start_without_its_program_or_its_models() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hearth.toml");
    let socket = dir.path().join("hearth.sock");
    for (contents, key) in [
        (
            config(dir.path(), "hearth-test-no-such-server"),
            "model[0].command[0]",
        ),
        (String::new(), "model"),
    ] {
        std::fs::write(&file, &contents).unwrap();
        let out = run(
            Command::new(HEARTH)
                .args(["daemon", "--config"])
                .arg(&file)
                .env_remove("NOTIFY_SOCKET"),
            Duration::from_secs(30),
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{key}: {err}");
        assert!(
            err.contains(&format!("{}", file.display())) && err.contains(key),
            "names the file and {key}: {err}"
        );
        assert!(!socket.exists(), "{key}: nothing was started");
    }
    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    assert!(
        text(&out.stderr).contains("model = []"),
        "{}",
        text(&out.stderr)
    );
}

/// As root, a model without `user` runs as the unprivileged account hearth (made at start
/// where the host lacks it): `check-config` and the daemon refuse a program or a socket that
/// account cannot reach, naming the file, the line, the key and the directory in the way, and
/// the daemon starts nothing. Each check is shown to pass once the directory is searchable.
#[test]
fn a_program_or_socket_the_replicas_account_cannot_reach_is_refused_naming_the_directory() {
    if !is_root() {
        eprintln!("note: not root: replicas run as the daemon's own user");
        return;
    }
    let top = tempfile::tempdir().unwrap();
    chmod(top.path(), 0o755);
    let private = top.path().join("private");
    std::fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let program = private.join("server");
    std::fs::hard_link(HEARTH, &program)
        .or_else(|_| std::fs::copy(HEARTH, &program).map(drop))
        .unwrap();
    let file = top.path().join("hearth.toml");
    let daemon_refuses = |key: &str, dir: &Path| {
        let out = run(
            Command::new(HEARTH)
                .args(["daemon", "--config"])
                .arg(&file)
                .env_remove("NOTIFY_SOCKET"),
            Duration::from_secs(30),
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(key) && err.contains(&format!("{} is not searchable", dir.display())),
            "{err}"
        );
    };
    // The program, in a directory only root may enter; the socket beside the file.
    let contents = config(top.path(), &program.display().to_string());
    std::fs::write(&file, &contents).unwrap();
    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let at = format!(
        "{}:{}: model[0].command[0]: ",
        file.display(),
        line_of(&contents, "command =")
    );
    assert!(err.starts_with(&at), "FILE:LINE: KEY: {err}");
    assert!(
        err.contains(&format!(
            "{} is not searchable by hearth (mode 0700",
            private.display()
        )) && err.contains("user = \"root\""),
        "names the directory and the way out: {err}"
    );
    daemon_refuses("model[0].command[0]", &private);
    assert!(
        !top.path().join("hearth.sock").exists(),
        "nothing was bound"
    );
    assert!(!top.path().join("state").exists(), "nothing was made");

    // The program reachable, the socket in the private directory.
    let contents = config(&private, HEARTH).replacen(
        &format!("state_dir = \"{}/state\"", private.display()),
        &format!("state_dir = \"{}/state\"", top.path().display()),
        1,
    );
    std::fs::write(&file, &contents).unwrap();
    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let at = format!(
        "{}:{}: daemon.socket: ",
        file.display(),
        line_of(&contents, "socket =")
    );
    assert!(err.starts_with(&at), "FILE:LINE: KEY: {err}");
    assert!(
        err.contains("replicas of model \"m\" run as hearth")
            && err.contains(&format!(
                "{} is not searchable by hearth",
                private.display()
            )),
        "{err}"
    );
    daemon_refuses("daemon.socket", &private);
    assert!(!private.join("hearth.sock").exists(), "nothing was bound");

    // Searchable: both pass.
    chmod(&private, 0o755);
    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(&file, config(top.path(), &program.display().to_string())).unwrap();
    let out = run(
        Command::new(HEARTH).arg("check-config").arg(&file),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A socket in a directory every user may write in, sticky like /tmp, is refused, and the
/// advice is a directory of its own: never to take /tmp's write permission away.
#[test]
fn a_socket_under_tmp_is_refused_with_a_private_directory_suggested() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hearth.toml");
    let socket = format!("/tmp/hearth-test-{}.sock", std::process::id());
    let contents = config(dir.path(), HEARTH).replacen(
        &format!("socket = \"{}/hearth.sock\"", dir.path().display()),
        &format!("socket = \"{socket}\""),
        1,
    );
    assert!(contents.contains(&socket));
    // The directory check is the daemon's own: the replicas run as this test's user.
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .name;
    let contents = contents.replace("gpus = 0\n", &format!("gpus = 0\nuser = \"{user}\"\n"));
    std::fs::write(&file, contents).unwrap();
    let out = run(
        Command::new(HEARTH)
            .args(["daemon", "--config"])
            .arg(&file)
            .env_remove("NOTIFY_SOCKET"),
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("socket directory /tmp") && err.contains("a directory of its own"),
        "{err}"
    );
    assert!(
        !err.contains("chmod"),
        "advice that breaks the machine: {err}"
    );
    assert!(!Path::new(&socket).exists());
}
