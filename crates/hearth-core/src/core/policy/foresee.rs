//! The burst the recurrence foretells (`[model.scaling] forecast`), as the policy holds it:
//! the replicas its level needs, from one time-to-ready and a lead before it is due.

use std::time::Duration;

use super::recurrence::Period;
use super::{Autoscaler, Inputs};
use crate::core::capacity::{replicas_needed, ReplicaCapacity, WAIT_TAIL};

/// A foreseen burst's capacity is ordered this long before one time-to-ready ahead of its
/// earliest due second, at least: the decision, the spawn and the promotion take seconds too.
const FORESEE_LEAD: Duration = Duration::from_secs(10);

/// A burst foreseen: its period, the replicas its level needs, and when they are ordered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Foreseen {
    pub period: Period,
    /// Routed replicas the burst's level needs.
    pub need: u32,
    /// The second from which its capacity is held: one time-to-ready and a lead before the
    /// earliest it is due.
    pub from: u64,
    /// As of this second.
    pub now: u64,
}

impl Foreseen {
    /// Its capacity is being held now.
    pub fn holding(&self) -> bool {
        self.now >= self.from
    }

    /// "burst expected in 58 s: period 10m0s, seen 4 times".
    pub fn describe(&self) -> String {
        format!(
            "burst expected in {}: period {}, seen {} times",
            crate::units::short_duration(Duration::from_secs(
                self.period.earliest.saturating_sub(self.now)
            )),
            crate::units::short_duration(Duration::from_secs_f64(self.period.mean_s)),
            self.period.seen
        )
    }
}

impl Autoscaler {
    /// The burst the recurrence foretells, if `forecast` is on and a period holds.
    pub(super) fn foresee(&mut self, inp: &Inputs, cap: Option<ReplicaCapacity>) {
        self.foreseen = None;
        // The forecast is a way down as much as a way up: what it holds before a burst it
        // releases after. Under an operator's limits on the way down it could only add (held
        // before each burst, then stepped down slowly), so it is the policy's own rule's part.
        let s = inp.scaling;
        if !s.forecast
            || s.down_stabilization != crate::config::DownLimit::Auto
            || s.down_step != crate::config::DownLimit::Auto
        {
            return;
        }
        let Some(b) = self.demand.last().copied() else {
            return;
        };
        self.recurrence
            .observe(b.second, b.is_burst_rise(), b.smooth);
        let (Some(period), Some(cap)) = (self.recurrence.period(b.second), cap) else {
            return;
        };
        let target = s.target_wait.as_secs_f64();
        let lead = (self.ttr() + FORESEE_LEAD.max(self.ttr() / 4)).as_secs();
        self.foreseen = Some(Foreseen {
            period,
            need: replicas_needed(period.level, cap, target, WAIT_TAIL, inp.max),
            from: period.earliest.saturating_sub(lead),
            now: b.second,
        });
    }

    /// What the recurrence foretells now, for `status`.
    pub fn foreseen(&self) -> Option<Foreseen> {
        self.foreseen
    }
}
