//! The control socket's client: one JSON object per line each way.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// How long a read waits for the daemon's answer before the test fails.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection to the control socket.
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    pub fn connect(socket: &Path) -> io::Result<Conn> {
        let s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        Ok(Conn {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.writer.set_read_timeout(t)
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.writer.set_write_timeout(t)
    }

    /// Another handle on the socket, to write from another thread.
    pub fn writer_clone(&self) -> UnixStream {
        self.writer.try_clone().expect("clone the socket")
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// The next line from the daemon, parsed.
    pub fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            ));
        }
        serde_json::from_str(&line).map_err(|e| io::Error::other(format!("{e}: {line:?}")))
    }

    /// Writes one request and reads its answer.
    pub fn call(&mut self, req: &Value) -> io::Result<Value> {
        self.send_raw(format!("{req}\n").as_bytes())?;
        self.read()
    }

    /// The two halves, for a reader thread (see `Watch`).
    pub(crate) fn into_parts(self) -> (BufReader<UnixStream>, UnixStream) {
        (self.reader, self.writer)
    }
}

/// One request on a fresh connection; panics if there is no answer.
pub fn request(socket: &Path, req: &Value) -> Value {
    Conn::connect(socket)
        .and_then(|mut c| c.call(req))
        .unwrap_or_else(|e| panic!("request {req} on {}: {e}", socket.display()))
}

/// Opens `n` connections to `socket` as the user `uid` (root only): the process's effective
/// uid is switched for the connects and back, and the daemon's SO_PEERCRED reads the uid a
/// connection was made with. The socket must let that user connect (chmod it 0666 first).
/// For tests of per-user limits, from a test binary that does nothing else meanwhile.
pub fn connect_as(socket: &Path, uid: u32, n: usize) -> Vec<UnixStream> {
    use nix::unistd::{seteuid, Uid};
    assert!(crate::procs::is_root(), "connect_as needs root");
    seteuid(Uid::from_raw(uid)).unwrap_or_else(|e| panic!("seteuid({uid}): {e}"));
    let conns: Vec<io::Result<UnixStream>> = (0..n).map(|_| UnixStream::connect(socket)).collect();
    seteuid(Uid::from_raw(0)).expect("seteuid back to root");
    conns
        .into_iter()
        .map(|c| c.unwrap_or_else(|e| panic!("connect as uid {uid}: {e}")))
        .collect()
}

/// Asks `req` on an open connection and reads one answer line (or fails).
pub fn ask_on(s: &UnixStream, req: &Value) -> io::Result<Value> {
    let mut w = s;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    w.write_all(format!("{req}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
