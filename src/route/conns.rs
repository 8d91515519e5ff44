//! The router's client connections: what each is doing, so that the listener can tell a
//! connection that serves a client from one that only holds a place.
//!
//! - **Silent connections** (accepted, not a byte sent) close after `SILENT_TIMEOUT` to twice
//!   that, spread by connection (thousands connected at once would otherwise be closed at once,
//!   reconnect at once, and load the router in waves every deadline), and hold
//!   no connection slot: they are accepted at once and bounded apart, at `SILENT_PER_SLOT`
//!   times `max_connections` (past it the oldest is closed). Thousands of bare TCP connects
//!   then neither take the slots nor fill the kernel's accept queue: were they closed to make
//!   room, each would connect again at once, and a population of them larger than the slots and
//!   the queue keeps the queue full, so that a client's connect is dropped and retried a second
//!   later (`benches/route_starve.rs` measured p99 3.2 s that way).
//! - **Slots**: a connection takes one of `max_connections` with its first byte. At the bound,
//!   connections idle between requests (keep-alive) are closed to make room, the longest idle
//!   first. A connection waiting for a slot, reading a request head or serving a request is
//!   never closed for room.
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
/// A connection that has sent nothing is closed after this, or up to twice this (spread by
/// connection). Any HTTP client sends its request as soon as it has connected; a connection
/// opened and left silent only holds a place.
pub const SILENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Silent connections held at most, per connection slot.
pub const SILENT_PER_SLOT: usize = 4;

const IDLE: u8 = 0;
const SERVING: u8 = 1;
/// Heard, waiting for a connection slot (until its first read by the HTTP parser).
const WAITING: u8 = 2;

/// One client connection, as the listener and the connection's task share it.
pub struct ClientConn {
    id: u64,
    pub peer: IpAddr,
    /// In `trusted_proxies`: no silent deadline, never closed for room.
    pub trusted: bool,
    /// Any byte read (or ready to be) since the connection was accepted.
    heard: AtomicBool,
    /// The registry's count of silent connections, which this one is in until heard or gone.
    silent: Arc<AtomicUsize>,
    /// Bytes read of the request head in progress (none while a request is served).
    head_bytes: AtomicUsize,
    phase: AtomicU8,
    /// Nanoseconds after the registry's epoch when the connection last became idle (accepted,
    /// or its last answer ended): the longest idle is closed first.
    idle_since: AtomicU64,
    close: CancellationToken,
}

impl ClientConn {
    /// Whether the connection is serving no request: reading a head, idle, waiting for a slot,
    /// or never heard.
    pub fn is_idle(&self) -> bool {
        self.phase.load(Ordering::Acquire) != SERVING
    }

    pub fn heard(&self) -> bool {
        self.heard.load(Ordering::Relaxed)
    }

    /// When this connection, silent, is closed: `SILENT_TIMEOUT` plus a share of it that
    /// differs between consecutive connections (Fibonacci hashing of the id), so that a burst
    /// of connects does not expire in a burst.
    pub fn silent_deadline(&self) -> Duration {
        let spread = self.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54; // 0..1024
        SILENT_TIMEOUT + SILENT_TIMEOUT.mul_f64(spread as f64 / 1024.0)
    }

    /// The connection is silent no more: it has sent a byte (or is gone). Counted once.
    fn leave_silence(&self) {
        if !self.heard.swap(true, Ordering::AcqRel) && !self.trusted {
            self.silent.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The client sent something: the connection waits for a slot, and is never closed for
    /// room meanwhile (it holds none).
    pub fn heard_now(&self) {
        self.phase.store(WAITING, Ordering::Release);
        self.leave_silence();
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
        self.leave_silence();
        if self.phase.load(Ordering::Acquire) != SERVING {
            self.head_bytes.fetch_add(n, Ordering::Relaxed);
            let _ = self
                .phase
                .compare_exchange(WAITING, IDLE, Ordering::AcqRel, Ordering::Acquire);
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
    /// Open connections that have sent nothing yet (trusted proxies' not counted).
    silent: Arc<AtomicUsize>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            silent: Arc::new(AtomicUsize::new(0)),
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
            silent: self.silent.clone(),
            head_bytes: AtomicUsize::new(0),
            phase: AtomicU8::new(IDLE),
            idle_since: AtomicU64::new(self.nanos()),
            close: CancellationToken::new(),
        });
        if !trusted {
            self.silent.fetch_add(1, Ordering::AcqRel);
        }
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

    /// Open connections that have sent nothing yet, trusted proxies' aside.
    pub fn silent(&self) -> usize {
        self.silent.load(Ordering::Acquire)
    }

    /// Closes one connection for room: a silent one, else one idle between requests, the
    /// longest waiting first; never one waiting for a slot, reading a head or serving, never a
    /// trusted proxy's. Whether one was found (what it held comes free when its task has ended).
    pub fn evict_one(&self) -> bool {
        self.evict(true, true)
    }

    /// Closes the oldest silent connection (for the silent bound, or a descriptor).
    pub fn evict_silent(&self) -> bool {
        self.evict(true, false)
    }

    /// Closes the connection idle between requests the longest (for a connection slot: only
    /// those hold one).
    pub fn evict_idle(&self) -> bool {
        self.evict(false, true)
    }

    fn evict(&self, silent: bool, idle: bool) -> bool {
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
            let heard = c.heard();
            if (heard && !idle) || (!heard && !silent) {
                continue;
            }
            let key = (u8::from(heard), c.idle_since.load(Ordering::Relaxed));
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
        self.conn.leave_silence();
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
    fn silent_connections_are_counted_apart_and_hold_no_slot() {
        let reg = Arc::new(Registry::default());
        let a = reg.admit(ip("10.0.0.1"), false);
        let b = reg.admit(ip("10.0.0.2"), false);
        let _proxy = reg.admit(ip("10.0.0.3"), true);
        assert_eq!(reg.silent(), 2, "a trusted proxy's not counted");
        a.conn.heard_now();
        assert_eq!(reg.silent(), 1);
        a.conn.note_read(3);
        assert_eq!(reg.silent(), 1, "counted once");
        // Closing for a slot takes only connections that hold one: idle between requests.
        assert!(!reg.evict_idle(), "neither a silent one nor one mid-head");
        assert!(reg.evict_silent());
        assert!(b.conn.close.is_cancelled());
        drop(b);
        assert_eq!(reg.silent(), 0, "gone");
        let waiting = reg.admit(ip("10.0.0.4"), false);
        waiting.conn.heard_now();
        assert!(
            !reg.evict_one(),
            "waiting for a slot: never closed for room"
        );
        drop((a, waiting));
        assert_eq!(reg.silent(), 0);
    }

    #[test]
    fn silent_deadlines_are_spread_between_one_and_two_timeouts() {
        let reg = Arc::new(Registry::default());
        let conns: Vec<Registered> = (0..1000)
            .map(|_| reg.admit(ip("10.0.0.1"), false))
            .collect();
        let mut tenths = [0usize; 10];
        for r in &conns {
            let d = r.conn.silent_deadline();
            assert!(d >= SILENT_TIMEOUT && d < 2 * SILENT_TIMEOUT, "{d:?}");
            let share = (d - SILENT_TIMEOUT).as_secs_f64() / SILENT_TIMEOUT.as_secs_f64();
            tenths[(share * 10.0) as usize] += 1;
        }
        // A burst of connects expires over the whole span, not at one instant.
        assert!(tenths.iter().all(|&n| (50..150).contains(&n)), "{tenths:?}");
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
