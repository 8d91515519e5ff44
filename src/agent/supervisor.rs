//! Spawns replica processes and watches them: each in its own process group, with the
//! placeholders' environment, PR_SET_PDEATHSIG, output forwarded to tracing, exits seen at once.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Gid, Pid, Uid};
use tokio::io::AsyncRead;
use tokio::process::Command;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use super::inbox::EventSink;
use super::prefetch;
use crate::core::{Event, ReplicaId, SpawnSpec, StopSignal};

/// Variables of the daemon's own that must never reach a child: they describe the daemon's
/// relationship with systemd (notify socket, watchdog, passed sockets, journal stream), and a
/// child that used them would speak for the daemon.
fn inherited_but_private(name: &str) -> bool {
    name == "NOTIFY_SOCKET"
        || name == "JOURNAL_STREAM"
        || name.starts_with("WATCHDOG_")
        || name.starts_with("LISTEN_")
}

struct Job {
    spec: SpawnSpec,
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
    /// Set at shutdown: prefetches stop early.
    cancel: Arc<AtomicBool>,
}

impl Supervisor {
    pub fn start(events: EventSink) -> Supervisor {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let events_for_prefetch = events.clone();
        let handle = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("hearth-spawner".into())
            .spawn(move || {
                // This thread lives as long as the daemon: the channel closes only at exit.
                while let Ok(job) = rx.recv() {
                    spawn_one(job, &handle, &events);
                }
            })
            .expect("spawn the spawner thread");
        Supervisor {
            jobs: tx,
            events: events_for_prefetch,
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

    /// Shutdown: prefetches under way stop.
    pub fn cancel_prefetches(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Signals a replica's whole process group.
    pub fn signal(replica: &ReplicaId, pid: u32, signal: StopSignal) {
        let sig = match signal {
            StopSignal::Term => Signal::SIGTERM,
            StopSignal::Kill => Signal::SIGKILL,
        };
        match killpg(Pid::from_raw(pid as i32), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => tracing::warn!(replica = %replica, pid, "could not send {sig:?}: {e}"),
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

/// Looked up before fork: a child between fork and exec may only make async-signal-safe calls.
struct Credentials {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

fn credentials(user: &str) -> Result<Credentials, String> {
    let u = nix::unistd::User::from_name(user)
        .map_err(|e| format!("looking up user {user:?}: {e}"))?
        .ok_or_else(|| format!("no user {user:?}"))?;
    let cname = CString::new(user).map_err(|_| "user name with a NUL byte".to_string())?;
    let groups =
        nix::unistd::getgrouplist(&cname, u.gid).map_err(|e| format!("groups of {user:?}: {e}"))?;
    Ok(Credentials {
        uid: u.uid,
        gid: u.gid,
        groups,
    })
}

fn build_command(spec: &SpawnSpec) -> Result<Command, String> {
    let program = spec.command.first().ok_or("empty command")?;
    let creds = spec.user.as_deref().map(credentials).transpose()?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(&spec.command[1..]);
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(inherited_but_private) {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group, so a stop reaches every process the server started.
    cmd.process_group(0);
    let daemon_pid = nix::unistd::getpid();
    // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid, prctl, getppid, _exit)
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(c) = &creds {
                nix::unistd::setgroups(&c.groups)?;
                nix::unistd::setgid(c.gid)?;
                nix::unistd::setuid(c.uid)?;
            }
            // After the credential change, which would clear it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The daemon may have died before prctl: then no signal will ever come.
            if nix::unistd::getppid() != daemon_pid {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    Ok(Command::from(cmd))
}

fn spawn_one(job: Job, handle: &tokio::runtime::Handle, events: &EventSink) {
    let Job { spec } = job;
    let replica = spec.replica.clone();
    let send = |ev: Event| {
        events.blocking_send(ev);
    };
    let mut cmd = match build_command(&spec) {
        Ok(c) => c,
        Err(error) => return send(Event::SpawnFailed { replica, error }),
    };
    // tokio's child reaping needs the runtime's context on the forking thread.
    let _guard = handle.enter();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let error = format!("{}: {e}", spec.command[0]);
            return send(Event::SpawnFailed { replica, error });
        }
    };
    let pid = child.id().expect("a just-spawned child has a pid");
    // GPU is the journal field for the device(s): absent for CPU-only replicas.
    let gpu = (!spec.gpus.is_empty()).then(|| spec.gpus.join(","));
    tracing::info!(model = %spec.model, replica = %replica, gpu = gpu.as_deref(), pid, port = spec.port, "spawned: {}", spec.command.join(" "));
    send(Event::Spawned {
        replica: replica.clone(),
        pid,
    });
    if let Some(out) = child.stdout.take() {
        handle.spawn(forward_output(
            out,
            spec.model.clone(),
            replica.clone(),
            gpu.clone(),
            "stdout",
        ));
    }
    if let Some(err) = child.stderr.take() {
        handle.spawn(forward_output(
            err,
            spec.model.clone(),
            replica.clone(),
            gpu.clone(),
            "stderr",
        ));
    }
    let events = events.clone();
    handle.spawn(async move {
        let status = child.wait().await;
        // Whatever the leader left behind in its group goes with it: a replica that is gone
        // must not keep holding GPU memory or its port.
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let status = match status {
            Ok(s) => describe(s),
            Err(e) => format!("wait failed: {e}"),
        };
        events.send(Event::Exited { replica, status }).await;
    });
}

fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(name) => format!("killed by {name:?}"),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => "ended".to_string(),
    }
}

async fn forward_output(
    stream: impl AsyncRead + Unpin,
    model: String,
    replica: ReplicaId,
    gpu: Option<String>,
    which: &'static str,
) {
    // Each line a replica prints is logged under its model, replica and GPU, so that the journal
    // can show one replica's output (`journalctl -u hearth REPLICA=llama-8b-3`).
    forward_lines(stream, |line| {
        tracing::info!(target: "hearth::replica", model = %model, replica = %replica, gpu = gpu.as_deref(), stream = which, "{line}");
    })
    .await;
}

/// Longest child output line forwarded whole; longer ones are cut, not buffered forever.
const MAX_OUTPUT_LINE: usize = 16 * 1024;

async fn forward_lines(stream: impl AsyncRead + Unpin, mut f: impl FnMut(&str)) {
    let mut lines = FramedRead::new(stream, LinesCodec::new_with_max_length(MAX_OUTPUT_LINE));
    while let Some(item) = lines.next().await {
        match item {
            Ok(line) => f(&line),
            Err(LinesCodecError::MaxLineLengthExceeded) => f("[line longer than 16 KiB dropped]"),
            Err(LinesCodecError::Io(_)) => break,
        }
    }
}
