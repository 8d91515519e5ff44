//! The model's demand, one entry per second: the arrival rate the policy sizes for, the wait and
//! queue it judges calm by, and the recommendation it made — with the windowed statistics the
//! policy reads: the envelope of recent peaks, how fast demand has risen within one
//! time-to-ready, the highest recommendation of the stabilization window.
//!
//! Every figure is bounded before it is kept, and the work per second is bounded by the windows
//! (at most `KEEP` seconds are kept), never by a value a reporter sent.

use std::collections::VecDeque;
use std::time::Duration;

use crate::core::queue_signal::ModelSignal;
use crate::core::Time;

/// Seconds of history kept: the longest window any setting can ask for.
pub const KEEP: usize = 4 * 3600;
/// Arrival rates above this (requests per second) are not believed.
const MAX_RATE: f64 = 1e6;
/// The window of the arrival rate the signal reports (`queue_signal::RATE_WINDOW`), seconds.
const RATE_WINDOW_S: f64 = 10.0;
/// The recent arrival rate's window (`queue_signal::RECENT_SPAN`), seconds.
pub const RECENT_WINDOW_S: f64 = 3.0;
/// Standard deviations of noise left on the envelope's peak (`Demand::peak_level`).
const PEAK_MARGIN_Z: f64 = 1.0;
/// Rises smaller than this many standard deviations of Poisson noise are not rises.
const NOISE_Z: f64 = 3.0;
/// A rise within one time-to-ready is a burst when it is at least this share of the level.
const BURST_SHARE: f64 = 0.25;

/// The steady arrival rate λ whose readings, over windows of `window_s` seconds, reach `peak`
/// at `z` standard deviations of Poisson noise: λ + z·√(λ ÷ window) = peak. A peak of noisy
/// readings overstates the level it came from; sizing for the peak itself would buy replicas
/// for noise.
pub fn level_under(peak: f64, z: f64, window_s: f64) -> f64 {
    // NaN and non-positive peaks stand for no level.
    if peak.is_nan() || peak <= 0.0 {
        return 0.0;
    }
    let b = z.max(0.0) / window_s.max(1e-3).sqrt();
    let root = (-b + (b * b + 4.0 * peak).sqrt()) / 2.0;
    (root * root).min(peak)
}

/// How many standard deviations of noise the highest of the readings over `span` stands above
/// a steady level: about √(2 ln n) for n independent readings of `RATE_WINDOW_S` each.
pub fn peak_noise_z(span: Duration) -> f64 {
    let n = (span.as_secs_f64() / RATE_WINDOW_S).max(1.0);
    (2.0 * n.ln()).sqrt()
}

/// One second of signal.
#[derive(Debug, Clone, Copy)]
pub struct Second {
    pub second: u64,
    pub wait_max: f64,
    depth_sum: f64,
    n: u32,
    /// Arrivals per second over the signal's rate window, when counters allow.
    pub rate: Option<f64>,
    /// How far the rate stood above its lowest of the preceding time-to-ready.
    pub rise: f64,
    /// The rate averaged over the sizing window (`record`'s `smooth`), when there are rates.
    pub smooth: Option<f64>,
    /// What the policy recommended during this second (the highest, if several).
    pub rec: u32,
    /// What it recommended while the wait was over target (the highest; 0 if it was not).
    pub trouble: u32,
}

impl Second {
    pub fn depth(&self) -> f64 {
        self.depth_sum / self.n as f64
    }

    /// It rose as a burst does: beyond noise, by a real share of the level it reached (not a
    /// ripple on a plateau or a slow ramp).
    pub fn is_burst_rise(&self) -> bool {
        self.rise > 0.0 && self.rise >= BURST_SHARE * self.rate.unwrap_or(0.0)
    }
}

fn bounded(rate: Option<f64>) -> Option<f64> {
    rate.filter(|r| r.is_finite())
        .map(|r| r.clamp(0.0, MAX_RATE))
}

#[derive(Debug, Clone, Default)]
pub struct Demand {
    seconds: VecDeque<Second>,
}

impl Demand {
    /// Records a signal seen at `now` (with the smoothed wait); true when it opens a new second.
    /// `ttr` is the time-to-ready the rise is measured over.
    pub fn record(
        &mut self,
        now: Time,
        sig: &ModelSignal,
        wait: f64,
        ttr: Duration,
        smooth: Duration,
    ) -> bool {
        let second = now.0.as_secs();
        let wait = if wait.is_finite() { wait.max(0.0) } else { 0.0 };
        let rate = bounded(sig.arrival_rate);
        if let Some(b) = self.seconds.back_mut().filter(|b| b.second == second) {
            b.wait_max = b.wait_max.max(wait);
            b.depth_sum += sig.queue_depth as f64;
            b.rate = rate.or(b.rate);
            b.n += 1;
            return false;
        }
        let rise = rate.map_or(0.0, |r| {
            let lowest = self
                .window(second, ttr)
                .filter_map(|b| b.rate)
                .fold(r, f64::min);
            // Less what Poisson noise alone explains: two rates over `RATE_WINDOW` differ by
            // about √(2λ/window) at random.
            let noise = NOISE_Z * (2.0 * r / RATE_WINDOW_S).sqrt();
            (r - lowest - noise).max(0.0)
        });
        let rec = self.seconds.back().map_or(0, |b| b.rec);
        let smoothed = rate.map(|r| {
            let (n, sum) = self
                .window(second, smooth)
                .filter_map(|b| b.rate)
                .fold((1.0, r), |(n, s), x| (n + 1.0, s + x));
            sum / n
        });
        self.seconds.push_back(Second {
            second,
            wait_max: wait,
            depth_sum: sig.queue_depth as f64,
            n: 1,
            rate,
            rise,
            smooth: smoothed,
            rec,
            trouble: 0,
        });
        while self.seconds.len() > KEEP {
            self.seconds.pop_front();
        }
        true
    }

    /// Seconds within `span` before `second` (inclusive), newest first.
    fn window(&self, second: u64, span: Duration) -> impl Iterator<Item = &Second> {
        let from = second.saturating_sub(span.as_secs());
        self.seconds
            .iter()
            .rev()
            .take_while(move |b| b.second >= from)
    }

    /// Seconds within `span` of the newest, newest first.
    pub fn recent(&self, span: Duration) -> impl Iterator<Item = &Second> {
        let last = self.seconds.back().map_or(0, |b| b.second);
        self.window(last, span)
    }

    pub fn last(&self) -> Option<&Second> {
        self.seconds.back()
    }

    /// The newest second at or before `second`.
    pub fn at_or_before(&self, second: u64) -> Option<&Second> {
        self.seconds.iter().rev().find(|b| b.second <= second)
    }

    /// The highest smoothed arrival rate within `span`, less what Poisson noise explains beyond
    /// one standard deviation: the level such a peak stands for (`level_under`), with one
    /// deviation kept as margin for readings that lag a rise by half their window.
    pub fn peak_level(&self, span: Duration) -> Option<f64> {
        self.peak_smooth(span).map(|p| {
            let z = (peak_noise_z(span) - PEAK_MARGIN_Z).max(0.0);
            level_under(p, z, RATE_WINDOW_S)
        })
    }

    /// The highest smoothed arrival rate within `span`.
    pub fn peak_smooth(&self, span: Duration) -> Option<f64> {
        self.recent(span)
            .filter_map(|b| b.smooth)
            .fold(None, |m, r| Some(m.map_or(r, |m: f64| m.max(r))))
    }

    /// The mean arrival rate over the `span` that ended `ago` before the newest second, once
    /// half of it has rates.
    pub fn mean_rate(&self, ago: Duration, span: Duration) -> Option<f64> {
        let last = self.seconds.back()?.second;
        let to = last.saturating_sub(ago.as_secs());
        let from = to.saturating_sub(span.as_secs());
        let (n, sum) = self
            .seconds
            .iter()
            .rev()
            .skip_while(|b| b.second > to)
            .take_while(|b| b.second > from)
            .filter_map(|b| b.rate)
            .fold((0usize, 0.0), |(n, s), r| (n + 1, s + r));
        (n > 0 && n as u64 * 2 >= span.as_secs()).then(|| sum / n as f64)
    }

    /// The level that demand has risen to, within one time-to-ready, at least twice within
    /// `memory`: `memory` is cut into slices of one time-to-ready (`ttr`); for two slices that
    /// do not touch, each with a rise (beyond noise), the lower of their peak rates; the highest
    /// such level. A single step or crowd does not count (it may never come again); bursts that
    /// recur do. None when nothing recurred.
    pub fn recurring_peak(&self, ttr: Duration, memory: Duration) -> Option<f64> {
        let width = ttr.as_secs().max(1);
        let last = self.seconds.back()?.second;
        // Per slice, newest first: the peak rate of the seconds that rose.
        let mut slices: Vec<f64> = Vec::new();
        for b in self.recent(memory) {
            let k = ((last - b.second) / width) as usize;
            if slices.len() <= k {
                slices.resize(k + 1, 0.0);
            }
            if b.is_burst_rise() {
                if let Some(s) = slices.get_mut(k) {
                    *s = s.max(b.rate.unwrap_or(0.0));
                }
            }
        }
        let mut best: Option<f64> = None;
        let mut before = 0.0f64;
        for (older, slice) in slices.iter().zip(slices.iter().skip(2)) {
            before = before.max(*older);
            let level = before.min(*slice);
            if level > 0.0 {
                best = Some(best.map_or(level, |b| b.max(level)));
            }
        }
        best
    }

    /// Notes what the policy recommends now (the highest of the second counts).
    pub fn recommend(&mut self, n: u32) {
        if let Some(b) = self.seconds.back_mut() {
            b.rec = b.rec.max(n);
        }
    }

    /// Notes what the policy recommends while the wait is over target: also a recommendation.
    pub fn recommend_in_trouble(&mut self, n: u32) {
        if let Some(b) = self.seconds.back_mut() {
            b.rec = b.rec.max(n);
            b.trouble = b.trouble.max(n);
        }
    }

    /// The highest recommendation made while the wait was over target, within `span`.
    pub fn peak_trouble(&self, span: Duration) -> u32 {
        self.recent(span).map(|b| b.trouble).max().unwrap_or(0)
    }

    /// Resets the current second's recommendation (a new second starts from nothing).
    pub fn set_recommendation(&mut self, n: u32) {
        if let Some(b) = self.seconds.back_mut() {
            b.rec = n;
        }
    }

    /// The highest recommendation within `span`.
    pub fn peak_recommendation(&self, span: Duration) -> u32 {
        self.recent(span).map(|b| b.rec).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_under_a_peak_is_the_rate_whose_noise_reaches_it() {
        for lambda in [0.5, 4.0, 24.0, 300.0] {
            for z in [0.0, 1.0, 2.0, 3.0] {
                let peak = lambda + z * (lambda / RATE_WINDOW_S).sqrt();
                let level = level_under(peak, z, RATE_WINDOW_S);
                assert!(
                    (level - lambda).abs() < 1e-9 * peak.max(1.0),
                    "{lambda} {z}"
                );
            }
        }
        // Never above the peak, rising with it; nothing for no peak.
        let mut prev = 0.0;
        for k in 1..200 {
            let peak = f64::from(k) * 0.37;
            let level = level_under(peak, 2.0, 3.0);
            assert!(level <= peak && level >= prev);
            prev = level;
        }
        for bad in [0.0, -5.0, f64::NAN, f64::NEG_INFINITY] {
            assert_eq!(level_under(bad, 2.0, 10.0), 0.0);
        }
        assert_eq!(level_under(f64::INFINITY, 2.0, 10.0), f64::INFINITY);
    }

    #[test]
    fn the_longer_the_span_the_more_noise_its_peak_holds() {
        assert_eq!(peak_noise_z(Duration::from_secs(5)), 0.0);
        assert_eq!(peak_noise_z(Duration::from_secs(10)), 0.0);
        let z60 = peak_noise_z(Duration::from_secs(60));
        let z240 = peak_noise_z(Duration::from_secs(240));
        assert!(z60 > 1.8 && z60 < 2.0, "{z60}");
        assert!(z240 > z60 && z240 < 2.6, "{z240}");
    }
}
