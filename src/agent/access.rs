//! Who may do what on the socket: the peer's credentials (SO_PEERCRED) against `[access]`.

use std::ffi::CString;
use std::sync::Arc;

use nix::unistd::{Gid, Group, Pid, Uid, User};

use super::containment::Containment;
use crate::config::{AccessConfig, Principal};
use crate::core::Peer;
use crate::protocol::Role;

#[derive(Debug)]
pub struct Access {
    /// Replaced by a reload.
    config: std::sync::RwLock<AccessConfig>,
    /// The daemon's own user: it owns the socket and could do anything anyway.
    own_uid: u32,
    /// Bumped by each reload: connections re-read their peer's role when it moved.
    generation: std::sync::atomic::AtomicU64,
    /// Tells which replica's cgroup holds a peer.
    containment: Option<Arc<Containment>>,
}

impl Access {
    pub fn new(config: AccessConfig) -> Access {
        Access {
            config: std::sync::RwLock::new(config),
            own_uid: Uid::effective().as_raw(),
            generation: std::sync::atomic::AtomicU64::new(1),
            containment: None,
        }
    }

    /// Peers are also known by the replica cgroup or scope they are in.
    pub fn with_containment(mut self, c: Arc<Containment>) -> Access {
        self.containment = Some(c);
        self
    }

    /// A reloaded `[access]`: every request from now on is judged by it, on connections
    /// already open too (they see the generation move and resolve their peer again).
    pub fn set_config(&self, config: AccessConfig) {
        let mut c = self.config.write().unwrap_or_else(|e| e.into_inner());
        if *c != config {
            *c = config;
            self.generation
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Which `[access]` is in force: changes with each reload that changed it.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves a connecting process to a `Peer`. Reads the user and group databases.
    pub fn peer(&self, uid: u32, gid: u32, pid: Option<i32>) -> Peer {
        let pgid = pid
            .and_then(|p| nix::unistd::getpgid(Some(Pid::from_raw(p))).ok())
            .map(|g| g.as_raw() as u32);
        let replica = match (&self.containment, pid) {
            (Some(c), Some(p)) => c.replica_of_pid(p as u32),
            _ => None,
        };
        Peer {
            uid,
            pid: pid.map(|p| p as u32),
            pgid,
            replica,
            role: self.role(uid, gid),
        }
    }

    /// Root and the daemon's own user: admins whatever `[access]` says, known without reading
    /// the user database.
    pub fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.own_uid
    }

    pub fn role(&self, uid: u32, gid: u32) -> Role {
        if self.privileged(uid) {
            return Role::Admin;
        }
        let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
        let name = user.as_ref().map(|u| u.name.clone());
        let mut groups: Vec<String> = Vec::new();
        if let Some(u) = &user {
            if let Ok(cname) = CString::new(u.name.as_str()) {
                if let Ok(gids) = nix::unistd::getgrouplist(&cname, u.gid) {
                    groups.extend(gids.into_iter().filter_map(group_name));
                }
            }
        }
        groups.extend(group_name(Gid::from_raw(gid)));
        let matches = |list: &[Principal]| {
            list.iter().any(|p| match p {
                Principal::User(u) => name.as_deref() == Some(u.as_str()),
                Principal::Group(g) => groups.iter().any(|x| x == g),
            })
        };
        let config = self.config.read().unwrap_or_else(|e| e.into_inner());
        if matches(&config.admins) {
            Role::Admin
        } else if matches(&config.reporters) {
            Role::Reporter
        } else if matches(&config.readers) {
            Role::Reader
        } else {
            Role::None
        }
    }
}

fn group_name(g: Gid) -> Option<String> {
    Group::from_gid(g).ok().flatten().map(|g| g.name)
}
