//! The service manager's side channel (sd_notify(3)): readiness, reloads, stopping, a one-line
//! status, and watchdog pings.
//!
//! The daemon's event loop owns the `Notifier` and calls it itself, so every message states what
//! the loop that owns the core has actually done: `READY=1` after the core placed the start-up
//! replicas, `WATCHDOG=1` only while that loop is turning (a core stuck in `handle` stops the
//! pings, and systemd restarts the service), `READY=1` after a reload only once it was applied
//! or refused.
//!
//! Messages are formatted by the `sd-notify` crate (`NotifyState`), but sent here: the crate's
//! sender treats an abstract-namespace `NOTIFY_SOCKET` ("@name", what systemd hands to services
//! in containers and user managers) as a file path, and its `watchdog_enabled` refuses an unset
//! `WATCHDOG_PID`, which sd_watchdog_enabled(3) accepts. Nothing here changes the environment:
//! the supervisor strips `NOTIFY_SOCKET`, `WATCHDOG_*` and `LISTEN_*` from every child instead,
//! which avoids `setenv` in a multi-threaded process.

use std::fmt::Write as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use sd_notify::NotifyState;

/// Where notifications go and whether the watchdog is on, as the service manager said in the
/// environment at start.
pub struct Notifier {
    socket: Option<String>,
    watchdog: Option<Duration>,
    /// The last `STATUS=` sent, to send only changes.
    status: String,
    /// A send failed once: said in the log, not again on every ping.
    warned: bool,
    /// `STOPPING=1` was sent: no `READY=1` may follow it (a reload that ends during the drain
    /// must not contradict it).
    stopping: bool,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`.
    pub fn from_env() -> Notifier {
        let socket = std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|s| !s.is_empty());
        let watchdog = watchdog_timeout(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Notifier {
            socket,
            watchdog,
            status: String::new(),
            warned: false,
            stopping: false,
        }
    }

    /// A notifier that sends nothing (not under a service manager, or in tests).
    pub fn disabled() -> Notifier {
        Notifier {
            socket: None,
            watchdog: None,
            status: String::new(),
            warned: false,
            stopping: false,
        }
    }

    /// Whether there is anyone to notify.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// How often to ping: half the watchdog timeout, as sd_watchdog_enabled(3) advises, so that
    /// one late tick does not get the service killed. None when no watchdog is set.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.socket.as_ref()?;
        self.watchdog.map(|t| (t / 2).max(Duration::from_millis(1)))
    }

    /// The watchdog timeout systemd set, for the log.
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Start-up (or a reload) is finished; `status` becomes the status line. Once stopping,
    /// only the status line is sent.
    pub fn ready(&mut self, status: &str) {
        if self.stopping {
            return self.status(status);
        }
        self.status = status.to_string();
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// A reload begins. systemd ≥ 253 requires `MONOTONIC_USEC` with `RELOADING=1` (it tells
    /// a reload that began after the request from an older one); older versions ignore it.
    pub fn reloading(&mut self) {
        let mut states = vec![NotifyState::Reloading];
        if let Ok(t) = NotifyState::monotonic_usec_now() {
            states.push(t);
        }
        states.push(NotifyState::Status("reloading the configuration"));
        self.status.clear();
        self.send(&states);
    }

    /// The shutdown began: systemd shows the unit as deactivating, not failed.
    pub fn stopping(&mut self, status: &str) {
        self.stopping = true;
        self.status = status.to_string();
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }

    /// Sends `STATUS=` only when it differs from the last one: `systemctl status` shows the
    /// latest, and a datagram per tick would only load the manager.
    pub fn status(&mut self, status: &str) {
        if self.status != status {
            self.status = status.to_string();
            self.send(&[NotifyState::Status(status)]);
        }
    }

    pub fn watchdog(&mut self) {
        self.send(&[NotifyState::Watchdog]);
    }

    fn send(&mut self, states: &[NotifyState]) {
        let Some(socket) = &self.socket else {
            return;
        };
        let mut msg = String::new();
        for s in states {
            // STATUS= is one line: a newline would start a new assignment.
            let _ = writeln!(msg, "{}", s.to_string().replace('\n', " "));
        }
        if let Err(e) = send_to(socket, msg.as_bytes()) {
            if !self.warned {
                self.warned = true;
                tracing::warn!("sd_notify to {socket}: {e} (further failures not logged)");
            }
        }
    }
}

/// One datagram to `NOTIFY_SOCKET`: a path, or "@name" in the abstract namespace.
fn send_to(socket: &str, msg: &[u8]) -> std::io::Result<()> {
    let addr = match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(socket)?,
    };
    let sock = UnixDatagram::unbound()?;
    let n = sock.send_to_addr(msg, &addr)?;
    if n != msg.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short datagram",
        ));
    }
    Ok(())
}

/// sd_watchdog_enabled(3): on when `WATCHDOG_USEC` is a positive number and `WATCHDOG_PID` is
/// unset or names this process (a child that inherited them must not ping for its parent).
fn watchdog_timeout(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    match pid {
        None => {}
        Some(p) if p.trim().parse::<u32>().ok() == Some(me) => {}
        Some(_) => return None,
    }
    Some(Duration::from_micros(usec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_follows_sd_watchdog_enabled() {
        let two = Some(Duration::from_secs(2));
        assert_eq!(watchdog_timeout(Some("2000000"), None, 7), two);
        assert_eq!(watchdog_timeout(Some("2000000"), Some("7"), 7), two);
        assert_eq!(watchdog_timeout(Some("2000000"), Some("8"), 7), None);
        assert_eq!(watchdog_timeout(Some("0"), None, 7), None);
        assert_eq!(watchdog_timeout(Some("soon"), None, 7), None);
        assert_eq!(watchdog_timeout(None, Some("7"), 7), None);
    }

    #[test]
    fn messages_reach_a_path_socket_and_status_is_sent_only_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut n = Notifier {
            socket: Some(path.display().to_string()),
            watchdog: Some(Duration::from_secs(2)),
            status: String::new(),
            warned: false,
            stopping: false,
        };
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(1)));
        let recv = || {
            let mut buf = [0u8; 4096];
            let k = rx.recv(&mut buf).unwrap();
            String::from_utf8(buf[..k].to_vec()).unwrap()
        };
        n.ready("1 model");
        assert_eq!(recv(), "READY=1\nSTATUS=1 model\n");
        n.status("1 model");
        n.status("2 models\nsecond line");
        assert_eq!(recv(), "STATUS=2 models second line\n");
        n.reloading();
        let m = recv();
        let lines: Vec<&str> = m.lines().collect();
        assert_eq!(lines[0], "RELOADING=1");
        let usec: u64 = lines[1]
            .strip_prefix("MONOTONIC_USEC=")
            .unwrap()
            .parse()
            .unwrap();
        assert!(usec > 0);
        n.watchdog();
        assert_eq!(recv(), "WATCHDOG=1\n");
        // A reload that ends during the drain says where things stand, but not READY=1.
        n.stopping("stopping: 3 replica(s) left");
        assert_eq!(recv(), "STOPPING=1\nSTATUS=stopping: 3 replica(s) left\n");
        n.ready("stopping: 2 replica(s) left");
        assert_eq!(recv(), "STATUS=stopping: 2 replica(s) left\n");
    }

    #[test]
    fn messages_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("hearth-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut n = Notifier {
            socket: Some(format!("@{name}")),
            watchdog: None,
            status: String::new(),
            warned: false,
            stopping: false,
        };
        assert_eq!(n.watchdog_interval(), None);
        n.stopping("stopping");
        let mut buf = [0u8; 256];
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"STOPPING=1\nSTATUS=stopping\n");
    }
}
