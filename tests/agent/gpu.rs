//! GPU integration tests with the real binary and real toy-server processes: the inventory
//! backends without NVML, placement (CUDA_VISIBLE_DEVICES), cordon with evacuation under a watch,
//! priority reclaim after a reload, weight prefetch. The NVML path itself (scripted driver,
//! monitor, core) is tested in src/agent/nvml/tests.rs.

use std::time::Duration;

use testkit::procs::{alive, env_var};
use testkit::status::{gpus as gpus_of, id, in_state, model, pid, replicas};
use testkit::*;

const LONG: Duration = Duration::from_secs(60);
const GIB: u64 = 1 << 30;

/// A toy model on one GPU with `mem_gib` of its memory, packed, at `priority`; its warm-up is a
/// real completion, its liveness /health every second.
fn toy(name: &str, mem_gib: u64, priority: i32, (min, max, pool): (u32, u32, u32)) -> Model {
    let mut m = Model::toy(name, &["--load-time", "200ms", "--service-time", "10ms"])
        .gpus(1, &format!("{mem_gib}GiB"))
        .scale(min, max, pool)
        .stop_grace("5s")
        .startup_timeout("30s")
        .liveness("1s", "1s", 3)
        .drain_timeout("10s");
    m.placement = Some("pack".into());
    m.priority = Some(priority);
    m.scaling.target_wait = None;
    m.scaling.down_stabilization = None;
    m.scaling.down_step = None;
    m
}

/// A daemon with `devices` (uuid, memory) declared for `backend`.
fn gpu_daemon(backend: &str, devices: &[(&str, &str)]) -> DaemonBuilder {
    Daemon::builder()
        .tick("50ms")
        .gpus(backend, devices)
        .ports(10)
}

/// Replicas of `name` in `state`: (id, pid, GPU uuids).
fn placed(status: &Value, name: &str, state: &str) -> Vec<(String, i32, Vec<String>)> {
    in_state(status, name, state)
        .iter()
        .map(|r| (id(r), pid(r), gpus_of(r)))
        .collect()
}

fn nvml_present() -> bool {
    hearth::agent::nvml::NvmlInventory::open().is_ok()
}

#[test]
fn auto_without_nvml_falls_back_to_the_declared_devices_and_says_why() {
    if !needs(!nvml_present(), || {
        "a host without NVML (NVML is usable here: the fallback cannot be shown)".into()
    }) {
        return;
    }
    let d = gpu_daemon(
        "auto",
        &[("GPU-static-a", "80GiB"), ("GPU-static-b", "40GiB")],
    )
    .start();
    let g = d.gpus();
    let uuids: Vec<&str> = g.iter().filter_map(|g| g["uuid"].as_str()).collect();
    assert_eq!(uuids, vec!["GPU-static-a", "GPU-static-b"]);
    assert_eq!(g[1]["memory_total"], 40 * GIB);
    assert_eq!(
        g[0]["memory_used"],
        Value::Null,
        "no NVML: memory use unknown"
    );
    let log = wait_until("the inventory line in the log", LONG, || {
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
    let out = d.cli_ok(&["gpus"]);
    assert!(
        out.contains("GPU-static-a") && out.contains("FOREIGN"),
        "{out}"
    );
}

#[test]
fn backend_nvml_without_nvml_exits_1_and_says_so() {
    if !needs(!nvml_present(), || {
        "a host without NVML (NVML is usable here: backend = \"nvml\" would start)".into()
    }) {
        return;
    }
    let mut d = gpu_daemon("nvml", &[("GPU-static-a", "80GiB")]).spawn();
    let status = d.wait_exit(LONG).expect("the daemon to exit");
    let stderr = d.log();
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("backend = \"nvml\"") && stderr.contains("NVML"),
        "the message says NVML is what is missing: {stderr}"
    );
    assert!(!d.socket.exists(), "nothing bound");
}

#[test]
fn replicas_see_their_device_and_cordon_evacuate_moves_them_with_routed_never_below_min() {
    let d = gpu_daemon(
        "static",
        &[("GPU-test-0", "80GiB"), ("GPU-test-1", "80GiB")],
    )
    .model(toy("m", 30, 0, (2, 4, 0)))
    .start();
    let before = d.wait_status("2 routed replicas", LONG, |st| {
        let r = placed(st, "m", "routed");
        (r.len() == 2).then_some(r)
    });
    for (id, pid, gpus) in &before {
        assert_eq!(
            gpus,
            &vec!["GPU-test-0".to_string()],
            "pack: both on device 0"
        );
        assert_eq!(
            env_var(*pid, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("0"),
            "{id} sees its device by index (device_naming = \"index\", the default)"
        );
        assert_eq!(
            env_var(*pid, "CUDA_DEVICE_ORDER").as_deref(),
            Some("PCI_BUS_ID"),
            "{id}: CUDA numbers devices in NVML's (PCI bus) order"
        );
        assert_eq!(
            env_var(*pid, "NVIDIA_VISIBLE_DEVICES").as_deref(),
            Some("GPU-test-0")
        );
    }
    let g = d.gpus();
    assert_eq!(g[0]["memory_reserved"], 60 * GIB);
    assert_eq!(g[0]["replicas"].as_array().unwrap().len(), 2);

    let watch = d.watch(Some("m"));
    d.cli_ok(&["cordon", "0", "--evacuate", "--reason", "maintenance"]);

    let mut old: Vec<String> = before.iter().map(|r| r.0.clone()).collect();
    old.sort();
    let after = d.wait_status("both replicas moved to device 1", LONG, |st| {
        let routed = placed(st, "m", "routed");
        let all = replicas(st, "m").len();
        let moved = routed.len() == 2
            && all == 2
            && routed
                .iter()
                .all(|r| r.2 == vec!["GPU-test-1".to_string()] && !old.contains(&r.0));
        moved.then_some(routed)
    });
    for (id, pid, _) in &after {
        assert_eq!(
            env_var(*pid, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("1"),
            "{id}"
        );
        assert_eq!(
            env_var(*pid, "NVIDIA_VISIBLE_DEVICES").as_deref(),
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
    let last = sets.last().unwrap().clone();
    let mut new: Vec<String> = after.iter().map(|r| r.0.clone()).collect();
    new.sort();
    assert_eq!(last, new);
    // The old processes are gone.
    for (_, pid, _) in &before {
        wait_until("an evacuated replica's process to exit", LONG, || {
            (!alive(*pid)).then_some(())
        });
    }

    let g = d.gpus();
    assert_eq!(g[0]["cordoned"], true);
    assert_eq!(g[0]["healthy"], true);
    assert_eq!(g[0]["note"], "maintenance");
    assert_eq!(g[0]["replicas"], json!([]));
    assert_eq!(g[0]["memory_reserved"], 0);
    assert_eq!(g[1]["memory_reserved"], 60 * GIB);
    let out = d.cli_ok(&["gpus"]);
    let row0 = out.lines().find(|l| l.contains("GPU-test-0")).unwrap();
    assert!(row0.contains("maintenance"), "{out}");
    let out = d.cli_ok(&["gpus", "--json"]);
    let parsed: Vec<Value> = serde_json::from_str(&out).expect("gpus --json is JSON");
    assert_eq!(parsed[0]["cordoned"], true);
    assert!(parsed[0].get("memory_foreign").is_some());

    // Uncordon: the device takes replicas again (nothing moves back by itself).
    d.cli_ok(&["uncordon", "GPU-test-0"]);
    let g = d.gpus();
    assert_eq!(
        (g[0]["cordoned"].clone(), g[0]["note"].clone()),
        (json!(false), Value::Null)
    );
}

#[test]
fn a_higher_priority_model_added_by_reload_reclaims_a_warm_replica_on_a_full_device() {
    let mut d = gpu_daemon("static", &[("GPU-one", "80GiB")])
        .model(toy("low", 40, 0, (1, 2, 1)))
        .start();
    let (routed, warm) = d.wait_status("low: 1 routed + 1 warm", LONG, |st| {
        let r = placed(st, "low", "routed");
        let w = placed(st, "low", "warm");
        (r.len() == 1 && w.len() == 1).then_some((r, w))
    });
    let g = d.gpus();
    assert_eq!(g[0]["memory_reserved"], 80 * GIB, "the device is full");

    let watch = d.watch(Some("low"));
    d.rewrite_config(|c| c.models.push(toy("high", 40, 10, (1, 1, 0))));
    d.cli_ok(&["reload"]);

    let high_routed = d.wait_status("high routed on the reclaimed GPU", LONG, |st| {
        let h = placed(st, "high", "routed");
        (h.len() == 1).then_some(h)
    });
    assert_eq!(high_routed[0].2, vec!["GPU-one".to_string()]);
    let st = d.status();
    assert_eq!(
        placed(&st, "low", "routed"),
        routed,
        "low's routed replica is untouched"
    );
    let low_ids: Vec<String> = replicas(&st, "low").iter().map(id).collect();
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
    let b = gpu_daemon("static", &[("GPU-p", "80GiB")]);
    let weights = b.dir().join("weights");
    std::fs::create_dir(&weights).unwrap();
    let file = weights.join("model-00001.safetensors");
    std::fs::write(&file, vec![7u8; 24 << 20]).unwrap();
    let missing = format!("{}/nothing-*.bin", weights.display());
    let mut m = toy("w", 10, 0, (1, 1, 0));
    let load_time = m.command.iter().position(|a| a == "--load-time").unwrap();
    m.command[load_time] = "--read-file".into();
    m.command[load_time + 1] = file.display().to_string();
    m.prefetch = vec![
        format!("{}/*.safetensors", weights.display()),
        missing.clone(),
    ];
    let d = b.model(m).start();
    d.wait_status("the replica routed", LONG, |st| {
        (in_state(st, "w", "routed").len() == 1).then_some(())
    });
    let log = wait_until("the prefetch lines in the log", LONG, || {
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

/// `examples/vllm.toml`'s model, with `vllm` replaced by a fake that reads CUDA_VISIBLE_DEVICES
/// as vLLM does (tests/fixtures/vllm/vllm), on two declared 80 GiB devices; `naming` set when
/// given.
fn example_vllm(naming: Option<&str>) -> Model {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/vllm.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let cfg = hearth::config::Config::parse(&text, &path).expect("the example parses");
    let ex = &cfg.models[0];
    let l = &ex.launch;
    assert_eq!(l.command[0], "vllm", "the example runs vllm");
    let fake = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm/vllm");
    let mut m = Model::toy(&ex.name, &[]);
    m.command = std::iter::once(fake.display().to_string())
        .chain(l.command.iter().skip(1).cloned())
        .collect();
    m.env = l.env.clone().into_iter().collect();
    m.env
        .push(("HEARTH_BIN".into(), testkit::hearth().display().to_string()));
    m.gpus = l.gpus;
    m.gpu_memory = Some(format!("{}GiB", l.gpu_memory.unwrap() >> 30));
    m.placement = Some("pack".into());
    m.device_naming = naming.map(str::to_string);
    m.warmup.body = l.warmup.body.clone().unwrap();
    m.warmup.startup_timeout = "30s".into();
    m.scaling.min = ex.scaling.min;
    m.scaling.max = ex.scaling.max;
    m.scaling.warm_pool = 1;
    m.scaling.target_wait = None;
    m
}

#[test]
fn a_fake_vllm_from_the_example_s_settings_starts_on_hearth_s_device_names() {
    let d = gpu_daemon(
        "static",
        &[("GPU-vllm-0", "80GiB"), ("GPU-vllm-1", "80GiB")],
    )
    .model(example_vllm(None))
    .start();
    // min 1 and warm_pool 1: one routed, one warm, both packed on the first device (38 GiB each).
    d.wait_settled("llama-8b", 1, 1, LONG);
    let st = d.status();
    let all: Vec<(String, i32, Vec<String>)> = ["routed", "warm"]
        .iter()
        .flat_map(|s| placed(&st, "llama-8b", s))
        .collect();
    assert_eq!(all.len(), 2);
    for (id, pid, gpus) in &all {
        assert_eq!(gpus, &vec!["GPU-vllm-0".to_string()], "{id}");
        assert_eq!(
            env_var(*pid, "CUDA_VISIBLE_DEVICES").as_deref(),
            Some("0"),
            "{id}"
        );
        assert_eq!(
            env_var(*pid, "CUDA_DEVICE_ORDER").as_deref(),
            Some("PCI_BUS_ID"),
            "{id}"
        );
    }
    // Replicas write to their own log (journald or state_dir/logs), not the daemon's.
    for (id, _, _) in &all {
        let log = d.replica_log(id);
        assert!(
            log.contains("vllm (fake): CUDA_VISIBLE_DEVICES=0"),
            "the fake read the variable ({id}):\n{log}"
        );
    }
}

#[test]
fn the_fake_vllm_fails_on_uuids_as_vllm_does() {
    // The proof that the test above can fail: named by UUID, vLLM's int() refuses the value.
    let d = gpu_daemon("static", &[("GPU-vllm-0", "80GiB")])
        .model(example_vllm(Some("uuid")))
        .start();
    let log = wait_until("the fake's ValueError in the replica's log", LONG, || {
        let log = d.replica_log("llama-8b-1");
        log.contains("invalid literal for int() with base 10: 'GPU-vllm-0'")
            .then_some(log)
    });
    let st = d.status();
    assert!(in_state(&st, "llama-8b", "routed").is_empty(), "{log}");
}
