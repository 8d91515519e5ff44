//! Traces: the built-in Azure ones and where they are found, and reading a trace file (the Azure
//! LLM inference format or a plain `t_seconds[,service_s]` list).

use std::path::{Path, PathBuf};

use super::synthetic::synth_service;
use super::{multiply_rate, push_transform, Request, ServiceModel, Workload};
use crate::sim::rng::Rng;
use crate::sim::{Us, SEC};

/// Why a trace gave no workload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("{0:?} is not a trace scenario")]
    NotATrace(String),
    #[error(
        "scenario {scenario} replays {file}, found in {}/ when run from the repository's root; \
         elsewhere give it with --trace FILE, or set HEARTH_TRACE_DIR to the folder that holds \
         it",
        REPO_TRACE_DIR
    )]
    NoTraceDir { scenario: String, file: String },
    #[error("cannot read trace {}: {error}", path.display())]
    Read { path: PathBuf, error: String },
    /// A line of the file (numbered from 1) is not what its format needs.
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: no requests in the trace", path.display())]
    Empty { path: PathBuf },
}

/// Built-in trace scenarios: name → the file they read (`--trace`, else in `trace_dir()`).
pub const TRACES: [(&str, &str); 2] = [
    ("azure-conv", "azure-llm-2023-conv.csv"),
    ("azure-code", "azure-llm-2023-code.csv"),
];

/// Where the repository keeps the traces, relative to its root (data/traces/README.md).
pub const REPO_TRACE_DIR: &str = "data/traces";

/// The folder the built-in traces are read from when no path is given: `$HEARTH_TRACE_DIR`, else
/// `data/traces` where it exists (a checkout's root, where the README's commands run), else none.
pub fn trace_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HEARTH_TRACE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    Some(PathBuf::from(REPO_TRACE_DIR)).filter(|d| d.is_dir())
}

pub const AZURE_ATTRIBUTION: &str = "Azure LLM inference trace 2023 (Patel et al., \"Splitwise: \
Efficient generative LLM inference using phase splitting\", ISCA 2024), CC-BY 4.0";

/// Where a built-in trace scenario's file is: `--trace`, else `<trace_dir()>/<file>`.
pub fn trace_path(scenario: &str, trace: Option<&Path>) -> Result<PathBuf, TraceError> {
    let (_, file) = TRACES
        .iter()
        .find(|(n, _)| *n == scenario)
        .ok_or_else(|| TraceError::NotATrace(scenario.to_string()))?;
    if let Some(p) = trace {
        return Ok(p.to_path_buf());
    }
    match trace_dir() {
        Some(dir) => Ok(dir.join(file)),
        None => Err(TraceError::NoTraceDir {
            scenario: scenario.to_string(),
            file: file.to_string(),
        }),
    }
}

/// Reads a trace: Azure format (header `TIMESTAMP,ContextTokens,GeneratedTokens`, BOM allowed)
/// or plain `t_seconds[,service_s]` lines (an optional header line is skipped). Requests without
/// a service time draw one like the synthetic scenarios do. Then applies `--speed` (arrival
/// times divided by it) and `--rate-mult` (below 1: each arrival kept with that probability;
/// above 1: each arrival replayed ⌊x⌋ times plus once more with probability x − ⌊x⌋, the copies
/// shifted by a uniform 0–1 s so they do not land on the same instant; copies keep the token
/// counts of their original).
pub fn trace_workload(
    path: &Path,
    name: &str,
    seed: u64,
    sm: &ServiceModel,
    speed: f64,
    rate_mult: f64,
) -> Result<Workload, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::Read {
        path: path.to_path_buf(),
        error: e.to_string(),
    })?;
    let (mut requests, azure) =
        parse_trace(&text, seed, sm).map_err(|(line, message)| TraceError::Line {
            path: path.to_path_buf(),
            line,
            message,
        })?;
    if requests.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
        });
    }
    requests.sort_by_key(|r| r.t);
    let t0 = requests[0].t;
    for r in &mut requests {
        r.t = ((r.t - t0) as f64 / speed).round() as Us;
    }
    if rate_mult != 1.0 {
        requests = multiply_rate(&requests, rate_mult, seed);
    }
    let last = requests.last().map_or(0, |r| r.t);
    let horizon = (last / SEC + 1) * SEC;
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut description = format!("trace {file} ({} requests", requests.len());
    description.push(')');
    push_transform(
        &mut description,
        speed,
        rate_mult,
        "arrivals thinned/replicated",
    );
    Ok(Workload {
        name: name.to_string(),
        requests,
        horizon,
        description,
        attribution: azure.then(|| AZURE_ATTRIBUTION.to_string()),
    })
}

type ParseError = (usize, String);

/// Requests with absolute times (µs); true when the file is in the Azure format.
fn parse_trace(
    text: &str,
    seed: u64,
    sm: &ServiceModel,
) -> Result<(Vec<Request>, bool), ParseError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, first)) = lines.next() else {
        return Ok((Vec::new(), false));
    };
    let header: Vec<String> = first
        .split(',')
        .map(|c| c.trim().trim_start_matches('\u{feff}').to_string())
        .collect();
    if header
        .first()
        .is_some_and(|h| h.eq_ignore_ascii_case("TIMESTAMP"))
    {
        let col = |name: &str| -> Result<usize, ParseError> {
            header
                .iter()
                .position(|h| h.eq_ignore_ascii_case(name))
                .ok_or((1, format!("the header has no {name} column")))
        };
        let (ct, cc, cg) = (
            col("TIMESTAMP")?,
            col("ContextTokens")?,
            col("GeneratedTokens")?,
        );
        let mut out = Vec::new();
        for (i, line) in lines {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let get = |c: usize| {
                cells
                    .get(c)
                    .copied()
                    .ok_or((i + 1, format!("expected {} columns", header.len())))
            };
            let t = parse_timestamp(get(ct)?).map_err(|e| (i + 1, e))?;
            let num = |s: &str, what: &str| {
                s.parse::<u64>()
                    .map_err(|_| (i + 1, format!("{what} {s:?} is not a whole number")))
            };
            let ctx = num(get(cc)?, "ContextTokens")?;
            let gen = num(get(cg)?, "GeneratedTokens")?;
            out.push(Request {
                t,
                service: sm.service(ctx, gen),
            });
        }
        return Ok((out, true));
    }
    // Plain: t_seconds[,service_s], optional header.
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let first_is_data = header
        .first()
        .is_some_and(|h| h.parse::<f64>().is_ok_and(f64::is_finite));
    let all = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    for (k, (i, line)) in all.enumerate() {
        if k == 0 && !first_is_data {
            continue;
        }
        let mut cells = line.split(',').map(str::trim);
        let tf: f64 = cells
            .next()
            .unwrap_or("")
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or((i + 1, "expected t_seconds[,service_s]".to_string()))?;
        let service = match cells.next().filter(|c| !c.is_empty()) {
            Some(c) => {
                let s: f64 = c
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite() && *v > 0.0)
                    .ok_or((i + 1, format!("service_s {c:?} is not a positive number")))?;
                ((s * SEC as f64).round() as Us).max(1)
            }
            None => synth_service(&mut rng, sm),
        };
        out.push(Request {
            t: (tf * SEC as f64).round() as Us,
            service,
        });
    }
    Ok((out, false))
}

/// `YYYY-MM-DD HH:MM:SS[.fffffff]` → µs since 1970-01-01 (UTC; only differences matter).
fn parse_timestamp(s: &str) -> Result<Us, String> {
    let bad = || format!("timestamp {s:?} is not YYYY-MM-DD HH:MM:SS.fff");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let d: Vec<&str> = date.split('-').collect();
    if d.len() != 3 {
        return Err(bad());
    }
    let y: i64 = d[0].parse().map_err(|_| bad())?;
    let m: i64 = d[1].parse().map_err(|_| bad())?;
    let day: i64 = d[2].parse().map_err(|_| bad())?;
    let (hms, frac) = match time.split_once('.') {
        Some((a, b)) => (a, b),
        None => (time, ""),
    };
    let t: Vec<&str> = hms.split(':').collect();
    if t.len() != 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let hh: i64 = t[0].parse().map_err(|_| bad())?;
    let mm: i64 = t[1].parse().map_err(|_| bad())?;
    let ss: i64 = t[2].parse().map_err(|_| bad())?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return Err(bad());
    }
    let mut micros: i64 = 0;
    for (k, b) in frac.bytes().take(6).enumerate() {
        micros += i64::from(b - b'0') * 10i64.pow(5 - k as u32);
    }
    let days = days_from_civil(y, m, day);
    let total = ((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + micros;
    u64::try_from(total).map_err(|_| bad())
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM: ServiceModel = ServiceModel {
        prefill: 0.0002,
        decode: 0.02,
    };

    #[test]
    fn azure_format_with_bom_parses_and_is_relative() {
        let text = "\u{feff}TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:15:46.6805900,374,44\n\
                    2023-11-16 18:15:50.9951690,396,109\n\
                    2023-11-17 00:00:00.5,1000,1\n";
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        std::fs::write(&p, text).unwrap();
        let w = trace_workload(&p, "t", 1, &SM, 1.0, 1.0).unwrap();
        assert_eq!(w.requests.len(), 3);
        assert_eq!(w.requests[0].t, 0);
        assert_eq!(w.requests[1].t, 4_314_579);
        assert_eq!(w.requests[0].service, 954_800); // 374 × 0.2 ms + 44 × 20 ms
        let midnight = (24 * 3600 - (18 * 3600 + 15 * 60 + 46)) * SEC - 680_590 + 500_000;
        assert_eq!(w.requests[2].t, midnight);
        assert!(w.attribution.is_some());
    }

    #[test]
    fn plain_format_with_and_without_header_and_service() {
        let (r, azure) = parse_trace("t_seconds,service_s\n0.5,2\n1.25\n", 3, &SM).unwrap();
        assert!(!azure);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            Request {
                t: 500_000,
                service: 2 * SEC
            }
        );
        assert_eq!(r[1].t, 1_250_000);
        assert!(r[1].service > 0);
        let (r, _) = parse_trace("0\n3,1.5\n", 3, &SM).unwrap();
        assert_eq!(r.len(), 2);
        assert!(parse_trace("x\nnope\n", 3, &SM).is_err());
    }

    #[test]
    fn speed_and_rate_mult_transform_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        let body: String = (0..10_000)
            .map(|i| format!("{},1\n", i as f64 * 0.1))
            .collect();
        std::fs::write(&p, body).unwrap();
        let fast = trace_workload(&p, "t", 1, &SM, 2.0, 1.0).unwrap();
        assert_eq!(fast.requests.len(), 10_000);
        assert_eq!(fast.requests[10].t, 500_000);
        let half = trace_workload(&p, "t", 1, &SM, 1.0, 0.5).unwrap();
        assert!((half.requests.len() as f64 - 5000.0).abs() < 250.0);
        let more = trace_workload(&p, "t", 1, &SM, 1.0, 2.5).unwrap();
        assert!((more.requests.len() as f64 - 25_000.0).abs() < 300.0);
        assert!(more.requests.windows(2).all(|w| w[0].t <= w[1].t));
    }
}
