//! Queue reports: what each replica (or a router, model-wide) last said, staleness, and the rates
//! that follow from the monotonic `arrived` / `completed` counters.

use std::collections::VecDeque;
use std::time::Duration;

use super::Time;
use crate::protocol::Report;

/// How far back counters are kept to estimate rates.
const RATE_WINDOW: Duration = Duration::from_secs(10);
/// Kept samples are at least this far apart (see `record`).
const MIN_SAMPLE_GAP: Duration = Duration::from_millis(100);
/// The recent arrival rate looks this far back.
const RECENT_SPAN: Duration = Duration::from_secs(3);
/// An arrival rate needs counters this far apart: shorter spans read sub-second clumps of a
/// bursty trace as sustained load.
const MIN_RATE_SPAN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at: Time,
    pub oldest_wait_ms: f64,
    pub queue_depth: u64,
    pub in_flight: u64,
    pub arrived: Option<u64>,
    pub completed: Option<u64>,
}

impl Sample {
    pub fn from_report(r: &Report, at: Time) -> Sample {
        Sample {
            at,
            oldest_wait_ms: r.oldest_wait_ms.unwrap_or(0.0).max(0.0),
            queue_depth: r.queue_depth.unwrap_or(0),
            in_flight: r.in_flight.unwrap_or(0),
            arrived: r.arrived,
            completed: r.completed,
        }
    }
}

/// One reporting source (a replica, or the model-wide router report).
#[derive(Debug, Clone, Default)]
pub struct ReplicaSignal {
    pub history: VecDeque<Sample>,
}

impl ReplicaSignal {
    /// Records a sample; returns the requests served and the busy slot-seconds (requests
    /// running, averaged over the interval, times its length) of the interval it closes: by
    /// Little's law their ratio is the service time. Requests served count the mean of those
    /// that finished and those that started (finished plus the change in running): while the
    /// running count falls, completions alone outnumber what the busy time paid for, and while
    /// it rises they fall short, so either alone would bias the service time through every
    /// change of load. Each interval is returned once.
    pub fn record(&mut self, s: Sample) -> Option<(f64, f64)> {
        let mut served = None;
        // A counter that went backwards means the reporter restarted: old deltas are meaningless.
        if let Some(last) = self.history.back() {
            let reset = matches!((last.arrived, s.arrived), (Some(a), Some(b)) if b < a)
                || matches!((last.completed, s.completed), (Some(a), Some(b)) if b < a);
            if reset {
                self.history.clear();
            } else if let (Some(a), Some(b)) = (last.completed, s.completed) {
                let running = |x: &Sample| x.in_flight.saturating_sub(x.queue_depth) as f64;
                let busy = (running(last) + running(&s)) / 2.0 * s.at.since(last.at).as_secs_f64();
                let done = (b - a) as f64;
                let started = (done + running(&s) - running(last)).max(0.0);
                served = Some(((done + started) / 2.0, busy));
            }
        }
        // Reports can come far faster than rates need: keep samples at least
        // `MIN_SAMPLE_GAP` apart by letting the newest replace the last until the gap is there,
        // so each report costs the same however many arrive.
        let close = (self.history.len().checked_sub(2))
            .and_then(|i| self.history.get(i))
            .is_some_and(|before| s.at.since(before.at) < MIN_SAMPLE_GAP);
        match self.history.back_mut() {
            Some(last) if close => *last = s,
            _ => self.history.push_back(s),
        }
        while let Some(first) = self.history.front() {
            if self.history.len() > 2 && s.at.since(first.at) > RATE_WINDOW {
                self.history.pop_front();
            } else {
                break;
            }
        }
        served
    }

    pub fn last(&self) -> Option<&Sample> {
        self.history.back()
    }

    pub fn fresh(&self, now: Time, stale_after: Duration) -> Option<&Sample> {
        self.last().filter(|s| now.since(s.at) <= stale_after)
    }

    /// Arrivals per second over the window.
    pub fn arrival_rate(&self) -> Option<f64> {
        let (n, from, to) = self.arrivals()?;
        let secs = to.since(from).as_secs_f64();
        (secs >= MIN_RATE_SPAN.as_secs_f64()).then(|| n as f64 / secs)
    }

    /// Arrivals counted over the window: how many, from when, to when.
    fn arrivals(&self) -> Option<(u64, Time, Time)> {
        self.arrivals_since(Time::ZERO)
    }

    /// Arrivals counted between the first sample at or after `from` and the last.
    fn arrivals_since(&self, from: Time) -> Option<(u64, Time, Time)> {
        let first = self
            .history
            .iter()
            .find(|s| s.arrived.is_some() && s.at >= from)?;
        let last = self.history.iter().rev().find(|s| s.arrived.is_some())?;
        Some((
            last.arrived?.saturating_sub(first.arrived?),
            first.at,
            last.at,
        ))
    }
}

/// The model's signal now: a fresh model-wide report wins; otherwise the max oldest wait and the
/// sums over the routed replicas with fresh reports.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelSignal {
    /// Newest report in use.
    pub at: Time,
    pub oldest_wait_ms: f64,
    pub queue_depth: u64,
    pub in_flight: u64,
    /// Arrivals/s, when counters allow.
    pub arrival_rate: Option<f64>,
    /// Arrivals/s over the last few seconds only: a step shows here first.
    pub arrival_rate_recent: Option<f64>,
    /// How many sources contributed.
    pub sources: u32,
    /// The queue is one model-wide FIFO (a router's report), not each replica's own: work
    /// waiting in it goes to whichever replica frees a slot first, one just woken included.
    pub shared_queue: bool,
}

impl ModelSignal {
    /// Requests wait or run: a queue, a wait, or work in flight (not a rate left from before).
    pub fn holds_work(&self) -> bool {
        self.queue_depth > 0 || self.in_flight > 0 || self.oldest_wait_ms > 0.0
    }

    pub fn combine<'a>(
        model_wide: &ReplicaSignal,
        routed: impl Iterator<Item = &'a ReplicaSignal>,
        now: Time,
        stale_after: Duration,
    ) -> Option<ModelSignal> {
        if let Some(s) = model_wide.fresh(now, stale_after) {
            return Some(ModelSignal {
                at: s.at,
                oldest_wait_ms: s.oldest_wait_ms,
                queue_depth: s.queue_depth,
                in_flight: s.in_flight,
                arrival_rate: model_wide.arrival_rate(),
                arrival_rate_recent: model_wide.arrivals_since(now - RECENT_SPAN).and_then(
                    |(n, from, to)| {
                        let secs = to.since(from).as_secs_f64();
                        (secs >= MIN_RATE_SPAN.as_secs_f64()).then(|| n as f64 / secs)
                    },
                ),
                sources: 1,
                shared_queue: true,
            });
        }
        let mut out: Option<ModelSignal> = None;
        let mut counting: Vec<&ReplicaSignal> = Vec::new();
        for sig in routed {
            let Some(s) = sig.fresh(now, stale_after) else {
                continue;
            };
            let o = out.get_or_insert(ModelSignal {
                at: s.at,
                ..Default::default()
            });
            o.at = o.at.max(s.at);
            o.oldest_wait_ms = o.oldest_wait_ms.max(s.oldest_wait_ms);
            o.queue_depth = o.queue_depth.saturating_add(s.queue_depth);
            o.in_flight = o.in_flight.saturating_add(s.in_flight);
            o.sources += 1;
            if sig.counted().is_some() {
                counting.push(sig);
            }
        }
        if let Some(o) = out.as_mut() {
            // Arrivals add up as counts over one window, not as rates: a replica routed a
            // second ago saw a second's worth of the model's arrivals, not a second's worth of
            // the rate. The window ends when every replica had last reported (replicas report
            // at their own moments; counting each to its own last report would undercount the
            // ones that have not reported yet this round) and each counter is read at its ends
            // by interpolation between reports.
            let end = counting
                .iter()
                .filter_map(|r| r.counted())
                .map(|c| c.1)
                .min();
            let rate = |span: Duration| -> Option<f64> {
                let end = end?;
                let from = end - span;
                let first = counting
                    .iter()
                    .filter_map(|r| r.counted())
                    .map(|c| c.0)
                    .min()?;
                let start = from.max(first);
                let secs = end.since(start).as_secs_f64();
                if secs < MIN_RATE_SPAN.as_secs_f64() {
                    return None;
                }
                let n: f64 = counting
                    .iter()
                    .filter_map(|r| Some(r.arrived_at(end)? - r.arrived_at(start)?))
                    .sum();
                Some(n / secs)
            };
            o.arrival_rate = rate(RATE_WINDOW);
            o.arrival_rate_recent = rate(RECENT_SPAN);
        }
        out
    }
}

impl ReplicaSignal {
    /// The first and last instants with an `arrived` counter.
    fn counted(&self) -> Option<(Time, Time)> {
        let first = self.history.iter().find(|s| s.arrived.is_some())?;
        let last = self.history.iter().rev().find(|s| s.arrived.is_some())?;
        Some((first.at, last.at))
    }

    /// The `arrived` counter at `t`, interpolated between reports (held at the ends).
    fn arrived_at(&self, t: Time) -> Option<f64> {
        let mut before: Option<&Sample> = None;
        for s in self.history.iter().filter(|s| s.arrived.is_some()) {
            if s.at >= t {
                let v = s.arrived? as f64;
                return Some(match before {
                    Some(b) if s.at > b.at => {
                        let bv = b.arrived? as f64;
                        let f = t.since(b.at).as_secs_f64() / s.at.since(b.at).as_secs_f64();
                        bv + (v - bv) * f
                    }
                    _ => v,
                });
            }
            before = Some(s);
        }
        before.and_then(|b| b.arrived).map(|v| v as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_ms: u64, wait: f64, depth: u64, arrived: u64, completed: u64) -> Sample {
        Sample {
            at: Time::from_millis(at_ms),
            oldest_wait_ms: wait,
            queue_depth: depth,
            in_flight: depth,
            arrived: Some(arrived),
            completed: Some(completed),
        }
    }

    #[test]
    fn rates_come_from_counter_deltas() {
        let mut sig = ReplicaSignal::default();
        // in_flight = depth here (see `s`): nothing counted as running, no busy time.
        assert_eq!(sig.record(s(0, 0.0, 2, 100, 50)), None);
        assert_eq!(sig.record(s(1000, 0.0, 3, 110, 58)), Some((8.0, 0.0)));
        let mut x = s(2000, 0.0, 4, 120, 66);
        x.in_flight = 12;
        assert_eq!(
            sig.record(x),
            Some((12.0, 4.0)),
            "8 done, 16 started (8 running at the end, 0 at the start): 12 served"
        );
        assert_eq!(sig.arrival_rate(), Some(10.0));
    }

    #[test]
    fn intervals_report_completions_and_busy_time() {
        let mut sig = ReplicaSignal::default();
        sig.record(s(0, 0.0, 0, 0, 0));
        assert_eq!(sig.record(s(1000, 0.0, 0, 1, 1)), Some((1.0, 0.0)));
    }

    #[test]
    fn a_counter_reset_restarts_the_window() {
        let mut sig = ReplicaSignal::default();
        sig.record(s(0, 0.0, 0, 500, 500));
        sig.record(s(1000, 0.0, 0, 3, 3));
        sig.record(s(2000, 0.0, 0, 5, 5));
        assert_eq!(
            sig.arrival_rate(),
            None,
            "one second of history is too short"
        );
        sig.record(s(3000, 0.0, 0, 7, 7));
        assert_eq!(sig.arrival_rate(), Some(2.0));
    }

    #[test]
    fn arrivals_add_up_as_counts_across_replicas_that_joined_at_different_times() {
        let mut old = ReplicaSignal::default();
        let mut new = ReplicaSignal::default();
        for t in 0..=10u64 {
            old.record(s(t * 1000, 0.0, 0, 10 * t, 0));
        }
        // Routed at 9 s: it took 10 arrivals in its one second.
        new.record(s(9000, 0.0, 0, 0, 0));
        new.record(s(10_000, 0.0, 0, 10, 0));
        let m = ModelSignal::combine(
            &ReplicaSignal::default(),
            [&old, &new].into_iter(),
            Time::from_millis(10_000),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(
            m.arrival_rate,
            Some(11.0),
            "110 arrivals in 10 s, not 10/s + 10/s"
        );
    }

    #[test]
    fn model_wide_report_wins_while_fresh_and_stale_reports_are_ignored() {
        let stale = Duration::from_secs(5);
        let mut wide = ReplicaSignal::default();
        let mut a = ReplicaSignal::default();
        let mut b = ReplicaSignal::default();
        a.record(s(9000, 300.0, 2, 0, 0));
        b.record(s(9500, 100.0, 1, 0, 0));
        let now = Time::from_millis(10_000);
        let m = ModelSignal::combine(&wide, [&a, &b].into_iter(), now, stale).unwrap();
        assert_eq!((m.oldest_wait_ms, m.queue_depth, m.sources), (300.0, 3, 2));
        wide.record(s(9900, 50.0, 7, 0, 0));
        let m = ModelSignal::combine(&wide, [&a, &b].into_iter(), now, stale).unwrap();
        assert_eq!((m.oldest_wait_ms, m.queue_depth), (50.0, 7));
        let later = Time::from_millis(30_000);
        assert!(ModelSignal::combine(&wide, [&a, &b].into_iter(), later, stale).is_none());
    }
}

#[cfg(test)]
mod flood_tests {
    use super::*;

    #[test]
    fn a_flood_of_reports_keeps_a_bounded_history_and_exact_counts() {
        let mut sig = ReplicaSignal::default();
        let mut done = 0.0;
        // 1000 reports a second for 20 s: one arrival and one completion each, 1 running.
        for i in 0..20_000u64 {
            let s = Sample {
                at: Time::from_millis(i),
                oldest_wait_ms: 0.0,
                queue_depth: 0,
                in_flight: 1,
                arrived: Some(i),
                completed: Some(i),
            };
            if let Some((d, _)) = sig.record(s) {
                done += d;
            }
        }
        assert!(sig.history.len() <= 110, "{}", sig.history.len());
        assert_eq!(done, 19_999.0, "every completion counted once");
        let rate = sig.arrival_rate().unwrap();
        assert!((rate - 1000.0).abs() < 1.0, "{rate}");
    }
}
