//! The control and report socket: line-framed JSON, answered in order, one task per connection.
//! Connections only forward requests to the core's task and write its answers back. Pipelined
//! requests already in a connection's buffer go to the core together, and their answers leave in
//! one write.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, oneshot};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder, Framed, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::inbox::{self, Answered, Published, ShellMsg};
use crate::core::Peer;
use crate::protocol::{self, ErrorCode, Failure, Request, Response};

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
    pub to_core: inbox::Sender,
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
    let mut framed = Framed::new(stream, Lines::new());
    let mut answers: Vec<Pending> = Vec::new();
    'conn: loop {
        let mut item = tokio::select! {
            _ = shutdown.cancelled() => break,
            item = framed.next() => item,
        };
        // Take every request already buffered (pipelined), up to BATCH: all of them go to the
        // core before the first answer is awaited, and their answers leave in one write.
        let mut closed = false;
        let mut watch_request = None;
        let mut taken = 0;
        loop {
            // After an over-long line the codec skips to its newline, which yields no item: a
            // newline in the buffer then says nothing about a next request.
            let skipping = matches!(item, Some(Ok(Line::TooLong)));
            match item {
                None | Some(Err(_)) => {
                    closed = true;
                    break;
                }
                Some(Ok(line)) => match classify(line) {
                    Classified::Blank => {}
                    Classified::Refused(f) => answers.push(Pending::Ready(f)),
                    Classified::Watch(request, model) => {
                        watch_request = Some((request, model));
                        break;
                    }
                    Classified::Ask(request) => {
                        let (reply, rx) = oneshot::channel();
                        let msg = ShellMsg::Request {
                            peer: peer.clone(),
                            request,
                            reply,
                        };
                        if control.to_core.send(msg).await.is_err() {
                            closed = true;
                            break;
                        }
                        answers.push(Pending::Core(rx));
                    }
                },
            }
            taken += 1;
            // A complete line in the read buffer is decoded without touching the socket.
            if skipping || taken >= BATCH || !framed.read_buffer().contains(&b'\n') {
                break;
            }
            item = framed.next().await;
        }
        // Answers in request order, written together.
        for a in answers.drain(..) {
            let answer = match a {
                Pending::Ready(f) => Err(f),
                Pending::Core(rx) => match rx.await {
                    Ok(Answered { answer, .. }) => answer,
                    Err(_) => break 'conn,
                },
            };
            if framed.feed(protocol::encode_answer(&answer)).await.is_err() {
                break 'conn;
            }
        }
        if framed.flush().await.is_err() || closed {
            break;
        }
        if let Some((request, model)) = watch_request {
            watch(framed, &control, peer, request, model, shutdown).await;
            return;
        }
    }
}

/// Most pipelined requests taken from one connection before their answers are written.
const BATCH: usize = 64;

/// A request's answer: known at once (a bad line), or coming from the core.
enum Pending {
    Ready(Failure),
    Core(oneshot::Receiver<Answered>),
}

/// What a line asks for.
enum Classified {
    /// An empty line: no answer.
    Blank,
    /// A bad line, answered without the core.
    Refused(Failure),
    Watch(Request, Option<String>),
    Ask(Request),
}

fn classify(line: Line) -> Classified {
    let line = match line {
        Line::Text(line) => line,
        Line::TooLong => {
            return Classified::Refused(Failure::new(
                ErrorCode::TooLarge,
                format!("a line may hold at most {} bytes", protocol::MAX_LINE),
            ))
        }
        Line::NotUtf8 => {
            return Classified::Refused(Failure::new(ErrorCode::BadRequest, "a line must be UTF-8"))
        }
    };
    if line.trim().is_empty() {
        return Classified::Blank;
    }
    match protocol::parse_request(&line) {
        Err(f) => Classified::Refused(f),
        Ok(Request::Watch { model }) => {
            let m = model.clone();
            Classified::Watch(Request::Watch { model }, m)
        }
        Ok(r) => Classified::Ask(r),
    }
}

/// Sends a request to the core's task and waits for its answer (and the publish sequence number
/// at the moment it was answered).
async fn ask(control: &Control, peer: Peer, request: Request) -> Option<Answered> {
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

async fn send(framed: &mut Framed<UnixStream, Lines>, line: &str) -> Result<(), LinesCodecError> {
    framed.send(line.to_string()).await
}

/// One line from a client: its text, or what was wrong with it.
#[derive(Debug, PartialEq)]
enum Line {
    Text(String),
    /// Longer than `MAX_LINE`; the rest of it, up to its newline, is skipped.
    TooLong,
    /// Not UTF-8; the line was consumed.
    NotUtf8,
}

/// `LinesCodec` whose bad lines are items rather than errors. A `Framed` stream ends after its
/// decoder's first error, which would close the connection after answering one bad line and
/// leave the requests pipelined behind it unanswered; `LinesCodec` itself recovers from both
/// (it skips to the next newline, or has already consumed the line).
struct Lines(LinesCodec);

impl Lines {
    fn new() -> Lines {
        Lines(LinesCodec::new_with_max_length(protocol::MAX_LINE))
    }

    fn wrap(r: Result<Option<String>, LinesCodecError>) -> Result<Option<Line>, LinesCodecError> {
        match r {
            Ok(l) => Ok(l.map(Line::Text)),
            Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Line::TooLong)),
            // The only I/O error `LinesCodec::decode` makes itself: invalid UTF-8 (socket
            // errors come from the read, not from here).
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

impl Encoder<String> for Lines {
    type Error = LinesCodecError;

    fn encode(&mut self, line: String, buf: &mut BytesMut) -> Result<(), LinesCodecError> {
        self.0.encode(line, buf)
    }
}

/// A watch: the answer, the routed-set snapshot, then every event for the model until the client
/// leaves. Subscribing before asking means no event can fall between snapshot and stream; events
/// already reflected in the snapshot are skipped by sequence number.
async fn watch(
    mut framed: Framed<UnixStream, Lines>,
    control: &Control,
    peer: Peer,
    request: Request,
    model: Option<String>,
    shutdown: CancellationToken,
) {
    let mut events = control.published.subscribe();
    let Some(Answered { answer, seq: seen }) = ask(control, peer, request).await else {
        return;
    };
    if send(&mut framed, &protocol::encode_answer(&answer))
        .await
        .is_err()
    {
        return;
    }
    let Ok(Response::Watching { snapshot }) = answer else {
        // Refused (an unknown model, a reader that may not watch): the answer said so.
        return;
    };
    for ev in &snapshot {
        let Ok(line) = serde_json::to_string(ev) else {
            continue;
        };
        if send(&mut framed, &line).await.is_err() {
            return;
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
                    if send(&mut framed, &p.line).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let f = Failure::new(ErrorCode::Busy, format!("watch fell {n} events behind; reconnect for a fresh snapshot"));
                    let _ = send(&mut framed, &protocol::encode_answer(&Err(f))).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
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
}
