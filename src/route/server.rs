//! The listener: one task per client connection, HTTP/1.1 with keep-alive, a bounded number of
//! connections, bounded request heads, and a deadline for each request head (which also closes
//! idle keep-alive connections). Takes its listener and its shutdown signal as arguments.
//!
//! Connections are dealt in turn to the router's threads, each a single-threaded runtime: a
//! connection, the requests on it and their replica connections then stay on one thread, with
//! no work stealing or wake-ups across threads on the way (a fifth less CPU per request than
//! tokio's multi-threaded scheduler, measured with scripts/route-bench.sh).

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::api;
use super::router::Router;

/// Longest request head (request line and headers). At most 100 headers, hyper's own bound:
/// setting another puts the parser's header tables on the heap, two allocations per request.
const MAX_HEAD: usize = 64 * 1024;
/// A request head must arrive within this, and an idle keep-alive connection closes after it.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts until `shutdown`; connections then finish the request they are serving and close.
pub async fn serve(
    listener: TcpListener,
    router: Arc<Router>,
    workers: Vec<Handle>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(router.settings.max_connections));
    let mut turn = 0usize;
    loop {
        // A connection slot first: beyond max_connections, clients wait in the accept backlog.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: don't spin, don't die.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
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
        let worker = &workers[turn % workers.len()];
        turn = turn.wrapping_add(1);
        let router = router.clone();
        let shutdown = shutdown.clone();
        tracker.spawn_on(
            async move {
                let _permit = permit;
                let Ok(stream) = TcpStream::from_std(stream) else {
                    return;
                };
                let svc = service_fn(move |req| api::handle(router.clone(), req));
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .max_buf_size(MAX_HEAD)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            },
            worker,
        );
    }
}
