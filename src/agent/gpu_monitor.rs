//! The GPU monitor: one dedicated thread that waits for XID events and reads memory use, and
//! sends what it sees to the core's task as events. NVML calls block (an event wait blocks by
//! design), so they never run on the core's task or on the async runtime.
//!
//! The thread's loop (`pump`) is written against `GpuSource`, so that a scripted source drives
//! the same shell path in tests as NVML does on a GPU host.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::inbox::EventSink;
use crate::core::Event;

/// How often memory use is read (and once at start).
pub const MEMORY_INTERVAL: Duration = Duration::from_secs(5);
/// The longest one wait for an XID may block: the thread notices a shutdown this soon.
pub const WAIT_SLICE: Duration = Duration::from_millis(500);

/// Memory on one device: all of it in use, and what each process holds.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceMemory {
    pub uuid: String,
    pub used: u64,
    /// (pid, bytes) of each compute process, as the driver lists them.
    pub processes: Vec<(u32, u64)>,
}

/// An XID error on a device.
#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    pub uuid: String,
    pub xid: u64,
}

/// Where the monitor's readings come from: NVML on a GPU host, a script in tests.
pub trait GpuSource {
    /// Memory use on every device it can read now; a device it cannot read is left out (its
    /// error logged by the source), never reported as zero.
    fn memory(&mut self) -> Vec<DeviceMemory>;
    /// Waits at most `timeout` for the next XID. `Ok(None)`: none came. `Err`: the source failed
    /// (the monitor logs it and carries on after a pause).
    fn wait_xid(&mut self, timeout: Duration) -> Result<Option<Xid>, String>;
}

/// Where the monitor's events go, and the flag that stops it.
#[derive(Clone)]
pub struct MonitorSink {
    pub to_core: EventSink,
    pub stop: Arc<AtomicBool>,
    pub interval: Duration,
}

impl MonitorSink {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.to_core.is_closed()
    }
    /// False once the core's task is gone.
    fn send(&self, ev: Event) -> bool {
        self.to_core.blocking_send(ev)
    }
}

/// Stops the monitor thread when dropped (the daemon keeps it for its lifetime).
pub struct MonitorHandle {
    stop: Arc<AtomicBool>,
}

impl MonitorHandle {
    pub fn new(stop: Arc<AtomicBool>) -> Self {
        MonitorHandle { stop }
    }
}

impl Drop for MonitorHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The process group of a pid, or None if the process is gone (or in another PID namespace).
pub fn pgid_of(pid: u32) -> Option<u32> {
    let pid = i32::try_from(pid).ok().filter(|&p| p > 0)?;
    nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid)))
        .ok()
        .map(|g| g.as_raw() as u32)
}

/// Sums each process's memory into its process group: a replica is a process group (its leader
/// created it), so memory held by a server's worker processes counts as the replica's. Processes
/// whose group can't be found (gone since the driver listed them, or invisible from here) are
/// left out, so they count as foreign until the next reading.
pub fn group_usage(processes: &[(u32, u64)], pgid: impl Fn(u32) -> Option<u32>) -> Vec<(u32, u64)> {
    let mut groups: BTreeMap<u32, u64> = BTreeMap::new();
    for &(pid, bytes) in processes {
        if let Some(g) = pgid(pid) {
            *groups.entry(g).or_default() += bytes;
        }
    }
    groups.into_iter().collect()
}

/// The monitor's loop: memory at start and every `sink.interval`, XIDs as they come, until the
/// stop flag is set or the core's task is gone.
pub fn pump(source: &mut dyn GpuSource, sink: &MonitorSink, pgid: &dyn Fn(u32) -> Option<u32>) {
    let mut next_memory = Instant::now();
    let mut failing = false;
    while !sink.stopped() {
        let now = Instant::now();
        if now >= next_memory {
            for d in source.memory() {
                let by_group = group_usage(&d.processes, pgid);
                let ev = Event::GpuMemory {
                    uuid: d.uuid,
                    used: d.used,
                    by_group,
                };
                if !sink.send(ev) {
                    return;
                }
            }
            next_memory = now + sink.interval;
        }
        let wait = next_memory
            .saturating_duration_since(Instant::now())
            .min(WAIT_SLICE);
        match source.wait_xid(wait) {
            Ok(Some(Xid { uuid, xid })) => {
                failing = false;
                tracing::warn!(gpu = %uuid, xid, "NVML reported XID {xid}");
                if !sink.send(Event::GpuXid { uuid, xid }) {
                    return;
                }
            }
            Ok(None) => failing = false,
            Err(e) => {
                // Logged once per episode; the pause keeps a broken source from spinning.
                if !failing {
                    tracing::error!("GPU event wait failed: {e}; retrying");
                    failing = true;
                }
                std::thread::sleep(wait.max(Duration::from_millis(100)));
            }
        }
    }
}

/// Runs `body` (which builds a source and calls `pump`) on a dedicated thread. NVML's event set
/// borrows the library handle, so the source is built on the thread that uses it.
pub fn spawn(
    name: &str,
    sink: MonitorSink,
    body: impl FnOnce(MonitorSink) + Send + 'static,
) -> std::io::Result<MonitorHandle> {
    let stop = sink.stop.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || body(sink))?;
    Ok(MonitorHandle::new(stop))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::inbox::{self, ShellMsg};
    use std::collections::VecDeque;

    #[test]
    fn memory_is_summed_per_process_group_and_unknown_pids_are_left_out() {
        // 10 and 11 share group 10 (a server and its worker); 20 is alone; 30 is gone.
        let pgid = |pid: u32| match pid {
            10 | 11 => Some(10),
            20 => Some(20),
            _ => None,
        };
        let by = group_usage(&[(10, 5), (11, 7), (20, 1), (30, 100)], pgid);
        assert_eq!(by, vec![(10, 12), (20, 1)]);
    }

    #[test]
    fn pgid_of_finds_this_process_group_and_not_a_missing_pid() {
        let me = std::process::id();
        let want = nix::unistd::getpgrp().as_raw() as u32;
        assert_eq!(pgid_of(me), Some(want));
        assert_eq!(pgid_of(0), None, "0 would mean the caller");
        assert_eq!(pgid_of(u32::MAX), None);
    }

    /// Replays XIDs, one per wait, then reports none; memory from a fixed table.
    struct Script {
        xids: VecDeque<Result<Option<Xid>, String>>,
        memory: Vec<DeviceMemory>,
        memory_reads: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl GpuSource for Script {
        fn memory(&mut self) -> Vec<DeviceMemory> {
            self.memory_reads.fetch_add(1, Ordering::Relaxed);
            self.memory.clone()
        }
        fn wait_xid(&mut self, timeout: Duration) -> Result<Option<Xid>, String> {
            match self.xids.pop_front() {
                Some(x) => x,
                None => {
                    std::thread::sleep(timeout.min(Duration::from_millis(5)));
                    Ok(None)
                }
            }
        }
    }

    #[test]
    fn the_pump_sends_memory_first_then_xids_and_survives_a_failing_wait() {
        let (tx, mut rx) = inbox::channel();
        let sink = MonitorSink {
            to_core: EventSink::new(tx),
            stop: Arc::new(AtomicBool::new(false)),
            interval: Duration::from_secs(3600),
        };
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut script = Script {
            xids: VecDeque::from(vec![
                Ok(Some(Xid {
                    uuid: "GPU-a".into(),
                    xid: 13,
                })),
                Err("GPU is lost".into()),
                Ok(Some(Xid {
                    uuid: "GPU-a".into(),
                    xid: 79,
                })),
            ]),
            memory: vec![DeviceMemory {
                uuid: "GPU-a".into(),
                used: 100,
                processes: vec![(10, 30), (11, 20), (99, 50)],
            }],
            memory_reads: reads.clone(),
        };
        let stop = sink.stop.clone();
        let handle = std::thread::spawn(move || {
            pump(&mut script, &sink, &|pid| (pid < 50).then_some(10));
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            match rx.blocking_recv() {
                Some(ShellMsg::Event(ev)) => got.push(ev),
                _ => panic!("the pump ended early"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        match &got[0] {
            Event::GpuMemory {
                uuid,
                used,
                by_group,
            } => {
                assert_eq!((uuid.as_str(), *used), ("GPU-a", 100));
                assert_eq!(by_group, &vec![(10, 50)]);
            }
            other => panic!("memory first, got {other:?}"),
        }
        assert!(matches!(&got[1], Event::GpuXid { xid: 13, .. }));
        assert!(matches!(&got[2], Event::GpuXid { xid: 79, .. }));
        assert_eq!(reads.load(Ordering::Relaxed), 1, "memory once per interval");
    }

    #[test]
    fn the_pump_ends_when_the_core_is_gone() {
        let (tx, rx) = inbox::channel();
        drop(rx);
        let sink = MonitorSink {
            to_core: EventSink::new(tx),
            stop: Arc::new(AtomicBool::new(false)),
            interval: Duration::from_millis(1),
        };
        let mut script = Script {
            xids: VecDeque::new(),
            memory: vec![],
            memory_reads: Default::default(),
        };
        // Returns rather than spinning forever.
        pump(&mut script, &sink, &|_| None);
    }
}
