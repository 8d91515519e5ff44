//! A fleet on one machine (docs/fleet.md): hosts on loopback addresses of their own (127.0.0.2,
//! .3, …), each a daemon with `hearth toy-server` replicas and a front door that answers agent
//! checks, all from `examples/fleet/hearth.toml`; real HAProxy in front
//! (`examples/fleet/haproxy.cfg`) and real Prometheus over them (`prometheus.yml`,
//! `fleet-rules.yml`). Every example file is rendered with only its addresses changed.
//!
//! Ports: one block per fleet, the same ports on every host's address: the front door's listen,
//! its agent, the daemon's metrics; then HAProxy's frontend and Prometheus's web port on
//! 127.0.0.1. HAProxy and Prometheus carry the first host's mark, so its cleanup finds them.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use super::{get, sample, Router};
use crate::daemon::spawn_marked;
use crate::{hearth, poll, wait_until, Daemon, Value};

/// The example's addresses, as haproxy.cfg, prometheus.yml and hearth.toml write them.
const EXAMPLE_HOSTS: [&str; 3] = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];
const EXAMPLE_LISTEN: u16 = 8080;
const EXAMPLE_AGENT: u16 = 9400;
const EXAMPLE_METRICS: u16 = 9464;
const EXAMPLE_BALANCER: &str = "\"10.0.0.2\"";
const EXAMPLE_FRONTEND: &str = "bind :8000";
const EXAMPLE_STATS: &str = "/run/haproxy/hearth-fleet.sock";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A file of `examples/fleet/`.
pub fn example(name: &str) -> String {
    let path = crate::repo_dir().join("examples/fleet").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` with each `(from, to)` replaced; panics if one is not there (the example changed
/// under the test).
pub fn substitute(text: &str, pairs: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (from, to) in pairs {
        assert!(
            out.contains(from.as_str()),
            "{from:?} is not in the example"
        );
        out = out.replace(from.as_str(), to);
    }
    out
}

/// One host: a daemon and its front door on `ip`.
pub struct Host {
    pub ip: Ipv4Addr,
    pub listen: SocketAddr,
    pub agent: SocketAddr,
    pub metrics: SocketAddr,
    /// Declared before the daemon: dropped first.
    pub router: Option<Router>,
    pub daemon: Daemon,
}

impl Host {
    /// The front door, started again after it exited.
    pub fn start_router(&mut self) {
        self.router = Some(Router::start(&self.daemon));
    }

    pub fn router(&self) -> &Router {
        self.router.as_ref().expect("the host's front door runs")
    }

    /// One agent check as HAProxy makes it: `send` (with its newline), then the answer line.
    pub fn agent(&self, send: &str) -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&self.agent, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(send.as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// A sample of the front door's metrics (`name{labels}` as exposed).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let r = get(self.listen, "/metrics").ok()?;
        sample(&r.text(), series)
    }

    /// Requests the front door answered for `model` with `status`.
    pub fn answered(&self, model: &str, status: u16) -> f64 {
        self.metric(&format!(
            "hearth_route_requests_total{{model=\"{model}\",status=\"{status}\"}}"
        ))
        .unwrap_or(0.0)
    }

    /// The daemon's status of `model`.
    pub fn model(&self, model: &str) -> Value {
        self.daemon.model(model)
    }
}

/// A server of an HAProxy backend, from the runtime API's `show servers state`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerState {
    pub name: String,
    /// 0 stopped, 2 running (1 starting, 3 stopping).
    pub op_state: u32,
    /// Bits: 0x01 forced maintenance (the agent's `maint`), 0x08 forced drain (its `drain`).
    pub admin_state: u32,
    /// The weight in force (the agent's percentage of `iweight`).
    pub uweight: u32,
    pub iweight: u32,
}

impl ServerState {
    pub fn maint(&self) -> bool {
        self.admin_state & 0x01 != 0
    }

    pub fn drain(&self) -> bool {
        self.admin_state & 0x08 != 0
    }

    pub fn up(&self) -> bool {
        self.op_state == 2 && self.admin_state == 0
    }
}

/// A process of the fleet's own (HAProxy, Prometheus): killed on drop.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if std::thread::panicking() {
                let log = self.log();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                eprintln!("---- {} ----\n{}", self.log.display(), tail.join("\n"));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct Fleet {
    /// Declared first: stopped before the hosts.
    pub haproxy: Option<Proc>,
    pub prometheus: Option<Proc>,
    pub hosts: Vec<Host>,
    /// HAProxy's frontend.
    pub frontend: SocketAddr,
    pub prometheus_web: SocketAddr,
    ports: crate::ports::PortBlock,
}

impl Fleet {
    /// `n` hosts (at most 3, the example's) from `examples/fleet/hearth.toml`, each with its
    /// front door up and 2 replicas routed; no balancer yet.
    pub fn start(n: usize) -> Fleet {
        Fleet::start_with(n, |_, text| text)
    }

    /// As [`Fleet::start`], with `change(i, text)` applied to host i's rendered file (a bench's
    /// skew, a shorter `stale_after`).
    pub fn start_with(n: usize, change: impl Fn(usize, String) -> String) -> Fleet {
        assert!((1..=3).contains(&n), "the example has 3 hosts");
        let ports = crate::ports::ports(5);
        let p = ports.first;
        let bin = hearth().parent().expect("target dir").display().to_string();
        let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
        let mut hosts = Vec::new();
        for i in 0..n {
            let ip = Ipv4Addr::new(127, 0, 0, 2 + i as u8);
            let listen = SocketAddr::from((ip, p));
            let agent = SocketAddr::from((ip, p + 1));
            let metrics = SocketAddr::from((ip, p + 2));
            let text = substitute(
                &example("hearth.toml"),
                &[
                    (
                        format!("{}:{EXAMPLE_METRICS}", EXAMPLE_HOSTS[0]),
                        metrics.to_string(),
                    ),
                    (
                        format!("{}:{EXAMPLE_AGENT}", EXAMPLE_HOSTS[0]),
                        agent.to_string(),
                    ),
                    (
                        format!("{}:{EXAMPLE_LISTEN}", EXAMPLE_HOSTS[0]),
                        listen.to_string(),
                    ),
                    (EXAMPLE_BALANCER.into(), "\"127.0.0.0/8\"".into()),
                ],
            );
            let daemon = Daemon::builder()
                .file(&change(i, text))
                .route_listen(listen)
                .env("PATH", &path)
                .start();
            hosts.push(Host {
                ip,
                listen,
                agent,
                metrics,
                router: None,
                daemon,
            });
        }
        for h in &mut hosts {
            h.start_router();
        }
        for h in &hosts {
            h.daemon.wait_routed("toy", 2, START_TIMEOUT);
            wait_until("the front door routing toy", START_TIMEOUT, || {
                (h.router()
                    .metric("hearth_route_routed_replicas{model=\"toy\"}")?
                    >= 2.0)
                    .then_some(())
            });
        }
        Fleet {
            haproxy: None,
            prometheus: None,
            frontend: SocketAddr::from(([127, 0, 0, 1], p + 3)),
            prometheus_web: SocketAddr::from(([127, 0, 0, 1], p + 4)),
            hosts,
            ports,
        }
    }

    fn dir(&self) -> &Path {
        self.hosts[0].daemon.dir.path()
    }

    /// The runtime API's socket.
    pub fn stats_socket(&self) -> PathBuf {
        self.dir().join("haproxy.sock")
    }

    /// The example's server and agent addresses made this fleet's (hosts beyond `n` keep the
    /// example's, unreachable: HAProxy marks them down).
    fn addresses(&self) -> Vec<(String, String)> {
        let mut pairs = Vec::new();
        for (i, example) in EXAMPLE_HOSTS.iter().enumerate() {
            let ip = match self.hosts.get(i) {
                Some(h) => h.ip.to_string(),
                None => "127.0.0.254".into(),
            };
            pairs.push((
                format!("{example}:{EXAMPLE_LISTEN}"),
                format!("{ip}:{}", self.ports.first),
            ));
        }
        pairs
    }

    /// `examples/fleet/haproxy.cfg` with this fleet's addresses: the servers, their agent
    /// port, the frontend's bind and the runtime API's socket.
    pub fn haproxy_cfg(&self) -> String {
        let mut pairs = self.addresses();
        pairs.push((
            format!("agent-port {EXAMPLE_AGENT}"),
            format!("agent-port {}", self.ports.first + 1),
        ));
        pairs.push((EXAMPLE_FRONTEND.into(), format!("bind {}", self.frontend)));
        pairs.push((
            EXAMPLE_STATS.into(),
            self.stats_socket().display().to_string(),
        ));
        substitute(&example("haproxy.cfg"), &pairs)
    }

    /// HAProxy on `cfg` (e.g. [`Fleet::haproxy_cfg`]), once every server it knows is up.
    pub fn start_haproxy(&mut self, cfg: &str) {
        self.haproxy = None;
        let file = self.dir().join("haproxy.cfg");
        std::fs::write(&file, cfg).expect("write haproxy.cfg");
        let log = self.dir().join("haproxy.log");
        let mut cmd = Command::new("haproxy");
        cmd.arg("-db").arg("-f").arg(&file);
        let child = spawn_marked(&mut cmd, &self.hosts[0].daemon, &log, &log);
        self.haproxy = Some(Proc {
            child: Some(child),
            log,
        });
        let n = self.hosts.len();
        wait_until("HAProxy with every host up", START_TIMEOUT, || {
            let up = self.servers("toy").ok()?;
            (up.iter().filter(|s| s.up()).count() == n).then_some(())
        });
    }

    /// A command on HAProxy's runtime API; its whole answer.
    pub fn runtime(&self, command: &str) -> std::io::Result<String> {
        let mut s = UnixStream::connect(self.stats_socket())?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(format!("{command}\n").as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// `show servers state BACKEND`, of the servers that are this fleet's hosts.
    pub fn servers(&self, backend: &str) -> std::io::Result<Vec<ServerState>> {
        let text = self.runtime(&format!("show servers state {backend}"))?;
        let n = self.hosts.len();
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let num = |i: usize| f.get(i)?.parse().ok();
                Some(ServerState {
                    name: f.get(3)?.to_string(),
                    op_state: num(5)?,
                    admin_state: num(6)?,
                    uweight: num(7)?,
                    iweight: num(8)?,
                })
            })
            .take(n)
            .collect())
    }

    /// The state of host `i`'s server in `backend`.
    pub fn server(&self, backend: &str, i: usize) -> Option<ServerState> {
        self.servers(backend).ok()?.into_iter().nth(i)
    }

    /// Prometheus on `examples/fleet/prometheus.yml` and `fleet-rules.yml`, this fleet's
    /// addresses in place of the example's.
    pub fn start_prometheus(&mut self) {
        let mut pairs = self.addresses();
        for (i, example) in EXAMPLE_HOSTS.iter().enumerate() {
            let ip = self
                .hosts
                .get(i)
                .map_or_else(|| "127.0.0.254".into(), |h| h.ip.to_string());
            pairs.push((
                format!("{example}:{EXAMPLE_METRICS}"),
                format!("{ip}:{}", self.ports.first + 2),
            ));
        }
        let dir = self.dir().join("prometheus");
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        let cfg = dir.join("prometheus.yml");
        std::fs::write(&cfg, substitute(&example("prometheus.yml"), &pairs)).expect("write");
        std::fs::write(dir.join("fleet-rules.yml"), example("fleet-rules.yml")).expect("write");
        let log = self.dir().join("prometheus.log");
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={}", self.prometheus_web));
        let child = spawn_marked(&mut cmd, &self.hosts[0].daemon, &log, &log);
        self.prometheus = Some(Proc {
            child: Some(child),
            log,
        });
        wait_until("Prometheus ready", START_TIMEOUT, || {
            get(self.prometheus_web, "/-/ready")
                .ok()
                .filter(|r| r.status == 200)
        });
    }

    /// An instant query on Prometheus's API: each result's labels and value.
    pub fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let path = format!("/api/v1/query?query={}", url_encode(q));
        let Ok(r) = get(self.prometheus_web, &path) else {
            return Vec::new();
        };
        let v = r.json();
        v["data"]["result"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .filter_map(|x| {
                        let value = x["value"][1].as_str()?.parse().ok()?;
                        Some((x["metric"].clone(), value))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until host `i`'s server in `backend` is as `want` says.
    pub fn wait_server(
        &self,
        backend: &str,
        i: usize,
        what: &str,
        timeout: Duration,
        want: impl Fn(&ServerState) -> bool,
    ) -> ServerState {
        wait_until(&format!("h{} {what}", i + 1), timeout, || {
            self.server(backend, i).filter(&want)
        })
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether HAProxy and Prometheus are installed; missing, the test fails saying so (unless
/// `HEARTH_ALLOW_SKIP=1`, where this says false and the test returns).
pub fn needs_fleet_tools() -> bool {
    let has = |bin: &str, arg: &str| Command::new(bin).arg(arg).output().is_ok();
    crate::needs::needs(
        has("haproxy", "-v") && has("prometheus", "--version"),
        || {
            "HAProxy and Prometheus (apt-get install haproxy prometheus; scripts/test.sh does)"
                .into()
        },
    )
}

/// Polls `f` until it holds (or `timeout`); whether it did.
pub fn eventually(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    let mut f = f;
    poll(timeout, || f().then_some(())).is_some()
}
