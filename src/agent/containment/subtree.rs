//! Without systemd, on a writable cgroup v2: a hearth-owned subtree `MOUNT/INSTANCE/` at the top
//! of the hierarchy, outside the daemon's own cgroup (so that whatever kills the daemon's cgroup
//! does not reach the replicas, and they can outlive the daemon once adoption exists), with one
//! cgroup per replica, `MOUNT/INSTANCE/REPLICA`, stopped with `cgroup.kill` and removed once
//! empty. The subtree's directory is locked (flock) while a daemon uses it.

use std::fs;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::cgroup::Cgroup;
use super::ContainmentError;

pub struct Subtree {
    pub root: Cgroup,
    /// Controllers turned on for the replicas' cgroups (e.g. "memory"), for the log.
    pub controllers: Vec<String>,
    _lock: Flock<fs::File>,
}

impl Subtree {
    /// Creates (or takes over) `mount/instance`. An error says why this host cannot have one:
    /// a read-only mount, no permission, another daemon holding it.
    pub fn open(mount: &Path, instance: &str) -> Result<Subtree, ContainmentError> {
        let root = mount.join(instance);
        match fs::create_dir(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(ContainmentError::Cgroup(format!(
                    "creating {}: {e}",
                    root.display()
                )))
            }
        }
        // Moving a process needs write access to cgroup.procs of the target and of the common
        // ancestor of where it is and where it goes (here the hierarchy's root).
        for p in [root.join("cgroup.procs"), mount.join("cgroup.procs")] {
            if nix::unistd::access(&p, nix::unistd::AccessFlags::W_OK).is_err() {
                return Err(ContainmentError::Cgroup(format!(
                    "{} is not writable",
                    p.display()
                )));
            }
        }
        let dir = fs::File::open(&root)
            .map_err(|e| ContainmentError::Cgroup(format!("opening {}: {e}", root.display())))?;
        let lock = Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            ContainmentError::Cgroup(format!(
                "{} is in use by another hearth daemon ({e})",
                root.display()
            ))
        })?;
        let controllers = enable_controllers(&root);
        Ok(Subtree {
            root: Cgroup::new(root),
            controllers,
            _lock: lock,
        })
    }

    pub fn replica(&self, replica: &str) -> Cgroup {
        Cgroup::new(self.root.dir.join(replica))
    }

    /// A fresh, empty cgroup for a replica about to start.
    pub fn create(&self, replica: &str) -> Result<Cgroup, ContainmentError> {
        let cg = self.replica(replica);
        match fs::create_dir(&cg.dir) {
            Ok(()) => Ok(cg),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if cg.populated() {
                    Err(ContainmentError::Cgroup(format!(
                        "{} still holds processes of an earlier replica {replica}",
                        cg.dir.display()
                    )))
                } else {
                    Ok(cg)
                }
            }
            Err(e) => Err(ContainmentError::Cgroup(format!(
                "creating {}: {e}",
                cg.dir.display()
            ))),
        }
    }

    /// Replica cgroups that exist now: at start, what an earlier run left.
    pub fn list(&self) -> Vec<(String, Cgroup)> {
        self.root
            .children()
            .into_iter()
            .filter_map(|c| {
                let name = c.dir.file_name()?.to_str()?.to_string();
                Some((name, c))
            })
            .collect()
    }

    /// At exit: the subtree goes if nothing is left in it.
    pub fn remove_if_empty(&self) {
        if self.root.children().is_empty() {
            let _ = fs::remove_dir(&self.root.dir);
        }
    }

    pub fn path(&self) -> PathBuf {
        self.root.dir.clone()
    }
}

/// Turns on, for the replicas' cgroups, the memory and cpu controllers the parent hands down,
/// so that memory.current and the cgroup's CPU time exist. Never touches the hierarchy's root:
/// what the host gives is what hearth uses.
fn enable_controllers(root: &Path) -> Vec<String> {
    let available = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let mut on = Vec::new();
    for c in ["memory", "cpu"] {
        if available.split_whitespace().any(|a| a == c)
            && fs::write(root.join("cgroup.subtree_control"), format!("+{c}")).is_ok()
        {
            on.push(c.to_string());
        }
    }
    on
}
