//! Before a hand-over: the binary at the path must answer `--version` like hearth, within a
//! bound (issue 24, item 2). A file that is not a program, a script that fails, a program that
//! hangs or prints something else is refused there, with the old daemon still running, rather
//! than found out by an exec that fails or a daemon that never answers.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// How long the new binary gets to answer `--version`.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of its output read.
const MAX_OUTPUT: u64 = 4096;
/// The longest version believed.
const MAX_VERSION: usize = 64;

/// Why the binary at the path is not taken.
#[derive(Debug, thiserror::Error)]
pub enum NotHearth {
    #[error("{path} --version could not be run: {error}")]
    Run { path: String, error: std::io::Error },
    #[error("{path} --version did not answer within {} s", VERSION_TIMEOUT.as_secs())]
    Timeout { path: String },
    #[error("{path} --version exited with {status}{said}")]
    Failed {
        path: String,
        status: std::process::ExitStatus,
        said: String,
    },
    #[error("{path} --version did not answer like hearth (\"hearth VERSION\"){said}")]
    Unlike { path: String, said: String },
}

/// `: it printed "…"` for what came out, if anything.
fn said(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    let first = text.lines().next().unwrap_or("").trim();
    if first.is_empty() {
        return String::new();
    }
    let cut: String = first.chars().take(80).collect();
    format!(": it printed {cut:?}")
}

/// The version in `hearth VERSION`, if that is what `out` says.
pub fn version_of(out: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(out).ok()?;
    let line = text.lines().next()?.trim();
    let version = line.strip_prefix("hearth ")?;
    let plausible = !version.is_empty()
        && version.len() <= MAX_VERSION
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
    plausible.then(|| version.to_string())
}

/// Runs `exe --version` (no stdin, nothing of the daemon's environment but PATH, in a process
/// group of its own that is killed if it does not answer in time) and returns the version it
/// says.
pub async fn check(exe: &Path) -> Result<String, NotHearth> {
    let path = exe.display().to_string();
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("--version")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|error| NotHearth::Run {
        path: path.clone(),
        error,
    })?;
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let answer = async {
        let mut out = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(MAX_OUTPUT).read_to_end(&mut out).await;
        }
        let status = child.wait().await;
        (out, status)
    };
    let (out, status) = match tokio::time::timeout(VERSION_TIMEOUT, answer).await {
        Ok(done) => done,
        Err(_) => {
            // Its children too: a script's `sleep` holds nothing of ours, but should not stay.
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(NotHearth::Timeout { path });
        }
    };
    let status = status.map_err(|error| NotHearth::Run {
        path: path.clone(),
        error,
    })?;
    if !status.success() {
        return Err(NotHearth::Failed {
            path,
            status,
            said: said(&out),
        });
    }
    version_of(&out).ok_or_else(|| NotHearth::Unlike {
        path,
        said: said(&out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        let p = dir.join("hearth");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn only_hearth_and_a_sane_version_pass() {
        assert_eq!(version_of(b"hearth 0.1.0\n").as_deref(), Some("0.1.0"));
        assert_eq!(
            version_of(b"hearth 1.2.3-rc.1+g1234\n").as_deref(),
            Some("1.2.3-rc.1+g1234")
        );
        for bad in [
            &b"hearth\n"[..],
            b"heart 0.1",
            b"hearth 0.1 extra",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(version_of(bad), None, "{bad:?}");
        }
        let long = format!("hearth {}", "1".repeat(MAX_VERSION + 1));
        assert_eq!(version_of(long.as_bytes()), None);
    }

    #[tokio::test]
    async fn a_script_that_fails_or_prints_something_else_is_refused_by_what_it_did() {
        let dir = tempfile::tempdir().unwrap();
        let e = check(&script(dir.path(), "echo nope; exit 1"))
            .await
            .unwrap_err();
        assert!(matches!(e, NotHearth::Failed { .. }), "{e}");
        assert!(e.to_string().contains("\"nope\""), "{e}");
        let e = check(&script(dir.path(), "echo something else"))
            .await
            .unwrap_err();
        assert!(matches!(e, NotHearth::Unlike { .. }), "{e}");
        let ok = check(&script(dir.path(), "echo hearth 9.9.9"))
            .await
            .unwrap();
        assert_eq!(ok, "9.9.9");
        let e = check(&dir.path().join("missing")).await.unwrap_err();
        assert!(matches!(e, NotHearth::Run { .. }), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_binary_that_hangs_is_given_up_on() {
        let dir = tempfile::tempdir().unwrap();
        let e = check(&script(dir.path(), "exec sleep 600"))
            .await
            .unwrap_err();
        assert!(matches!(e, NotHearth::Timeout { .. }), "{e}");
    }
}
