//! The unit's sandbox against a real model server: llama.cpp's server (the tests' launcher,
//! `testkit::real_model_dir`, a Python virtual environment) run by hearth.service as shipped.
//!
//! ProtectHome=yes makes /home, /root and /run/user inaccessible to the daemon and its
//! replicas. A server whose files (the launcher, the virtual environment, the Python it was
//! made from: pyenv puts one under /root) live there cannot start. Where that is so here, the
//! test shows the failure under the shipped unit, with the reason in the replica's journal
//! stream, and then the widening docs/operations.md gives (`ProtectHome=tmpfs` with
//! `BindReadOnlyPaths=` of exactly those directories) making the server warm and answer.
//! Where nothing is under a home directory, the shipped unit must run it unchanged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use testkit::{wait_until, Model, Value};

use crate::host::{toy, Host};

/// Where llama.cpp's server and what it needs live on this machine.
pub struct RealModel {
    /// Directories the server reads: the launcher's, the server script's, the Python prefix
    /// the virtual environment was made from (none when it is under /usr, which the container
    /// has anyway).
    pub dirs: Vec<PathBuf>,
    /// Those of them the shipped sandbox hides (under /home, /root or /run/user, or under /tmp
    /// and /var/tmp, which PrivateTmp= replaces).
    pub hidden: Vec<PathBuf>,
}

fn under_a_home(p: &Path) -> bool {
    ["/home", "/root", "/run/user"]
        .iter()
        .any(|h| p.starts_with(h))
}

/// PrivateTmp=yes gives the unit a /tmp and /var/tmp of its own: a server kept under the host's
/// (a checkout cloned into /tmp, as CI's may be) is not there at all.
fn under_a_tmp(p: &Path) -> bool {
    ["/tmp", "/var/tmp"].iter().any(|t| p.starts_with(t))
}

impl RealModel {
    pub fn find() -> RealModel {
        let dir = testkit::real_model_dir();
        let launcher = std::fs::read_to_string(dir.join("llama-server")).expect("the launcher");
        // `exec "PYTHON" "SCRIPT" "$@"`: the absolute paths it names.
        let named: Vec<PathBuf> = launcher
            .split('"')
            .filter(|s| s.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        let mut dirs = vec![dir.clone()];
        for p in &named {
            if let Some(parent) = p.parent() {
                dirs.push(parent.to_path_buf());
            }
        }
        let cfg = std::fs::read_to_string(dir.join("venv/pyvenv.cfg")).unwrap_or_default();
        if let Some(home) = cfg
            .lines()
            .find_map(|l| l.strip_prefix("home = "))
            .map(|h| PathBuf::from(h.trim()))
        {
            if let Some(prefix) = home.parent() {
                if !prefix.starts_with("/usr") {
                    dirs.push(prefix.to_path_buf());
                }
            }
        }
        // A directory inside another one on the list comes with it.
        dirs.sort();
        dirs.dedup();
        let all = dirs.clone();
        dirs.retain(|d| !all.iter().any(|o| o != d && d.starts_with(o)));
        let hidden = dirs
            .iter()
            .filter(|d| under_a_home(d) || under_a_tmp(d))
            .cloned()
            .collect();
        RealModel { dirs, hidden }
    }

    pub fn binds(&self) -> Vec<&Path> {
        self.dirs.iter().map(PathBuf::as_path).collect()
    }

    fn model() -> Model {
        Model::llama("llama", &["--host", "127.0.0.1"]).default_account()
    }

    /// The drop-in lines that let the server's files through (empty when none is hidden).
    pub fn widening(&self) -> String {
        if self.hidden.is_empty() {
            return String::new();
        }
        let paths: Vec<String> = self
            .hidden
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        // The bind is made inside the unit's own /tmp too; ProtectHome=tmpfs only where a home
        // directory hides one.
        let homes = if self.hidden.iter().any(|d| under_a_home(d)) {
            "ProtectHome=tmpfs\n"
        } else {
            ""
        };
        format!("[Service]\n{homes}BindReadOnlyPaths={}\n", paths.join(" "))
    }

    /// Under the shipped unit, where a directory it needs is hidden: the model added by a
    /// reload never warms, and the journal says why (the daemon's refusal of a program it
    /// cannot find, "does not exist", when the launcher itself is hidden; or the replica's own
    /// "not found" / "Permission denied" when only its Python is). The model is taken out again.
    pub fn hidden_by_the_shipped_sandbox(&self, h: &Host) {
        if self.hidden.is_empty() {
            eprintln!("the real model's files are outside /home, /root and /tmp: nothing hidden");
            return;
        }
        let cursor = h.cursor();
        let before = h.status();
        let counts = |st: &Value| {
            let m = testkit::status::model(st, "toy");
            (
                m["routed"].as_u64().unwrap_or(0),
                m["warm"].as_u64().unwrap_or(0),
            )
        };
        let (routed, warm) = counts(&before);
        let kept = h.config(&[toy(2, 4, 2)]);
        h.write_config(&h.config(&[toy(2, 4, 2), Self::model()]));
        h.sh_ok("systemctl reload hearth");
        let says = |e: &Value| {
            e["MESSAGE"].as_str().is_some_and(|m| {
                [
                    "not found",
                    "does not exist",
                    "No such file",
                    "Permission denied",
                ]
                .iter()
                .any(|w| m.contains(w))
            })
        };
        let why = wait_until(
            "the reason the server cannot start, in the journal",
            Duration::from_secs(20),
            || {
                let replica = h.journal_since(&cursor, "SYSLOG_IDENTIFIER=llama-1");
                let daemon = h.daemon_log(&cursor);
                replica.into_iter().chain(daemon).find(says)
            },
        );
        eprintln!(
            "ProtectHome=yes hides {:?}: {}",
            self.hidden,
            why["MESSAGE"].as_str().unwrap_or_default()
        );
        let st = h.status();
        if let Some(m) = st["models"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["name"] == "llama"))
        {
            assert_eq!(m["routed"], 0, "{m}");
            assert_eq!(m["warm"], 0, "{m}");
        }
        h.write_config(&kept);
        h.sh_ok("systemctl reload hearth");
        h.wait_status_line("toy", routed, warm);
    }

    /// Writes the widening drop-in (if any) for the next start of hearth.
    pub fn widen(&self, h: &Host) {
        let lines = self.widening();
        if lines.is_empty() {
            return;
        }
        h.c.write(
            "/etc/systemd/system/hearth.service.d/20-real-model.conf",
            &lines,
        );
        h.sh_ok("systemctl daemon-reload");
    }

    /// The server, added by a reload, passes its warm-up (a real completion) in the sandbox
    /// (widened where needed) and answers one more.
    pub fn serves(&self, h: &Host, toy_routed: u64) {
        h.write_config(&h.config(&[toy(2, 4, 2), Self::model()]));
        h.sh_ok("systemctl reload hearth");
        let line = format!(
            "2 models: {} routed, 0 warm, 0 starting; GPUs: none",
            toy_routed + 1
        );
        let st = h.wait_status_text(&[("toy", toy_routed, 0), ("llama", 1, 0)], &line);
        let llama = testkit::status::replicas(&st, "llama");
        let addr = testkit::status::addr(&llama[0]);
        let (status, tokens, body) = testkit::llama_complete(&addr, 4).expect("a completion");
        assert_eq!(status, 200, "{body}");
        assert!(tokens > 0, "{body}");
        eprintln!(
            "llama.cpp's server in hearth.service's sandbox{}: routed, {tokens} tokens",
            if self.hidden.is_empty() {
                " as shipped".to_string()
            } else {
                format!(" widened for {:?}", self.hidden)
            }
        );
    }
}
