//! What an earlier run left, adopted where its saved ledger proves it, stopped otherwise; the
//! proofs this run saves; the command that stops everything when no daemon comes back.

use std::collections::BTreeMap;

use super::{procfs, Backend, Containment, Entry, Leftover};
use crate::agent::ledger::{Proof, Saved};
use crate::core::{Ledger, ReplicaId};

impl Containment {
    /// At start: what an earlier run left, checked against what it saved. A leftover is
    /// adopted when the saved proof names it, its leader (the saved pid) is in it and alive with
    /// the saved start time (a reused pid has another), and its cgroup is the saved one; it is
    /// then this run's to watch and stop. Every other leftover is stopped. Returns the core's
    /// records of the adopted ones only.
    pub fn claim(&self, saved: Option<Saved>) -> Ledger {
        let saved = saved.unwrap_or_else(|| Saved::new(Ledger::default(), BTreeMap::new()));
        let mut proven = Ledger {
            models: saved.ledger.models.clone(),
            replicas: Vec::new(),
        };
        let mut stop = Vec::new();
        for l in self.leftovers() {
            let record = saved
                .ledger
                .replicas
                .iter()
                .find(|r| r.replica == l.replica);
            let proof = saved.proofs.get(&l.replica);
            let why_not = match (record, proof, &l.cgroup) {
                (None, _, _) | (_, None, _) => Some("nothing saved about it".to_string()),
                (_, _, None) => Some("no cgroup to prove it by".to_string()),
                (Some(r), Some(p), Some(cg)) => {
                    if r.pid != p.pid {
                        Some("its saved records disagree".to_string())
                    } else if cg.dir.display().to_string() != p.cgroup {
                        Some(format!("its cgroup is not the saved {}", p.cgroup))
                    } else {
                        match l.processes.iter().find(|(pid, _)| *pid == p.pid) {
                            None => Some(format!("its leader (pid {}) is gone", p.pid)),
                            Some((_, ticks)) if *ticks != p.start_ticks => Some(format!(
                                "pid {} started at another time (tick {ticks}, saved {}): not the process that was started",
                                p.pid, p.start_ticks
                            )),
                            Some(_) => None,
                        }
                    }
                }
            };
            match (why_not, record, proof) {
                (None, Some(r), Some(p)) => {
                    self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(
                        ReplicaId(l.replica.clone()),
                        Entry {
                            pid: p.pid,
                            start_ticks: p.start_ticks,
                            cgroup: l.cgroup.clone(),
                        },
                    );
                    proven.replicas.push(r.clone());
                }
                (why, _, _) => {
                    let why = why.unwrap_or_default();
                    tracing::warn!(replica = %l.replica, "not adopting what an earlier run left in {}: {why}", l.location);
                    stop.push(l);
                }
            }
        }
        self.stop_leftovers(stop);
        proven
    }

    /// What proves each live replica's leader, to be saved.
    pub fn proofs(&self) -> BTreeMap<String, Proof> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(r, e)| {
                Some((
                    r.0.clone(),
                    Proof {
                        pid: e.pid,
                        start_ticks: e.start_ticks,
                        cgroup: e.cgroup.as_ref()?.dir.display().to_string(),
                    },
                ))
            })
            .collect()
    }

    /// The command that stops every replica of this instance when no daemon will come back
    /// for them; None where replicas do not outlive the daemon.
    pub fn stop_everything_command(&self) -> Option<String> {
        match &self.backend {
            Backend::Scopes(s) => Some(format!("systemctl stop {}", s.slice)),
            Backend::Subtree(s) => Some(format!("echo 1 > {}/cgroup.kill", s.path().display())),
            Backend::Groups(_) => None,
        }
    }

    /// Stops leftovers, saying what each held.
    fn stop_leftovers(&self, leftovers: Vec<Leftover>) {
        for l in leftovers {
            let what = if l.processes.is_empty() {
                "empty".to_string()
            } else {
                let procs: Vec<String> = l
                    .processes
                    .iter()
                    .map(|(p, _)| procfs::describe(*p))
                    .collect();
                format!("{} process(es): {}", procs.len(), procs.join(", "))
            };
            match self.stop_leftover(&l) {
                Ok(()) => tracing::warn!(
                    replica = %l.replica,
                    "stopped what an earlier run left in {}: {what}",
                    l.location
                ),
                Err(e) => tracing::error!(
                    replica = %l.replica,
                    "could not stop what an earlier run left in {} ({what}): {e}",
                    l.location
                ),
            }
        }
    }
}
