//! Reload and rollout tests of the core with virtual time, one file a question:
//! - `rollouts.rs`: what a changed configuration does to the replicas running (kept, rolled over,
//!   a rollout that halts and latches, configured back);
//! - `flow.rs`: who decides and when: the reload request, the read, the answer after the shell
//!   applied its part, bad files, refusals (role, shutdown), reads shared and unasked;
//! - `launch_identity.rs`: the launch spec, every field of it, and nothing else, rolls a model
//!   over.

use super::harness::{model, BASE};

mod flow;
mod launch_identity;
mod rollouts;

/// A configuration of one model `m` at `version` with the `[models.scaling]` lines `scaling`.
fn cfg(version: &str, scaling: &str) -> String {
    format!(
        "{BASE}{}",
        model("m", &format!("version = \"{version}\""), scaling)
    )
}
