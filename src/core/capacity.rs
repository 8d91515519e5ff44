//! How many replicas an arrival rate needs for the wait target: the fleet as one M/M/c queue
//! (c = replicas × slots per replica, each slot completing `μ ÷ slots` requests per second),
//! sized so that the share of arrivals waiting longer than the target stays under a bound
//! (Erlang C). Where the slots per replica are not known yet, Little's law at a utilisation.

/// Share of arrivals that may wait longer than the target at the size chosen.
pub const WAIT_TAIL: f64 = 0.01;
/// Utilisation used instead when the slots per replica are not known.
pub const UTILISATION: f64 = 0.85;

/// What one replica can do, as measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaCapacity {
    /// Completions per second while saturated.
    pub mu: f64,
    /// Requests it serves at once, when seen (in flight minus queued, while it had a queue).
    pub slots: Option<u32>,
}

/// Probability that an arrival waits longer than `t` seconds in M/M/c with offered load
/// `a = λ/μ_slot` (Erlang C, times the exponential tail of the wait given waiting).
pub fn wait_tail(lambda: f64, c: u32, mu_slot: f64, t: f64) -> f64 {
    let a = lambda / mu_slot;
    if c == 0 || a >= c as f64 {
        return 1.0;
    }
    // Erlang B by its stable recursion, then C from B.
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (k as f64 + a * b);
    }
    let c_f = c as f64;
    let erlang_c = c_f * b / (c_f - a * (1.0 - b));
    erlang_c * (-(c_f * mu_slot - lambda) * t).exp()
}

/// The fewest replicas (up to `limit`) for which at most `tail` of arrivals at rate `lambda`
/// wait longer than `target` seconds.
pub fn replicas_needed(
    lambda: f64,
    cap: ReplicaCapacity,
    target: f64,
    tail: f64,
    limit: u32,
) -> u32 {
    if lambda <= 0.0 || cap.mu <= 0.0 {
        return 0;
    }
    let Some(slots) = cap.slots.filter(|s| *s > 0) else {
        let share = tail / WAIT_TAIL;
        // Without slot counts: a stricter tail reads as a lower utilisation.
        let utilisation = (UTILISATION * share.powf(0.1)).clamp(0.5, 0.95);
        return ((lambda / (cap.mu * utilisation)).ceil() as u32).min(limit);
    };
    let mu_slot = cap.mu / slots as f64;
    let mut n = ((lambda / cap.mu).ceil() as u32).max(1);
    while n < limit && wait_tail(lambda, n.saturating_mul(slots), mu_slot, target) > tail {
        n += 1;
    }
    n.min(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_c_matches_known_values() {
        // M/M/1: P(wait) = ρ; tail at t: ρ·e^{-(μ-λ)t}.
        let t = wait_tail(0.5, 1, 1.0, 0.0);
        assert!((t - 0.5).abs() < 1e-9, "{t}");
        let t = wait_tail(0.5, 1, 1.0, 2.0);
        assert!((t - 0.5 * (-1.0f64).exp()).abs() < 1e-9, "{t}");
        // M/M/2 with a = 1: C = 1/3.
        let t = wait_tail(1.0, 2, 1.0, 0.0);
        assert!((t - 1.0 / 3.0).abs() < 1e-9, "{t}");
        assert_eq!(wait_tail(3.0, 2, 1.0, 1.0), 1.0, "overloaded");
    }

    #[test]
    fn more_slots_per_replica_need_fewer_replicas_and_stricter_targets_more() {
        let cap = |slots| ReplicaCapacity {
            mu: 2.0,
            slots: Some(slots),
        };
        // 10 req/s at 2/s per replica: 5 replicas are fully busy; with 6 of 8 slots each, 0.3 %
        // wait over 2 s; with 6 single-slot replicas, 1.08 %: one more is needed.
        let n8 = replicas_needed(10.0, cap(8), 2.0, WAIT_TAIL, 100);
        let n1 = replicas_needed(10.0, cap(1), 2.0, WAIT_TAIL, 100);
        assert_eq!((n8, n1), (6, 7));
        assert!(replicas_needed(10.0, cap(8), 0.1, WAIT_TAIL, 100) > n8);
        assert_eq!(
            replicas_needed(10.0, cap(8), 2.0, WAIT_TAIL, 4),
            4,
            "never above the limit"
        );
        assert_eq!(replicas_needed(0.0, cap(8), 2.0, WAIT_TAIL, 100), 0);
    }

    #[test]
    fn without_slot_counts_little_at_a_utilisation() {
        let cap = ReplicaCapacity {
            mu: 2.0,
            slots: None,
        };
        assert_eq!(
            replicas_needed(10.0, cap, 2.0, WAIT_TAIL, 100),
            6,
            "10 / (2 × 0.85)"
        );
    }
}
