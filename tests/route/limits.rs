//! What a client may hold of the front door, and what it may send: connections that send
//! nothing close after a short deadline and make room for clients that do; one client
//! address holds at most its share of buffered request bodies (a trusted proxy's address is
//! exempt from both); the request head's documented bounds (64 KiB, 100 headers) at their
//! edges; bodies that are not valid JSON within the depth bound refused by the router itself;
//! SIGTERM with nothing in flight ends the router at once.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::route::*;

const T: Duration = Duration::from_secs(60);
/// Longer than the router's silent deadline (2 to 4 s), shorter than its head timeout (30 s).
const PAST_SILENT: Duration = Duration::from_secs(12);

fn toy() -> Model {
    Model::front_toy("l", &["--service-time", "10ms"]).scale(1, 1, 0)
}

/// Waits for the server to close `s` (EOF or reset) within `within`; false if still open.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn routed(addr: SocketAddr, daemon: &Daemon) {
    daemon.wait_routed("l", 1, T);
    wait_until("the router routing l", T, || {
        let r = complete(addr, "l", Duration::from_secs(10)).ok()?;
        (r.status == 200).then_some(())
    });
}

#[test]
fn silent_connections_close_early_and_make_room_for_clients() {
    let (daemon, _router, addr) = front_door([toy()], "max_connections = 8\n");
    routed(addr, &daemon);
    // Eight connections that never send a byte: as many as max_connections.
    let mut silent: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    // A client's request is served anyway: silent connections hold no slot (at first it waited
    // in the accept backlog until a silent one's 30-s head timeout).
    let r = complete(addr, "l", Duration::from_secs(10)).expect("served while 8 sit silent");
    assert_eq!(r.status, 200, "{}", r.text());
    // The rest close after the silent deadline, long before the head timeout.
    let started = Instant::now();
    for s in &mut silent {
        let left = PAST_SILENT.saturating_sub(started.elapsed());
        assert!(
            closed_within(s, left.max(Duration::from_millis(1))),
            "still open"
        );
    }
    // A connection that has sent part of a head is not silent: it keeps its head timeout.
    let mut partial = TcpStream::connect(addr).unwrap();
    partial.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    assert!(!closed_within(&mut partial, Duration::from_secs(5)));
}

#[test]
fn silent_connections_past_max_connections_are_held_apart_not_closed_for_room() {
    let (daemon, _router, addr) = front_door([toy()], "max_connections = 8\n");
    routed(addr, &daemon);
    // Three times the slots, silent (the router holds four times its slots of them). Before,
    // it took them in turn from the accept queue, each by closing an earlier one, so that a
    // client behind them waited for that churn (and, with more of them than the queue holds,
    // for the kernel's retry a second later: benches/route_starve.rs).
    let mut silent: Vec<TcpStream> = (0..24).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let r = complete(addr, "l", Duration::from_secs(10)).expect("served while 24 sit silent");
    assert_eq!(r.status, 200, "{}", r.text());
    // None was closed to make room: each is still open, until its own silent deadline.
    let mut open = 0;
    for s in &mut silent {
        if !closed_within(s, Duration::from_millis(1)) {
            open += 1;
        }
    }
    assert_eq!(open, 24, "silent connections closed before their deadline");
    let started = Instant::now();
    for s in &mut silent {
        let left = PAST_SILENT.saturating_sub(started.elapsed());
        assert!(
            closed_within(s, left.max(Duration::from_millis(1))),
            "still open"
        );
    }
}

/// `POST /v1/completions` declaring `len` bytes of body, of which `sent` are sent.
fn stalled_upload(from: Ipv4Addr, addr: SocketAddr, len: usize, sent: usize) -> TcpStream {
    let mut s = connect_from(from, addr).expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    // An upload the router refuses is answered at once and closed while its body is still being
    // written (it does not fit in the socket's buffers): the write then fails with a broken pipe,
    // and the answer, read next, is what the test judges.
    let _ = s.write_all(&vec![b' '; sent]);
    s
}

/// Status and error code of the answer to what `s` sent, if it comes within `within`.
fn answer(s: TcpStream, within: Duration) -> Option<(u16, String)> {
    let r = exchange(s, b"", within).ok()?.whole().ok()?;
    let code = serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default();
    Some((r.status, code))
}

#[test]
fn one_client_address_cannot_take_the_whole_body_budget() {
    const MIB: usize = 1 << 20;
    let keys = "max_body = \"1MiB\"\nmax_buffered = \"4MiB\"\ntrusted_proxies = [\"127.0.0.3\"]\n";
    let (daemon, _router, addr) = front_door([toy()], keys);
    routed(addr, &daemon);
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    // Its first stalled upload holds its share (1 MiB: an eighth of 4 MiB, at least max_body).
    let first = stalled_upload(attacker, addr, MIB, MIB - 1);
    std::thread::sleep(Duration::from_millis(500));
    // Its next ones are refused at once, 429, while the first holds.
    let mut held = vec![first];
    for _ in 0..3 {
        let s = stalled_upload(attacker, addr, MIB, MIB - 1);
        let got = answer(s, Duration::from_secs(10));
        assert_eq!(
            got,
            Some((429, "client_overloaded".to_string())),
            "a second stalled upload from one address"
        );
    }
    // Everyone else still has room: before, four stalled uploads took the whole 4 MiB and every
    // other client got 503 `overloaded` until they timed out.
    held.push(stalled_upload(attacker, addr, MIB, MIB - 1));
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "l", "prompt": "x".repeat(200_000)}),
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // A trusted proxy carries everyone's traffic: it may hold more than one address's share.
    let proxy = Ipv4Addr::new(127, 0, 0, 3);
    let p1 = stalled_upload(proxy, addr, MIB, MIB - 1);
    std::thread::sleep(Duration::from_millis(300));
    let p2 = stalled_upload(proxy, addr, MIB, MIB - 1);
    assert_eq!(
        answer(p2, Duration::from_secs(2)),
        None,
        "the proxy's second upload is read, not refused"
    );
    // … and a connection of its that has sent nothing yet is not closed at the silent deadline.
    let mut quiet = connect_from(proxy, addr).unwrap();
    assert!(!closed_within(&mut quiet, Duration::from_secs(6)));
    drop((held, p1));
}

#[test]
fn the_request_head_bounds_are_exact() {
    let (daemon, _router, addr) = front_door([toy()], "");
    routed(addr, &daemon);
    let head = |total: usize| {
        let base = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-pad: ";
        let pad = total - base.len() - 4;
        format!("{base}{}\r\n\r\n", "a".repeat(pad)).into_bytes()
    };
    let status = |bytes: Vec<u8>| {
        let s = TcpStream::connect(addr).unwrap();
        exchange(s, &bytes, Duration::from_secs(10)).unwrap().status
    };
    assert_eq!(head(64 * 1024).len(), 65536);
    assert_eq!(status(head(64 * 1024)), 200, "a head of exactly 64 KiB");
    assert_eq!(status(head(64 * 1024 + 1)), 431, "one byte over");
    assert_eq!(status(head(100 * 1024)), 431);
    let headers = |n: usize| {
        let mut h = String::from("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        for i in 0..n - 2 {
            h.push_str(&format!("x-h{i}: v\r\n"));
        }
        h.push_str("\r\n");
        h.into_bytes()
    };
    assert_eq!(status(headers(100)), 200, "100 headers");
    assert_eq!(status(headers(101)), 431, "101 headers");
}

#[test]
fn bodies_that_are_not_valid_json_are_refused_by_the_router() {
    let (daemon, _router, addr) = front_door([toy()], "");
    routed(addr, &daemon);
    let deep = |n: usize| {
        format!(
            "{{\"model\":\"l\",\"prompt\":\"x\",\"a\":{}{}}}",
            "[".repeat(n),
            "]".repeat(n)
        )
        .into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("100,000-deep nesting", deep(100_000)),
        ("128 levels", deep(127)),
        (
            "invalid UTF-8",
            b"{\"model\":\"l\",\"prompt\":\"\xff\xfe\"}".to_vec(),
        ),
        (
            "a lone surrogate",
            br#"{"model":"l","prompt":"\ud800 alone"}"#.to_vec(),
        ),
    ];
    for (what, body) in cases {
        let r = send(
            addr,
            "POST",
            "/v1/completions",
            &[("Content-Type", "application/json")],
            &body,
            Duration::from_secs(10),
        )
        .unwrap()
        .whole()
        .unwrap();
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "invalid_json", "{what}");
        assert_eq!(
            r.header("x-hearth-replica"),
            None,
            "{what}: reached a replica"
        );
    }
    // 127 levels, the bound, pass to the replica.
    let r = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        &deep(126),
        Duration::from_secs(10),
    )
    .unwrap()
    .whole()
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn sigterm_with_nothing_in_flight_ends_the_router_at_once() {
    let (daemon, mut router, addr) = front_door([toy()], "shutdown_grace = \"30s\"\n");
    routed(addr, &daemon);
    // What clients leave open: a keep-alive connection after its answer, one that sent part
    // of a head, one that sent nothing.
    let mut kept = TcpStream::connect(addr).unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 512];
    assert!(kept.read(&mut buf).unwrap() > 0);
    let mut partial = TcpStream::connect(addr).unwrap();
    partial.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    let _silent = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    router.signal(Signal::SIGTERM);
    // Before, the partial head held the router until its 30-s head timeout.
    let status = router
        .wait_exit(Duration::from_secs(10))
        .expect("the router exits without waiting on idle connections");
    assert!(status.success(), "{status}");
}
