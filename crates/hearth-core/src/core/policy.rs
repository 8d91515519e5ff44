//! The autoscaling policy: how many replicas should be routed, from the queue-wait signal.
//!
//! Up is fast and evaluated on every report: when the lightly smoothed oldest wait exceeds the
//! target, the routed count grows multiplicatively on wait ÷ target (damped, capped per step),
//! never below what Little's law says the measured arrival rate and backlog need — unless the
//! queue is already draining fast enough to clear within the target.
//! Down is slow: only after the window average of the wait has stayed below `down_below × target`
//! and the measured load fits in one replica fewer, for `down_stabilization`; then one replica per
//! `down_step`. Scaling up late costs queued requests; scaling down early costs a cold start.
//! Where a replica leaving sleeps and is back within the target behind a shared queue, an early
//! step costs one wake instead, and the policy holds for that (`sleep_return`).

mod demand;
mod down;
mod foresee;
pub mod recurrence;
mod sleep_return;

use std::collections::VecDeque;
use std::time::Duration;

use super::capacity::{replicas_needed, ReplicaCapacity, MAX_SLOTS, WAIT_TAIL};
use super::queue_signal::ModelSignal;
use super::Time;
use crate::config::ScalingConfig;
use demand::Demand;
pub use foresee::Foreseen;
use recurrence::Recurrence;

/// Time constant of the wait's smoothing on the way down.
const SMOOTHING: Duration = Duration::from_millis(500);
/// Share of the excess ratio acted on per step: wait at 3× target asks for 2× the replicas.
const DAMPING: f64 = 0.5;
/// After a scale-up, the next one waits this long, so the new capacity can show in the queue.
const UP_SETTLE: Duration = Duration::from_secs(2);
/// How far back the queue's trend is read.
const TREND_SPAN: Duration = Duration::from_secs(2);
/// Evidence of per-replica throughput fades with this time constant.
const MU_MEMORY: Duration = Duration::from_secs(600);
/// Completions needed before the service time is trusted.
const MU_EVIDENCE: f64 = 20.0;
/// Cold starts remembered for time-to-ready.
const READY_TIMES: usize = 8;
/// Until a cold start has been seen, the windows assume one takes this long.
const TTR_PRIOR: Duration = Duration::from_secs(60);

/// The envelope looks back one time-to-ready, and at least this far.
const ENVELOPE_MIN: Duration = Duration::from_secs(30);
/// How long a rise of demand within one time-to-ready is remembered for the pool.
const RISE_MEMORY: Duration = Duration::from_secs(1800);
/// The arrival rate the envelope sizes for is averaged over this long (one second of Poisson
/// noise is not a peak).
const RATE_SMOOTHING: Duration = Duration::from_secs(1);
/// Standard deviations of Poisson noise taken off the recent arrival rate before it counts as
/// a rise above the envelope.
const RECENT_Z: f64 = 2.0;
/// Standard deviations of noise taken off a recent rise that counts, to size for it.
const RISE_SIZE_Z: f64 = 0.5;
/// The backlog a rise builds while cold replicas start is drained within this share of a
/// time-to-ready after they are ready.
const BACKLOG_DRAIN_SHARE: f64 = 1.0 / 3.0;

#[derive(Debug, Clone, Default)]
pub struct Autoscaler {
    smoothed: Option<(Time, f64)>,
    last_up: Option<Time>,
    last_down: Option<Time>,
    /// When the signal began (for the first stabilization window).
    first_seen: Option<Time>,
    demand: Demand,
    /// Service time (s): busy slot-seconds over completions (Little's law on the requests
    /// running), both decaying with `MU_MEMORY`, so it follows a changing workload.
    service: Option<(Time, f64, f64)>,
    /// Requests one replica serves at once, as seen while it had a queue.
    slots: Option<u32>,
    /// The most requests seen running at once on one replica: a lower bound on `slots`.
    max_running: u32,
    time_to_ready: Option<Duration>,
    ready_times: VecDeque<Duration>,
    /// The envelope as of the latest second: the highest arrival rate within one
    /// time-to-ready, and the routed replicas it needs.
    envelope: Option<(f64, u32)>,
    /// Warm replicas beyond the envelope that the largest recent rise within one time-to-ready
    /// asks for.
    rise_pool: Option<u32>,
    /// The wait has been over target since (this episode).
    over_since: Option<Time>,
    /// The model has shown no work since.
    idle_since: Option<Time>,
    /// The bursts seen, and the period they keep (`[model.scaling] forecast`).
    recurrence: Recurrence,
    /// What the recurrence foretells as of the latest second.
    foreseen: Option<Foreseen>,
    /// As of the latest signal, what a replica put to sleep takes to be routed again, where
    /// that is within the target behind a shared queue (`sleep_return`).
    sleep_return: Option<Duration>,
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
    /// Where the model's pool is held asleep: how long a sleeping replica takes to be routed
    /// again (its measured wake and warm-up, the recent slow case).
    pub wake: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub to: u32,
    pub reason: String,
}

impl Autoscaler {
    /// How long the model has shown no work (as of its latest signal), if it shows none.
    pub fn idle_for(&self, now: Time) -> Option<Duration> {
        self.idle_since.map(|t| now.since(t))
    }

    /// A cold start finished after `d` (spawn → warm).
    /// The bursts seen, for the next run of the daemon (its ledger).
    pub fn remembered_bursts(&self) -> Option<recurrence::Remembered> {
        self.recurrence.remembered()
    }

    /// The bursts an earlier run saw, taken back at `now` (bounded: `Recurrence::restore`).
    pub fn restore_bursts(&mut self, saved: &recurrence::Remembered, now: Time) {
        self.recurrence = Recurrence::restore(saved, now.0.as_secs());
    }

    pub fn observe_time_to_ready(&mut self, d: Duration) {
        self.ready_times.push_back(d);
        if self.ready_times.len() > READY_TIMES {
            self.ready_times.pop_front();
        }
        // Planning wants the slow case: the longest of the recent cold starts.
        self.time_to_ready = self.ready_times.iter().max().copied();
    }

    /// Routed replicas beyond what the envelope of recent peaks needs: already serving, they
    /// are headroom as a warm replica would be, so the pool need not hold them too.
    pub fn spare_routed(&self, desired: u32) -> u32 {
        self.envelope
            .map_or(0, |(_, need)| desired.saturating_sub(need))
    }

    /// The warm pool `warm_pool = "auto"` asks for: the replicas that the largest rise of the
    /// arrival rate within one time-to-ready, seen lately, would need beyond the envelope (the
    /// seed formula, read off the model's own history). Nothing while load is steady; one
    /// replica until there is data to size it.
    pub fn auto_pool(&self) -> u32 {
        self.rise_pool.unwrap_or(1)
    }

    fn ttr(&self) -> Duration {
        self.time_to_ready.unwrap_or(TTR_PRIOR)
    }

    /// How far back the envelope looks: one time-to-ready, and at least `envelope_min()`.
    fn envelope_span(&self) -> Duration {
        match self.sleep_return {
            Some(_) => ENVELOPE_MIN,
            None => self.ttr().max(ENVELOPE_MIN),
        }
    }

    /// A replica's report: what it runs at once while it has a queue is its slot count.
    pub fn observe_replica(&mut self, queue_depth: u64, in_flight: u64) {
        // Believed only up to MAX_SLOTS: sizing must cost the same whatever a reporter claims.
        let running = in_flight
            .saturating_sub(queue_depth)
            .min(u64::from(MAX_SLOTS)) as u32;
        self.max_running = self.max_running.max(running);
        if queue_depth > 0 {
            self.slots = Some(self.slots.map_or(running, |s| s.max(running)));
        }
    }

    /// A replica completed `done` requests over `busy` slot-seconds of running them.
    pub fn observe_served(&mut self, now: Time, done: f64, busy: f64) {
        let (done_sum, busy_sum) = match self.service {
            Some((at, d, b)) => {
                let keep = (-now.since(at).as_secs_f64() / MU_MEMORY.as_secs_f64()).exp();
                (d * keep + done, b * keep + busy)
            }
            None => (done, busy),
        };
        self.service = Some((now, done_sum, busy_sum));
    }

    /// Mean service time, once enough completions were seen to trust it.
    fn service_time(&self) -> Option<f64> {
        let (_, done, busy) = self.service?;
        // Bounded: counters that jump by absurd amounts cannot make capacity infinite or zero.
        (done >= MU_EVIDENCE && busy > 0.0).then(|| (busy / done).clamp(1e-3, 3600.0))
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
        self.sleep_return = sleep_return::within_target(inp, &sig);
        let now = inp.now;
        self.first_seen.get_or_insert(now);
        let wait = self.smooth(now, sig.oldest_wait_ms);
        if self
            .demand
            .record(now, &sig, wait, self.ttr(), RATE_SMOOTHING)
        {
            self.refresh(inp);
        }
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
            // In trouble: what serves now is the least the window should remember.
            self.demand.recommend_in_trouble(desired);
            let d = self.scale_up(inp, &sig, wait, target_ms, desired);
            if let Some(d) = &d {
                self.demand.recommend_in_trouble(d.to);
            }
            return d;
        }
        self.over_since = None;
        if let Some(d) = self.follow_envelope(inp, &sig, desired) {
            self.demand.recommend(d.to);
            return Some(d);
        }
        self.scale_down(inp, wait, target_ms, desired)
    }

    /// Once a second: the envelope of recent peaks and the pool the recent rises ask for.
    fn refresh(&mut self, inp: &Inputs) {
        let target = inp.scaling.target_wait.as_secs_f64();
        let cap = self.capacity();
        let peak = self.demand.peak_level(self.envelope_span());
        let size_rate = match (peak, self.forecast()) {
            (Some(p), Some(f)) => Some(p.max(f)),
            (p, _) => p,
        };
        self.envelope = match (cap, size_rate) {
            (Some(cap), Some(rate)) => {
                Some((rate, replicas_needed(rate, cap, target, WAIT_TAIL, inp.max)))
            }
            _ => None,
        };
        let now_rate = self.demand.last().and_then(|b| b.rate);
        self.rise_pool = match (cap, now_rate, self.envelope) {
            (Some(cap), Some(_), Some((_, need))) => {
                let back = self.demand.recurring_peak(self.ttr(), RISE_MEMORY);
                let with_rise = back.map_or(0, |level| {
                    replicas_needed(level, cap, target, WAIT_TAIL, inp.max)
                });
                Some(with_rise.saturating_sub(need))
            }
            _ => None,
        };
        self.foresee(inp, cap);
        let foreseen = self.foreseen.filter(|f| f.holding()).map_or(0, |f| f.need);
        self.demand
            .set_recommendation(self.envelope.map_or(0, |(_, need)| need).max(foreseen));
    }

    /// The arrival rate one time-to-ready ahead if it keeps rising as it has lately: the mean of
    /// the last half time-to-ready plus the slope that the two halves before agree on (the
    /// smaller of the two rises), carried over a whole time-to-ready. A ramp has a slope; a
    /// step or a burst does not (it rose in one half only), and a fall has none.
    fn forecast(&self) -> Option<f64> {
        let half = (self.ttr() / 2).max(Duration::from_secs(15));
        let m2 = self.demand.mean_rate(Duration::ZERO, half)?;
        let m1 = self.demand.mean_rate(half, half)?;
        let m0 = self.demand.mean_rate(half * 2, half)?;
        let slope = (m2 - m1).min(m1 - m0).max(0.0) / half.as_secs_f64();
        Some(m2 + slope * self.ttr().as_secs_f64())
    }

    /// Up to what the envelope of recent peaks needs, before the wait shows a shortfall: the
    /// demand that came within the last time-to-ready can come again before a cold replica
    /// could be ready for it.
    fn follow_envelope(
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
        let (mut rate, mut need) = self.envelope?;
        let mut backlog = 0.0;
        let cap = self.capacity()?;
        // A rise seen in the last seconds counts at once: it is the peak the envelope will hold.
        // It is a rise when it stands two standard deviations of its noise above the envelope
        // (a blip of three seconds is not); it is then sized at its reading less half a
        // standard deviation. Sized at the test's bound, a true step of 4 → 16/s read as 12/s,
        // and the capacity it ordered fell short for a whole cold start.
        if let Some(raw) = sig
            .arrival_rate_recent
            .filter(|r| r.is_finite())
            .filter(|&r| demand::level_under(r, RECENT_Z, demand::RECENT_WINDOW_S) > rate)
        {
            let r = demand::level_under(raw, RISE_SIZE_Z, demand::RECENT_WINDOW_S);
            let target = inp.scaling.target_wait.as_secs_f64();
            // What the routed replicas fall short of it piles up until cold replicas are ready;
            // every request queued behind that backlog waits over target until it is gone (a
            // replica's queue is committed), so it is drained within a share of a cold start.
            let ttr = self.backlog_span(inp, self.ttr()).as_secs_f64();
            let shortfall = (r - f64::from(inp.routed) * cap.mu).max(0.0);
            backlog = shortfall * ttr;
            let drain = (ttr * BACKLOG_DRAIN_SHARE).max(target);
            let size = r + backlog / drain;
            (rate, need) = (r, replicas_needed(size, cap, target, WAIT_TAIL, inp.max));
        }
        let foreseen = self
            .foreseen
            .filter(|f| f.holding() && f.need > need && f.need > desired);
        if let Some(f) = foreseen {
            let to = f.need.min(desired + inp.scaling.max_up_step).min(inp.max);
            self.last_up = Some(now);
            let mut reason = format!(
                "{}: {} replicas for its {:.1}/s, ready before it ({})",
                f.describe(),
                f.need,
                f.period.level,
                describe(cap)
            );
            reason.push_str(&capped(f.need, to, desired, inp));
            return Some(Decision { to, reason });
        }
        let to = need.min(desired + inp.scaling.max_up_step).min(inp.max);
        if to <= desired {
            return None;
        }
        self.last_up = Some(now);
        let mut reason = format!(
            "arrivals peaked at {rate:.1}/s within the last {}: {need} replicas keep {:.0} % of \
             waits under {} ({})",
            crate::units::short_duration(self.envelope_span()),
            (1.0 - WAIT_TAIL) * 100.0,
            crate::units::short_duration(inp.scaling.target_wait),
            describe(cap)
        );
        if backlog >= 1.0 {
            reason.push_str(&format!(
                ", and drain the {backlog:.0} that queue meanwhile within {}",
                crate::units::short_duration(Duration::from_secs_f64(
                    (self.ttr().as_secs_f64() * BACKLOG_DRAIN_SHARE)
                        .max(inp.scaling.target_wait.as_secs_f64())
                ))
            ));
        }
        reason.push_str(&capped(need, to, desired, inp));
        Some(Decision { to, reason })
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
        let clump = on_the_way > 0 && lasted < ttr / 8.0;
        let by_rate = if clump {
            None
        } else {
            self.littles_floor(inp, sig)
        };
        // The envelope is read off the same arrivals: the same rule.
        let by_envelope = self.envelope.filter(|_| !clump).map(|(_, need)| need);
        // Before the service time is known: every request in flight a slot, as Cortex sizes.
        // Like the wait, the count in flight grows for want of capacity already ordered, but
        // it is the only measure of demand there is yet: read once a shortfall has outlasted
        // an eighth of a cold start (the prior's, before one was seen), as the rate is. Blind
        // for a whole cold start, a model that starts under load builds a backlog it drains
        // for many minutes.
        let early = on_the_way > 0 && lasted < self.ttr().as_secs_f64() / 8.0;
        let by_in_flight = (self.capacity().is_none() && !early).then(|| {
            let slots = self.slots.unwrap_or(self.max_running).max(1);
            sig.in_flight
                .div_ceil(u64::from(slots))
                .min(u64::from(inp.max)) as u32
        });
        let mut want = by_wait
            .unwrap_or(0)
            .max(by_rate.unwrap_or(0))
            .max(by_envelope.unwrap_or(0))
            .max(by_in_flight.unwrap_or(0));
        if warm_only {
            want = want.min(desired + inp.warm);
        }
        let to = want.min(desired + inp.scaling.max_up_step).min(inp.max);
        if to <= desired {
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
        if let Some(n) = by_in_flight.filter(|&n| n > desired) {
            reason.push_str(&format!("; {} in flight need {n}", sig.in_flight));
        }
        if let Some((rate, n)) = self
            .envelope
            .filter(|e| by_envelope.is_some() && e.1 > by_rate.unwrap_or(0))
        {
            reason.push_str(&format!(
                "; arrivals peaked at {rate:.1}/s within {}: {n} needed",
                crate::units::short_duration(self.envelope_span())
            ));
        }
        reason.push_str(&capped(want, to, desired, inp));
        Some(Decision { to, reason })
    }

    /// Little's law: the replicas that serve the arrival rate within the wait target, plus
    /// those that drain the backlog — as it will stand when new capacity is ready (it grows
    /// while the routed replicas fall short) — within one time-to-ready after that.
    fn littles_floor(&self, inp: &Inputs, sig: &ModelSignal) -> Option<u32> {
        let (lambda, cap) = (sig.arrival_rate?, self.capacity()?);
        // Over target, believe a rise at once, as the wait is.
        let lambda = lambda.max(sig.arrival_rate_recent.unwrap_or(0.0));
        let ttr = self
            .backlog_span(inp, self.time_to_ready.unwrap_or_default())
            .as_secs_f64();
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

    /// What one replica can do, once measured: its slots (or, until it was seen saturated,
    /// the most it ran at once) over the service time.
    ///
    /// Until a replica has been seen with a queue, the most it ran at once stands for its slots:
    /// a lower bound, so sizing errs towards more replicas, and Erlang C still applies.
    pub fn capacity(&self) -> Option<ReplicaCapacity> {
        let slots = self.slots.unwrap_or(self.max_running);
        if slots == 0 {
            return None;
        }
        let mu = slots as f64 / self.service_time()?;
        Some(ReplicaCapacity {
            mu,
            slots: Some(slots),
        })
    }

    /// Seconds until the queue empties at its current rate of decline, if it is declining.
    fn clear_time(&self, now: Time, sig: &ModelSignal) -> Option<f64> {
        if sig.queue_depth == 0 {
            return Some(0.0);
        }
        let last = self.demand.last()?;
        let earlier = self
            .demand
            .at_or_before(now.0.as_secs().saturating_sub(TREND_SPAN.as_secs()))?;
        let dt = (last.second - earlier.second) as f64;
        let decline = (earlier.depth() - last.depth()) / dt;
        (decline > 0.0).then(|| sig.queue_depth as f64 / decline)
    }
}

/// The note a reason carries when a step gave less than it wanted, naming the cap that applied.
fn capped(want: u32, to: u32, desired: u32, inp: &Inputs) -> String {
    if to >= want {
        String::new()
    } else if inp.max <= desired + inp.scaling.max_up_step {
        format!("; capped at max {}", inp.max)
    } else {
        format!("; capped at +{} per step", inp.scaling.max_up_step)
    }
}

fn describe(cap: ReplicaCapacity) -> String {
    match cap.slots {
        Some(k) => format!("{:.2}/s per replica, {k} at once", cap.mu),
        None => format!("{:.2}/s per replica", cap.mu),
    }
}
