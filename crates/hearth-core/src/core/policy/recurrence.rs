//! Recurring load foreseen (docs/autoscaling.md, "Recurring load"): the onsets of the bursts a
//! model has seen, the period they keep, and when the next one is due, so that its capacity can
//! be ready one time-to-ready before it instead of a cold start after it.
//!
//! Only onsets are kept (at most `ONSETS`, whatever the rate), so memory is bounded per model.
//! They outlive the daemon in its ledger ([`Remembered`]): the core's seconds are wall-clock
//! seconds, so a restart or an upgrade picks the period up where it was. A forecast needs
//! `EVIDENCE` intervals that agree within `SPREAD`; one whose burst does not come within its
//! window is dropped, and the late burst's interval disagrees with the others, so a period that
//! stopped holding is not believed again until it has held twice more. Bursts at irregular
//! intervals rarely agree twice running, and a phantom forecast costs one window's capacity.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Onsets remembered.
pub const ONSETS: usize = 8;
/// A rise within this many seconds of the last rising second belongs to the same burst.
const SAME_BURST_S: u64 = 30;
/// A burst's level is its highest smoothed arrival rate within this many seconds of its onset.
const LEVEL_SPAN_S: u64 = 60;
/// Intervals agree when the longest is at most this many times the shortest (a period with
/// ±20 % jitter gives up to 1.5).
const SPREAD: f64 = 1.6;
/// Agreeing intervals needed before a period is believed (onsets seen: one more).
const EVIDENCE: usize = 2;
/// Periods believed: from about two minutes to a day (and a little over, for a day's drift).
const MIN_PERIOD_S: u64 = 90;
const MAX_PERIOD_S: u64 = 26 * 3600;
/// The most intervals a period is judged on: the newest ones.
const JUDGED: usize = ONSETS - 1;

/// Levels above this (requests per second) are not believed from a saved ledger.
const MAX_LEVEL: f64 = 1e6;

/// One burst: the second it began and the level it reached.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Onset {
    pub at: u64,
    pub level: f64,
}

/// What a model's recurring bursts foretell as of one second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Period {
    /// The mean of the agreeing intervals, seconds.
    pub mean_s: f64,
    /// Onsets that agreed (one more than the intervals).
    pub seen: usize,
    /// The second the last burst began.
    pub last: u64,
    /// The second the next burst is due at the earliest (the last onset plus the shortest
    /// agreeing interval) and at the latest (plus the longest).
    pub earliest: u64,
    pub latest: u64,
    /// The level the agreeing bursts reached (the highest of them).
    pub level: f64,
}

/// The onsets a model has seen, newest last.
#[derive(Debug, Clone, Default)]
pub struct Recurrence {
    onsets: VecDeque<Onset>,
    last_rising: Option<u64>,
}

/// What a model's recurrence leaves for the next run of the daemon (in its ledger).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Remembered {
    /// Oldest first.
    #[serde(default)]
    pub onsets: Vec<Onset>,
    /// The last second demand rose as a burst does: a burst under way at a restart stays one
    /// burst.
    #[serde(default)]
    pub last_rising: Option<u64>,
}

impl Recurrence {
    /// What the next run needs; None when no burst has been seen.
    pub fn remembered(&self) -> Option<Remembered> {
        if self.onsets.is_empty() && self.last_rising.is_none() {
            return None;
        }
        Some(Remembered {
            onsets: self.onsets.iter().copied().collect(),
            last_rising: self.last_rising,
        })
    }

    /// Taken back from a saved ledger, which is read from disk and believed only as far as it
    /// is plausible at `now`: onsets in the future, out of order or with a level that is not a
    /// finite rate are dropped, and only the newest `ONSETS` are kept.
    pub fn restore(saved: &Remembered, now: u64) -> Recurrence {
        let mut onsets: VecDeque<Onset> = VecDeque::new();
        for o in saved.onsets.iter().rev().take(ONSETS) {
            let plausible = o.at <= now
                && o.level.is_finite()
                && (0.0..=MAX_LEVEL).contains(&o.level)
                && onsets.front().is_none_or(|newer| o.at < newer.at);
            if plausible {
                onsets.push_front(*o);
            }
        }
        Recurrence {
            onsets,
            last_rising: saved.last_rising.filter(|t| *t <= now),
        }
    }

    /// One second of demand: whether it rose as a burst does, and its smoothed arrival rate.
    pub fn observe(&mut self, second: u64, rising: bool, smooth: Option<f64>) {
        if rising {
            let same = self
                .last_rising
                .is_some_and(|t| second.saturating_sub(t) <= SAME_BURST_S);
            if !same {
                self.onsets.push_back(Onset {
                    at: second,
                    level: 0.0,
                });
                while self.onsets.len() > ONSETS {
                    self.onsets.pop_front();
                }
            }
            self.last_rising = Some(second);
        }
        let rate = smooth.filter(|r| r.is_finite()).unwrap_or(0.0);
        if let Some(o) = self
            .onsets
            .back_mut()
            .filter(|o| second.saturating_sub(o.at) <= LEVEL_SPAN_S)
        {
            o.level = o.level.max(rate);
        }
    }

    /// The period the newest intervals agree on, while its next burst can still come: none
    /// once the latest it was due at has passed by a quarter of a period.
    pub fn period(&self, now: u64) -> Option<Period> {
        let last = *self.onsets.back()?;
        let mut lo = u64::MAX;
        let mut hi = 0u64;
        let mut sum = 0u64;
        let mut n = 0usize;
        let newest: Vec<&Onset> = self.onsets.iter().rev().take(JUDGED + 1).collect();
        for (newer, older) in newest.iter().zip(newest.iter().skip(1)) {
            let gap = newer.at.saturating_sub(older.at);
            if !(MIN_PERIOD_S..=MAX_PERIOD_S).contains(&gap) {
                break;
            }
            let (l, h) = (lo.min(gap), hi.max(gap));
            if h as f64 > SPREAD * l as f64 {
                break;
            }
            (lo, hi, sum, n) = (l, h, sum + gap, n + 1);
        }
        if n < EVIDENCE {
            return None;
        }
        let mean_s = sum as f64 / n as f64;
        let latest = last.at + hi;
        if now > latest + (mean_s / 4.0) as u64 {
            return None;
        }
        // The highest the agreeing bursts reached: a burst met short costs a cold start of
        // misses, one met long costs a replica for its span.
        let level = newest
            .iter()
            .take(n + 1)
            .map(|o| o.level)
            .fold(0.0, f64::max);
        Some(Period {
            mean_s,
            seen: n + 1,
            last: last.at,
            earliest: last.at + lo,
            latest,
            level,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bursts at `onsets` (seconds), each rising for 5 s to `level` and lasting 60 s, on a base
    /// of 4/s, observed every second up to `until`.
    fn play(onsets: &[u64], level: f64, until: u64) -> Recurrence {
        let mut r = Recurrence::default();
        for s in 0..until {
            let in_burst = onsets.iter().any(|&o| s >= o && s < o + 60);
            let rising = onsets.iter().any(|&o| s >= o && s < o + 5);
            r.observe(s, rising, Some(if in_burst { level } else { 4.0 }));
        }
        r
    }

    #[test]
    fn bursts_every_ten_minutes_foretell_the_next() {
        let r = play(&[600, 1200, 1800], 20.0, 1900);
        let p = r.period(1900).expect("a period");
        assert_eq!((p.seen, p.earliest, p.latest), (3, 2400, 2400));
        assert_eq!(p.mean_s, 600.0);
        assert_eq!(p.level, 20.0);
        // Two onsets are one interval: not yet a period.
        assert_eq!(play(&[600, 1200], 20.0, 1300).period(1300), None);
    }

    #[test]
    fn jitter_widens_the_window_and_a_missed_burst_drops_the_forecast() {
        let r = play(&[600, 1080, 1680, 2160], 20.0, 2200);
        let p = r.period(2200).expect("a period");
        assert_eq!((p.earliest, p.latest, p.seen), (2160 + 480, 2160 + 600, 4));
        // Due by 2760 at the latest: a quarter period after that, no forecast.
        assert!(r.period(2760 + 100).is_some());
        assert_eq!(r.period(2760 + 140), None);
        // The burst that comes late disagrees with the others: not believed.
        let late = play(&[600, 1080, 1680, 2160, 3400], 20.0, 3500);
        assert_eq!(late.period(3500), None);
    }

    #[test]
    fn irregular_bursts_and_one_long_burst_foretell_nothing() {
        assert_eq!(play(&[600, 800, 1500, 1700], 20.0, 1800).period(1800), None);
        // A rise that goes on (a ramp seen as rising second after second) is one onset.
        let mut r = Recurrence::default();
        for s in 0..3000 {
            r.observe(s, true, Some(s as f64));
        }
        assert_eq!(r.onsets.len(), 1);
        assert_eq!(r.period(3000), None);
    }

    #[test]
    fn what_is_remembered_foretells_the_same_after_a_restart_and_bad_records_are_dropped() {
        let r = play(&[600, 1200, 1800], 20.0, 1900);
        let saved = r.remembered().expect("bursts were seen");
        let back = Recurrence::restore(&saved, 1950);
        assert_eq!(back.period(1950), r.period(1950));
        assert_eq!(back.last_rising, r.last_rising);
        // A burst under way at the restart is still one burst.
        let mut cont = Recurrence::restore(&saved, 1810);
        cont.observe(1810, true, Some(20.0));
        assert_eq!(cont.onsets.len(), 3);
        // Nothing seen: nothing to keep.
        assert_eq!(Recurrence::default().remembered(), None);
        // A corrupt or hostile file: too many onsets, some in the future, out of order, or
        // with levels that are not rates.
        let mut onsets: Vec<Onset> = (1..=100)
            .map(|k| Onset {
                at: k * 600,
                level: 20.0,
            })
            .collect();
        onsets.push(Onset {
            at: 1_000_000,
            level: 20.0,
        });
        onsets.insert(
            97,
            Onset {
                at: 10,
                level: 20.0,
            },
        );
        onsets[98].level = f64::NAN;
        onsets[99].level = -1.0;
        let hostile = Remembered {
            onsets,
            last_rising: Some(u64::MAX),
        };
        let back = Recurrence::restore(&hostile, 60_500);
        assert!(back.onsets.len() <= ONSETS);
        assert!(back
            .onsets
            .iter()
            .all(|o| o.at <= 60_500 && o.level.is_finite() && o.level >= 0.0));
        assert!(back
            .onsets
            .iter()
            .zip(back.onsets.iter().skip(1))
            .all(|(a, b)| a.at < b.at));
        assert_eq!(back.last_rising, None);
    }

    #[test]
    fn memory_is_bounded_whatever_the_bursts() {
        let onsets: Vec<u64> = (1..=40).map(|k| k * 300).collect();
        let r = play(&onsets, 20.0, 12_100);
        assert_eq!(r.onsets.len(), ONSETS);
        assert_eq!(r.onsets.front().map(|o| o.at), Some(33 * 300));
        assert!(r.period(12_100).is_some());
    }
}
