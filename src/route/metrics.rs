//! The router's Prometheus exposition (GET /metrics): what happened to requests (counters and
//! histograms recorded as they go) and what the queue holds now (gauges read from the queue at
//! the scrape, so replicas that are gone leave no series behind). Names start `hearth_route_`.
//! Labels take only configured model names and status codes, never a name a client sent.

use std::sync::OnceLock;

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
struct AnswerLabel {
    /// The agent check's answer: ready, drain, maint or down.
    answer: String,
}

/// The agent's answers, in the order of `agent_answers`.
const ANSWERS: [&str; 4] = ["ready", "drain", "maint", "down"];

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
    /// `agent_checks_total` by answer, made at start (four series, one increment a check).
    agent_answers: [Counter; 4],
    /// Per model (and one more for requests that named none), the series each request records,
    /// found once: a family's lookup hashes a label set of fresh strings and takes a lock, several
    /// times a request. A series still appears only once something was recorded in it.
    series: Vec<Series>,
}

/// A model's series, each made on first use.
struct Series {
    /// By status, 100 to 599 (others are looked up in the family each time).
    requests: Box<[OnceLock<Counter>]>,
    retries: OnceLock<Counter>,
    queue_wait: OnceLock<Histogram>,
    first_byte: OnceLock<Histogram>,
    upstream: OnceLock<Histogram>,
}

const STATUSES: std::ops::Range<u16> = 100..600;

impl Series {
    fn new() -> Series {
        Series {
            requests: STATUSES.map(|_| OnceLock::new()).collect(),
            retries: OnceLock::new(),
            queue_wait: OnceLock::new(),
            first_byte: OnceLock::new(),
            upstream: OnceLock::new(),
        }
    }
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
        let agent = Family::<AnswerLabel, Counter>::default();
        registry.register(
            "agent_checks",
            "HAProxy agent checks answered, by answer (ready, drain, maint, down)",
            agent.clone(),
        );
        let agent_answers = ANSWERS.map(|a| {
            agent
                .get_or_create(&AnswerLabel { answer: a.into() })
                .clone()
        });
        Metrics {
            agent_answers,
            registry,
            series: (0..=models.len()).map(|_| Series::new()).collect(),
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

    /// A model's series; requests that named no model share the last.
    fn series(&self, model: Option<usize>) -> &Series {
        let i = model
            .filter(|&i| i < self.models.len())
            .unwrap_or(self.models.len());
        &self.series[i]
    }

    pub fn request(&self, model: Option<usize>, status: u16) {
        let labels = || RequestLabels {
            model: self.model_label(model),
            status: status.to_string(),
        };
        if !STATUSES.contains(&status) {
            self.requests.get_or_create(&labels()).inc();
            return;
        }
        self.series(model).requests[usize::from(status - STATUSES.start)]
            .get_or_init(|| self.requests.get_or_create(&labels()).clone())
            .inc();
    }

    /// An agent check answered (`answer`: one of ready, drain, maint, down).
    pub fn agent_check(&self, answer: &str) {
        if let Some(i) = ANSWERS.iter().position(|a| *a == answer) {
            self.agent_answers[i].inc();
        }
    }

    pub fn retry(&self, model: usize) {
        self.series(Some(model))
            .retries
            .get_or_init(|| {
                self.retries
                    .get_or_create(&ModelLabel {
                        model: self.model_label(Some(model)),
                    })
                    .clone()
            })
            .inc();
    }

    pub fn queue_wait(&self, model: usize, seconds: f64) {
        let s = &self.series(Some(model)).queue_wait;
        self.observe(s, &self.queue_wait, model, seconds);
    }

    pub fn first_byte(&self, model: usize, seconds: f64) {
        let s = &self.series(Some(model)).first_byte;
        self.observe(s, &self.first_byte, model, seconds);
    }

    pub fn upstream(&self, model: usize, seconds: f64) {
        let s = &self.series(Some(model)).upstream;
        self.observe(s, &self.upstream, model, seconds);
    }

    fn observe(&self, series: &OnceLock<Histogram>, h: &Histograms, model: usize, seconds: f64) {
        series
            .get_or_init(|| {
                h.get_or_create(&ModelLabel {
                    model: self.model_label(Some(model)),
                })
                .clone()
            })
            .observe(seconds);
    }

    /// The whole exposition: recorded series, then the queue's gauges now, then `# EOF`.
    /// `drain`: per model as `states`, 0 serving, 1 answering balancers `drain`, 2 drained.
    pub fn render(
        &self,
        states: Vec<ModelState>,
        daemon_connected: bool,
        drain: Vec<u8>,
    ) -> String {
        openmetrics::render(
            &self.registry,
            PREFIX,
            Box::new(Gauges {
                states,
                daemon_connected,
                drain,
            }),
        )
    }
}

#[derive(Debug)]
struct Gauges {
    states: Vec<ModelState>,
    daemon_connected: bool,
    drain: Vec<u8>,
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
        family(
            &mut encoder,
            "draining",
            "0 serving; 1 answering the balancers' agent checks drain, still serving; 2 drained, \
             refusing (503) what still comes",
            self.states
                .iter()
                .zip(&self.drain)
                .map(|(s, d)| {
                    (
                        ModelLabel {
                            model: s.name.clone(),
                        },
                        ConstGauge::new(i64::from(*d)),
                    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn series_appear_when_first_recorded_and_count_every_request() {
        let settings = crate::route::settings::RouteSettings::defaults(
            PathBuf::from("/nonexistent"),
            vec![
                ("a".to_string(), Duration::from_secs(1)),
                ("b".to_string(), Duration::from_secs(1)),
            ],
        );
        let m = Metrics::new(&settings.models);
        let text = m.render(Vec::new(), false, Vec::new());
        assert!(!text.contains("hearth_route_requests_total{"), "{text}");
        assert!(!text.contains("hearth_route_queue_wait_seconds_count{"));
        for _ in 0..3 {
            m.request(Some(0), 200);
        }
        m.request(Some(1), 429);
        m.request(None, 404);
        m.request(Some(7), 404);
        m.request(Some(0), 999);
        m.retry(1);
        m.queue_wait(0, 0.001);
        m.queue_wait(0, 0.002);
        m.first_byte(1, 0.01);
        m.upstream(0, 0.5);
        let text = m.render(Vec::new(), false, Vec::new());
        for line in [
            r#"hearth_route_requests_total{model="a",status="200"} 3"#,
            r#"hearth_route_requests_total{model="b",status="429"} 1"#,
            r#"hearth_route_requests_total{model="",status="404"} 2"#,
            r#"hearth_route_requests_total{model="a",status="999"} 1"#,
            r#"hearth_route_retries_total{model="b"} 1"#,
            r#"hearth_route_queue_wait_seconds_count{model="a"} 2"#,
            r#"hearth_route_time_to_first_byte_seconds_count{model="b"} 1"#,
            r#"hearth_route_upstream_seconds_count{model="a"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(!text.contains(r#"queue_wait_seconds_count{model="b"}"#));
        assert!(!text.contains(r#"retries_total{model="a"}"#));
    }
}
