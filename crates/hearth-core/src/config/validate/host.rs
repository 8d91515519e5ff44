//! What this host must provide ([`Checks::Host`]): each command's program, found the way the
//! spawn will look it up (a name with a slash as a path, relative to the current directory; a
//! bare name on the PATH the replica gets, its `env.PATH`, else the daemon's), and what the
//! replicas' accounts can reach: the program and the control socket. Only the host can answer;
//! the shell does, through [`Reach`] ([`Config::parse_on`]). Without it nothing here is checked.
//!
//! [`Config::parse_on`]: crate::config::Config::parse_on
//! [`Checks::Host`]: crate::config::Checks::Host
//! [`Reach`]: crate::config::Reach

use std::path::Path;

use super::{At, Cx, Marks, Res};
use crate::config::placeholders::{expand, placeholders_in, Placeholders};
use crate::config::raw::{index, join};
use crate::config::ModelConfig;

impl Cx<'_> {
    /// Each model's program, as the host finds it (see [`Reach::lookup`]), when it can be
    /// known before a replica exists (not when a `{port}`, `{replica}` or `{gpus}` names it).
    ///
    /// [`Reach::lookup`]: crate::config::Reach::lookup
    pub(super) fn host(&self, models: &[ModelConfig], marks: &[Marks]) -> Res<()> {
        let Some(reach) = self.reach else {
            return Ok(());
        };
        for (m, mark) in models.iter().zip(marks) {
            let Some((program, search)) = program_of(m) else {
                continue;
            };
            if let Some(why) = reach.lookup(&program, search.as_deref()) {
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
