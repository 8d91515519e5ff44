//! The router's Prometheus exposition (GET /metrics): what happened to requests (counters and
//! histograms recorded as they go) and what the queue holds now (gauges read from the queue at
//! the scrape, so replicas that are gone leave no series behind). Names start `hearth_route_`.
//! Labels take only configured model names and status codes, never a name a client sent.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::queue::ModelState;
use super::settings::ModelRoute;
use crate::openmetrics::{self, family};

const PREFIX: &str = "hearth_route";

/// From a slot taken at once to a queue that waited for a cold start.
const WAIT_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// From a cached embedding to a long generation.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// A configured model, or "" when the request named none that exists.
    model: String,
    /// The HTTP status the client got; "499" when the client left before the answer ended.
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    model: String,
    replica: String,
}

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

type Histograms = Family<ModelLabel, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    models: Vec<String>,
    requests: Family<RequestLabels, Counter>,
    retries: Family<ModelLabel, Counter>,
    queue_wait: Histograms,
    first_byte: Histograms,
    upstream: Histograms,
}

impl Metrics {
    pub fn new(models: &[ModelRoute]) -> Metrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let requests = Family::<RequestLabels, Counter>::default();
        let retries = Family::<ModelLabel, Counter>::default();
        let queue_wait = Histograms::new_with_constructor(wait_histogram);
        let first_byte = Histograms::new_with_constructor(latency_histogram);
        let upstream = Histograms::new_with_constructor(latency_histogram);
        registry.register(
            "requests",
            "Requests answered, by model and HTTP status (499: the client left first; 502 also \
             counts answers cut off after their first byte)",
            requests.clone(),
        );
        registry.register(
            "retries",
            "Requests sent to a second replica after the first failed before any byte reached \
             the client",
            retries.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time from arrival to a free slot on a replica",
            queue_wait.clone(),
        );
        registry.register(
            "time_to_first_byte_seconds",
            "Time from arrival to the first byte of the answer leaving for the client",
            first_byte.clone(),
        );
        registry.register(
            "upstream_seconds",
            "Time from sending a request to a replica to the end of its answer",
            upstream.clone(),
        );
        Metrics {
            registry,
            models: models.iter().map(|m| m.name.clone()).collect(),
            requests,
            retries,
            queue_wait,
            first_byte,
            upstream,
        }
    }

    fn model_label(&self, model: Option<usize>) -> String {
        model
            .and_then(|i| self.models.get(i))
            .cloned()
            .unwrap_or_default()
    }

    pub fn request(&self, model: Option<usize>, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                model: self.model_label(model),
                status: status.to_string(),
            })
            .inc();
    }

    pub fn retry(&self, model: usize) {
        self.retries
            .get_or_create(&ModelLabel {
                model: self.model_label(Some(model)),
            })
            .inc();
    }

    pub fn queue_wait(&self, model: usize, seconds: f64) {
        self.observe(&self.queue_wait, model, seconds);
    }

    pub fn first_byte(&self, model: usize, seconds: f64) {
        self.observe(&self.first_byte, model, seconds);
    }

    pub fn upstream(&self, model: usize, seconds: f64) {
        self.observe(&self.upstream, model, seconds);
    }

    fn observe(&self, h: &Histograms, model: usize, seconds: f64) {
        h.get_or_create(&ModelLabel {
            model: self.model_label(Some(model)),
        })
        .observe(seconds);
    }

    /// The whole exposition: recorded series, then the queue's gauges now, then `# EOF`.
    pub fn render(&self, states: Vec<ModelState>, daemon_connected: bool) -> String {
        openmetrics::render(
            &self.registry,
            PREFIX,
            Box::new(Gauges {
                states,
                daemon_connected,
            }),
        )
    }
}

#[derive(Debug)]
struct Gauges {
    states: Vec<ModelState>,
    daemon_connected: bool,
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let per_model = |f: &dyn Fn(&ModelState) -> i64| {
            self.states
                .iter()
                .map(|s| {
                    (
                        ModelLabel {
                            model: s.name.clone(),
                        },
                        ConstGauge::new(f(s)),
                    )
                })
                .collect::<Vec<_>>()
        };
        family(
            &mut encoder,
            "queue_depth",
            "Requests waiting in the model's FIFO",
            per_model(&|s| s.queue_depth as i64),
        )?;
        family(
            &mut encoder,
            "queue_oldest_wait_seconds",
            "Age of the oldest request in the model's FIFO",
            self.states
                .iter()
                .map(|s| {
                    (
                        ModelLabel {
                            model: s.name.clone(),
                        },
                        ConstGauge::new(s.oldest_wait.as_secs_f64()),
                    )
                })
                .collect(),
        )?;
        family(
            &mut encoder,
            "in_flight",
            "Requests at the model's replicas",
            per_model(&|s| s.running as i64),
        )?;
        family(
            &mut encoder,
            "routed_replicas",
            "Replicas in the model's routed set, as the daemon last said",
            per_model(&|s| s.routed as i64),
        )?;
        family(
            &mut encoder,
            "replica_in_flight",
            "Requests at each replica the router sends to or still waits for",
            self.states
                .iter()
                .flat_map(|s| {
                    s.replicas.iter().map(|r| {
                        (
                            ReplicaLabels {
                                model: s.name.clone(),
                                replica: r.id.to_string(),
                            },
                            ConstGauge::new(i64::from(r.in_flight)),
                        )
                    })
                })
                .collect(),
        )?;
        let up = ConstGauge::new(i64::from(self.daemon_connected));
        let metric = encoder.encode_descriptor(
            "daemon_connected",
            "1 while the router follows the daemon's watch",
            None,
            up.metric_type(),
        )?;
        up.encode(metric)?;
        Ok(())
    }
}
