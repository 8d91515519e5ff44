//! The answer to one HAProxy agent check (docs/fleet.md), as a pure function of what the front
//! door already holds: the queue's load, the daemon's last `capacity` event, how old its view
//! of the daemon is, and whether the model is draining. HAProxy's own rules shape it
//! (configuration manual, `agent-check`):
//!
//! - A weight is a percentage of the server's configured weight, which the example sets to
//!   `max` × `slots`: free and promotable slots ÷ (`max` × `slots`) makes hosts comparable.
//!   HAProxy shows a weight of 0 as DRAIN, so load alone never goes below one slot's worth
//!   (at least 1 %): a fleet that saturates would otherwise refuse everything.
//! - `up` in every answer that is not `down`: once an agent said `down`, only `up` brings the
//!   server back.
//! - `maxconn:N`: what the host holds without refusing (its slots and its queue), shared among
//!   the balancers, each of which applies it on its own.
//! - `drain` only when an operator drained the model or the front door is stopping; `maint`
//!   only when the view of the daemon is older than `stale_after` (a daemon restart or upgrade
//!   is shorter); `down` for a model this host does not serve.

use std::fmt;
use std::time::Duration;

/// What the daemon last said of a model beyond its routed set (watch's `capacity` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub drained: bool,
    pub max: u32,
    pub warm: u32,
    pub can_start: bool,
    /// Replicas asleep (`[model.sleep]`): `/v1/models` says the model's tier from it.
    pub asleep: u32,
}

/// A model's load as the queue holds it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    pub routed: u32,
    pub slots: u32,
    /// Free slots on routed replicas (not passed over after a failure).
    pub free: u32,
    /// Requests waiting in the FIFO.
    pub queued: u32,
    pub max_queue: u32,
}

/// One model, as the answer needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelInput {
    pub load: Load,
    /// None until the daemon has said (or from a daemon before `capacity` events).
    pub capacity: Option<Capacity>,
    /// Operator drain or the front door stopping.
    pub draining: bool,
    /// How long ago the front door lost the daemon's watch; None while it follows it.
    pub daemon_gone_for: Option<Duration>,
    pub stale_after: Duration,
}

/// The one line an agent check is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ready { weight: u32, maxconn: u32 },
    Drain,
    Maint,
    Down(String),
}

impl Answer {
    /// The state word the metrics count answers by.
    pub fn state(&self) -> &'static str {
        match self {
            Answer::Ready { .. } => "ready",
            Answer::Drain => "drain",
            Answer::Maint => "maint",
            Answer::Down(_) => "down",
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Ready { weight, maxconn } => write!(f, "up ready {weight}% maxconn:{maxconn}"),
            Answer::Drain => f.write_str("up drain"),
            Answer::Maint => f.write_str("up maint"),
            // HAProxy reads a description only after a space: "down#x" is no answer at all.
            Answer::Down(why) => write!(f, "down #{why}"),
        }
    }
}

/// The slots a model's weight is a share of, and those it has free or can promote now.
fn shares(m: &ModelInput) -> (u64, u64) {
    let slots = u64::from(m.load.slots.max(1));
    let (max, warm) = m.capacity.map_or((m.load.routed, 0), |c| (c.max, c.warm));
    // A routed set above `max` (lowered by `hearth scale`) still serves: never over 100 %.
    let base = u64::from(max.max(m.load.routed)) * slots;
    let free = u64::from(m.load.free).saturating_sub(u64::from(m.load.queued));
    (base, free + u64::from(warm) * slots)
}

/// What the host holds without a 429: requests at routed and promotable replicas, and its FIFO.
fn holds(m: &ModelInput) -> u64 {
    let warm = m.capacity.map_or(0, |c| c.warm);
    u64::from(m.load.routed + warm) * u64::from(m.load.slots.max(1)) + u64::from(m.load.max_queue)
}

fn stale(m: &ModelInput) -> bool {
    m.daemon_gone_for.is_some_and(|d| d > m.stale_after)
}

/// Nothing serves the model here and nothing can: no replica routed or warm, none to start.
fn serves_nothing(m: &ModelInput) -> bool {
    m.load.routed == 0 && m.capacity.is_none_or(|c| c.warm == 0 && !c.can_start)
}

fn maxconn(holds: u64, balancers: u32) -> u32 {
    let n = holds.div_ceil(u64::from(balancers.max(1))).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The percentage of the server's configured weight (`max` × `slots`) that HAProxy turns back
/// into `usable` slots: it rounds down (configured × percent ÷ 100), so the percentage is rounded
/// up. Never under one slot's worth: HAProxy shows a weight of 0 as DRAIN.
fn weight(base: u64, usable: u64) -> u32 {
    if base == 0 {
        return 1;
    }
    let usable = usable.clamp(1, base);
    (usable * 100).div_ceil(base) as u32
}

/// The answer for one model (`agent-send` named it).
pub fn model_answer(name: &str, m: &ModelInput, balancers: u32) -> Answer {
    if m.draining {
        return Answer::Drain;
    }
    if stale(m) {
        return Answer::Maint;
    }
    if serves_nothing(m) {
        return Answer::Down(format!("{name}: no replica routed or warm, none can start"));
    }
    let (base, usable) = shares(m);
    Answer::Ready {
        weight: weight(base, usable),
        maxconn: maxconn(holds(m), balancers),
    }
}

/// The answer for the host as a whole (no `agent-send`, or an empty line): the models together,
/// weighted by their slots. Draining or in maintenance only when every model is.
pub fn host_answer(models: &[ModelInput], balancers: u32) -> Answer {
    if models.is_empty() {
        return Answer::Down("no model configured".into());
    }
    if models.iter().all(|m| m.draining) {
        return Answer::Drain;
    }
    let open: Vec<&ModelInput> = models.iter().filter(|m| !m.draining).collect();
    if open.iter().all(|m| stale(m)) {
        return Answer::Maint;
    }
    if open.iter().all(|m| serves_nothing(m)) {
        return Answer::Down("no replica routed or warm, none can start".into());
    }
    let (mut base, mut usable, mut held) = (0u64, 0u64, 0u64);
    for m in &open {
        let (b, u) = shares(m);
        base += b;
        usable += u.min(b);
        held += holds(m);
    }
    Answer::Ready {
        weight: weight(base, usable),
        maxconn: maxconn(held, balancers),
    }
}

/// The answer for a name this host does not serve. The name is the balancer's configuration,
/// shown on its stats page: only printable ASCII of it, bounded.
pub fn unknown_answer(name: &str) -> Answer {
    let shown: String = name
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(64)
        .collect();
    Answer::Down(format!("unknown model {shown}"))
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
