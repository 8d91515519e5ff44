//! Launch identity: the launch spec, every field of it, and nothing else. A change to any of its
//! fields rolls the model over; a change anywhere else keeps every replica, and keeps a rollout
//! under way.

use std::time::Duration;

use super::super::harness::{signals, spawns, Harness};
use super::super::replica::Replica;
use super::super::*;
use super::cfg;
use crate::config::{
    Config, DeviceNaming, LaunchSpec, LivenessConfig, ModelConfig, Placement, ScalingConfig,
    ScrapeFormat, SignalConfig, WarmupConfig,
};

/// Every launch spec that differs from `l` in exactly one field (each field of the warm-up on its
/// own). The patterns name every field without `..`: a field added to `LaunchSpec` or
/// `WarmupConfig` does not compile here until it is named, and a named field no change uses is an
/// unused variable, which clippy (`-D warnings`) refuses.
fn launch_changes(l: &LaunchSpec) -> Vec<(&'static str, LaunchSpec)> {
    let LaunchSpec {
        version,
        command,
        env,
        user,
        gpus,
        gpu_memory,
        placement,
        device_naming,
        prefetch,
        warmup,
    } = l.clone();
    let WarmupConfig {
        method,
        url,
        body,
        headers,
        expect_status,
        expect_body,
        timeout,
        startup_timeout,
        recheck,
    } = warmup.clone();
    let with = |f: &dyn Fn(&mut LaunchSpec)| {
        let mut c = l.clone();
        f(&mut c);
        c
    };
    let with_warmup = |f: &dyn Fn(&mut WarmupConfig)| with(&|c| f(&mut c.warmup));
    let more = |s: &Option<String>| Some(format!("{}x", s.clone().unwrap_or_default()));
    let second = Duration::from_secs(1);
    vec![
        ("version", with(&|c| c.version = format!("{version}.1"))),
        (
            "command",
            with(&|c| c.command = [command.clone(), vec!["--seed".into()]].concat()),
        ),
        (
            "env",
            with(&|c| {
                c.env = [(String::from("EXTRA"), String::from("1"))]
                    .into_iter()
                    .chain(env.clone())
                    .collect()
            }),
        ),
        ("user", with(&|c| c.user = more(&user))),
        ("gpus", with(&|c| c.gpus = gpus + 1)),
        (
            "gpu_memory",
            with(&|c| c.gpu_memory = Some(gpu_memory.unwrap_or(0) + (1 << 30))),
        ),
        (
            "placement",
            with(&|c| {
                c.placement = match placement {
                    Placement::Pack => Placement::Spread,
                    Placement::Spread => Placement::Pack,
                }
            }),
        ),
        (
            "device_naming",
            with(&|c| {
                c.device_naming = match device_naming {
                    DeviceNaming::Index => DeviceNaming::Uuid,
                    DeviceNaming::Uuid => DeviceNaming::Index,
                }
            }),
        ),
        (
            "prefetch",
            with(&|c| c.prefetch = [prefetch.clone(), vec!["/models/m/*.gguf".into()]].concat()),
        ),
        (
            "warmup.method",
            with_warmup(&|w| w.method = if method == "GET" { "POST" } else { "GET" }.into()),
        ),
        (
            "warmup.url",
            with_warmup(&|w| w.url = format!("{url}?again")),
        ),
        ("warmup.body", with_warmup(&|w| w.body = more(&body))),
        (
            "warmup.headers",
            with_warmup(&|w| {
                w.headers = [(String::from("x-extra"), String::from("1"))]
                    .into_iter()
                    .chain(headers.clone())
                    .collect()
            }),
        ),
        (
            "warmup.expect_status",
            with_warmup(&|w| w.expect_status = if expect_status == 200 { 204 } else { 200 }),
        ),
        (
            "warmup.expect_body",
            with_warmup(&|w| w.expect_body = more(&expect_body)),
        ),
        (
            "warmup.timeout",
            with_warmup(&|w| w.timeout = timeout + second),
        ),
        (
            "warmup.startup_timeout",
            with_warmup(&|w| w.startup_timeout = startup_timeout + second),
        ),
        (
            "warmup.recheck",
            with_warmup(&|w| w.recheck = recheck + second),
        ),
    ]
}

/// Every model configuration that differs from `c` outside its launch spec, one field at a time.
/// Exhaustive like `launch_changes`: a field added to `ModelConfig` must be named here.
fn live_changes(c: &ModelConfig) -> Vec<(&'static str, ModelConfig)> {
    let ModelConfig {
        // Another name is another model.
        name: _,
        // Above.
        launch: _,
        start_alone,
        priority,
        slots,
        // Where `slots` came from: read by the simulator only, no effect on replicas.
        slots_declared: _,
        stop_grace,
        liveness,
        signal,
        scaling,
        sleep,
        pin,
    } = c.clone();
    let with = |f: &dyn Fn(&mut ModelConfig)| {
        let mut m = c.clone();
        f(&mut m);
        m
    };
    vec![
        ("start_alone", with(&|m| m.start_alone = !start_alone)),
        ("priority", with(&|m| m.priority = priority + 1)),
        ("slots", with(&|m| m.slots = slots + 1)),
        (
            "stop_grace",
            with(&|m| m.stop_grace = stop_grace + Duration::from_secs(1)),
        ),
        (
            "liveness",
            with(&|m| {
                m.liveness = liveness.clone().map(|l| LivenessConfig {
                    interval: l.interval * 2,
                    ..l
                })
            }),
        ),
        ("liveness removed", with(&|m| m.liveness = None)),
        (
            "signal",
            with(&|m| {
                m.signal = match &signal {
                    Some(_) => None,
                    None => Some(SignalConfig {
                        scrape: "http://127.0.0.1:{port}/metrics".into(),
                        format: ScrapeFormat::Llamacpp,
                        interval: Duration::from_secs(1),
                        models: Vec::new(),
                    }),
                }
            }),
        ),
        (
            "scaling",
            with(&|m| {
                m.scaling = ScalingConfig {
                    target_wait: scaling.target_wait * 2,
                    down_stabilization: crate::config::DownLimit::AtLeast(
                        scaling.down_stabilization.floor() * 2 + Duration::from_secs(1),
                    ),
                    ..scaling.clone()
                }
            }),
        ),
        ("pin", with(&|m| m.pin = !pin)),
        (
            "sleep",
            with(&|m| {
                m.sleep = match &sleep {
                    Some(_) => None,
                    None => Some(crate::config::sleep::SleepConfig {
                        format: Some(crate::config::sleep::SleepFormat::Sglang),
                        level: 1,
                        sleep: Vec::new(),
                        wake: Vec::new(),
                        state: None,
                        host_memory: 0,
                        gpu_memory_asleep: 1 << 29,
                        wake_timeout: Duration::from_secs(60),
                        sleep_timeout: Duration::from_secs(60),
                        idle_to_sleep: None,
                    }),
                }
            }),
        ),
    ]
}

/// A node with two routed and one warm replica of `m`, settled.
fn settled() -> Harness {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 1"));
    let first = h.log.clone();
    h.settle(first);
    assert_eq!(h.node.held.replicas().len(), 3);
    h
}

fn with_model(h: &Harness, m: ModelConfig) -> Config {
    let mut config = h.node.config.clone();
    config.models = vec![m];
    config
}

#[test]
fn a_change_to_any_field_of_the_launch_spec_rolls_the_model_over() {
    let base = settled().node.models["m"].config.clone();
    let changes = launch_changes(&base.launch);
    assert_eq!(changes.len(), 18);
    for (field, launch) in changes {
        assert_ne!(launch, base.launch, "{field}: a real change");
        let mut h = settled();
        let old: Vec<ReplicaId> = h.node.held.replicas().keys().cloned().collect();
        h.reload_config(with_model(
            &h,
            ModelConfig {
                launch: launch.clone(),
                ..base.clone()
            },
        ));
        let m = &h.node.models["m"];
        let rollout = m.rollout.as_ref().unwrap_or_else(|| panic!("{field}"));
        assert_eq!(*rollout.previous_spec, base.launch, "{field}");
        assert_eq!(*m.spec, launch, "{field}");
        for id in &old {
            if let Some(r) = h.node.held.replicas().get(id) {
                assert!(h.node.departing(r), "{field}: {id} is of the old version");
            }
        }
        let new: Vec<&Replica> = h
            .node
            .held
            .replicas()
            .values()
            .filter(|r| !old.contains(&r.id))
            .collect();
        assert!(!new.is_empty(), "{field}: new replicas are on their way");
        for r in new {
            assert_eq!(
                *r.spec, launch,
                "{field}: {} is made from the new spec",
                r.id
            );
            assert!(!h.node.departing(r), "{field}");
        }
    }
}

#[test]
fn a_change_outside_the_launch_spec_keeps_every_replica() {
    let base = settled().node.models["m"].config.clone();
    for (field, config) in live_changes(&base) {
        assert_ne!(config, base, "{field}: a real change");
        assert_eq!(config.launch, base.launch, "{field}");
        let mut h = settled();
        let before: Vec<(ReplicaId, Option<u32>)> = h
            .node
            .held
            .replicas()
            .values()
            .map(|r| (r.id.clone(), r.pid))
            .collect();
        let out = h.reload_config(with_model(&h, config.clone()));
        assert!(
            signals(&out, StopSignal::Term).is_empty() && spawns(&out) == 0,
            "{field}: {out:?}"
        );
        let m = &h.node.models["m"];
        assert!(m.rollout.is_none(), "{field}");
        assert_eq!(m.config, config, "{field}: applied");
        let after: Vec<(ReplicaId, Option<u32>)> = h
            .node
            .held
            .replicas()
            .values()
            .map(|r| (r.id.clone(), r.pid))
            .collect();
        assert_eq!(before, after, "{field}");
        assert!(
            h.node
                .held
                .replicas()
                .values()
                .all(|r| !h.node.departing(r)),
            "{field}"
        );
    }
}

#[test]
fn a_change_outside_the_launch_spec_during_a_rollout_keeps_the_rollout() {
    let base = settled().node.models["m"].config.clone();
    let (_, launch) = launch_changes(&base.launch).swap_remove(0);
    let next = ModelConfig {
        launch: launch.clone(),
        ..base.clone()
    };
    for (field, config) in live_changes(&next) {
        let mut h = settled();
        h.reload_config(with_model(&h, next.clone()));
        assert!(h.node.models["m"].rollout.is_some());
        h.reload_config(with_model(&h, config));
        let m = &h.node.models["m"];
        let rollout = m
            .rollout
            .as_ref()
            .unwrap_or_else(|| panic!("{field}: rollout kept"));
        assert_eq!(*rollout.previous_spec, base.launch, "{field}");
        assert_eq!(*m.spec, launch, "{field}");
    }
}
