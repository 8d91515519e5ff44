//! GPU integration tests with the real binary and real toy-server processes: the inventory
//! backends without NVML, placement (CUDA_VISIBLE_DEVICES), cordon with evacuation under a watch,
//! priority reclaim after a reload, weight prefetch; and the GPU monitor's shell path (pgid
//! mapping, XIDs, memory) driven by a scripted source in an in-process daemon.

mod gpu_support;

use std::process::{Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use gpu_support::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

fn nvml_present() -> bool {
    hearth::agent::nvml::NvmlInventory::open().is_ok()
}

#[test]
fn auto_without_nvml_falls_back_to_the_declared_devices_and_says_why() {
    if nvml_present() {
        eprintln!("NVML is usable on this host: the fallback cannot be shown here");
        return;
    }
    let env = Env::new((31300, 31309));
    // No models, said explicitly (a file without [[model]] must say `model = []`).
    let config = env.config("auto", &[("GPU-static-a", 80), ("GPU-static-b", 40)], "");
    env.write_config(&format!("model = []\n{config}"));
    let d = Daemon::start(env);
    let g = gpus(&d.socket());
    let uuids: Vec<&str> = g.iter().filter_map(|g| g["uuid"].as_str()).collect();
    assert_eq!(uuids, vec!["GPU-static-a", "GPU-static-b"]);
    assert_eq!(g[1]["memory_total"], 40 * GIB);
    assert_eq!(
        g[0]["memory_used"],
        Value::Null,
        "no NVML: memory use unknown"
    );
    let log = wait_for("the inventory line in the log", LONG, || {
        let log = d.log();
        log.contains("GPU inventory").then_some(log)
    });
    assert!(
        log.contains("static: 2 device(s)") && log.contains("NVML is not usable"),
        "the log says which inventory and why:\n{log}"
    );
    assert!(
        log.contains("libnvidia-ml") || log.contains("driver") || log.contains("permission"),
        "the log names the reason:\n{log}"
    );
    let (st, out, err) = cli(&d.socket(), &["gpus"]);
    assert!(st.success(), "{err}");
    assert!(
        out.contains("GPU-static-a") && out.contains("FOREIGN"),
        "{out}"
    );
}

#[test]
fn backend_nvml_without_nvml_exits_1_and_says_so() {
    if nvml_present() {
        eprintln!("NVML is usable on this host: backend = \"nvml\" would start");
        return;
    }
    let env = Env::new((31310, 31319));
    let config = env.config("nvml", &[("GPU-static-a", 80)], "");
    env.write_config(&format!("model = []\n{config}"));
    let mut child = Command::new(HEARTH)
        .args(["daemon", "--config"])
        .arg(env.config_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hearth daemon");
    let status = wait_for("the daemon to exit", LONG, || child.try_wait().unwrap());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("backend = \"nvml\"") && stderr.contains("NVML"),
        "the message says NVML is what is missing: {stderr}"
    );
    assert!(!env.socket().exists(), "nothing bound");
}

#[test]
fn replicas_see_their_device_and_cordon_evacuate_moves_them_with_routed_never_below_min() {
    let env = Env::new((31100, 31149));
    let models = toy_model("m", 30, 0, "min = 2\nmax = 4\nwarm_pool = 0");
    env.write_config(&env.config("static", &[("GPU-test-0", 80), ("GPU-test-1", 80)], &models));
    let d = Daemon::start(env);
    let before = d.wait_status("2 routed replicas", LONG, |st| {
        let r = replicas(st, "m", "routed");
        (r.len() == 2).then_some(r)
    });
    for (id, pid, gpus) in &before {
        assert_eq!(
            gpus,
            &vec!["GPU-test-0".to_string()],
            "pack: both on device 0"
        );
        assert_eq!(
            environ(*pid, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("GPU-test-0"),
            "{id} sees its device by UUID"
        );
        assert_eq!(
            environ(*pid, "NVIDIA_VISIBLE_DEVICES").as_deref(),
            Some("GPU-test-0")
        );
    }
    let g = gpus(&d.socket());
    assert_eq!(g[0]["memory_reserved"], 60 * GIB);
    assert_eq!(g[0]["replicas"].as_array().unwrap().len(), 2);

    let watch = Watch::open(&d.socket(), Some("m"));
    let (st, _, err) = cli(
        &d.socket(),
        &["cordon", "0", "--evacuate", "--reason", "maintenance"],
    );
    assert!(st.success(), "cordon: {err}");

    let old: Vec<String> = before.iter().map(|r| r.0.clone()).collect();
    let after = d.wait_status("both replicas moved to device 1", LONG, |st| {
        let routed = replicas(st, "m", "routed");
        let all = model(st, "m")["replicas"].as_array().unwrap().len();
        let moved = routed.len() == 2
            && all == 2
            && routed
                .iter()
                .all(|r| r.2 == vec!["GPU-test-1".to_string()] && !old.contains(&r.0));
        moved.then_some(routed)
    });
    for (id, pid, _) in &after {
        assert_eq!(
            environ(*pid, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("GPU-test-1"),
            "{id}"
        );
    }
    // The whole time, the routed set the routers saw never dropped below min.
    let sets = watch.routed_sets("m");
    eprintln!("routed sets seen by the watch: {sets:?}");
    assert!(sets.len() >= 2, "the move was published: {sets:?}");
    assert!(
        sets.iter().all(|s| s.len() >= 2),
        "routed never below min = 2: {sets:?}"
    );
    assert_eq!(sets[0], old, "the snapshot is the old set");
    let mut last = sets.last().unwrap().clone();
    last.sort();
    let mut new: Vec<String> = after.iter().map(|r| r.0.clone()).collect();
    new.sort();
    assert_eq!(last, new);
    // The old processes are gone.
    for (_, pid, _) in &before {
        wait_for("an evacuated replica's process to exit", LONG, || {
            (!std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")))
            .then_some(())
        });
    }

    let g = gpus(&d.socket());
    assert_eq!(g[0]["cordoned"], true);
    assert_eq!(g[0]["healthy"], true);
    assert_eq!(g[0]["note"], "maintenance");
    assert_eq!(g[0]["replicas"], json!([]));
    assert_eq!(g[0]["memory_reserved"], 0);
    assert_eq!(g[1]["memory_reserved"], 60 * GIB);
    let (st, out, _) = cli(&d.socket(), &["gpus"]);
    assert!(st.success());
    let row0 = out.lines().find(|l| l.contains("GPU-test-0")).unwrap();
    assert!(row0.contains("maintenance"), "{out}");
    let (st, out, _) = cli(&d.socket(), &["gpus", "--json"]);
    assert!(st.success());
    let parsed: Vec<Value> = serde_json::from_str(&out).expect("gpus --json is JSON");
    assert_eq!(parsed[0]["cordoned"], true);
    assert!(parsed[0].get("memory_foreign").is_some());

    // Uncordon: the device takes replicas again (nothing moves back by itself).
    let (st, _, err) = cli(&d.socket(), &["uncordon", "GPU-test-0"]);
    assert!(st.success(), "{err}");
    let g = gpus(&d.socket());
    assert_eq!(
        (g[0]["cordoned"].clone(), g[0]["note"].clone()),
        (json!(false), Value::Null)
    );
}

#[test]
fn a_higher_priority_model_added_by_reload_reclaims_a_warm_replica_on_a_full_device() {
    let env = Env::new((31150, 31199));
    let low = toy_model("low", 40, 0, "min = 1\nmax = 2\nwarm_pool = 1");
    env.write_config(&env.config("static", &[("GPU-one", 80)], &low));
    let d = Daemon::start(env);
    let (routed, warm) = d.wait_status("low: 1 routed + 1 warm", LONG, |st| {
        let r = replicas(st, "low", "routed");
        let w = replicas(st, "low", "warm");
        (r.len() == 1 && w.len() == 1).then_some((r, w))
    });
    let g = gpus(&d.socket());
    assert_eq!(g[0]["memory_reserved"], 80 * GIB, "the device is full");

    let watch = Watch::open(&d.socket(), Some("low"));
    let high = toy_model("high", 40, 10, "min = 1\nmax = 1\nwarm_pool = 0");
    d.env.write_config(
        &d.env
            .config("static", &[("GPU-one", 80)], &format!("{low}{high}")),
    );
    let (st, _, err) = cli(&d.socket(), &["reload"]);
    assert!(st.success(), "reload: {err}");

    let high_routed = d.wait_status("high routed on the reclaimed GPU", LONG, |st| {
        let h = replicas(st, "high", "routed");
        (h.len() == 1).then_some(h)
    });
    assert_eq!(high_routed[0].2, vec!["GPU-one".to_string()]);
    let st = d.status();
    assert_eq!(
        replicas(&st, "low", "routed"),
        routed,
        "low's routed replica is untouched"
    );
    let low_ids: Vec<String> = model(&st, "low")["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str().map(String::from))
        .collect();
    assert!(
        !low_ids.contains(&warm[0].0),
        "the warm replica was reclaimed: {low_ids:?}"
    );
    assert_eq!(model(&st, "low")["health"], "no_capacity", "{st}");
    let sets = watch.routed_sets("low");
    assert!(
        sets.iter().all(|s| s == &vec![routed[0].0.clone()]),
        "low's routed set never changed: {sets:?}"
    );
    let log = d.log();
    assert!(
        log.contains("GPU reclaimed by model high"),
        "the reclaim is logged:\n{log}"
    );
}

#[test]
fn prefetch_reads_the_weights_beside_the_server_start_and_warns_about_missing_files() {
    let env = Env::new((31250, 31299));
    let weights = env.dir.path().join("weights");
    std::fs::create_dir(&weights).unwrap();
    let file = weights.join("model-00001.safetensors");
    std::fs::write(&file, vec![7u8; 24 << 20]).unwrap();
    let missing = format!("{}/nothing-*.bin", weights.display());
    let m = toy_model("w", 10, 0, "min = 1\nmax = 1\nwarm_pool = 0")
        .replace(
            "\"--load-time\", \"200ms\"",
            &format!("\"--read-file\", \"{}\"", file.display()),
        )
        .replace(
            "priority = 0",
            &format!(
                "priority = 0\nprefetch = [\"{}/*.safetensors\", \"{missing}\"]",
                weights.display()
            ),
        );
    env.write_config(&env.config("static", &[("GPU-p", 80)], &m));
    let d = Daemon::start(env);
    d.wait_status("the replica routed", LONG, |st| {
        (replicas(st, "w", "routed").len() == 1).then_some(())
    });
    let log = wait_for("the prefetch lines in the log", LONG, || {
        let log = d.log();
        log.contains("prefetched").then_some(log)
    });
    assert!(
        log.contains("prefetching 24MiB of weights"),
        "start logged:\n{log}"
    );
    assert!(
        log.contains("prefetched 24MiB in 1 file(s)"),
        "end logged:\n{log}"
    );
    assert!(
        log.contains(&format!("prefetch: nothing read for {missing}")) && log.contains("WARN"),
        "a missing glob is a warning:\n{log}"
    );
    // The prefetch runs beside the spawn, never in front of it: the server starts at once.
    assert!(log.contains("spawned:"), "the server was started:\n{log}");
}

// ---- the monitor's shell path, driven by a script, in an in-process daemon ------------------

mod scripted {
    use super::*;
    use hearth::agent::daemon::Daemon as HearthDaemon;
    use hearth::agent::gpu_monitor::{
        self, DeviceMemory, GpuSource, MonitorHandle, MonitorSink, Xid,
    };
    use hearth::agent::inventory::Inventory;
    use hearth::core::GpuDevice;

    pub enum Reading {
        Memory(DeviceMemory),
        Xid(Xid),
    }

    /// XIDs as the test sends them; memory as last sent, per device, on every reading.
    struct ChannelSource {
        rx: std_mpsc::Receiver<Reading>,
        memory: Vec<DeviceMemory>,
    }

    impl GpuSource for ChannelSource {
        fn memory(&mut self) -> Vec<DeviceMemory> {
            self.memory.clone()
        }
        fn wait_xid(&mut self, timeout: Duration) -> Result<Option<Xid>, String> {
            match self.rx.recv_timeout(timeout) {
                Ok(Reading::Xid(x)) => Ok(Some(x)),
                Ok(Reading::Memory(m)) => {
                    self.memory.retain(|d| d.uuid != m.uuid);
                    self.memory.push(m);
                    Ok(None)
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => Ok(None),
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(timeout);
                    Ok(None)
                }
            }
        }
    }

    pub struct ScriptedInventory {
        pub devices: Vec<GpuDevice>,
        pub feed: Option<std_mpsc::Receiver<Reading>>,
    }

    impl Inventory for ScriptedInventory {
        fn describe(&self) -> String {
            format!("scripted: {} device(s)", self.devices.len())
        }
        fn devices(&mut self) -> Vec<GpuDevice> {
            self.devices.clone()
        }
        fn start_monitor(&mut self, sink: MonitorSink) -> Option<MonitorHandle> {
            let rx = self.feed.take()?;
            let sink = MonitorSink {
                interval: Duration::from_millis(100),
                ..sink
            };
            gpu_monitor::spawn("scripted-gpu", sink, move |sink| {
                let mut source = ChannelSource {
                    rx,
                    memory: Vec::new(),
                };
                gpu_monitor::pump(&mut source, &sink, &gpu_monitor::pgid_of);
            })
            .ok()
        }
    }

    /// The daemon on a runtime of its own thread; stopped (and its replicas with it) on drop.
    pub struct InProcess {
        pub env: Env,
        stop: tokio::sync::mpsc::Sender<bool>,
        thread: Option<std::thread::JoinHandle<()>>,
        pub pids: Pids,
    }

    impl InProcess {
        pub fn start(env: Env, inventory: ScriptedInventory) -> InProcess {
            let config = hearth::config::Config::load(&env.config_path()).expect("config");
            let config_path = env.config_path();
            let socket = env.socket();
            let (stop, stop_rx) = tokio::sync::mpsc::channel(4);
            let (_hup, hup_rx) = tokio::sync::mpsc::channel(4);
            let thread = std::thread::spawn(move || {
                let _hup = _hup;
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = hearth::agent::control::bind(&socket).expect("bind");
                    let log =
                        hearth::agent::logging::LogControl::detached(&config.daemon.log_level);
                    let d = HearthDaemon {
                        config,
                        config_path,
                        inventory: Box::new(inventory),
                        notifier: hearth::agent::notify::Notifier::disabled(),
                        log,
                    };
                    d.run(listener, None, stop_rx, hup_rx)
                        .await
                        .expect("daemon ran");
                });
            });
            let p = InProcess {
                env,
                stop,
                thread: Some(thread),
                pids: Pids::default(),
            };
            let socket = p.env.socket();
            wait_for("the in-process daemon's socket", LONG, || {
                std::os::unix::net::UnixStream::connect(&socket).ok()
            });
            p
        }
        pub fn status(&self) -> Value {
            let st = status(&self.env.socket());
            self.pids.note(&st);
            st
        }
    }

    impl Drop for InProcess {
        fn drop(&mut self) {
            let _ = self.stop.try_send(false);
            let _ = self.stop.try_send(true);
            if let Some(t) = self.thread.take() {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !t.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if t.is_finished() {
                    let _ = t.join();
                }
            }
            self.pids.kill_all();
        }
    }
}

#[test]
fn scripted_xids_and_memory_readings_go_through_the_monitor_to_status_and_placement() {
    use hearth::agent::gpu_monitor::{DeviceMemory, Xid};
    use hearth::core::GpuDevice;
    use scripted::*;

    let env = Env::new((31200, 31249));
    let m = toy_model("m", 30, 0, "min = 1\nmax = 2\nwarm_pool = 0");
    // The daemon section comes from the config; the devices from the scripted inventory.
    env.write_config(&env.config("auto", &[], &m));
    let devices: Vec<GpuDevice> = (0..2)
        .map(|i| GpuDevice {
            index: i,
            uuid: format!("GPU-s-{i}"),
            name: "Scripted H100".into(),
            memory_total: 80 * GIB,
            memory_foreign: 0,
            topology: Some("numa0".into()),
        })
        .collect();
    let (feed, rx) = std_mpsc::channel();
    let d = InProcess::start(
        env,
        ScriptedInventory {
            devices,
            feed: Some(rx),
        },
    );
    let socket = d.env.socket();
    let wait = |what: &str, f: &dyn Fn(&Value) -> bool| {
        wait_for(what, LONG, || {
            let st = d.status();
            f(&st).then_some(st)
        })
    };
    let st = wait("one routed replica", &|st| {
        replicas(st, "m", "routed").len() == 1
    });
    let (id, pid, gpus0) = replicas(&st, "m", "routed").remove(0);
    assert_eq!(gpus0, vec!["GPU-s-0".to_string()]);

    // 50 GiB used on device 0: 20 by the replica's process group, 30 by this test process
    // (someone else's). The monitor maps pids to groups; the core sees what is foreign.
    feed.send(Reading::Memory(DeviceMemory {
        uuid: "GPU-s-0".into(),
        used: 50 * GIB,
        processes: vec![(pid, 20 * GIB), (std::process::id(), 30 * GIB)],
    }))
    .unwrap();
    let g = wait_for("the memory reading in gpus", LONG, || {
        let g = gpus(&socket);
        (g[0]["memory_used"] == 50 * GIB).then_some(g)
    });
    assert_eq!(g[0]["memory_foreign"], 30 * GIB, "{g:?}");
    assert_eq!(g[0]["topology"], "numa0");
    assert_eq!(g[1]["memory_used"], Value::Null, "no reading for device 1");

    // An application XID is logged only; a critical one evacuates the device.
    feed.send(Reading::Xid(Xid {
        uuid: "GPU-s-0".into(),
        xid: 13,
    }))
    .unwrap();
    feed.send(Reading::Memory(DeviceMemory {
        uuid: "GPU-s-0".into(),
        used: 51 * GIB,
        processes: vec![(pid, 21 * GIB)],
    }))
    .unwrap();
    let g = wait_for("the second memory reading", LONG, || {
        let g = gpus(&socket);
        (g[0]["memory_used"] == 51 * GIB).then_some(g)
    });
    assert_eq!(g[0]["healthy"], true, "XID 13 leaves the device in service");
    assert_eq!(g[0]["memory_foreign"], 30 * GIB);

    feed.send(Reading::Xid(Xid {
        uuid: "GPU-s-0".into(),
        xid: 79,
    }))
    .unwrap();
    let st = wait("the replica replaced on device 1", &|st| {
        let routed = replicas(st, "m", "routed");
        routed.len() == 1
            && routed[0].2 == vec!["GPU-s-1".to_string()]
            && model(st, "m")["replicas"].as_array().unwrap().len() == 1
    });
    assert_ne!(replicas(&st, "m", "routed")[0].0, id);
    let g = gpus(&socket);
    assert_eq!(g[0]["healthy"], false);
    assert_eq!(g[0]["note"], "critical XID 79");
    assert_eq!(g[0]["replicas"], json!([]));
}
