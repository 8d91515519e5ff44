//! The core's inbox: what the shell's workers send to the one task that owns the `Node`, and
//! what it publishes back. Workers depend on this module, never on the event loop itself: the
//! socket asks requests (`ShellMsg`), the metrics ask for a snapshot, and the supervisor, the
//! probes and the GPU monitor only send events, through an `EventSink`.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::core::{Event, Peer};
use crate::protocol::{Answer, Request, StatusView, WatchEvent};

/// Capacity of the queue into the core's task: a flood of reports waits here rather than
/// growing memory without bound.
pub const CAPACITY: usize = 8192;

/// Watch events kept for watchers that read slower than the core publishes; one that falls
/// further behind is told to reconnect.
pub const PUBLISHED_CAPACITY: usize = 4096;

/// Messages to the core's task.
pub enum ShellMsg {
    Event(Event),
    /// A control request, answered with the core's answer and the publish sequence number at
    /// that moment (a watch skips the events its snapshot already holds).
    Request {
        peer: Peer,
        request: Request,
        reply: oneshot::Sender<Answered>,
    },
    /// A metrics scrape: the status as the core sees it now.
    Snapshot {
        reply: oneshot::Sender<StatusView>,
    },
}

/// The core's answer to a request, and the last publish sequence number when it was given.
#[derive(Debug)]
pub struct Answered {
    pub answer: Answer,
    pub seq: u64,
}

/// A watch event as broadcast to watchers, numbered so a watch can skip what its snapshot holds.
#[derive(Debug)]
pub struct Published {
    pub seq: u64,
    pub event: WatchEvent,
    /// The event as its watchers get it, serialized once for all of them.
    pub line: String,
}

/// The sending half of the inbox, for the socket and the metrics.
pub type Sender = mpsc::Sender<ShellMsg>;

/// A new inbox: its sender and the core task's receiver.
pub fn channel() -> (Sender, mpsc::Receiver<ShellMsg>) {
    mpsc::channel(CAPACITY)
}

/// Where published watch events go.
pub fn published() -> broadcast::Sender<Arc<Published>> {
    broadcast::channel(PUBLISHED_CAPACITY).0
}

/// What workers that only report happenings hold: process exits, probe and scrape results,
/// prefetch progress, GPU readings. They can send events and nothing else.
#[derive(Clone, Debug)]
pub struct EventSink {
    to_core: Sender,
}

impl EventSink {
    pub fn new(to_core: Sender) -> EventSink {
        EventSink { to_core }
    }

    /// From a task. False once the core's task is gone.
    pub async fn send(&self, ev: Event) -> bool {
        self.to_core.send(ShellMsg::Event(ev)).await.is_ok()
    }

    /// From a thread of its own (never from a runtime worker: it blocks while the inbox is full).
    /// False once the core's task is gone.
    pub fn blocking_send(&self, ev: Event) -> bool {
        self.to_core.blocking_send(ShellMsg::Event(ev)).is_ok()
    }

    /// The core's task is gone.
    pub fn is_closed(&self) -> bool {
        self.to_core.is_closed()
    }
}
