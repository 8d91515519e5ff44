//! The GPU monitor: one dedicated thread that waits for XID events, reads each device's memory
//! and recovery action, and reads the inventory again, and sends what it sees to the core's task
//! as events. NVML calls block (an event wait blocks by design), so they never run on the core's
//! task or on the async runtime.
//!
//! The thread's loop (`pump`) is written against `GpuSource`, so that a scripted source drives
//! the same shell path in tests as NVML does on a GPU host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::gpu_owner::Attribution;
use super::inbox::EventSink;
use crate::core::{Event, GpuDevice, GpuReading, RecoveryAction};

/// How often memory use is read (and once at start).
pub const MEMORY_INTERVAL: Duration = Duration::from_secs(5);
/// How often the inventory is read again (and at once when a device is found lost).
pub const INVENTORY_INTERVAL: Duration = Duration::from_secs(30);
/// The longest one wait for an event may block: the thread notices a shutdown this soon.
pub const WAIT_SLICE: Duration = Duration::from_millis(500);
/// Processes of one device a reading carries: a bound on what a driver may list.
pub const MAX_PROCESSES: usize = 4096;

/// One device as read now.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceMemory {
    pub uuid: String,
    /// Allocated by processes (NVML's `used`, without the driver's reserve).
    pub used: u64,
    /// Set aside by the driver and firmware.
    pub driver_reserved: u64,
    /// (pid, bytes) of each compute process, as the driver lists them; None where the driver
    /// reports "Unavailable".
    pub processes: Vec<(u32, Option<u64>)>,
    /// The device's recovery action, where the driver reports one.
    pub recovery: Option<RecoveryAction>,
}

/// An XID error on a device, with the recovery action read right after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    pub uuid: String,
    pub xid: u64,
    pub recovery: Option<RecoveryAction>,
}

/// What an event wait brings.
#[derive(Debug, Clone, PartialEq)]
pub enum News {
    Xid(Xid),
    /// Something changed that a fresh reading of memory, recovery actions and the inventory
    /// will show (a device lost, an uncorrectable ECC error, a recovery action changed).
    Reread,
}

/// Where the monitor's readings come from: NVML on a GPU host, a script in tests.
pub trait GpuSource {
    /// Every device it can read now; a device it cannot read is left out (its error logged by
    /// the source), never reported as zero.
    fn memory(&mut self) -> Vec<DeviceMemory>;
    /// Waits at most `timeout` for the next event. `Ok(None)`: none came. `Err`: the source
    /// failed (the monitor logs it and carries on after a pause).
    fn wait_event(&mut self, timeout: Duration) -> Result<Option<News>, String>;
    /// The inventory now, where the source can read it again; None: it cannot.
    fn inventory(&mut self) -> Option<Vec<GpuDevice>> {
        None
    }
}

/// Where the monitor's events go, the flag that stops it, and how it tells whose a process is.
#[derive(Clone)]
pub struct MonitorSink {
    pub to_core: EventSink,
    pub stop: Arc<AtomicBool>,
    pub interval: Duration,
    pub inventory_interval: Duration,
    pub attribution: Arc<Attribution>,
}

impl MonitorSink {
    pub fn new(to_core: EventSink, attribution: Arc<Attribution>) -> MonitorSink {
        MonitorSink {
            to_core,
            stop: Arc::new(AtomicBool::new(false)),
            interval: MEMORY_INTERVAL,
            inventory_interval: INVENTORY_INTERVAL,
            attribution,
        }
    }
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

/// The monitor's loop: memory at start and every `sink.interval`, the inventory every
/// `sink.inventory_interval`, both at once when an event says something changed, XIDs as they
/// come; until the stop flag is set or the core's task is gone.
pub fn pump(source: &mut dyn GpuSource, sink: &MonitorSink) {
    let mut next_memory = Instant::now();
    let mut next_inventory = Instant::now() + sink.inventory_interval;
    let mut last_inventory: Option<Vec<GpuDevice>> = None;
    let mut failing = false;
    while !sink.stopped() {
        let now = Instant::now();
        if now >= next_inventory {
            next_inventory = now + sink.inventory_interval;
            if let Some(devices) = source.inventory() {
                if last_inventory.as_ref() != Some(&devices) {
                    last_inventory = Some(devices.clone());
                    if !sink.send(Event::Inventory(devices)) {
                        return;
                    }
                }
            }
        }
        if now >= next_memory {
            for d in source.memory() {
                let mut processes = d.processes;
                processes.truncate(MAX_PROCESSES);
                let ev = Event::GpuReading(GpuReading {
                    uuid: d.uuid,
                    used: d.used,
                    driver_reserved: d.driver_reserved,
                    processes: processes
                        .into_iter()
                        .map(|(pid, bytes)| sink.attribution.process(pid, bytes))
                        .collect(),
                    recovery: d.recovery,
                });
                if !sink.send(ev) {
                    return;
                }
            }
            next_memory = now + sink.interval;
        }
        let wait = next_memory
            .min(next_inventory)
            .saturating_duration_since(Instant::now())
            .min(WAIT_SLICE);
        match source.wait_event(wait) {
            Ok(Some(News::Xid(Xid {
                uuid,
                xid,
                recovery,
            }))) => {
                failing = false;
                tracing::warn!(gpu = %uuid, xid, "NVML reported XID {xid}");
                if !sink.send(Event::GpuXid {
                    uuid,
                    xid,
                    recovery,
                }) {
                    return;
                }
            }
            Ok(Some(News::Reread)) => {
                failing = false;
                next_memory = Instant::now();
                next_inventory = Instant::now();
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

/// Runs `body` (which builds a source and calls `pump`) on a dedicated thread. The source is
/// built on the thread that uses it.
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
    use crate::agent::gpu_owner::CgroupIndex;
    use crate::agent::inbox::{self, ShellMsg};
    use std::collections::VecDeque;

    /// Replays events, one per wait, then reports none; memory from a fixed table.
    struct Script {
        events: VecDeque<Result<Option<News>, String>>,
        memory: Vec<DeviceMemory>,
        memory_reads: Arc<std::sync::atomic::AtomicUsize>,
        inventories: VecDeque<Vec<GpuDevice>>,
    }

    impl GpuSource for Script {
        fn memory(&mut self) -> Vec<DeviceMemory> {
            self.memory_reads.fetch_add(1, Ordering::Relaxed);
            self.memory.clone()
        }
        fn wait_event(&mut self, timeout: Duration) -> Result<Option<News>, String> {
            match self.events.pop_front() {
                Some(x) => x,
                None => {
                    std::thread::sleep(timeout.min(Duration::from_millis(5)));
                    Ok(None)
                }
            }
        }
        fn inventory(&mut self) -> Option<Vec<GpuDevice>> {
            self.inventories.pop_front()
        }
    }

    fn sink(
        interval: Duration,
    ) -> (
        MonitorSink,
        tokio::sync::mpsc::Receiver<crate::agent::inbox::ShellMsg>,
    ) {
        let (tx, rx) = inbox::channel();
        let mut s = MonitorSink::new(
            EventSink::new(tx),
            Arc::new(Attribution::new(CgroupIndex::default())),
        );
        s.interval = interval;
        s.inventory_interval = Duration::from_secs(3600);
        (s, rx)
    }

    #[test]
    fn the_pump_sends_memory_first_then_xids_and_survives_a_failing_wait() {
        let (sink, mut rx) = sink(Duration::from_secs(3600));
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let xid = |n| {
            Ok(Some(News::Xid(Xid {
                uuid: "GPU-a".into(),
                xid: n,
                recovery: None,
            })))
        };
        let me = std::process::id();
        let mut script = Script {
            events: VecDeque::from(vec![xid(13), Err("GPU is lost".into()), xid(79)]),
            memory: vec![DeviceMemory {
                uuid: "GPU-a".into(),
                used: 100,
                driver_reserved: 7,
                processes: vec![(me, Some(30)), (me, None)],
                recovery: Some(RecoveryAction::None),
            }],
            memory_reads: reads.clone(),
            inventories: VecDeque::new(),
        };
        let stop = sink.stop.clone();
        let handle = std::thread::spawn(move || pump(&mut script, &sink));
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
            Event::GpuReading(r) => {
                assert_eq!(
                    (r.uuid.as_str(), r.used, r.driver_reserved),
                    ("GPU-a", 100, 7)
                );
                assert_eq!(r.processes.len(), 2);
                assert_eq!(r.processes[0].bytes, Some(30));
                assert_eq!(r.processes[1].bytes, None, "Unavailable stays unknown");
                assert_eq!(r.processes[0].leaders.first(), Some(&me));
                assert_eq!(r.recovery, Some(RecoveryAction::None));
            }
            other => panic!("memory first, got {other:?}"),
        }
        assert!(matches!(&got[1], Event::GpuXid { xid: 13, .. }));
        assert!(matches!(&got[2], Event::GpuXid { xid: 79, .. }));
        assert_eq!(reads.load(Ordering::Relaxed), 1, "memory once per interval");
    }

    #[test]
    fn a_reread_brings_the_inventory_and_memory_at_once_and_an_unchanged_list_is_not_resent() {
        let (sink, mut rx) = sink(Duration::from_secs(3600));
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let one = vec![GpuDevice::new(0, "GPU-a", "x", 1)];
        let mut script = Script {
            // Three rereads, three inventories: the second repeats the first and is not sent.
            events: VecDeque::from(vec![
                Ok(Some(News::Reread)),
                Ok(Some(News::Reread)),
                Ok(Some(News::Reread)),
            ]),
            memory: vec![],
            memory_reads: reads.clone(),
            inventories: VecDeque::from(vec![one.clone(), one.clone(), vec![]]),
        };
        let stop = sink.stop.clone();
        let handle = std::thread::spawn(move || pump(&mut script, &sink));
        let mut got = Vec::new();
        while got.len() < 2 {
            match rx.blocking_recv() {
                Some(ShellMsg::Event(ev)) => got.push(ev),
                _ => panic!("the pump ended early"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        assert!(matches!(&got[0], Event::Inventory(d) if d == &one));
        assert!(
            matches!(&got[1], Event::Inventory(d) if d.is_empty()),
            "{got:?}"
        );
        assert!(
            reads.load(Ordering::Relaxed) >= 3,
            "memory read again at each reread"
        );
    }

    #[test]
    fn the_pump_ends_when_the_core_is_gone() {
        let (sink, rx) = sink(Duration::from_millis(1));
        drop(rx);
        let mut script = Script {
            events: VecDeque::new(),
            memory: vec![],
            memory_reads: Default::default(),
            inventories: VecDeque::new(),
        };
        // Returns rather than spinning forever.
        pump(&mut script, &sink);
    }
}
