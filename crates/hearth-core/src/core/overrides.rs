//! `hearth scale` overrides against a configuration: what they may hold, wherever they come from
//! (the `scale` op, `state_dir/overrides.json` at start, a reload that changes the models or
//! `daemon.ports`). Every replica takes a port, so the models' `max` together are bounded by
//! what `daemon.ports` holds — the bound that keeps a count from a client from sizing a loop,
//! an allocation or a status answer.

use std::collections::BTreeMap;

use super::model::Overrides;
use crate::config::{Config, ModelConfig, PortRange};

/// Ports in `range`, as a count that cannot overflow.
pub fn port_capacity(range: PortRange) -> u64 {
    u64::from(range.last).saturating_sub(u64::from(range.first)) + 1
}

/// The `max` a model runs with under `o`.
fn effective_max(c: &ModelConfig, o: &Overrides) -> u64 {
    u64::from(o.max.unwrap_or(c.scaling.max))
}

/// Why `o` cannot be one model's overrides under `config`, read alone: a pair the `scale` op
/// would refuse, or a number no port range can hold.
fn check_one(name: &str, o: &Overrides, ports: u64) -> Result<(), String> {
    if o.max == Some(0) {
        return Err(format!("model {name}: max 0 (at least 1)"));
    }
    if let (Some(lo), Some(hi)) = (o.min, o.max) {
        if lo > hi {
            return Err(format!("model {name}: min {lo} > max {hi}"));
        }
    }
    for (what, v) in [("min", o.min), ("max", o.max)] {
        if let Some(v) = v.filter(|v| u64::from(*v) > ports) {
            return Err(format!(
                "model {name}: {what} {v} is more than daemon.ports holds ({ports})"
            ));
        }
    }
    // A warm pool larger than `max` leaves room for is cut to it where it is used, as the
    // configuration file's own is.
    Ok(())
}

/// Whether `overrides` can run under `config`: each model's alone, and the ports every model's
/// `max` needs together (overrides of models the configuration does not name are ignored).
pub fn check(config: &Config, overrides: &BTreeMap<String, Overrides>) -> Result<(), String> {
    let ports = port_capacity(config.daemon.ports);
    let none = Overrides::default();
    let mut needed: u64 = 0;
    for c in &config.models {
        let o = overrides.get(&c.name).unwrap_or(&none);
        check_one(&c.name, o, ports)?;
        needed = needed.saturating_add(effective_max(c, o));
    }
    if needed > ports {
        return Err(format!(
            "the models' max add up to {needed} with the scale overrides in force, and \
             daemon.ports {}-{} holds {ports}",
            config.daemon.ports.first, config.daemon.ports.last
        ));
    }
    Ok(())
}
