//! The control and report socket: line-framed JSON, answered in order, one task per connection.
//! Connections only forward requests to the core's task and write its answers back. Pipelined
//! requests already in a connection's buffer go to the core together, and their answers leave in
//! one write. Every line gets exactly one answer (a blank one is a `bad_request`), except on a
//! watching connection, where lines the client sends are refused one by one in the stream.
//!
//! Limits (see conn.rs for the per-connection ones): at most `MAX_CONNECTIONS` at once, the
//! next is answered `busy` and closed; a role is re-read from `[access]` when a reload changed
//! it, also on connections already open.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::conn::{self, Line, Reader, Stop};
use super::inbox::{self, Answered, Published, ShellMsg};
use super::paths;
use crate::core::Peer;
use crate::protocol::{self, ErrorCode, Failure, Request, Response};

/// Most connections open at once. Far above what a host needs (a reporter per replica, a few
/// routers and watchers, operators' one-shot commands), and under the 1024 file descriptors a
/// process gets by default outside systemd; the one after it is told `busy` and closed, so a
/// flood of connections costs bounded memory and file descriptors.
pub const MAX_CONNECTIONS: usize = 512;

/// Binds the socket: checks its directory first (paths.rs), replaces only a stale socket nobody
/// answers on (never a file of another kind), then binds, chmods 0660 and listens, so nobody
/// connects before the permissions hold.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    paths::secure_dir(paths::parent_of(path), 0o755, "socket directory")?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
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
        Ok(meta) => anyhow::bail!(
            "{}: there is a {} there, not a socket; hearth does not delete it: remove it if it \
             is not needed, or set daemon.socket to another path",
            path.display(),
            kind(&meta.file_type())
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("{}: {e}", path.display()),
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

/// What a file type is, in words.
fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_file() {
        "regular file"
    } else if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "file"
    }
}

#[derive(Clone)]
pub struct Control {
    /// The core's inbox, where reports go (with the workers' events).
    pub to_core: inbox::Sender,
    /// Every other request: the operators' lane, which the loop serves in turn with the inbox, so
    /// a `status` does not wait behind thousands of queued reports.
    pub operators: inbox::Sender,
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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let large = Arc::new(Semaphore::new(conn::LARGE_LINES));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let control = control.clone();
                        let shutdown = shutdown.clone();
                        let large = large.clone();
                        tracker.spawn(async move {
                            connection(stream, control, large, shutdown).await;
                            drop(slot);
                        });
                    }
                    Err(_) => refuse_busy(stream),
                },
                Err(e) => {
                    // EMFILE and friends: don't spin, don't die.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// One connection too many: told so in one line (the socket buffer of a new connection takes
/// it without waiting), then closed.
fn refuse_busy(stream: UnixStream) {
    use std::io::Write;
    let f = Failure::new(
        ErrorCode::Busy,
        format!("too many connections ({MAX_CONNECTIONS} open); try again"),
    );
    let mut line = protocol::encode_answer(&Err(f));
    line.push('\n');
    // Written directly (the socket is non-blocking): tokio's own `try_write` would wait for a
    // readiness event a socket this new has not had yet.
    if let Ok(s) = stream.into_std() {
        let _ = (&s).write(line.as_bytes());
    }
}

/// The peer, resolved against the `[access]` in force, and which version of it that was.
struct Who {
    uid: u32,
    gid: u32,
    pid: Option<i32>,
    peer: Peer,
    generation: u64,
}

impl Who {
    /// Resolves (again) against the access lists in force. The user and group databases are
    /// files (or NSS): off the runtime's threads.
    async fn resolve(&mut self, access: &Arc<Access>) -> bool {
        let generation = access.generation();
        let (a, uid, gid, pid) = (access.clone(), self.uid, self.gid, self.pid);
        match tokio::task::spawn_blocking(move || a.peer(uid, gid, pid)).await {
            Ok(p) => {
                self.peer = p;
                self.generation = generation;
                true
            }
            Err(_) => false,
        }
    }

    /// A reload changed `[access]` since the role was read: read it again, so a revoked role
    /// is gone for connections already open too.
    async fn current(&mut self, access: &Arc<Access>) -> bool {
        access.generation() == self.generation || self.resolve(access).await
    }
}

async fn connection(
    stream: UnixStream,
    control: Control,
    large: Arc<Semaphore>,
    shutdown: CancellationToken,
) {
    let mut who = match stream.peer_cred() {
        Ok(c) => Who {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid(),
            peer: Peer {
                uid: c.uid(),
                pid: None,
                pgid: None,
                replica: None,
                role: protocol::Role::None,
            },
            generation: 0,
        },
        Err(e) => {
            tracing::warn!("peer credentials unavailable: {e}");
            return;
        }
    };
    if !who.resolve(&control.access).await {
        return;
    }
    let (read, mut write) = stream.into_split();
    let mut reader = Reader::new(read, large);
    loop {
        let mut item = tokio::select! {
            _ = shutdown.cancelled() => return,
            item = reader.line(true) => item,
        };
        // Take every request already buffered (pipelined), up to BATCH: all of them go to the
        // core before the first answer is awaited, and their answers leave in one write.
        let mut answers: Vec<Pending> = Vec::new();
        let mut stopped = None;
        let mut watching = None;
        let mut lane = None;
        let mut taken = 0;
        loop {
            match item {
                Err(stop) => {
                    stopped = Some(stop);
                    break;
                }
                Ok(line) => match classify(line) {
                    Classified::Refused(f) => answers.push(Pending::Ready(Err(f))),
                    Classified::Watch(request, model) => {
                        watching = Some((request, model));
                        break;
                    }
                    Classified::Ask(request) => {
                        if !who.current(&control.access).await {
                            return;
                        }
                        let to = Lane::of(&request);
                        // One connection's requests take effect in the order it sent them:
                        // before one goes to the other lane, the answers still out on this one
                        // are waited for.
                        if lane.is_some_and(|l| l != to) && !settle(&mut answers).await {
                            return;
                        }
                        lane = Some(to);
                        let (reply, rx) = oneshot::channel();
                        let msg = ShellMsg::Request {
                            peer: who.peer.clone(),
                            request,
                            reply,
                        };
                        if control.sender(to).send(msg).await.is_err() {
                            return;
                        }
                        answers.push(Pending::Core(rx));
                    }
                },
            }
            taken += 1;
            // A complete line in the read buffer is decoded without touching the socket.
            if taken >= BATCH || !reader.has_line() {
                break;
            }
            item = reader.line(true).await;
        }
        // Answers in request order, written together.
        if !settle(&mut answers).await {
            return;
        }
        let mut out = String::new();
        for a in answers.drain(..) {
            if let Pending::Ready(answer) = a {
                out.push_str(&protocol::encode_answer(&answer));
                out.push('\n');
            }
        }
        if let Some(Stop::SlowLine) = stopped {
            let f = Failure::new(
                ErrorCode::BadRequest,
                format!(
                    "a line must be complete within {} s of its first byte; closing",
                    conn::LINE_TIMEOUT.as_secs()
                ),
            );
            out.push_str(&protocol::encode_answer(&Err(f)));
            out.push('\n');
        }
        if !out.is_empty() && !conn::write(&mut write, out.as_bytes()).await {
            return;
        }
        if stopped.is_some() {
            return;
        }
        if let Some((request, model)) = watching {
            if !watch(
                &mut reader,
                &mut write,
                &control,
                &mut who,
                request,
                model,
                &shutdown,
            )
            .await
            {
                return;
            }
        }
    }
}

/// Most pipelined requests taken from one connection before their answers are written.
const BATCH: usize = 64;

/// Which of the core's two queues a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Reports,
    Operators,
}

impl Lane {
    fn of(request: &Request) -> Lane {
        match request {
            Request::Report(_) => Lane::Reports,
            _ => Lane::Operators,
        }
    }
}

impl Control {
    fn sender(&self, lane: Lane) -> &inbox::Sender {
        match lane {
            Lane::Reports => &self.to_core,
            Lane::Operators => &self.operators,
        }
    }
}

/// A request's answer: known, or coming from the core.
enum Pending {
    Ready(protocol::Answer),
    Core(oneshot::Receiver<Answered>),
}

/// Waits for every answer still coming from the core. False: the core's task is gone.
async fn settle(answers: &mut [Pending]) -> bool {
    for a in answers.iter_mut() {
        if let Pending::Core(rx) = a {
            match rx.await {
                Ok(Answered { answer, .. }) => *a = Pending::Ready(answer),
                Err(_) => return false,
            }
        }
    }
    true
}

/// What a line asks for.
enum Classified {
    /// A bad line (a blank one included), answered without the core.
    Refused(Failure),
    Watch(Request, Option<String>),
    Ask(Request),
}

/// A line's failure before it is even a request.
fn unreadable(line: &Line) -> Option<Failure> {
    match line {
        Line::Text(_) => None,
        Line::TooLong => Some(Failure::new(
            ErrorCode::TooLarge,
            format!("a line may hold at most {} bytes", protocol::MAX_LINE),
        )),
        Line::NotUtf8 => Some(Failure::new(ErrorCode::BadRequest, "a line must be UTF-8")),
    }
}

fn classify(line: Line) -> Classified {
    if let Some(f) = unreadable(&line) {
        return Classified::Refused(f);
    }
    let Line::Text(line) = line else {
        return Classified::Refused(Failure::new(ErrorCode::BadRequest, "unreadable"));
    };
    match protocol::parse_request(&line) {
        Err(f) => Classified::Refused(f),
        Ok(Request::Watch { model }) => {
            let m = model.clone();
            Classified::Watch(Request::Watch { model }, m)
        }
        Ok(r) => Classified::Ask(r),
    }
}

/// A watch: the answer, the routed-set snapshot, then every event for the model until the client
/// leaves. Subscribing before asking means no event can fall between snapshot and stream; events
/// already reflected in the snapshot are skipped by sequence number. A refused watch (an unknown
/// model, a peer without the role) is answered and the connection goes on (true); an accepted
/// one streams until the end of the connection (false). Lines the client sends while watching
/// are each refused in the stream, never dropped unanswered.
async fn watch(
    reader: &mut Reader,
    write: &mut OwnedWriteHalf,
    control: &Control,
    who: &mut Who,
    request: Request,
    model: Option<String>,
    shutdown: &CancellationToken,
) -> bool {
    let mut events = control.published.subscribe();
    if !who.current(&control.access).await {
        return false;
    }
    let (reply, rx) = oneshot::channel();
    let msg = ShellMsg::Request {
        peer: who.peer.clone(),
        request,
        reply,
    };
    if control.operators.send(msg).await.is_err() {
        return false;
    }
    let Ok(Answered { answer, seq: seen }) = rx.await else {
        return false;
    };
    let mut out = protocol::encode_answer(&answer);
    out.push('\n');
    let Ok(Response::Watching { snapshot }) = answer else {
        // Refused: the answer says why, and the connection takes requests as before.
        return conn::write(write, out.as_bytes()).await;
    };
    for ev in &snapshot {
        if let Ok(line) = serde_json::to_string(ev) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if !conn::write(write, out.as_bytes()).await {
        return false;
    }
    let watched = model
        .as_deref()
        .map_or("every model".to_string(), protocol::quote);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            incoming = reader.line(false) => {
                let Ok(line) = incoming else { return false };
                let f = unreadable(&line).unwrap_or_else(|| Failure::new(
                    ErrorCode::BadRequest,
                    format!("this connection is watching {watched}: it takes no more requests; send them on another connection"),
                ));
                let mut line = protocol::encode_answer(&Err(f));
                line.push('\n');
                if !conn::write(write, line.as_bytes()).await {
                    return false;
                }
            }
            ev = events.recv() => match ev {
                Ok(p) => {
                    if p.seq <= seen || p.event.model().is_some_and(|m| model.as_deref().is_some_and(|w| w != m)) {
                        continue;
                    }
                    let mut line = String::with_capacity(p.line.len() + 1);
                    line.push_str(&p.line);
                    line.push('\n');
                    if !conn::write(write, line.as_bytes()).await {
                        return false;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let f = Failure::new(ErrorCode::Busy, format!("watch fell {n} events behind; reconnect for a fresh snapshot"));
                    let mut line = protocol::encode_answer(&Err(f));
                    line.push('\n');
                    let _ = conn::write(write, line.as_bytes()).await;
                    return false;
                }
                Err(broadcast::error::RecvError::Closed) => return false,
            }
        }
    }
}
