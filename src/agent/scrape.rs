//! Scrapes a model server's Prometheus metrics for its queue.

use std::time::Duration;

use crate::config::ScrapeFormat;
use crate::core::ScrapedQueue;

pub async fn run(
    _client: &reqwest::Client,
    _url: &str,
    format: ScrapeFormat,
    _timeout: Duration,
) -> Result<ScrapedQueue, String> {
    Err(format!("scraping the {format:?} format is not built yet"))
}
