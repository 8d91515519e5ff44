//! What this host must provide ([`Checks::Host`]): each command's program. It is looked up the
//! way the spawn will look it up: a name with a slash as a path (relative to the current
//! directory), a bare name on the PATH the replica gets (its `env.PATH`, else the daemon's).
//! Then, when the shell answers ([`Config::load_on`]), what the replicas' accounts can reach:
//! the program and the control socket.
//!
//! [`Config::load_on`]: crate::config::Config::load_on
//! [`Checks::Host`]: crate::config::Checks::Host

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use super::{At, Cx, Marks, Res};
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

    /// What the replicas' accounts can reach, as the host answers (see [`Reach`]): each model's
    /// program, and the control socket for a model whose queue comes from the socket (a model
    /// with `[model.signal]` is read from its own metrics: its servers need not report).
    ///
    /// [`Reach`]: crate::config::Reach
    pub(super) fn reach(
        &self,
        socket: &Path,
        socket_at: At,
        models: &[ModelConfig],
        marks: &[Marks],
    ) -> Res<()> {
        let Some(reach) = self.reach else {
            return Ok(());
        };
        for (m, mark) in models.iter().zip(marks) {
            if let Some((program, search)) = program_of(m) {
                if let Some(why) = reach.program(m, &program, search.as_deref()) {
                    return Err(self.err(
                        &index(&join(&mark.key, "command"), 0),
                        mark.program.clone(),
                        why,
                    ));
                }
            }
            if m.signal.is_none() {
                if let Some(why) = reach.socket(m, socket) {
                    return Err(self.err("daemon.socket", socket_at.clone(), why));
                }
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

/// The model's program and the PATH its replicas get (None: the daemon's), as far as they are
/// known before a replica exists: None when a `{port}`, `{replica}` or `{gpus}` is in either.
fn program_of(m: &ModelConfig) -> Option<(String, Option<String>)> {
    let known_now = |s: &str| placeholders_in(s).iter().all(|p| *p == "model");
    let vars = Placeholders {
        model: m.name.clone(),
        ..Placeholders::default()
    };
    let program = m.launch.command.first()?;
    if !known_now(program) {
        return None;
    }
    let search = match m.launch.env.get("PATH") {
        Some(p) if known_now(p) => Some(expand(p, &vars)),
        Some(_) => return None,
        None => None,
    };
    Some((expand(program, &vars), search))
}

/// Ok when the model's program resolves, or when it cannot be known before a replica exists
/// (a `{port}`, `{replica}` or `{gpus}` in it or in `env.PATH`).
fn program_resolves(m: &ModelConfig) -> Result<(), String> {
    let Some((program, search)) = program_of(m) else {
        return Ok(());
    };
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
    let (search, whose): (OsString, &str) = match search {
        Some(p) => (p.into(), "this model's env.PATH"),
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
