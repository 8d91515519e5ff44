//! Where a replica that leaves the routed set goes to sleep and is back within the target
//! (docs/sleep.md, "The way down with a sleeping tier").
//!
//! Behind one shared queue (a front door's FIFO, reported model-wide), a replica woken takes
//! the oldest waiting work the moment it is routed. A step down that proves wrong then costs
//! the requests beyond capacity one wake of waiting, and the wake is shorter than the target:
//! holding replicas for a cold start's worth of peaks buys little that the tier does not give
//! for 1.6 % of the price (a vLLM level-1 sleeper's GPU share). So, for such a model:
//! - the envelope looks back `ENVELOPE_MIN`, not one cold start;
//! - the way down follows the highest need of the last `WINDOW`, in one step, with no
//!   `down_step` between steps;
//! - the backlog that a rise builds is counted over the wake, not a cold start, while there
//!   are replicas to wake.
//!
//! Behind per-replica queues (a router that commits each request to a replica), the work already
//! queued at the busy replicas does not move to the one woken, and misses pile up behind a wrong
//! step: with a one-minute window, 16 of 48 sampled sleep cells missed materially more. The slow way down stays there,
//! as it does where the wake is longer than the target or the operator set `down_*` limits.

use std::time::Duration;

use super::Inputs;
use crate::config::DownLimit;
use crate::core::queue_signal::ModelSignal;

/// The way down's window for such a model: the highest of its recommendations over the last
/// `WINDOW - ENVELOPE_MIN`, each the peak of the `ENVELOPE_MIN` before it. A wrong step costs
/// the requests that a rise beyond the routed set brings within one wake; on the bursty traces a
/// rise often comes back a minute or two after a fall. On the sleep grid behind the front door
/// (BENCHMARKS.md), a window of 1 minute missed more than the slow way down in 20 of the 222
/// cells where the wake fits the target, 2 minutes in 8, 3 minutes in none.
pub(super) const WINDOW: Duration = Duration::from_secs(180);

/// The measured wake (`Inputs::wake`), where a replica put to sleep is back within the target
/// behind a shared queue and no `down_*` limit is set.
pub(super) fn within_target(inp: &Inputs, sig: &ModelSignal) -> Option<Duration> {
    let wake = inp.wake?;
    let auto = inp.scaling.down_stabilization == DownLimit::Auto
        && inp.scaling.down_step == DownLimit::Auto;
    (auto && sig.shared_queue && wake <= inp.scaling.target_wait).then_some(wake)
}

/// What a decision's reason adds for it.
pub(super) fn describe(wake: Duration) -> String {
    format!(
        "; a replica leaving sleeps and is routed again within {} (p99 wake), so no more is held",
        crate::units::short_duration(wake)
    )
}

impl super::Autoscaler {
    /// How long the routed replicas fall short of a rise before new capacity serves: a wake
    /// where there are replicas to wake (sleeping or warm), else a cold start.
    pub(super) fn backlog_span(&self, inp: &Inputs, cold: Duration) -> Duration {
        match self.sleep_return {
            Some(wake) if inp.warm > 0 => wake.min(cold),
            _ => cold,
        }
    }
}
