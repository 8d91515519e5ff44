//! A fixed fleet: `min` replicas, never scaled. Not an autoscaler — the control for checking the
//! queueing model against theory (with `min = max` it is an M/M/c-style system per replica).

use super::{secs, Baseline, Deployment};
use crate::sim::engine::Sim;
use crate::sim::Us;

pub struct Fixed;

impl Baseline for Fixed {
    fn period(&self) -> Us {
        secs(3600)
    }

    fn decide(&mut self, _sim: &Sim, _dep: &Deployment) -> Option<u32> {
        None
    }
}
