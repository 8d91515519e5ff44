//! The OpenMetrics text both endpoints serve (the daemon's `daemon.metrics`, the router's
//! GET /metrics): what was recorded as it happened, then gauges read at the scrape, then `# EOF`.
//! One encoder, so the two expositions cannot drift apart in format.
#![forbid(unsafe_code)]

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::registry::Registry;

/// The Content-Type of an exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The whole exposition: `recorded`'s series, then what `now` reads at this scrape (named with
/// `prefix`, like `recorded`'s), then `# EOF`. Series of `now` that are gone leave nothing
/// behind, since its registry lives only for this scrape.
pub fn render(recorded: &Registry, prefix: &str, now: Box<dyn Collector>) -> String {
    let mut out = String::new();
    let mut fresh = Registry::with_prefix(prefix);
    fresh.register_collector(now);
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode_registry(&mut out, recorded);
    let _ = prometheus_client::encoding::text::encode_registry(&mut out, &fresh);
    let _ = prometheus_client::encoding::text::encode_eof(&mut out);
    out
}

/// One metric family from (labels, value) pairs; nothing at all when there are none.
pub fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<(L, M)>,
) -> Result<(), std::fmt::Error> {
    let Some((_, first)) = samples.first() else {
        return Ok(());
    };
    let kind = first.metric_type();
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in &samples {
        value.encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

/// One metric of no labels.
pub fn single<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: M,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, value.metric_type())?;
    value.encode(metric)
}
