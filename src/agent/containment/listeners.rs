//! Who listens on a port: /proc/net/tcp{,6} gives the listening sockets' inodes, /proc/PID/fd
//! who holds them. Used to refuse a port another process holds before a spawn, and to check
//! that a warm-up was answered by the replica's own process.

use std::fs;
use std::io::ErrorKind;
use std::net::TcpListener;

use super::procfs;

/// A listening TCP socket on this host (this network namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub port: u16,
    pub inode: u64,
    /// Bound to a loopback or wildcard address: it can answer a connection to 127.0.0.1 or ::1.
    pub local: bool,
}

/// TCP state 0A: LISTEN.
const LISTEN: &str = "0A";

/// Listening sockets on `port`, IPv4 and IPv6.
pub fn listening_on(port: u16) -> Vec<Listener> {
    let mut v = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = fs::read_to_string(file) {
            v.extend(parse(&text).into_iter().filter(|l| l.port == port));
        }
    }
    v
}

/// Lines of /proc/net/tcp or tcp6: `sl local rem st … uid timeout inode …`.
pub fn parse(text: &str) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) != Some(&LISTEN) {
                return None;
            }
            let (addr, port) = f.get(1)?.split_once(':')?;
            Some(Listener {
                port: u16::from_str_radix(port, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
                local: local_address(addr),
            })
        })
        .collect()
}

/// A hex address of /proc/net/tcp{,6} (32-bit words in host order) is loopback or wildcard.
fn local_address(hex: &str) -> bool {
    // Each 32-bit word is the address's bytes in network order, printed as a host integer:
    // its bytes in memory are the address's.
    let bytes: Vec<u8> = (0..hex.len() / 8)
        .filter_map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .flat_map(u32::to_ne_bytes)
        .collect();
    match bytes.len() {
        4 => bytes == [0, 0, 0, 0] || bytes[0] == 127,
        16 => {
            let (head, tail) = bytes.split_at(12);
            let v4_mapped = head[..10].iter().all(|b| *b == 0) && head[10..] == [0xff, 0xff];
            bytes.iter().all(|b| *b == 0)
                || (bytes[..15].iter().all(|b| *b == 0) && bytes[15] == 1)
                || (v4_mapped && (tail == [0, 0, 0, 0] || tail[0] == 127))
        }
        _ => false,
    }
}

/// The process holding socket `inode`, among `pids`.
pub fn holder_among(inode: u64, pids: &[u32]) -> Option<u32> {
    pids.iter()
        .copied()
        .find(|&p| procfs::socket_inodes(p).contains(&inode))
}

/// Who holds `port` on a loopback or wildcard address, as a phrase for a message.
pub fn describe_holder(port: u16) -> String {
    let all = procfs::pids();
    for l in listening_on(port).into_iter().filter(|l| l.local) {
        if let Some(p) = holder_among(l.inode, &all) {
            return procfs::describe(p);
        }
    }
    "another process".to_string()
}

/// The port is held on 127.0.0.1 or ::1, as the server will bind it. Bound with SO_REUSEADDR
/// (std sets it, as servers do), so that a port in TIME_WAIT is not "busy": the server will get
/// it. A host without IPv6 has no ::1 to hold.
pub fn port_busy(port: u16) -> bool {
    ["127.0.0.1", "::1"]
        .iter()
        .any(|host| match TcpListener::bind((*host, port)) {
            Ok(_) => false,
            Err(e) => e.kind() == ErrorKind::AddrInUse,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5208 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 00000000:5209 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 0500000A:520A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 100 0 0 10 0
   3: 0100007F:5208 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 444 1 0000000000000000 100 0 0 10 0
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:5208 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:5209 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 666 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:520B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
   3: B80D0120000000000000000001000000:520C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 888 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn listening_sockets_and_which_can_answer_loopback() {
        let v4 = parse(TCP);
        assert_eq!(
            v4,
            vec![
                Listener {
                    port: 0x5208,
                    inode: 111,
                    local: true
                },
                Listener {
                    port: 0x5209,
                    inode: 222,
                    local: true
                },
                Listener {
                    port: 0x520A,
                    inode: 333,
                    local: false
                },
            ],
            "established sockets are not listeners; 10.0.0.5 is not loopback"
        );
        let v6 = parse(TCP6);
        let local: Vec<(u64, bool)> = v6.iter().map(|l| (l.inode, l.local)).collect();
        assert_eq!(
            local,
            vec![(555, true), (666, true), (777, true), (888, false)]
        );
        assert!(parse("garbage\n0: zz").is_empty());
    }

    #[test]
    fn a_held_port_is_busy_and_its_holder_named() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        assert!(port_busy(port));
        let me = std::process::id();
        let found = listening_on(port);
        assert!(found.iter().any(|l| l.local), "{found:?}");
        assert_eq!(holder_among(found[0].inode, &[me]), Some(me));
        assert!(describe_holder(port).starts_with(&format!("pid {me} ")));
        let inode = found[0].inode;
        drop(held);
        // Gone and free within a deadline, not at once: a child another test forks holds a copy
        // of the socket until it execs (CLOEXEC acts at exec), and another test binding port 0
        // may take the port a moment on either address port_busy checks.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while listening_on(port).iter().any(|l| l.inode == inode) || port_busy(port) {
            assert!(std::time::Instant::now() < deadline, "free once closed");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
