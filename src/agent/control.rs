//! The control and report socket: line-framed JSON, answered in order, one task per connection.
//! Connections only forward requests to the core's task and write its answers back. Pipelined
//! requests already in a connection's buffer go to the core together, and their answers leave in
//! one write. Every line gets exactly one answer (a blank one is a `bad_request`), except on a
//! watching connection, where lines the client sends are refused one by one in the stream.
//!
//! Limits (see conn.rs for the per-connection ones, admission.rs for who gets a connection
//! slot and how a refusal is told); a role is re-read from `[access]` when a reload changed it,
//! also on connections already open.
//!
//! Where connections run: the accept loop and every new connection run beside the core's loop,
//! on its thread (daemon.rs), so an operator's `status` is accepted, read, answered and written
//! without waiting behind the tasks of hundreds of reporters. A connection moves to the
//! runtime's workers (`Control::reporters`) as soon as the first request of a batch is not an
//! operator's request: a report, a watch, or a bad line. Reporters and watchers, the bulk of
//! the socket's traffic, so never run on the core's thread.

use std::sync::Arc;

use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::Access;
use super::admission::{self, Admission, Slot, Slots};
use super::conn::{self, Line, Reader, Stop};
use super::inbox::{self, Answered, Published, ShellMsg};
use crate::core::Peer;
use crate::protocol::{self, ErrorCode, Failure, Request, Response};

pub use super::admission::MAX_CONNECTIONS;
pub use super::listen::bind;

#[derive(Clone)]
pub struct Control {
    /// The core's inbox, where reports go (with the workers' events).
    pub to_core: inbox::Sender,
    /// Every other request: the operators' lane, which the loop serves in turn with the inbox, so
    /// a `status` does not wait behind thousands of queued reports.
    pub operators: inbox::Sender,
    pub published: broadcast::Sender<Arc<Published>>,
    pub access: Arc<Access>,
    /// Where a connection moves once it turns out to report, watch or send bad lines (the
    /// runtime's workers); `None` where it already runs there.
    pub reporters: Option<tokio::runtime::Handle>,
}

/// Accepts connections until `shutdown`; the tracker lets the daemon wait for them.
pub async fn serve(
    listener: UnixListener,
    control: Control,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Slots::new();
    let drains = Arc::new(Semaphore::new(admission::DRAINS));
    let large = Arc::new(Semaphore::new(conn::LARGE_LINES));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let cred = match stream.peer_cred() {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!("peer credentials unavailable: {e}");
                            continue;
                        }
                    };
                    match slots.admit(cred.uid(), control.access.privileged(cred.uid())) {
                        Admission::Admitted { slot, must_be_admin } => {
                            let c = Connection {
                                control: control.clone(),
                                large: large.clone(),
                                drains: drains.clone(),
                                shutdown: shutdown.clone(),
                                tracker: tracker.clone(),
                                _slot: slot,
                            };
                            tracker.spawn(c.start(stream, cred, must_be_admin));
                        }
                        Admission::Busy(why) => admission::refuse(stream, why, &drains, &tracker),
                    }
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
        if access.privileged(uid) {
            // Admin without the user database: what is left to read is the peer's process
            // group and cgroup, from the kernel.
            self.peer = a.peer(uid, gid, pid);
            self.generation = generation;
            return true;
        }
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

/// One admitted connection: what it needs wherever it runs, and the slot it holds until it ends.
struct Connection {
    control: Control,
    large: Arc<Semaphore>,
    drains: Arc<Semaphore>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    _slot: Slot,
}

impl Connection {
    async fn start(self, stream: UnixStream, cred: tokio::net::unix::UCred, must_be_admin: bool) {
        let mut who = Who {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
            peer: Peer {
                uid: cred.uid(),
                pid: None,
                pgid: None,
                replica: None,
                role: protocol::Role::None,
            },
            generation: 0,
        };
        if !who.resolve(&self.control.access).await {
            return;
        }
        if must_be_admin && who.peer.role != protocol::Role::Admin {
            let why = format!(
                "too many connections ({} open; the last {} are kept for admins); try again",
                MAX_CONNECTIONS,
                admission::RESERVED_FOR_ADMINS
            );
            admission::refuse(stream, why, &self.drains, &self.tracker);
            return;
        }
        let (read, write) = stream.into_split();
        let reader = Reader::new(read, self.large.clone());
        self.serve(reader, write, who, None).await;
    }

    /// Moves the connection to `to` (see the module's comment), where it goes on with `first`,
    /// the line it just read.
    fn move_to(
        mut self,
        to: tokio::runtime::Handle,
        reader: Reader,
        write: OwnedWriteHalf,
        who: Who,
        first: Result<Line, Stop>,
    ) {
        let (read, parked) = reader.park();
        let Ok(stream) = read.reunite(write) else {
            return;
        };
        let Ok(stream) = stream.into_std() else {
            return;
        };
        self.control.reporters = None;
        let tracker = self.tracker.clone();
        tracker.spawn_on(
            async move {
                let Ok(stream) = UnixStream::from_std(stream) else {
                    return;
                };
                let (read, write) = stream.into_split();
                self.serve(Reader::unpark(read, parked), write, who, Some(first))
                    .await;
            },
            &to,
        );
    }

    /// Requests and their answers until the connection ends (or moves).
    async fn serve(
        self,
        mut reader: Reader,
        mut write: OwnedWriteHalf,
        mut who: Who,
        mut first: Option<Result<Line, Stop>>,
    ) {
        let control = &self.control;
        let shutdown = &self.shutdown;
        loop {
            let mut item = match first.take() {
                Some(item) => item,
                None => tokio::select! {
                    _ = shutdown.cancelled() => return,
                    item = reader.line(true) => item,
                },
            };
            if let Some(to) = &control.reporters {
                if moves(&item) {
                    let to = to.clone();
                    self.move_to(to, reader, write, who, item);
                    return;
                }
            }
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
            let ready: Vec<protocol::Answer> = answers
                .drain(..)
                .filter_map(|a| match a {
                    Pending::Ready(answer) => Some(answer),
                    Pending::Core(_) => None,
                })
                .collect();
            // A status lists every replica: on the core's thread, it is written out on a
            // thread of the blocking pool rather than between two turns of the loop.
            let big = ready
                .iter()
                .any(|a| matches!(a, Ok(Response::Status { .. })));
            let mut out = if big && control.reporters.is_some() {
                match tokio::task::spawn_blocking(move || encode_all(&ready)).await {
                    Ok(out) => out,
                    Err(_) => return,
                }
            } else {
                encode_all(&ready)
            };
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
                    control,
                    &mut who,
                    request,
                    model,
                    shutdown,
                )
                .await
                {
                    return;
                }
            }
        }
    }
}

/// Answers as lines, in order.
fn encode_all(answers: &[protocol::Answer]) -> String {
    let mut out = String::new();
    for answer in answers {
        out.push_str(&protocol::encode_answer(answer));
        out.push('\n');
    }
    out
}

/// A line that is not an operator's request: the connection leaves the core's thread.
fn moves(item: &Result<Line, Stop>) -> bool {
    match item {
        Err(_) => false,
        Ok(Line::Text(t)) => !matches!(
            protocol::parse_request(t),
            Ok(r) if !matches!(r, Request::Report(_) | Request::Watch { .. })
        ),
        Ok(_) => true,
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
