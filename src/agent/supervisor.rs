//! Spawns replica processes and watches them: each in its own process group and its cgroup or
//! scope (placed before exec: containment/), as its model's account, with the placeholders'
//! environment, output straight to journald or a log file of its own (replica_log.rs), exits
//! seen at once. Where a cgroup or scope holds the replica it outlives the daemon (issue 14:
//! the next run adopts it); where none does, PR_SET_PDEATHSIG ties it to the daemon, since
//! nothing could find it again.

// The crate denies unsafe code; this file needs it for the spawn: what runs between fork and exec (pre_exec): each block says why it is sound.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::signal::Signal;
use tokio::process::Command;

use super::account::{Accounts, Credentials};
use super::containment::{listeners, ChildSide, Containment, Gate};
use super::inbox::EventSink;
use super::prefetch;
use super::replica_log::ReplicaLogs;
use crate::core::{Event, ExitStatus, ReplicaId, SpawnError, SpawnSpec, StopSignal};

/// Variables of the daemon's own that must never reach a child: they describe the daemon's
/// relationship with systemd (notify socket, watchdog, passed sockets, journal stream), and a
/// child that used them would speak for the daemon.
fn inherited_but_private(name: &str) -> bool {
    name == "NOTIFY_SOCKET"
        || name == "JOURNAL_STREAM"
        || name.starts_with("WATCHDOG_")
        || name.starts_with("LISTEN_")
        || name == super::upgrade::HANDOVER_ENV
        || name == super::upgrade::LISTEN_FD_ENV
        || name == super::upgrade::PANIC_REEXECS_ENV
        || name == super::handover::PREVIOUS_EXE_FD_ENV
        || name == super::handover::ATTEMPT_ENV
        || name == super::handover::FELL_BACK_ENV
}

struct Job {
    spec: SpawnSpec,
}

/// What the spawner thread works with.
struct Spawner {
    handle: tokio::runtime::Handle,
    events: EventSink,
    containment: Arc<Containment>,
    accounts: Accounts,
    logs: ReplicaLogs,
}

/// Hands spawn requests to one long-lived thread. PR_SET_PDEATHSIG fires when the *thread* that
/// forked the child exits, so children must not be forked from pool threads that can retire.
/// Prefetches of weight files run on threads of their own, beside the spawns: they never delay
/// a start (reading the files first and only then starting the server measured slower than
/// letting the two overlap).
#[derive(Clone)]
pub struct Supervisor {
    jobs: std::sync::mpsc::Sender<Job>,
    events: EventSink,
    containment: Arc<Containment>,
    /// Set at shutdown: prefetches stop early.
    cancel: Arc<AtomicBool>,
}

impl Supervisor {
    pub fn start(
        events: EventSink,
        containment: Arc<Containment>,
        accounts: Accounts,
        logs: ReplicaLogs,
    ) -> Supervisor {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let spawner = Spawner {
            handle: tokio::runtime::Handle::current(),
            events: events.clone(),
            containment: containment.clone(),
            accounts,
            logs,
        };
        std::thread::Builder::new()
            .name("hearth-spawner".into())
            .spawn(move || {
                // This thread lives as long as the daemon: the channel closes only at exit.
                while let Ok(job) = rx.recv() {
                    spawn_one(job, &spawner);
                }
            })
            .expect("spawn the spawner thread");
        Supervisor {
            jobs: tx,
            events,
            containment,
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn spawn(&self, spec: SpawnSpec) {
        let _ = self.jobs.send(Job { spec });
    }

    /// Reads a replica's weight files into the page cache on a thread of its own.
    pub fn prefetch(&self, replica: ReplicaId, model: String, globs: Vec<String>) {
        let (events, cancel) = (self.events.clone(), self.cancel.clone());
        let started = std::thread::Builder::new()
            .name("hearth-prefetch".into())
            .spawn(move || prefetch_files(&replica, &model, &globs, &events, &cancel));
        if let Err(e) = started {
            tracing::warn!("could not start a prefetch thread: {e}; the replica starts without it");
        }
    }

    /// Watches an adopted replica's leader, which this process did not start (or started
    /// before it re-executed itself): its exit is seen through a pidfd, it is reaped if it is
    /// a child, and what it left goes with it as for any replica.
    pub fn watch_adopted(&self, replica: ReplicaId, pid: u32, model: String) {
        let (events, containment) = (self.events.clone(), self.containment.clone());
        tokio::spawn(async move {
            let status = wait_pidfd(pid).await;
            let r = replica.clone();
            let cleared = tokio::task::spawn_blocking(move || containment.release(&r, pid)).await;
            if let Ok(Some(what)) = cleared {
                tracing::info!(model = %model, replica = %replica, "after its exit: {what}");
            }
            events.send(Event::Exited { replica, status }).await;
        });
    }

    /// Shutdown: prefetches under way stop.
    pub fn cancel_prefetches(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// SIGTERM to a replica's process group; SIGKILL to every process it has (its group at
    /// once, the rest off the event loop).
    pub fn signal(&self, replica: &ReplicaId, pid: u32, signal: StopSignal) {
        self.containment.signal_group(replica, pid, signal);
        if signal == StopSignal::Kill {
            let (c, r) = (self.containment.clone(), replica.clone());
            tokio::task::spawn_blocking(move || c.kill_rest(&r));
        }
    }
}

/// Reads the replica's prefetch files into the page cache, reporting progress to the core.
fn prefetch_files(
    replica: &ReplicaId,
    model: &str,
    globs: &[String],
    events: &EventSink,
    cancel: &AtomicBool,
) {
    let mut warned = 0usize;
    let mut announced = false;
    let outcome = prefetch::run(globs, cancel, |p| {
        if !announced {
            announced = true;
            let size = crate::units::short_bytes;
            match &p.limit {
                None => {
                    tracing::info!(model = %model, replica = %replica, "prefetching {} of weights: {}", size(p.total_bytes), globs.join(" "))
                }
                Some(l) => {
                    tracing::warn!(model = %model, replica = %replica, "prefetch: {} of weights would not fit in the {} of memory available ({} of it planned by other prefetches); reading the first {}, the server reads the rest from disk: {}", size(l.matched_bytes), size(l.room_bytes), size(l.others_bytes), size(p.total_bytes), globs.join(" "))
                }
            }
        }
        for m in &p.missing[warned..] {
            tracing::warn!(model = %model, replica = %replica, "prefetch: nothing read for {m}");
        }
        warned = p.missing.len();
        events.blocking_send(Event::Prefetch {
            replica: replica.clone(),
            done_bytes: p.done_bytes,
            total_bytes: p.total_bytes,
            missing: p.missing.clone(),
        });
    });
    if outcome.cancelled {
        tracing::info!(model = %model, replica = %replica, "prefetch stopped: shutting down");
        return;
    }
    let secs = outcome.elapsed.as_secs_f64();
    let rate = outcome.progress.done_bytes as f64 / secs.max(1e-3) / (1u64 << 20) as f64;
    tracing::info!(model = %model, replica = %replica, "prefetched {} in {} file(s) in {secs:.1} s ({rate:.0} MiB/s)", crate::units::short_bytes(outcome.progress.done_bytes), outcome.files);
}

/// What the child is given before fork: its credentials (None: stay the daemon's user) and the
/// gate's child side (None: no cgroup to wait for).
fn build_command(
    spec: &SpawnSpec,
    creds: Option<Credentials>,
    gate: Option<ChildSide>,
    output: (Stdio, Stdio),
) -> Result<Command, SpawnError> {
    let program = spec.command.first().ok_or(SpawnError::EmptyCommand)?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(&spec.command[1..]);
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(inherited_but_private) {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.stdin(Stdio::null()).stdout(output.0).stderr(output.1);
    // A replica in a cgroup or scope is found again by the next run of the daemon and may
    // outlive this one; one in a bare process group could not be, so it dies with the daemon.
    let pdeathsig = gate.is_none();
    // Its own process group, so a stop reaches every process the server started.
    cmd.process_group(0);
    let daemon_pid = nix::unistd::getpid();
    let creds = creds.filter(|c| !c.is_current());
    // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid, prctl, getppid, getpid,
    // read, write) between fork and exec, and no allocation.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(c) = &creds {
                nix::unistd::setgroups(&c.groups)?;
                nix::unistd::setgid(c.gid)?;
                nix::unistd::setuid(c.uid)?;
            }
            if pdeathsig {
                // After the credential change, which would clear it.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // The daemon may have died before prctl: then no signal will ever come.
                if nix::unistd::getppid() != daemon_pid {
                    libc::_exit(1);
                }
            }
            // Last: nothing of the server runs, and nothing can fork, until it is placed.
            if let Some(g) = gate {
                g.wait()?;
            }
            Ok(())
        });
    }
    Ok(Command::from(cmd))
}

/// The account the replica runs as, checked against its program: an account that cannot reach
/// the program is said plainly, before anything is started (the same check `check-config`
/// makes: account.rs).
fn account(spec: &SpawnSpec, accounts: &Accounts) -> Result<Option<Credentials>, SpawnError> {
    let (user, _) = accounts.user_for(spec.user.as_deref());
    let Some(user) = user else {
        return Ok(None);
    };
    let creds = Credentials::of(&user).map_err(|e| SpawnError::Account(e.to_string()))?;
    let path = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let program = spec.command.first().map(String::as_str).unwrap_or("");
    match accounts.cannot_run(spec.user.as_deref(), program, path) {
        Some(why) => Err(SpawnError::Account(why)),
        None => Ok(Some(creds)),
    }
}

fn spawn_one(job: Job, sv: &Spawner) {
    let Job { spec } = job;
    let replica = spec.replica.clone();
    let send = |ev: Event| {
        sv.events.blocking_send(ev);
    };
    // A port another process holds (an orphan of an earlier run, a server started by hand) is
    // not given to a replica: the server could not bind it, and a stranger would answer.
    if listeners::port_busy(spec.port) {
        let holder = listeners::describe_holder(spec.port);
        return send(Event::PortBusy {
            replica,
            port: spec.port,
            holder,
        });
    }
    let creds = match account(&spec, &sv.accounts) {
        Ok(c) => c,
        Err(error) => return send(Event::SpawnFailed { replica, error }),
    };
    let placement = match sv.containment.prepare(&spec) {
        Ok(p) => p,
        Err(e) => {
            let error = SpawnError::Containment(e.to_string());
            return send(Event::SpawnFailed { replica, error });
        }
    };
    let gate = if sv.containment.gated() {
        match Gate::new() {
            Ok(g) => Some(g),
            Err(e) => {
                sv.containment.discard(placement);
                let error = SpawnError::Gate(e.to_string());
                return send(Event::SpawnFailed { replica, error });
            }
        }
    } else {
        None
    };
    let output = match sv.logs.open(replica.as_str()) {
        Ok(o) => o,
        Err(e) => {
            sv.containment.discard(placement);
            let error = SpawnError::Output {
                location: sv.logs.location(replica.as_str()).to_string(),
                error: e.to_string(),
            };
            return send(Event::SpawnFailed { replica, error });
        }
    };
    let mut cmd = match build_command(&spec, creds, gate.as_ref().map(Gate::child_side), output) {
        Ok(c) => c,
        Err(error) => {
            sv.containment.discard(placement);
            return send(Event::SpawnFailed { replica, error });
        }
    };
    let guard = sv.containment.spawning();
    // The gate's daemon side runs beside `spawn`, which returns only once the child has exec'd.
    let spawned = AtomicBool::new(false);
    let (child, placed) = std::thread::scope(|scope| {
        let opener = gate.as_ref().map(|g| {
            let (containment, placement, spawned) = (&sv.containment, &placement, &spawned);
            scope.spawn(move || g.open_with(spawned, |pid| containment.place(placement, pid)))
        });
        // tokio's child reaping needs the runtime's context on the forking thread.
        let child = {
            let _enter = sv.handle.enter();
            cmd.spawn()
        };
        spawned.store(true, Ordering::Release);
        let placed = opener.and_then(|h| h.join().ok().flatten());
        (child, placed)
    });
    drop(gate);
    let mut child = match (child, placed) {
        (Ok(c), None | Some(Ok(_))) => c,
        (result, placed) => {
            sv.containment.discard(placement);
            let error = match (placed, result) {
                (Some(Err(e)), _) => SpawnError::Placing(e.to_string()),
                (_, Err(e)) => SpawnError::Exec {
                    program: spec.command[0].clone(),
                    error: e.to_string(),
                },
                (_, Ok(_)) => SpawnError::EndedBeforePlaced,
            };
            return send(Event::SpawnFailed { replica, error });
        }
    };
    let Some(pid) = child.id() else {
        sv.containment.discard(placement);
        let error = SpawnError::EndedAtOnce;
        return send(Event::SpawnFailed { replica, error });
    };
    sv.containment.register(placement, pid);
    drop(guard);
    // GPU is the journal field for the device(s): absent for CPU-only replicas.
    let gpu = (!spec.gpus.is_empty()).then(|| spec.gpus.join(","));
    tracing::info!(model = %spec.model, replica = %replica, gpu = gpu.as_deref(), pid, port = spec.port, output = %sv.logs.location(replica.as_str()), "spawned: {}", spec.command.join(" "));
    send(Event::Spawned {
        replica: replica.clone(),
        pid,
    });
    let handle = &sv.handle;
    let events = sv.events.clone();
    let containment = sv.containment.clone();
    let model = spec.model.clone();
    handle.spawn(async move {
        let status = child.wait().await;
        // Whatever the leader left behind goes with it (its group, its cgroup or scope, the
        // orphans that came back to hearth): a replica that is gone must not keep holding GPU
        // memory or its port.
        let r = replica.clone();
        let cleared = tokio::task::spawn_blocking(move || containment.release(&r, pid)).await;
        if let Ok(Some(what)) = cleared {
            tracing::info!(model = %model, replica = %replica, "after its exit: {what}");
        }
        let status = match status {
            Ok(s) => describe(s),
            Err(e) => ExitStatus::WaitFailed(e.to_string()),
        };
        events.send(Event::Exited { replica, status }).await;
    });
}

/// Waits for `pid` to exit through a pidfd (Linux 5.3+); reaps it if it is our child (after a
/// re-exec, replicas are still children). The exit as far as it can be known.
async fn wait_pidfd(pid: u32) -> ExitStatus {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return ExitStatus::GoneBeforeWatched;
    }
    // SAFETY: a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the pidfd is owned by the AsyncFd, neither replaced nor closed while registered.
    match unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    } {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(e) => {
            tracing::warn!(pid, "watching an adopted process: {e}; polling it instead");
            while super::containment::procfs::stat(pid).is_some_and(|s| s.alive()) {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    match waitpid(
        nix::unistd::Pid::from_raw(pid as i32),
        Some(WaitPidFlag::WNOHANG),
    ) {
        Ok(WaitStatus::Exited(_, c)) => ExitStatus::Code(c),
        Ok(WaitStatus::Signaled(_, sig, core_dumped)) => ExitStatus::Signaled {
            signal: sig as i32,
            core_dumped,
        },
        _ => ExitStatus::NotAChild,
    }
}

fn describe(s: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(signal)) => ExitStatus::Signaled {
            signal,
            core_dumped: s.core_dumped(),
        },
        _ => ExitStatus::Ended,
    }
}
