//! Which containment this host gets, chosen once at start (the strongest it allows, or the one
//! `HEARTH_CONTAINMENT` forces) and said in one log line; the instance name every backend uses,
//! and the lock that keeps a second daemon of the same instance from starting.

use std::collections::BTreeMap;
use std::os::linux::net::SocketAddrExt;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use super::{cgroup, groups, scope, subtree, Backend, Containment, Mode};
use crate::agent::gpu_owner::CgroupIndex;

/// The default `state_dir`, whose instance is plain `hearth`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/hearth";
/// The name of this daemon's slice, subtree and lock: `hearth` for the default state_dir,
/// `hearth-` and 16 hex digits of the path's FNV-1a hash otherwise. Stable across builds and
/// compilers (unlike std's hasher): the next run of the same daemon must find the same names.
pub fn instance_for(state_dir: &Path) -> String {
    if state_dir == Path::new(DEFAULT_STATE_DIR) {
        return "hearth".to_string();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in state_dir.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("hearth-{h:016x}")
}

/// Forces a containment instead of the strongest the host allows: `scopes`, `cgroup` (the
/// daemon refuses to start without it) or `groups`; `auto` (the default) picks.
pub const CONTAINMENT_ENV: &str = "HEARTH_CONTAINMENT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Auto,
    Scopes,
    Cgroup,
    Groups,
}

impl Wanted {
    fn from_env() -> anyhow::Result<Wanted> {
        let v = std::env::var(CONTAINMENT_ENV).unwrap_or_default();
        Ok(match v.as_str() {
            "" | "auto" => Wanted::Auto,
            "scopes" => Wanted::Scopes,
            "cgroup" => Wanted::Cgroup,
            "groups" => Wanted::Groups,
            other => anyhow::bail!(
                "{CONTAINMENT_ENV}={other:?}: expected auto, scopes, cgroup or groups"
            ),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Wanted::Auto => "auto",
            Wanted::Scopes => "scopes",
            Wanted::Cgroup => "cgroup",
            Wanted::Groups => "groups",
        }
    }
}

impl Containment {
    /// Takes the instance lock and picks the containment this host allows.
    pub fn open(state_dir: &Path, runtime: tokio::runtime::Handle) -> anyhow::Result<Containment> {
        let instance = instance_for(state_dir);
        let lock = lock(&instance).map_err(|e| {
            anyhow::anyhow!(
                "another hearth daemon runs with state_dir {} (instance {instance}): {e}",
                state_dir.display()
            )
        })?;
        let mount = cgroup::mount();
        let wanted = Wanted::from_env()?;
        let mut why_not: Vec<String> = Vec::new();
        let backend = 'pick: {
            if matches!(wanted, Wanted::Auto | Wanted::Scopes) {
                if Path::new("/run/systemd/system").exists() {
                    match scope::Scopes::connect(runtime, &instance, mount.clone()) {
                        Ok(s) => break 'pick Backend::Scopes(s),
                        Err(e) => why_not.push(format!("systemd: {e}")),
                    }
                } else {
                    why_not.push("systemd is not PID 1".into());
                }
            }
            if matches!(wanted, Wanted::Auto | Wanted::Cgroup) {
                match &mount {
                    Some(m) => match subtree::Subtree::open(m, &instance) {
                        Ok(s) => break 'pick Backend::Subtree(s),
                        Err(e) => why_not.push(format!("cgroup2: {e}")),
                    },
                    None => why_not.push("no cgroup2 mount".into()),
                }
            }
            if !matches!(wanted, Wanted::Auto | Wanted::Groups) {
                anyhow::bail!(
                    "{CONTAINMENT_ENV}={} cannot be had here: {}",
                    wanted.name(),
                    why_not.join("; ")
                );
            }
            if wanted == Wanted::Groups {
                why_not.push(format!("{CONTAINMENT_ENV}=groups"));
            }
            Backend::Groups(groups::Groups::open()?)
        };
        let mode = match &backend {
            Backend::Scopes(_) => Mode::Scopes,
            Backend::Subtree(_) => Mode::Subtree,
            Backend::Groups(_) => Mode::Groups,
        };
        let c = Containment {
            mode,
            backend,
            instance,
            live: Mutex::new(BTreeMap::new()),
            spawning: AtomicUsize::new(0),
            gpu_owners: CgroupIndex::default(),
            _lock: lock,
        };
        tracing::info!("containment: {}", c.describe());
        if !why_not.is_empty() && mode != Mode::Scopes {
            tracing::info!("containment: not stronger because {}", why_not.join("; "));
        }
        Ok(c)
    }

    /// The one line the log says at start.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Scopes(s) => format!("systemd scopes under {}", s.slice),
            Backend::Subtree(s) => {
                let ctl = if s.controllers.is_empty() {
                    "no controllers: memory and CPU summed over processes".to_string()
                } else {
                    format!("controllers: {}", s.controllers.join(" "))
                };
                format!("cgroup2 subtree at {} ({ctl})", s.path().display())
            }
            Backend::Groups(_) => {
                "process groups + PDEATHSIG + subreaper (no writable cgroup2)".to_string()
            }
        }
    }
}

/// An abstract Unix socket named after the instance: bound while the daemon lives, released by
/// the kernel when it dies, whatever the file system (ProtectSystem=strict leaves little
/// writable).
fn lock(instance: &str) -> std::io::Result<std::os::unix::net::UnixListener> {
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(format!("hearth-instance/{instance}"))?;
    std::os::unix::net::UnixListener::bind_addr(&addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_is_hearth_for_the_default_state_dir_and_stable_otherwise() {
        assert_eq!(instance_for(Path::new("/var/lib/hearth")), "hearth");
        let a = instance_for(Path::new("/tmp/x/state"));
        assert_eq!(a, instance_for(Path::new("/tmp/x/state")));
        assert_ne!(a, instance_for(Path::new("/tmp/y/state")));
        // Fixed forever: the next run (maybe a newer build) must find the same cgroups.
        assert_eq!(
            instance_for(Path::new("/tmp/x/state")),
            "hearth-321b4a5233d7641a"
        );
        assert!(a.len() <= 64 && a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    }

    #[test]
    fn a_second_daemon_of_the_same_instance_is_refused() {
        let name = format!("test-{}", std::process::id());
        let first = lock(&name).unwrap();
        assert!(lock(&name).is_err());
        drop(first);
        assert!(lock(&name).is_ok());
    }
}
