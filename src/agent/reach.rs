//! Whether the account a model's replicas run as can reach what they must, judged by mode bits
//! and ownership as the kernel does without ACLs (root passes): the program (every directory on
//! the way searchable, the file executable), and the control socket in `HEARTH_SOCKET` (every
//! directory on the way searchable; the socket, 0660, theirs or their group's). The spawn asks
//! about the program before it starts anything (supervisor.rs); `hearth check-config`, the
//! daemon's start and a reload ask about both through [`config::Reach`], so that a replica that
//! could not run, or could not report, is refused with the directory that stops it.
//!
//! [`config::Reach`]: crate::config::Reach

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, Uid, User};

use super::account::{Accounts, Credentials};
use crate::config::{Checks, Config, ConfigError, ModelConfig, Reach};

/// An account as far as permissions go. `uid` None: an account not made yet, which owns
/// nothing and whose group (of its own, made with it) holds nothing.
#[derive(Debug, Clone)]
pub struct Who {
    pub name: String,
    uid: Option<u32>,
    gids: Vec<u32>,
}

impl Who {
    pub fn of(c: &Credentials) -> Who {
        let mut gids: Vec<u32> = c.groups.iter().map(|g| g.as_raw()).collect();
        gids.push(c.gid.as_raw());
        Who {
            name: c.name.clone(),
            uid: Some(c.uid.as_raw()),
            gids,
        }
    }

    /// The default account before it was made.
    pub fn to_be_made(name: &str) -> Who {
        Who {
            name: name.to_string(),
            uid: None,
            gids: Vec::new(),
        }
    }

    fn is_root(&self) -> bool {
        self.uid == Some(0)
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gids.contains(&gid)
    }

    /// Why this account cannot execute `program`, found on `path` (the child's PATH) if it has
    /// no slash; None if it can (or if it is nowhere: the spawn itself says so).
    pub fn cannot_execute(&self, program: &str, path: Option<&str>) -> Option<String> {
        if self.is_root() {
            return None;
        }
        let candidates: Vec<PathBuf> = if program.contains('/') {
            vec![PathBuf::from(program)]
        } else {
            path.unwrap_or("/usr/local/bin:/usr/bin:/bin")
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| Path::new(d).join(program))
                .collect()
        };
        let mut first_problem = None;
        for c in candidates {
            if !c.is_file() {
                continue;
            }
            let absolute = absolute(&c);
            let why = self.blocked_on_the_way(&absolute).or_else(|| {
                let meta = std::fs::metadata(&absolute).ok()?;
                (!self.may(&meta, 0o1)).then(|| {
                    format!(
                        "{} cannot execute {} (mode {:o}, owner uid {})",
                        self.name,
                        absolute.display(),
                        meta.mode() & 0o7777,
                        meta.uid()
                    )
                })
            });
            match why {
                None => return None,
                Some(why) => {
                    first_problem.get_or_insert(why);
                }
            }
        }
        first_problem
    }

    /// Why this account could not connect to the control socket at `socket`, which the daemon
    /// (`owner`) binds with mode 0660 and group `group` (None: the default account's own, not
    /// made yet); None if it could.
    pub fn cannot_connect(&self, socket: &Path, owner: Uid, group: Option<Gid>) -> Option<String> {
        if self.is_root() {
            return None;
        }
        let socket = absolute(socket);
        if let Some(why) = self.blocked_on_the_way(&socket) {
            return Some(why);
        }
        let theirs = self.uid == Some(owner.as_raw())
            || match group {
                Some(g) => self.in_group(g.as_raw()),
                // The group made with the default account: its own, and nobody else's.
                None => self.uid.is_none(),
            };
        if theirs {
            return None;
        }
        let group = group.map_or_else(|| "a new group".to_string(), |g| group_name(g.as_raw()));
        Some(format!(
            "{} cannot connect to {}: the socket is mode 0660, group {group}, and {} is not in \
             group {group} (add it: usermod -aG {group} {})",
            self.name,
            socket.display(),
            self.name,
            self.name
        ))
    }

    /// The first directory above `file` (absolute) that this account may not search.
    fn blocked_on_the_way(&self, file: &Path) -> Option<String> {
        let mut dir = PathBuf::from("/");
        let parents = file.parent()?.components().skip(1);
        for part in std::iter::once(None).chain(parents.map(Some)) {
            if let Some(p) = part {
                dir.push(p);
            }
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            if !self.may(&meta, 0o1) {
                return Some(format!(
                    "{} cannot reach {}: {} is not searchable by {} (mode {:04o}, owner {})",
                    self.name,
                    file.display(),
                    dir.display(),
                    self.name,
                    meta.mode() & 0o7777,
                    user_name(meta.uid())
                ));
            }
        }
        None
    }

    /// Permission `bit` (1 = execute/search) for this account on a file.
    fn may(&self, meta: &std::fs::Metadata, bit: u32) -> bool {
        let mode = meta.mode();
        if self.uid == Some(meta.uid()) {
            mode & (bit << 6) != 0
        } else if self.in_group(meta.gid()) {
            mode & (bit << 3) != 0
        } else {
            mode & bit != 0
        }
    }
}

/// The host's answers to the configuration's questions about the replicas' accounts.
pub struct HostReach {
    accounts: Accounts,
    /// Who binds the socket, and the group it gets.
    owner: Uid,
    group: Option<Gid>,
}

impl HostReach {
    pub fn new(accounts: Accounts) -> HostReach {
        HostReach {
            owner: Uid::effective(),
            group: accounts.socket_group(),
            accounts,
        }
    }
}

impl Reach for HostReach {
    fn lookup(&self, program: &str, search: Option<&str>) -> Option<String> {
        crate::config::program_lookup(program, search)
    }

    fn program(&self, model: &ModelConfig, program: &str, search: Option<&str>) -> Option<String> {
        self.accounts
            .cannot_run(model.launch.user.as_deref(), program, search)
    }

    fn socket(&self, model: &ModelConfig, socket: &Path) -> Option<String> {
        let who = match self.accounts.who(model.launch.user.as_deref()) {
            Ok(Some(w)) => w,
            Ok(None) => return None,
            Err(e) => return Some(e.to_string()),
        };
        let why = who.cannot_connect(socket, self.owner, self.group)?;
        Some(format!(
            "replicas of model {:?} run as {}, who are told HEARTH_SOCKET to report their \
             queue: {why}. Put the socket where {} can reach it (the default \
             /run/hearth/hearth.sock), or read the model's queue from its own metrics with \
             [model.signal]",
            model.name, who.name, who.name
        ))
    }
}

/// Reads the configuration file as the daemon runs it: checked to depth `checks`, down to what
/// the replicas' accounts can reach at [`Checks::Host`], and the socket made absolute (replicas
/// are told it in `HEARTH_SOCKET`, and may run elsewhere than the daemon's directory). What
/// `hearth daemon`, a reload and `hearth check-config` read.
pub fn load(path: &Path, checks: Checks) -> Result<Config, ConfigError> {
    load_text(path, checks).map(|(config, _)| config)
}

/// [`load`], and the text the configuration was read from (what an upgrade carries across).
pub fn load_text(path: &Path, checks: Checks) -> Result<(Config, String), ConfigError> {
    let text = crate::config::read_file(path)?;
    let mut config = Config::parse_on(&text, path, checks, &HostReach::new(Accounts::lookup()))?;
    config.daemon.socket = absolute(&config.daemon.socket);
    Ok((config, text))
}

/// `p` from the current directory, as the daemon opens it.
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn user_name(uid: u32) -> String {
    User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

fn group_name(gid: u32) -> String {
    Group::from_gid(Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or_else(|| format!("{gid}"), |g| g.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn nobody() -> Who {
        Who {
            name: "nobody".into(),
            uid: Some(65534),
            gids: vec![65534],
        }
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_directory_the_account_cannot_search_is_named() {
        let nobody = nobody();
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let prog = private.join("server");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        chmod(&prog, 0o755);
        chmod(dir.path(), 0o755);
        chmod(&private, 0o700);
        let why = nobody.cannot_execute(prog.to_str().unwrap(), None).unwrap();
        assert!(
            why.contains(&format!(
                "{} is not searchable by nobody",
                private.display()
            )),
            "{why}"
        );
        chmod(&private, 0o755);
        assert_eq!(nobody.cannot_execute(prog.to_str().unwrap(), None), None);
        chmod(&prog, 0o700);
        assert!(nobody
            .cannot_execute("server", Some(private.to_str().unwrap()))
            .unwrap()
            .contains("mode 700"));
        // Not found at all: the spawn itself says so.
        assert_eq!(
            nobody.cannot_execute("no-such-program-anywhere", Some("/nonexistent")),
            None
        );
    }

    #[test]
    fn the_socket_needs_every_directory_searchable_and_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        chmod(dir.path(), 0o755);
        chmod(&run, 0o700);
        let sock = run.join("hearth.sock");
        let (root, nogroup) = (Uid::from_raw(0), Some(Gid::from_raw(65534)));
        let why = nobody().cannot_connect(&sock, root, nogroup).unwrap();
        assert!(
            why.contains(&format!("{} is not searchable by nobody", run.display())),
            "{why}"
        );
        chmod(&run, 0o755);
        assert_eq!(nobody().cannot_connect(&sock, root, nogroup), None);
        // Reachable, but the socket's group is another's.
        let why = nobody()
            .cannot_connect(&sock, root, Some(Gid::from_raw(0)))
            .unwrap();
        assert!(why.contains("is not in group"), "{why}");
        // The default account not made yet: its own new group is the socket's.
        assert_eq!(
            Who::to_be_made("hearth").cannot_connect(&sock, root, None),
            None
        );
    }
}
