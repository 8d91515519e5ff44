//! The control and report socket: line-framed JSON, answered in order, one task per connection.
//! Connections only forward requests to the core's task and write its answers back.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::codec::{Framed, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::daemon::{Published, ShellMsg};
use crate::core::Peer;
use crate::protocol::{self, ErrorCode, Failure, Request};

/// Binds the socket: probe a stale one before replacing it; bind, chmod 0660, then listen, so
/// nobody connects before the permissions hold.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => anyhow::bail!("{}: another daemon is listening there", path.display()),
            Err(_) => {
                // Nobody answers: a socket left by a daemon that died. Safe to replace.
                std::fs::remove_file(path).map_err(|e| {
                    anyhow::anyhow!("removing stale socket {}: {e}", path.display())
                })?;
            }
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let fd: OwnedFd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &UnixAddr::new(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
    )
    .map_err(|e| anyhow::anyhow!("binding {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    listen(&fd, Backlog::new(1024)?)?;
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    Ok(UnixListener::from_std(std_listener)?)
}

#[derive(Clone)]
pub struct Control {
    pub to_core: mpsc::Sender<ShellMsg>,
    pub published: broadcast::Sender<Arc<Published>>,
    pub access: Arc<Access>,
}

/// Accepts connections until `shutdown`; the tracker lets the daemon wait for them.
pub async fn serve(
    listener: UnixListener,
    control: Control,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let control = control.clone();
                    let shutdown = shutdown.clone();
                    tracker.spawn(async move { connection(stream, control, shutdown).await });
                }
                Err(e) => {
                    // EMFILE and friends: don't spin, don't die.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

async fn connection(stream: UnixStream, control: Control, shutdown: CancellationToken) {
    let peer = match stream.peer_cred() {
        Ok(c) => {
            let access = control.access.clone();
            let (uid, gid, pid) = (c.uid(), c.gid(), c.pid());
            // The user and group databases are files (or NSS): off the runtime's threads.
            match tokio::task::spawn_blocking(move || access.peer(uid, gid, pid)).await {
                Ok(p) => p,
                Err(_) => return,
            }
        }
        Err(e) => {
            tracing::warn!("peer credentials unavailable: {e}");
            return;
        }
    };
    let mut framed = Framed::new(stream, LinesCodec::new_with_max_length(protocol::MAX_LINE));
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => break,
            item = framed.next() => item,
        };
        let line = match item {
            None => break,
            Some(Ok(line)) => line,
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                let f = Failure::new(
                    ErrorCode::TooLarge,
                    format!("a line may hold at most {} bytes", protocol::MAX_LINE),
                );
                if send(&mut framed, &f.to_value()).await.is_err() {
                    break;
                }
                continue;
            }
            Some(Err(LinesCodecError::Io(_))) => break,
        };
        if line.trim().is_empty() {
            continue;
        }
        let request = match protocol::parse_request(&line) {
            Ok(r) => r,
            Err(f) => {
                if send(&mut framed, &f.to_value()).await.is_err() {
                    break;
                }
                continue;
            }
        };
        if let Request::Watch { model } = &request {
            let model = model.clone();
            watch(framed, &control, peer, request, model, shutdown).await;
            return;
        }
        let Some((answer, _)) = ask(&control, peer.clone(), request).await else {
            break;
        };
        if send(&mut framed, &answer).await.is_err() {
            break;
        }
    }
}

/// Sends a request to the core's task and waits for its answer (and the publish sequence number
/// at the moment it was answered).
async fn ask(control: &Control, peer: Peer, request: Request) -> Option<(Value, u64)> {
    let (tx, rx) = oneshot::channel();
    control
        .to_core
        .send(ShellMsg::Request {
            peer,
            request,
            reply: tx,
        })
        .await
        .ok()?;
    rx.await.ok()
}

async fn send(
    framed: &mut Framed<UnixStream, LinesCodec>,
    v: &Value,
) -> Result<(), LinesCodecError> {
    framed.send(v.to_string()).await
}

/// A watch: the answer, the routed-set snapshot, then every event for the model until the client
/// leaves. Subscribing before asking means no event can fall between snapshot and stream; events
/// already reflected in the snapshot are skipped by sequence number.
async fn watch(
    mut framed: Framed<UnixStream, LinesCodec>,
    control: &Control,
    peer: Peer,
    request: Request,
    model: Option<String>,
    shutdown: CancellationToken,
) {
    let mut events = control.published.subscribe();
    let Some((mut answer, seen)) = ask(control, peer, request).await else {
        return;
    };
    let snapshot = answer.as_object_mut().and_then(|o| o.remove("snapshot"));
    if send(&mut framed, &answer).await.is_err() || answer["ok"] != Value::Bool(true) {
        return;
    }
    if let Some(Value::Array(items)) = snapshot {
        for ev in items {
            if send(&mut framed, &ev).await.is_err() {
                return;
            }
        }
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // The client may only read; a closed socket ends the watch.
            incoming = framed.next() => {
                if !matches!(incoming, Some(Ok(_))) {
                    return;
                }
            }
            ev = events.recv() => match ev {
                Ok(p) => {
                    if p.seq <= seen || p.event.model().is_some_and(|m| model.as_deref().is_some_and(|w| w != m)) {
                        continue;
                    }
                    if send(&mut framed, &p.json).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let f = Failure::new(ErrorCode::Busy, format!("watch fell {n} events behind; reconnect for a fresh snapshot"));
                    let _ = send(&mut framed, &f.to_value()).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
