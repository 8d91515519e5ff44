//! Whose is a process on a GPU: the seam between NVML's process list and hearth's replicas.
//!
//! NVML names processes by pid. A replica is the process hearth started (its leader) and
//! everything that process starts, so the monitor describes each pid by what can tie it to a
//! leader, nearest first, and the core takes the first that is a replica's leader:
//!
//! 1. the replica's cgroup, where containment gives each replica one ([`CgroupIndex`]);
//! 2. the pid itself, its process group (a replica's leader makes one), its parent chain (a
//!    server's workers, and TGI's shards, which leave the group with `process_group(0)` but stay
//!    its children), then its session.
//!
//! Reading /proc is bounded: at most [`MAX_ANCESTORS`] parents per process.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::core::{GpuProcess, ReplicaId};

/// Parents followed per process.
pub const MAX_ANCESTORS: usize = 16;

/// Replica cgroups, by their directory (`/sys/fs/cgroup/…`). Empty where containment makes
/// none (process groups): then this step is skipped and the process tree decides.
///
/// Containment (agent/containment) inserts a replica's cgroup when the replica's leader is
/// registered in it (a systemd scope `hearth-<replica>.scope`, or a cgroup of its own in
/// hearth's cgroup2 subtree) and removes it when the replica is released; the daemon hands the
/// same index to the GPU monitor.
#[derive(Clone, Default)]
pub struct CgroupIndex {
    paths: Arc<RwLock<BTreeMap<String, ReplicaId>>>,
}

impl CgroupIndex {
    /// `path`: the replica's cgroup directory, e.g.
    /// `/sys/fs/cgroup/hearth.slice/hearth-m-3.scope`.
    pub fn insert(&self, path: impl Into<String>, replica: ReplicaId) {
        if let Ok(mut p) = self.paths.write() {
            p.insert(path.into(), replica);
        }
    }

    pub fn remove(&self, replica: &ReplicaId) {
        if let Ok(mut p) = self.paths.write() {
            p.retain(|_, r| r != replica);
        }
    }

    fn is_empty(&self) -> bool {
        self.paths.read().map(|p| p.is_empty()).unwrap_or(true)
    }

    /// The replica whose cgroup (or a cgroup below it) `cgroup` is.
    pub fn replica_in(&self, cgroup: &str) -> Option<ReplicaId> {
        let paths = self.paths.read().ok()?;
        paths
            .iter()
            .filter(|(p, _)| {
                cgroup == p.as_str()
                    || cgroup
                        .strip_prefix(p.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            })
            .max_by_key(|(p, _)| p.len())
            .map(|(_, r)| r.clone())
    }
}

/// Describes processes for the core.
pub struct Attribution {
    cgroups: CgroupIndex,
    /// Where cgroup2 is mounted: /proc/PID/cgroup paths are below it.
    mount: Option<PathBuf>,
    proc: PathBuf,
    /// The daemon itself: the parent walk stops here (a replica's leader is its child).
    me: u32,
}

/// What /proc/PID/stat says about a process: (parent, process group, session).
fn stat(proc: &std::path::Path, pid: u32) -> Option<(u32, u32, u32)> {
    let text = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    // `pid (comm) state ppid pgrp session …`; comm may hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(1);
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    let session = f.next()?.parse().ok()?;
    Some((ppid, pgrp, session))
}

/// The cgroup2 path of a process (`0::PATH` in /proc/PID/cgroup).
fn cgroup_of(proc: &std::path::Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

impl Attribution {
    pub fn new(cgroups: CgroupIndex) -> Attribution {
        Attribution {
            cgroups,
            mount: super::containment::cgroup2_mount(),
            proc: PathBuf::from("/proc"),
            me: std::process::id(),
        }
    }

    /// Who `pid` may belong to; `bytes` as the driver gave them.
    pub fn process(&self, pid: u32, bytes: Option<u64>) -> GpuProcess {
        let replica = if self.cgroups.is_empty() {
            None
        } else {
            self.mount.as_ref().and_then(|m| {
                let rel = cgroup_of(&self.proc, pid)?;
                let dir = m.join(rel.trim_start_matches('/'));
                let dir = dir.to_string_lossy();
                self.cgroups.replica_in(dir.trim_end_matches('/'))
            })
        };
        GpuProcess {
            pid,
            bytes,
            replica,
            leaders: self.leaders(pid),
        }
    }

    /// The pid, its process group, its parents (up to the daemon, init, or the bound), then its
    /// session. Empty where the process can't be seen (gone, or in another PID namespace).
    fn leaders(&self, pid: u32) -> Vec<u32> {
        let Some((ppid, pgrp, session)) = stat(&self.proc, pid) else {
            return Vec::new();
        };
        let mut out = vec![pid];
        let push = |p: u32, out: &mut Vec<u32>| {
            if p > 1 && p != self.me && !out.contains(&p) {
                out.push(p);
            }
        };
        push(pgrp, &mut out);
        let mut parent = ppid;
        for _ in 0..MAX_ANCESTORS {
            if parent <= 1 || parent == self.me {
                break;
            }
            push(parent, &mut out);
            parent = match stat(&self.proc, parent) {
                Some((pp, _, _)) => pp,
                None => break,
            };
        }
        push(session, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_child_in_a_group_of_its_own_still_leads_back_to_its_parent() {
        // sh (in this test's group) starts sleep in a new process group, as TGI's launcher
        // starts its shards.
        let mut sh = Command::new("sh")
            .args(["-c", "setsid sleep 30 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(sh.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let child: u32 = line.trim().parse().unwrap();
        let a = Attribution::new(CgroupIndex::default());
        let p = a.process(child, None);
        let _ = Command::new("kill").arg(child.to_string()).status();
        let _ = sh.wait();
        assert_eq!(p.leaders.first(), Some(&child), "{:?}", p.leaders);
        assert!(
            p.leaders.contains(&sh.id()),
            "the parent chain reaches the shell: {:?}",
            p.leaders
        );
        assert!(
            !p.leaders.contains(&std::process::id()),
            "stops at the daemon"
        );
        assert_eq!(p.replica, None, "no cgroups registered: no lookup");
    }

    #[test]
    fn a_process_that_is_gone_has_no_leaders() {
        let a = Attribution::new(CgroupIndex::default());
        assert!(a.process(u32::MAX, Some(1)).leaders.is_empty());
    }

    #[test]
    fn the_cgroup_hook_names_the_replica_whose_cgroup_holds_the_process() {
        let me = std::process::id();
        let (Some(rel), Some(mount)) = (
            cgroup_of(std::path::Path::new("/proc"), me),
            super::super::containment::cgroup2_mount(),
        ) else {
            return; // no cgroup2 here: nothing to match against
        };
        let mine = mount
            .join(rel.trim_start_matches('/'))
            .display()
            .to_string();
        let mine = mine.trim_end_matches('/').to_string();
        let index = CgroupIndex::default();
        let a = Attribution::new(index.clone());
        assert_eq!(a.process(me, None).replica, None);
        let r = ReplicaId("m-3".into());
        index.insert(mine.clone(), r.clone());
        index.insert(format!("{mine}x"), ReplicaId("not-a-prefix".into()));
        assert_eq!(a.process(me, None).replica, Some(r.clone()));
        assert_eq!(index.replica_in(&format!("{mine}/worker")), Some(r.clone()));
        index.remove(&r);
        assert_eq!(a.process(me, None).replica, None);
    }
}
