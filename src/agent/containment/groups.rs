//! With neither systemd nor a writable cgroup v2: each replica is its process group, its leader
//! carries PR_SET_PDEATHSIG, and hearth is a child subreaper (PR_SET_CHILD_SUBREAPER), so that a
//! process that leaves its replica's tree (a double fork, a setsid'd worker whose parent exits)
//! becomes hearth's child instead of init's. hearth follows each replica's tree through /proc,
//! attributes such orphans to their replica (by what it saw earlier, else by the
//! HEARTH_REPLICA their environment carries), kills them with it, and reaps them.
//!
//! What this cannot do: a process that escaped while its parent still lives, in another session
//! and process group, is found only through the tree; one that escapes and whose ancestry and
//! environment both say nothing cannot be attributed, and is killed (it is no replica's to keep).
//! And none of it outlives the daemon: after a `kill -9` of hearth, orphans are init's. Ports
//! they hold are passed over, and they never pass a new replica's warm-up (listeners.rs).

// The crate denies unsafe code; this file needs it for what the child does between fork and exec: each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::procfs::{self, Stat};
use super::ContainmentError;
use crate::core::ReplicaId;

/// A process, for good: pid and start time.
pub type Proc = (u32, u64);

#[derive(Default)]
pub struct Groups {
    /// Every process seen in each replica's tree at the last look.
    seen: Mutex<BTreeMap<ReplicaId, BTreeSet<Proc>>>,
}

impl Groups {
    /// Makes this process a child subreaper.
    pub fn open() -> Result<Groups, ContainmentError> {
        // SAFETY: prctl with an integer argument.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(ContainmentError::Cgroup(format!(
                "PR_SET_CHILD_SUBREAPER: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Groups::default())
    }

    /// Walks /proc: each live replica's processes (its leader's descendants, its process group,
    /// and orphans that came back to hearth), attributed and remembered; orphans that belong to
    /// no live replica are killed; hearth's zombie children that are not leaders are reaped.
    /// `leaders`: each live replica's leader pid. `spawning`: a child may exist that is not in
    /// `leaders` yet; hearth's unknown children are then left alone.
    pub fn scan(
        &self,
        leaders: &BTreeMap<ReplicaId, u32>,
        spawning: bool,
    ) -> BTreeMap<ReplicaId, Vec<u32>> {
        let me = std::process::id();
        let stats: HashMap<u32, Stat> = procfs::pids()
            .into_iter()
            .filter_map(|p| Some((p, procfs::stat(p)?)))
            .collect();
        let leader_pids: BTreeSet<u32> = leaders.values().copied().collect();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let by_proc: HashMap<Proc, ReplicaId> = seen
            .iter()
            .flat_map(|(r, procs)| procs.iter().map(move |p| (*p, r.clone())))
            .collect();
        // The replica of each of hearth's children: the leaders themselves, and orphans.
        let mut roots: HashMap<u32, ReplicaId> =
            leaders.iter().map(|(r, p)| (*p, r.clone())).collect();
        for (&pid, s) in &stats {
            if s.ppid != me || leader_pids.contains(&pid) {
                continue;
            }
            if !s.alive() {
                if spawning {
                    // It may be a leader about to be registered: tokio's to reap.
                    continue;
                }
                // An orphan that ended: reap it (a leader is tokio's to reap).
                let _ = waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG));
                continue;
            }
            let owner = by_proc.get(&(pid, s.start_ticks)).cloned().or_else(|| {
                procfs::env_var(pid, "HEARTH_REPLICA")
                    .map(ReplicaId)
                    .filter(|r| leaders.contains_key(r))
            });
            match owner.filter(|r| leaders.contains_key(r)) {
                Some(r) => {
                    roots.insert(pid, r);
                }
                // Maybe a leader about to be registered.
                None if spawning => {}
                None => {
                    tracing::warn!(
                        "{} came back to hearth from a replica that is gone (or it cannot be told which): killing it",
                        procfs::describe(pid)
                    );
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
            }
        }
        // Descendants of each root, by parent links; and members of each leader's group.
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (&pid, s) in &stats {
            children.entry(s.ppid).or_default().push(pid);
        }
        let mut out: BTreeMap<ReplicaId, Vec<u32>> = BTreeMap::new();
        for (root, replica) in &roots {
            let mut stack = vec![*root];
            let members = out.entry(replica.clone()).or_default();
            while let Some(p) = stack.pop() {
                if stats.get(&p).is_some_and(Stat::alive) && !members.contains(&p) {
                    members.push(p);
                }
                if let Some(c) = children.get(&p) {
                    stack.extend(c.iter().copied().filter(|c| *c != me));
                }
            }
        }
        for (replica, leader) in leaders {
            let members = out.entry(replica.clone()).or_default();
            for (&pid, s) in &stats {
                if s.pgrp == *leader && s.alive() && !members.contains(&pid) {
                    members.push(pid);
                }
            }
        }
        *seen = out
            .iter()
            .map(|(r, pids)| {
                let procs = pids
                    .iter()
                    .filter_map(|p| Some((*p, stats.get(p)?.start_ticks)))
                    .collect();
                (r.clone(), procs)
            })
            .collect();
        out
    }

    /// Forgets a replica that is gone.
    pub fn forget(&self, replica: &ReplicaId) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(replica);
    }
}
