//! Durations and sizes as people write them in configuration files and flags ("250ms", "1m30s",
//! "40GiB"), and the short forms hearth prints. One parser for the config, the CLI and the toy
//! server, so a value means the same wherever it is typed.

use std::time::Duration;

const DURATION_FORM: &str =
    "expected a number followed by ms, s, m or h, e.g. \"250ms\", \"30s\", \"5m\", \"1h30m\"";

/// What a text that does not read is meant to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    Duration,
    Size,
}

/// A duration or a size that does not read: the text, why, and (in the message) the forms that
/// would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError {
    pub kind: UnitKind,
    pub text: String,
    pub why: String,
}

impl std::fmt::Display for UnitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, form) = match self.kind {
            UnitKind::Duration => ("duration", DURATION_FORM),
            UnitKind::Size => ("size", SIZE_FORM),
        };
        write!(f, "invalid {what} {:?}: {}; {form}", self.text, self.why)
    }
}

impl std::error::Error for UnitError {}

/// Parse a duration such as "250ms", "30s", "5m", "2h", "1.5s" or "1m30s". A bare "0" is zero:
/// it needs no unit to be unambiguous; any other number without a unit is an error.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    parse_duration_with(s, false)
}

/// [`parse_duration`], and with `fine` also "us" and "ns": what [`format_duration`] writes for
/// a sub-millisecond part. People never need those units; state hearth writes and reads back does.
fn parse_duration_with(s: &str, fine: bool) -> Result<Duration, UnitError> {
    let bad = |why: &str| UnitError {
        kind: UnitKind::Duration,
        text: s.to_string(),
        why: why.to_string(),
    };
    let text = s.trim();
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() {
            return Err(bad(if rest.starts_with('-') {
                "negative durations are not allowed"
            } else {
                "missing number"
            }));
        }
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per_unit: u128 = match unit {
            "ns" if fine => 1,
            "us" if fine => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad("missing unit")),
            other => return Err(bad(&format!("unknown unit {other:?}"))),
        };
        let nanos = scaled(num, nanos_per_unit).ok_or_else(|| bad("bad number"))?;
        let part = u64::try_from(nanos / 1_000_000_000)
            .ok()
            .map(|secs| Duration::new(secs, (nanos % 1_000_000_000) as u32))
            .ok_or_else(|| bad("too large"))?;
        total = total.checked_add(part).ok_or_else(|| bad("too large"))?;
    }
    Ok(total)
}

/// `num` (digits, optionally with one decimal point) times `unit`, rounded down; None if `num` is
/// malformed or the result overflows.
fn scaled(num: &str, unit: u128) -> Option<u128> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || (num.contains('.') && frac.is_empty())
        || frac.len() > 18
    {
        return None;
    }
    let int_val: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut value = int_val.checked_mul(unit)?;
    if !frac.is_empty() {
        let frac_val: u128 = frac.parse().ok()?;
        let denom = 10u128.pow(frac.len() as u32);
        value = value.checked_add(frac_val.checked_mul(unit)? / denom)?;
    }
    Some(value)
}

/// A compact human form of `d`: "250ms", "30s", "5m", "1h30m", "1s500ms"; "0s" for zero.
/// The result parses back with [`parse_duration`] (sub-millisecond parts aside), and exactly
/// with [`duration_text`]'s reader.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let ms = d.subsec_millis();
    let sub_ms = d.subsec_nanos() % 1_000_000;
    let mut out = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s"), (u64::from(ms), "ms")] {
        if value > 0 {
            out.push_str(&format!("{value}{unit}"));
        }
    }
    if sub_ms > 0 {
        if sub_ms.is_multiple_of(1000) {
            out.push_str(&format!("{}us", sub_ms / 1000));
        } else {
            out.push_str(&format!("{sub_ms}ns"));
        }
    }
    out
}

const SIZE_FORM: &str =
    "expected a number with an optional unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. \"40GiB\"";

/// Parse a size in bytes such as "40GiB", "512MiB", "80GB", "1024" or "1.5GiB".
/// KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024; units are case-sensitive.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let bad = |why: &str| UnitError {
        kind: UnitKind::Size,
        text: s.to_string(),
        why: why.to_string(),
    };
    let text = s.trim();
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text.starts_with('-') {
        return Err(bad("negative sizes are not allowed"));
    }
    let num_len = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = (&text[..num_len], text[num_len..].trim_start());
    if num.is_empty() {
        return Err(bad("missing number"));
    }
    let mult: u128 = match unit {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => return Err(bad(&format!("unknown unit {other:?}"))),
    };
    let bytes = scaled(num, mult).ok_or_else(|| bad("bad number"))?;
    u64::try_from(bytes).map_err(|_| bad("too large"))
}

/// A duration for messages and reasons: "250ms" under a second, else seconds to a tenth ("1.5s").
pub fn short_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// A `Duration` in serde as [`format_duration`] writes it ("30s", "1m30s"), read back exactly:
/// `#[serde(with = "crate::units::duration_text")]`. For state hearth persists, so that it reads
/// the way the configuration file does.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        super::parse_duration_with(&text, true).map_err(serde::de::Error::custom)
    }
}

/// Bytes in binary units for messages: "1.5GiB", or whole MiB below a GiB.
pub fn short_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let f = b as f64;
    if f >= GIB {
        format!("{:.1}GiB", f / GIB)
    } else {
        format!("{:.0}MiB", f / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let ok = [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("2h", Duration::from_secs(7200)),
            ("1.5s", Duration::from_millis(1500)),
            ("0s", Duration::ZERO),
            ("1m30s", Duration::from_secs(90)),
            ("1h30m", Duration::from_secs(5400)),
            ("1s500ms", Duration::from_millis(1500)),
            ("0.25m", Duration::from_secs(15)),
            (" 10s ", Duration::from_secs(10)),
        ];
        for (s, want) in ok {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
        for bad in [
            "", "  ", "-1s", "10", "5x", "5 s", "s", "1.s", ".", "1..5s", "5sec", "1m30",
        ] {
            let err = parse_duration(bad).expect_err(bad).to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains("250ms"), "{err}");
        }
    }

    #[test]
    fn durations_format() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(5400), "1h30m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_millis(1500), "1s500ms"),
            (Duration::from_secs(3661), "1h1m1s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_duration(d), want);
            assert_eq!(parse_duration(want), Ok(d), "round trip {want}");
        }
        assert_eq!(format_duration(Duration::from_micros(1500)), "1ms500us");
    }

    #[test]
    fn duration_text_round_trips_exactly() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct T(#[serde(with = "duration_text")] Duration);
        for d in [
            Duration::ZERO,
            Duration::from_millis(250),
            Duration::from_secs(5400),
            Duration::from_micros(1500),
            Duration::from_nanos(1_000_000_007),
            Duration::new(3661, 999_999_999),
            Duration::MAX,
        ] {
            let text = serde_json::to_string(&T(d)).unwrap();
            assert_eq!(text, format!("{:?}", format_duration(d)));
            assert_eq!(serde_json::from_str::<T>(&text).unwrap(), T(d), "{text}");
        }
        assert_eq!(
            serde_json::to_string(&T(Duration::from_secs(90))).unwrap(),
            "\"1m30s\""
        );
        for bad in ["\"\"", "\"10\"", "\"-1s\"", "30", "\"5x\""] {
            assert!(serde_json::from_str::<T>(bad).is_err(), "{bad}");
        }
        // The fine units are for state hearth writes, not for people.
        assert!(parse_duration("5us").is_err());
        assert!(parse_duration("5ns").is_err());
    }

    #[test]
    fn sizes_parse() {
        let ok = [
            ("40GiB", 40u64 << 30),
            ("512MiB", 512 << 20),
            ("80GB", 80_000_000_000),
            ("1024", 1024),
            ("1.5GiB", 3 << 29),
            ("7B", 7),
            ("2KB", 2000),
            ("2KiB", 2048),
            ("3MB", 3_000_000),
            ("1TB", 1_000_000_000_000),
            ("1TiB", 1 << 40),
            ("0", 0),
        ];
        for (s, want) in ok {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        for bad in [
            "",
            "GiB",
            "40gib",
            "40G",
            "40 GIB",
            "-1GiB",
            "1.2.3GiB",
            "4e9",
            "99999999999TiB",
        ] {
            let err = parse_size(bad).expect_err(bad).to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains("GiB"), "{err}");
        }
    }

    #[test]
    fn short_forms() {
        assert_eq!(short_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(short_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(short_bytes(3 << 29), "1.5GiB");
        assert_eq!(short_bytes(512 << 20), "512MiB");
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }
}
