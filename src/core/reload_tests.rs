//! Reload and rollout tests of the core with virtual time.

use std::path::Path;
use std::time::Duration;

use super::replica::Replica;
use super::tests::{model, signals, spawns, Harness, BASE};
use super::*;
use crate::config::{
    Config, DeviceNaming, LaunchSpec, LivenessConfig, ModelConfig, Placement, ScalingConfig,
    ScrapeFormat, SignalConfig, WarmupConfig,
};
use crate::protocol::ErrorCode;

fn cfg(version: &str, scaling: &str) -> String {
    format!(
        "{BASE}{}",
        model("m", &format!("version = \"{version}\""), scaling)
    )
}

fn reload(h: &mut Harness, toml: &str) -> Vec<Action> {
    h.reload(toml)
}

fn routed(h: &Harness) -> usize {
    h.in_state("m", ReplicaState::Routed).len()
}

#[test]
fn a_scaling_only_change_keeps_every_replica() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 6\nwarm_pool = 1"));
    let first = h.log.clone();
    h.settle(first);
    let before: Vec<(ReplicaId, u32)> = h
        .node
        .replicas
        .values()
        .map(|r| (r.id.clone(), r.pid.unwrap()))
        .collect();
    let out = reload(
        &mut h,
        &cfg("1", "min = 2\nmax = 8\nwarm_pool = 1\ntarget_wait = \"2s\""),
    );
    assert!(signals(&out, StopSignal::Term).is_empty() && spawns(&out) == 0);
    let after: Vec<(ReplicaId, u32)> = h
        .node
        .replicas
        .values()
        .map(|r| (r.id.clone(), r.pid.unwrap()))
        .collect();
    assert_eq!(before, after);
    assert_eq!(h.node.models["m"].config.scaling.max, 8);
}

#[test]
fn a_version_change_warms_new_replicas_before_old_ones_drain() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 1"));
    let first = h.log.clone();
    h.settle(first);
    let old: Vec<ReplicaId> = h.node.replicas.keys().cloned().collect();
    let out = reload(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 1"));
    // The old warm one serves nothing: it goes at once. Routed ones stay.
    assert_eq!(signals(&out, StopSignal::Term).len(), 1);
    assert_eq!(routed(&h), 2);
    let st = h.node.status(Some("m"), h.now);
    let rollout = st.models[0].rollout.clone().unwrap();
    assert_eq!(
        (
            rollout.version.as_str(),
            rollout.from.as_str(),
            rollout.halted.as_deref()
        ),
        ("2", "1", None)
    );
    assert!(rollout
        .to_string()
        .starts_with("rolling out version 2 (from 1)"));
    let mut actions = out;
    let mut min_routed = routed(&h);
    for _ in 0..10 {
        let ids = h.spawn_all(&actions);
        actions.clear();
        for id in ids {
            actions.extend(h.warm(&id));
            min_routed = min_routed.min(routed(&h));
        }
        for id in h.in_state("m", ReplicaState::Draining) {
            let before = h.log.len();
            h.report("m", Some(&id.0), 0.0, 0, 0);
            actions.extend(h.log[before..].iter().cloned());
        }
        for id in h.in_state("m", ReplicaState::Stopping) {
            actions.extend(h.exit(&id, "exit status 0"));
            min_routed = min_routed.min(routed(&h));
        }
        actions.extend(h.advance(Duration::from_millis(250)));
    }
    assert!(min_routed >= 2, "routed never below min during the rollout");
    let versions: Vec<String> = h
        .node
        .replicas
        .values()
        .map(|r| r.version.clone())
        .collect();
    assert_eq!(versions, vec!["2"; 3], "2 routed + 1 warm, all new");
    assert!(h.node.replicas.keys().all(|id| !old.contains(id)));
    assert!(
        h.node.status(Some("m"), h.now).models[0].rollout.is_none(),
        "complete"
    );
}

/// Reloads `toml` and lets every replica of the new version time out in warm-up (startup_timeout
/// 10 s) until the rollout halts.
fn roll_out_until_halted(h: &mut Harness, toml: &str) {
    let mut actions = reload(h, toml);
    for _ in 0..400 {
        h.spawn_all(&actions);
        actions.clear();
        for id in h.in_state("m", ReplicaState::Stopping) {
            actions.extend(h.exit(&id, "exit status 143"));
        }
        actions.extend(h.advance(Duration::from_millis(250)));
        if h.node.models["m"]
            .rollout
            .as_ref()
            .is_some_and(|r| r.halted.is_some())
        {
            return;
        }
    }
    panic!("the rollout did not halt");
}

#[test]
fn after_a_halted_rollout_the_version_serving_can_be_configured_back() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let old = h.in_state("m", ReplicaState::Routed);
    roll_out_until_halted(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 0"));
    let out = reload(&mut h, &cfg("1", "min = 2\nmax = 6\nwarm_pool = 0"));
    assert!(h.node.models["m"].rollout.is_none());
    assert!(signals(&out, StopSignal::Term).is_empty() && spawns(&out) == 0);
    assert_eq!(h.in_state("m", ReplicaState::Routed), old);
    for r in h.node.replicas.values() {
        // What is left of version 2 (a replica stopping after its failed warm-up) goes.
        assert_eq!(
            h.node.departing(r),
            r.version == "2",
            "{} {:?}",
            r.id,
            r.state
        );
    }
    assert!(h.node.status(Some("m"), h.now).models[0].rollout.is_none());
}

#[test]
fn a_new_version_that_cannot_warm_up_halts_the_rollout_and_latches() {
    let mut h = Harness::new(&cfg("1", "min = 2\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let old = h.in_state("m", ReplicaState::Routed);
    roll_out_until_halted(&mut h, &cfg("2", "min = 2\nmax = 4\nwarm_pool = 0"));
    let st = h.node.status(Some("m"), h.now);
    let text = st.models[0].rollout.clone().unwrap().halted.unwrap();
    assert!(
        text.contains("halted") && text.contains("version 1 keeps serving"),
        "{text}"
    );
    assert_eq!(
        h.in_state("m", ReplicaState::Routed),
        old,
        "the old version keeps serving"
    );
    // Latched: no more new-version launches, however long we wait.
    let later = h.run_for(Duration::from_secs(600));
    assert_eq!(spawns(&later), 0);
    // An old replica that dies is replaced with the old version.
    let out = h.exit(&old[0], "killed by SIGKILL");
    let out2 = h.run_for(Duration::from_secs(400));
    let spec = out.iter().chain(out2.iter()).find_map(|a| match a {
        Action::Spawn(s) => Some(s.replica.clone()),
        _ => None,
    });
    let replacement = spec.expect("replaced");
    assert_eq!(h.node.replicas[&replacement].version, "1");
    // A new configuration resumes.
    let out = reload(&mut h, &cfg("3", "min = 2\nmax = 4\nwarm_pool = 0"));
    assert!(h.node.models["m"]
        .rollout
        .as_ref()
        .unwrap()
        .halted
        .is_none());
    let _ = out;
    let new: Vec<&str> = h
        .node
        .replicas
        .values()
        .filter(|r| r.state == ReplicaState::Pending)
        .map(|r| r.version.as_str())
        .collect();
    assert_eq!(
        new,
        vec!["3", "3"],
        "version 3 replicas are on their way (after the back-off)"
    );
}

// ---- who decides: the reload flow ------------------------------------------------------------

fn read_ok(toml: &str, warnings: &[&str]) -> Event {
    let config = Config::parse(toml, Path::new("reload.toml")).unwrap();
    Event::ConfigRead(Ok(Box::new(NewConfig {
        config,
        warnings: warnings.iter().map(|w| w.to_string()).collect(),
    })))
}

fn reload_request(h: &mut Harness, id: RequestId, peer: Peer) -> Vec<Action> {
    h.send(Event::Request {
        id,
        peer,
        request: crate::protocol::Request::Reload {},
    })
}

fn reads(actions: &[Action]) -> Vec<ReloadCause> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ReadConfig { cause } => Some(*cause),
            _ => None,
        })
        .collect()
}

/// The answers in `actions`, by request id, as `Ok(())` or the error code.
fn answers(actions: &[Action]) -> Vec<(RequestId, Result<(), ErrorCode>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Reply { id, answer } => {
                Some((*id, answer.clone().map(|_| ()).map_err(|f| f.code)))
            }
            _ => None,
        })
        .collect()
}

fn logged(actions: &[Action], level: LogLevel) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Log {
                level: l, message, ..
            } if *l == level => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn reader() -> Peer {
    Peer {
        role: crate::protocol::Role::Reporter,
        ..Peer::trusted()
    }
}

#[test]
fn a_reload_request_reads_the_file_then_the_shell_applies_its_part_before_the_answer() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let out = reload_request(&mut h, 7, Peer::trusted());
    assert_eq!(reads(&out), [ReloadCause::Request]);
    assert!(answers(&out).is_empty(), "answered once the file is read");

    let out = h.send(read_ok(
        &cfg("1", "min = 1\nmax = 6\nwarm_pool = 0"),
        &["daemon.socket changed from a to b: not applied"],
    ));
    let done = out
        .iter()
        .position(|a| matches!(a, Action::ReloadDone { applied: Some(c), cause: ReloadCause::Request } if c.models[0].scaling.max == 6))
        .expect("the configuration in force goes to the shell");
    let answered = out
        .iter()
        .position(|a| {
            matches!(
                a,
                Action::Reply {
                    id: 7,
                    answer: Ok(_)
                }
            )
        })
        .expect("the request is answered");
    assert!(
        done < answered,
        "in force everywhere before the answer: {out:?}"
    );
    assert_eq!(h.node.models["m"].config.scaling.max, 6);
    assert_eq!(
        logged(&out, LogLevel::Warn),
        ["reload: daemon.socket changed from a to b: not applied"]
    );
}

#[test]
fn a_bad_file_is_answered_with_its_error_and_changes_nothing() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let first = h.log.clone();
    h.settle(first);
    let before: Vec<ReplicaId> = h.node.replicas.keys().cloned().collect();
    reload_request(&mut h, 3, Peer::trusted());
    let out = h.send(Event::ConfigRead(Err(
        "reload.toml:9: max: not a number".into()
    )));
    assert_eq!(answers(&out), [(3, Err(ErrorCode::BadRequest))]);
    let Some(Action::Reply { answer: Err(f), .. }) =
        out.iter().find(|a| matches!(a, Action::Reply { .. }))
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        f.message,
        "configuration not reloaded: reload.toml:9: max: not a number"
    );
    assert!(out.contains(&Action::ReloadDone {
        cause: ReloadCause::Request,
        applied: None
    }));
    assert_eq!(
        logged(&out, LogLevel::Error),
        ["reload: configuration not reloaded, the running one is kept: reload.toml:9: max: not a number"]
    );
    assert_eq!(h.node.replicas.keys().cloned().collect::<Vec<_>>(), before);
    assert_eq!(h.node.models["m"].config.scaling.max, 4);
}

#[test]
fn only_admins_may_reload_and_nothing_is_read_for_others() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let out = reload_request(&mut h, 1, reader());
    assert_eq!(answers(&out), [(1, Err(ErrorCode::Forbidden))]);
    assert!(reads(&out).is_empty());
}

#[test]
fn while_shutting_down_reloads_are_refused_and_a_read_out_is_not_applied() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    // A read is out when the stop comes; one more request waits behind it.
    assert_eq!(reads(&reload_request(&mut h, 1, Peer::trusted())).len(), 1);
    assert!(reads(&reload_request(&mut h, 2, Peer::trusted())).is_empty());
    let out = h.send(Event::Shutdown { immediate: false });
    let mut refused = answers(&out);
    refused.sort_by_key(|(id, _)| *id);
    assert_eq!(
        refused,
        [(1, Err(ErrorCode::Busy)), (2, Err(ErrorCode::Busy))],
        "answered at once, not when the read comes back"
    );
    // The read comes back: the reload ends for the shell, nothing is applied, nobody answered twice.
    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 8\nwarm_pool = 0"), &[]));
    assert!(out.contains(&Action::ReloadDone {
        cause: ReloadCause::Request,
        applied: None
    }));
    assert!(answers(&out).is_empty());
    assert_eq!(h.node.models["m"].config.scaling.max, 4);
    // Asked now: refused, and no read.
    let out = reload_request(&mut h, 3, Peer::trusted());
    assert_eq!(answers(&out), [(3, Err(ErrorCode::Busy))]);
    let out = h.send(Event::ReloadSignal);
    assert!(reads(&out).is_empty());
    assert_eq!(
        logged(&out, LogLevel::Warn),
        ["SIGHUP ignored: shutting down"]
    );
}

#[test]
fn reloads_asked_during_a_read_share_the_next_read() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    assert_eq!(
        reads(&reload_request(&mut h, 1, Peer::trusted())),
        [ReloadCause::Request]
    );
    // A storm while the file is being read: no second read yet.
    let mut during = Vec::new();
    for _ in 0..50 {
        during.extend(h.send(Event::ReloadSignal));
    }
    during.extend(reload_request(&mut h, 2, Peer::trusted()));
    assert!(reads(&during).is_empty(), "one read at a time");

    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 5\nwarm_pool = 0"), &[]));
    assert_eq!(answers(&out), [(1, Ok(()))]);
    assert_eq!(
        reads(&out),
        [ReloadCause::Signal],
        "one more read, for everything asked meanwhile: the file may have changed since"
    );
    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 7\nwarm_pool = 0"), &[]));
    assert_eq!(answers(&out), [(2, Ok(()))]);
    assert!(reads(&out).is_empty());
    assert_eq!(h.node.models["m"].config.scaling.max, 7);
}

#[test]
fn a_read_nobody_asked_for_changes_nothing() {
    let mut h = Harness::new(&cfg("1", "min = 1\nmax = 4\nwarm_pool = 0"));
    let out = h.send(read_ok(&cfg("1", "min = 1\nmax = 8\nwarm_pool = 0"), &[]));
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::ReloadDone { .. } | Action::Reply { .. })));
    assert_eq!(h.node.models["m"].config.scaling.max, 4);
}

// ---- launch identity: the launch spec, every field of it, and nothing else -------------------

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
        stop_grace,
        liveness,
        signal,
        scaling,
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
                    down_stabilization: scaling.down_stabilization * 2,
                    ..scaling.clone()
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
    assert_eq!(h.node.replicas.len(), 3);
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
        let old: Vec<ReplicaId> = h.node.replicas.keys().cloned().collect();
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
            if let Some(r) = h.node.replicas.get(id) {
                assert!(h.node.departing(r), "{field}: {id} is of the old version");
            }
        }
        let new: Vec<&Replica> = h
            .node
            .replicas
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
            .replicas
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
            .replicas
            .values()
            .map(|r| (r.id.clone(), r.pid))
            .collect();
        assert_eq!(before, after, "{field}");
        assert!(
            h.node.replicas.values().all(|r| !h.node.departing(r)),
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
