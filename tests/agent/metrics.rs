//! The Prometheus exposition at `daemon.metrics`: parsed strictly as OpenMetrics text, every
//! value compared with what `hearth status` says at the same moment.

use std::collections::BTreeMap;
use std::time::Duration;

use testkit::ports::ports;
use testkit::*;

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A strict reader of the OpenMetrics text format (the subset hearth writes): every sample
/// belongs to the family declared by the `# TYPE` line before it, with the suffixes its type
/// allows; families are not interleaved; no sample appears twice; the text ends with `# EOF`.
fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut out: Vec<Sample> = Vec::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let mut seen = std::collections::HashSet::new();
    let mut eof = false;
    if !text.ends_with('\n') {
        return Err("no final newline".into());
    }
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if eof {
            return Err(format!("line {n}: text after # EOF"));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let arg = parts.next().unwrap_or("");
            match kind {
                "HELP" | "UNIT" => {}
                "TYPE" => {
                    if ![
                        "counter",
                        "gauge",
                        "histogram",
                        "info",
                        "stateset",
                        "unknown",
                    ]
                    .contains(&arg)
                    {
                        return Err(format!("line {n}: unknown type {arg:?}"));
                    }
                    if types.insert(name.to_string(), arg.to_string()).is_some() {
                        return Err(format!("line {n}: family {name} declared twice"));
                    }
                    current = Some((name.to_string(), arg.to_string()));
                }
                _ => return Err(format!("line {n}: unknown comment {line:?}")),
            }
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(k) => (&line[..k], &line[k..]),
            None => return Err(format!("line {n}: no value: {line:?}")),
        };
        let (family, kind) = current
            .as_ref()
            .ok_or_else(|| format!("line {n}: sample before any # TYPE"))?;
        let suffix = name
            .strip_prefix(family.as_str())
            .ok_or_else(|| format!("line {n}: {name} outside family {family}"))?;
        let allowed: &[&str] = match kind.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        if !allowed.contains(&suffix) {
            return Err(format!(
                "line {n}: {name} is not a {kind} sample of {family}"
            ));
        }
        let mut labels = BTreeMap::new();
        let mut rest = rest;
        if let Some(r) = rest.strip_prefix('{') {
            let mut r = r;
            loop {
                if let Some(after) = r.strip_prefix('}') {
                    r = after;
                    break;
                }
                let eq = r
                    .find('=')
                    .ok_or_else(|| format!("line {n}: label without ="))?;
                let key = &r[..eq];
                if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!("line {n}: bad label name {key:?}"));
                }
                let mut chars = r[eq + 1..].char_indices();
                if chars.next().map(|c| c.1) != Some('"') {
                    return Err(format!("line {n}: unquoted label value"));
                }
                let mut value = String::new();
                let mut end = None;
                let mut escaped = false;
                for (k, c) in chars {
                    match (escaped, c) {
                        (true, 'n') => (value.push('\n'), escaped = false).1,
                        (true, c) => (value.push(c), escaped = false).1,
                        (false, '\\') => escaped = true,
                        (false, '"') => {
                            end = Some(eq + 1 + k + 1);
                            break;
                        }
                        (false, c) => value.push(c),
                    }
                }
                let end = end.ok_or_else(|| format!("line {n}: unterminated label value"))?;
                if labels.insert(key.to_string(), value).is_some() {
                    return Err(format!("line {n}: label {key} twice"));
                }
                r = &r[end..];
                r = r.strip_prefix(',').unwrap_or(r);
            }
            rest = r;
        }
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| format!("line {n}: no space before the value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .map_err(|_| format!("line {n}: bad value {v:?}"))?,
        };
        if !seen.insert(format!("{name}{labels:?}")) {
            return Err(format!("line {n}: {name}{labels:?} twice"));
        }
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    if !eof {
        return Err("no # EOF".into());
    }
    Ok(out)
}

/// The value of the sample named `name` with exactly these labels.
fn get(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .find(|s| s.name == name && s.labels == want)
        .map(|s| s.value)
}

fn get_metrics(port: u16, path: &str) -> HttpReply {
    http(
        &format!("127.0.0.1:{port}"),
        "GET",
        path,
        None,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn scrape(port: u16) -> Vec<Sample> {
    let r = get_metrics(port, "/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    let content_type = r.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse(&r.body).unwrap_or_else(|e| panic!("not valid OpenMetrics text: {e}\n{}", r.body))
}

/// Replica counts per state, GPU reservations and health, restarts: equal to status.
fn assert_matches_status(samples: &[Sample], status: &Value) {
    for m in status["models"].as_array().unwrap() {
        let model = m["name"].as_str().unwrap();
        for state in ["pending", "starting", "warm", "routed", "draining"] {
            assert_eq!(
                get(
                    samples,
                    "hearth_replicas",
                    &[("model", model), ("state", state)]
                ),
                Some(m[state].as_f64().unwrap()),
                "hearth_replicas{{model={model},state={state}}} vs status {m}"
            );
        }
        assert_eq!(
            get(
                samples,
                "hearth_replica_restarts_total",
                &[("model", model)]
            ),
            m["restarts_total"].as_f64(),
        );
    }
    for g in status["gpus"].as_array().unwrap() {
        let uuid = g["uuid"].as_str().unwrap();
        assert_eq!(
            get(
                samples,
                "hearth_gpu_memory_reserved_bytes",
                &[("gpu", uuid)]
            ),
            g["memory_reserved"].as_f64(),
            "reserved on {uuid}"
        );
        assert_eq!(
            get(samples, "hearth_gpu_healthy", &[("gpu", uuid)]),
            Some(if g["healthy"] == true { 1.0 } else { 0.0 })
        );
    }
}

fn histogram(samples: &[Sample], model: &str, path: &str) -> (f64, f64, Vec<(f64, f64)>) {
    let l = [("model", model), ("path", path)];
    let count = get(samples, "hearth_time_to_ready_seconds_count", &l).unwrap_or(0.0);
    let sum = get(samples, "hearth_time_to_ready_seconds_sum", &l).unwrap_or(0.0);
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| {
            s.name == "hearth_time_to_ready_seconds_bucket"
                && s.labels.get("model").map(String::as_str) == Some(model)
                && s.labels.get("path").map(String::as_str) == Some(path)
        })
        .map(|s| {
            let le = s.labels["le"].as_str();
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            (le, s.value)
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    (count, sum, buckets)
}

#[test]
fn metrics_equal_status_and_count_what_happened() {
    let port = ports(1);
    let metrics = port.first;
    // 2 routed + 1 warm (max 4) of a server that loads for 1 s, 10 GiB of a GPU each; the
    // test's reports count for a minute and are under target.
    let mut toy = Model::toy("toy", &["--load-time", "1s"])
        .scale(2, 4, 1)
        .gpus(1, "10GiB")
        .stale_after("1m")
        .target_wait("10s");
    // The servers' own queue reports would change the signal and the report count under the
    // test: only the test reports.
    toy.command
        .splice(0..0, ["env", "-u", "HEARTH_SOCKET"].map(String::from));
    let d = Daemon::builder()
        .tick("100ms")
        .shutdown_timeout("15s")
        .metrics(metrics)
        .gpus(
            "static",
            &[("GPU-metrics-0", "80GiB"), ("GPU-metrics-1", "80GiB")],
        )
        .model(toy)
        .start();
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));

    let r = get_metrics(metrics, "/");
    assert_eq!(r.status, 404, "{}", r.body);

    for _ in 0..2 {
        d.cli_ok(&[
            "report",
            "toy",
            "--wait-ms",
            "300",
            "--depth",
            "5",
            "--in-flight",
            "2",
        ]);
    }
    let samples = scrape(metrics);
    let st = d.status();
    assert_matches_status(&samples, &st);
    let m = &st["models"][0];
    assert_eq!(m["signal"]["oldest_wait_ms"], 300.0);
    assert_eq!(
        get(
            &samples,
            "hearth_queue_oldest_wait_seconds",
            &[("model", "toy")]
        ),
        Some(0.3)
    );
    assert_eq!(
        get(&samples, "hearth_queue_depth", &[("model", "toy")]),
        m["signal"]["queue_depth"].as_f64()
    );
    assert_eq!(
        get(&samples, "hearth_queue_depth", &[("model", "toy")]),
        Some(5.0)
    );
    assert_eq!(
        get(&samples, "hearth_reports_total", &[("model", "toy")]),
        Some(2.0)
    );
    let reserved: f64 = st["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["memory_reserved"].as_f64().unwrap())
        .sum();
    assert_eq!(
        reserved,
        3.0 * 10.0 * (1u64 << 30) as f64,
        "3 replicas × 10 GiB"
    );

    // Three cold starts of a server that loads for 1 s.
    let (count, sum, buckets) = histogram(&samples, "toy", "cold");
    assert_eq!(count, 3.0, "{buckets:?}");
    assert!((3.0..90.0).contains(&sum), "sum {sum}");
    assert_eq!(
        buckets.last().map(|b| b.1),
        Some(count),
        "+Inf bucket = count"
    );
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "cumulative");
    let latest = m["time_to_ready_ms"].as_f64().unwrap() / 1000.0;
    assert!(
        latest >= 1.0 && latest <= sum,
        "status's latest cold start {latest}"
    );
    assert!(
        get(
            &samples,
            "hearth_scale_events_total",
            &[("model", "toy"), ("direction", "up")]
        )
        .is_none(),
        "no scale decision yet"
    );

    // A scale-up promotes the warm replica and starts a new one for the pool.
    d.cli_ok(&["scale", "toy", "--min", "3"]);
    let st = d.wait_settled("toy", 3, 1, Duration::from_secs(30));
    let samples = scrape(metrics);
    let status = d.status();
    assert_matches_status(&samples, &status);
    assert_eq!(st["last_scale"]["from"], 2);
    assert_eq!(st["last_scale"]["to"], 3);
    assert_eq!(
        get(
            &samples,
            "hearth_scale_events_total",
            &[("model", "toy"), ("direction", "up")]
        ),
        Some(1.0)
    );
    let (count, sum, _) = histogram(&samples, "toy", "promote");
    assert_eq!(count, 1.0, "one promotion");
    assert!(
        sum < 0.5,
        "a promotion takes milliseconds, not a cold start: {sum}s"
    );
    let (count, _, _) = histogram(&samples, "toy", "cold");
    assert_eq!(count, 4.0, "the pool's refill was a cold start");
    assert_eq!(
        get(&samples, "hearth_reports_total", &[("model", "toy")]),
        Some(2.0)
    );
}

#[test]
fn a_taken_metrics_port_fails_the_start() {
    let taken = ports(1);
    let port = taken.first;
    let _holder = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let mut d = Daemon::builder()
        .metrics(port)
        .model(Model::toy("toy", &[]))
        .spawn();
    let exited = d
        .wait_exit(Duration::from_secs(20))
        .expect("the daemon did not exit within 20 s");
    assert_eq!(exited.code(), Some(1));
    let err = d.log();
    assert!(
        err.contains(&format!("binding daemon.metrics 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(!d.socket.exists(), "nothing was started");
    assert!(d.children().is_empty(), "started: {:?}", d.children());
}
