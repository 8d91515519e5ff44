//! Hostile and careless input on the control socket: every bad line gets its error code, the
//! connection and other clients carry on, and the daemon keeps running.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use testkit::*;

/// Reads one answer and checks it is the failure `code`.
fn expect_error(c: &mut Conn, code: &str, what: &str) -> Value {
    let a = c
        .read()
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    assert_eq!(a["ok"], json!(false), "{what}: {a}");
    assert_eq!(a["error"], json!(code), "{what}: {a}");
    assert!(
        a["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: no message: {a}"
    );
    a
}

fn expect_ok(c: &mut Conn, what: &str) -> Value {
    let a = c
        .read()
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    assert_eq!(a["ok"], json!(true), "{what}: {a}");
    a
}

#[test]
fn hostile_input_gets_error_codes_and_nobody_else_notices() {
    let mut d = Daemon::start([Model::toy("toy", &[]).scale(1, 2, 0)]);
    wait_until("toy-1 routed", Duration::from_secs(15), || {
        d.in_state("toy", "routed")
            .into_iter()
            .find(|r| r["id"] == "toy-1")
    });
    // A well-behaved client, connected all along.
    let mut other = Conn::connect(&d.socket).unwrap();
    let mut check_other = |after: &str| {
        let a = other
            .call(&json!({"op": "version"}))
            .unwrap_or_else(|e| panic!("the other client, after {after}: {e}"));
        assert_eq!(a["ok"], json!(true), "the other client, after {after}: {a}");
        assert_eq!(a["protocol"], json!(1), "{a}");
    };
    check_other("nothing");

    let mut c = Conn::connect(&d.socket).unwrap();
    let big = {
        let mut v = vec![b'x'; 70 * 1024];
        v.push(b'\n');
        v
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("invalid JSON", b"{nope\n".to_vec(), "bad_request"),
        ("not an object", b"[1,2]\n".to_vec(), "bad_request"),
        ("no op", b"{\"model\":\"toy\"}\n".to_vec(), "bad_request"),
        ("unknown op", b"{\"op\":\"fly\"}\n".to_vec(), "unknown_op"),
        (
            "unknown model",
            b"{\"op\":\"status\",\"model\":\"nope\"}\n".to_vec(),
            "unknown_model",
        ),
        (
            "unknown replica",
            b"{\"op\":\"drain\",\"replica\":\"toy-999\"}\n".to_vec(),
            "unknown_replica",
        ),
        (
            "drain without replica",
            b"{\"op\":\"drain\"}\n".to_vec(),
            "bad_request",
        ),
        ("a line over 64 KiB", big.clone(), "too_large"),
        (
            "invalid UTF-8",
            b"{\"op\":\"\xff\xfe\"}\n".to_vec(),
            "bad_request",
        ),
    ];
    for (what, line, code) in &cases {
        c.send_raw(line).unwrap();
        expect_error(&mut c, code, what);
        // The same connection still answers.
        c.send_raw(b"{\"op\":\"version\"}\n").unwrap();
        expect_ok(&mut c, &format!("version after {what}"));
        check_other(what);
    }

    // A pipelined batch in one write, hostile lines included, answered in order.
    let mut batch = Vec::new();
    batch.extend_from_slice(b"{\"op\":\"version\"}\n");
    batch.extend_from_slice(b"{\"op\":\"fly\"}\n");
    batch.extend_from_slice(b"{\"op\":\"status\",\"model\":\"toy\"}\n");
    batch.extend_from_slice(&big);
    batch.extend_from_slice(b"{bad\n");
    batch.extend_from_slice(b"{\"op\":\"status\",\"model\":\"nope\"}\n");
    batch.extend_from_slice(b"\n");
    batch.extend_from_slice(b"{\"op\":\"gpus\"}\n");
    batch.extend_from_slice(b"{\"op\":\"drain\",\"replica\":\"nope-1\"}\n");
    batch.extend_from_slice(b"{\"op\":\"version\"}\n");
    c.send_raw(&batch).unwrap();
    let a = expect_ok(&mut c, "batch 1: version");
    assert_eq!(a["protocol"], json!(1), "{a}");
    expect_error(&mut c, "unknown_op", "batch 2: fly");
    let a = expect_ok(&mut c, "batch 3: status toy");
    assert_eq!(a["status"]["models"][0]["name"], json!("toy"), "{a}");
    expect_error(&mut c, "too_large", "batch 4: 70 KiB line");
    expect_error(&mut c, "bad_request", "batch 5: bad JSON");
    expect_error(&mut c, "unknown_model", "batch 6: unknown model");
    // Every line gets one answer: an empty one is a bad request, as a client pairing answers
    // with its lines expects.
    expect_error(&mut c, "bad_request", "batch 6b: an empty line");
    let a = expect_ok(&mut c, "batch 7: gpus");
    assert!(a["gpus"].is_array(), "{a}");
    expect_error(&mut c, "unknown_replica", "batch 8: unknown replica");
    let a = expect_ok(&mut c, "batch 9: version");
    assert_eq!(a["protocol"], json!(1), "{a}");
    check_other("the pipelined batch");

    // An admin op from a peer without the role (a client run as uid 65534).
    if needs_root("a client run as another uid") {
        // Let uid 65534 reach the socket at all: the temp dir is 0700, the socket 0660.
        std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut drain = d.command(&["drain", "toy-1"]);
        let out = run(drain.uid(65534).gid(65534), Duration::from_secs(30));
        let stderr = out.stderr;
        assert_eq!(
            out.status.code(),
            Some(1),
            "hearth drain as uid 65534: {stderr}"
        );
        assert!(stderr.contains("forbidden"), "{stderr}");
        let r = d
            .replicas("toy")
            .into_iter()
            .find(|r| r["id"] == "toy-1")
            .unwrap();
        assert_eq!(
            r["state"],
            json!("routed"),
            "a forbidden drain drained: {r}"
        );
        check_other("a forbidden drain");
    }

    // The daemon kept running and answers a fresh client.
    assert!(d.running(), "the daemon exited:\n{}", d.log());
    let s = d.status();
    assert_eq!(s["models"][0]["routed"], json!(1), "{s}");
}

#[test]
fn a_flood_of_bad_lines_does_not_stall_other_clients() {
    let mut d = Daemon::start([Model::toy("toy", &[]).scale(1, 1, 0)]);
    let sock = d.socket.clone();
    // Several hostile clients write garbage as fast as they can, not reading their answers.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // How many floods have landed a line: the normal client starts only once all three flood,
    // so that on a loaded machine its 50 asks cannot all finish before a flood has begun.
    let flooding = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let floods: Vec<_> = (0..3)
        .map(|i| {
            let sock = sock.clone();
            let stop = stop.clone();
            let flooding = flooding.clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(&sock).unwrap();
                let line = match i {
                    0 => b"{garbage\n".to_vec(),
                    1 => {
                        let mut v = vec![b'y'; 100 * 1024];
                        v.push(b'\n');
                        v
                    }
                    _ => b"{\"op\":\"nope\"}\n".to_vec(),
                };
                // The daemon may stop reading from a client that never reads its answers:
                // then writes block (here: time out) and that is fine.
                c.set_write_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let mut sent = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match c.send_raw(&line) {
                        Ok(()) => {
                            if sent == 0 {
                                flooding.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            sent += 1
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => break,
                    }
                }
                sent
            })
        })
        .collect();
    wait_until("all three floods to send", Duration::from_secs(20), || {
        (flooding.load(std::sync::atomic::Ordering::Relaxed) == 3).then_some(())
    });
    // Meanwhile a normal client gets every answer promptly.
    let mut c = Conn::connect(&sock).unwrap();
    for _ in 0..50 {
        let t = std::time::Instant::now();
        let a = c.call(&json!({"op": "status"})).unwrap();
        assert_eq!(a["ok"], json!(true), "{a}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "status took {:?} under a flood",
            t.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent: u64 = floods.into_iter().map(|f| f.join().unwrap()).sum();
    assert!(sent > 50, "the flood was no flood: {sent} lines");
    assert!(d.running(), "the daemon exited:\n{}", d.log());
}

#[test]
fn a_long_pipelined_stream_is_answered_in_order() {
    let d = Daemon::start([Model::toy("toy", &[]).scale(1, 1, 0)]);
    let mut c = Conn::connect(&d.socket).unwrap();
    // 2,000 requests in one stream, written by another thread while this one reads (so neither
    // side's socket buffer can stall the other): reports (answered by the core) alternate with
    // status requests for unknown models, whose errors name the model and so show the order.
    let n = 2_000;
    let mut stream = Vec::new();
    for i in 0..n {
        if i % 2 == 0 {
            stream.extend_from_slice(
                format!(
                    "{}\n",
                    json!({"op": "report", "model": "toy", "oldest_wait_ms": 1})
                )
                .as_bytes(),
            );
        } else {
            stream.extend_from_slice(
                format!(
                    "{}\n",
                    json!({"op": "status", "model": format!("nope-{i}")})
                )
                .as_bytes(),
            );
        }
    }
    let mut writer = c.writer_clone();
    let t = std::thread::spawn(move || {
        use std::io::Write;
        writer.write_all(&stream).unwrap();
    });
    for i in 0..n {
        if i % 2 == 0 {
            expect_ok(&mut c, &format!("request {i}: report"));
        } else {
            let a = expect_error(&mut c, "unknown_model", &format!("request {i}"));
            let m = a["message"].as_str().unwrap();
            assert!(m.contains(&format!("nope-{i}\"")), "request {i}: {a}");
        }
    }
    t.join().unwrap();
}
