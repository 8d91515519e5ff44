//! What this host must provide ([`Checks::Host`]): each command's program. It is looked up the
//! way the spawn will look it up: a name with a slash as a path (relative to the current
//! directory), a bare name on the PATH the replica gets (its `env.PATH`, else the daemon's).
//!
//! [`Checks::Host`]: crate::config::Checks::Host

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use super::{Cx, Marks, Res};
use crate::config::placeholders::{expand, placeholders_in, Placeholders};
use crate::config::raw::{index, join};
use crate::config::ModelConfig;

/// glibc's search path when PATH is unset (`confstr(_CS_PATH)`), which the spawn then uses.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

impl Cx<'_> {
    pub(super) fn host(&self, models: &[ModelConfig], marks: &[Marks]) -> Res<()> {
        for (m, mark) in models.iter().zip(marks) {
            if let Err(why) = program_resolves(m) {
                return Err(self.err(
                    &index(&join(&mark.key, "command"), 0),
                    mark.program.clone(),
                    why,
                ));
            }
        }
        Ok(())
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

/// Ok when the model's program resolves, or when it cannot be known before a replica exists
/// (a `{port}`, `{replica}` or `{gpus}` in it or in `env.PATH`).
fn program_resolves(m: &ModelConfig) -> Result<(), String> {
    let known_now = |s: &str| placeholders_in(s).iter().all(|p| *p == "model");
    let vars = Placeholders {
        model: m.name.clone(),
        ..Placeholders::default()
    };
    let Some(program) = m.launch.command.first() else {
        return Ok(());
    };
    if !known_now(program) {
        return Ok(());
    }
    let program = expand(program, &vars);
    if program.contains('/') {
        let path = Path::new(&program);
        return match not_executable(path) {
            None => Ok(()),
            Some(why) if path.is_relative() => {
                let why = why.why();
                let cwd = std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|_| "?".into());
                Err(format!(
                    "{program:?} {why} (a relative path starts from the daemon's current \
                     directory, here {cwd}; give an absolute path)"
                ))
            }
            Some(why) => Err(format!("{program:?} {}", why.why())),
        };
    }
    let (search, whose): (OsString, &str) = match m.launch.env.get("PATH") {
        Some(p) if known_now(p) => (expand(p, &vars).into(), "this model's env.PATH"),
        Some(_) => return Ok(()),
        None => (
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
            "the PATH",
        ),
    };
    let mut refused: Option<(PathBuf, Unusable)> = None;
    for dir in std::env::split_paths(&search) {
        let candidate = dir.join(&program);
        match not_executable(&candidate) {
            None => return Ok(()),
            Some(Unusable::Missing) => {}
            Some(why) => {
                refused.get_or_insert((candidate, why));
            }
        }
    }
    let shown = search.to_string_lossy();
    Err(match refused {
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
