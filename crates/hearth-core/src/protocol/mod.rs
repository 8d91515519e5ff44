//! The control socket's protocol (version 1), shared by the daemon and the CLI: one JSON object per
//! line each way, at most `MAX_LINE` bytes a line, answers in request order.
//!
//! Requests are `Request`; answers are `Answer` (`Result<Response, Failure>`), which the core
//! returns and only the socket layer turns into a line (`encode_answer`), and the CLI back
//! (`decode_answer`). The wire form is docs/design.md's: `{"ok":true,...}`, or
//! `{"ok":false,"error":"CODE","message":"…"}`.

mod daemon_view;
mod views;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use daemon_view::{
    ConfigFileState, ConfigFileView, DaemonView, UpgradeOutcome, UpgradePlan, UpgradeView,
};
pub use views::{
    Endpoint, GoneTag, GpuView, Health, ModelView, ReplicaState, ReplicaView, RolloutView,
    ScaleView, SignalView, StatusView, WakeView, WatchEvent, WatchedState,
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

/// What a request asks for, without its fields: the `op` alone. Reading a line's `op` into it
/// tells an unknown op (`unknown_op`, with serde's list of the known ones) from a malformed
/// known one (`bad_request`). `Request::op` maps every request onto it, so a new request cannot
/// be added without its op.
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
        f.write_str(&wire_name(self))
    }
}

impl Op {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(skip_deserializing)]
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

/// The line (without its newline) that carries `answer`.
pub fn encode_answer(answer: &Answer) -> String {
    #[derive(Serialize)]
    struct Success<'a> {
        ok: bool,
        #[serde(flatten)]
        response: &'a Response,
    }
    #[derive(Serialize)]
    struct Error<'a> {
        ok: bool,
        error: ErrorCode,
        message: &'a str,
    }
    let line = match answer {
        Ok(response) => serde_json::to_string(&Success { ok: true, response }),
        Err(f) => serde_json::to_string(&Error {
            ok: false,
            error: f.code,
            message: &bounded_message(&f.message),
        }),
    };
    // Views hold no maps with non-string keys and no non-finite floats the core lets in; should
    // one ever fail to serialize, the client still gets a well-formed answer.
    line.unwrap_or_else(|e| {
        encode_answer(&Err(Failure::new(
            ErrorCode::Busy,
            format!("the answer could not be written: {e}"),
        )))
    })
}

/// Reads an answer line. `Err`: the line is not an answer of this protocol.
pub fn decode_answer(line: &str) -> Result<Answer, String> {
    #[derive(Deserialize)]
    struct Head {
        ok: bool,
    }
    #[derive(Deserialize)]
    struct Error {
        error: ErrorCode,
        message: String,
    }
    let value: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let head = Head::deserialize(&value).map_err(|e| e.to_string())?;
    if head.ok {
        let response = Response::deserialize(&value).map_err(|e| e.to_string())?;
        // `Done` matches any object: one with more than "ok" is an answer whose body did not
        // read (a view of another version), not a bare yes.
        let bare = value.as_object().is_some_and(|o| o.len() == 1);
        if response == (Response::Done {}) && !bare {
            return Err(format!("an answer this client cannot read: {line}"));
        }
        Ok(Ok(response))
    } else {
        let e = Error::deserialize(&value).map_err(|e| e.to_string())?;
        Ok(Err(Failure::new(e.error, e.message)))
    }
}

/// Parses one request line. Distinguishes an unknown op from a malformed known one.
pub fn parse_request(line: &str) -> Result<Request, Failure> {
    if line.trim().is_empty() {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            "an empty line: a request is a JSON object on one line",
        ));
    }
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
    if let Err(e) =
        Op::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(&op))
    {
        // serde's message quotes the op whole; the known ones are what it is for.
        let known = e.to_string();
        let known = known
            .rsplit_once("expected")
            .map_or("", |(_, k)| k.trim_start_matches(" one of").trim());
        return Err(Failure::new(
            ErrorCode::UnknownOp,
            format!("unknown op {}: expected one of {known}", quote(&op)),
        ));
    }
    serde_json::from_value(value).map_err(|e| {
        Failure::new(
            ErrorCode::BadRequest,
            format!("op {}: {}", quote(&op), serde_message(&e)),
        )
    })
}

/// serde's reason, with the text it quotes from the request (an unknown field's name, a value of
/// the wrong type) cut to `QUOTE_MAX` characters.
fn serde_message(e: &serde_json::Error) -> String {
    let m = e.to_string();
    // serde quotes names in backticks and strings in double quotes: cut each quoted stretch.
    let mut out = String::with_capacity(m.len().min(MAX_MESSAGE));
    let mut rest = m.as_str();
    while let Some(i) = rest.find(['`', '"']) {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        let q = from.chars().next().unwrap_or('`');
        let body = &from[q.len_utf8()..];
        match body.find(q) {
            Some(j) => {
                let inner = &body[..j];
                out.push(q);
                let cut: String = inner.chars().take(QUOTE_MAX).collect();
                out.push_str(&cut);
                if cut.len() < inner.len() {
                    out.push('…');
                }
                out.push(q);
                rest = &body[j + q.len_utf8()..];
            }
            None => {
                out.push_str(from);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

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
