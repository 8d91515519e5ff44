//! Which account a model's server runs as. A daemon running as root never runs a server as root
//! unless the model says `user = "root"`: a model without `user` runs as the unprivileged
//! `hearth` account (systemd/hearth.sysusers), or as `nobody` where that account does not exist.
//! A daemon that is not root runs every server as itself (it could not switch anyway).

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, User};

/// The account a model without `user` runs as when the daemon is root.
pub const DEFAULT_ACCOUNT: &str = "hearth";
/// Where that account does not exist.
pub const FALLBACK_ACCOUNT: &str = "nobody";

#[derive(Debug, Clone)]
pub struct Accounts {
    /// None when the daemon is not root: servers run as the daemon's own user.
    default: Option<String>,
}

impl Accounts {
    /// Looks the default account up once, at start; warns if it has to fall back.
    pub fn resolve() -> Accounts {
        if !Uid::effective().is_root() {
            return Accounts { default: None };
        }
        if matches!(User::from_name(DEFAULT_ACCOUNT), Ok(Some(_))) {
            return Accounts {
                default: Some(DEFAULT_ACCOUNT.into()),
            };
        }
        tracing::warn!(
            "no account {DEFAULT_ACCOUNT:?}: models without `user` run as {FALLBACK_ACCOUNT:?}. Create it \
             with `systemd-sysusers systemd/hearth.sysusers` (installed as /usr/lib/sysusers.d/hearth.conf) \
             or `useradd --system --no-create-home --shell /usr/sbin/nologin {DEFAULT_ACCOUNT}`, then restart hearth"
        );
        Accounts {
            default: Some(FALLBACK_ACCOUNT.into()),
        }
    }

    /// Accounts as if the daemon ran as root with `default` as the default account (tests).
    pub fn with_default(default: Option<&str>) -> Accounts {
        Accounts {
            default: default.map(String::from),
        }
    }

    /// Lets replicas that run as the default account reach the control socket (0660), so that
    /// they can report for themselves: when the daemon runs as root with group root (no
    /// `Group=` as the unit sets), the socket's group becomes the default account's own group.
    /// Under the unit the socket is already root:hearth, the group of the `hearth` account.
    pub fn open_socket_to_replicas(&self, socket: &Path) {
        let Some(name) = &self.default else {
            return;
        };
        if Gid::effective().as_raw() != 0 {
            return;
        }
        let Ok(Some(user)) = User::from_name(name) else {
            return;
        };
        match nix::unistd::chown(socket, None, Some(user.gid)) {
            Ok(()) => tracing::info!(
                "{}: group set to {name}'s group (gid {}), so that replicas running as {name} can report for themselves",
                socket.display(),
                user.gid
            ),
            Err(e) => tracing::warn!(
                "{}: could not give it {name}'s group ({e}): replicas running as {name} cannot report on the socket",
                socket.display()
            ),
        }
    }

    /// The account a model's server runs as: its `user`, else the default (None: the daemon's
    /// own user). `defaulted` says which.
    pub fn user_for(&self, configured: Option<&str>) -> (Option<String>, bool) {
        match configured {
            Some(u) => (Some(u.to_string()), false),
            None => (self.default.clone(), self.default.is_some()),
        }
    }
}

/// Looked up before fork: a child between fork and exec may only make async-signal-safe calls.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
}

impl Credentials {
    pub fn of(user: &str) -> Result<Credentials, String> {
        let u = User::from_name(user)
            .map_err(|e| format!("looking up user {user:?}: {e}"))?
            .ok_or_else(|| format!("no user {user:?}"))?;
        let cname = CString::new(user).map_err(|_| "user name with a NUL byte".to_string())?;
        let groups = nix::unistd::getgrouplist(&cname, u.gid)
            .map_err(|e| format!("groups of {user:?}: {e}"))?;
        Ok(Credentials {
            name: user.to_string(),
            uid: u.uid,
            gid: u.gid,
            groups,
        })
    }

    /// The daemon already runs as exactly this account: nothing to switch.
    pub fn is_current(&self) -> bool {
        self.uid == Uid::effective() && self.gid == Gid::effective()
    }

    /// Why this account cannot execute `program`, found on `path` (the child's PATH) if it has
    /// no slash; None if it can. Goes by mode bits and ownership, as the kernel does without
    /// ACLs; root passes.
    pub fn cannot_execute(&self, program: &str, path: Option<&str>) -> Option<String> {
        if self.uid.is_root() {
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
            match self.blocked(&c) {
                None => return None,
                Some(why) => {
                    first_problem.get_or_insert(why);
                }
            }
        }
        first_problem
    }

    /// What stops this account from executing `file`: a directory on the way it may not search,
    /// or the file's own mode.
    fn blocked(&self, file: &Path) -> Option<String> {
        let absolute = if file.is_absolute() {
            file.to_path_buf()
        } else {
            std::env::current_dir().ok()?.join(file)
        };
        let mut dir = PathBuf::from("/");
        for part in absolute.parent()?.components().skip(1) {
            dir.push(part);
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            if !self.may(&meta, 0o1) {
                return Some(format!(
                    "{} cannot execute {}: {} is not searchable by {} (mode {:o})",
                    self.name,
                    absolute.display(),
                    dir.display(),
                    self.name,
                    meta.mode() & 0o7777
                ));
            }
        }
        let meta = std::fs::metadata(&absolute).ok()?;
        if !self.may(&meta, 0o1) {
            return Some(format!(
                "{} cannot execute {} (mode {:o}, owner uid {})",
                self.name,
                absolute.display(),
                meta.mode() & 0o7777,
                meta.uid()
            ));
        }
        None
    }

    /// Permission `bit` (1 = execute/search) for this account on a file.
    fn may(&self, meta: &std::fs::Metadata, bit: u32) -> bool {
        let mode = meta.mode();
        if meta.uid() == self.uid.as_raw() {
            mode & (bit << 6) != 0
        } else if meta.gid() == self.gid.as_raw()
            || self.groups.iter().any(|g| g.as_raw() == meta.gid())
        {
            mode & (bit << 3) != 0
        } else {
            mode & bit != 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn without_user_root_daemons_use_the_default_account_and_root_must_be_asked_for() {
        let a = Accounts::with_default(Some("hearth"));
        assert_eq!(a.user_for(None), (Some("hearth".into()), true));
        assert_eq!(a.user_for(Some("root")), (Some("root".into()), false));
        let own = Accounts::with_default(None);
        assert_eq!(own.user_for(None), (None, false));
    }

    #[test]
    fn a_directory_the_account_cannot_search_is_named() {
        let nobody = Credentials {
            name: "nobody".into(),
            uid: Uid::from_raw(65534),
            gid: Gid::from_raw(65534),
            groups: vec![],
        };
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let prog = private.join("server");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let why = nobody.cannot_execute(prog.to_str().unwrap(), None).unwrap();
        assert!(
            why.contains(&format!(
                "{} is not searchable by nobody",
                private.display()
            )),
            "{why}"
        );
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(nobody.cannot_execute(prog.to_str().unwrap(), None), None);
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o700)).unwrap();
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
}
