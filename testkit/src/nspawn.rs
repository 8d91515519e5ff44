//! A throwaway container with systemd as PID 1, booted from this machine's own /usr: where the
//! tests run hearth's unit files under a real service manager (`tests/under_systemd/`).
//!
//! `SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn --register=no --keep-unit --volatile=yes
//! -D / -b` (Debian's `systemd-container`): the root is an empty tmpfs with the host's /usr
//! mounted read-only on it, so /etc starts empty (systemd creates its own accounts; the host's
//! /etc is bound read-only at [`HOST_ETC`] to copy more from) and nothing the container writes
//! outlives it. `systemd.firstboot=off` keeps the first-boot wizard from asking on the console.
//! The network is the host's (no `--private-network`): the test reaches replicas and the front
//! door on loopback ports it holds ([`crate::ports`]). Commands run inside through `nsenter -t
//! LEADER -a` with a clean environment; files are read and written through
//! `/proc/LEADER/root`.
//!
//! Cleanup, however the test ends: the container (nspawn and everything under it) lives in a
//! cgroup of its own, `MOUNT/hearth-nspawn-PID-N`. Dropping the [`Container`] kills that cgroup
//! (`cgroup.kill`) and removes it; a test process killed from outside, which runs no drop,
//! closes the pipe a dead man's switch (a `sh` outside that cgroup) waits on, and the switch
//! does the same. (nspawn's own death does not end the container: its PID 1 lives on.)

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::daemon::{run, CliOutput};
use crate::{cgroups, poll, procs};

/// Where the host's /etc is, read-only, inside the container.
pub const HOST_ETC: &str = "/run/host-etc";
/// How long the boot may take (a few seconds on a quiet 2-core machine).
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one command inside may take before the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// PATH inside: the container's own /usr (the host's).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A booted container; killed with everything in it when dropped.
pub struct Container {
    nspawn: Child,
    /// The container's PID 1, as the host sees it.
    leader: i32,
    cgroup: PathBuf,
    /// nspawn's output (the container's console).
    console: PathBuf,
    _dir: tempfile::TempDir,
    switch: Child,
    _switch_pipe: ChildStdin,
}

/// Why this machine cannot boot a container (None: it can): not root, no systemd-nspawn or
/// nsenter, or no cgroup v2 mount to give the container a cgroup of its own.
pub fn unavailable() -> Option<String> {
    if !procs::is_root() {
        return Some("needs root".into());
    }
    for (tool, arg) in [("systemd-nspawn", "--version"), ("nsenter", "--version")] {
        let found = Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!(
                "needs {tool} (apt-get install systemd-container util-linux)"
            ));
        }
    }
    if cgroups::mount().is_none() {
        return Some("needs a cgroup v2 mount".into());
    }
    None
}

impl Container {
    /// Boots one with `binds` (host path, path inside) mounted read-only, and waits until
    /// systemd says the boot is over (`is-system-running --wait`: running or degraded).
    pub fn boot(binds: &[(&Path, &Path)]) -> Container {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("hearth-{}-{n}", std::process::id());
        let cgroup = cgroups::mount()
            .expect("a cgroup v2 mount")
            .join(format!("hearth-nspawn-{}-{n}", std::process::id()));
        fs::create_dir(&cgroup)
            .unwrap_or_else(|e| panic!("create the cgroup {}: {e}", cgroup.display()));
        let dir = crate::temp_dir();
        let console = dir.path().join("console.log");
        let switch = dead_mans_switch(&cgroup);
        let (switch, switch_pipe) = switch;

        let mut cmd = Command::new("systemd-nspawn");
        cmd.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
            .args(["--register=no", "--keep-unit", "--volatile=yes", "-D", "/"])
            .arg(format!("--bind-ro=/etc:{HOST_ETC}"))
            .args(["--console=passive", "--quiet"])
            .arg(format!("--machine={name}"));
        for (host, inside) in binds {
            cmd.arg(format!("--bind-ro={}:{}", host.display(), inside.display()));
        }
        cmd.args(["-b", "systemd.firstboot=off"])
            .stdin(Stdio::null())
            .stdout(File::create(&console).expect("the console log"))
            .stderr(Stdio::from(
                File::options()
                    .append(true)
                    .open(&console)
                    .expect("the console log"),
            ));
        let procs_file = OpenOptions::new()
            .write(true)
            .open(cgroup.join("cgroup.procs"))
            .expect("the cgroup's procs file");
        let fd = procs_file.as_raw_fd();
        // SAFETY: between fork and exec only async-signal-safe calls: write(2) of a constant on
        // a descriptor opened before the fork, and prctl(2).
        unsafe {
            cmd.pre_exec(move || {
                // "0" moves the writer itself: nspawn, and so the whole container, in the
                // cgroup of its own before it starts.
                nix::unistd::write(std::os::fd::BorrowedFd::borrow_raw(fd), b"0")?;
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                Ok(())
            });
        }
        let nspawn = cmd.spawn().expect("start systemd-nspawn");
        drop(procs_file);
        let mut c = Container {
            leader: 0,
            nspawn,
            cgroup,
            console,
            _dir: dir,
            switch,
            _switch_pipe: switch_pipe,
        };
        let parent = c.nspawn.id() as i32;
        c.leader = poll(BOOT_TIMEOUT, || {
            let exited = c.nspawn.try_wait().ok().flatten();
            assert!(
                exited.is_none(),
                "systemd-nspawn exited ({exited:?}): {}",
                c.console()
            );
            cgroups::procs(&c.cgroup).into_iter().find(|&p| {
                procs::stat(p).is_some_and(|s| s.ppid == parent)
                    && fs::read_to_string(format!("/proc/{p}/comm"))
                        .is_ok_and(|c| c.trim() == "systemd")
            })
        })
        .unwrap_or_else(|| panic!("no PID 1 in the container: {}", c.console()));
        // The namespaces exist a moment before systemd answers on its bus.
        let booted = poll(BOOT_TIMEOUT, || {
            let out = c.sh("systemctl is-system-running --wait");
            let state = out.stdout.trim().to_string();
            matches!(state.as_str(), "running" | "degraded").then_some(state)
        });
        if booted.is_none() {
            let failed = c.sh("systemctl --failed --no-pager; systemctl list-jobs --no-pager");
            panic!(
                "the container did not finish booting: {}\n{}",
                failed.stdout,
                c.console()
            );
        }
        c
    }

    /// The container's PID 1 as the host sees it.
    pub fn leader(&self) -> i32 {
        self.leader
    }

    /// What nspawn printed (the container's console).
    pub fn console(&self) -> String {
        fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Runs `script` with `sh -c` inside, with a clean environment; panics after a minute.
    pub fn sh(&self, script: &str) -> CliOutput {
        self.sh_for(script, COMMAND_TIMEOUT)
    }

    /// [`Container::sh`] with a deadline of its own.
    pub fn sh_for(&self, script: &str, timeout: Duration) -> CliOutput {
        let mut cmd = Command::new("nsenter");
        cmd.env_clear()
            .env("PATH", PATH)
            .env("LANG", "C.UTF-8")
            .args(["-t", &self.leader.to_string(), "-a", "sh", "-c", script])
            .stdin(Stdio::null());
        run(&mut cmd, timeout)
    }

    /// [`Container::sh`], and panics with what it printed unless it exits 0; returns stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "`{script}` in the container: {}\nstdout: {}\nstderr: {}",
            out.status,
            out.stdout,
            out.stderr
        );
        out.stdout
    }

    /// A path inside, as the host reaches it.
    pub fn path(&self, inside: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.leader)).join(inside.trim_start_matches('/'))
    }

    /// Writes `text` to `inside` (created or replaced; the directory must exist).
    pub fn write(&self, inside: &str, text: &str) {
        fs::write(self.path(inside), text)
            .unwrap_or_else(|e| panic!("write {inside} in the container: {e}"));
    }

    /// Reads `inside`.
    pub fn read(&self, inside: &str) -> String {
        fs::read_to_string(self.path(inside))
            .unwrap_or_else(|e| panic!("read {inside} in the container: {e}"))
    }

    /// The host's pid for `pid` inside (NSpid's last field), if it is alive.
    pub fn host_pid(&self, pid: i32) -> Option<i32> {
        cgroups::procs(&self.cgroup).into_iter().find(|&p| {
            fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|l| l.split_whitespace().last()?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        cgroups::kill_and_remove(&self.cgroup);
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        let _ = self.switch.kill();
        let _ = self.switch.wait();
        if self.cgroup.exists() {
            eprintln!(
                "hearth testkit: the container's cgroup {} is left",
                self.cgroup.display()
            );
        }
    }
}

/// A `sh` outside the container's cgroup that kills and removes it once its stdin closes: when
/// the test process ends, however it ends.
fn dead_mans_switch(cgroup: &Path) -> (Child, ChildStdin) {
    let cg = cgroup.display().to_string();
    let script = "read _ignored; echo 1 > \"$1/cgroup.kill\"; \
                  for _ in $(seq 100); do \
                  [ -z \"$(find \"$1\" -name cgroup.procs -exec cat {} +)\" ] && break; sleep 0.1; done; \
                  find \"$1\" -depth -type d -exec rmdir {} +";
    let mut child = Command::new("sh")
        .args(["-c", script, "sh", &cg])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the container's dead man's switch");
    let pipe = child.stdin.take().expect("its stdin");
    (child, pipe)
}
