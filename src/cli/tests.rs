//! The parser and the tables, without a daemon.

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::CommandFactory;

use super::render::{short_uuid, Uuids, NONE};
use super::*;
use crate::protocol::{GpuView, ModelView, ReplicaState, ReplicaView, SignalView, StatusView};

/// The verbs that talk to the daemon.
const CLIENT_VERBS: [&str; 11] = [
    "status", "watch", "gpus", "report", "scale", "drain", "undrain", "cordon", "uncordon",
    "reload", "upgrade",
];

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("hearth").chain(args.iter().copied()))
}

fn refused(args: &[&str]) -> clap::Error {
    match parse(args) {
        Ok(cli) => panic!("{args:?} parsed: {cli:?}"),
        Err(e) => e,
    }
}

#[test]
fn every_argument_of_every_subcommand_has_a_help_line() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let generated = matches!(arg.get_id().as_str(), "help" | "version");
            if generated || arg.is_hide_set() {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() && sub.get_name() != "help" {
                missing.push(format!("{path} {} (the verb)", sub.get_name()));
            }
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "hearth", &mut missing);
    assert!(missing.is_empty(), "no help line: {missing:#?}");
}

#[test]
fn socket_is_an_option_of_the_client_verbs_only() {
    let cli = Cli::command();
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        let has = sub
            .get_arguments()
            .any(|a| a.get_long() == Some("socket") && !a.is_hide_set());
        let client = CLIENT_VERBS.contains(&sub.get_name());
        assert_eq!(has, client, "hearth {} --socket", sub.get_name());
    }
    let root = cli
        .get_arguments()
        .find(|a| a.get_long() == Some("socket"))
        .expect("accepted before the verb");
    assert!(root.is_hide_set(), "not shown as an option of every verb");
}

#[test]
fn socket_goes_after_the_verb_or_before_it_and_only_on_client_verbs() {
    let before = parse(&["--socket", "/a.sock", "status"]).unwrap();
    assert_eq!(before.socket_path(), PathBuf::from("/a.sock"));
    let after = parse(&["status", "--socket", "/b.sock"]).unwrap();
    assert_eq!(after.socket_path(), PathBuf::from("/b.sock"));
    let both = parse(&["--socket", "/a.sock", "drain", "m-1", "--socket", "/b.sock"]).unwrap();
    assert_eq!(
        both.socket_path(),
        PathBuf::from("/b.sock"),
        "the verb's wins"
    );
    assert!(both.check().is_ok());

    let e = refused(&["daemon", "--socket", "/a.sock"]);
    assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    assert_eq!(e.exit_code(), 2);
    let misplaced = parse(&["--socket", "/a.sock", "check-config", "x.toml"]).unwrap();
    let why = misplaced.check().unwrap_err();
    assert!(why.contains("configuration"), "{why}");
}

#[test]
fn scale_with_no_flag_says_what_it_can_change() {
    let e = refused(&["scale", "m"]);
    assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    assert_eq!(e.exit_code(), 2);
    let text = e.to_string();
    for flag in ["--min", "--max", "--warm"] {
        assert!(text.contains(flag), "{text}");
    }
    let ok = parse(&["scale", "m", "--warm", "auto"]).unwrap();
    assert!(matches!(
        ok.command,
        Command::Scale {
            warm: Some(WarmPoolSetting::AUTO),
            ..
        }
    ));
}

#[test]
fn negative_numbers_get_clap_s_ordinary_error() {
    for (args, flag) in [
        (&["scale", "m", "--min", "-1"][..], "--min <N>"),
        (&["scale", "m", "--max", "-3"][..], "--max <N>"),
        (&["scale", "m", "--warm", "-1"][..], "--warm <N|auto>"),
        (&["report", "m", "--depth", "-2"][..], "--depth <N>"),
        (&["report", "m", "--in-flight", "-2"][..], "--in-flight <N>"),
        (&["report", "m", "--wait-ms", "-5"][..], "--wait-ms <MS>"),
        (&["report", "m", "--wait-ms", "inf"][..], "--wait-ms <MS>"),
    ] {
        let e = refused(args);
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{args:?}: {e}");
        assert_eq!(e.exit_code(), 2);
        let text = e.to_string();
        assert!(
            text.contains(&format!("invalid value '{}' for '{flag}'", args[3])),
            "{args:?}: {text}"
        );
    }
    assert!(parse(&["report", "m", "--wait-ms", "12.5", "--depth", "0"]).is_ok());
}

#[test]
fn no_daemon_suggests_hearth_socket() {
    let e = crate::client::ClientError::NoDaemon {
        path: "/run/hearth/hearth.sock".into(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    let text = e.to_string();
    assert!(
        text.starts_with("no daemon at /run/hearth/hearth.sock") && text.contains("HEARTH_SOCKET"),
        "{text}"
    );
}

fn gpu(index: u32, uuid: &str, used: Option<u64>, note: Option<&str>) -> GpuView {
    const GIB: u64 = 1 << 30;
    GpuView {
        index,
        uuid: uuid.into(),
        name: "H100".into(),
        memory_total: 80 * GIB,
        memory_reserved: 30 * GIB,
        healthy: note.is_none(),
        cordoned: false,
        replicas: vec![format!("m-{index}")],
        memory_used: used,
        memory_foreign: used.map(|u| u - 20 * GIB),
        note: note.map(String::from),
        topology: None,
        memory_driver_reserved: None,
        mig_parent: None,
        nvlink: Vec::new(),
        asleep: Vec::new(),
    }
}

#[test]
fn the_gpu_table_shows_memory_in_use_foreign_memory_and_why_a_device_is_out() {
    const GIB: u64 = 1 << 30;
    let t = gpu_table(&[
        gpu(0, "GPU-0", Some(50 * GIB), None),
        gpu(1, "GPU-1", None, Some("critical XID 79")),
    ]);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].contains("USED") && lines[0].contains("FOREIGN") && lines[0].contains("NOTE"));
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        cols,
        ["0", "GPU-0", "H100", "80.0", "30.0", "50.0", "30.0", "yes", "no", "m-0"]
    );
    let cols: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "1", "GPU-1", "H100", "80.0", "30.0", NONE, NONE, "NO", "no", "m-1", "critical", "XID",
            "79"
        ]
    );
}

const UUID_A: &str = "GPU-3f1b6c2e-8a4d-4e9b-9c1f-2b7d5e6a8c90";
const UUID_B: &str = "GPU-77aa01de-1111-2222-3333-444455556666";

#[test]
fn long_uuids_are_shortened_unambiguously() {
    assert_eq!(short_uuid(UUID_A), "GPU-3f1b6c2e…");
    assert_eq!(
        short_uuid("GPU-static-0"),
        "GPU-static-0",
        "short ones stay"
    );
    assert_eq!(
        short_uuid("MIG-GPU-3f1b6c2e-8a4d-4e9b-9c1f-2b7d5e6a8c90/1/0"),
        "MIG-GPU-3f1b6c2e…/1/0",
        "a MIG slice keeps its instance"
    );
    assert_eq!(
        short_uuid("MIG-4f3e2d1c-aaaa-bbbb-cccc-ddddeeeeffff"),
        "MIG-4f3e2d1c…"
    );
    // Two that would shorten alike are shown whole.
    let twin = "GPU-3f1b6c2e-0000-0000-0000-000000000000";
    let u = Uuids::new([UUID_A, twin, UUID_B]);
    assert_eq!(u.show(UUID_A), UUID_A);
    assert_eq!(u.show(twin), twin);
    assert_eq!(u.show(UUID_B), "GPU-77aa01de…");
}

fn model(signal: SignalView, replicas: Vec<ReplicaView>) -> ModelView {
    let mut m: ModelView = serde_json::from_value(serde_json::json!({
        "name": "m", "version": "1", "health": "ok", "routed": 1, "warm": 0,
        "starting": 1, "pending": 0, "draining": 0, "desired_routed": 1, "min": 1, "max": 4,
        "warm_pool": "auto", "target_wait_ms": 500, "signal": {}, "last_scale": null,
        "replicas": []
    }))
    .unwrap();
    m.signal = signal;
    m.replicas = replicas;
    m
}

fn replica(id: &str, state: ReplicaState, pid: Option<u32>, gpus: &[&str]) -> ReplicaView {
    ReplicaView {
        id: id.into(),
        state,
        pid,
        port: pid.map(|_| 30000),
        addr: pid.map(|_| "127.0.0.1:30000".into()),
        gpus: gpus.iter().map(|g| g.to_string()).collect(),
        since_ms: 0,
        restarts: 0,
        version: "1".into(),
        reason: "".into(),
        rss_bytes: None,
        cpu_seconds: None,
    }
}

#[test]
fn status_shows_a_dash_for_a_missing_signal_and_short_uuids_and_json_keeps_them_whole() {
    let st = StatusView {
        daemon: Default::default(),
        models: vec![model(
            SignalView::default(),
            vec![
                replica("m-1", ReplicaState::Routed, Some(42), &[UUID_A]),
                replica("m-2", ReplicaState::Pending, None, &[]),
            ],
        )],
        gpus: vec![gpu(0, UUID_A, None, None), gpu(1, UUID_B, None, None)],
    };
    let t = status_table(&st);
    assert!(
        t.contains("queue: oldest wait — (target 500 ms), depth —, in flight —, report age —"),
        "{t}"
    );
    assert!(!t.contains("- ms") && !t.contains("— ms"), "{t}");
    assert!(t.contains("(min 1, max 4, pool auto, 1 slot each)"), "{t}");
    let m1 = t.lines().find(|l| l.contains("m-1")).unwrap();
    assert!(m1.contains("GPU-3f1b6c2e…") && !m1.contains(UUID_A), "{m1}");
    let m2: Vec<&str> = t
        .lines()
        .find(|l| l.contains("m-2"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(m2, ["m-2", "pending", NONE, NONE, "0", NONE]);
    assert!(t.contains("GPU-77aa01de…") && !t.contains(UUID_B), "{t}");

    let fresh = SignalView {
        oldest_wait_ms: Some(849.6),
        queue_depth: Some(12),
        in_flight: Some(3),
        age_ms: Some(40),
        router: None,
        routers: Vec::new(),
    };
    let t = status_table(&StatusView {
        daemon: Default::default(),
        models: vec![model(fresh, vec![])],
        gpus: vec![],
    });
    assert!(
        t.contains(
            "queue: oldest wait 850 ms (target 500 ms), depth 12, in flight 3, report age 40 ms"
        ),
        "{t}"
    );

    let json = serde_json::to_string(&st).unwrap();
    assert!(
        json.contains(UUID_A) && json.contains(UUID_B),
        "--json keeps UUIDs whole"
    );
}

#[test]
fn drain_takes_a_replica_or_a_model_and_undrain_a_model() {
    let req = |args: &[&str]| request_of(parse(args).unwrap().command).map(|(r, _)| r);
    assert_eq!(
        req(&["drain", "toy-1"]),
        Some(Request::Drain {
            replica: Some("toy-1".into()),
            model: None,
            force: false
        })
    );
    assert_eq!(
        req(&["drain", "--model", "toy"]),
        Some(Request::Drain {
            replica: None,
            model: Some("toy".into()),
            force: false
        })
    );
    assert_eq!(
        req(&["undrain", "--model", "toy"]),
        Some(Request::Undrain {
            model: "toy".into()
        })
    );
    for bad in [
        &["drain"][..],
        &["drain", "toy-1", "--model", "toy"],
        &["drain", "--model", "toy", "--force"],
        &["undrain"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}
