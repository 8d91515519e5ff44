//! The service manager's end of `NOTIFY_SOCKET`: every datagram the daemon sends, stamped on
//! arrival, in order.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{wait_until, Conn};

type AtReady = Arc<Mutex<Option<Result<Value, String>>>>;

pub struct NotifyRecorder {
    got: Arc<Mutex<Vec<(Instant, String)>>>,
    at_ready: AtReady,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl NotifyRecorder {
    /// Binds the datagram socket at `path`. With `control`, the recorder asks that control
    /// socket for `status` the moment the first READY=1 arrives: what a unit ordered
    /// After=hearth.service would find (see [`NotifyRecorder::status_at_ready`]).
    pub fn bind(path: &Path, control: Option<PathBuf>) -> NotifyRecorder {
        let sock = UnixDatagram::bind(path).expect("bind the notify socket");
        // Wakes the reader now and then to see whether it should stop.
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("a read timeout");
        let got = Arc::new(Mutex::new(Vec::new()));
        let at_ready: AtReady = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (g, r, s) = (got.clone(), at_ready.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                let Ok(n) = sock.recv(&mut buf) else {
                    continue;
                };
                let at = Instant::now();
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let first_ready =
                    msg.lines().any(|l| l == "READY=1") && r.lock().unwrap().is_none();
                if let (true, Some(control)) = (first_ready, &control) {
                    let answer = Conn::connect(control)
                        .and_then(|mut c| c.call(&json!({"op": "status"})))
                        .map_err(|e| e.to_string());
                    *r.lock().unwrap() = Some(answer);
                }
                g.lock().unwrap().push((at, msg));
            }
        });
        NotifyRecorder {
            got,
            at_ready,
            stop,
            thread: Some(thread),
        }
    }

    /// Every message so far, stamped.
    pub fn all(&self) -> Vec<(Instant, String)> {
        self.got.lock().unwrap().clone()
    }

    /// The first message at index ≥ `from` with a line equal to `line`, waiting up to
    /// `timeout`: (index, arrival, message).
    pub fn wait_line(
        &self,
        from: usize,
        line: &str,
        timeout: Duration,
    ) -> (usize, Instant, String) {
        wait_until(&format!("{line:?} on NOTIFY_SOCKET"), timeout, || {
            self.all()
                .into_iter()
                .enumerate()
                .skip(from)
                .find(|(_, (_, m))| m.lines().any(|l| l == line))
                .map(|(i, (at, m))| (i, at, m))
        })
    }

    /// When each WATCHDOG=1 arrived.
    pub fn pings(&self) -> Vec<Instant> {
        self.all()
            .into_iter()
            .filter(|(_, m)| m.lines().any(|l| l == "WATCHDOG=1"))
            .map(|(at, _)| at)
            .collect()
    }

    /// The control socket's answer to `status` when READY=1 arrived (see `bind`).
    pub fn status_at_ready(&self) -> Option<Result<Value, String>> {
        self.at_ready.lock().unwrap().clone()
    }
}

impl Drop for NotifyRecorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
