//! How many replicas an arrival rate needs for the wait target: the fleet as one M/M/c queue
//! (c = replicas × slots per replica, each slot completing `μ ÷ slots` requests per second),
//! sized so that the share of arrivals waiting longer than the target stays under a bound
//! (Erlang C). Where the slots per replica are not known yet, Little's law at a utilisation.
//!
//! The work is bounded whatever the reports said: slots are believed up to `MAX_SLOTS`, Erlang C
//! is exact up to `EXACT_SERVERS` servers and follows the Halfin–Whitt approximation beyond
//! (where it is accurate), and the search over replica counts is incremental.

/// Share of arrivals that may wait longer than the target at the size chosen.
pub const WAIT_TAIL: f64 = 0.01;
/// Utilisation used instead when the slots per replica are not known.
pub const UTILISATION: f64 = 0.85;
/// The most requests one replica is believed to run at once. Model servers run tens to a few
/// hundred (vLLM's default `max_num_seqs` is 256); a report claiming more is clamped, so that
/// no report can make sizing expensive.
pub const MAX_SLOTS: u32 = 1024;
/// Servers up to which Erlang C is computed exactly (one step per server).
const EXACT_SERVERS: u64 = 4096;

/// What one replica can do, as measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaCapacity {
    /// Completions per second while saturated.
    pub mu: f64,
    /// Requests it serves at once, when seen (in flight minus queued, while it had a queue).
    pub slots: Option<u32>,
}

/// The standard normal CDF (Abramowitz & Stegun 7.1.26 for erf; error below 1.5e-7).
fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

/// Erlang C (the probability of waiting) from Erlang B at the same `c` and offered load `a`.
fn erlang_c_from_b(b: f64, c: f64, a: f64) -> f64 {
    (c * b / (c - a * (1.0 - b))).clamp(0.0, 1.0)
}

/// Erlang C for many servers: Halfin–Whitt, with β = (c − a) ÷ √a.
fn erlang_c_many(c: f64, a: f64) -> f64 {
    let beta = (c - a) / a.sqrt();
    let pdf = (-0.5 * beta * beta).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let cdf = normal_cdf(beta);
    if pdf <= 0.0 {
        return 0.0;
    }
    (1.0 / (1.0 + beta * cdf / pdf)).clamp(0.0, 1.0)
}

/// The share of arrivals waiting longer than `t`, given the probability of waiting.
fn tail(p_wait: f64, c: f64, lambda: f64, mu_slot: f64, t: f64) -> f64 {
    p_wait * (-(c * mu_slot - lambda) * t).exp()
}

/// Probability that an arrival waits longer than `t` seconds in M/M/c with offered load
/// `a = λ/μ_slot` (Erlang C, times the exponential tail of the wait given waiting).
#[cfg(test)]
fn wait_tail(lambda: f64, c: u64, mu_slot: f64, t: f64) -> f64 {
    let a = lambda / mu_slot;
    if c == 0 || !a.is_finite() || a >= c as f64 {
        return 1.0;
    }
    let cf = c as f64;
    let p_wait = if c > EXACT_SERVERS {
        erlang_c_many(cf, a)
    } else {
        // Erlang B by its stable recursion.
        let mut b = 1.0;
        for k in 1..=c {
            b = a * b / (k as f64 + a * b);
        }
        erlang_c_from_b(b, cf, a)
    };
    tail(p_wait, cf, lambda, mu_slot, t)
}

/// The fewest replicas (up to `limit`) for which at most `tail` of arrivals at rate `lambda`
/// wait longer than `target` seconds.
pub fn replicas_needed(
    lambda: f64,
    cap: ReplicaCapacity,
    target: f64,
    tail_bound: f64,
    limit: u32,
) -> u32 {
    // NaN compares false: no rate, or no measured capacity, asks for nothing.
    if !(lambda > 0.0 && cap.mu > 0.0) {
        return 0;
    }
    let Some(slots) = cap.slots.filter(|s| *s > 0) else {
        let share = tail_bound / WAIT_TAIL;
        // Without slot counts: a stricter tail reads as a lower utilisation.
        let utilisation = (UTILISATION * share.powf(0.1)).clamp(0.5, 0.95);
        return ((lambda / (cap.mu * utilisation)).ceil() as u32).min(limit);
    };
    let slots = u64::from(slots.min(MAX_SLOTS));
    let mu_slot = cap.mu / slots as f64;
    let a = lambda / mu_slot;
    // Float → int casts saturate: an absurd rate starts at the limit.
    let first = ((lambda / cap.mu).ceil() as u32).max(1);
    if first >= limit {
        return limit;
    }
    // Erlang B advances one server at a time while exact; each candidate count reuses it.
    let (mut b, mut k) = (1.0, 0u64);
    for n in first..limit {
        let c = u64::from(n) * slots;
        let p_wait = if c > EXACT_SERVERS {
            erlang_c_many(c as f64, a)
        } else {
            while k < c {
                k += 1;
                b = a * b / (k as f64 + a * b);
            }
            erlang_c_from_b(b, c as f64, a)
        };
        let cf = c as f64;
        let over = if a >= cf {
            1.0
        } else {
            tail(p_wait, cf, lambda, mu_slot, target)
        };
        if over <= tail_bound {
            return n;
        }
    }
    limit
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
    fn the_approximation_for_many_servers_agrees_with_the_exact_value() {
        for (c, rho) in [(1000u64, 0.95), (4000, 0.98), (3000, 0.9)] {
            let a = rho * c as f64;
            let mut b = 1.0;
            for k in 1..=c {
                b = a * b / (k as f64 + a * b);
            }
            let exact = erlang_c_from_b(b, c as f64, a);
            let approx = erlang_c_many(c as f64, a);
            assert!(
                (exact - approx).abs() < 0.02 + 0.1 * exact,
                "c {c} ρ {rho}: {exact} vs {approx}"
            );
        }
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

    /// Issue 11: a report claiming 4294967295 slots made one evaluation loop 4.29e9 times.
    /// Whatever the figures, the work is bounded: slots are clamped, Erlang C is exact only up
    /// to `EXACT_SERVERS`, and absurd or non-finite rates return at once.
    #[test]
    fn absurd_figures_cost_bounded_work() {
        let huge = ReplicaCapacity {
            mu: 1e6,
            slots: Some(u32::MAX),
        };
        for lambda in [1.0, 1e3, 1e9, f64::MAX, f64::INFINITY, f64::NAN] {
            let n = replicas_needed(lambda, huge, 0.5, WAIT_TAIL, 1000);
            assert!(n <= 1000, "{lambda}: {n}");
        }
        assert_eq!(wait_tail(1.0, 1_000_000, 1e-9, 1.0), 1.0, "overloaded");
        assert!(wait_tail(1.0, u64::MAX, 1.0, 1.0) < 1e-9);
    }
}
