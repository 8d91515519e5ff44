//! The autoscaling policy: how many replicas should be routed. (Static for now: `min`.)

use super::signal::ModelSignal;
use super::Time;
use crate::config::ScalingConfig;

#[derive(Debug, Clone, Default)]
pub struct Autoscaler {}

/// What the policy sees.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub now: Time,
    pub scaling: &'a ScalingConfig,
    pub min: u32,
    pub max: u32,
    pub signal: Option<ModelSignal>,
    pub routed: u32,
    pub desired: u32,
    /// The call comes from a report (true) or the tick (false).
    pub on_report: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub to: u32,
    pub reason: String,
}

impl Autoscaler {
    /// A cold start finished after `d` (spawn → warm).
    pub fn observe_time_to_ready(&mut self, d: std::time::Duration) {
        let _ = d;
    }

    /// The warm pool `warm_pool = "auto"` asks for.
    pub fn auto_pool(&self) -> u32 {
        1
    }

    pub fn evaluate(&mut self, inp: &Inputs) -> Option<Decision> {
        let to = inp.desired.clamp(inp.min, inp.max);
        (to != inp.desired).then(|| Decision {
            to,
            reason: format!("within min {} and max {}", inp.min, inp.max),
        })
    }
}
