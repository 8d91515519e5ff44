//! The protocol's lines: a request line read (once, straight into the `Request`; a line that
//! does not read is looked at again to say why), and an answer written and read back as the
//! shape of the op that was sent.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    bounded_message, quote, Answer, ErrorCode, Failure, GpuView, Op, Request, Response, StatusView,
    UpgradePlan, MAX_MESSAGE, QUOTE_MAX,
};

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

/// Why a line is not the answer to the request that was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerError(String);

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AnswerError {}

/// Reads the answer line to a request with op `op`: a success is read as that op's shape (a
/// `report` may be `superseded`; a `watch`'s answer is `{"ok":true}` before its events, read as
/// `Done`). `Err`: the line is not an answer of this protocol to that op.
pub fn decode_answer(line: &str, op: Op) -> Result<Answer, AnswerError> {
    #[derive(Deserialize)]
    struct Head {
        ok: bool,
    }
    #[derive(Deserialize)]
    struct Error {
        error: ErrorCode,
        message: String,
    }
    #[derive(Deserialize)]
    struct VersionBody {
        version: String,
        protocol: u32,
    }
    #[derive(Deserialize)]
    struct StatusBody {
        status: StatusView,
    }
    #[derive(Deserialize)]
    struct GpusBody {
        gpus: Vec<GpuView>,
    }
    #[derive(Deserialize)]
    struct SupersededBody {
        superseded_by: Vec<String>,
    }
    #[derive(Deserialize)]
    struct UpgradingBody {
        upgrading: UpgradePlan,
    }
    fn read<'a, T: Deserialize<'a>>(value: &'a Value) -> Result<T, AnswerError> {
        T::deserialize(value).map_err(|e| AnswerError(e.to_string()))
    }
    let value: Value = serde_json::from_str(line).map_err(|e| AnswerError(e.to_string()))?;
    let head: Head = read(&value)?;
    if !head.ok {
        let e: Error = read(&value)?;
        return Ok(Err(Failure::new(e.error, e.message)));
    }
    // A yes with more than "ok" is an answer this op does not give (a view of another
    // version, or the answer to another request), not a bare yes.
    let done = || match value.as_object().is_some_and(|o| o.len() == 1) {
        true => Ok(Response::Done {}),
        false => Err(AnswerError(format!(
            "an answer this client cannot read: {line}"
        ))),
    };
    let response = match op {
        Op::Version => {
            let v: VersionBody = read(&value)?;
            Response::Version {
                version: v.version,
                protocol: v.protocol,
            }
        }
        Op::Status => Response::Status {
            status: read::<StatusBody>(&value)?.status,
        },
        Op::Gpus => Response::Gpus {
            gpus: read::<GpusBody>(&value)?.gpus,
        },
        Op::Report if value.get("superseded_by").is_some() => Response::Superseded {
            superseded_by: read::<SupersededBody>(&value)?.superseded_by,
        },
        Op::Upgrade => Response::Upgrading {
            upgrading: read::<UpgradingBody>(&value)?.upgrading,
        },
        Op::Report
        | Op::Watch
        | Op::Scale
        | Op::Drain
        | Op::Undrain
        | Op::Cordon
        | Op::Uncordon
        | Op::Reload => done()?,
    };
    Ok(Ok(response))
}

/// Parses one request line. Distinguishes an unknown op from a malformed known one.
///
/// A line that reads as a request (every report) is deserialized once, straight into it; only
/// one that does not is read again, as a JSON value, to say what is wrong with it.
pub fn parse_request(line: &str) -> Result<Request, Failure> {
    serde_json::from_str(line).or_else(|_| explain_bad_line(line))
}

/// What is wrong with a line that did not read as a request: not JSON, not an object, no op, an
/// unknown op, or a known op with bad fields. (Ok only where the value reads as a request but
/// the line did not straight away, as with a repeated key, which the value keeps once.)
fn explain_bad_line(line: &str) -> Result<Request, Failure> {
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
    if Op::from_name(&op).is_none() {
        let known: Vec<String> = Op::ALL.iter().map(|o| format!("`{o}`")).collect();
        return Err(Failure::new(
            ErrorCode::UnknownOp,
            format!(
                "unknown op {}: expected one of {}",
                quote(&op),
                known.join(", ")
            ),
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
