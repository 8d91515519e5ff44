//! One control connection's bytes: lines in, with the limits that keep a hostile or stuck client
//! from holding the daemon's memory or a connection for ever; lines out, with a deadline.
//!
//! - A line is at most `protocol::MAX_LINE` bytes (longer: `too_large`, and the rest of it up to
//!   its newline is skipped without being kept).
//! - A line must be complete within `LINE_TIMEOUT` of its first byte.
//! - A connection with nothing to answer and nothing sent for `IDLE_TIMEOUT` is closed (a watch
//!   is a stream, not idle: it is read without this deadline).
//! - A connection keeps at most `SMALL_BUFFER` bytes of an unfinished line on its own; beyond
//!   that it needs one of `LARGE_LINES` shared permits, and waits for one (reading nothing
//!   meanwhile, so the client's writes stop in the kernel's socket buffer). Memory held for
//!   unfinished lines is so bounded by `LARGE_LINES × (MAX_LINE + a read)` plus
//!   `SMALL_BUFFER` per connection, whatever the number of clients.
//! - A read buffer that grew for a long line is given back once the line is consumed.
//! - Answers and watch events must leave within `WRITE_TIMEOUT` (a client that does not read
//!   is dropped rather than held).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LinesCodec, LinesCodecError};

use crate::protocol;

pub const LINE_TIMEOUT: Duration = Duration::from_secs(10);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a connection may hold of an unfinished line without a shared permit.
pub const SMALL_BUFFER: usize = 4096;
/// Connections that may hold more than `SMALL_BUFFER` of an unfinished line at once.
pub const LARGE_LINES: usize = 64;

/// One line from a client: its text, or what was wrong with it.
#[derive(Debug, PartialEq)]
pub enum Line {
    Text(String),
    /// Longer than `MAX_LINE`; the rest of it, up to its newline, is skipped.
    TooLong,
    /// Not UTF-8; the line was consumed.
    NotUtf8,
}

/// Why no line came.
#[derive(Debug, PartialEq)]
pub enum Stop {
    /// The client closed its end (after a last line without a newline, if any).
    Closed,
    /// Nothing came for `IDLE_TIMEOUT`.
    Idle,
    /// A line was started and not finished within `LINE_TIMEOUT`.
    SlowLine,
    /// The socket failed.
    Failed,
}

/// `LinesCodec` whose bad lines are items rather than errors, so one bad line does not end the
/// connection and leave the requests pipelined behind it unanswered (`LinesCodec` itself
/// recovers from both: it skips to the next newline, or has already consumed the line).
pub struct Lines(LinesCodec);

impl Default for Lines {
    fn default() -> Lines {
        Lines::new()
    }
}

impl Lines {
    pub fn new() -> Lines {
        Lines(LinesCodec::new_with_max_length(protocol::MAX_LINE))
    }

    fn wrap(r: Result<Option<String>, LinesCodecError>) -> Result<Option<Line>, LinesCodecError> {
        match r {
            Ok(l) => Ok(l.map(Line::Text)),
            Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Line::TooLong)),
            // The only I/O error `LinesCodec::decode` makes itself: invalid UTF-8.
            Err(LinesCodecError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                Ok(Some(Line::NotUtf8))
            }
            Err(e) => Err(e),
        }
    }
}

impl Decoder for Lines {
    type Item = Line;
    type Error = LinesCodecError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, LinesCodecError> {
        Lines::wrap(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, LinesCodecError> {
        Lines::wrap(self.0.decode_eof(buf))
    }
}

/// A `Reader`'s state without its socket (see `Reader::park`).
pub struct Parked {
    buf: BytesMut,
    codec: Lines,
    large: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    started: Option<Instant>,
    eof: bool,
}

/// The reading half of a connection.
pub struct Reader {
    half: OwnedReadHalf,
    buf: BytesMut,
    codec: Lines,
    /// Shared permits for unfinished lines over `SMALL_BUFFER`.
    large: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    /// When the unfinished line in `buf` began.
    started: Option<Instant>,
    eof: bool,
}

impl Reader {
    pub fn new(half: OwnedReadHalf, large: Arc<Semaphore>) -> Reader {
        Reader {
            half,
            buf: BytesMut::with_capacity(1024),
            codec: Lines::new(),
            large,
            held: None,
            started: None,
            eof: false,
        }
    }

    /// The socket's reading half, and what was read from it and not yet taken, apart: the
    /// connection moves to another runtime (control.rs) and goes on where it was.
    pub fn park(self) -> (OwnedReadHalf, Parked) {
        let Reader {
            half,
            buf,
            codec,
            large,
            held,
            started,
            eof,
        } = self;
        let parked = Parked {
            buf,
            codec,
            large,
            held,
            started,
            eof,
        };
        (half, parked)
    }

    /// A parked reader on its (re-registered) socket.
    pub fn unpark(half: OwnedReadHalf, p: Parked) -> Reader {
        Reader {
            half,
            buf: p.buf,
            codec: p.codec,
            large: p.large,
            held: p.held,
            started: p.started,
            eof: p.eof,
        }
    }

    /// A whole line is already in the buffer: the next `line` returns without reading.
    pub fn has_line(&self) -> bool {
        self.buf.contains(&b'\n')
    }

    /// The next line. `idle`: close a connection that sends nothing for `IDLE_TIMEOUT` (not for
    /// a watch, whose client only reads).
    pub async fn line(&mut self, idle: bool) -> Result<Line, Stop> {
        let since = Instant::now();
        loop {
            let decoded = if self.eof {
                self.codec.decode_eof(&mut self.buf)
            } else {
                self.codec.decode(&mut self.buf)
            };
            match decoded {
                Ok(Some(line)) => {
                    self.consumed();
                    return Ok(line);
                }
                Ok(None) if self.eof => return Err(Stop::Closed),
                Ok(None) => {}
                Err(_) => return Err(Stop::Failed),
            }
            // Skipping the rest of an over-long line empties the buffer: nothing is unfinished.
            if self.buf.is_empty() {
                self.consumed();
            }
            let deadline = match self.started {
                Some(t) => t + LINE_TIMEOUT,
                None if self.buf.is_empty() && idle => since + IDLE_TIMEOUT,
                None if self.buf.is_empty() => since + Duration::from_secs(365 * 24 * 3600),
                None => *self.started.insert(Instant::now()) + LINE_TIMEOUT,
            };
            let slow = |unfinished: bool| {
                if unfinished {
                    Stop::SlowLine
                } else {
                    Stop::Idle
                }
            };
            if self.buf.len() >= SMALL_BUFFER && self.held.is_none() {
                let permit = self.large.clone().acquire_owned();
                match tokio::time::timeout_at(deadline, permit).await {
                    Ok(Ok(p)) => self.held = Some(p),
                    Ok(Err(_)) => return Err(Stop::Failed),
                    Err(_) => return Err(Stop::SlowLine),
                }
            }
            // Small reads: what an unfinished line holds grows by at most this much at a time.
            self.buf.reserve(SMALL_BUFFER);
            let mut limited = (&mut self.half).take(SMALL_BUFFER as u64);
            let read = limited.read_buf(&mut self.buf);
            match tokio::time::timeout_at(deadline, read).await {
                Ok(Ok(0)) => self.eof = true,
                Ok(Ok(_)) => {
                    if self.started.is_none() && !self.buf.is_empty() {
                        self.started = Some(Instant::now());
                    }
                }
                Ok(Err(_)) => return Err(Stop::Failed),
                Err(_) => return Err(slow(!self.buf.is_empty())),
            }
        }
    }

    /// A line was taken out: what is left is the start of the next (or nothing).
    fn consumed(&mut self) {
        if self.buf.is_empty() {
            self.started = None;
            self.held = None;
            // A buffer that grew for a long line goes back to the allocator.
            if self.buf.capacity() > SMALL_BUFFER * 2 {
                self.buf = BytesMut::with_capacity(1024);
            }
        } else if !self.buf.contains(&b'\n') {
            // The rest is a line begun in the same read: its clock starts now.
            self.started = Some(Instant::now());
        }
    }
}

/// Writes `bytes` within `WRITE_TIMEOUT`; false when the client is gone or does not read.
pub async fn write(half: &mut OwnedWriteHalf, bytes: &[u8]) -> bool {
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, half.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_items_and_decoding_goes_on() {
        let mut codec = Lines::new();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&vec![b'x'; protocol::MAX_LINE + 10]);
        buf.extend_from_slice(b"\n{\"op\":\"version\"}\n\xff\xfe\n{}\n");
        let mut got = Vec::new();
        while let Some(l) = codec.decode(&mut buf).unwrap() {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                Line::TooLong,
                Line::Text("{\"op\":\"version\"}".into()),
                Line::NotUtf8,
                Line::Text("{}".into()),
            ]
        );
    }

    fn pair() -> (Reader, tokio::net::UnixStream, Arc<Semaphore>) {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (r, w) = a.into_split();
        std::mem::forget(w);
        let large = Arc::new(Semaphore::new(1));
        (Reader::new(r, large.clone()), b, large)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unfinished_line_times_out_and_an_idle_connection_closes() {
        let (mut r, mut c, _) = pair();
        c.write_all(b"{\"op\":\"vers").await.unwrap();
        let t = Instant::now();
        assert_eq!(r.line(true).await, Err(Stop::SlowLine));
        assert!(t.elapsed() >= LINE_TIMEOUT && t.elapsed() < LINE_TIMEOUT * 2);

        let (mut r, mut c, _) = pair();
        c.write_all(b"{\"op\":\"version\"}\n").await.unwrap();
        assert!(matches!(r.line(true).await, Ok(Line::Text(_))));
        let t = Instant::now();
        assert_eq!(r.line(true).await, Err(Stop::Idle));
        assert!(t.elapsed() >= IDLE_TIMEOUT);
        // A watch's reader has no idle deadline.
        let (mut r, _c, _) = pair();
        let waited = tokio::time::timeout(IDLE_TIMEOUT * 10, r.line(false)).await;
        assert!(waited.is_err(), "still waiting for a line");
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_unfinished_line_waits_for_a_shared_permit() {
        let (mut r1, mut c1, large) = pair();
        let (r2, mut c2) = {
            let (a, b) = tokio::net::UnixStream::pair().unwrap();
            let (r, w) = a.into_split();
            std::mem::forget(w);
            (Reader::new(r, large.clone()), b)
        };
        let mut r2 = r2;
        let big = vec![b'x'; 3 * SMALL_BUFFER];
        c1.write_all(&big).await.unwrap();
        c2.write_all(&big).await.unwrap();
        // r1 reads past SMALL_BUFFER and takes the one permit (and keeps it while it waits for
        // the rest of its line); r2 cannot: it waits, then its unfinished line times out,
        // having kept no more than a small buffer and one read.
        let waiting = tokio::time::timeout(Duration::from_secs(1), r1.line(true)).await;
        assert!(waiting.is_err());
        assert_eq!(r1.buf.len(), 3 * SMALL_BUFFER);
        assert_eq!(large.available_permits(), 0);
        assert_eq!(r2.line(true).await, Err(Stop::SlowLine));
        assert!(r2.buf.len() < SMALL_BUFFER * 2, "{}", r2.buf.len());
        drop(r1);
        assert_eq!(large.available_permits(), 1, "given back");
    }

    #[tokio::test]
    async fn a_buffer_grown_for_a_long_line_is_given_back() {
        let (mut r, mut c, large) = pair();
        let mut line = vec![b' '; 60 * 1024];
        line.extend_from_slice(b"{\"op\":\"version\"}\n");
        c.write_all(&line).await.unwrap();
        assert!(matches!(r.line(true).await, Ok(Line::Text(_))));
        assert!(r.buf.capacity() <= SMALL_BUFFER * 2, "{}", r.buf.capacity());
        assert_eq!(large.available_permits(), 1);
    }
}
