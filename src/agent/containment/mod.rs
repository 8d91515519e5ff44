//! Replica containment: where a replica's processes live, so that nothing it forks outlives its
//! stop, its memory and CPU can be read, a peer on the socket can be told to be one of its
//! processes, and what an earlier run left behind can be found. Chosen once at start, in this
//! order, and logged (`choice.rs`):
//!
//! - **systemd scopes** (`scope.rs`): systemd is PID 1 (/run/systemd/system) and answers on the
//!   system bus. Each replica is the transient unit `INSTANCE-REPLICA.scope` in
//!   `INSTANCE.slice`.
//! - **a cgroup2 subtree** (`subtree.rs`): cgroup v2 is mounted and writable. Each replica is the
//!   cgroup `MOUNT/INSTANCE/REPLICA`, outside the daemon's own cgroup.
//! - **process groups** (`groups.rs`): each replica is its process group, with PDEATHSIG, and
//!   hearth is a child subreaper.
//!
//! In the first two, a child is placed between fork and exec (`gate.rs`), before it can fork.
//! INSTANCE is `hearth` for the default `state_dir` (/var/lib/hearth), `hearth-HASH` for any
//! other (a stable hash of the path), so that two daemons with their own state never touch each
//! other's replicas; an abstract socket named after it keeps a second daemon of the same
//! instance from starting. The names carry the replica id: what an earlier run left is found
//! by listing them ([`Containment::leftovers`]); those the persisted ledger proves to be the
//! processes that were started are adopted ([`Containment::claim`]), the rest stopped.

mod cgroup;
mod choice;
mod claim;
mod gate;
mod groups;
pub mod listeners;
pub mod procfs;
mod scope;
mod stopping;
mod subtree;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};

/// Why containment could not do what the rest of the shell asked of it. The words name the
/// cgroup, the unit or the process, for the operator; the kind says which part failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContainmentError {
    /// The cgroup2 tree: a replica's cgroup made, moved into, killed or removed.
    #[error("{0}")]
    Cgroup(String),
    /// systemd over the system bus: a replica's scope started or stopped.
    #[error("{0}")]
    Systemd(String),
    /// Nothing answers the port on loopback.
    #[error("nothing listens on port {port} on loopback")]
    NoListener { port: u16 },
    /// Another process answers the replica's port.
    #[error("port {port} is answered by {who}, not by a process of this replica")]
    NotTheReplica { port: u16, who: String },
}
use nix::unistd::Pid;

pub use cgroup::{mount as cgroup2_mount, Cgroup};
pub use choice::{instance_for, CONTAINMENT_ENV, DEFAULT_STATE_DIR};
pub use gate::{ChildSide, Gate};

use super::gpu_owner::CgroupIndex;
use super::inbox::EventSink;
use super::ledger::Saved;
use crate::core::{Event, Ledger, ReplicaId, SpawnSpec, StopSignal, Usage};

/// How long a stop waits for a cgroup to empty after SIGKILL.
const EMPTY_PATIENCE: Duration = Duration::from_secs(10);

/// Which containment this host gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Scopes,
    Subtree,
    Groups,
}

enum Backend {
    Scopes(scope::Scopes),
    Subtree(subtree::Subtree),
    Groups(groups::Groups),
}

/// A live replica: its leader, and the cgroup it is in where there is one.
#[derive(Debug, Clone)]
struct Entry {
    pid: u32,
    /// The leader's start time (clock ticks since boot): with the pid, its identity.
    start_ticks: u64,
    cgroup: Option<Cgroup>,
}

/// What an earlier run left: a replica's cgroup or scope and the processes in it.
#[derive(Debug, Clone)]
pub struct Leftover {
    /// The replica id its name carries.
    pub replica: String,
    /// The cgroup directory or the unit, for the log.
    pub location: String,
    /// (pid, start time in clock ticks) of each process in it: with issue 14's adoption, the
    /// proof that a process is the one that was started.
    pub processes: Vec<(u32, u64)>,
    cgroup: Option<Cgroup>,
}

/// Made before fork for a replica about to start; `place` uses it during the gate.
pub struct Placement {
    replica: ReplicaId,
    model: String,
    stop_grace: Duration,
    /// The subtree's cgroup, created empty; for scopes, the scope's cgroup once placed.
    cgroup: Mutex<Option<Cgroup>>,
}

pub struct Containment {
    mode: Mode,
    backend: Backend,
    instance: String,
    live: Mutex<BTreeMap<ReplicaId, Entry>>,
    /// Spawns between fork and registration (see groups.rs).
    spawning: AtomicUsize,
    /// Each live replica's cgroup, for the GPU monitor: a process on a GPU is the replica's when
    /// it is in that cgroup, whatever process group or parent it has (TGI's shards).
    gpu_owners: CgroupIndex,
    _lock: std::os::unix::net::UnixListener,
}

impl Containment {
    /// The replicas' cgroups, as the GPU monitor attributes processes by them.
    pub fn gpu_owners(&self) -> CgroupIndex {
        self.gpu_owners.clone()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Where the subtree is (cgroup2 mode).
    pub fn subtree(&self) -> Option<PathBuf> {
        match &self.backend {
            Backend::Subtree(s) => Some(s.path()),
            _ => None,
        }
    }

    // ---- what an earlier run left --------------------------------------------------------

    /// Replica cgroups or scopes that exist before this run started any: an earlier run's.
    /// None can be found with process groups only.
    pub fn leftovers(&self) -> Vec<Leftover> {
        let found: Vec<(String, String, Option<Cgroup>)> = match &self.backend {
            Backend::Subtree(s) => s
                .list()
                .into_iter()
                .map(|(r, cg)| (r, cg.dir.display().to_string(), Some(cg)))
                .collect(),
            Backend::Scopes(s) => match s.list() {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!("listing the scopes of {}: {e}", s.slice);
                    Vec::new()
                }
            },
            Backend::Groups(_) => Vec::new(),
        };
        found
            .into_iter()
            .map(|(replica, location, cgroup)| {
                let processes = cgroup
                    .as_ref()
                    .map(|c| c.procs_recursive())
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| Some((p, procfs::stat(p)?.start_ticks)))
                    .collect();
                Leftover {
                    replica,
                    location,
                    processes,
                    cgroup,
                }
            })
            .collect()
    }

    /// Stops a leftover: everything in it is killed and it is removed.
    pub fn stop_leftover(&self, l: &Leftover) -> Result<(), ContainmentError> {
        match &self.backend {
            Backend::Subtree(_) => match &l.cgroup {
                Some(cg) => cg.kill_and_remove(EMPTY_PATIENCE).map(|_| ()),
                None => Ok(()),
            },
            Backend::Scopes(s) => s.stop(&l.replica),
            Backend::Groups(_) => Ok(()),
        }
    }

    // ---- starting a replica --------------------------------------------------------------

    /// Before fork: the replica's cgroup, created empty (cgroup2 mode).
    pub fn prepare(&self, spec: &SpawnSpec) -> Result<Placement, ContainmentError> {
        let cgroup = match &self.backend {
            Backend::Subtree(s) => Some(s.create(spec.replica.as_str())?),
            _ => None,
        };
        Ok(Placement {
            replica: spec.replica.clone(),
            model: spec.model.clone(),
            stop_grace: spec.stop_grace,
            cgroup: Mutex::new(cgroup),
        })
    }

    /// The child must wait between fork and exec until `place` has run.
    pub fn gated(&self) -> bool {
        self.mode != Mode::Groups
    }

    /// A spawn is under way (between fork and `register`).
    pub fn spawning(&self) -> SpawnGuard<'_> {
        self.spawning.fetch_add(1, Ordering::AcqRel);
        SpawnGuard(self)
    }

    /// Puts the waiting child in its cgroup or scope.
    pub fn place(&self, p: &Placement, pid: u32) -> Result<(), ContainmentError> {
        match &self.backend {
            Backend::Subtree(_) => {
                let cg = p.cgroup.lock().unwrap_or_else(|e| e.into_inner());
                match cg.as_ref() {
                    Some(cg) => cg.attach(pid).map_err(|e| {
                        ContainmentError::Cgroup(format!(
                            "moving pid {pid} into {}: {e}",
                            cg.dir.display()
                        ))
                    }),
                    None => Err(ContainmentError::Cgroup("no cgroup prepared".into())),
                }
            }
            Backend::Scopes(s) => {
                let description = format!("hearth replica {} (model {})", p.replica, p.model);
                let cg = s.start(p.replica.as_str(), &description, pid, p.stop_grace)?;
                *p.cgroup.lock().unwrap_or_else(|e| e.into_inner()) = Some(cg);
                Ok(())
            }
            Backend::Groups(_) => Ok(()),
        }
    }

    /// The spawn failed: what was made for it goes.
    pub fn discard(&self, p: Placement) {
        let cg = p.cgroup.into_inner().unwrap_or_else(|e| e.into_inner());
        match &self.backend {
            Backend::Subtree(_) => {
                if let Some(cg) = cg {
                    let _ = cg.kill_and_remove(EMPTY_PATIENCE);
                }
            }
            Backend::Scopes(s) if cg.is_some() => {
                let _ = s.stop(p.replica.as_str());
            }
            _ => {}
        }
    }

    /// The child runs: from now on it is the replica's leader.
    pub fn register(&self, p: Placement, pid: u32) {
        let cgroup = p.cgroup.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(cg) = &cgroup {
            self.gpu_owners
                .insert(cg.dir.display().to_string(), p.replica.clone());
        }
        let start_ticks = procfs::stat(pid).map_or(0, |s| s.start_ticks);
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(
            p.replica,
            Entry {
                pid,
                start_ticks,
                cgroup,
            },
        );
    }

    // ---- reading ---------------------------------------------------------------------------

    fn entry(&self, replica: &ReplicaId) -> Option<Entry> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(replica)
            .cloned()
    }

    /// The ids of the live replicas.
    pub fn live_ids(&self) -> Vec<String> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .map(|r| r.0.clone())
            .collect()
    }

    fn leaders(&self) -> BTreeMap<ReplicaId, u32> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(r, e)| (r.clone(), e.pid))
            .collect()
    }

    /// The live replica whose cgroup or scope holds `pid`; None where there are no cgroups
    /// (the core then goes by process group).
    pub fn replica_of_pid(&self, pid: u32) -> Option<ReplicaId> {
        if self.mode == Mode::Groups {
            return None;
        }
        let cg = procfs::cgroup_of(pid)?;
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.iter().find_map(|(r, e)| {
            let dir = &e.cgroup.as_ref()?.dir;
            dir.to_str()?.ends_with(cg.as_str()).then(|| r.clone())
        })
    }

    /// Every live process of the replica.
    pub fn members(&self, replica: &ReplicaId) -> Vec<u32> {
        let Some(e) = self.entry(replica) else {
            return Vec::new();
        };
        match (&self.backend, &e.cgroup) {
            (Backend::Groups(g), _) => self.groups_members(g, replica, e.pid),
            (_, Some(cg)) => cg.procs_recursive(),
            _ => Vec::new(),
        }
    }

    /// Checks that every listening socket on `port` that can answer loopback belongs to a
    /// process of the replica. The error names who holds it instead.
    pub fn verify_listener(&self, replica: &ReplicaId, port: u16) -> Result<(), ContainmentError> {
        let listeners: Vec<_> = listeners::listening_on(port)
            .into_iter()
            .filter(|l| l.local)
            .collect();
        if listeners.is_empty() {
            return Err(ContainmentError::NoListener { port });
        }
        let members = self.members(replica);
        let mut all: Option<Vec<u32>> = None;
        for l in listeners {
            if listeners::holder_among(l.inode, &members).is_some() {
                continue;
            }
            let everyone = all.get_or_insert_with(procfs::pids);
            let who = match listeners::holder_among(l.inode, everyone) {
                Some(p) => procfs::describe(p),
                None => "a process hearth cannot see".to_string(),
            };
            return Err(ContainmentError::NotTheReplica { port, who });
        }
        Ok(())
    }

    /// Memory and CPU of every live replica.
    pub fn sample(&self) -> Vec<(ReplicaId, Usage)> {
        let live: Vec<(ReplicaId, Entry)> = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(r, e)| (r.clone(), e.clone()))
            .collect();
        match &self.backend {
            Backend::Groups(g) => {
                let spawning = self.spawning.load(Ordering::Acquire) > 0;
                let members = g.scan(&self.leaders(), spawning);
                live.into_iter()
                    .map(|(r, _)| {
                        let pids = members.get(&r).cloned().unwrap_or_default();
                        (r, cgroup::sum_usage(&pids))
                    })
                    .collect()
            }
            _ => live
                .into_iter()
                .map(|(r, e)| {
                    let u = e.cgroup.as_ref().map(Cgroup::usage).unwrap_or_default();
                    (r, u)
                })
                .collect(),
        }
    }
}

/// How often replicas' memory and CPU are read (and, with process groups, their trees walked,
/// orphans attributed and zombies reaped).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// At start, off the event loop: picks the containment, then adopts what an earlier run of
/// this daemon left and `saved` proves, and stops the rest (before any replica of this run
/// exists). The records of the adopted replicas, for the core.
pub async fn start(
    state_dir: &Path,
    saved: Option<Saved>,
) -> anyhow::Result<(Arc<Containment>, Ledger)> {
    let state_dir = state_dir.to_path_buf();
    let handle = tokio::runtime::Handle::current();
    let (c, ledger) =
        tokio::task::spawn_blocking(move || -> anyhow::Result<(Containment, Ledger)> {
            let c = Containment::open(&state_dir, handle)?;
            let ledger = c.claim(saved);
            Ok((c, ledger))
        })
        .await??;
    Ok((Arc::new(c), ledger))
}

/// Samples replicas' usage on a thread of its own until `stop` is set or the loop is gone.
pub fn start_sampler(c: Arc<Containment>, sink: EventSink, stop: Arc<AtomicBool>) {
    let started = std::thread::Builder::new()
        .name("hearth-usage".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) && !sink.is_closed() {
                std::thread::sleep(SAMPLE_INTERVAL);
                let samples = c.sample();
                if !samples.is_empty() && !sink.blocking_send(Event::Usage(samples)) {
                    break;
                }
            }
        });
    if let Err(e) = started {
        tracing::warn!("could not start the usage sampler: {e}; status shows no memory or CPU");
    }
}

impl std::fmt::Debug for Containment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containment")
            .field("mode", &self.mode)
            .field("instance", &self.instance)
            .finish()
    }
}

/// Held while a spawn is between fork and `register`.
pub struct SpawnGuard<'a>(&'a Containment);

impl Drop for SpawnGuard<'_> {
    fn drop(&mut self) {
        self.0.spawning.fetch_sub(1, Ordering::AcqRel);
    }
}
