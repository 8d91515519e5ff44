//! Why a scrape of a replica's metrics gave no queue, as the shell tells the core.

use std::time::Duration;

/// Why a scrape gave no queue: the page could not be had, was not the text format, or lacks
/// what the server's format needs. The core takes it as no signal and logs its words; the shell's
/// scraper (src/agent/scrape/) is what makes one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScrapeError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("connection refused")]
    Refused,
    #[error("request failed: {0}")]
    Request(String),
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: metrics larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("GET {url}: metrics are not UTF-8")]
    NotUtf8 { url: String },
    #[error("the metrics page is empty")]
    Empty,
    #[error("not the Prometheus text format: {0}")]
    NotTextFormat(String),
    #[error("the metrics lack {name}: is this a {format} server, with metrics enabled?")]
    Lacks { name: String, format: String },
    #[error("{name} is {value}, not a count")]
    NotACount { name: String, value: f64 },
    /// Triton's `models`: none of them is on the page.
    #[error("{format}: none of the models {models:?} is on the page ({series})")]
    NoModel {
        format: String,
        models: Vec<String>,
        series: String,
    },
}
