//! The NVML path driven by scripted NVML answers ([`ScriptedDriver`]): the inventory reading,
//! the monitor's source (event sets, readings, lost GPUs), the monitor's loop, and the core's
//! verdicts on what they report. Everything here runs the code a GPU host runs; only the
//! answers of libnvidia-ml are scripted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::driver::{event_bits, RawEvent};
use super::script::{ScriptedDriver, ScriptedGpu, ScriptedMig};
use super::source::NvmlSource;
use super::NvmlInventory;
use crate::agent::gpu_monitor::{DeviceMemory, GpuSource, MonitorSink, News, Xid};
use crate::agent::gpu_owner::{Attribution, CgroupIndex};
use crate::agent::inbox::{self, EventSink, ShellMsg};
use crate::agent::inventory::Inventory;
use crate::core::harness::{gpu_model, on_device, Harness, BASE};
use crate::core::{
    Action, Event, ExitStatus, GpuDevice, GpuFault, GpuProcess, GpuReading, Link, RecoveryAction,
    ReplicaState,
};

const GIB: u64 = 1 << 30;
const WHOLE: u32 = u32::MAX;

fn gpus(n: usize) -> Vec<ScriptedGpu> {
    (0..n)
        .map(|i| ScriptedGpu::new(&format!("GPU-{i}")))
        .collect()
}

fn source(d: &ScriptedDriver) -> (NvmlSource<ScriptedDriver>, Vec<GpuDevice>) {
    let inv = NvmlInventory::with_driver(d.clone());
    let devices = inv.devices.clone();
    (
        NvmlSource::new(d.clone(), inv.enumerator.clone(), devices.clone()),
        devices,
    )
}

/// A reading as the monitor sends it (each process its own leader).
fn reading_event(m: DeviceMemory) -> Event {
    Event::GpuReading(GpuReading {
        uuid: m.uuid,
        used: m.used,
        driver_reserved: m.driver_reserved,
        processes: m
            .processes
            .into_iter()
            .map(|(pid, bytes)| GpuProcess {
                pid,
                bytes,
                replica: None,
                leaders: vec![pid],
            })
            .collect(),
        recovery: m.recovery,
    })
}

/// The devices of every replica placed.
fn placed(h: &Harness) -> Vec<Vec<String>> {
    h.all_replicas()
        .into_iter()
        .map(|r| r.1)
        .filter(|g| !g.is_empty())
        .collect()
}

/// One memory reading of every device into the core, then a tick: what start-up placement
/// waits for.
fn read_all(h: &mut Harness, s: &mut NvmlSource<ScriptedDriver>) -> Vec<Action> {
    let mut out = Vec::new();
    for m in s.memory() {
        out.extend(h.send(reading_event(m)));
    }
    out.extend(h.send(Event::Tick));
    out
}

/// Everything the source brings within `within`, until it has brought `n` pieces of news.
fn news(s: &mut NvmlSource<ScriptedDriver>, n: usize, within: Duration) -> Vec<News> {
    let end = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < end {
        if let Ok(Some(x)) = s.wait_event(Duration::from_millis(5)) {
            out.push(x);
        }
    }
    out
}

fn xids(news: &[News]) -> Vec<(String, u64, Option<RecoveryAction>)> {
    news.iter()
        .filter_map(|n| match n {
            News::Xid(Xid {
                uuid,
                xid,
                recovery,
            }) => Some((uuid.clone(), *xid, *recovery)),
            News::Reread => None,
        })
        .collect()
}

#[test]
fn a_failed_registration_on_device_k_costs_device_k_alone() {
    for k in 0..4u32 {
        let mut g = gpus(4);
        g[k as usize].register_fails = Some(super::driver::DriverError::Other("unknown".into()));
        let d = ScriptedDriver::new(g);
        let (mut s, _) = source(&d);
        {
            let sc = d.script();
            assert_eq!(sc.freed_by_failure, 1);
            let registered: Vec<u32> = sc.registrations.iter().map(|r| r.1).collect();
            let expected: Vec<u32> = (0..4).filter(|&i| i != k).collect();
            assert_eq!(registered, expected, "k = {k}");
            let mut sets: Vec<usize> = sc.registrations.iter().map(|r| r.0).collect();
            sets.dedup();
            assert_eq!(sets.len(), 3, "one set per GPU");
        }
        // Every other GPU's XIDs still arrive.
        for i in 0..4u32 {
            d.xid(i, 13, WHOLE);
        }
        let got = xids(&news(&mut s, 3, Duration::from_secs(10)));
        let mut uuids: Vec<String> = got.iter().map(|x| x.0.clone()).collect();
        uuids.sort();
        let expected: Vec<String> = (0..4)
            .filter(|&i| i != k)
            .map(|i| format!("GPU-{i}"))
            .collect();
        assert_eq!(uuids, expected, "k = {k}");
    }
}

/// A host with two GPUs and a 30 GiB replica on GPU-0; the XID `xid` arrives there with the
/// recovery action `raw` read after it. Whether GPU-0 stays in service.
fn xid_on_a_host(xid: u64, raw: u32) -> (bool, Vec<ReplicaState>) {
    let d = ScriptedDriver::new(gpus(2));
    let (mut s, devices) = source(&d);
    let toml = format!(
        "{BASE}{}",
        gpu_model("m", "30GiB", "", "min = 1\nmax = 1\nwarm_pool = 0")
    );
    let mut h = Harness::with_devices(&toml, devices);
    let first = read_all(&mut h, &mut s);
    h.settle(first);
    let r = h.in_state("m", ReplicaState::Routed);
    assert_eq!(r.len(), 1);
    assert_eq!(h.gpus_of(&r[0]), vec!["GPU-0".to_string()]);
    d.script().gpus[0].recovery = Ok(raw);
    d.xid(0, xid, WHOLE);
    let got = xids(&news(&mut s, 1, Duration::from_secs(10)));
    assert_eq!(
        got,
        vec![("GPU-0".into(), xid, Some(RecoveryAction::from_raw(raw)))]
    );
    for (uuid, xid, recovery) in got {
        h.send(Event::GpuXid {
            uuid,
            xid,
            recovery,
        });
    }
    let healthy = h.accepts("GPU-0");
    let states = h.all_replicas().into_iter().map(|r| r.0).collect();
    (healthy, states)
}

#[test]
fn xids_94_63_48_79_154_with_their_recovery_actions() {
    // (XID, raw recovery action, stays in service)
    let cases = [
        (94, 0, true),   // contained ECC: only the faulting application
        (94, 1, false),  // … unless the driver asks for a reset
        (63, 0, true),   // row remapping pending: future work unaffected
        (48, 0, true),   // uncorrectable ECC the driver contained
        (48, 4, false),  // … or not: drain and reset
        (79, 2, false),  // fallen off the bus
        (154, 0, true),  // the recovery action changed, to none
        (154, 2, false), // … to a node reboot
        (154, 7, false), // … to a system reboot
        (13, 0, true),   // an application's own fault
    ];
    for (xid, raw, stays) in cases {
        let (healthy, states) = xid_on_a_host(xid, raw);
        assert_eq!(healthy, stays, "XID {xid}, recovery action {raw}");
        if !stays {
            assert!(
                states.contains(&ReplicaState::Starting),
                "XID {xid}/{raw}: a replacement starts on GPU-1: {states:?}"
            );
        } else {
            assert_eq!(states, vec![ReplicaState::Routed], "XID {xid}/{raw}");
        }
    }
}

#[test]
fn a_recovery_action_read_with_memory_drains_peer_to_peer_or_evacuates() {
    let d = ScriptedDriver::new(gpus(2));
    let (mut s, _) = source(&d);
    d.script().gpus[1].recovery = Ok(3);
    let m = s.memory();
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].recovery, Some(RecoveryAction::None));
    assert_eq!(m[1].recovery, Some(RecoveryAction::DrainP2p));
    assert_eq!(m[0].driver_reserved, GIB, "NVML's reserved, carried");
    // Unreadable: no action, never a guess.
    d.script().gpus[1].recovery = Err(super::driver::DriverError::NotSupported);
    assert_eq!(s.memory()[1].recovery, None);
}

#[test]
fn unavailable_process_memory_is_carried_as_unknown() {
    let mut g = gpus(1);
    g[0].processes = vec![(4242, None), (4343, Some(3 * GIB))];
    g[0].memory.used = 40 * GIB;
    let d = ScriptedDriver::new(g);
    let (mut s, _) = source(&d);
    let m = s.memory();
    assert_eq!(m[0].processes, vec![(4242, None), (4343, Some(3 * GIB))]);
    assert_eq!(m[0].used, 40 * GIB);
}

fn mig_host() -> ScriptedDriver {
    let mut g = gpus(2);
    g[1].mig = Some(
        (0..2)
            .map(|gi| ScriptedMig {
                uuid: format!("MIG-1-{gi}"),
                gpu_instance: gi + 3,
                memory: super::driver::Memory {
                    total: 40 * GIB,
                    reserved: 0,
                    used: 0,
                },
                processes: Vec::new(),
            })
            .collect(),
    );
    ScriptedDriver::new(g)
}

#[test]
fn a_gpu_in_mig_mode_is_its_instances_and_an_instance_s_xid_stays_with_it() {
    let d = mig_host();
    let (mut s, devices) = source(&d);
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        vec!["GPU-0", "MIG-1-0", "MIG-1-1"],
        "the parent is no device"
    );
    for m in &devices[1..] {
        assert_eq!(m.memory_total, 40 * GIB);
        assert_eq!(m.mig.as_ref().map(|x| x.parent.as_str()), Some("GPU-1"));
    }
    // Memory is read per instance.
    assert_eq!(s.memory().len(), 3);
    // An XID in GPU instance 4 is MIG-1-1's; one for the whole GPU is the parent's.
    d.xid(1, 94, 4);
    d.xid(1, 79, WHOLE);
    let got = xids(&news(&mut s, 2, Duration::from_secs(10)));
    let who: Vec<&str> = got.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(who, vec!["MIG-1-1", "GPU-1"]);

    // The core: a reset-class XID on one instance leaves the other in service; the parent's
    // takes both out.
    let toml = format!(
        "{BASE}{}",
        gpu_model("m", "10GiB", "device_naming = \"uuid\"", "min = 1\nmax = 1")
    );
    let mut h = Harness::with_devices(&toml, devices.clone());
    h.send(Event::GpuXid {
        uuid: "MIG-1-1".into(),
        xid: 95,
        recovery: None,
    });
    let ok = |h: &Harness, u: &str| h.accepts(u);
    assert!(!ok(&h, "MIG-1-1") && ok(&h, "MIG-1-0") && ok(&h, "GPU-0"));
    h.send(Event::GpuXid {
        uuid: "GPU-1".into(),
        xid: 79,
        recovery: None,
    });
    assert!(!ok(&h, "MIG-1-0") && ok(&h, "GPU-0"));

    // A model that names devices by index never lands on an instance.
    let toml = format!(
        "{BASE}{}",
        gpu_model("ix", "10GiB", "", "min = 3\nmax = 3\nwarm_pool = 0")
    );
    let mut h = Harness::with_devices(&toml, devices);
    let first = read_all(&mut h, &mut s);
    h.settle(first);
    let placed = placed(&h);
    assert_eq!(placed.len(), 3);
    for gpus in placed {
        assert_eq!(
            gpus,
            vec!["GPU-0".to_string()],
            "never a MIG instance by index"
        );
    }
}

#[test]
fn a_gpu_in_mig_mode_without_instances_is_listed_faulted() {
    let mut g = gpus(1);
    g[0].mig = Some(Vec::new());
    let d = ScriptedDriver::new(g);
    let (_, devices) = source(&d);
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].fault, Some(GpuFault::MigWithoutInstances));
    assert!(devices[0]
        .fault
        .as_ref()
        .unwrap()
        .to_string()
        .contains("MIG"));
}

#[test]
fn a_gpu_lost_at_start_is_reported_once_and_takes_nothing() {
    let mut g = gpus(3);
    g[1].lost = true;
    let d = ScriptedDriver::new(g);
    let (mut s, devices) = source(&d);
    assert_eq!(devices.len(), 3, "listed, not dropped");
    assert_eq!(devices[1].uuid, "lost-1");
    assert_eq!(devices[1].fault, Some(GpuFault::Lost));
    assert!(devices[1]
        .fault
        .as_ref()
        .unwrap()
        .to_string()
        .starts_with("lost"));
    // Reported as XID 79 for it, once, however often it is asked about.
    let mut got = news(&mut s, 2, Duration::from_secs(5));
    for _ in 0..3 {
        s.memory();
        got.extend(news(&mut s, 1, Duration::from_millis(50)));
    }
    assert_eq!(xids(&got), vec![("lost-1".into(), 79, None)]);
    assert_eq!(s.memory().len(), 2, "the other two are read");
    // The core: it takes nothing.
    let toml = format!(
        "{BASE}{}",
        gpu_model(
            "m",
            "10GiB",
            "placement = \"spread\"",
            "min = 3\nmax = 3\nwarm_pool = 0"
        )
    );
    let mut h = Harness::with_devices(&toml, devices);
    let first = read_all(&mut h, &mut s);
    h.settle(first);
    assert_eq!(placed(&h).len(), 3);
    assert!(on_device(&h, "lost-1").is_empty());
}

#[test]
fn a_gpu_lost_later_keeps_its_uuid_and_is_read_again() {
    let d = ScriptedDriver::new(gpus(2));
    let (mut s, _) = source(&d);
    d.script().gpus[0].lost = true;
    // Found on the next memory reading (or event wait): XID 79 under its own UUID, once.
    s.memory();
    s.memory();
    let got = news(&mut s, 2, Duration::from_secs(5));
    assert_eq!(xids(&got), vec![("GPU-0".into(), 79, None)]);
    assert!(got.contains(&News::Reread));
    let inv = s.inventory().expect("NVML reads it again");
    assert_eq!(inv[0].uuid, "GPU-0");
    assert!(inv[0].fault.is_some());
    assert!(inv[1].fault.is_none());
}

#[test]
fn topology_comes_from_nvlink_and_the_common_ancestor() {
    let mut g = gpus(4);
    for (i, x) in g.iter_mut().enumerate() {
        x.bus_id = Some(format!("00000000:{:02X}:00.0", 0x10 + i));
        x.numa = Some((i / 2) as i64);
    }
    let d = ScriptedDriver::new(g);
    {
        let mut s = d.script();
        s.nvlink.insert((0, 3));
        s.nvlink.insert((1, 2));
        s.ancestor = Some(Link::HostBridge);
    }
    let (mut s, devices) = source(&d);
    assert_eq!(devices[0].topology.as_deref(), Some("numa0"));
    assert_eq!(devices[3].topology.as_deref(), Some("numa1"));
    assert_eq!(devices[0].link_to("GPU-3"), Some(Link::NvLink));
    assert_eq!(devices[0].link_to("GPU-1"), Some(Link::HostBridge));
    // A two-GPU replica takes a bridged pair, never 0 and 1.
    let toml = format!(
        "{BASE}{}",
        gpu_model("tp", "30GiB", "", "min = 1\nmax = 1\nwarm_pool = 0")
            .replace("gpus = 1", "gpus = 2")
    );
    let mut h = Harness::with_devices(&toml, devices);
    let first = read_all(&mut h, &mut s);
    h.settle(first);
    let r = h.in_state("tp", ReplicaState::Routed);
    let mut got = h.gpus_of(&r[0]);
    got.sort();
    assert_eq!(got, vec!["GPU-0", "GPU-3"]);
}

/// The monitor thread over a scripted driver, as the daemon starts it.
fn monitor(
    d: &ScriptedDriver,
) -> (
    NvmlInventory<ScriptedDriver>,
    crate::agent::gpu_monitor::MonitorHandle,
    tokio::sync::mpsc::Receiver<ShellMsg>,
) {
    let mut inv = NvmlInventory::with_driver(d.clone());
    let (tx, rx) = inbox::channel();
    let mut sink = MonitorSink::new(
        EventSink::new(tx),
        Arc::new(Attribution::new(CgroupIndex::default())),
    );
    sink.interval = Duration::from_millis(20);
    sink.inventory_interval = Duration::from_millis(50);
    let handle = inv.start_monitor(sink).expect("the monitor starts");
    (inv, handle, rx)
}

fn next_event(
    rx: &mut tokio::sync::mpsc::Receiver<ShellMsg>,
    within: Duration,
    want: impl Fn(&Event) -> bool,
) -> Event {
    let end = Instant::now() + within;
    let mut seen = VecDeque::new();
    while Instant::now() < end {
        match rx.try_recv() {
            Ok(ShellMsg::Event(ev)) if want(&ev) => return ev,
            Ok(ShellMsg::Event(ev)) => {
                seen.push_back(format!("{ev:?}"));
                if seen.len() > 5 {
                    seen.pop_front();
                }
            }
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    panic!("no such event within {within:?}; last seen: {seen:?}");
}

#[test]
fn a_device_that_disappears_is_sent_as_an_inventory_and_reservations_stay_with_their_uuid() {
    let d = ScriptedDriver::new(gpus(3));
    let (inv, _handle, mut rx) = monitor(&d);
    let devices = inv.devices.clone();
    let toml = format!(
        "{BASE}{}",
        gpu_model(
            "m",
            "30GiB",
            "placement = \"spread\"",
            "min = 3\nmax = 3\nwarm_pool = 0"
        )
    );
    let mut h = Harness::with_devices(&toml, devices);
    let mut first = Vec::new();
    for u in ["GPU-0", "GPU-1", "GPU-2"] {
        let ev = next_event(
            &mut rx,
            Duration::from_secs(20),
            |e| matches!(e, Event::GpuReading(r) if r.uuid == u),
        );
        first.extend(h.send(ev));
    }
    first.extend(h.send(Event::Tick));
    h.settle(first);
    let on = |h: &Harness, u: &str| on_device(h, u);
    let on2 = on(&h, "GPU-2");
    assert_eq!(on2.len(), 1);
    // GPU-0 disappears: NVML now numbers GPU-1 as 0 and GPU-2 as 1.
    d.script().gpus.remove(0);
    let ev = next_event(
        &mut rx,
        Duration::from_secs(20),
        |e| matches!(e, Event::Inventory(d) if d.len() == 2),
    );
    let Event::Inventory(list) = &ev else {
        unreachable!()
    };
    assert_eq!(
        list.iter()
            .map(|d| (d.index, d.uuid.as_str()))
            .collect::<Vec<_>>(),
        vec![(0, "GPU-1"), (1, "GPU-2")]
    );
    h.send(ev);
    // The replica on GPU-2 keeps its device and its reservation under the new numbering.
    assert_eq!(on(&h, "GPU-2"), on2);
    assert_eq!(h.reserved_on("GPU-2"), Some((30 * GIB, 1)));
    let first = h.log.clone();
    h.settle(first);
    // The one on GPU-0 is replaced on a device that is still there, and leaves.
    let routed: Vec<Vec<String>> = h
        .all_replicas()
        .into_iter()
        .filter(|r| r.0 == ReplicaState::Routed)
        .map(|r| r.1)
        .collect();
    assert_eq!(routed.len(), 3, "{routed:?}");
    assert!(routed.iter().all(|g| g != &vec!["GPU-0".to_string()]));
    let old = on(&h, "GPU-0");
    assert_eq!(old.len(), 1, "held until it has left");
    for id in old {
        h.exit(
            &id,
            ExitStatus::Signaled {
                signal: 15,
                core_dumped: false,
            },
        );
    }
    let out = h.send(Event::Tick);
    h.settle(out);
    assert_eq!(
        h.reserved_on("GPU-0"),
        None,
        "gone from the table once empty"
    );
}

#[test]
fn the_monitor_sends_xids_readings_and_a_lost_gpu_through_the_sink() {
    let mut g = gpus(2);
    g[0].memory.used = 5 * GIB;
    g[0].processes = vec![(std::process::id(), None)];
    let d = ScriptedDriver::new(g);
    let (_inv, _handle, mut rx) = monitor(&d);
    let ev = next_event(
        &mut rx,
        Duration::from_secs(20),
        |e| matches!(e, Event::GpuReading(r) if r.uuid == "GPU-0"),
    );
    let Event::GpuReading(r) = ev else {
        unreachable!()
    };
    assert_eq!((r.used, r.driver_reserved), (5 * GIB, GIB));
    assert_eq!(r.processes[0].bytes, None);
    d.script().gpus[1].recovery = Ok(1);
    d.xid(1, 154, WHOLE);
    next_event(
        &mut rx,
        Duration::from_secs(20),
        |e| matches!(e, Event::GpuXid { uuid, xid: 154, recovery: Some(RecoveryAction::GpuReset) } if uuid == "GPU-1"),
    );
    d.script().gpus[0].lost = true;
    next_event(
        &mut rx,
        Duration::from_secs(20),
        |e| matches!(e, Event::GpuXid { uuid, xid: 79, .. } if uuid == "GPU-0"),
    );
    next_event(
        &mut rx,
        Duration::from_secs(20),
        |e| matches!(e, Event::Inventory(d) if d[0].fault.is_some()),
    );
}

#[test]
fn event_bits_the_driver_cannot_deliver_are_not_asked_for() {
    let mut g = gpus(2);
    g[1].supported_events = event_bits::DOUBLE_BIT_ECC_ERROR;
    let d = ScriptedDriver::new(g);
    let (mut s, _) = source(&d);
    d.event(
        1,
        RawEvent {
            types: event_bits::DOUBLE_BIT_ECC_ERROR,
            data: 0,
            gpu_instance: WHOLE,
        },
    );
    // A double-bit ECC event is no XID of its own: it asks for a fresh reading.
    let got = news(&mut s, 1, Duration::from_secs(5));
    assert_eq!(got, vec![News::Reread]);
}

#[test]
fn start_up_placement_waits_for_the_first_memory_reading() {
    let mut g = gpus(2);
    // Someone else holds 70 GiB of GPU-0 before hearth starts.
    g[0].memory.used = 70 * GIB;
    g[0].processes = vec![(99999, Some(70 * GIB))];
    let d = ScriptedDriver::new(g);
    let (mut s, devices) = source(&d);
    let toml = format!(
        "{BASE}{}",
        gpu_model("m", "30GiB", "", "min = 1\nmax = 1\nwarm_pool = 0")
    );
    let mut h = Harness::with_devices(&toml, devices);
    assert!(placed(&h).is_empty(), "nothing placed before a reading");
    // GPU-1's reading alone is not enough: GPU-0's room is still unknown.
    let mut readings = s.memory();
    let zero = readings.remove(0);
    h.send(reading_event(readings.remove(0)));
    h.send(Event::Tick);
    assert!(placed(&h).is_empty(), "nothing placed before every reading");
    let first = h.send(reading_event(zero));
    h.settle(first);
    assert_eq!(
        placed(&h),
        vec![vec!["GPU-1".to_string()]],
        "not onto the full GPU-0"
    );
}

#[test]
fn driver_reserved_memory_is_never_capacity() {
    let mut g = gpus(1);
    g[0].memory.reserved = 2 * GIB;
    let d = ScriptedDriver::new(g);
    let (mut s, devices) = source(&d);
    // 80 GiB total, 2 GiB the driver's: a 79 GiB replica does not fit, a 78 GiB one does.
    for (mem, fits) in [("79GiB", false), ("78GiB", true)] {
        let toml = format!(
            "{BASE}{}",
            gpu_model("m", mem, "", "min = 1\nmax = 1\nwarm_pool = 0")
        );
        let mut h = Harness::with_devices(&toml, devices.clone());
        let first = read_all(&mut h, &mut s);
        h.settle(first);
        assert_eq!(placed(&h).len(), usize::from(fits), "{mem}");
    }
}
