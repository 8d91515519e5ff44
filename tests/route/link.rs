//! The router's link to the daemon, seen from the daemon's side of the socket. A scripted
//! daemon (protocol 1 on a real Unix socket, in this test) hands out routed sets and records
//! every report, so the test can see exactly what the router says, and can go away and come
//! back without taking replicas with it (the real daemon's replicas die with it). The replicas
//! are real `hearth toy-server` processes, the router the real binary.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::route::*;

const T: Duration = Duration::from_secs(30);

type Reports = Arc<Mutex<Vec<(Instant, Value)>>>;

struct Scripted {
    path: PathBuf,
    reports: Reports,
    conns: Arc<Mutex<Vec<UnixStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scripted {
    /// Listens at `path`; every watch gets `routed` as its snapshot.
    fn start(path: &Path, routed: Vec<Value>, reports: Reports) -> Scripted {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        let conns: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, s2, r2) = (conns.clone(), stop.clone(), reports.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                c2.lock().unwrap().push(conn.try_clone().unwrap());
                let (routed, reports) = (routed.clone(), r2.clone());
                std::thread::spawn(move || serve(conn, routed, reports));
            }
        });
        Scripted {
            path: path.to_path_buf(),
            reports,
            conns,
            stop,
            thread: Some(thread),
        }
    }

    /// The daemon goes away: every connection closes, the socket file goes.
    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }

    fn reports_since(&self, t: Instant) -> Vec<Value> {
        self.reports
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= t)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn serve(conn: UnixStream, routed: Vec<Value>, reports: Reports) {
    let mut w = conn.try_clone().unwrap();
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            return;
        };
        let answer = match v["op"].as_str() {
            Some("watch") => {
                let mut out = String::from("{\"ok\":true}\n");
                for ev in &routed {
                    out.push_str(&format!("{ev}\n"));
                }
                out
            }
            Some("report") => {
                reports.lock().unwrap().push((Instant::now(), v.clone()));
                "{\"ok\":true}\n".to_string()
            }
            _ => "{\"ok\":false,\"error\":\"unknown_op\",\"message\":\"scripted\"}\n".to_string(),
        };
        if w.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

struct Toy(Child);

impl Toy {
    /// A toy server on `port`, carrying `home`'s mark (so that its cleanup finds it too).
    fn start(home: &Home, port: u16) -> Toy {
        let (mark, value) = home.mark();
        let mut cmd = Command::new(hearth());
        cmd.args([
            "toy-server",
            "--port",
            &port.to_string(),
            "--service-time",
            "20ms",
        ])
        .env_remove("HEARTH_SOCKET")
        .env(mark, value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let t = Toy(cmd.spawn().unwrap());
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_until("the toy server", T, || {
            get(addr, "/health").ok().filter(|r| r.status == 200)
        });
        t
    }
}

impl Drop for Toy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn routed(model: &str, replicas: &[(&str, u16)]) -> Value {
    json!({"event": "routed", "model": model, "endpoints": replicas.iter()
        .map(|(id, port)| json!({"replica": id, "addr": format!("127.0.0.1:{port}")}))
        .collect::<Vec<_>>()})
}

#[test]
fn reports_say_the_queue_and_the_router_serves_on_while_the_daemon_is_away() {
    // The daemon's directory and file, and no daemon: this test plays it.
    let (home, _) = front_door_daemon(
        [
            Model::front_toy("a", &[]).scale(1, 1, 0).slots(2),
            Model::front_toy("b", &[]).scale(1, 1, 0),
        ],
        "queue_timeout = \"2m\"\n",
    )
    .prepare();
    let ports = (ports::ports(1), ports::ports(1));
    let (pa, pb) = (ports.0.first, ports.1.first);
    let _toys = (Toy::start(&home, pa), Toy::start(&home, pb));
    let reports: Reports = Arc::default();
    // At first the daemon routes a's replica, and nothing for b.
    let daemon = Scripted::start(
        &home.socket,
        vec![routed("a", &[("a-1", pa)]), routed("b", &[])],
        reports.clone(),
    );
    let router = Router::start(&home);
    let addr = router.addr;
    wait_until("a routed at the router", T, || {
        (router.metric("hearth_route_routed_replicas{model=\"a\"}")? == 1.0).then_some(())
    });
    for _ in 0..3 {
        assert_eq!(complete(addr, "a", T).unwrap().status, 200);
    }

    // Reports: every 100 ms a model-wide report per model, and one per replica.
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let got = daemon.reports_since(t0);
    let wide_a: Vec<&Value> = got
        .iter()
        .filter(|r| r["model"] == "a" && r.get("replica").is_none())
        .collect();
    let per_replica: Vec<&Value> = got.iter().filter(|r| r["replica"] == "a-1").collect();
    assert!(
        wide_a.len() >= 4,
        "model-wide reports in 1 s: {}",
        wide_a.len()
    );
    assert!(
        per_replica.len() >= 4,
        "replica reports in 1 s: {}",
        per_replica.len()
    );
    let last = wide_a.last().unwrap();
    assert_eq!(last["queue_depth"], 0, "{last}");
    assert_eq!(last["oldest_wait_ms"], 0.0, "{last}");
    assert_eq!(last["arrived"], 3, "{last}");
    assert_eq!(last["completed"], 3, "{last}");
    let rep = per_replica.last().unwrap();
    assert_eq!(
        (
            rep["in_flight"].clone(),
            rep["arrived"].clone(),
            rep["completed"].clone()
        ),
        (json!(0), json!(3), json!(3)),
        "{rep}"
    );
    assert!(got.iter().all(|r| r["op"] == "report"));

    // A request for b, which has nothing routed: held, reported at once as waiting work.
    let sent = Instant::now();
    let held = spawn(move || complete(addr, "b", Duration::from_secs(120)));
    let waiting = wait_until("a report of b's waiting request", T, || {
        daemon
            .reports_since(sent)
            .into_iter()
            .find(|r| r["model"] == "b" && r["queue_depth"] == 1)
    });
    assert_eq!(waiting.get("replica"), None, "{waiting}");
    assert_eq!(waiting["in_flight"], 1, "{waiting}");

    // The daemon goes away. The router keeps serving a on the routed set it last saw, and b's
    // request keeps waiting.
    daemon.stop();
    wait_until("the router to notice", T, || {
        (get(addr, "/health").ok()?.json()["daemon"] == "disconnected").then_some(())
    });
    for _ in 0..3 {
        let r = complete(addr, "a", T).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(!held.is_finished(), "b's request was not held");
    assert_eq!(
        router.metric("hearth_route_queue_depth{model=\"b\"}"),
        Some(1.0)
    );

    // The daemon is back and routes b: the held request is served, and reports flow again with
    // the counters the router kept.
    let back = Instant::now();
    let daemon = Scripted::start(
        &home.socket,
        vec![routed("a", &[("a-1", pa)]), routed("b", &[("b-1", pb)])],
        reports.clone(),
    );
    let r = held.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-hearth-replica"), Some("b-1"));
    let again = wait_until("reports after the daemon's return", T, || {
        daemon
            .reports_since(back)
            .into_iter()
            .find(|r| r["model"] == "a" && r.get("replica").is_none())
    });
    assert!(again["arrived"].as_u64().unwrap() >= 6, "{again}");
    assert_eq!(get(addr, "/health").unwrap().json()["daemon"], "connected");
    eprintln!("b's request waited {:?} in all", sent.elapsed());
    daemon.stop();
}
