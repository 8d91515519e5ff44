//! Which account a model's server runs as. A daemon running as root never runs a server as root
//! unless the model says `user = "root"`, nor as an account other processes share (`nobody`:
//! any process of it could take a replica's connected socket with pidfd_getfd and report as
//! the replica): a model without `user` runs as the unprivileged `hearth` account
//! (systemd/hearth.sysusers), which a root daemon creates at start if the host lacks it. A
//! daemon that is not root runs every server as itself (it could not switch anyway).

use std::ffi::CString;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Group, Uid, User};

use super::reach::Who;

/// Why an account could not be used or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountError {
    #[error("looking up user {user:?}: {error}")]
    Lookup { user: String, error: String },
    #[error("no user {0:?} on this host")]
    NoUser(String),
    #[error("user name with a NUL byte")]
    NulInName,
    #[error("groups of {user:?}: {error}")]
    Groups { user: String, error: String },
    #[error("the daemon is not root: it cannot start a server as {0:?}")]
    NotRoot(String),
    /// The default account is missing and the system's tools could not make it (their words).
    #[error(
        "no account {name:?}, which models without `user` run as, and creating it \
         failed: {why}. Create it with `systemd-sysusers systemd/hearth.sysusers` \
         (installed as /usr/lib/sysusers.d/hearth.conf) or `useradd --system \
         --user-group --no-create-home --home-dir / --shell /usr/sbin/nologin {name}`"
    )]
    NotCreated { name: String, why: String },
    #[error("no account {name:?}: {how} ran but the account is still missing")]
    StillMissing { name: String, how: String },
}

/// The account a model without `user` runs as when the daemon is root.
pub const DEFAULT_ACCOUNT: &str = "hearth";
/// The file that declares it, applied as installing it would.
const SYSUSERS: &str = include_str!("../../systemd/hearth.sysusers");
/// How long creating the account may take before it is given up.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Accounts {
    /// None when the daemon is not root: servers run as the daemon's own user.
    default: Option<String>,
}

impl Accounts {
    /// The accounts as this process would run models, without changing anything on the host:
    /// for `check-config`, the checks at start (before the default account is made) and
    /// reloads.
    pub fn lookup() -> Accounts {
        Accounts {
            default: Uid::effective()
                .is_root()
                .then(|| DEFAULT_ACCOUNT.to_string()),
        }
    }

    /// Accounts as if the daemon ran as root with `default` as the default account (tests).
    pub fn with_default(default: Option<&str>) -> Accounts {
        Accounts {
            default: default.map(String::from),
        }
    }

    /// Makes sure the default account exists where `config` has a model without `user` (a
    /// host whose models all name their account gets none): see `ensure_default`.
    pub fn ensure_for(
        &self,
        config: &crate::config::Config,
    ) -> Result<Option<String>, AccountError> {
        if config.models.iter().all(|m| m.launch.user.is_some()) {
            return Ok(None);
        }
        self.ensure_default()
    }

    /// Makes sure the default account exists, creating it where a root daemon finds none: as
    /// `systemd-sysusers` applies systemd/hearth.sysusers, or with `useradd --system` where
    /// that tool is absent. Returns what it did, for the log; an error if the account is still
    /// missing (models without `user` could not run: the daemon does not start).
    pub fn ensure_default(&self) -> Result<Option<String>, AccountError> {
        let Some(name) = &self.default else {
            return Ok(None);
        };
        if let Ok(Some(_)) = User::from_name(name) {
            return Ok(None);
        }
        let how = create(name);
        match (User::from_name(name), how) {
            (Ok(Some(u)), Ok(how)) => Ok(Some(format!(
                "no account {name:?}: created it with {how}, as systemd/hearth.sysusers \
                 declares it (uid {}, gid {}); models without `user` run as {name}",
                u.uid, u.gid
            ))),
            // Made meanwhile by someone else (another daemon starting beside this one).
            (Ok(Some(_)), Err(_)) => Ok(None),
            (_, Err(why)) => Err(AccountError::NotCreated {
                name: name.clone(),
                why,
            }),
            (_, Ok(how)) => Err(AccountError::StillMissing {
                name: name.clone(),
                how,
            }),
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

    /// The group the control socket has once bound: the default account's when the daemon
    /// runs as root with group root (`open_socket_to_replicas`), else the daemon's own. None:
    /// a group that does not exist yet, the default account's own, made with it.
    pub fn socket_group(&self) -> Option<Gid> {
        let own = Gid::effective();
        let Some(name) = self.default.as_deref().filter(|_| own.as_raw() == 0) else {
            return Some(own);
        };
        match User::from_name(name) {
            Ok(Some(u)) => Some(u.gid),
            _ => match Group::from_name(name) {
                Ok(Some(g)) => Some(g.gid),
                _ => None,
            },
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

    /// Who a model's replicas run as, for the checks of what they can reach: None when they
    /// run as the daemon's own user. The default account before it was made is an account of
    /// its own, with a group of its own: what every user may, it may.
    pub fn who(&self, configured: Option<&str>) -> Result<Option<Who>, AccountError> {
        let (user, defaulted) = self.user_for(configured);
        let Some(user) = user else {
            return Ok(None);
        };
        match Credentials::of(&user) {
            Ok(c) if self.default.is_none() && !c.is_current() => {
                Err(AccountError::NotRoot(user.to_string()))
            }
            Ok(c) => Ok(Some(Who::of(&c))),
            Err(_) if defaulted => Ok(Some(Who::to_be_made(&user))),
            Err(e) => Err(e),
        }
    }

    /// Why a model's replicas could not run `program` (found on `search` if it has no slash;
    /// None: the daemon's PATH), with what to do about it; None if they could. What the spawn
    /// says (supervisor.rs) and what `check-config` and the daemon's start refuse.
    pub fn cannot_run(
        &self,
        configured: Option<&str>,
        program: &str,
        search: Option<&str>,
    ) -> Option<String> {
        let who = match self.who(configured) {
            Ok(Some(w)) => w,
            Ok(None) => return None,
            Err(e) => return Some(e.to_string()),
        };
        let path = search
            .map(str::to_string)
            .or_else(|| std::env::var("PATH").ok());
        let why = who.cannot_execute(program, path.as_deref())?;
        let user = &who.name;
        let whose = if configured.is_none() {
            format!(
                "the model has no `user`, so it runs as {user:?}, the unprivileged default; give \
                 {user:?} access to the program (install it where {user:?} can reach it, e.g. \
                 `install -m 0755 PROGRAM /usr/local/bin/`), or set `user` in the model \
                 (`user = \"root\"` runs it as root)"
            )
        } else {
            format!("the model's `user` is {user:?}")
        };
        Some(format!("{why} ({whose})"))
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
    pub fn of(user: &str) -> Result<Credentials, AccountError> {
        let u = User::from_name(user)
            .map_err(|e| AccountError::Lookup {
                user: user.to_string(),
                error: e.to_string(),
            })?
            .ok_or_else(|| AccountError::NoUser(user.to_string()))?;
        let cname = CString::new(user).map_err(|_| AccountError::NulInName)?;
        let groups =
            nix::unistd::getgrouplist(&cname, u.gid).map_err(|e| AccountError::Groups {
                user: user.to_string(),
                error: e.to_string(),
            })?;
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
}

/// Creates the default account with the system's own tools; says which did it.
fn create(name: &str) -> Result<String, String> {
    let mut failures = Vec::new();
    if name == DEFAULT_ACCOUNT {
        let mut sysusers = Command::new("systemd-sysusers");
        sysusers.arg("-");
        match run_tool(&mut sysusers, Some(SYSUSERS)) {
            Ok(()) if matches!(User::from_name(name), Ok(Some(_))) => {
                return Ok("`systemd-sysusers -` (systemd/hearth.sysusers)".into())
            }
            Ok(()) => failures.push("systemd-sysusers made no such account".to_string()),
            Err(e) => failures.push(format!("systemd-sysusers: {e}")),
        }
    }
    let mut useradd = Command::new("useradd");
    useradd.args(["--system", "--no-create-home", "--home-dir", "/"]);
    useradd.args([
        "--shell",
        "/usr/sbin/nologin",
        "--comment",
        "hearth model servers",
    ]);
    // A group of the name left behind (the account removed without it) is the account's.
    if matches!(Group::from_name(name), Ok(Some(_))) {
        useradd.args(["--gid", name]);
    } else {
        useradd.arg("--user-group");
    }
    useradd.arg(name);
    match run_tool(&mut useradd, None) {
        Ok(()) => Ok(format!(
            "`useradd --system --user-group --no-create-home --home-dir / --shell \
             /usr/sbin/nologin {name}`"
        )),
        Err(e) => {
            failures.push(format!("useradd: {e}"));
            Err(failures.join("; "))
        }
    }
}

/// Runs a system tool to its end (at most `CREATE_TIMEOUT`), `input` on its stdin; its error
/// output is the error.
fn run_tool(cmd: &mut Command, input: Option<&str>) -> Result<(), String> {
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break status,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", CREATE_TIMEOUT.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = (&mut e).take(4096).read_to_string(&mut err);
    }
    Err(format!("{status}: {}", err.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_user_root_daemons_use_the_default_account_and_root_must_be_asked_for() {
        let a = Accounts::with_default(Some("hearth"));
        assert_eq!(a.user_for(None), (Some("hearth".into()), true));
        assert_eq!(a.user_for(Some("root")), (Some("root".into()), false));
        let own = Accounts::with_default(None);
        assert_eq!(own.user_for(None), (None, false));
    }

    #[test]
    fn the_default_account_before_it_exists_is_checked_as_a_stranger() {
        let a = Accounts::with_default(Some("hearth-test-account-that-is-not-there"));
        let who = a.who(None).unwrap().unwrap();
        assert_eq!(who.name, "hearth-test-account-that-is-not-there");
        // A named account that does not exist is an error, not a guess.
        let e = a
            .who(Some("hearth-test-no-such-user"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no user"), "{e}");
    }
}
