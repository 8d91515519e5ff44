//! The gate between fork and exec: the child stops before it runs a single instruction of the
//! server, until the daemon has put it in its cgroup or scope. So nothing the server forks can
//! start outside (a fork before placement would leave its child behind in the daemon's cgroup).
//!
//! Why not clone3(CLONE_INTO_CGROUP), which creates the child in its cgroup directly: std's
//! `Command` (and tokio's, which wraps it and reaps the child) cannot be asked for it, and
//! calling clone3 ourselves means re-implementing what `Command` does in the child (file
//! descriptors, environment, exec errors reported to the parent) outside the tested library.
//! It would also not serve systemd, which moves a process into a scope only once it exists.
//! The gate gives the same guarantee with std: placement happens while the child waits in
//! `pre_exec`, which is after std has set up its process group and before exec.
//!
//! How: two close-on-exec pipes. In `pre_exec` the child writes its pid to one and reads one
//! byte from the other (async-signal-safe calls only: getpid, write, read). `Command::spawn`
//! blocks until the child execs, so the daemon's side runs on a helper thread: it reads the
//! pid, places it, and answers 1 (go on) or 0 (give up: the child's `pre_exec` fails and
//! `spawn` returns the error). If the daemon dies meanwhile (a `kill -9` in the middle of a
//! spawn), the child sees EOF and exits: it never runs unplaced, and never waits for ever. For
//! that EOF the child first closes its own copies of the daemon's ends: fork copies every
//! descriptor, and close-on-exec closes them only at the exec the child is waiting to reach, so
//! a child that kept the write end of its own `go` pipe would wait on itself (an orphan outside
//! any replica's cgroup, found after a restart by the chaos test).

// The crate denies unsafe code; this file needs it for what the child does between fork and exec: each block says why it is sound.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Longest the daemon waits for a child to reach the gate (its `pre_exec` runs only
/// async-signal-safe calls: anything this slow is a machine in trouble).
const REACH: Duration = Duration::from_secs(30);

pub struct Gate {
    pid_read: OwnedFd,
    pid_write: OwnedFd,
    go_read: OwnedFd,
    go_write: OwnedFd,
}

/// What the child keeps: descriptor numbers, no allocation. Its own two ends, and the
/// daemon's two, which it closes.
#[derive(Clone, Copy)]
pub struct ChildSide {
    pid_write: RawFd,
    go_read: RawFd,
    pid_read: RawFd,
    go_write: RawFd,
}

impl Gate {
    pub fn new() -> io::Result<Gate> {
        let (pid_read, pid_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (go_read, go_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        Ok(Gate {
            pid_read,
            pid_write,
            go_read,
            go_write,
        })
    }

    pub fn child_side(&self) -> ChildSide {
        ChildSide {
            pid_write: self.pid_write.as_raw_fd(),
            go_read: self.go_read.as_raw_fd(),
            pid_read: self.pid_read.as_raw_fd(),
            go_write: self.go_write.as_raw_fd(),
        }
    }

    /// The daemon's side, on a thread beside the one blocked in `spawn`: waits for the child's
    /// pid (or for `spawn` to have returned without one: `spawned` set), runs `place`, and
    /// opens the gate if it succeeded. The placement's result; None if no child came.
    pub fn open_with(
        &self,
        spawned: &AtomicBool,
        place: impl FnOnce(u32) -> Result<(), super::ContainmentError>,
    ) -> Option<Result<u32, super::ContainmentError>> {
        let deadline = Instant::now() + REACH;
        let pid = loop {
            if spawned.load(Ordering::Acquire) || Instant::now() > deadline {
                return None;
            }
            let mut fds = [PollFd::new(
                std::os::fd::AsFd::as_fd(&self.pid_read),
                PollFlags::POLLIN,
            )];
            match poll(&mut fds, PollTimeout::from(50u16)) {
                Ok(n) if n > 0 => {
                    let mut buf = [0u8; 4];
                    match nix::unistd::read(&self.pid_read, &mut buf) {
                        Ok(4) => break u32::from_ne_bytes(buf),
                        Ok(_) => return None,
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => return None,
                    }
                }
                _ => continue,
            }
        };
        let result = place(pid);
        let byte = [u8::from(result.is_ok())];
        // A child that died meanwhile has its read end closed with ours still open: no EPIPE.
        let _ = nix::unistd::write(&self.go_write, &byte);
        Some(result.map(|()| pid))
    }
}

impl ChildSide {
    /// In the child, between fork and exec: async-signal-safe calls only, no allocation.
    pub fn wait(self) -> io::Result<()> {
        // SAFETY: close, getpid, write and read are async-signal-safe; the buffers live on
        // this stack; the descriptors closed are this process's copies of the daemon's ends,
        // which nothing in the child uses.
        unsafe {
            // The daemon's ends: only the daemon may hold them, or a dead daemon's EOF never
            // comes (see the module's comment).
            libc::close(self.go_write);
            libc::close(self.pid_read);
            let pid = libc::getpid() as u32;
            let bytes = pid.to_ne_bytes();
            loop {
                let n = libc::write(self.pid_write, bytes.as_ptr().cast(), bytes.len());
                if n == bytes.len() as isize {
                    break;
                }
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                return Err(io::Error::last_os_error());
            }
            let mut go = [0u8; 1];
            loop {
                let n = libc::read(self.go_read, go.as_mut_ptr().cast(), 1);
                if n == 1 {
                    break;
                }
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                // EOF: the daemon is gone. Either way this child must not run.
                return Err(io::Error::from_raw_os_error(libc::ECANCELED));
            }
            if go[0] == 1 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(libc::ECANCELED))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;

    /// The daemon dies while its child waits at the gate (here: it reads the pid, then its ends
    /// go, as at a `kill -9`): the child sees EOF and its spawn fails, and it never execs.
    #[test]
    fn a_child_at_the_gate_exits_when_the_daemon_side_is_gone() {
        let gate = Gate::new().unwrap();
        let child_side = gate.child_side();
        let mut cmd = std::process::Command::new("true");
        // SAFETY: `wait` makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || child_side.wait());
        }
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(cmd.spawn().map(|mut c| c.wait()));
        });
        let mut buf = [0u8; 4];
        let n = nix::unistd::read(&gate.pid_read, &mut buf).unwrap();
        assert_eq!(n, 4, "the child sends its pid");
        let pid = u32::from_ne_bytes(buf);
        drop(gate);
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(result) => assert!(result.is_err(), "the child ran past the gate: {result:?}"),
            Err(_) => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                panic!("the child still waits at the gate 20 s after the daemon's ends closed");
            }
        }
    }
}
