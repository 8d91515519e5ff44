//! What a root daemon meets on a fresh machine, without changing this one: [`FreshAccounts`], a
//! private copy of /etc with no `hearth` account, bind-mounted over /etc in a mount namespace of
//! the daemon's own, so the account the daemon makes is made in the copy and the host's own
//! accounts are left alone; and [`Checkout`], a fresh clone as the README's quick start sees
//! it: `config.toml.example` at its top and the binary at `target/release/hearth`, run from
//! there with that directory on PATH.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::ports::{ports, PortBlock};
use crate::procs::Reaper;
use crate::{hearth, run, temp_dir, CliOutput};

/// The accounts systemd/hearth.sysusers declares, which a fresh machine does not have.
const HEARTH_ACCOUNTS: [&str; 3] = ["hearth", "hearth-report", "hearth-admin"];

/// A copy of /etc without hearth's accounts, for a daemon run under [`FreshAccounts::wrapper`].
pub struct FreshAccounts {
    dir: tempfile::TempDir,
}

impl FreshAccounts {
    /// None when this machine cannot give a process a private /etc (not root, no `unshare`).
    pub fn new() -> Option<FreshAccounts> {
        if !crate::procs::is_root() || !Path::new("/usr/bin/unshare").exists() {
            return None;
        }
        let dir = temp_dir();
        let copied = Command::new("cp")
            .args(["-a", "/etc"])
            .arg(dir.path())
            .status()
            .expect("cp");
        assert!(copied.success(), "copying /etc");
        let etc = dir.path().join("etc");
        for file in ["passwd", "group", "shadow", "gshadow"] {
            let path = etc.join(file);
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            let kept: String = text
                .lines()
                .filter(|l| {
                    let name = l.split(':').next().unwrap_or("");
                    !HEARTH_ACCOUNTS.contains(&name)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            fs::write(&path, kept).expect("rewrite the copy");
        }
        Some(FreshAccounts { dir })
    }

    /// As `new`, for a test that cannot show anything without it: where this machine cannot give
    /// a private /etc, the test fails saying so (`crate::needs`), unless `HEARTH_ALLOW_SKIP=1`.
    pub fn needed() -> Option<FreshAccounts> {
        let fresh = FreshAccounts::new();
        crate::needs(fresh.is_some(), || {
            "root and /usr/bin/unshare (a private /etc without hearth's accounts)".to_string()
        })
        .then_some(fresh)
        .flatten()
    }

    /// The private /etc, as the daemon sees it at /etc.
    pub fn etc(&self) -> PathBuf {
        self.dir.path().join("etc")
    }

    /// Runs a command in a mount namespace of its own with the copy at /etc
    /// (`DaemonBuilder::wrapper`, `Checkout::daemon`).
    pub fn wrapper(&self) -> Vec<String> {
        let script = format!(
            "mount --bind '{}' /etc && exec \"$@\"",
            self.etc().display()
        );
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ]
        .map(String::from)
        .to_vec()
    }

    /// The uid and gid of `name` in the copy.
    pub fn account(&self, name: &str) -> Option<(u32, u32)> {
        let text = fs::read_to_string(self.etc().join("passwd")).ok()?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name))
                .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
        })
    }
}

/// A fresh clone, searchable by every account (0755) as a clone under /srv or a home of 0755
/// is: `config.toml.example` with only its ports and its front door's port moved to ports of
/// this test's own, and the binary at `target/release/hearth`.
pub struct Checkout {
    // Dropped first: the sweep of every process started from here.
    reaper: Reaper,
    _ports: PortBlock,
    dir: tempfile::TempDir,
}

impl Default for Checkout {
    fn default() -> Self {
        Self::new()
    }
}

impl Checkout {
    pub fn new() -> Checkout {
        let dir = temp_dir();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the repository");
        let block = ports(8);
        let example = fs::read_to_string(repo.join("config.toml.example")).expect("the example");
        let moved: String = example
            .lines()
            .map(|l| {
                if l.starts_with("ports = ") {
                    format!("ports = \"{}-{}\"", block.first, block.last - 1)
                } else if l.starts_with("listen = ") {
                    format!("listen = \"127.0.0.1:{}\"", block.last)
                } else {
                    l.to_string()
                }
            })
            .map(|l| l + "\n")
            .collect();
        fs::write(dir.path().join("config.toml.example"), moved).expect("write the example");
        let bin = dir.path().join("target/release");
        fs::create_dir_all(&bin).expect("target/release");
        for d in [dir.path().join("target"), bin.clone()] {
            fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let copy = bin.join("hearth");
        if fs::hard_link(hearth(), &copy).is_err() {
            fs::copy(hearth(), &copy).expect("copy the binary");
        }
        let state = dir.path().join("target/hearth-example/state");
        let reaper = Reaper::new(&dir.path().display().to_string()).with_cgroups_of(&state);
        Checkout {
            reaper,
            _ports: block,
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the example's daemon listens (`target/hearth-example/hearth.sock`).
    pub fn socket(&self) -> PathBuf {
        self.path().join("target/hearth-example/hearth.sock")
    }

    /// A command run from the checkout with its `target/release` first on PATH, as the
    /// README's `export PATH="$PWD/target/release:$PATH"` puts it, under `wrapper`, carrying the
    /// mark that cleanup finds.
    pub fn command(&self, wrapper: &[String], args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.path().join("target/release").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut argv: Vec<String> = wrapper.to_vec();
        argv.push("hearth".into());
        argv.extend(args.iter().map(|s| s.to_string()));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(self.path())
            .env("PATH", path)
            .env_remove("HEARTH_SOCKET")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("RUST_LOG");
        let (k, v) = self.reaper.env();
        cmd.env(k, v);
        cmd
    }

    /// `hearth daemon --config config.toml.example`, its output in `daemon.log` beside the
    /// checkout's files.
    pub fn daemon(&self, wrapper: &[String], env: &[(&str, &str)]) -> Child {
        let log = fs::File::create(self.path().join("daemon.log")).expect("the log");
        let mut cmd = self.command(wrapper, &["daemon", "--config", "config.toml.example"]);
        cmd.envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log);
        cmd.spawn().expect("start the daemon")
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.path().join("daemon.log")).unwrap_or_default()
    }

    /// A client verb as the README runs it: `HEARTH_SOCKET=target/hearth-example/hearth.sock
    /// hearth ARGS`, from the checkout.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        let mut cmd = self.command(&[], args);
        cmd.env("HEARTH_SOCKET", "target/hearth-example/hearth.sock");
        run(&mut cmd, std::time::Duration::from_secs(60))
    }
}
