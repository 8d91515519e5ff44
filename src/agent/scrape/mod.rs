//! Scrapes a model server's Prometheus metrics for its queue: fetch (bounded in time and size),
//! parse the text exposition, and derive a `ScrapedQueue` by the server's format. Deciding what
//! the numbers mean for scaling — the bound on the oldest wait, deltas between scrapes, staleness,
//! logging a failing episode once — is the core's; this module is stateless.
//!
//! One module per format, each documenting its derivation: [`vllm`], [`llamacpp`], [`tgi`],
//! [`triton`].
//!
//! The parser is `prom_text_format_parser` (MIT OR Apache-2.0): a complete grammar for the text
//! format (metric names with colons, escaped label values, optional whitespace, NaN/±Inf,
//! timestamps, comments), and it reports a malformed family without losing the others. The
//! alternatives were tried on the fixtures in `tests/fixtures/scrape/` and rejected:
//! `prometheus-parse` matches names with `\w+`, so it silently drops every `vllm:` and
//! `llamacpp:` series; `nom-openmetrics` stops at the blank lines TGI's exporter writes between
//! families; `openmetrics-parser` is LGPL-3.0, awkward inside a statically linked Apache-2.0
//! binary, and rejects a whole exposition for one family it finds invalid.

pub mod llamacpp;
pub mod tgi;
pub mod triton;
pub mod vllm;

use std::collections::HashMap;
use std::time::Duration;

use prom_text_format_parser::{Type, ValueType};

use crate::config::ScrapeFormat;
use crate::core::ScrapedQueue;

/// A metrics page larger than this is refused rather than buffered.
const MAX_BODY: usize = 8 << 20;

pub use hearth_core::core::ScrapeError;

/// Fetches `url` within `timeout` and derives the queue by `format`. Any failure — refused,
/// timed out, not 200, too large, unparseable, or lacking the format's metrics — is an `Err`
/// that says which, and the core treats it as no signal.
pub async fn run(
    client: &reqwest::Client,
    url: &str,
    format: ScrapeFormat,
    models: &[String],
    timeout: Duration,
) -> Result<ScrapedQueue, ScrapeError> {
    let text = fetch(client, url, timeout).await?;
    derive_for(&text, format, models)
}

/// The queue from one exposition, by format.
pub fn derive(text: &str, format: ScrapeFormat) -> Result<ScrapedQueue, ScrapeError> {
    derive_for(text, format, &[])
}

/// The queue from one exposition, by format; `models`: Triton's models whose request counters
/// count (empty: all).
pub fn derive_for(
    text: &str,
    format: ScrapeFormat,
    models: &[String],
) -> Result<ScrapedQueue, ScrapeError> {
    let e = Exposition::parse(text)?;
    match format {
        ScrapeFormat::Vllm => vllm::queue(&e),
        ScrapeFormat::Llamacpp => llamacpp::queue(&e),
        ScrapeFormat::Tgi => tgi::queue(&e),
        ScrapeFormat::Triton => triton::queue_of(&e, models),
    }
}

async fn fetch(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<String, ScrapeError> {
    // The timeout covers connecting, the headers and the whole body.
    let mut resp = client
        .get(url)
        // Servers that can speak OpenMetrics (Python's client) answer the classic text format.
        .header(reqwest::header::ACCEPT, "text/plain; version=0.0.4")
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| request_error(&e, timeout))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(ScrapeError::Status {
            url: url.to_string(),
            status: status.as_u16(),
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| request_error(&e, timeout))? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ScrapeError::TooLarge {
                limit: MAX_BODY,
                url: url.to_string(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| ScrapeError::NotUtf8 {
        url: url.to_string(),
    })
}

fn request_error(e: &reqwest::Error, timeout: Duration) -> ScrapeError {
    if e.is_timeout() {
        return ScrapeError::Timeout(timeout);
    }
    if e.is_connect() {
        return ScrapeError::Refused;
    }
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg = s.to_string();
        source = s.source();
    }
    ScrapeError::Request(msg)
}

/// One series' sample: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Point {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition, indexed by series name as written on the page: a histogram `x` is found
/// as `x_bucket`, `x_sum` and `x_count`, a summary as `x`, `x_sum` and `x_count`, whether or not
/// the page declared its type.
#[derive(Debug, Default)]
pub struct Exposition {
    series: HashMap<String, Vec<Point>>,
}

impl Exposition {
    pub fn parse(text: &str) -> Result<Exposition, ScrapeError> {
        // Per-family errors (say, a TYPE line with no samples) cost only that family; a line
        // that is not the text format at all rejects the page.
        let (metrics, error) = prom_text_format_parser::parse_scrape(text);
        if metrics.is_empty() {
            return Err(match error {
                Some(e) => ScrapeError::NotTextFormat(brief(&e)),
                None => ScrapeError::Empty,
            });
        }
        let mut series: HashMap<String, Vec<Point>> = HashMap::new();
        for m in metrics {
            for s in m.samples {
                let suffix = match (m.kind, s.value.value_type) {
                    (_, ValueType::Sum) => "_sum",
                    (_, ValueType::Count) => "_count",
                    (Type::Histogram, ValueType::Sample) => "_bucket",
                    _ => "",
                };
                // The parser has checked the number's syntax; Rust reads the same forms.
                let Ok(value) = s.value.value.parse::<f64>() else {
                    continue;
                };
                let labels = s
                    .labels
                    .iter()
                    .map(|l| (l.key.clone(), l.value.clone()))
                    .collect();
                series
                    .entry(format!("{}{suffix}", m.name))
                    .or_default()
                    .push(Point { labels, value });
            }
        }
        Ok(Exposition { series })
    }

    /// Every sample of the series `name`.
    pub fn points(&self, name: &str) -> &[Point] {
        self.series.get(name).map_or(&[], Vec::as_slice)
    }

    /// The series' value added up over all its label sets (engines, models, versions, finish
    /// reasons…); `None` when the page lacks it or a value is not a finite number.
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.sum_where(name, |_| true)
    }

    /// As [`Exposition::sum`], over the samples `keep` accepts; `None` when it accepts none.
    pub fn sum_where(&self, name: &str, keep: impl Fn(&Point) -> bool) -> Option<f64> {
        let mut kept = self.points(name).iter().filter(|p| keep(p)).peekable();
        kept.peek()?;
        let total: f64 = kept.map(|p| p.value).sum();
        total.is_finite().then_some(total)
    }

    /// A count (of requests) from the series: its sum, which must be a non-negative number.
    pub fn count(&self, name: &str) -> Option<u64> {
        to_count(self.sum(name)?)
    }

    /// As [`Exposition::count`], but the format cannot do without it.
    pub fn require_count(&self, name: &str, format: &str) -> Result<u64, ScrapeError> {
        match self.sum(name) {
            None => Err(ScrapeError::Lacks {
                name: name.to_string(),
                format: format.to_string(),
            }),
            Some(value) => to_count(value).ok_or_else(|| ScrapeError::NotACount {
                name: name.to_string(),
                value,
            }),
        }
    }
}

/// A whole, non-negative count; gauges and counters arrive as floats (`7.0`).
pub fn to_count(v: f64) -> Option<u64> {
    (v.is_finite() && v >= -0.5).then(|| v.round().max(0.0) as u64)
}

fn brief(e: &impl std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// The exposition texts the parser tests read: real captures or the documented shapes of each
/// server's page (see `tests/fixtures/scrape/README.md`).
#[cfg(test)]
pub(crate) mod fixtures {
    pub const VLLM: &str = include_str!("../../../tests/fixtures/scrape/vllm.prom");
    pub const LLAMACPP: &str = include_str!("../../../tests/fixtures/scrape/llamacpp.prom");
    pub const TGI: &str = include_str!("../../../tests/fixtures/scrape/tgi.prom");
    pub const TRITON: &str = include_str!("../../../tests/fixtures/scrape/triton.prom");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_found_by_their_written_names_with_labels() {
        let e = Exposition::parse(fixtures::VLLM).unwrap();
        let waiting = e.points("vllm:num_requests_waiting");
        assert_eq!(waiting.len(), 2, "one per data-parallel engine");
        assert_eq!(
            waiting[0].label("model_name"),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(waiting[1].label("engine"), Some("1"));
        // A histogram is indexed under its _bucket, _sum and _count series.
        let buckets = e.points("vllm:request_queue_time_seconds_bucket");
        assert_eq!(buckets.len(), 2 * 22, "21 bounds and +Inf, per engine");
        let inf = buckets
            .iter()
            .find(|p| p.label("le") == Some("+Inf") && p.label("engine") == Some("0"))
            .unwrap();
        assert_eq!(inf.value, 129.0);
        assert_eq!(e.sum("vllm:request_queue_time_seconds_count"), Some(237.0));
        assert_eq!(e.sum("vllm:request_queue_time_seconds_sum"), Some(37.5));
        // `_created` series are families of their own and never mistaken for the counter.
        assert_eq!(e.sum("vllm:request_success_total"), Some(221.0));
        assert!(e.sum("vllm:request_success_created").unwrap() > 1e9);
    }

    #[test]
    fn summaries_keep_quantiles_apart_from_sum_and_count() {
        let e = Exposition::parse(fixtures::TRITON).unwrap();
        let q = e.points("nv_inference_queue_summary_us");
        assert_eq!(q.len(), 3 * 5);
        assert!(q.iter().all(|p| p.label("quantile").is_some()));
        assert_eq!(e.sum("nv_inference_queue_summary_us_count"), Some(240.0));
        let tgi = Exposition::parse(fixtures::TGI).unwrap();
        assert_eq!(tgi.sum("tgi_request_skipped_tokens_count"), Some(3423.0));
    }

    #[test]
    fn label_values_may_hold_separators_and_escapes() {
        let text = "# TYPE x gauge\n\
                    x{path=\"/a,b=c}\",q=\"say \\\"hi\\\"\"} 2\n\
                    x{path=\"/d\"} 3.5\n";
        let e = Exposition::parse(text).unwrap();
        let p = e.points("x");
        assert_eq!(p[0].label("path"), Some("/a,b=c}"));
        assert_eq!(p[0].label("q"), Some("say \\\"hi\\\""));
        assert_eq!(e.sum("x"), Some(5.5));
    }

    #[test]
    fn a_family_without_samples_costs_only_itself() {
        let text = "# HELP a first\n# TYPE a gauge\na 1\n\
                    # HELP lora_info nothing yet\n# TYPE lora_info gauge\n\
                    # HELP b last\n# TYPE b counter\nb 2\n";
        let e = Exposition::parse(text).unwrap();
        assert_eq!((e.sum("a"), e.sum("b")), (Some(1.0), Some(2.0)));
    }

    #[test]
    fn pages_that_are_not_the_text_format_are_errors() {
        assert!(Exposition::parse("").is_err());
        let html = "<html><body>Not Found</body></html>\n";
        let err = Exposition::parse(html).unwrap_err().to_string();
        assert!(err.contains("not the Prometheus text format"), "{err}");
        let err = derive("{\"error\":\"no metrics\"}", ScrapeFormat::Vllm)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the Prometheus text format"), "{err}");
    }

    #[test]
    fn special_values_are_read_but_never_counted() {
        let text = "g NaN\nh +Inf\ni -1\nj 3.0\nk 2.5e+01\n";
        let e = Exposition::parse(text).unwrap();
        assert_eq!(e.sum("g"), None, "NaN is no number");
        assert_eq!(e.sum("h"), None);
        assert_eq!(e.count("i"), None, "a count is never negative");
        assert_eq!(e.count("j"), Some(3));
        assert_eq!(e.count("k"), Some(25));
        assert_eq!(e.count("absent"), None);
        let err = e.require_count("absent", "vLLM").unwrap_err().to_string();
        assert!(err.contains("lack absent") && err.contains("vLLM"), "{err}");
    }

    #[test]
    fn a_server_of_another_format_is_an_error_not_an_idle_queue() {
        for (text, wrong) in [
            (fixtures::LLAMACPP, ScrapeFormat::Vllm),
            (fixtures::VLLM, ScrapeFormat::Tgi),
            (fixtures::TGI, ScrapeFormat::Triton),
            (fixtures::TRITON, ScrapeFormat::Llamacpp),
        ] {
            let err = derive(text, wrong).unwrap_err().to_string();
            assert!(err.contains("the metrics lack"), "{wrong:?}: {err}");
        }
    }

    /// A one-shot HTTP server on loopback that answers with `response` (raw), or never answers.
    async fn serve_once(response: Option<String>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                req.extend_from_slice(&buf[..n]);
            }
            match response {
                Some(r) => {
                    let _ = sock.write_all(r.as_bytes()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(30)).await,
            }
        });
        url
    }

    fn http(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn a_page_is_fetched_and_read_by_its_format() {
        let url = serve_once(Some(http("200 OK", fixtures::LLAMACPP))).await;
        let client = crate::agent::probe::client();
        let q = run(
            &client,
            &url,
            ScrapeFormat::Llamacpp,
            &[],
            Duration::from_secs(2),
        )
        .await
        .unwrap();
        assert_eq!((q.queue_depth, q.in_flight), (2, 3));
    }

    #[tokio::test]
    async fn no_answer_in_time_is_an_error_within_the_timeout() {
        let url = serve_once(None).await;
        let client = crate::agent::probe::client();
        let started = std::time::Instant::now();
        let err = run(
            &client,
            &url,
            ScrapeFormat::Vllm,
            &[],
            Duration::from_millis(300),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("no answer within 300ms"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn refused_connections_and_http_errors_are_errors() {
        let client = crate::agent::probe::client();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}/metrics", l.local_addr().unwrap())
        };
        let err = run(
            &client,
            &closed,
            ScrapeFormat::Tgi,
            &[],
            Duration::from_secs(1),
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(err, "connection refused");
        let url = serve_once(Some(http("503 Service Unavailable", "loading"))).await;
        let err = run(
            &client,
            &url,
            ScrapeFormat::Tgi,
            &[],
            Duration::from_secs(1),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.ends_with("HTTP 503"), "{err}");
    }

    #[tokio::test]
    async fn an_endless_page_is_refused() {
        let big = "x 1\n".repeat(MAX_BODY / 4 + 1);
        let url = serve_once(Some(http("200 OK", &big))).await;
        let client = crate::agent::probe::client();
        let err = run(
            &client,
            &url,
            ScrapeFormat::Triton,
            &[],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("larger than"), "{err}");
    }
}
