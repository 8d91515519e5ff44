//! Loopback port blocks for daemons (their `ports` range) and single ports (metrics), safe when
//! several test binaries, and several checkouts' suites, run at once on one machine.
//!
//! Ports are handed out in slots of [`SLOT`] consecutive ports between [`LOW`] and the kernel's
//! ephemeral range (so that no outgoing connection can take one). A block holds an exclusive
//! `flock` on one lock file per slot, in a directory every user of the machine shares, for as
//! long as it lives: the kernel drops the locks when the holder exits, however it exits, so a
//! crashed run leaves nothing to clean. Two `open`s of one file conflict even within one
//! process, so the same lock guards parallel tests of one binary. A locked slot is also probed
//! with `bind`, and skipped when something that takes no lock (another program) listens there.

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

/// Ports per slot.
pub const SLOT: u16 = 4;
/// The lowest port handed out.
pub const LOW: u16 = 12_000;
/// The highest port handed out is below this, and below the ephemeral range.
pub const HIGH: u16 = 32_000;

/// Ports `first..=last`, held until dropped.
pub struct PortBlock {
    pub first: u16,
    pub last: u16,
    _locks: Vec<Flock<File>>,
}

impl PortBlock {
    pub fn range(&self) -> (u16, u16) {
        (self.first, self.last)
    }
}

impl std::fmt::Debug for PortBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ports {}-{}", self.first, self.last)
    }
}

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("hearth-testkit-ports");
    if std::fs::create_dir(&dir).is_ok() {
        // Shared by every user's runs, like /tmp itself.
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    }
    dir
}

/// The top of the range: below the kernel's ephemeral ports.
fn high() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .map_or(HIGH, |low| low.min(HIGH))
}

fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// A lock file in the shared directory, made writable by every user's runs.
fn lock_file(path: &std::path::Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o666)
        .open(path)
}

fn lock_slot(dir: &std::path::Path, first_port: u16) -> Option<Flock<File>> {
    let file = lock_file(&dir.join(first_port.to_string())).ok()?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

fn bindable(first: u16, last: u16) -> bool {
    (first..=last).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// `n` consecutive ports (rounded up to whole slots), free now and held by no other test until
/// the block is dropped. Starts the search at a random slot, so that runs rarely contend.
pub fn ports(n: u16) -> PortBlock {
    assert!(n > 0, "a block of no ports");
    let dir = lock_dir();
    let slots = (high().saturating_sub(LOW) / SLOT) as usize;
    let need = n.div_ceil(SLOT) as usize;
    assert!(need <= slots, "{n} ports is more than the range holds");
    let start = random() as usize % slots;
    for i in 0..slots {
        let s = (start + i) % slots;
        if s + need > slots {
            continue;
        }
        let first = LOW + s as u16 * SLOT;
        let last = first + need as u16 * SLOT - 1;
        let Some(locks) = (0..need)
            .map(|k| lock_slot(&dir, first + k as u16 * SLOT))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        if bindable(first, last) {
            return PortBlock {
                first,
                last,
                _locks: locks,
            };
        }
    }
    panic!(
        "no free block of {n} ports in {LOW}-{} (locks in {})",
        high(),
        dir.display()
    );
}

/// Whether another holder would be refused the slot that starts at `first` (it is locked).
pub fn is_held(first: u16) -> bool {
    lock_slot(&lock_dir(), first).is_none()
}

/// An exclusive lock on `name` for the whole machine, waited for, held until dropped: for what
/// only one test may hold at a time whichever process runs it (a test runner that starts a
/// process per test, another checkout's suite). Kept beside the port locks, whose directory and
/// release on exit it shares.
pub fn machine_lock(name: &str) -> Flock<File> {
    let path = lock_dir().join(format!("lock-{name}"));
    let file = lock_file(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    Flock::lock(file, FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock {}: {e}", path.display()))
}
