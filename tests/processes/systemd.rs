//! hearth as a systemd service: the sd_notify conversation (READY, WATCHDOG, RELOADING with
//! MONOTONIC_USEC, STOPPING, STATUS), the environment replicas inherit, journald fields, and
//! the unit file's numbers against the daemon's. The test plays the service manager: it owns
//! the datagram socket named by NOTIFY_SOCKET.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use testkit::procs::{alive, environ};
use testkit::*;

/// 2 routed + 1 warm (max 4) of a toy server that loads for 1 s.
fn toy() -> Model {
    Model::toy("toy", &["--load-time", "1s"]).scale(2, 4, 1)
}

/// A daemon of `models`, its NOTIFY_SOCKET at `notify`.
fn notified(notify: &Path, models: impl IntoIterator<Item = Model>) -> DaemonBuilder {
    Daemon::builder()
        .tick("100ms")
        .shutdown_timeout("15s")
        .notify_socket(notify)
        .models(models)
}

#[test]
fn the_daemon_speaks_sd_notify_and_keeps_its_notify_socket_from_replicas() {
    let notify_dir = tempfile::tempdir().unwrap();
    let notify_path = notify_dir.path().join("notify.sock");
    let b = notified(&notify_path, [toy()]);
    let manager = NotifyRecorder::bind(&notify_path, Some(b.socket()));
    let mut d = b
        .env("WATCHDOG_USEC", "2000000")
        .watchdog_pid_self()
        // Like systemd, and what a replica would inherit if nothing stripped them.
        .env("LISTEN_FDS", "0")
        .start();

    // READY=1 once the socket listens and the start-up replicas are placed, not warm: the
    // manager asked for the status the moment READY=1 arrived.
    let (i_ready, ready_at, ready) = manager.wait_line(0, "READY=1", Duration::from_secs(10));
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=1 model: ")),
        "READY=1 carries the status line: {ready:?}"
    );
    let at_ready = manager.status_at_ready().expect("asked");
    let at_ready = at_ready.unwrap_or_else(|e| panic!("the socket did not answer at READY=1: {e}"));
    let m = &at_ready["status"]["models"][0];
    assert_eq!(
        m["replicas"].as_array().unwrap().len(),
        3,
        "2 routed + 1 warm placed before READY=1: {m}"
    );
    assert_eq!(m["warm"], 0, "READY=1 does not wait for warm-ups: {m}");
    assert_eq!(m["routed"], 0, "{m}");
    assert!(
        manager.all()[..i_ready]
            .iter()
            .all(|(_, m)| !m.contains("READY=1")),
        "one READY=1 at start"
    );

    // The replicas, placed before READY=1, warm afterwards; the status line follows.
    d.wait_settled("toy", 2, 1, Duration::from_secs(30));
    manager.wait_line(
        i_ready,
        "STATUS=1 model: 2 routed, 1 warm, 0 starting; GPUs: none",
        Duration::from_secs(5),
    );

    // Watchdog: WATCHDOG_USEC = 2 s, so the loop pings at half that, as sd_watchdog_enabled(3)
    // advises, and keeps pinging while it runs. How regular the pings are on a busy machine is a
    // latency figure: `cargo bench --bench watchdog` measures the gaps.
    assert!(
        d.log()
            .contains("systemd watchdog: 2000ms; pinging every 1000ms"),
        "{}",
        d.log()
    );
    let after_ready = |n: usize| {
        wait_until(
            &format!("{n} WATCHDOG=1 after READY=1"),
            Duration::from_secs(30),
            || (manager.pings().iter().filter(|&&p| p > ready_at).count() >= n).then_some(()),
        )
    };
    after_ready(3);

    // No replica sees the daemon's notify socket or watchdog or passed sockets.
    let pids: Vec<i32> = d.replicas("toy").iter().map(status::pid).collect();
    assert_eq!(pids.len(), 3);
    for pid in &pids {
        let env = environ(*pid).expect("a replica's environment");
        for private in [
            "NOTIFY_SOCKET=",
            "WATCHDOG_USEC=",
            "WATCHDOG_PID=",
            "LISTEN_FDS=",
        ] {
            assert!(
                !env.iter().any(|e| e.starts_with(private)),
                "replica {pid} inherited {private}…"
            );
        }
        assert!(env.iter().any(|e| e.starts_with("HEARTH_REPLICA=")));
    }
    let daemon_env = environ(d.pid()).unwrap();
    assert!(
        daemon_env.iter().any(|e| e.starts_with("NOTIFY_SOCKET=")),
        "the daemon itself keeps it"
    );

    // SIGHUP: RELOADING=1 with MONOTONIC_USEC (CLOCK_MONOTONIC now), then READY=1.
    let from = manager.all().len();
    let before = monotonic_usec();
    d.signal(Signal::SIGHUP);
    let (i_rel, _, reloading) = manager.wait_line(from, "RELOADING=1", Duration::from_secs(5));
    let after = monotonic_usec();
    let usec: u64 = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("RELOADING=1 without MONOTONIC_USEC: {reloading:?}"))
        .parse()
        .unwrap();
    assert!(
        before <= usec && usec <= after,
        "MONOTONIC_USEC={usec} is CLOCK_MONOTONIC at the reload ({before}..{after})"
    );
    let (_, _, ready_again) = manager.wait_line(i_rel + 1, "READY=1", Duration::from_secs(5));
    assert!(ready_again.contains("STATUS=1 model: 2 routed, 1 warm"));
    assert_eq!(
        d.replicas("toy")
            .iter()
            .map(status::pid)
            .collect::<Vec<_>>(),
        pids,
        "an unchanged file keeps every replica"
    );
    // The reload did not stop the pings.
    let pinged = manager.pings().len();
    wait_until(
        "a WATCHDOG=1 after the reload",
        Duration::from_secs(30),
        || (manager.pings().len() > pinged).then_some(()),
    );

    // A reload of a broken file is refused, and still ends with READY=1: the daemon runs on.
    let good = std::fs::read_to_string(&d.config_path).unwrap();
    std::fs::write(&d.config_path, "[daemon\n").unwrap();
    let from = manager.all().len();
    d.signal(Signal::SIGHUP);
    let (i_rel, _, _) = manager.wait_line(from, "RELOADING=1", Duration::from_secs(5));
    manager.wait_line(i_rel + 1, "READY=1", Duration::from_secs(5));
    assert!(d.running());
    std::fs::write(&d.config_path, good).unwrap();

    // SIGTERM: STOPPING=1 first, then the drain, then exit 0.
    let from = manager.all().len();
    d.signal(Signal::SIGTERM);
    let (_, _, stopping) = manager.wait_line(from, "STOPPING=1", Duration::from_secs(5));
    assert!(stopping.contains("STATUS=stopping"));
    let st = d
        .wait_exit(Duration::from_secs(30))
        .expect("exit after SIGTERM");
    assert!(st.success(), "exit status {st}");
    for pid in pids {
        assert!(!alive(pid), "replica {pid} outlived the daemon");
    }
}

#[test]
fn without_watchdog_usec_there_are_no_pings_and_a_foreign_watchdog_pid_is_ignored() {
    let notify_dir = tempfile::tempdir().unwrap();
    let notify_path = notify_dir.path().join("notify.sock");
    let manager = NotifyRecorder::bind(&notify_path, None);
    let d = notified(&notify_path, [toy().scale(1, 4, 0)])
        .env("WATCHDOG_USEC", "500000")
        // Meant for another process (sd_watchdog_enabled(3)): not ours to honour.
        .env("WATCHDOG_PID", "1")
        .start();
    let (i_ready, _, _) = manager.wait_line(0, "READY=1", Duration::from_secs(10));
    // The loop turns on: the replica warms and is routed, and the status line says so. With the
    // watchdog on, 1.5 s more would hold about six pings (one every 250 ms).
    d.wait_settled("toy", 1, 0, Duration::from_secs(30));
    manager.wait_line(
        i_ready,
        "STATUS=1 model: 1 routed, 0 warm, 0 starting; GPUs: none",
        Duration::from_secs(5),
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        manager.pings().is_empty(),
        "no pings for a watchdog that is not ours"
    );
    assert!(!d.log().contains("systemd watchdog:"), "{}", d.log());
    drop(d);
}

/// The unit's numbers agree with the daemon's: a service that notifies, is watched, drains
/// on stop within TimeoutStopSec, and keeps CUDA's JIT working. (`systemd-analyze verify`
/// runs in .ci/run.)
#[test]
fn the_unit_file_fits_the_daemon() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/hearth.service"
    ))
    .unwrap();
    let values = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim().to_string())
            .collect()
    };
    let one = |key: &str| -> String {
        let v = values(key);
        assert_eq!(v.len(), 1, "{key}= once in the unit: {v:?}");
        v[0].clone()
    };
    let secs = |v: &str| -> u64 {
        v.strip_suffix('s')
            .unwrap_or(v)
            .parse()
            .unwrap_or_else(|_| panic!("seconds: {v}"))
    };
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("NotifyAccess"), "main");
    assert_eq!(one("KillMode"), "mixed");
    assert_eq!(one("Restart"), "on-failure");
    assert!(one("ExecReload").contains("-HUP $MAINPID"));
    assert!(secs(&one("WatchdogSec")) >= 2);
    // Default shutdown_timeout (60 s) + the daemon's own 5 s hard stop, and a margin.
    let shutdown_timeout = 60;
    assert!(
        secs(&one("TimeoutStopSec")) >= shutdown_timeout + 30,
        "TimeoutStopSec must leave the drain its shutdown_timeout"
    );
    assert_eq!(one("DevicePolicy"), "closed");
    assert!(values("DeviceAllow").iter().any(|v| v == "char-nvidia* rw"));
    for key in [
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
    ] {
        assert!(!values(key).is_empty(), "{key}= is set");
    }
    assert_eq!(one("RuntimeDirectory"), "hearth");
    assert_eq!(one("StateDirectory"), "hearth");
    assert!(
        values("MemoryDenyWriteExecute").is_empty(),
        "CUDA JIT-compiles: no MemoryDenyWriteExecute"
    );
}

/// The front door's unit leaves a stop room for the drain that comes first (docs/fleet.md):
/// `[route] drain_timeout`, then `shutdown_grace`, at their defaults, and a margin.
#[test]
fn the_front_door_unit_leaves_room_for_the_drain_and_the_grace() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/hearth-route.service"
    ))
    .unwrap();
    let stop: Vec<u64> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("TimeoutStopSec="))
        .map(|v| v.trim().trim_end_matches('s').parse().unwrap())
        .collect();
    let needed = hearth::route::settings::DEFAULT_DRAIN_TIMEOUT
        + hearth::route::settings::DEFAULT_SHUTDOWN_GRACE;
    assert_eq!(stop.len(), 1, "TimeoutStopSec= once: {stop:?}");
    assert!(
        stop[0] >= needed.as_secs() + 15,
        "TimeoutStopSec={} leaves no room for drain_timeout + shutdown_grace ({needed:?})",
        stop[0]
    );
}

/// Decodes journald's native protocol: `NAME=value\n`, or `NAME\n` + 64-bit LE length + bytes +
/// `\n` for values that may hold newlines.
fn journal_fields(mut b: &[u8]) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let nl = b.iter().position(|&c| c == b'\n')?;
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            out.push((
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            ));
            b = &b[nl + 1..];
        } else {
            let name = String::from_utf8_lossy(line).into_owned();
            let rest = &b[nl + 1..];
            let len = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?) as usize;
            let value = rest.get(8..8 + len)?;
            out.push((name, String::from_utf8_lossy(value).into_owned()));
            b = rest.get(8 + len + 1..)?;
        }
    }
    Some(out)
}

/// With stderr connected to "the journal" (JOURNAL_STREAM naming stderr's inode), entries go to
/// journald's socket with MODEL, REPLICA, GPU and PRIORITY fields. The journal socket's path is
/// fixed (/run/systemd/journal/socket), so the daemon runs in a private mount namespace with a
/// fresh /run where the test's listener sits. Fails where `unshare -m` is not allowed or python3
/// is missing (testkit::needs).
#[test]
fn logs_carry_journal_fields_when_stderr_is_the_journal() {
    let ok = Command::new("unshare")
        .args(["-m", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("python3")
            .arg("-c")
            .arg("pass")
            .status()
            .is_ok_and(|s| s.success());
    if !needs(ok, || "`unshare -m` (root, util-linux) and python3".into()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let entries = dir.path().join("journal.bin");
    let streams = dir.path().join("streams.txt");
    let stderr = dir.path().join("stderr");
    std::fs::write(&stderr, "").unwrap();
    // The listener writes each datagram as a 4-byte length and its bytes, and everything the
    // stdout streams (replicas' output) send, appended to one file.
    // It dies with its parent (PR_SET_PDEATHSIG, through ctypes), or after 5 quiet minutes.
    let listener = format!(
        "import socket,struct,os,ctypes,threading\n\
         ctypes.CDLL(None).prctl(1, 9)\n\
         os.makedirs('/run/systemd/journal', exist_ok=True)\n\
         st=socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
         st.bind('/run/systemd/journal/stdout')\n\
         st.listen(64)\n\
         g=open({streams:?},'ab',buffering=0)\n\
         def conn(c):\n    while True:\n        d=c.recv(65536)\n        if not d: return\n        g.write(d)\n\
         def accept():\n    while True:\n        c,_=st.accept()\n        threading.Thread(target=conn,args=(c,),daemon=True).start()\n\
         threading.Thread(target=accept,daemon=True).start()\n\
         s=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
         s.settimeout(300)\n\
         s.bind('/run/systemd/journal/socket')\n\
         open({ready:?},'w').close()\n\
         f=open({entries:?},'ab',buffering=0)\n\
         while True:\n    d=s.recv(1<<20)\n    f.write(struct.pack('<I',len(d))+d)\n",
        ready = dir.path().join("listening").display().to_string(),
        entries = entries.display().to_string(),
        streams = streams.display().to_string(),
    );
    std::fs::write(dir.path().join("listener.py"), listener).unwrap();
    let script = format!(
        "mount -t tmpfs tmpfs /run && python3 {py} & \
         while [ ! -e {ready} ]; do sleep 0.05; done; \
         export JOURNAL_STREAM=$(stat -c %d:%i {stderr}); exec \"$@\" 2>>{stderr}",
        py = dir.path().join("listener.py").display(),
        ready = dir.path().join("listening").display(),
        stderr = stderr.display(),
    );
    let toy = Model::toy("jt", &["--load-time", "1s"])
        .scale(1, 4, 0)
        .gpus(1, "1GiB");
    let mut d = Daemon::builder()
        .tick("100ms")
        .gpus("static", &[("GPU-journal-0", "8GiB")])
        .model(toy)
        .wrapper(&["unshare", "-m", "sh", "-c", &script, "sh"])
        .start();
    d.wait_settled("jt", 1, 0, Duration::from_secs(30));
    let read = || -> Vec<Vec<(String, String)>> {
        let raw = std::fs::read(&entries).unwrap_or_default();
        let mut out = Vec::new();
        let mut b = &raw[..];
        while b.len() >= 4 {
            let n = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
            if b.len() < 4 + n {
                break;
            }
            out.push(journal_fields(&b[4..4 + n]).expect("a well-formed journal entry"));
            b = &b[4 + n..];
        }
        out
    };
    let field =
        |e: &[(String, String)], k: &str| e.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let entries = wait_until(
        "the warm-up line in the journal",
        Duration::from_secs(10),
        || {
            let all = read();
            all.iter()
                .any(|e| field(e, "MESSAGE").is_some_and(|m| m.starts_with("warm after")))
                .then_some(all)
        },
    );
    let spawned = entries
        .iter()
        .find(|e| field(e, "MESSAGE").is_some_and(|m| m.starts_with("spawned: ")))
        .expect("the spawn line");
    assert_eq!(field(spawned, "MODEL").as_deref(), Some("jt"));
    assert_eq!(field(spawned, "REPLICA").as_deref(), Some("jt-1"));
    assert_eq!(field(spawned, "GPU").as_deref(), Some("GPU-journal-0"));
    assert_eq!(field(spawned, "PRIORITY").as_deref(), Some("6"), "info");
    assert!(
        spawned.iter().all(|(n, _)| !n.starts_with("F_")),
        "fields are not prefixed: {spawned:?}"
    );
    // A line the core logged about the replica carries the replica's GPU too.
    let warm = entries
        .iter()
        .find(|e| field(e, "MESSAGE").is_some_and(|m| m.starts_with("warm after")))
        .unwrap();
    assert_eq!(field(warm, "REPLICA").as_deref(), Some("jt-1"));
    assert_eq!(field(warm, "GPU").as_deref(), Some("GPU-journal-0"));
    // What the replica printed went to journald's stdout stream, not through the daemon: a
    // stream whose header names the replica, then its lines.
    assert!(
        entries.iter().all(|e| field(e, "STREAM").is_none()),
        "the daemon forwards no replica line"
    );
    let text = wait_until("the replica's stream", Duration::from_secs(10), || {
        let t = std::fs::read_to_string(&streams).unwrap_or_default();
        t.contains("toy-server ready").then_some(t)
    });
    assert!(text.contains("jt-1\n\n6\n0\n0\n0\n0\n"), "{text:?}");
    assert_eq!(
        field(spawned, "OUTPUT").as_deref(),
        Some("journalctl -t jt-1")
    );
    // A daemon-wide line has no MODEL at all (not an empty one).
    let global = entries
        .iter()
        .find(|e| field(e, "MESSAGE").is_some_and(|m| m.starts_with("listening on")))
        .expect("the listening line");
    assert_eq!(field(global, "MODEL"), None);
    // Nothing went to stderr as text: the journal got it all.
    let text = std::fs::read_to_string(&stderr).unwrap();
    assert!(!text.contains("spawned: "), "stderr: {text}");
    d.signal(Signal::SIGTERM);
    assert!(d
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
}
