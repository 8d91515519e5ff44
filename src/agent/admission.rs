//! Who gets one of the socket's connection slots, and how the others are told no.
//!
//! - At most `MAX_CONNECTIONS` connections at once: a flood of connections costs bounded memory
//!   and file descriptors.
//! - One unprivileged user holds at most `PER_USER` of them (by SO_PEERCRED uid), so one local
//!   account (a hostile neighbour, or every replica's reporter running as the `hearth` account)
//!   cannot take every slot.
//! - The last `RESERVED_FOR_ADMINS` slots are kept for admins: root and the daemon's own user
//!   take them at once; anyone else only once their role resolves to admin (`[access] admins`),
//!   else they are told busy. However many users flood the socket, `hearth status` from an admin
//!   is answered.
//! - A refusal is one `busy` line. The socket is then shut for writing and what the client had
//!   already sent is read and thrown away (up to `DRAIN_BYTES`, for `DRAIN_TIME`) before it is
//!   closed: closing with its request unread would reset the connection, and the client would
//!   see a reset (or a broken pipe on its write) instead of the reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::protocol::{self, ErrorCode, Failure};

/// Most connections open at once. Far above what a host needs (a reporter per replica, a few
/// routers and watchers, operators' one-shot commands), and under the 1024 file descriptors a
/// process gets by default outside systemd (with `DRAINS` refusals being drained on top).
pub const MAX_CONNECTIONS: usize = 512;
/// Of which this many are kept for admins.
pub const RESERVED_FOR_ADMINS: usize = 16;
/// Most connections one unprivileged user holds at once.
pub const PER_USER: usize = 256;
/// Refusals drained at once; beyond that a refused connection is closed at once (the busy line
/// is still written first).
pub const DRAINS: usize = 64;
/// What a refused client may still send before its connection is closed…
pub const DRAIN_BYTES: usize = 2 * protocol::MAX_LINE;
/// …and for how long.
pub const DRAIN_TIME: Duration = Duration::from_secs(2);

/// The connection slots, shared by the accept loop and the connections it admitted.
#[derive(Debug)]
pub struct Slots {
    general: usize,
    reserved: usize,
    per_user: usize,
    state: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    general: usize,
    reserved: usize,
    by_uid: HashMap<u32, usize>,
}

/// What the accept loop does with a new connection.
#[derive(Debug)]
pub enum Admission {
    /// Served. `must_be_admin`: it holds one of the admins' reserved slots without being root
    /// or the daemon's own user, and is refused busy unless its role resolves to admin.
    Admitted { slot: Slot, must_be_admin: bool },
    /// Told busy, and why.
    Busy(String),
}

/// One connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    uid: u32,
    reserved: bool,
}

impl Slots {
    pub fn new() -> Arc<Slots> {
        Slots::with_limits(MAX_CONNECTIONS, RESERVED_FOR_ADMINS, PER_USER)
    }

    pub fn with_limits(total: usize, reserved: usize, per_user: usize) -> Arc<Slots> {
        let reserved = reserved.min(total);
        Arc::new(Slots {
            general: total - reserved,
            reserved,
            per_user,
            state: Mutex::new(Held::default()),
        })
    }

    /// A slot for a connection from `uid`; `privileged`: root or the daemon's own user (admins
    /// whatever `[access]` says, known without reading the user database).
    pub fn admit(self: &Arc<Slots>, uid: u32, privileged: bool) -> Admission {
        let mut held = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mine = held.by_uid.get(&uid).copied().unwrap_or(0);
        if !privileged && mine >= self.per_user {
            return Admission::Busy(format!(
                "too many connections from uid {uid} ({} open, the most one user may hold); \
                 try again",
                self.per_user
            ));
        }
        let reserved = if held.general < self.general {
            held.general += 1;
            false
        } else if held.reserved < self.reserved {
            held.reserved += 1;
            true
        } else {
            return Admission::Busy(format!(
                "too many connections ({} open; the last {} are kept for admins); try again",
                self.general + self.reserved,
                self.reserved
            ));
        };
        *held.by_uid.entry(uid).or_insert(0) += 1;
        Admission::Admitted {
            slot: Slot {
                slots: self.clone(),
                uid,
                reserved,
            },
            must_be_admin: reserved && !privileged,
        }
    }

    /// Connections open now: (in the general slots, in the admins' reserve).
    pub fn open(&self) -> (usize, usize) {
        let held = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (held.general, held.reserved)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.reserved {
            held.reserved = held.reserved.saturating_sub(1);
        } else {
            held.general = held.general.saturating_sub(1);
        }
        if let Some(n) = held.by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_uid.remove(&self.uid);
            }
        }
    }
}

/// The busy line for `why`.
fn busy_line(why: String) -> Vec<u8> {
    let mut line = protocol::encode_answer(&Err(Failure::new(ErrorCode::Busy, why)));
    line.push('\n');
    line.into_bytes()
}

/// Refuses a connection: the busy line, then, if one of `drains` is free, the drain (in a task
/// of its own); else the socket is closed after the line.
pub fn refuse(
    stream: UnixStream,
    why: String,
    drains: &Arc<Semaphore>,
    tracker: &tokio_util::task::TaskTracker,
) {
    let line = busy_line(why);
    match drains.clone().try_acquire_owned() {
        Ok(permit) => {
            tracker.spawn(refuse_and_drain(stream, line, permit));
        }
        Err(_) => {
            use std::io::Write;
            // Written directly (the socket is non-blocking): tokio's own `try_write` would wait
            // for a readiness event a socket this new has not had yet. A new socket's buffer
            // takes one line.
            if let Ok(s) = stream.into_std() {
                let _ = (&s).write(&line);
            }
        }
    }
}

/// The busy line, shut for writing (the client reads the line, then end of file), and what
/// the client sends meanwhile read and dropped, within bounds.
pub async fn refuse_and_drain(mut stream: UnixStream, line: Vec<u8>, permit: OwnedSemaphorePermit) {
    let _permit = permit;
    let drained = async {
        if stream.write_all(&line).await.is_err() {
            return;
        }
        let _ = stream.shutdown().await;
        let mut buf = [0u8; 4096];
        let mut left = DRAIN_BYTES;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drained).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(a: Admission) -> (Slot, bool) {
        match a {
            Admission::Admitted {
                slot,
                must_be_admin,
            } => (slot, must_be_admin),
            Admission::Busy(why) => panic!("refused: {why}"),
        }
    }

    fn busy(a: Admission) -> String {
        match a {
            Admission::Busy(why) => why,
            Admission::Admitted { .. } => panic!("admitted"),
        }
    }

    #[test]
    fn one_user_cannot_take_every_slot() {
        let slots = Slots::with_limits(10, 2, 4);
        let mine: Vec<_> = (0..4).map(|_| admitted(slots.admit(1000, false))).collect();
        assert!(busy(slots.admit(1000, false)).contains("from uid 1000"));
        // Another user still gets in, and so does root.
        let _other = admitted(slots.admit(1001, false));
        let _root = admitted(slots.admit(0, true));
        drop(mine);
        assert_eq!(slots.open(), (2, 0));
        let _again = admitted(slots.admit(1000, false));
    }

    #[test]
    fn the_last_slots_are_for_admins_only() {
        let slots = Slots::with_limits(10, 2, 100);
        // Unprivileged users fill the general slots.
        let flood: Vec<_> = (0..8)
            .map(|i| {
                let (s, must) = admitted(slots.admit(1000 + i, false));
                assert!(!must);
                s
            })
            .collect();
        // The next unprivileged one only gets in to prove it is an admin.
        let (reserved, must) = admitted(slots.admit(2000, false));
        assert!(must, "must prove the admin role");
        // Root takes the last one without proving anything.
        let (root, must) = admitted(slots.admit(0, true));
        assert!(!must);
        assert_eq!(slots.open(), (8, 2));
        // Then nobody, root included.
        assert!(busy(slots.admit(0, true)).contains("too many connections (10 open;"));
        assert!(busy(slots.admit(3000, false)).contains("too many connections"));
        drop(reserved);
        let (_, must) = admitted(slots.admit(0, true));
        assert!(!must);
        drop((flood, root));
    }

    #[test]
    fn privileged_users_have_no_per_user_cap_but_the_total_holds() {
        let slots = Slots::with_limits(6, 1, 2);
        let held: Vec<_> = (0..6).map(|_| admitted(slots.admit(0, true))).collect();
        assert!(busy(slots.admit(0, true)).contains("too many connections"));
        drop(held);
        assert_eq!(slots.open(), (0, 0));
    }

    #[tokio::test]
    async fn a_refused_client_that_already_wrote_reads_the_busy_line() {
        use std::io::{Read, Write};
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let ours = UnixStream::from_std(ours).unwrap();
        let mut theirs = theirs;
        theirs.write_all(b"{\"op\":\"status\"}\n").unwrap();
        let drains = Arc::new(Semaphore::new(1));
        let tracker = tokio_util::task::TaskTracker::new();
        refuse(ours, "full".into(), &drains, &tracker);
        let reading = tokio::task::spawn_blocking(move || {
            // Written after the refusal: still taken (drained), not a broken pipe.
            std::thread::sleep(Duration::from_millis(100));
            theirs.write_all(b"{\"op\":\"version\"}\n")?;
            let mut s = String::new();
            theirs.read_to_string(&mut s).map(|_| s)
        });
        let got = reading.await.unwrap().unwrap();
        assert!(got.contains("\"busy\"") && got.contains("full"), "{got}");
        tracker.close();
        tracker.wait().await;
        assert_eq!(drains.available_permits(), 1);
    }
}
