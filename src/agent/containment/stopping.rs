//! Stopping a replica: signals to its process group, the kill of whatever it left behind
//! (its cgroup or scope, or the processes of its groups), and giving its cgroup back.

use super::*;

impl Containment {
    /// SIGTERM goes to the leader's process group: the server's own graceful stop, as its
    /// workers expect it; SIGKILL too, and then (`kill_rest`) to every process of the replica.
    pub fn signal_group(&self, replica: &ReplicaId, pid: u32, signal: StopSignal) {
        let sig = match signal {
            StopSignal::Term => Signal::SIGTERM,
            StopSignal::Kill => Signal::SIGKILL,
        };
        match killpg(Pid::from_raw(pid as i32), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => tracing::warn!(replica = %replica, pid, "could not send {sig:?}: {e}"),
        }
    }

    /// SIGKILL to every process of the replica but through its process group: its cgroup's
    /// (`cgroup.kill`; a scope's processes one by one, since under systemd the cgroup file
    /// system is read-only to hearth), or those the process-group walk finds. Blocking (it
    /// reads /proc): off the event loop.
    pub fn kill_rest(&self, replica: &ReplicaId) {
        let entry = self.entry(replica);
        match (
            &self.backend,
            entry.as_ref().and_then(|e| e.cgroup.as_ref()),
        ) {
            (Backend::Subtree(_), Some(cg)) => {
                let _ = cg.kill();
            }
            (Backend::Scopes(_), Some(cg)) => {
                for p in cg.procs_recursive() {
                    let _ = nix::sys::signal::kill(Pid::from_raw(p as i32), Signal::SIGKILL);
                }
            }
            (Backend::Groups(g), _) => {
                if let Some(e) = &entry {
                    for p in self.groups_members(g, replica, e.pid) {
                        let _ = nix::sys::signal::kill(Pid::from_raw(p as i32), Signal::SIGKILL);
                    }
                }
            }
            _ => {}
        }
    }

    /// The leader has exited: whatever the replica left goes with it (setsid'd workers and
    /// daemonized grandchildren included), and its cgroup or scope is removed. Blocking: waits
    /// for the processes to be gone. What was killed, for the log.
    pub fn release(&self, replica: &ReplicaId, pid: u32) -> Option<String> {
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let entry = self.entry(replica);
        let result = match (
            &self.backend,
            entry.as_ref().and_then(|e| e.cgroup.as_ref()),
        ) {
            (Backend::Subtree(_), Some(cg)) => cg.kill_and_remove(EMPTY_PATIENCE),
            (Backend::Scopes(s), cg) => {
                let n = cg.map_or(0, |c| c.procs_recursive().len());
                s.stop(replica.as_str()).map(|()| n)
            }
            (Backend::Groups(g), _) => Ok(self.release_group(g, replica, pid)),
            _ => Ok(0),
        };
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(replica);
        self.gpu_owners.remove(replica);
        match result {
            Ok(0) => None,
            Ok(n) => Some(format!("killed {n} process(es) it left behind")),
            Err(e) => Some(format!("could not clear what it left: {e}")),
        }
    }

    pub(super) fn release_group(
        &self,
        g: &groups::Groups,
        replica: &ReplicaId,
        leader: u32,
    ) -> usize {
        let deadline = Instant::now() + EMPTY_PATIENCE;
        let mut killed = std::collections::BTreeSet::new();
        loop {
            let left = self.groups_members(g, replica, leader);
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for p in left {
                killed.insert(p);
                let _ = nix::sys::signal::kill(Pid::from_raw(p as i32), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        g.forget(replica);
        killed.len()
    }

    /// The replica's processes, by the process-group backend's walk (its leader included in
    /// the walk even once it has exited, so that its orphans are still attributed to it).
    pub(super) fn groups_members(
        &self,
        g: &groups::Groups,
        replica: &ReplicaId,
        leader: u32,
    ) -> Vec<u32> {
        let mut leaders = self.leaders();
        leaders.insert(replica.clone(), leader);
        let spawning = self.spawning.load(Ordering::Acquire) > 0;
        g.scan(&leaders, spawning)
            .remove(replica)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| procfs::stat(*p).is_some_and(|s| s.alive()))
            .collect()
    }

    /// At exit: nothing of ours is left; the subtree goes if empty.
    pub fn close(&self) {
        if let Backend::Subtree(s) = &self.backend {
            s.remove_if_empty();
        }
    }
}
