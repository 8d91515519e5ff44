//! cgroup v2: finding the mount, and one cgroup directory — its processes, its memory and CPU,
//! killing everything in it, removing it once empty. Used by the hearth-owned subtree (no
//! systemd) and, read-only, for systemd scopes.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::procfs;
use super::ContainmentError;
use crate::core::Usage;

/// Where cgroup v2 is mounted, from /proc/self/mountinfo (never assumed: /sys/fs/cgroup on a
/// pure cgroup2 host, /sys/fs/cgroup/unified on a hybrid one, absent on a v1-only one).
pub fn mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_in(&text)
}

/// mountinfo lines: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS… - FSTYPE SOURCE SUPEROPTS`.
/// Only a mount of the hierarchy's root counts (a bind mount of a subdirectory would put our
/// cgroups somewhere else than their names say).
pub fn mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        if *f.get(3)? != "/" {
            return None;
        }
        Some(PathBuf::from(unescape(f.get(4)?)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// One cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub dir: PathBuf,
}

impl Cgroup {
    pub fn new(dir: PathBuf) -> Cgroup {
        Cgroup { dir }
    }

    /// Pids in it (not in its children).
    pub fn procs(&self) -> Vec<u32> {
        read_pids(&self.dir.join("cgroup.procs"))
    }

    /// Pids in it and in every cgroup below it.
    pub fn procs_recursive(&self) -> Vec<u32> {
        let mut v = self.procs();
        for c in self.children() {
            v.extend(c.procs_recursive());
        }
        v
    }

    pub fn children(&self) -> Vec<Cgroup> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut v: Vec<Cgroup> = dir
            .filter_map(|e| {
                let e = e.ok()?;
                e.file_type().ok()?.is_dir().then(|| Cgroup::new(e.path()))
            })
            .collect();
        v.sort_by(|a, b| a.dir.cmp(&b.dir));
        v
    }

    /// Something in it or below it still runs (`cgroup.events`' `populated`).
    pub fn populated(&self) -> bool {
        match fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(t) => t.lines().any(|l| l.trim() == "populated 1"),
            // Gone, or unreadable: judge by the processes we can see.
            Err(_) => !self.procs_recursive().is_empty(),
        }
    }

    /// Moves `pid` into it.
    pub fn attach(&self, pid: u32) -> io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))?;
        f.write_all(pid.to_string().as_bytes())
    }

    /// SIGKILL to every process in it and below it, at once (`cgroup.kill`, Linux 5.14); where
    /// the kernel lacks it, each process found is killed, until none is found.
    pub fn kill(&self) -> io::Result<()> {
        match fs::write(self.dir.join("cgroup.kill"), "1") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.dir.exists() => {
                for p in self.procs_recursive() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Kills everything in it, waits up to `patience` for it to empty, removes it (and the
    /// empty cgroups below it). How many processes it held; an error if it would not empty.
    pub fn kill_and_remove(&self, patience: Duration) -> Result<usize, ContainmentError> {
        if !self.dir.exists() {
            return Ok(0);
        }
        let found = self.procs_recursive().len();
        let deadline = Instant::now() + patience;
        loop {
            if let Err(e) = self.kill() {
                if self.dir.exists() {
                    return Err(ContainmentError::Cgroup(format!(
                        "killing {}: {e}",
                        self.dir.display()
                    )));
                }
            }
            if !self.populated() {
                break;
            }
            if Instant::now() > deadline {
                return Err(ContainmentError::Cgroup(format!(
                    "{} still holds {} process(es) {patience:?} after SIGKILL (uninterruptible sleep?)",
                    self.dir.display(),
                    self.procs_recursive().len()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.remove().map(|()| found)
    }

    /// Removes it and the cgroups below it, deepest first; they must be empty.
    pub fn remove(&self) -> Result<(), ContainmentError> {
        for c in self.children() {
            c.remove()?;
        }
        match fs::remove_dir(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ContainmentError::Cgroup(format!(
                "removing {}: {e}",
                self.dir.display()
            ))),
        }
    }

    /// Memory and CPU: the cgroup's own counters where its controllers are on (memory.current,
    /// cpu.stat's usage_usec, which every cgroup v2 has), else summed over its processes.
    pub fn usage(&self) -> Usage {
        let rss_bytes = fs::read_to_string(self.dir.join("memory.current"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok());
        let cpu_seconds = fs::read_to_string(self.dir.join("cpu.stat"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
            })
            .map(|us| us as f64 / 1e6);
        match (rss_bytes, cpu_seconds) {
            (Some(_), Some(_)) => Usage {
                rss_bytes,
                cpu_seconds,
            },
            _ => {
                let summed = sum_usage(&self.procs_recursive());
                Usage {
                    rss_bytes: rss_bytes.or(summed.rss_bytes),
                    cpu_seconds: cpu_seconds.or(summed.cpu_seconds),
                }
            }
        }
    }
}

/// Memory and CPU summed over processes, from /proc (resident pages counted once per process:
/// shared pages count in each). None when none of them could be read.
pub fn sum_usage(pids: &[u32]) -> Usage {
    let stats: Vec<procfs::Stat> = pids.iter().filter_map(|p| procfs::stat(*p)).collect();
    if stats.is_empty() {
        return Usage::default();
    }
    let page = procfs::page_size();
    let hz = procfs::clock_ticks() as f64;
    Usage {
        rss_bytes: Some(
            stats
                .iter()
                .map(|s| s.rss_pages.saturating_mul(page))
                .fold(0u64, u64::saturating_add),
        ),
        cpu_seconds: Some(stats.iter().map(|s| s.cpu_ticks as f64).sum::<f64>() / hz),
    }
}

/// A cgroup.procs file: one pid per line. A process cannot make this long: the number of
/// processes in one cgroup is the number of lines.
fn read_pids(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_where_mountinfo_says() {
        let hybrid = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure =
            "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(mount_in(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let v1_only = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(mount_in(v1_only), None);
        let bind_of_a_subdir = "50 23 0:26 /user.slice /mnt/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(mount_in(bind_of_a_subdir), None);
        let spaced = "50 23 0:26 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(mount_in(spaced), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn usage_sums_over_processes_when_the_cgroup_has_no_counters() {
        let me = std::process::id();
        let u = sum_usage(&[me, u32::MAX]);
        assert!(u.rss_bytes.unwrap() > 1 << 20, "{u:?}");
        assert!(u.cpu_seconds.unwrap() >= 0.0);
        assert_eq!(sum_usage(&[u32::MAX]), Usage::default());
        let none = Cgroup::new(PathBuf::from("/nonexistent/cgroup"));
        assert_eq!(none.usage(), Usage::default());
        assert!(none.procs().is_empty() && !none.populated());
        assert_eq!(none.kill_and_remove(Duration::from_millis(10)), Ok(0));
    }
}
