//! The pure core: every decision hearth makes, as `Node::handle(event, now) -> Vec<Action>`.
//! Nothing here performs I/O, reads a clock or spawns anything; time comes in with each event.
//! The daemon and the simulator drive the same `Node`.
//!
//! A panic here would end the daemon's run (it re-executes and adopts its replicas, each
//! after a warm-up): the core is panic-free by construction — no `unwrap`/`expect`, no `[]` on maps or slices; absent entries
//! are `let … else` and `get`/`get_mut`.
#![deny(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
#![cfg_attr(
    test,
    allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)
)]

mod adopt;
#[cfg(test)]
mod adopt_found_tests;
mod adopt_roles;
#[cfg(test)]
mod adopt_tests;
#[cfg(test)]
mod autoscaler_tests;
mod capacity;
mod daemon_facts;
mod event;
mod exit;
mod fleet;
mod front_door;
#[cfg(test)]
mod front_door_tests;
pub mod front_doors;
mod gpu;
#[cfg(test)]
mod gpu_tests;
// The core under test (virtual time, a fake process table), for the core's tests and the
// shell's tests of what feeds it.
mod gpu_health;
#[cfg(test)]
mod harden_tests;
#[cfg(any(test, feature = "harness"))]
pub mod harness;
mod lifecycle;
mod model;
mod node;
mod overrides;
mod pending;
mod placement;
pub mod policy;
#[cfg(test)]
mod policy_tests;
mod ports;
mod prefetch;
mod probes;
mod process_facts;
#[cfg(test)]
mod process_facts_tests;
#[cfg(test)]
mod prop_tests;
mod queue_signal;
mod reclaim;
mod reconcile;
mod reload;
#[cfg(test)]
mod reload_tests;
mod replica;
mod requests;
mod reservations;
mod scrape;
mod scrape_error;
mod sleep;
#[cfg(test)]
mod sleep_evict_tests;
mod sleep_room;
#[cfg(test)]
mod sleep_room_tests;
mod sleep_sizing;
#[cfg(test)]
mod sleep_tests;
mod sleep_tier;
mod start_gates;
pub mod status;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod unavailable_tests;
pub mod xid;

pub use adopt::{Adoption, Ledger, ModelRecord, ReplicaRecord};
pub use event::{
    Action, ConfigReadError, Event, GpuProcess, GpuReading, LogLevel, NewConfig, Peer, ProbeKind,
    ProbeOutcome, ProbeSpec, QueueTime, Readiness, ReloadCause, RequestId, ScrapedQueue, SpawnSpec,
    StopSignal, Usage,
};
pub use exit::{signal_name, ExitStatus, SpawnError};
pub use gpu::{GpuDevice, GpuFault, Link, MigSlice, PeerLink};
pub use model::Overrides;
pub use node::Node;
pub use overrides::{check as check_overrides, OverridesError};
pub use replica::{ReplicaId, ReplicaState};
pub use scrape_error::ScrapeError;
pub use xid::RecoveryAction;

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, as the shell or the simulator reports it: the daemon passes wall-clock time
/// since the Unix epoch advanced by a monotonic clock; the simulator starts at zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Time(pub Duration);

impl Time {
    pub const ZERO: Time = Time(Duration::ZERO);

    pub fn from_millis(ms: u64) -> Time {
        Time(Duration::from_millis(ms))
    }
    pub fn from_secs_f64(s: f64) -> Time {
        Time(Duration::from_secs_f64(s))
    }
    pub fn as_millis(self) -> u64 {
        self.0.as_millis() as u64
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0.as_secs_f64()
    }
    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn since(self, earlier: Time) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    /// Saturating: a duration from the configuration (any a TOML number can say) added to now
    /// is "never", not a panic.
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(d))
    }
}
