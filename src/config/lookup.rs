//! Whether the daemon can find and execute a model's program, looked up the way the spawn will
//! look it up: a name with a slash as a path (relative to the current directory), a bare name on
//! the PATH the replica gets (its `env.PATH`, else the daemon's). This is the host's half of
//! [`Checks::Host`]; the configuration asks it through [`Reach::lookup`].
//!
//! [`Checks::Host`]: hearth_core::config::Checks::Host
//! [`Reach::lookup`]: hearth_core::config::Reach::lookup

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use hearth_core::config::{ModelConfig, Reach};

/// glibc's search path when PATH is unset (`confstr(_CS_PATH)`), which the spawn then uses.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The daemon's own lookup and nothing else: for a check of the file on this host where no
/// account is known (the replicas' reach is `agent::reach`'s).
pub struct DaemonLookup;

impl Reach for DaemonLookup {
    fn lookup(&self, program: &str, search: Option<&str>) -> Option<String> {
        program_lookup(program, search)
    }
    fn program(&self, _: &ModelConfig, _: &str, _: Option<&str>) -> Option<String> {
        None
    }
    fn socket(&self, _: &ModelConfig, _: &Path) -> Option<String> {
        None
    }
}

/// Why a path cannot be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unusable {
    Missing,
    Directory,
    NotExecutable,
}

impl Unusable {
    fn why(self) -> &'static str {
        match self {
            Unusable::Missing => "does not exist",
            Unusable::Directory => "is a directory",
            Unusable::NotExecutable => "is not executable",
        }
    }
}

/// Why the file at `path` cannot be executed, if it cannot (symbolic links followed).
fn not_executable(path: &Path) -> Option<Unusable> {
    match std::fs::metadata(path) {
        Err(_) => Some(Unusable::Missing),
        Ok(meta) if meta.is_dir() => Some(Unusable::Directory),
        Ok(_) if access(path, AccessFlags::X_OK).is_err() => Some(Unusable::NotExecutable),
        Ok(_) => None,
    }
}

/// Why the daemon could not find and execute `program` (a path, or a name looked up on
/// `search`, the PATH the replica is given; None: the daemon's), if it could not.
pub fn program_lookup(program: &str, search: Option<&str>) -> Option<String> {
    if program.contains('/') {
        let path = Path::new(program);
        return match not_executable(path) {
            None => None,
            Some(why) if path.is_relative() => {
                let why = why.why();
                let cwd = std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|_| "?".into());
                Some(format!(
                    "{program:?} {why} (a relative path starts from the daemon's current \
                     directory, here {cwd}; give an absolute path)"
                ))
            }
            Some(why) => Some(format!("{program:?} {}", why.why())),
        };
    }
    let (search, whose): (OsString, &str) = match search {
        Some(p) => (p.into(), "this model's env.PATH"),
        None => (
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
            "the PATH",
        ),
    };
    let mut refused: Option<(PathBuf, Unusable)> = None;
    for dir in std::env::split_paths(&search) {
        let candidate = dir.join(program);
        match not_executable(&candidate) {
            None => return None,
            Some(Unusable::Missing) => {}
            Some(why) => {
                refused.get_or_insert((candidate, why));
            }
        }
    }
    let shown = search.to_string_lossy();
    Some(match refused {
        Some((path, why)) => format!(
            "{program:?} was found on {whose} as {}, which {}",
            path.display(),
            why.why()
        ),
        None => format!(
            "{program:?} is not on {whose} ({shown}); install it, give its absolute path, or \
             set env.PATH for this model (to check a file away from the host that will run \
             it: hearth check-config --no-binaries)"
        ),
    })
}
