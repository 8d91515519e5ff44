//! What the oracle keeps between uses (oracle/mod.rs, step 3): how long a replica that exited may
//! stand in for a new one, awake or, where the model sleeps, asleep.

use super::engine::Params;
use super::{Us, SEC};

/// A replica is kept asleep between uses for at most this long.
const MAX_KEEP: Us = 26 * 3600 * SEC;

/// A replica that exited and may stand in for a new one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kept {
    pub exit: Us,
    pub unrouted: Us,
    pub id: u32,
    /// Counted against `max_asleep`: it may sleep, so it is kept for `keep`, not `keep_awake`.
    pub may_sleep: bool,
}

/// The longest a replica is kept between uses rather than stopped and started again, given
/// what it would cost. Awake, as long as a cold start and the promotion delay: what a new one
/// bills before it serves. Where the model has `[model.sleep]`, asleep as long as falling
/// asleep and waking (billed in full) and the sleep between (at its `asleep` charge) cost less than
/// that: the replay (oracle_replay.rs) puts every replica kept longer than a sleep and a wake
/// to sleep, so the oracle uses the sleeping tier as any policy may.
pub(super) fn keep(p: &Params) -> Us {
    let restart = p.cold_start + p.promotion;
    let round_trip = p.fall_asleep + p.wake;
    match p.asleep.map(|a| a.charge) {
        Some(c) if c < 1.0 && round_trip < restart => {
            let asleep = if c <= 0.0 {
                MAX_KEEP
            } else {
                round_trip.saturating_add(((restart - round_trip) as f64 / c) as Us)
            };
            restart.max(asleep.min(MAX_KEEP))
        }
        _ => restart,
    }
}
