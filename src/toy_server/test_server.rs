//! A toy server running inside the test process on an ephemeral port, for the unit tests of
//! every part of the toy server.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::{serve, Reporter, ToyArgs};

/// The flags' defaults, on an ephemeral port.
pub fn args() -> ToyArgs {
    ToyArgs {
        port: 0,
        host: "127.0.0.1".into(),
        load_time: Duration::ZERO,
        concurrency: 1,
        service_time: Duration::from_millis(200),
        token_time: Duration::ZERO,
        model: None,
        fail_warmup: false,
        crash_after: None,
        hang_after: None,
        read_file: None,
        report_socket: None,
        fork_worker: false,
        ignore_sigterm: false,
        marks: None,
        sleep_time: Duration::ZERO,
        wake_time: Duration::ZERO,
        hold_memory: 0,
        listen_fd: None,
    }
}

pub struct Server {
    pub base: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub http: reqwest::Client,
}

impl Server {
    pub async fn start(args: ToyArgs, reporter: Option<Reporter>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, args, reporter, async {
            let _ = rx.await;
        }));
        Server {
            base,
            stop: Some(tx),
            task,
            http: reqwest::Client::new(),
        }
    }

    /// `host:port`, for raw TCP.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    pub async fn get(&self, path: &str) -> reqwest::Result<(u16, String)> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await?;
        Ok((r.status().as_u16(), r.text().await?))
    }

    pub fn complete(&self, body: &str) -> impl Future<Output = reqwest::Result<(u16, Value)>> {
        let req = self
            .http
            .post(format!("{}/v1/completions", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(Duration::from_secs(10));
        async move {
            let r = req.send().await?;
            let status = r.status().as_u16();
            let text = r.text().await?;
            Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
        }
    }

    /// The samples on `/metrics`, by name.
    pub async fn metrics(&self) -> HashMap<String, f64> {
        let (status, text) = self.get("/metrics").await.unwrap();
        assert_eq!(status, 200);
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
            .collect()
    }

    /// (arrived, completed) from `/metrics`.
    pub async fn arrived_and_completed(&self) -> (f64, f64) {
        let m = self.metrics().await;
        (
            m["toy_requests_arrived_total"],
            m["toy_requests_completed_total"],
        )
    }

    /// Asks the server to shut down and waits (at most 10 s) for `serve` to return.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `f` until it yields `Some`, failing the test after `limit`.
pub async fn until<T, Fut: Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> Fut,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
