//! Issue 11 against the real binary: paths an unprivileged user could prepare, the limits on
//! connections and lines, the protocol's edges (watch, blank lines, unknown fields, amplified
//! answers), scale bounded by the ports and overrides that outlive restarts only when they fit,
//! `drain` that keeps routed ≥ min, and a revoked role that takes effect on open connections.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::*;

fn chmod(p: &std::path::Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A daemon that must refuse to start: its exit status and its log.
fn refused(d: &mut Daemon) -> String {
    let st = d
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the daemon did not exit:\n{}", d.log()));
    assert_eq!(st.code(), Some(1), "{}", d.log());
    assert!(
        !d.socket.exists()
            || !std::fs::symlink_metadata(&d.socket)
                .unwrap()
                .file_type()
                .is_socket_like(),
        "no socket bound"
    );
    d.log()
}

trait SocketLike {
    fn is_socket_like(&self) -> bool;
}
impl SocketLike for std::fs::FileType {
    fn is_socket_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_socket()
    }
}

#[test]
fn a_state_dir_others_can_write_in_is_refused_and_nothing_starts() {
    let b = Daemon::builder().model(Model::toy("toy", &[]).scale(1, 2, 0));
    let state = b.dir().join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o777);
    let mut d = b.spawn();
    let log = refused(&mut d);
    assert!(
        log.contains("daemon.state_dir") && log.contains("writable by every user"),
        "{log}"
    );
    assert!(
        d.marked().len() <= 1,
        "no replica started: {:?}",
        d.marked()
    );
}

#[test]
fn a_regular_file_at_the_socket_path_is_named_and_left_alone() {
    let b = Daemon::builder().model(Model::toy("toy", &[]).scale(1, 2, 0));
    let precious = b.socket();
    std::fs::write(&precious, "not a socket").unwrap();
    let mut d = b.spawn();
    let log = refused(&mut d);
    assert!(
        log.contains("regular file there, not a socket") && log.contains("hearth.sock"),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "not a socket");
}

#[test]
fn a_planted_temporary_symlink_in_state_dir_is_never_followed_by_scale() {
    let b = Daemon::builder().model(Model::toy("toy", &[]).scale(1, 3, 0));
    let state = b.dir().join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    // A file the daemon must never write: outside its state, reached by a link at the name
    // it writes its temporary file under.
    let victim = b.dir().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, state.join("overrides.json.tmp")).unwrap();
    let d = b.start();
    d.cli_ok(&["scale", "toy", "--max", "2"]);
    let saved = wait_until("overrides.json written", Duration::from_secs(10), || {
        std::fs::read_to_string(state.join("overrides.json"))
            .ok()
            .filter(|t| t.contains("\"max\": 2"))
    });
    assert!(saved.contains("toy"), "{saved}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
}

/// Links planted in state_dir are never followed: a `logs` link to another directory stops the
/// start before the socket is bound (its target is neither chmod'ed nor written in), and a
/// `replicas.json` link to a file is not read through (the ledger is not used) and is replaced,
/// not written through, when the daemon saves its ledger.
#[test]
fn links_planted_in_state_dir_are_never_followed() {
    let b = Daemon::builder()
        .model(Model::toy("toy", &[]).scale(1, 2, 0))
        .env("HEARTH_REPLICA_LOGS", "files");
    let state = b.dir().join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    let victim = b.dir().join("victim");
    std::fs::create_dir(&victim).unwrap();
    chmod(&victim, 0o700);
    std::os::unix::fs::symlink(&victim, state.join("logs")).unwrap();
    let secret = b.dir().join("secret.json");
    std::fs::write(&secret, "precious").unwrap();
    std::os::unix::fs::symlink(&secret, state.join("replicas.json")).unwrap();
    let (home, launch) = b.prepare();
    let mut d = launch.spawn(home);
    let log = refused(&mut d);
    assert!(
        log.contains("logs: a symlink") && log.contains("does not follow links"),
        "{log}"
    );
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "the link's target was chmod'ed");
    assert_eq!(
        std::fs::read_dir(&victim).unwrap().count(),
        0,
        "nothing was written in the link's target"
    );
    // Without the `logs` link the daemon runs; its ledger replaces the other link.
    std::fs::remove_file(state.join("logs")).unwrap();
    d.restart();
    d.wait_settled("toy", 1, 0, Duration::from_secs(30));
    assert!(
        d.log().contains("replicas.json: a symlink"),
        "the ledger is not read through the link: {}",
        d.log()
    );
    wait_until("the ledger saved", Duration::from_secs(10), || {
        let meta = std::fs::symlink_metadata(state.join("replicas.json")).ok()?;
        meta.is_file().then_some(())
    });
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "precious");
    assert!(state.join("logs").is_dir() && !state.join("logs").is_symlink());
}

#[test]
fn scale_is_bounded_by_the_ports_reset_clears_it_and_a_bad_saved_file_is_kept_aside() {
    let b = Daemon::builder()
        .model(Model::toy("a", &[]).scale(1, 3, 0))
        .model(Model::toy("b", &[]).scale(1, 1, 0))
        .ports(10);
    let state = b.dir().join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    // A saved max that no port range holds: never used, never overwritten.
    std::fs::write(state.join("overrides.json"), r#"{"a":{"max":4294967295}}"#).unwrap();
    let d = b.start();
    let aside = wait_until("overrides.json kept aside", Duration::from_secs(5), || {
        std::fs::read_dir(&state).unwrap().find_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.starts_with("overrides.json.corrupt-").then_some(n)
        })
    });
    assert_eq!(
        std::fs::read_to_string(state.join(&aside)).unwrap(),
        r#"{"a":{"max":4294967295}}"#
    );
    let log = d.log();
    assert!(log.contains(&aside) && log.contains("not used"), "{log}");
    assert_eq!(d.model("a")["max"], json!(3), "the file's values");

    // The issue's sequence: each refused, nothing created.
    let ports = u32::from(d.ports.1 - d.ports.0) + 1;
    let too_many = ports.to_string();
    for args in [
        ["scale", "a", "--max", "4294967295"],
        ["scale", "a", "--min", "100000"],
        ["scale", "a", "--min", "4294967295"],
        ["scale", "a", "--max", &too_many],
    ] {
        let out = d.cli(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("bad_request"), "{}", out.stderr);
    }
    assert!(d.replicas("a").len() <= 3);
    // All but b's 1: taken.
    let fits = (ports - 1).to_string();
    d.cli_ok(&["scale", "a", "--max", &fits, "--min", "2"]);
    assert_eq!(d.model("a")["max"], json!(ports - 1));
    d.cli_ok(&["scale", "a", "--reset"]);
    let m = d.model("a");
    assert_eq!((m["min"].clone(), m["max"].clone()), (json!(1), json!(3)));
    wait_until("overrides.json emptied", Duration::from_secs(10), || {
        std::fs::read_to_string(state.join("overrides.json"))
            .ok()
            .filter(|t| t.trim() == "{}")
    });
    // The corrupt file was left as it was.
    assert_eq!(
        std::fs::read_to_string(state.join(&aside)).unwrap(),
        r#"{"a":{"max":4294967295}}"#
    );
}

#[test]
fn check_config_and_the_daemon_refuse_a_fifo_at_the_config_path_at_once() {
    let dir = temp_dir();
    let fifo = dir.path().join("config.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for verb in ["check-config", "daemon"] {
        let mut cmd = Command::new(hearth());
        if verb == "daemon" {
            cmd.args(["daemon", "--config"]);
        } else {
            cmd.arg(verb);
        }
        cmd.arg(&fifo);
        let started = Instant::now();
        // Nobody ever opens the FIFO for writing: a blocking open would never return.
        let out = run(&mut cmd, Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(1), "{verb}: {}", out.stderr);
        assert!(out.stderr.contains("not a regular file"), "{}", out.stderr);
        assert!(started.elapsed() < Duration::from_secs(15));
    }
}

/// Reads lines until `pred` matches one; panics after 10 s.
fn read_until(r: &mut BufReader<UnixStream>, pred: impl Fn(&Value) -> bool) -> Value {
    r.get_ref()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).expect("a line within 10 s");
        assert!(n > 0, "closed before the line came");
        let v: Value = serde_json::from_str(&line).unwrap();
        if pred(&v) {
            return v;
        }
    }
}

#[test]
fn watch_refusals_keep_the_connection_and_lines_sent_while_watching_are_refused() {
    let d = Daemon::start([Model::toy("toy", &[]).scale(1, 3, 0)]);
    let s = UnixStream::connect(&d.socket).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    w.write_all(b"{\"op\":\"watch\",\"model\":\"nope\"}\n{\"op\":\"version\"}\n")
        .unwrap();
    let a = read_until(&mut r, |_| true);
    assert_eq!(a["error"], json!("unknown_model"), "{a}");
    let a = read_until(&mut r, |_| true);
    assert_eq!(a["ok"], json!(true), "the connection goes on: {a}");
    assert_eq!(a["protocol"], json!(1));
    // Now a watch, with a request pipelined behind it in the same write.
    w.write_all(b"{\"op\":\"watch\",\"model\":\"toy\"}\n{\"op\":\"status\"}\n")
        .unwrap();
    assert_eq!(read_until(&mut r, |_| true), json!({"ok": true}));
    let refusal = read_until(&mut r, |v| v.get("ok").is_some());
    assert_eq!(refusal["error"], json!("bad_request"), "{refusal}");
    assert!(
        refusal["message"].as_str().unwrap().contains("watching"),
        "{refusal}"
    );
    // Events keep coming after the refusal, and so does a refusal for each later line.
    d.cli_ok(&["scale", "toy", "--min", "2"]);
    let ev = read_until(&mut r, |v| v["event"] == "scale");
    assert_eq!(ev["to"], json!(2), "{ev}");
    w.write_all(b"\n").unwrap();
    let refusal = read_until(&mut r, |v| v.get("ok").is_some());
    assert_eq!(refusal["error"], json!("bad_request"), "{refusal}");
}

#[test]
fn no_request_is_amplified_and_unknown_fields_are_refused_on_every_op() {
    let d = Daemon::start([Model::toy("toy", &[]).scale(1, 2, 0)]);
    let mut c = Conn::connect(&d.socket).unwrap();
    for line in [
        r#"{"op":"version","x":1}"#,
        r#"{"op":"gpus","verbose":true}"#,
        r#"{"op":"reload","now":1}"#,
    ] {
        let a = c.call(&serde_json::from_str(line).unwrap()).unwrap();
        assert_eq!(a["error"], json!("bad_request"), "{line}: {a}");
    }
    let big = "\u{1}\"x".repeat(6_000);
    let lines: Vec<String> = vec![
        json!({"op": big}).to_string(),
        json!({"op": "status", "model": big}).to_string(),
        json!({"op": "drain", "replica": big}).to_string(),
        json!({"op": "uncordon", "gpu": big}).to_string(),
        json!({"op": "cordon", "gpu": "0", "reason": big}).to_string(),
        json!({"op": "report", "model": "toy", big.clone(): 1}).to_string(),
        json!({"op": "report", "model": "toy", "queue_depth": big}).to_string(),
        format!("{{\"op\":\"version\",{}", "\"a\":".repeat(10_000)),
    ];
    for line in lines {
        assert!(line.len() < 64 * 1024, "{}", line.len());
        c.send_raw(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        let a = c.read().unwrap();
        reply.push_str(&a.to_string());
        assert_eq!(a["ok"], json!(false), "{}", &line[..80]);
        assert!(
            reply.len() < 5 * 1024,
            "a {} byte request got a {} byte answer",
            line.len(),
            reply.len()
        );
    }
}

#[test]
fn connections_past_the_cap_are_told_busy_and_a_half_written_line_times_out() {
    let d = Daemon::start([Model::toy("toy", &[]).scale(1, 2, 0)]);
    // The cap: 512 connections (the daemon's MAX_CONNECTIONS); the toy replica's reporter
    // holds one of them once it reports.
    d.wait_model("toy", "a report", Duration::from_secs(20), |m| {
        m["signal"]["queue_depth"].is_number()
    });
    let mut held = Vec::new();
    for _ in 0..511 {
        held.push(UnixStream::connect(&d.socket).unwrap());
    }
    // Every one is served (one request each proves it was accepted, not just queued).
    let probe = |s: &mut UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"{\"op\":\"version\"}\n").unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    for s in held.iter_mut().step_by(64) {
        assert_eq!(probe(s)["ok"], json!(true));
    }
    let mut extra = UnixStream::connect(&d.socket).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    extra
        .read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("{e}: {answer:?}\n{}", d.log_tail(40)));
    let a: Value = serde_json::from_str(answer.trim()).unwrap();
    assert_eq!(a["error"], json!("busy"), "{a}");
    assert!(a["message"]
        .as_str()
        .unwrap()
        .contains("too many connections"));
    // A refused client reads why, also when it wrote its request first (the daemon used to
    // close with the request unread: a reset) or only after the refusal (then a broken pipe).
    // The pause stands for a client that is slow to write, not for a wait on the daemon.
    for pause in [Duration::ZERO, Duration::from_millis(300)] {
        let mut c = UnixStream::connect(&d.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        std::thread::sleep(pause);
        c.write_all(b"{\"op\":\"status\"}\n")
            .unwrap_or_else(|e| panic!("writing after {pause:?}: {e}"));
        let mut answer = String::new();
        c.read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("reading after {pause:?}: {e}: {answer:?}"));
        let a: Value = serde_json::from_str(answer.trim()).unwrap();
        assert_eq!(a["error"], json!("busy"), "{a}");
    }
    // One leaves: room again.
    held.pop();
    wait_until("room after one left", Duration::from_secs(10), || {
        let mut s = UnixStream::connect(&d.socket).ok()?;
        (probe(&mut s)["ok"] == json!(true)).then_some(())
    });
    drop(held);
    // The daemon sees the held connections close in its own time: until it has, a new one may
    // still be over the cap (answered busy, then closed with our half line unread: a reset).
    wait_until(
        "the held connections seen closed",
        Duration::from_secs(10),
        || {
            let mut s = UnixStream::connect(&d.socket).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            s.write_all(b"{\"op\":\"version\"}\n").ok()?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line).ok()?;
            let a: Value = serde_json::from_str(&line).ok()?;
            (a["ok"] == json!(true)).then_some(())
        },
    );

    // Half a line, then nothing: answered and closed once LINE_TIMEOUT (10 s) has passed.
    let mut slow = UnixStream::connect(&d.socket).unwrap();
    slow.write_all(b"{\"op\":\"vers").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let t = Instant::now();
    let mut rest = String::new();
    slow.read_to_string(&mut rest).unwrap();
    let a: Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(a["error"], json!("bad_request"), "{a}");
    assert!(
        a["message"].as_str().unwrap().contains("within 10 s"),
        "{a}"
    );
    assert!(t.elapsed() >= Duration::from_secs(9), "{:?}", t.elapsed());
    assert_eq!(d.request(json!({"op": "version"}))["ok"], json!(true));
}

#[test]
fn drain_of_the_last_routed_replica_keeps_one_routed() {
    let d = Daemon::start([Model::toy("toy", &["--load-time", "300ms"]).scale(1, 3, 0)]);
    d.wait_settled("toy", 1, 0, Duration::from_secs(20));
    let first = d.in_state("toy", "routed")[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let w = d.watch(Some("toy"));
    w.wait_for(0, Duration::from_secs(10), |e| e["event"] == "routed")
        .expect("the snapshot");
    d.cli_ok(&["drain", &first]);
    // A replacement starts, is routed, and only then the drained one leaves the routed set.
    w.wait_for(0, Duration::from_secs(30), |e| {
        e["event"] == "replica" && e["replica"] == json!(first) && e["state"] == "draining"
    })
    .unwrap_or_else(|| panic!("{first} never drained:\n{}", d.log()));
    let sets = w.routed_sets("toy");
    assert!(
        sets.iter().all(|s| !s.is_empty()),
        "routed dropped to 0: {sets:?}"
    );
    let now = d.in_state("toy", "routed");
    assert_eq!(now.len(), 1);
    assert_ne!(now[0]["id"], json!(first));
}

#[test]
fn a_role_revoked_by_reload_is_gone_on_connections_already_open() {
    if !needs_root("a client that runs as another uid") {
        return;
    }
    let mut d = Daemon::builder()
        .model(Model::toy("toy", &[]).scale(1, 2, 0))
        .extra_config("[access]\nreaders = [\"nobody\"]\n")
        .start();
    chmod(d.dir.path(), 0o755);
    chmod(&d.socket, 0o666);
    // A client as nobody that holds one connection: a request per line on its stdin.
    let script = "import socket,sys\n\
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f=s.makefile('rw')\n\
for line in sys.stdin:\n    f.write(line); f.flush(); print(f.readline().strip(), flush=True)\n";
    let mut child = Command::new("python3")
        .args(["-c", script])
        .arg(&d.socket)
        .env(d.mark().0, d.mark().1)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .uid(65534)
        .gid(65534)
        .spawn()
        .expect("python3");
    let mut to = child.stdin.take().unwrap();
    let mut from = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |line: &str| -> Value {
        to.write_all(format!("{line}\n").as_bytes()).unwrap();
        to.flush().unwrap();
        let mut a = String::new();
        from.read_line(&mut a).unwrap();
        serde_json::from_str(&a).unwrap_or_else(|e| panic!("{e}: {a:?}"))
    };
    assert_eq!(ask(r#"{"op":"version"}"#)["ok"], json!(true));
    d.rewrite_config(|c| c.extra = "[access]\nreaders = []\n".into());
    d.cli_ok(&["reload"]);
    let a = ask(r#"{"op":"version"}"#);
    assert_eq!(a["error"], json!("forbidden"), "{a}");
    drop(to);
    let _ = child.wait();
}

use std::os::unix::process::CommandExt;
