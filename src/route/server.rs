//! The listener: one task per client connection, HTTP/1.1 with keep-alive, a bounded number of
//! connections (silent and idle ones closed to make room: `conns.rs`), bounded request heads,
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
use super::conns::{Registry, Tracked, Watched, MAX_HEAD, SILENT_TIMEOUT};
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
    let registry = Arc::new(Registry::default());
    let mut turn = 0usize;
    loop {
        // A connection slot first: at max_connections, a silent or idle connection is closed
        // to make room; with none, clients wait in the accept backlog.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = room(&permits, &registry) => match p {
                Some(p) => p,
                None => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: an idle connection gives its descriptor back, else
                    // wait a little; don't spin, don't die.
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
        let worker = &workers[turn % workers.len()];
        turn = turn.wrapping_add(1);
        let router = router.clone();
        let shutdown = shutdown.clone();
        let registry = registry.clone();
        tracker.spawn_on(
            async move {
                // The slot and the place in the registry are held as long as this task runs.
                let _permit = permit;
                let Ok(stream) = TcpStream::from_std(stream) else {
                    return;
                };
                let conn = registered.conn.clone();
                let client = Client { ip, trusted };
                let svc = {
                    let conn = conn.clone();
                    service_fn(move |req| {
                        let serving = conn.begin(&registry);
                        let router = router.clone();
                        async move {
                            let resp = api::handle(router, req, client).await?;
                            Ok::<_, std::convert::Infallible>(
                                resp.map(|body| Tracked::new(body, serving)),
                            )
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
                let silent = tokio::time::sleep(SILENT_TIMEOUT);
                tokio::pin!(silent);
                let mut listening_for_silence = !trusted;
                loop {
                    tokio::select! {
                        _ = http.as_mut() => return,
                        _ = &mut silent, if listening_for_silence => {
                            if !conn.heard() {
                                return;
                            }
                            listening_for_silence = false;
                        }
                        _ = shutdown.cancelled() => break,
                        _ = conn.closing() => break,
                    }
                }
                // Stopping, or closed for room: nothing is lost by closing a connection that
                // serves no request; one that does finishes it first.
                if conn.is_idle() {
                    return;
                }
                http.as_mut().graceful_shutdown();
                let _ = http.await;
            },
            worker,
        );
    }
}

/// A connection slot: a free one, or one made by closing a silent or idle connection (its slot
/// comes free as its task ends); None once the semaphore is closed.
async fn room(permits: &Arc<Semaphore>, registry: &Registry) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = permits.clone().try_acquire_owned() {
        return Some(p);
    }
    registry.evict_one();
    permits.clone().acquire_owned().await.ok()
}
