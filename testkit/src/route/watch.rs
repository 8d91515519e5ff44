//! A watch on the daemon, its events stamped on arrival.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Events in order of arrival, stamped, and a condition to wait for more.
type Events = Arc<(Mutex<Vec<(Instant, Value)>>, Condvar)>;

/// A watch on the daemon, read by a thread; events stamped on arrival.
pub struct Watch {
    events: Events,
    stream: UnixStream,
}

impl Watch {
    pub fn open(socket: &Path) -> Watch {
        let mut s = UnixStream::connect(socket).expect("connect for watch");
        s.write_all(b"{\"op\":\"watch\"}\n").unwrap();
        let events: Events = Arc::default();
        let e2 = events.clone();
        let reader = BufReader::new(s.try_clone().unwrap());
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                let (lock, cv) = &*e2;
                lock.lock().unwrap().push((Instant::now(), v));
                cv.notify_all();
            }
        });
        Watch { events, stream: s }
    }

    /// The first event at or after index `from` that matches, within `timeout`.
    pub fn wait_for(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<(usize, Instant, Value)> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.events;
        let mut g = lock.lock().unwrap();
        let mut i = from;
        loop {
            while i < g.len() {
                if pred(&g[i].1) {
                    return Some((i, g[i].0, g[i].1.clone()));
                }
                i += 1;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    pub fn events(&self) -> Vec<(Instant, Value)> {
        self.events.0.lock().unwrap().clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The replica ids of a `routed` event.
pub fn endpoint_ids(ev: &Value) -> Vec<String> {
    let mut ids: Vec<String> = ev["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["replica"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}
