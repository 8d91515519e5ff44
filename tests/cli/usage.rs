//! The CLI's exit codes with the real binary and no daemon: usage errors and a missing daemon
//! exit 2, with a message that says what to do.

use std::process::Command;

const HEARTH: &str = env!("CARGO_BIN_EXE_hearth");

/// Exit code and stderr of `hearth ARGS` with `HEARTH_SOCKET` set to `socket`.
fn run(args: &[&str], socket: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(HEARTH)
        .args(args)
        .env("HEARTH_SOCKET", socket)
        .output()
        .expect("run hearth");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_and_a_missing_daemon_exit_2_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("hearth.sock");

    let (code, err) = run(&["status"], &missing);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("no daemon at {}", missing.display()))
            && err.contains("HEARTH_SOCKET"),
        "{err}"
    );

    let (code, err) = run(&["scale", "m"], &missing);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--min") && err.contains("--max") && err.contains("--warm"),
        "{err}"
    );

    let (code, err) = run(&["scale", "m", "--min", "-1"], &missing);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid value '-1' for '--min <N>'"), "{err}");

    let (code, err) = run(&["daemon", "--socket", "/tmp/x.sock"], &missing);
    assert_eq!(code, Some(2), "{err}");
}
