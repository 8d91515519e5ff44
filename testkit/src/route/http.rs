//! A plain HTTP/1.1 client that reads answers as they arrive (the router streams).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {} {}", self.status, self.text()))
    }
}

/// An answer being read as it arrives.
pub struct Streaming {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    remaining: Option<usize>,
    done: bool,
}

impl Streaming {
    /// The next piece of the body (a chunk, or what a read returned); None at its end. An error
    /// is an answer cut off.
    pub fn next_piece(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        if self.chunked {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "cut off"));
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io::Error::other(format!("bad chunk size {line:?}")))?;
            if size == 0 {
                let mut end = String::new();
                self.reader.read_line(&mut end)?;
                self.done = true;
                return Ok(None);
            }
            let mut buf = vec![0; size + 2];
            self.reader.read_exact(&mut buf)?;
            buf.truncate(size);
            return Ok(Some(buf));
        }
        let mut buf = vec![0; 65536];
        let want = self.remaining.map_or(buf.len(), |r| r.min(buf.len()));
        if want == 0 {
            self.done = true;
            return Ok(None);
        }
        let n = self.reader.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
            if self.remaining.is_some_and(|r| r > 0) {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "cut off"));
            }
            return Ok(None);
        }
        if let Some(r) = self.remaining.as_mut() {
            *r -= n;
        }
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// The rest of the body.
    pub fn rest(&mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(p) = self.next_piece()? {
            out.extend(p);
        }
        Ok(out)
    }

    /// The whole answer, its body read to the end (`send(…)?.whole()`: a request and its
    /// answer).
    pub fn whole(mut self) -> io::Result<Resp> {
        let body = self.rest()?;
        Ok(Resp {
            status: self.status,
            headers: self.headers,
            body,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Closes the connection now (a client that leaves).
    pub fn abandon(self) {
        let _ = self.reader.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// Writes a request on a new connection and reads nothing: a client that may leave before its
/// answer (drop the stream).
pub fn open(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    s
}

/// The value of an unlabelled or fully labelled series in a Prometheus text page.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Sends a request on a new connection and reads the answer's head; [`Streaming::whole`]
/// reads the rest.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<Streaming> {
    let mut s = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| {
        k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding")
    }) {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    read_head(BufReader::new(s))
}

fn read_head(mut reader: BufReader<TcpStream>) -> io::Result<Streaming> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "in the head"));
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let remaining = find("content-length").and_then(|v| v.parse().ok());
    Ok(Streaming {
        status,
        headers,
        reader,
        chunked,
        remaining,
        done: false,
    })
}

pub fn get(addr: SocketAddr, path: &str) -> io::Result<Resp> {
    send(addr, "GET", path, &[], b"", Duration::from_secs(10))?.whole()
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &Value, timeout: Duration) -> io::Result<Resp> {
    send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
        timeout,
    )?
    .whole()
}

/// A completion for `model` through the router.
pub fn complete(addr: SocketAddr, model: &str, timeout: Duration) -> io::Result<Resp> {
    post(
        addr,
        "/v1/completions",
        &json!({"model": model, "prompt": "Hello there", "max_tokens": 4}),
        timeout,
    )
}

/// Requests run on threads, for the ones a test must keep waiting.
pub fn spawn<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}

/// A TCP connection to `addr` from the loopback address `src` (any of 127.0.0.0/8 on Linux):
/// another client address on one machine, for the front door's bounds per address.
pub fn connect_from(src: std::net::Ipv4Addr, addr: SocketAddr) -> io::Result<TcpStream> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    use std::os::fd::AsRawFd;
    bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(std::net::SocketAddrV4::new(src, 0)),
    )?;
    let SocketAddr::V4(to) = addr else {
        return Err(io::Error::other("an IPv4 address to connect to"));
    };
    connect(fd.as_raw_fd(), &SockaddrIn::from(to))?;
    Ok(TcpStream::from(fd))
}

/// Sends `head` (and `body`) on `s` and reads the answer's head.
pub fn exchange(mut s: TcpStream, bytes: &[u8], timeout: Duration) -> io::Result<Streaming> {
    s.set_read_timeout(Some(timeout))?;
    s.write_all(bytes)?;
    read_head(BufReader::new(s))
}
