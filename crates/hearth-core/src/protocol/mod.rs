//! The control socket's protocol (version 1), shared by the daemon and the CLI: one JSON object per
//! line each way, at most `MAX_LINE` bytes a line, answers in request order.
//!
//! Requests are `Request`; answers are `Answer` (`Result<Response, Failure>`), which the core
//! returns and only the socket layer turns into a line (`encode_answer`), and the CLI back
//! (`decode_answer`, reading the shape of the op it sent). The wire form is docs/design.md's: `{"ok":true,...}`, or
//! `{"ok":false,"error":"CODE","message":"…"}`.

mod daemon_view;
mod lines;
mod views;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use daemon_view::{
    ConfigFileState, ConfigFileView, DaemonView, HostMemoryView, UpgradeOutcome, UpgradePlan,
    UpgradeView,
};
pub use lines::{decode_answer, encode_answer, parse_request, AnswerError};
pub use views::{
    Endpoint, ForecastView, GoneTag, GpuView, Health, ModelView, ReplicaState, ReplicaView,
    RolloutView, ScaleView, SignalView, StatusView, WakeView, WatchEvent, WatchedState,
};

pub const PROTOCOL_VERSION: u32 = 1;
/// Longest accepted line, newline excluded.
pub const MAX_LINE: usize = 64 * 1024;
pub const DEFAULT_SOCKET: &str = "/run/hearth/hearth.sock";

/// Bounds on the numbers a report may carry. Every number from outside is bounded before the
/// core uses it; a report beyond these is refused (`bad_request`, naming the field and its
/// bound), and a scrape beyond them is clamped (nobody is there to answer).
///
/// - `oldest_wait_ms` ≤ one day: a request that has waited longer says nothing more about how
///   many replicas are needed than one that waited a day, and durations built from it stay far
///   from `Duration`'s limits.
/// - `queue_depth`, `in_flight` ≤ one million: no model server holds more, and the policy's
///   per-replica estimates are made from them.
/// - `arrived`, `completed` ≤ 2^53 − 1: exact as the `f64` rates are computed in, and 285 years
///   of counting at a million requests a second.
pub const MAX_WAIT_MS: f64 = 86_400_000.0;
pub const MAX_QUEUE: u64 = 1_000_000;
pub const MAX_COUNTER: u64 = (1 << 53) - 1;
/// Longest cordon `reason`: it is shown in every `status` and `gpus` answer.
pub const MAX_REASON: usize = 256;

/// Most of a client's own text an error message quotes back (characters).
pub const QUOTE_MAX: usize = 64;
/// Longest error message an answer carries (bytes); longer ones are cut. With quoting, an error
/// answer stays under 5 KiB whatever the request was: a request cannot be amplified.
pub const MAX_MESSAGE: usize = 2048;

/// A client's text as an error message quotes it: escaped like `{:?}`, at most `QUOTE_MAX`
/// characters of it, and "…" where it was cut.
pub fn quote(s: &str) -> String {
    let mut cut: String = s.chars().take(QUOTE_MAX).collect();
    let more = cut.len() < s.len();
    if more {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// An error message as it goes on the wire: control characters other than newline and tab
/// replaced (JSON would escape each into six bytes), at most `MAX_MESSAGE` bytes.
fn bounded_message(m: &str) -> std::borrow::Cow<'_, str> {
    let clean = |c: char| !c.is_control() || c == '\n' || c == '\t';
    if m.len() <= MAX_MESSAGE && m.chars().all(clean) {
        return m.into();
    }
    let mut out = String::with_capacity(MAX_MESSAGE + 32);
    for c in m.chars() {
        let c = if clean(c) { c } else { '\u{fffd}' };
        if out.len() + c.len_utf8() > MAX_MESSAGE {
            out.push_str(" … (cut)");
            break;
        }
        out.push(c);
    }
    out.into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Written `Version {}` rather than as a unit variant: serde lets an internally tagged unit
    /// variant take any field, and a misspelt one must be an error here as on every other op.
    Version {},
    Report(Report),
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    Watch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    Gpus {},
    Scale {
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warm_pool: Option<WarmPoolSetting>,
        /// Clears the model's overrides first (the configuration file's values apply again);
        /// `min`, `max` and `warm_pool` given beside it are then set anew.
        #[serde(default, skip_serializing_if = "is_false")]
        reset: bool,
    },
    /// A replica (`replica`), or a whole model off this host's balancers (`model`: front doors
    /// answer `drain` for it, replicas keep running); exactly one of the two.
    Drain {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replica: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// Drain even when routed would drop below `min` with no replacement possible.
        #[serde(default, skip_serializing_if = "is_false")]
        force: bool,
    },
    /// Ends `drain` of a model: front doors answer balancers `ready` for it again.
    Undrain {
        model: String,
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
    Reload {},
    /// Replace the daemon with the binary now on disk, keeping every replica (issue 14).
    Upgrade {},
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a request asks for, without its fields: the `op` alone. Looking a line's `op` up in
/// `Op::ALL` tells an unknown op (`unknown_op`, with the list of the known ones) from a
/// malformed known one (`bad_request`). `Request::op` maps every request onto it, so a new
/// request cannot be added without its op; a test keeps `ALL` and `name` to serde's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Version,
    Report,
    Status,
    Watch,
    Gpus,
    Scale,
    Drain,
    Undrain,
    Cordon,
    Uncordon,
    Reload,
    Upgrade,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Op {
    /// Every op, in the order an unknown op's error lists them.
    pub const ALL: [Op; 12] = [
        Op::Version,
        Op::Report,
        Op::Status,
        Op::Watch,
        Op::Gpus,
        Op::Scale,
        Op::Drain,
        Op::Undrain,
        Op::Cordon,
        Op::Uncordon,
        Op::Reload,
        Op::Upgrade,
    ];

    /// The op's name on the wire.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Version => "version",
            Op::Report => "report",
            Op::Status => "status",
            Op::Watch => "watch",
            Op::Gpus => "gpus",
            Op::Scale => "scale",
            Op::Drain => "drain",
            Op::Undrain => "undrain",
            Op::Cordon => "cordon",
            Op::Uncordon => "uncordon",
            Op::Reload => "reload",
            Op::Upgrade => "upgrade",
        }
    }

    /// The op named `name` on the wire, if there is one.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The role an op needs. `report` is also allowed to a replica's own processes (checked by
    /// the core, which knows the process groups).
    pub fn required_role(self) -> Role {
        match self {
            Op::Version | Op::Status | Op::Watch | Op::Gpus => Role::Reader,
            Op::Report => Role::Reporter,
            Op::Scale
            | Op::Drain
            | Op::Undrain
            | Op::Cordon
            | Op::Uncordon
            | Op::Reload
            | Op::Upgrade => Role::Admin,
        }
    }
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
    /// Set by a front door (`hearth route`): its name. While a front door reports for a model,
    /// its reports are the model's signal and supersede the replicas' own reports and scrapes
    /// (they hold only part of the queue, or none of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<String>,
}

impl Report {
    /// Refuses numbers no server could mean (see `MAX_WAIT_MS` and the bounds beside it).
    pub fn check(&self) -> Result<(), Failure> {
        let bad = |m: String| Err(Failure::new(ErrorCode::BadRequest, m));
        if let Some(w) = self.oldest_wait_ms {
            if !w.is_finite() || w < 0.0 {
                return bad("oldest_wait_ms must be a finite number ≥ 0".into());
            }
            if w > MAX_WAIT_MS {
                return bad(format!(
                    "oldest_wait_ms {w} is more than a day ({MAX_WAIT_MS} ms): not a queue wait"
                ));
            }
        }
        for (name, v, max) in [
            ("queue_depth", self.queue_depth, MAX_QUEUE),
            ("in_flight", self.in_flight, MAX_QUEUE),
            ("arrived", self.arrived, MAX_COUNTER),
            ("completed", self.completed, MAX_COUNTER),
        ] {
            if let Some(v) = v.filter(|v| *v > max) {
                return bad(format!("{name} {v} is over its bound {max}"));
            }
        }
        Ok(())
    }
}

/// A front door's name in a report: bounded, so that status and logs stay readable.
pub const MAX_ROUTER_NAME: usize = 128;

/// A warm pool size: a count or "auto" (`scale`'s `warm_pool`, status's `warm_pool`).
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

impl WarmPoolSetting {
    pub const AUTO: WarmPoolSetting = WarmPoolSetting::Auto(AutoTag::Auto);
}

impl fmt::Display for WarmPoolSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WarmPoolSetting::Count(n) => write!(f, "{n}"),
            WarmPoolSetting::Auto(_) => f.write_str("auto"),
        }
    }
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

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&wire_name(self))
    }
}

/// A failed request: `{"ok":false,"error":CODE,"message":…}` on the wire.
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
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// A successful answer, one variant per shape; on the wire each is `{"ok":true}` plus its fields.
/// Written untagged; read back by `decode_answer` as the shape of the op that was sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Response {
    /// `version`: `{"ok":true,"version":"…","protocol":1}`
    Version { version: String, protocol: u32 },
    /// `status`: `{"ok":true,"status":STATUS}`
    Status { status: StatusView },
    /// `gpus`: `{"ok":true,"gpus":[GPU…]}`
    Gpus { gpus: Vec<GpuView> },
    /// `watch`: the routed set of each watched model now. The answer line is `{"ok":true}`; the
    /// socket layer then writes the snapshot one event a line, and the events that follow.
    Watching {
        #[serde(skip)]
        snapshot: Vec<WatchEvent>,
    },
    /// `report` that was answered but not recorded: front doors hold the model's signal
    /// (docs/front-door.md). `{"ok":true,"superseded_by":["hearth route …"]}`
    Superseded { superseded_by: Vec<String> },
    /// `upgrade`, once the new binary answered its check:
    /// `{"ok":true,"upgrading":{"attempt":N,"version":"…","binary":"…"}}`; the daemon then
    /// re-executes, and `status.daemon.upgrade` says how that ended.
    Upgrading { upgrading: UpgradePlan },
    /// Every other op: `{"ok":true}`
    Done {},
}

/// The answer to one request, as the core gives it.
pub type Answer = Result<Response, Failure>;

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Version {} => Op::Version,
            Request::Report(_) => Op::Report,
            Request::Status { .. } => Op::Status,
            Request::Watch { .. } => Op::Watch,
            Request::Gpus {} => Op::Gpus,
            Request::Scale { .. } => Op::Scale,
            Request::Drain { .. } => Op::Drain,
            Request::Undrain { .. } => Op::Undrain,
            Request::Cordon { .. } => Op::Cordon,
            Request::Uncordon { .. } => Op::Uncordon,
            Request::Reload {} => Op::Reload,
            Request::Upgrade {} => Op::Upgrade,
        }
    }

    /// The role the request's op needs.
    pub fn required_role(&self) -> Role {
        self.op().required_role()
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

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&wire_name(self))
    }
}

/// The name serde gives a unit variant on the wire (`ErrorCode::TooLarge` → `too_large`), so
/// that messages and tables say what the protocol says without a second list of names.
pub(crate) fn wire_name<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
