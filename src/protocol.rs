//! The control socket's protocol (version 1), shared by the daemon and the CLI: one JSON object per
//! line each way, at most `MAX_LINE` bytes a line, answers in request order.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub const PROTOCOL_VERSION: u32 = 1;
/// Longest accepted line, newline excluded.
pub const MAX_LINE: usize = 64 * 1024;
pub const DEFAULT_SOCKET: &str = "/run/hearth/hearth.sock";

/// Every op the daemon knows, so an unknown one gets `unknown_op` rather than `bad_request`.
pub const OPS: &[&str] = &[
    "version", "report", "status", "watch", "gpus", "scale", "drain", "cordon", "uncordon",
    "reload",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Version,
    Report(Report),
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    Watch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    Gpus,
    Scale {
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warm_pool: Option<WarmPoolSetting>,
    },
    Drain {
        replica: String,
    },
    Cordon {
        gpu: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default)]
        evacuate: bool,
    },
    Uncordon {
        gpu: String,
    },
    Reload,
}

/// A queue report: from a replica about itself, or model-wide from a router.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_wait_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrived: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

/// `warm_pool` in a `scale` request: a count or "auto".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WarmPoolSetting {
    Count(u32),
    Auto(AutoTag),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoTag {
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    UnknownOp,
    UnknownModel,
    UnknownReplica,
    UnknownGpu,
    Forbidden,
    TooLarge,
    Busy,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::UnknownReplica => "unknown_replica",
            ErrorCode::UnknownGpu => "unknown_gpu",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Busy => "busy",
        }
    }
}

/// A failed request, as it goes on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
}

impl Failure {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
    pub fn to_value(&self) -> Value {
        json!({"ok": false, "error": self.code.as_str(), "message": self.message})
    }
}

pub fn ok() -> Value {
    json!({"ok": true})
}

/// `{"ok":true, key: value}`
pub fn ok_with(key: &str, value: impl Serialize) -> Value {
    let mut v = ok();
    v[key] = serde_json::to_value(value).unwrap_or(Value::Null);
    v
}

/// Parses one request line. Distinguishes an unknown op from a malformed known one.
pub fn parse_request(line: &str) -> Result<Request, Failure> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| Failure::new(ErrorCode::BadRequest, format!("invalid JSON: {e}")))?;
    let Some(obj) = value.as_object() else {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            "a request is a JSON object",
        ));
    };
    let op = match obj.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(_) => {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                "\"op\" must be a string",
            ))
        }
        None => return Err(Failure::new(ErrorCode::BadRequest, "missing \"op\"")),
    };
    if !OPS.contains(&op.as_str()) {
        return Err(Failure::new(
            ErrorCode::UnknownOp,
            format!("unknown op {op:?}; known: {}", OPS.join(", ")),
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| Failure::new(ErrorCode::BadRequest, format!("op {op:?}: {e}")))
}

impl Request {
    pub fn op(&self) -> &'static str {
        match self {
            Request::Version => "version",
            Request::Report(_) => "report",
            Request::Status { .. } => "status",
            Request::Watch { .. } => "watch",
            Request::Gpus => "gpus",
            Request::Scale { .. } => "scale",
            Request::Drain { .. } => "drain",
            Request::Cordon { .. } => "cordon",
            Request::Uncordon { .. } => "uncordon",
            Request::Reload => "reload",
        }
    }

    /// The role an op needs. `report` is also allowed to a replica's own processes (checked by
    /// the core, which knows the process groups).
    pub fn required_role(&self) -> Role {
        match self {
            Request::Version | Request::Status { .. } | Request::Watch { .. } | Request::Gpus => {
                Role::Reader
            }
            Request::Report(_) => Role::Reporter,
            Request::Scale { .. }
            | Request::Drain { .. }
            | Request::Cordon { .. }
            | Request::Uncordon { .. }
            | Request::Reload => Role::Admin,
        }
    }
}

/// Roles, each including the ones below it: admins may do everything, reporters may report and
/// read, readers may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    None,
    Reader,
    Reporter,
    Admin,
}

// ---- STATUS ----------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    pub models: Vec<ModelView>,
    pub gpus: Vec<GpuView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    pub name: String,
    pub version: String,
    /// ok | crash_loop | no_capacity
    pub health: String,
    /// Why the model is not ok (last failure, what placement lacks); empty when ok.
    #[serde(default)]
    pub health_reason: String,
    pub routed: u32,
    pub warm: u32,
    pub starting: u32,
    pub pending: u32,
    pub draining: u32,
    pub desired_routed: u32,
    #[serde(default)]
    pub desired_warm: u32,
    pub min: u32,
    pub max: u32,
    /// a count, or "auto"
    pub warm_pool: Value,
    pub target_wait_ms: u64,
    pub signal: SignalView,
    pub last_scale: Option<ScaleView>,
    /// A rollout under way or halted, in words; None when every replica runs the configuration.
    #[serde(default)]
    pub rollout: Option<String>,
    /// spawn → warm of the latest cold start, when measured
    #[serde(default)]
    pub time_to_ready_ms: Option<u64>,
    /// Replicas that failed (exited, failed a probe, never warmed) since the daemon started,
    /// each replaced after its back-off; `hearth_replica_restarts_total` in the metrics.
    #[serde(default)]
    pub restarts_total: u64,
    pub replicas: Vec<ReplicaView>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SignalView {
    pub oldest_wait_ms: Option<f64>,
    pub queue_depth: Option<u64>,
    pub in_flight: Option<u64>,
    /// age of the newest report in use; None when there is no fresh signal
    pub age_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleView {
    pub at_ms: u64,
    pub from: u32,
    pub to: u32,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub id: String,
    pub state: String,
    pub pid: Option<u32>,
    pub port: Option<u16>,
    pub addr: Option<String>,
    pub gpus: Vec<String>,
    pub since_ms: u64,
    pub restarts: u32,
    pub version: String,
    /// What the replica is waiting for or why it is leaving; empty when nothing to say.
    #[serde(default)]
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_reserved: u64,
    pub healthy: bool,
    pub cordoned: bool,
    pub replicas: Vec<String>,
    /// Memory in use on the device by every process, as NVML last said; null without NVML.
    #[serde(default)]
    pub memory_used: Option<u64>,
    /// The part of `memory_used` that hearth's replicas do not account for (other users of the
    /// GPU); it is not capacity. Null until NVML has reported.
    #[serde(default)]
    pub memory_foreign: Option<u64>,
    /// Why the device is unhealthy or cordoned (the XID, the operator's reason), if it is.
    #[serde(default)]
    pub note: Option<String>,
    /// NUMA node (or PCIe root) key shared by devices close to each other; null if unknown.
    #[serde(default)]
    pub topology: Option<String>,
}

// ---- WATCH -----------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub replica: String,
    pub addr: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEvent {
    Routed {
        model: String,
        endpoints: Vec<Endpoint>,
    },
    Replica {
        model: String,
        replica: String,
        state: String,
    },
    Scale {
        model: String,
        from: u32,
        to: u32,
        reason: String,
    },
    Gpu {
        uuid: String,
        healthy: bool,
        cordoned: bool,
    },
}

impl WatchEvent {
    /// The model an event is about; None for host-wide events, which every watcher gets.
    pub fn model(&self) -> Option<&str> {
        match self {
            WatchEvent::Routed { model, .. }
            | WatchEvent::Replica { model, .. }
            | WatchEvent::Scale { model, .. } => Some(model),
            WatchEvent::Gpu { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_ops_and_rejects_the_rest() {
        assert_eq!(
            parse_request(r#"{"op":"version"}"#).unwrap(),
            Request::Version
        );
        let r = parse_request(r#"{"op":"report","model":"m","oldest_wait_ms":12.5,"in_flight":3}"#)
            .unwrap();
        match r {
            Request::Report(rep) => {
                assert_eq!(rep.model, "m");
                assert_eq!(rep.oldest_wait_ms, Some(12.5));
                assert_eq!(rep.in_flight, Some(3));
                assert_eq!(rep.queue_depth, None);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_request("{nope").unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_request("[1]").unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_request(r#"{"op":"fly"}"#).unwrap_err().code,
            ErrorCode::UnknownOp
        );
        assert_eq!(
            parse_request(r#"{"op":7}"#).unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(
            parse_request(r#"{"op":"drain"}"#).unwrap_err().code,
            ErrorCode::BadRequest,
            "drain without replica"
        );
        assert_eq!(
            parse_request(r#"{"op":"report","model":"m","wait_ms":3}"#)
                .unwrap_err()
                .code,
            ErrorCode::BadRequest,
            "a misspelt field is an error, not silently ignored"
        );
    }

    #[test]
    fn warm_pool_setting_is_a_count_or_auto() {
        let r = parse_request(r#"{"op":"scale","model":"m","warm_pool":"auto"}"#).unwrap();
        assert!(matches!(
            r,
            Request::Scale {
                warm_pool: Some(WarmPoolSetting::Auto(_)),
                ..
            }
        ));
        let r = parse_request(r#"{"op":"scale","model":"m","warm_pool":2,"min":1}"#).unwrap();
        assert!(matches!(
            r,
            Request::Scale {
                warm_pool: Some(WarmPoolSetting::Count(2)),
                min: Some(1),
                ..
            }
        ));
        assert!(parse_request(r#"{"op":"scale","model":"m","warm_pool":"lots"}"#).is_err());
    }

    #[test]
    fn watch_events_carry_their_tag() {
        let e = WatchEvent::Routed {
            model: "m".into(),
            endpoints: vec![Endpoint {
                replica: "m-1".into(),
                addr: "127.0.0.1:1".into(),
            }],
        };
        let s = serde_json::to_string(&e).unwrap();
        assert!(s.starts_with(r#"{"event":"routed","model":"m""#), "{s}");
    }
}
