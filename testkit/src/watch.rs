//! A `watch` connection read by a thread of its own: every event in order, stamped the moment it
//! arrived (the clock latency figures and orderings are read on).

use std::io::BufRead;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::Conn;

/// An event as it arrived.
#[derive(Debug, Clone)]
pub struct Ev {
    pub at: Instant,
    pub v: Value,
}

#[derive(Default)]
struct Events {
    list: Vec<Ev>,
    /// The daemon closed the connection.
    closed: bool,
}

type Shared = Arc<(Mutex<Events>, Condvar)>;

pub struct Watch {
    shared: Shared,
    stream: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Opens a watch on `model` (every model with None); panics unless the daemon accepts it.
    pub fn open(socket: &Path, model: Option<&str>) -> Watch {
        let mut conn = Conn::connect(socket).expect("connect for watch");
        let mut req = json!({"op": "watch"});
        if let Some(m) = model {
            req["model"] = json!(m);
        }
        let answer = conn.call(&req).expect("the watch answer");
        assert_eq!(answer["ok"], json!(true), "watch refused: {answer}");
        let (mut reader, stream) = conn.into_parts();
        stream.set_read_timeout(None).expect("no read timeout");
        let shared: Shared = Arc::default();
        let sink = shared.clone();
        let thread = std::thread::spawn(move || loop {
            let mut line = String::new();
            let n = reader.read_line(&mut line).unwrap_or(0);
            let at = Instant::now();
            let (lock, cv) = &*sink;
            let mut g = lock.lock().unwrap();
            if n == 0 {
                g.closed = true;
                cv.notify_all();
                return;
            }
            let v = serde_json::from_str(&line)
                .unwrap_or_else(|e| json!({"unparsable": line, "error": e.to_string()}));
            g.list.push(Ev { at, v });
            cv.notify_all();
        });
        Watch {
            shared,
            stream,
            thread: Some(thread),
        }
    }

    pub fn len(&self) -> usize {
        self.shared.0.lock().unwrap().list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn events(&self) -> Vec<Ev> {
        self.shared.0.lock().unwrap().list.clone()
    }

    /// The events without their stamps.
    pub fn values(&self) -> Vec<Value> {
        let g = self.shared.0.lock().unwrap();
        g.list.iter().map(|e| e.v.clone()).collect()
    }

    /// Whether the daemon closed the connection.
    pub fn closed(&self) -> bool {
        self.shared.0.lock().unwrap().closed
    }

    /// The first event at index ≥ `from` that matches, waiting up to `timeout`: its index and
    /// the event. None at the deadline, or once the daemon closed the watch.
    pub fn wait_for(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<(usize, Ev)> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.shared;
        let mut g = lock.lock().unwrap();
        let mut i = from;
        loop {
            while i < g.list.len() {
                if pred(&g.list[i].v) {
                    return Some((i, g.list[i].clone()));
                }
                i += 1;
            }
            let now = Instant::now();
            if now >= deadline || g.closed {
                return None;
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// Every routed set published for `model`, in order (replica ids, sorted).
    pub fn routed_sets(&self, model: &str) -> Vec<Vec<String>> {
        let g = self.shared.0.lock().unwrap();
        g.list
            .iter()
            .filter(|e| e.v["event"] == "routed" && e.v["model"] == model)
            .map(|e| endpoint_ids(&e.v))
            .collect()
    }

    /// The endpoints (replica, addr) of the latest routed set of `model`.
    pub fn routed(&self, model: &str) -> Vec<(String, String)> {
        let g = self.shared.0.lock().unwrap();
        g.list
            .iter()
            .rev()
            .find(|e| e.v["event"] == "routed" && e.v["model"] == model)
            .map(|e| endpoints(&e.v))
            .unwrap_or_default()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The endpoints (replica, addr) of a `routed` event, in its order.
pub fn endpoints(ev: &Value) -> Vec<(String, String)> {
    ev["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("replica"), s("addr"))
        })
        .collect()
}

/// The replica ids of a `routed` event, sorted.
pub fn endpoint_ids(ev: &Value) -> Vec<String> {
    let mut ids: Vec<String> = endpoints(ev).into_iter().map(|(id, _)| id).collect();
    ids.sort();
    ids
}

/// A predicate for `{"event":"replica","replica":ID,"state":STATE}`.
pub fn replica_event(id: &str, state: &str) -> impl Fn(&Value) -> bool {
    let (id, state) = (id.to_string(), state.to_string());
    move |v| v["event"] == "replica" && v["replica"] == id.as_str() && v["state"] == state.as_str()
}
