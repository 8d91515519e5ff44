//! Prometheus exposition at `daemon.metrics` (GET /metrics, OpenMetrics text).
//!
//! Two sources, so that every number means what `hearth status` means:
//! - gauges (replicas per state, queue, GPUs) and the restart counter are read from a status
//!   snapshot that the core's task takes when the scrape arrives: the core owns that state, and
//!   a copy kept on the side could drift from it;
//! - counters of things that happen (scale decisions, reports) and the time-to-ready histogram
//!   are recorded by the event loop as it applies the core's actions, in `Recorder`.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::inbox::{self, ShellMsg};
use crate::openmetrics::{self, family, single};
use crate::protocol::StatusView;

/// Every metric name starts with this.
const PREFIX: &str = "hearth";

/// From a 1 ms promotion to a 20 min cold start of a large model.
const READY_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1200.0,
];

/// How long a scrape waits for the core's snapshot. A core that cannot answer in this time is
/// stalled (the watchdog will say so too); the scrape fails rather than hanging.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScaleLabels {
    model: String,
    /// "up" or "down"
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadyLabels {
    model: String,
    /// "cold" (spawn → warm) or "promote" (decision → routed)
    path: String,
}

/// How capacity became ready, for `hearth_time_to_ready_seconds{path}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyPath {
    Cold,
    Promote,
    /// A sleeping replica woken (docs/sleep.md).
    Wake,
}

fn ready_histogram() -> Histogram {
    Histogram::new(READY_BUCKETS)
}

/// The counters and the histogram the event loop records into; shared with the HTTP task,
/// which only reads them (they are atomics).
pub struct Recorder {
    registry: Registry,
    scale_events: Family<ScaleLabels, Counter>,
    reports: Family<ModelLabel, Counter>,
    time_to_ready: Family<ReadyLabels, Histogram, fn() -> Histogram>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        let mut registry = Registry::with_prefix(PREFIX);
        let scale_events = Family::<ScaleLabels, Counter>::default();
        let reports = Family::<ModelLabel, Counter>::default();
        let time_to_ready =
            Family::<ReadyLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                ready_histogram,
            );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "scale_events",
            "Scale decisions that changed a model's desired routed count",
            scale_events.clone(),
        );
        registry.register(
            "reports",
            "Queue reports accepted on the socket",
            reports.clone(),
        );
        registry.register(
            "time_to_ready_seconds",
            "Time until capacity was ready: cold = spawn to warm-up passed; promote = from the \
             event that led to a promotion to the routed set that holds the replica",
            time_to_ready.clone(),
        );
        Recorder {
            registry,
            scale_events,
            reports,
            time_to_ready,
        }
    }

    pub fn scale(&self, model: &str, from: u32, to: u32) {
        let direction = if to > from { "up" } else { "down" };
        self.scale_events
            .get_or_create(&ScaleLabels {
                model: model.to_string(),
                direction: direction.to_string(),
            })
            .inc();
    }

    pub fn report(&self, model: &str) {
        self.reports
            .get_or_create(&ModelLabel {
                model: model.to_string(),
            })
            .inc();
    }

    pub fn ready(&self, model: &str, path: ReadyPath, seconds: f64) {
        let path = match path {
            ReadyPath::Cold => "cold",
            ReadyPath::Promote => "promote",
            ReadyPath::Wake => "wake",
        };
        self.time_to_ready
            .get_or_create(&ReadyLabels {
                model: model.to_string(),
                path: path.to_string(),
            })
            .observe(seconds);
    }

    /// The whole exposition: what the event loop recorded, then the snapshot, then `# EOF`.
    pub fn render(&self, snapshot: StatusView) -> String {
        openmetrics::render(&self.registry, PREFIX, Box::new(Snapshot(snapshot)))
    }
}

/// The gauges of one status snapshot.
#[derive(Debug)]
struct Snapshot(StatusView);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let st = &self.0;
        let mut replicas = Vec::new();
        for m in &st.models {
            // The same five counts as `hearth status` (draining includes stopping).
            for (state, n) in [
                ("pending", m.pending),
                ("starting", m.starting),
                ("warm", m.warm),
                ("routed", m.routed),
                ("draining", m.draining),
            ] {
                replicas.push((
                    [("model", m.name.as_str()), ("state", state)],
                    ConstGauge::new(i64::from(n)),
                ));
            }
            // A model with a sleeping tier has two more.
            if m.wake.is_some() {
                for (state, n) in [("sleeping", m.sleeping), ("waking", m.waking)] {
                    replicas.push((
                        [("model", m.name.as_str()), ("state", state)],
                        ConstGauge::new(i64::from(n)),
                    ));
                }
            }
        }
        family(
            &mut encoder,
            "replicas",
            "Replicas per model and state, as hearth status counts them",
            replicas,
        )?;
        let model = |name: &str| [("model", name.to_string())];
        // Only models with a fresh signal: a stale one is no measurement, and 0 would be a lie.
        family(
            &mut encoder,
            "queue_oldest_wait_seconds",
            "Age of the oldest waiting request, from the latest fresh reports",
            st.models
                .iter()
                .filter_map(|m| {
                    let ms = m.signal.oldest_wait_ms?;
                    Some((model(&m.name), ConstGauge::new(ms / 1000.0)))
                })
                .collect(),
        )?;
        family(
            &mut encoder,
            "queue_depth",
            "Requests waiting, from the latest fresh reports",
            st.models
                .iter()
                .filter_map(|m| {
                    let depth = m.signal.queue_depth?;
                    Some((model(&m.name), ConstGauge::new(depth as i64)))
                })
                .collect(),
        )?;
        family(
            &mut encoder,
            "replica_restarts",
            "Replicas that failed and were replaced, since the daemon started",
            st.models
                .iter()
                .map(|m| (model(&m.name), ConstCounter::new(m.restarts_total)))
                .collect(),
        )?;
        family(
            &mut encoder,
            "gave_way",
            "Replicas put to sleep or stopped to make room for another model's start or wake, \
             since the daemon started",
            st.models
                .iter()
                .map(|m| (model(&m.name), ConstCounter::new(m.gave_way_total)))
                .collect(),
        )?;
        let host = &st.daemon.sleeping_host_memory;
        single(
            &mut encoder,
            "sleeping_host_memory_bytes",
            "Host RAM held by sleeping replicas (their [model.sleep] host_memory)",
            ConstGauge::new(host.held_bytes as i64),
        )?;
        if let Some(budget) = host.budget_bytes {
            single(
                &mut encoder,
                "sleeping_host_memory_budget_bytes",
                "[daemon] host_memory: what sleeping replicas may hold in host RAM",
                ConstGauge::new(budget as i64),
            )?;
        }
        let gpu = |uuid: &str| [("gpu", uuid.to_string())];
        family(
            &mut encoder,
            "gpu_memory_reserved_bytes",
            "GPU memory reserved by hearth's replicas",
            st.gpus
                .iter()
                .map(|g| (gpu(&g.uuid), ConstGauge::new(g.memory_reserved as i64)))
                .collect(),
        )?;
        family(
            &mut encoder,
            "gpu_healthy",
            "1 while the device is healthy (no critical XID since it was last uncordoned), else 0",
            st.gpus
                .iter()
                .map(|g| (gpu(&g.uuid), ConstGauge::new(i64::from(g.healthy))))
                .collect(),
        )?;
        Ok(())
    }
}

/// Serves GET /metrics on `listener` until `shutdown`. Each scrape asks the core's task for a
/// status snapshot over its inbox, like a control request would.
pub async fn serve(
    listener: TcpListener,
    recorder: Arc<Recorder>,
    to_core: inbox::Sender,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: don't spin, don't die.
                    tracing::warn!("metrics: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let recorder = recorder.clone();
        let to_core = to_core.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let recorder = recorder.clone();
                let to_core = to_core.clone();
                async move { Ok::<_, Infallible>(answer(req, &recorder, &to_core).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(io, service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                }
            }
        });
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn answer<B>(
    req: Request<B>,
    recorder: &Recorder,
    to_core: &inbox::Sender,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            "hearth serves Prometheus metrics at /metrics\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".into());
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    let (tx, rx) = oneshot::channel();
    if to_core
        .send(ShellMsg::Snapshot { reply: tx })
        .await
        .is_err()
    {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "hearth is stopping\n".into(),
        );
    }
    let snapshot = match tokio::time::timeout(SNAPSHOT_TIMEOUT, rx).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "hearth is stopping\n".into(),
            )
        }
        Err(_) => {
            let mut msg = String::new();
            let _ = writeln!(
                msg,
                "the core did not answer within {}s",
                SNAPSHOT_TIMEOUT.as_secs()
            );
            return text(StatusCode::SERVICE_UNAVAILABLE, msg);
        }
    };
    let body = recorder.render(snapshot);
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(openmetrics::CONTENT_TYPE),
    );
    r
}

/// Binds the metrics listener before anything starts, so a taken port fails the start (exit 1)
/// instead of a metrics endpoint that silently never appears.
pub async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding daemon.metrics {addr}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{GpuView, ModelView, SignalView};

    fn model(name: &str) -> ModelView {
        serde_json::from_value(serde_json::json!({
            "name": name, "version": "1", "health": "ok", "routed": 2, "warm": 1,
            "starting": 0, "pending": 0, "draining": 1, "desired_routed": 2, "min": 2, "max": 4,
            "warm_pool": 1, "target_wait_ms": 500, "signal": {}, "last_scale": null,
            "restarts_total": 3, "gave_way_total": 2, "replicas": []
        }))
        .unwrap()
    }

    #[test]
    fn the_exposition_holds_every_family_with_its_values() {
        let r = Recorder::new();
        r.scale("m", 2, 3);
        r.report("m");
        r.report("m");
        r.ready("m", ReadyPath::Cold, 1.5);
        let mut m = model("m");
        m.signal = SignalView {
            oldest_wait_ms: Some(250.0),
            queue_depth: Some(7),
            in_flight: Some(1),
            age_ms: Some(10),
            router: None,
            routers: Vec::new(),
        };
        let quiet = model("q");
        let gpus = vec![GpuView {
            index: 0,
            uuid: "GPU-a".into(),
            name: "static device".into(),
            memory_total: 80 << 30,
            memory_reserved: 40 << 30,
            healthy: true,
            cordoned: false,
            replicas: vec![],
            memory_used: None,
            memory_foreign: None,
            note: None,
            topology: None,
            memory_driver_reserved: None,
            mig_parent: None,
            nvlink: Vec::new(),
            asleep: Vec::new(),
        }];
        let mut daemon: crate::protocol::DaemonView = Default::default();
        daemon.sleeping_host_memory.held_bytes = 8 << 30;
        let text = r.render(StatusView {
            daemon: Box::new(daemon),
            models: vec![m, quiet],
            gpus,
        });
        for line in [
            "hearth_scale_events_total{model=\"m\",direction=\"up\"} 1",
            "hearth_reports_total{model=\"m\"} 2",
            "hearth_time_to_ready_seconds_count{model=\"m\",path=\"cold\"} 1",
            "hearth_time_to_ready_seconds_bucket{le=\"2.5\",model=\"m\",path=\"cold\"} 1",
            "hearth_replicas{model=\"m\",state=\"routed\"} 2",
            "hearth_replicas{model=\"q\",state=\"draining\"} 1",
            "hearth_queue_oldest_wait_seconds{model=\"m\"} 0.25",
            "hearth_queue_depth{model=\"m\"} 7",
            "hearth_replica_restarts_total{model=\"m\"} 3",
            "hearth_gave_way_total{model=\"m\"} 2",
            "hearth_sleeping_host_memory_bytes 8589934592",
            "hearth_gpu_memory_reserved_bytes{gpu=\"GPU-a\"} 42949672960",
            "hearth_gpu_healthy{gpu=\"GPU-a\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        assert!(
            !text.contains("hearth_queue_depth{model=\"q\"}"),
            "no fresh signal, no sample"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
