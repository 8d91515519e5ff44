//! Connections to replicas: HTTP/1 with keep-alive, one pool per router thread, used only by the
//! client connections that thread serves (no lock, no hand-off between threads on the way).
//!
//! A connection is checked out for one request and comes back when its answer has been read to
//! the end; one whose answer was not (the client left, the replica failed) is dropped, which
//! closes it, so that the replica sees the request cancelled. Each connection is driven by a task
//! of its own on the thread that opened it.
//!
//! This is what hyper-util's pooled client does, less what a proxy to a handful of known
//! addresses does not need: no URI to parse or rewrite per request, no shared pool behind a lock
//! keyed by a hashed authority, no task spawned per request to wait for the connection to be
//! idle again (a fifth of the router's own CPU per request, measured with
//! scripts/route-bench.sh).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A replica that does not accept a connection in this time is failing, not busy (the router
/// never sends it more than its slots).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections to a replica are kept this long for the next request.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// How often a thread's pool drops connections that closed or idled out, for replicas no
/// request goes to any more.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Largest response head a replica may send.
const MAX_RESPONSE_HEAD: usize = 256 * 1024;

type Sender = SendRequest<Full<Bytes>>;

/// Why a request did not get an answer's head from a replica.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection: refused, timed out, unreachable. The replica never saw the request.
    #[error("connecting to the replica")]
    Connect(#[source] std::io::Error),
    /// The connection failed on the way (hyper says how, and whether anything was sent).
    #[error("{0}")]
    Http(#[source] hyper::Error),
}

/// A connection to a replica, checked out for one request.
pub struct Conn {
    tx: Sender,
    addr: SocketAddr,
}

impl Conn {
    /// The answer was read to its end: the connection serves the next request to its replica.
    pub fn reuse(self) {
        if self.tx.is_ready() {
            checkin(self);
            return;
        }
        // Not yet idle (its task has yet to see the end of the answer) or closing: back in the
        // pool once it says it is ready, dropped if it closes instead.
        tokio::spawn(async move {
            let mut c = self;
            if c.tx.ready().await.is_ok() {
                checkin(c);
            }
        });
    }
}

struct Idle {
    tx: Sender,
    since: Instant,
}

/// By replica address (a thread talks to a handful: a list is quicker to search than a map).
#[derive(Default)]
struct Pool {
    idle: Vec<(SocketAddr, Vec<Idle>)>,
    swept: Option<Instant>,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::default();
}

/// Sends a request to the replica at `addr` on an idle connection of this thread, or a new one.
/// A pooled connection that closed before the request went out is passed over (nothing was
/// sent on it); a failure after that is the caller's to judge.
pub async fn send(
    addr: SocketAddr,
    mut req: Request<Full<Bytes>>,
) -> Result<(Response<Incoming>, Conn), SendError> {
    while let Some(mut tx) = checkout(addr) {
        match tx.try_send_request(req).await {
            Ok(resp) => return Ok((resp, Conn { tx, addr })),
            Err(mut e) => match e.take_message() {
                Some(r) => req = r,
                None => return Err(SendError::Http(e.into_error())),
            },
        }
    }
    let mut tx = connect(addr).await?;
    let resp = tx.send_request(req).await.map_err(SendError::Http)?;
    Ok((resp, Conn { tx, addr }))
}

async fn connect(addr: SocketAddr) -> Result<Sender, SendError> {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(s) => s.map_err(SendError::Connect)?,
        Err(_) => {
            return Err(SendError::Connect(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no connection within {}",
                    crate::units::format_duration(CONNECT_TIMEOUT)
                ),
            )))
        }
    };
    let _ = stream.set_nodelay(true);
    let (tx, conn) = http1::Builder::new()
        .max_buf_size(MAX_RESPONSE_HEAD)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(SendError::Http)?;
    tokio::spawn(async move {
        // Its requests hear of a failure through their answers; here it only ends the task.
        if let Err(e) = conn.await {
            tracing::debug!("replica connection to {addr} ended: {e}");
        }
    });
    Ok(tx)
}

/// The most recently used idle connection to `addr` that can take a request now.
fn checkout(addr: SocketAddr) -> Option<Sender> {
    POOL.with_borrow_mut(|p| {
        let (_, list) = p.idle.iter_mut().find(|(a, _)| *a == addr)?;
        let now = Instant::now();
        while let Some(c) = list.pop() {
            if c.tx.is_ready() && now.saturating_duration_since(c.since) < POOL_IDLE {
                return Some(c.tx);
            }
        }
        None
    })
}

fn checkin(conn: Conn) {
    POOL.with_borrow_mut(|p| {
        let now = Instant::now();
        if p.swept
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
        {
            p.swept = Some(now);
            p.idle.retain_mut(|(_, list)| {
                list.retain(|c| {
                    !c.tx.is_closed() && now.saturating_duration_since(c.since) < POOL_IDLE
                });
                !list.is_empty()
            });
        }
        let idle = Idle {
            tx: conn.tx,
            since: now,
        };
        match p.idle.iter_mut().find(|(a, _)| *a == conn.addr) {
            Some((_, list)) => list.push(idle),
            None => p.idle.push((conn.addr, vec![idle])),
        }
    });
}
