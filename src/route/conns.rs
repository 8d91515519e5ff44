//! The router's client connections: what each is doing, so that the listener can tell a
//! connection that serves a client from one that only holds a place.
//!
//! - **Silent connections** (accepted, not a byte sent) close after `SILENT_TIMEOUT`, and are
//!   the first closed to make room when `max_connections` are open: thousands of bare TCP
//!   connects cannot keep a client's request waiting in the accept backlog. Connections idle
//!   between requests (keep-alive) are closed next, the longest idle first. A connection
//!   reading a request head, or serving a request, is never closed for room.
//! - **The request head** is bounded exactly: at most `MAX_HEAD` bytes are handed to the HTTP
//!   parser for one head, so a head of `MAX_HEAD` bytes is read and one byte more is answered
//!   431 (hyper alone checks its buffer only after a read, which lets a head run to about
//!   twice its bound).
//! - **Shutdown** closes at once every connection that is not serving a request; those that
//!   are finish it first.
//!
//! Addresses in `[route] trusted_proxies` (balancers, whose connections carry everyone's
//! traffic and may be opened ahead of use) are exempt from the silent deadline and from being
//! closed for room.

// The crate denies unsafe code; this file needs it for socket options nix does not wrap: each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::relay::{BoxError, RouteBody};

/// Longest request head (request line and headers). At most 100 headers, hyper's own bound:
/// setting another puts the parser's header tables on the heap, two allocations per request.
pub const MAX_HEAD: usize = 64 * 1024;
/// A connection that has sent nothing is closed after this. Any HTTP client sends its request
/// as soon as it has connected; a connection opened and left silent only holds a place.
pub const SILENT_TIMEOUT: Duration = Duration::from_secs(3);

const IDLE: u8 = 0;
const SERVING: u8 = 1;

/// One client connection, as the listener and the connection's task share it.
pub struct ClientConn {
    id: u64,
    pub peer: IpAddr,
    /// In `trusted_proxies`: no silent deadline, never closed for room.
    pub trusted: bool,
    /// Any byte read since the connection was accepted.
    heard: AtomicBool,
    /// Bytes read of the request head in progress (none while a request is served).
    head_bytes: AtomicUsize,
    phase: AtomicU8,
    /// Nanoseconds after the registry's epoch when the connection last became idle (accepted,
    /// or its last answer ended): the longest idle is closed first.
    idle_since: AtomicU64,
    close: CancellationToken,
}

impl ClientConn {
    /// Whether the connection is serving no request: reading a head, idle, or never heard.
    pub fn is_idle(&self) -> bool {
        self.phase.load(Ordering::Acquire) != SERVING
    }

    pub fn heard(&self) -> bool {
        self.heard.load(Ordering::Relaxed)
    }

    /// Ends when the listener chose this connection to be closed for room.
    pub fn closing(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }

    /// A request head was read: the request is served from now until its answer ends (the
    /// guard is dropped).
    pub fn begin(self: &Arc<Self>, registry: &Arc<Registry>) -> Serving {
        self.phase.store(SERVING, Ordering::Release);
        self.head_bytes.store(0, Ordering::Relaxed);
        Serving {
            conn: self.clone(),
            registry: registry.clone(),
        }
    }

    /// How many more bytes the head in progress may take (no bound while a request is served:
    /// what arrives then is its body, or a pipelined head checked by hyper's own bound).
    fn head_room(&self) -> usize {
        if self.phase.load(Ordering::Acquire) == SERVING {
            return usize::MAX;
        }
        MAX_HEAD.saturating_sub(self.head_bytes.load(Ordering::Relaxed))
    }

    fn note_read(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.heard.store(true, Ordering::Relaxed);
        if self.phase.load(Ordering::Acquire) != SERVING {
            self.head_bytes.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// A request being served; dropped when its answer has ended (or was abandoned).
pub struct Serving {
    conn: Arc<ClientConn>,
    registry: Arc<Registry>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.conn
            .idle_since
            .store(self.registry.nanos(), Ordering::Relaxed);
        self.conn.head_bytes.store(0, Ordering::Relaxed);
        self.conn.phase.store(IDLE, Ordering::Release);
    }
}

/// Every open client connection, for the listener to choose which to close for room.
pub struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<ClientConn>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        }
    }
}

impl Registry {
    fn nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ClientConn>>> {
        // Entries are inserted and removed whole: a panic elsewhere leaves nothing half-done.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection just accepted; it leaves the registry when its `Registered` is dropped.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, trusted: bool) -> Registered {
        let conn = Arc::new(ClientConn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            trusted,
            heard: AtomicBool::new(false),
            head_bytes: AtomicUsize::new(0),
            phase: AtomicU8::new(IDLE),
            idle_since: AtomicU64::new(self.nanos()),
            close: CancellationToken::new(),
        });
        self.lock().insert(conn.id, conn.clone());
        Registered {
            conn,
            registry: self.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes one connection to make room: a silent one, else one idle between requests, the
    /// longest waiting first; never one reading a head or serving, never a trusted proxy's.
    /// Whether one was found (its slot comes free when its task has ended).
    pub fn evict_one(&self) -> bool {
        let mut conns = self.lock();
        // (rank, idle since): silent before idle, then the oldest.
        let mut best: Option<((u8, u64), u64)> = None;
        for c in conns.values() {
            if c.trusted
                || c.phase.load(Ordering::Acquire) != IDLE
                || c.head_bytes.load(Ordering::Relaxed) > 0
            {
                continue;
            }
            let key = (u8::from(c.heard()), c.idle_since.load(Ordering::Relaxed));
            if best.is_none_or(|(k, _)| key < k) {
                best = Some((key, c.id));
            }
        }
        let Some((_, id)) = best else {
            return false;
        };
        let Some(c) = conns.remove(&id) else {
            return false;
        };
        drop(conns);
        // A request that began since the scan keeps its connection: it is served, then the
        // connection closes (the task sees `closing` with the request in progress).
        c.close.cancel();
        true
    }
}

/// A connection's place in the registry, given up when dropped (the connection's task ends).
pub struct Registered {
    pub conn: Arc<ClientConn>,
    registry: Arc<Registry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.conn.id);
    }
}

/// The client's TCP stream as hyper reads it: every read is noted (first byte, head size) and
/// a head is cut off at `MAX_HEAD` bytes.
pub struct Watched {
    stream: TcpStream,
    conn: Arc<ClientConn>,
}

impl Watched {
    pub fn new(stream: TcpStream, conn: Arc<ClientConn>) -> Watched {
        Watched { stream, conn }
    }
}

impl hyper::rt::Read for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let room = this.conn.head_room();
        let n = {
            // SAFETY: as hyper_util's TokioIo does: the cursor's unfilled part is lent to a
            // tokio ReadBuf, which only writes initialised bytes into it, and the cursor is
            // advanced by what was filled.
            let dst = unsafe { buf.as_mut() };
            let len = dst.len().min(room);
            if len == 0 && !dst.is_empty() {
                // hyper answers 431 before asking for more than a whole head; never reached
                // unless that changes, and then the connection ends rather than a bound.
                return Poll::Ready(Err(io::Error::other("request head over the bound")));
            }
            let mut tbuf = tokio::io::ReadBuf::uninit(&mut dst[..len]);
            match Pin::new(&mut this.stream).poll_read(cx, &mut tbuf) {
                Poll::Ready(Ok(())) => tbuf.filled().len(),
                other => return other,
            }
        };
        // SAFETY: `n` bytes were filled just above.
        unsafe { buf.advance(n) };
        this.conn.note_read(n);
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        tokio::io::AsyncWrite::poll_write(Pin::new(&mut self.get_mut().stream), cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::io::AsyncWrite::poll_flush(Pin::new(&mut self.get_mut().stream), cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::io::AsyncWrite::poll_shutdown(Pin::new(&mut self.get_mut().stream), cx)
    }

    fn is_write_vectored(&self) -> bool {
        tokio::io::AsyncWrite::is_write_vectored(&self.stream)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        tokio::io::AsyncWrite::poll_write_vectored(Pin::new(&mut self.get_mut().stream), cx, bufs)
    }
}

/// An answer's body with its request's `Serving` guard: the request is served until hyper has
/// written the last byte (or dropped the body because the client left).
pub struct Tracked {
    body: RouteBody,
    _serving: Serving,
}

impl Tracked {
    pub fn new(body: RouteBody, serving: Serving) -> Tracked {
        Tracked {
            body,
            _serving: serving,
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn room_is_made_from_silent_connections_first_then_the_longest_idle() {
        let reg = Arc::new(Registry::default());
        let heard_idle = reg.admit(ip("10.0.0.1"), false);
        heard_idle.conn.note_read(10);
        drop(heard_idle.conn.begin(&reg));
        let serving = reg.admit(ip("10.0.0.2"), false);
        let _busy = serving.conn.begin(&reg);
        let mid_head = reg.admit(ip("10.0.0.3"), false);
        mid_head.conn.note_read(5);
        let proxy = reg.admit(ip("10.0.0.4"), true);
        let silent_old = reg.admit(ip("10.0.0.5"), false);
        let silent_new = reg.admit(ip("10.0.0.6"), false);
        assert_eq!(reg.len(), 6);
        assert!(reg.evict_one());
        assert!(
            silent_old.conn.close.is_cancelled(),
            "the oldest silent first"
        );
        assert!(reg.evict_one());
        assert!(silent_new.conn.close.is_cancelled());
        assert!(reg.evict_one());
        assert!(heard_idle.conn.close.is_cancelled(), "then idle keep-alive");
        assert!(!reg.evict_one(), "never one serving, mid-head or a proxy's");
        for c in [&serving, &mid_head, &proxy] {
            assert!(!c.conn.close.is_cancelled());
        }
        assert_eq!(reg.len(), 3);
        drop((serving, mid_head, proxy));
        assert!(reg.is_empty());
    }

    #[test]
    fn the_head_bound_counts_only_bytes_read_between_requests() {
        let reg = Arc::new(Registry::default());
        let r = reg.admit(ip("127.0.0.1"), false);
        let c = &r.conn;
        assert_eq!(c.head_room(), MAX_HEAD);
        c.note_read(1000);
        assert_eq!(c.head_room(), MAX_HEAD - 1000);
        let serving = c.begin(&reg);
        c.note_read(1 << 20);
        assert_eq!(c.head_room(), usize::MAX, "a body is not a head");
        drop(serving);
        assert_eq!(c.head_room(), MAX_HEAD, "the next head starts afresh");
        c.note_read(MAX_HEAD + 5);
        assert_eq!(c.head_room(), 0);
    }
}
