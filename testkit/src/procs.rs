//! Processes as /proc shows them, signals, and the [`Reaper`]: the harness's one cleanup.

use std::fs;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgrp, Pid};

/// What /proc/PID/stat says about a process.
#[derive(Debug, Clone)]
pub struct Stat {
    /// R, S, D, Z, X…
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    /// User and system CPU time so far, in clock ticks.
    pub utime: u64,
    pub stime: u64,
    /// When it started, in clock ticks since boot (field 22).
    pub start_ticks: u64,
}

pub fn stat(pid: i32) -> Option<Stat> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields start after the last ')'.
    let f: Vec<&str> = s.get(s.rfind(')')? + 2..)?.split_whitespace().collect();
    let int = |i: usize| f.get(i)?.parse::<i32>().ok();
    let ticks = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: int(1)?,
        pgrp: int(2)?,
        utime: ticks(11)?,
        stime: ticks(12)?,
        start_ticks: ticks(19)?,
    })
}

/// The process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live members of process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| stat(p).is_some_and(|s| s.pgrp == pgid && s.state != 'Z' && s.state != 'X'))
        .collect()
}

/// A process's environment, as NAME=value strings.
pub fn environ(pid: i32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|e| !e.is_empty())
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .collect(),
    )
}

/// One variable of a process's environment.
pub fn env_var(pid: i32, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    environ(pid)?
        .into_iter()
        .find_map(|e| e.strip_prefix(&prefix).map(str::to_string))
}

/// Live processes (this one aside) whose environment holds exactly `entry` ("NAME=value").
pub fn procs_with_env(entry: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    all_pids()
        .into_iter()
        .filter(|&p| p != me && alive(p))
        .filter(|&p| environ(p).is_some_and(|env| env.iter().any(|e| e == entry)))
        .collect()
}

/// Sends `sig` to `pid`; a process already gone is no error here.
pub fn signal(pid: i32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid), sig);
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The name of the mark every process of one daemon carries in its environment.
pub const MARK: &str = "HEARTH_TESTKIT_MARK";

/// Kills, on drop, every process whose environment carries its mark (`HEARTH_TESTKIT_MARK=…`),
/// and fails the test if one survives. See the crate's documentation for where the mark is set.
pub struct Reaper {
    value: String,
    entry: String,
    /// The daemon's replica cgroups (hearth's cgroup2 subtree), if the host has them.
    cgroups: Option<std::path::PathBuf>,
}

impl Reaper {
    /// `value` must be unique on this machine while the reaper lives (a temporary directory's
    /// path is).
    pub fn new(value: &str) -> Reaper {
        Reaper {
            value: value.to_string(),
            entry: format!("{MARK}={value}"),
            cgroups: None,
        }
    }

    /// Also sweeps the replica cgroups of the daemon whose state_dir is `state_dir`.
    pub fn with_cgroups_of(mut self, state_dir: &std::path::Path) -> Reaper {
        self.cgroups = crate::cgroups::subtree(state_dir);
        self
    }

    /// The variable to set in a process's environment: (name, value).
    pub fn env(&self) -> (&'static str, &str) {
        (MARK, &self.value)
    }

    /// Live processes carrying the mark.
    pub fn marked(&self) -> Vec<i32> {
        procs_with_env(&self.entry)
    }

    /// SIGKILLs every marked process, and its process group, until none is left or 10 s pass;
    /// then every process in the daemon's replica cgroups, which it removes. Returns what
    /// survived.
    pub fn kill_all(&self) -> Vec<i32> {
        let left = self.kill_marked();
        if let Some(dir) = &self.cgroups {
            crate::cgroups::kill_and_remove(dir);
        }
        left
    }

    fn kill_marked(&self) -> Vec<i32> {
        let ours = getpgrp();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.marked();
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            for p in left {
                // Its group too: whatever it started and that dropped the mark. Never ours.
                if let Some(g) = stat(p).map(|s| Pid::from_raw(s.pgrp)) {
                    if g != ours && g.as_raw() > 1 {
                        let _ = killpg(g, Signal::SIGKILL);
                    }
                }
                signal(p, Signal::SIGKILL);
            }
            std::thread::sleep(crate::POLL);
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let left = self.kill_all();
        if left.is_empty() {
            return;
        }
        let msg = format!(
            "hearth testkit: processes {left:?} ({}) survive SIGKILL",
            self.entry
        );
        if std::thread::panicking() {
            eprintln!("{msg}");
        } else {
            panic!("{msg}");
        }
    }
}

/// The real uid of a process (/proc/PID/status).
pub fn uid(pid: i32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A process's cgroup v2 path (the `0::` line of /proc/PID/cgroup).
pub fn cgroup(pid: i32) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// A process's command line, its arguments joined by spaces (/proc/PID/cmdline).
pub fn cmdline(pid: i32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(args.join(" "))
}
