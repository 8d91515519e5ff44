//! A test daemon's replica cgroups, as hearth's containment lays them out without systemd:
//! `MOUNT/INSTANCE/REPLICA` with MOUNT the cgroup2 mount and INSTANCE derived from the daemon's
//! state_dir (`hearth-` and the path's FNV-1a hash; `tests/cli/harness.rs` checks this against the
//! daemon's own log line). For counting a replica's processes and for the cleanup.

use std::fs;
use std::path::{Path, PathBuf};

/// The cgroup v2 mount, from /proc/self/mountinfo.
pub fn mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        if *f.get(3)? != "/" {
            return None;
        }
        Some(PathBuf::from(f.get(4)?))
    })
}

/// hearth's instance name for a state_dir other than the default.
pub fn instance(state_dir: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in state_dir.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("hearth-{h:016x}")
}

/// Where a daemon with `state_dir` keeps its replicas' cgroups (whether or not it exists).
pub fn subtree(state_dir: &Path) -> Option<PathBuf> {
    Some(mount()?.join(instance(state_dir)))
}

/// Pids in `dir` and every cgroup below it.
pub fn procs(dir: &Path) -> Vec<i32> {
    let mut v: Vec<i32> = fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default();
    for c in children(dir) {
        v.extend(procs(&c));
    }
    v
}

/// The cgroups directly below `dir`.
pub fn children(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            e.file_type().ok()?.is_dir().then(|| e.path())
        })
        .collect();
    v.sort();
    v
}

/// SIGKILLs everything in `dir` and below (cgroup.kill), then removes the empty cgroups.
pub fn kill_and_remove(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let _ = fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..500 {
        if procs(dir).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    remove(dir);
}

fn remove(dir: &Path) {
    for c in children(dir) {
        remove(&c);
    }
    let _ = fs::remove_dir(dir);
}
