//! The autoscaling policy: how many replicas should be routed, from the queue-wait signal.
//!
//! Up is fast and evaluated on every report: when the lightly smoothed oldest wait exceeds the
//! target, the routed count grows multiplicatively on wait ÷ target (damped, capped per step),
//! never below what Little's law says the measured arrival rate and backlog need — unless the
//! queue is already draining fast enough to clear within the target.
//! Down is slow: only after the window average of the wait has stayed below `down_below × target`
//! and the measured load fits in one replica fewer, for `down_stabilization`; then one replica per
//! `down_step`. Scaling up late costs queued requests; scaling down early costs a cold start.

use std::collections::VecDeque;
use std::time::Duration;

use super::capacity::{replicas_needed, ReplicaCapacity, WAIT_TAIL};
use super::signal::ModelSignal;
use super::Time;
use crate::config::ScalingConfig;

/// Time constant of the wait's smoothing on the way down.
const SMOOTHING: Duration = Duration::from_millis(500);
/// Share of the excess ratio acted on per step: wait at 3× target asks for 2× the replicas.
const DAMPING: f64 = 0.5;
/// After a scale-up, the next one waits this long, so the new capacity can show in the queue.
const UP_SETTLE: Duration = Duration::from_secs(2);
/// The arrival rate that sets the standing floor is averaged over this long.
const LOAD_WINDOW: Duration = Duration::from_secs(30);
/// Removing a replica must leave the rest with at most this share of arrivals waiting longer
/// than the target: stricter than the share scale-up sizes for, so the two do not flap.
const DOWN_WAIT_TAIL: f64 = WAIT_TAIL / 5.0;
/// How far back the queue's trend is read.
const TREND_SPAN: Duration = Duration::from_secs(2);
/// Evidence of per-replica throughput fades with this time constant.
const MU_MEMORY: Duration = Duration::from_secs(600);
/// Completions needed before the service time is trusted.
const MU_EVIDENCE: f64 = 20.0;
/// Cold starts remembered for time-to-ready.
const READY_TIMES: usize = 8;
/// The most requests one replica is taken to run at once, whatever a report says (vLLM's
/// `max_num_seqs` is 256 by default and 1,024 on the largest GPUs).
pub const MAX_SLOTS: u64 = 1024;
/// How long a peak of arrival-rate growth counts when sizing the automatic pool.
const GROWTH_MEMORY: Duration = Duration::from_secs(3600);
/// Growth of the arrival rate is measured over this span.
const GROWTH_SPAN: Duration = Duration::from_secs(60);

/// One second of signal, for window averages.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    second: u64,
    wait_sum: f64,
    wait_max: f64,
    depth_sum: f64,
    rate: Option<f64>,
    n: u32,
}

impl Bucket {
    fn wait(&self) -> f64 {
        self.wait_sum / self.n as f64
    }
    fn depth(&self) -> f64 {
        self.depth_sum / self.n as f64
    }
}

#[derive(Debug, Clone, Default)]
pub struct Autoscaler {
    smoothed: Option<(Time, f64)>,
    last_up: Option<Time>,
    last_down: Option<Time>,
    /// When the signal began (for the first stabilization window).
    first_seen: Option<Time>,
    buckets: VecDeque<Bucket>,
    /// Service time (s): busy slot-seconds over completions (Little's law on the requests
    /// running), both decaying with `MU_MEMORY`, so it follows a changing workload.
    service: Option<(Time, f64, f64)>,
    /// Requests one replica serves at once, as seen while it had a queue.
    slots: Option<u32>,
    /// The most requests seen running at once on one replica: a lower bound on `slots`.
    max_running: u32,
    /// Arrival rate per second, for growth.
    rates: VecDeque<(Time, f64)>,
    /// Peak growth of the arrival rate (requests/s per second) and when it was seen.
    peak_growth: Option<(Time, f64)>,
    time_to_ready: Option<Duration>,
    ready_times: VecDeque<Duration>,
    /// What the busiest second of the last `down_stabilization` needed, for the wait target.
    peak_need: Option<u32>,
    /// The wait has been over target since (this episode).
    over_since: Option<Time>,
    /// The model has shown no work since.
    idle_since: Option<Time>,
}

/// What the policy sees.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub now: Time,
    pub scaling: &'a ScalingConfig,
    pub min: u32,
    pub max: u32,
    pub signal: Option<ModelSignal>,
    /// Ready, routed replicas: the only capacity there is.
    pub routed: u32,
    /// What the policy asked for last.
    pub desired: u32,
    /// Warm replicas ready to be promoted.
    pub warm: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub to: u32,
    pub reason: String,
}

impl Autoscaler {
    /// A cold start finished after `d` (spawn → warm).
    pub fn observe_time_to_ready(&mut self, d: Duration) {
        self.ready_times.push_back(d);
        if self.ready_times.len() > READY_TIMES {
            self.ready_times.pop_front();
        }
        // Planning wants the slow case: the longest of the recent cold starts.
        self.time_to_ready = self.ready_times.iter().max().copied();
    }

    /// Routed replicas beyond what the busiest recent second needed (and one more): already
    /// serving, they are headroom as a warm replica would be, so the pool need not hold them too.
    pub fn spare_routed(&self, desired: u32) -> u32 {
        self.peak_need
            .map_or(0, |need| desired.saturating_sub(need + 1))
    }

    /// The warm pool `warm_pool = "auto"` asks for: enough to absorb the steepest recent growth
    /// of the arrival rate for as long as a cold start takes (the seed formula). One replica until
    /// there is data to size it.
    pub fn auto_pool(&self) -> u32 {
        match (
            self.peak_growth,
            self.time_to_ready,
            self.capacity().map(|c| c.mu),
        ) {
            (Some((_, growth)), Some(ttr), Some(mu)) => {
                ((growth * ttr.as_secs_f64()) / mu).ceil().max(1.0) as u32
            }
            _ => 1,
        }
    }

    /// A replica's report: what it runs at once while it has a queue is its slot count.
    pub fn observe_replica(&mut self, queue_depth: u64, in_flight: u64) {
        // Capped: the Erlang-C estimate costs O(replicas × slots), and a report may claim a
        // million at once; no model server runs more than `MAX_SLOTS` per replica.
        let running = in_flight.saturating_sub(queue_depth).min(MAX_SLOTS) as u32;
        self.max_running = self.max_running.max(running);
        if queue_depth > 0 {
            self.slots = Some(self.slots.map_or(running, |s| s.max(running)));
        }
    }

    /// A replica completed `done` requests over `busy` slot-seconds of running them.
    pub fn observe_served(&mut self, now: Time, done: u64, busy: f64) {
        let (done_sum, busy_sum) = match self.service {
            Some((at, d, b)) => {
                let keep = (-now.since(at).as_secs_f64() / MU_MEMORY.as_secs_f64()).exp();
                (d * keep + done as f64, b * keep + busy)
            }
            None => (done as f64, busy),
        };
        self.service = Some((now, done_sum, busy_sum));
    }

    /// Mean service time, once enough completions were seen to trust it.
    fn service_time(&self) -> Option<f64> {
        let (_, done, busy) = self.service?;
        (done >= MU_EVIDENCE && busy > 0.0).then(|| busy / done)
    }

    pub fn evaluate(&mut self, inp: &Inputs) -> Option<Decision> {
        let desired = inp.desired.clamp(inp.min, inp.max);
        if desired != inp.desired {
            return Some(Decision {
                to: desired,
                reason: format!("kept within min {} and max {}", inp.min, inp.max),
            });
        }
        // No fresh signal: hold. Silence is not calm.
        let sig = inp.signal?;
        let now = inp.now;
        self.first_seen.get_or_insert(now);
        let wait = self.smooth(now, sig.oldest_wait_ms);
        self.record(now, &sig, wait);
        self.peak_need = self.capacity().and_then(|cap| {
            let peak = self
                .window(now, inp.scaling.down_stabilization)
                .filter_map(|b| b.rate)
                .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))))?;
            let target = inp.scaling.target_wait.as_secs_f64();
            Some(replicas_needed(peak, cap, target, WAIT_TAIL, inp.max))
        });
        let target_ms = inp.scaling.target_wait.as_secs_f64() * 1000.0;
        let working =
            sig.in_flight > 0 || sig.queue_depth > 0 || sig.arrival_rate.is_some_and(|r| r > 0.0);
        if working {
            self.idle_since = None;
        } else {
            self.idle_since.get_or_insert(now);
        }

        // From zero: any sign of work starts (or promotes) a replica at once.
        if desired == 0 {
            if working || sig.oldest_wait_ms > 0.0 {
                let to = inp.min.max(1).min(inp.max);
                self.last_up = Some(now);
                return Some(Decision {
                    to,
                    reason: "work arrived for a model at zero".into(),
                });
            }
            return None;
        }

        if wait > target_ms {
            self.over_since.get_or_insert(now);
            return self.scale_up(inp, &sig, wait, target_ms, desired);
        }
        self.over_since = None;
        if let Some(d) = self.keep_up_with_arrivals(inp, &sig, desired) {
            return Some(d);
        }
        self.scale_down(inp, target_ms, desired)
    }

    /// Little's law as a standing floor: where rates are known, the routed count never falls
    /// short of what the arrival rate (averaged over `LOAD_WINDOW`, so noise does not ratchet
    /// the fleet up) needs for the wait target — before the wait shows the shortfall.
    fn keep_up_with_arrivals(
        &mut self,
        inp: &Inputs,
        sig: &ModelSignal,
        desired: u32,
    ) -> Option<Decision> {
        let now = inp.now;
        if desired >= inp.max
            || self
                .last_up
                .is_some_and(|t| now.since(t) < UP_SETTLE || sig.at <= t)
        {
            return None;
        }
        let cap = self.capacity()?;
        let lambda = self.recent_rate(now)?;
        let target = inp.scaling.target_wait.as_secs_f64();
        let need = replicas_needed(lambda, cap, target, WAIT_TAIL, inp.max);
        let to = need.min(desired + inp.scaling.max_up_step).min(inp.max);
        if to <= desired {
            return None;
        }
        self.last_up = Some(now);
        Some(Decision {
            to,
            reason: format!(
                "arrivals {lambda:.1}/s need {need} replicas to keep {:.0} % of waits under {} ({})",
                (1.0 - WAIT_TAIL) * 100.0,
                crate::units::short_duration(inp.scaling.target_wait),
                describe(cap)
            ),
        })
    }

    /// Fast attack, smoothed release: a rise counts at once (the report that shows the need
    /// should act), a fall is believed over `SMOOTHING`, so one quiet report does not read as calm.
    fn smooth(&mut self, now: Time, wait: f64) -> f64 {
        let s = match self.smoothed {
            Some((_, prev)) if wait >= prev => wait,
            Some((at, prev)) => {
                let dt = now.since(at).as_secs_f64();
                let alpha = 1.0 - (-dt / SMOOTHING.as_secs_f64()).exp();
                prev + alpha * (wait - prev)
            }
            None => wait,
        };
        self.smoothed = Some((now, s));
        s
    }

    fn record(&mut self, now: Time, sig: &ModelSignal, wait: f64) {
        let second = now.0.as_secs();
        match self.buckets.back_mut() {
            Some(b) if b.second == second => {
                b.wait_sum += wait;
                b.wait_max = b.wait_max.max(wait);
                b.depth_sum += sig.queue_depth as f64;
                b.rate = sig.arrival_rate.or(b.rate);
                b.n += 1;
            }
            _ => {
                self.buckets.push_back(Bucket {
                    second,
                    wait_sum: wait,
                    wait_max: wait,
                    depth_sum: sig.queue_depth as f64,
                    rate: sig.arrival_rate,
                    n: 1,
                });
                if let Some(rate) = sig.arrival_rate {
                    self.track_growth(now, rate);
                }
            }
        }
        // Keep what the longest window needs (down_stabilization is at most hours).
        while self.buckets.len() > 4 * 3600 {
            self.buckets.pop_front();
        }
    }

    fn track_growth(&mut self, now: Time, rate: f64) {
        self.rates.push_back((now, rate));
        while self
            .rates
            .front()
            .is_some_and(|(t, _)| now.since(*t) > GROWTH_SPAN)
        {
            self.rates.pop_front();
        }
        if let Some(&(t0, r0)) = self.rates.front() {
            let span = now.since(t0).as_secs_f64();
            if span >= GROWTH_SPAN.as_secs_f64() * 0.5 {
                let growth = (rate - r0) / span;
                let keep = self
                    .peak_growth
                    .filter(|(at, g)| now.since(*at) < GROWTH_MEMORY && *g >= growth);
                self.peak_growth = keep.or(Some((now, growth.max(0.0))));
            }
        }
    }

    /// Buckets within `span` of now.
    fn window(&self, now: Time, span: Duration) -> impl Iterator<Item = &Bucket> {
        let from = now.0.as_secs().saturating_sub(span.as_secs());
        // From the newest back: the window is short next to what is kept.
        self.buckets
            .iter()
            .rev()
            .take_while(move |b| b.second >= from)
    }

    fn scale_up(
        &mut self,
        inp: &Inputs,
        sig: &ModelSignal,
        wait: f64,
        target_ms: f64,
        desired: u32,
    ) -> Option<Decision> {
        let now = inp.now;
        if desired >= inp.max {
            return None;
        }
        if self
            .last_up
            .is_some_and(|t| now.since(t) < UP_SETTLE || sig.at <= t)
        {
            // Too soon for the last step to show, or no report since it: the evidence it acted
            // on must not be counted twice.
            return None;
        }
        let target_s = target_ms / 1000.0;
        // The trend guard: a queue that is already emptying fast enough needs no new replicas.
        // Within the target: none at all. Before a cold start could finish: no cold ones (they
        // would arrive after the work is done), but warm ones still shorten it.
        let mut warm_only = false;
        if let Some(clear_s) = self.clear_time(now, sig) {
            if clear_s <= target_s {
                return None;
            }
            let ttr = self.time_to_ready.unwrap_or_default().as_secs_f64();
            warm_only = clear_s <= ttr;
        }
        let ratio = wait / target_ms;
        // The wait law acts only when all the capacity asked for is serving: while cold
        // replicas are on their way the wait keeps growing for want of exactly them, and reading
        // that again would order the same capacity twice.
        let on_the_way = desired.saturating_sub(inp.routed);
        let by_wait = (on_the_way == 0).then(|| {
            let base = inp.routed.max(1) as f64;
            (base * (1.0 + DAMPING * (ratio - 1.0))).ceil() as u32
        });
        // More cold capacity while some is already on its way only once the shortfall has
        // outlasted an eighth of a cold start: a clump of seconds is over before any of it
        // could serve, and would leave it idle for a whole stabilization window.
        let lasted = self.over_since.map_or(0.0, |t| now.since(t).as_secs_f64());
        let ttr = self.time_to_ready.unwrap_or_default().as_secs_f64();
        let by_rate = if on_the_way > 0 && lasted < ttr / 8.0 {
            None
        } else {
            self.littles_floor(inp, sig)
        };
        let mut want = by_wait.unwrap_or(0).max(by_rate.unwrap_or(0));
        if warm_only {
            want = want.min(desired + inp.warm);
        }
        let capped = want.min(desired + inp.scaling.max_up_step).min(inp.max);
        if capped <= desired {
            return None;
        }
        self.last_up = Some(now);
        let mut reason = format!(
            "oldest wait {:.0} ms > target {:.0} ms (×{:.1})",
            wait, target_ms, ratio
        );
        if let Some(n) = by_rate {
            reason.push_str(&format!("; arrivals and backlog need {n} (Little's law)"));
        }
        if capped < want {
            reason.push_str(&format!(
                "; capped at +{} per step",
                inp.scaling.max_up_step
            ));
        }
        Some(Decision { to: capped, reason })
    }

    /// Little's law: the replicas that serve the arrival rate within the wait target, plus
    /// those that drain the backlog — as it will stand when new capacity is ready (it grows
    /// while the routed replicas fall short) — within one time-to-ready after that.
    fn littles_floor(&self, inp: &Inputs, sig: &ModelSignal) -> Option<u32> {
        let (lambda, cap) = (sig.arrival_rate?, self.capacity()?);
        // Over target, believe a rise at once, as the wait is.
        let lambda = lambda.max(sig.arrival_rate_recent.unwrap_or(0.0));
        let ttr = self.time_to_ready.unwrap_or_default().as_secs_f64();
        let target = inp.scaling.target_wait.as_secs_f64();
        let horizon = ttr.max(target);
        // What the routed replicas fall short of the arrivals, for as long as a cold start.
        let shortfall = (lambda - inp.routed as f64 * cap.mu).max(0.0);
        let backlog = sig.queue_depth as f64 + shortfall * ttr;
        Some(replicas_needed(
            lambda + backlog / horizon,
            cap,
            target,
            WAIT_TAIL,
            inp.max,
        ))
    }

    /// The arrival rate averaged over `LOAD_WINDOW`, once half of it has rates.
    fn recent_rate(&self, now: Time) -> Option<f64> {
        let rates: Vec<f64> = self
            .window(now, LOAD_WINDOW)
            .filter_map(|b| b.rate)
            .collect();
        let enough = rates.len() >= LOAD_WINDOW.as_secs() as usize / 2;
        enough.then(|| rates.iter().sum::<f64>() / rates.len() as f64)
    }

    /// What one replica can do, once measured: its slots (or, until it was seen saturated,
    /// the most it ran at once) over the service time.
    pub fn capacity(&self) -> Option<ReplicaCapacity> {
        let slots = self.slots.unwrap_or(self.max_running);
        if slots == 0 {
            return None;
        }
        let mu = slots as f64 / self.service_time()?;
        Some(ReplicaCapacity {
            mu,
            slots: self.slots,
        })
    }

    /// Seconds until the queue empties at its current rate of decline, if it is declining.
    fn clear_time(&self, now: Time, sig: &ModelSignal) -> Option<f64> {
        if sig.queue_depth == 0 {
            return Some(0.0);
        }
        let last = self.buckets.back()?;
        let earlier = self
            .buckets
            .iter()
            .rev()
            .find(|b| now.0.as_secs().saturating_sub(b.second) >= TREND_SPAN.as_secs())?;
        let dt = (last.second - earlier.second) as f64;
        let decline = (earlier.depth() - last.depth()) / dt;
        (decline > 0.0).then(|| sig.queue_depth as f64 / decline)
    }

    fn scale_down(&mut self, inp: &Inputs, target_ms: f64, desired: u32) -> Option<Decision> {
        let now = inp.now;
        let s = inp.scaling;
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
        // The calm must have lasted a whole window since the last scale-up (and since the signal
        // began), and a step since the last scale-down.
        let since = self.last_up.max(self.first_seen)?;
        if now.since(since) < s.down_stabilization {
            return None;
        }
        if self.last_down.is_some_and(|t| now.since(t) < s.down_step) {
            return None;
        }
        let window: Vec<&Bucket> = self.window(now, s.down_stabilization).collect();
        if window.is_empty() {
            return None;
        }
        let n = window.len() as f64;
        let avg_wait = window.iter().map(|b| b.wait()).sum::<f64>() / n;
        let calm_ms = s.down_below * target_ms;
        if avg_wait >= calm_ms || window.iter().any(|b| b.wait_max > target_ms) {
            return None;
        }
        // Not busy: the average load must fit in one replica fewer.
        let rates: Vec<f64> = window.iter().filter_map(|b| b.rate).collect();
        let fits = match (rates.is_empty(), self.capacity()) {
            (false, Some(cap)) => {
                // The window's average, or the standing floor's if that is higher: a step down
                // must never be one the floor would take back at once.
                let lambda = (rates.iter().sum::<f64>() / rates.len() as f64)
                    .max(self.recent_rate(now).unwrap_or(0.0));
                let target = s.target_wait.as_secs_f64();
                let need = replicas_needed(lambda, cap, target, DOWN_WAIT_TAIL, inp.max);
                (need < desired)
                    .then(|| format!("load {lambda:.1}/s needs {need} ({})", describe(cap)))
            }
            // Without rates, the queue must have been empty on average.
            _ => {
                let depth = window.iter().map(|b| b.depth()).sum::<f64>() / n;
                (depth < 0.5).then(|| "no queue".to_string())
            }
        };
        let fits = fits?;
        self.last_down = Some(now);
        Some(Decision {
            to: desired - 1,
            reason: format!(
                "calm for {}: average oldest wait {:.0} ms < {:.0} ms; {fits}",
                crate::units::short_duration(s.down_stabilization),
                avg_wait,
                calm_ms
            ),
        })
    }
}

fn describe(cap: ReplicaCapacity) -> String {
    match cap.slots {
        Some(k) => format!("{:.2}/s per replica, {k} at once", cap.mu),
        None => format!("{:.2}/s per replica", cap.mu),
    }
}
