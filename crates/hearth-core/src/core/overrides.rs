//! `hearth scale` overrides against a configuration: what they may hold, wherever they come from
//! (the `scale` op, `state_dir/overrides.json` at start, a reload that changes the models or
//! `daemon.ports`). Every replica takes a port, so the models' `max` together are bounded by
//! what `daemon.ports` holds — the bound that keeps a count from a client from sizing a loop,
//! an allocation or a status answer.

use std::collections::BTreeMap;

use super::model::Overrides;
use crate::config::{Config, ModelConfig, PortRange};

/// Why overrides cannot run under a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverridesError {
    ZeroMax {
        model: String,
    },
    MinOverMax {
        model: String,
        min: u32,
        max: u32,
    },
    /// `min` or `max` alone is more than the port range holds.
    OverPorts {
        model: String,
        what: &'static str,
        value: u32,
        ports: u64,
    },
    /// The models' `max` together need more ports than the range holds.
    PortsShort {
        needed: u64,
        range: PortRange,
        ports: u64,
    },
}

impl std::fmt::Display for OverridesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OverridesError::ZeroMax { model } => write!(f, "model {model}: max 0 (at least 1)"),
            OverridesError::MinOverMax { model, min, max } => {
                write!(f, "model {model}: min {min} > max {max}")
            }
            OverridesError::OverPorts {
                model,
                what,
                value,
                ports,
            } => write!(
                f,
                "model {model}: {what} {value} is more than daemon.ports holds ({ports})"
            ),
            OverridesError::PortsShort {
                needed,
                range,
                ports,
            } => write!(
                f,
                "the models' max add up to {needed} with the scale overrides in force, and \
                 daemon.ports {}-{} holds {ports}",
                range.first, range.last
            ),
        }
    }
}

impl std::error::Error for OverridesError {}

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
fn check_one(name: &str, o: &Overrides, ports: u64) -> Result<(), OverridesError> {
    let model = || name.to_string();
    if o.max == Some(0) {
        return Err(OverridesError::ZeroMax { model: model() });
    }
    if let (Some(min), Some(max)) = (o.min, o.max) {
        if min > max {
            return Err(OverridesError::MinOverMax {
                model: model(),
                min,
                max,
            });
        }
    }
    for (what, v) in [("min", o.min), ("max", o.max)] {
        if let Some(value) = v.filter(|v| u64::from(*v) > ports) {
            return Err(OverridesError::OverPorts {
                model: model(),
                what,
                value,
                ports,
            });
        }
    }
    // A warm pool larger than `max` leaves room for is cut to it where it is used, as the
    // configuration file's own is.
    Ok(())
}

/// Whether `overrides` can run under `config`: each model's alone, and the ports every model's
/// `max` needs together (overrides of models the configuration does not name are ignored).
pub fn check(
    config: &Config,
    overrides: &BTreeMap<String, Overrides>,
) -> Result<(), OverridesError> {
    let ports = port_capacity(config.daemon.ports);
    let none = Overrides::default();
    let mut needed: u64 = 0;
    for c in &config.models {
        let o = overrides.get(&c.name).unwrap_or(&none);
        check_one(&c.name, o, ports)?;
        needed = needed.saturating_add(effective_max(c, o));
    }
    if needed > ports {
        return Err(OverridesError::PortsShort {
            needed,
            range: config.daemon.ports,
            ports,
        });
    }
    Ok(())
}
