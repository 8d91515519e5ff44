//! The value of each launch key the file leaves out. Validation fills the typed configuration
//! from these and a persisted [`LaunchSpec`](super::LaunchSpec) reads a missing field as these,
//! so the two can never disagree on what "not written" means.

use std::time::Duration;

use super::{DeviceNaming, Placement};

pub fn version() -> String {
    "1".to_string()
}

pub fn gpus() -> u32 {
    1
}

pub fn placement() -> Placement {
    Placement::Pack
}

/// Indices: vLLM, the flagship server, cannot read UUIDs.
pub fn device_naming() -> DeviceNaming {
    DeviceNaming::Index
}

pub fn warmup_method() -> String {
    "POST".to_string()
}

pub fn warmup_expect_status() -> u16 {
    200
}

pub fn warmup_timeout() -> Duration {
    Duration::from_secs(30)
}

pub fn warmup_startup_timeout() -> Duration {
    Duration::from_secs(600)
}

pub fn warmup_recheck() -> Duration {
    Duration::from_secs(300)
}
