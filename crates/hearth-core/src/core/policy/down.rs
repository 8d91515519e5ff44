//! The way down: one replica per `down_step` (`"auto"`: 2 minutes), along the envelope, once
//! the stabilization window (`"auto"`: 5 minutes) is calm. Scaling down early costs a cold start when the load comes back;
//! where it costs a wake within the target instead, straight down (`sleep_return`).

use std::time::Duration;

use super::{sleep_return, Autoscaler, Decision, Inputs};
use crate::config::DownLimit;
use crate::core::capacity::{replicas_needed, WAIT_TAIL};

/// Standard deviations of Poisson noise by which the newer half of the stabilization window's
/// arrival rate must exceed the older half before the load counts as rising.
const TREND_Z: f64 = 2.0;
/// `down_stabilization = "auto"`: the calm the policy waits for before a step down. An economic
/// rule (a hold tied to the time-to-ready, several replicas per step) was measured against this
/// one on the grid and not yet found better: BENCHMARKS.md, "The grid".
const AUTO_STABILIZATION: Duration = Duration::from_secs(300);
/// `down_step = "auto"`: one replica per this long.
const AUTO_STEP: Duration = Duration::from_secs(120);

/// What a limit means to the policy: "auto" is its own rule's figure.
fn limit(l: DownLimit, auto: Duration) -> Duration {
    match l {
        DownLimit::Auto => auto,
        DownLimit::AtLeast(d) => d,
    }
}

impl Autoscaler {
    /// Down along the envelope, HPA-style: one replica per `down_step`, once the highest
    /// recommendation covering the last `down_stabilization` of demand — each second's envelope
    /// need (which itself looks back one envelope span), and what served while the wait was over
    /// target — is below the routed count, and the wait is calm now. Without measured rates, only after a whole window with no queue on average.
    pub(super) fn scale_down(
        &mut self,
        inp: &Inputs,
        wait: f64,
        target_ms: f64,
        desired: u32,
    ) -> Option<Decision> {
        let now = inp.now;
        let s = inp.scaling;
        // Between foreseen bursts (`foresee` makes no forecast under an operator's limits):
        // once the envelope has seen the whole of the last burst's rise, and the next one's
        // capacity is due more than a time-to-ready from now, what the burst left follows the
        // envelope down with no `down_step` between decisions. Held, it would idle until the
        // next burst; released, it is started again in time.
        let span = self.envelope_span();
        let between = self.foreseen.filter(|f| {
            !f.holding()
                && f.now >= f.period.last + span.as_secs()
                && f.from.saturating_sub(f.now) > self.ttr().as_secs()
        });
        let asleep = self.sleep_return.filter(|_| between.is_none());
        let (stabilization, step) = match (between, asleep) {
            (Some(_), _) => (span, Duration::ZERO),
            (None, Some(_)) => (sleep_return::WINDOW, Duration::ZERO),
            (None, None) => (
                limit(s.down_stabilization, AUTO_STABILIZATION),
                limit(s.down_step, AUTO_STEP),
            ),
        };
        // Scale to zero: only after idle_to_zero with no work at all.
        if inp.min == 0 {
            if let Some(since) = self.idle_since {
                if now.since(since) >= s.idle_to_zero
                    && self.last_up.is_none_or(|t| now.since(t) >= s.idle_to_zero)
                {
                    self.last_down = Some(now);
                    return Some(Decision {
                        to: 0,
                        reason: format!(
                            "no work for {}",
                            crate::units::short_duration(s.idle_to_zero)
                        ),
                    });
                }
            }
        }
        let floor = inp.min.max(1);
        if desired <= floor || inp.routed < desired {
            return None;
        }
        // A whole window of signal since it began, and a step since the last scale-down.
        if self.first_seen.is_none_or(|t| now.since(t) < stabilization)
            || self.last_down.is_some_and(|t| now.since(t) < step)
        {
            return None;
        }
        let calm_ms = s.down_below * target_ms;
        if wait >= calm_ms {
            return None;
        }
        let window = stabilization;
        let mut to = desired - 1;
        let why = match self.envelope {
            Some((rate, _)) => {
                // Each second's envelope already looks back one envelope span: its needs over
                // the rest of the window cover `down_stabilization` of demand, no more. What
                // served while the wait was over target is remembered for the whole window.
                let highest = self
                    .demand
                    .peak_recommendation(
                        window
                            .saturating_sub(self.envelope_span())
                            .max(self.envelope_span()),
                    )
                    .max(self.demand.peak_trouble(window))
                    .max(self.foreseen_within_ttr());
                if highest >= desired {
                    return None;
                }
                // The window looks back; a rise that carries on looks forward. A replica stopped
                // while demand climbs back to it is a cold start soon after, and the wait pays
                // for it while that runs.
                if let Some(need) = self.rising_need(inp, rate, window, step) {
                    if need >= desired {
                        return None;
                    }
                }
                let mut why = format!(
                    "the highest need of the last {} is {highest} (arrivals now peak at {rate:.1}/s \
                     within {})",
                    crate::units::short_duration(window),
                    crate::units::short_duration(self.envelope_span())
                );
                if let Some(wake) = asleep {
                    to = highest.max(floor);
                    why.push_str(&sleep_return::describe(wake));
                }
                if let Some(f) = between {
                    to = highest.max(floor);
                    why.push_str(&format!("; {}: released until then", f.describe()));
                }
                why
            }
            None => {
                // Without rates: no second over target, and no queue on average.
                let (mut n, mut depth, mut over) = (0.0, 0.0, false);
                for b in self.demand.recent(window) {
                    n += 1.0;
                    depth += b.depth();
                    over |= b.wait_max > target_ms;
                }
                if n == 0.0
                    || over
                    || depth / n >= 0.5
                    || self.last_up.is_some_and(|t| now.since(t) < window)
                {
                    return None;
                }
                "no queue".to_string()
            }
        };
        self.last_down = Some(now);
        Some(Decision {
            to,
            reason: format!("calm: oldest wait {wait:.0} ms < {calm_ms:.0} ms; {why}"),
        })
    }

    /// What a burst foreseen needs once its capacity is due within one time-to-ready: a replica
    /// stopped now would have to start again before it could be back.
    fn foreseen_within_ttr(&self) -> u32 {
        self.foreseen
            .filter(|f| f.from.saturating_sub(f.now) <= self.ttr().as_secs())
            .map_or(0, |f| f.need)
    }

    /// Where the load rises through the stabilization window (its newer half's mean arrival
    /// rate above its older half's by more than `TREND_Z` deviations of Poisson noise), the
    /// replicas the envelope's `rate` needs once the rise has gone on until the next step down
    /// could follow this one.
    fn rising_need(
        &self,
        inp: &Inputs,
        rate: f64,
        window: Duration,
        step: Duration,
    ) -> Option<u32> {
        let half = window / 2;
        let newer = self.demand.mean_rate(Duration::ZERO, half)?;
        let older = self.demand.mean_rate(half, half)?;
        let h = half.as_secs_f64().max(1.0);
        let noise = ((newer + older) / h).sqrt();
        if newer - older <= TREND_Z * noise {
            return None;
        }
        let ahead = rate + (newer - older) / h * step.as_secs_f64();
        let target = inp.scaling.target_wait.as_secs_f64();
        Some(replicas_needed(
            ahead,
            self.capacity()?,
            target,
            WAIT_TAIL,
            inp.max,
        ))
    }
}
