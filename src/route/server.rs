//! The listener: a task per client connection, HTTP/1.1 with keep-alive, a bounded number of
//! connections (a slot taken with the first byte; silent connections bounded apart and closed
//! after a short deadline, idle ones closed to make room: `conns.rs`), bounded request heads,
//! and a deadline for each request head (which also closes idle keep-alive connections). Takes
//! its listener and its shutdown signal as arguments.
//!
//! Connections are dealt in turn to the router's threads, each a single-threaded runtime: a
//! connection, the requests on it and their replica connections then stay on one thread, with
//! no work stealing or wake-ups across threads on the way (a fifth less CPU per request than
//! tokio's multi-threaded scheduler, measured with scripts/route-bench.sh).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::api::{self, Client};
use super::conns::{Registered, Registry, Tracked, Watched, MAX_HEAD, SILENT_PER_SLOT};
use super::router::Router;

/// A request head must arrive within this, and an idle keep-alive connection closes after it.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// The listening socket, with an accept backlog as deep as the connections allowed (the
/// kernel caps it at `net.core.somaxconn`): a burst of connects waits there rather than being
/// dropped and retried a second later.
pub fn bind(addr: SocketAddr, max_connections: usize) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(u32::try_from(max_connections.clamp(1024, 65_535)).unwrap_or(65_535))
}

/// Accepts until `shutdown`; connections then close at once unless they are serving a request,
/// which they finish first.
pub async fn serve(
    listener: TcpListener,
    router: Arc<Router>,
    workers: Vec<Handle>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(router.settings.max_connections));
    let max_silent = router
        .settings
        .max_connections
        .saturating_mul(SILENT_PER_SLOT);
    let registry = Arc::new(Registry::default());
    let mut turn = 0usize;
    loop {
        // Never waiting for a slot before accepting: a connection takes one with its first
        // byte, so that silent ones cannot hold the accept queue full (conns.rs).
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: a silent or idle connection gives its descriptor
                    // back, else wait a little; don't spin, don't die.
                    if !registry.evict_one() {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // Moved to its thread's runtime: deregistered here, registered there.
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("handing a connection over: {e}");
                continue;
            }
        };
        let ip = peer.ip().to_canonical();
        let trusted = router.settings.trusted_proxies.contains(ip);
        let registered = registry.admit(ip, trusted);
        if registry.silent() > max_silent {
            registry.evict_silent();
        }
        let worker = &workers[turn % workers.len()];
        turn = turn.wrapping_add(1);
        let conn = Connection {
            router: router.clone(),
            registry: registry.clone(),
            registered,
            permits: permits.clone(),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
        };
        tracker.spawn_on(conn.first_byte(stream), worker);
    }
}

/// One client connection, from its accept to its end.
struct Connection {
    router: Arc<Router>,
    registry: Arc<Registry>,
    /// The place in the registry, held as long as the connection's task runs.
    registered: Registered,
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Connection {
    /// Waits for the client's first byte (within the silent deadline, but for a trusted
    /// proxy's), then takes a slot and serves HTTP on a task of its own: thousands of silent
    /// connections cost a small task each, not an HTTP connection's state.
    async fn first_byte(self, stream: std::net::TcpStream) {
        let Ok(stream) = TcpStream::from_std(stream) else {
            return;
        };
        let conn = self.registered.conn.clone();
        let silent = tokio::time::sleep(conn.silent_deadline());
        tokio::pin!(silent);
        tokio::select! {
            // Readable: a byte, or the client's end (which the HTTP parser then reads).
            ready = stream.readable() => if ready.is_err() { return },
            _ = &mut silent, if !conn.trusted => return,
            _ = self.shutdown.cancelled() => return,
            _ = conn.closing() => return,
        }
        conn.heard_now();
        let permit = tokio::select! {
            p = room(&self.permits, &self.registry) => match p {
                Some(p) => p,
                None => return,
            },
            _ = self.shutdown.cancelled() => return,
        };
        let tracker = self.tracker.clone();
        tracker.spawn(self.http(stream, permit));
    }

    async fn http(self, stream: TcpStream, permit: OwnedSemaphorePermit) {
        // The slot is held as long as this task runs.
        let _permit = permit;
        let conn = self.registered.conn.clone();
        let client = Client {
            ip: conn.peer,
            trusted: conn.trusted,
        };
        let svc = {
            let conn = conn.clone();
            let (router, registry) = (self.router.clone(), self.registry.clone());
            service_fn(move |req| {
                let serving = conn.begin(&registry);
                let router = router.clone();
                async move {
                    let resp = api::handle(router, req, client).await?;
                    Ok::<_, std::convert::Infallible>(resp.map(|body| Tracked::new(body, serving)))
                }
            })
        };
        let http = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_HEAD)
            .keep_alive(true)
            .serve_connection(Watched::new(stream, conn.clone()), svc);
        tokio::pin!(http);
        tokio::select! {
            _ = http.as_mut() => return,
            _ = self.shutdown.cancelled() => {}
            _ = conn.closing() => {}
        }
        // Stopping, or closed for room: nothing is lost by closing a connection that serves no
        // request; one that does finishes it first.
        if conn.is_idle() {
            return;
        }
        http.as_mut().graceful_shutdown();
        let _ = http.await;
    }
}

/// A connection slot: a free one, or one made by closing a connection idle between requests
/// (its slot comes free as its task ends); None once the semaphore is closed.
async fn room(permits: &Arc<Semaphore>, registry: &Registry) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = permits.clone().try_acquire_owned() {
        return Some(p);
    }
    registry.evict_idle();
    permits.clone().acquire_owned().await.ok()
}
