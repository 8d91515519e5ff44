//! Requests and answers against literal lines of the wire.

use super::*;

#[test]
fn parses_known_ops_and_rejects_the_rest() {
    assert_eq!(
        parse_request(r#"{"op":"version"}"#).unwrap(),
        Request::Version {}
    );
    let r = parse_request(r#"{"op":"report","model":"m","oldest_wait_ms":12.5,"in_flight":3}"#)
        .unwrap();
    match r {
        Request::Report(rep) => {
            assert_eq!(rep.model, "m");
            assert_eq!(rep.oldest_wait_ms, Some(12.5));
            assert_eq!(rep.in_flight, Some(3));
            assert_eq!(rep.queue_depth, None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        parse_request("{nope").unwrap_err().code,
        ErrorCode::BadRequest
    );
    assert_eq!(
        parse_request("[1]").unwrap_err().code,
        ErrorCode::BadRequest
    );
    assert_eq!(
        parse_request(r#"{"op":"fly"}"#).unwrap_err().code,
        ErrorCode::UnknownOp
    );
    assert_eq!(
        parse_request(r#"{"op":7}"#).unwrap_err().code,
        ErrorCode::BadRequest
    );
    assert_eq!(
        parse_request(r#"{"op":"undrain"}"#).unwrap_err().code,
        ErrorCode::BadRequest,
        "undrain without model"
    );
    assert_eq!(
        parse_request(r#"{"op":"report","model":"m","wait_ms":3}"#)
            .unwrap_err()
            .code,
        ErrorCode::BadRequest,
        "a misspelt field is an error, not silently ignored"
    );
}

#[test]
fn warm_pool_setting_is_a_count_or_auto() {
    let r = parse_request(r#"{"op":"scale","model":"m","warm_pool":"auto"}"#).unwrap();
    assert!(matches!(
        r,
        Request::Scale {
            warm_pool: Some(WarmPoolSetting::Auto(_)),
            ..
        }
    ));
    let r = parse_request(r#"{"op":"scale","model":"m","warm_pool":2,"min":1}"#).unwrap();
    assert!(matches!(
        r,
        Request::Scale {
            warm_pool: Some(WarmPoolSetting::Count(2)),
            min: Some(1),
            ..
        }
    ));
    assert!(parse_request(r#"{"op":"scale","model":"m","warm_pool":"lots"}"#).is_err());
}

#[test]
fn watch_events_carry_their_tag() {
    let e = WatchEvent::Routed {
        model: "m".into(),
        endpoints: vec![Endpoint {
            replica: "m-1".into(),
            addr: "127.0.0.1:1".into(),
            slots: Some(4),
        }],
    };
    let s = serde_json::to_string(&e).unwrap();
    assert!(s.starts_with(r#"{"event":"routed","model":"m""#), "{s}");
    assert!(s.contains(r#""slots":4"#), "{s}");
    // A daemon from before `slots` sends none.
    let old: WatchEvent = serde_json::from_str(
        r#"{"event":"routed","model":"m","endpoints":[{"replica":"m-1","addr":"127.0.0.1:1"}]}"#,
    )
    .unwrap();
    let WatchEvent::Routed { endpoints, .. } = old else {
        panic!("{old:?}")
    };
    assert_eq!(endpoints[0].slots, None);
}

#[test]
fn an_unknown_op_names_the_known_ones() {
    let f = parse_request(r#"{"op":"fly"}"#).unwrap_err();
    assert_eq!(f.code, ErrorCode::UnknownOp);
    for op in [
        "version", "report", "status", "watch", "gpus", "scale", "drain", "reload",
    ] {
        assert!(f.message.contains(&format!("`{op}`")), "{}", f.message);
    }
    // The words serde gave when the list was read from its error.
    assert_eq!(
        f.message,
        "unknown op \"fly\": expected one of `version`, `report`, `status`, `watch`, `gpus`, \
         `scale`, `drain`, `undrain`, `cordon`, `uncordon`, `reload`, `upgrade`"
    );
    // The constant list is serde's: every op, each under its wire name.
    for op in Op::ALL {
        assert_eq!(crate::protocol::wire_name(&op), op.name());
        assert_eq!(Op::from_name(op.name()), Some(op));
        let line = format!(r#"{{"op":"{op}","x":1}}"#);
        assert_eq!(
            parse_request(&line).unwrap_err().code,
            ErrorCode::BadRequest
        );
    }
    let serde_names: Vec<String> = serde_json::from_str::<Op>(r#""fly""#)
        .unwrap_err()
        .to_string()
        .split('`')
        .skip(3)
        .step_by(2)
        .map(String::from)
        .collect();
    let ours: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
    assert_eq!(serde_names, ours);
}

#[test]
fn a_line_read_once_and_one_read_again_give_the_same_request() {
    // A repeated key reads only as a value (which keeps the last): the same as before.
    let r = parse_request(r#"{"op":"report","model":"a","model":"m","queue_depth":3}"#).unwrap();
    let Request::Report(report) = r else {
        panic!("{r:?}")
    };
    assert_eq!((report.model.as_str(), report.queue_depth), ("m", Some(3)));
    // The op need not come first.
    let r = parse_request(r#"{"model":"m","op":"report","in_flight":1}"#).unwrap();
    assert_eq!(r.op(), Op::Report);
}

#[test]
fn every_request_s_op_is_a_known_op_with_its_role() {
    let all = [
        (r#"{"op":"version"}"#, Op::Version, Role::Reader),
        (r#"{"op":"report","model":"m"}"#, Op::Report, Role::Reporter),
        (r#"{"op":"status"}"#, Op::Status, Role::Reader),
        (r#"{"op":"watch","model":"m"}"#, Op::Watch, Role::Reader),
        (r#"{"op":"gpus"}"#, Op::Gpus, Role::Reader),
        (
            r#"{"op":"scale","model":"m","max":2}"#,
            Op::Scale,
            Role::Admin,
        ),
        (r#"{"op":"drain","replica":"m-1"}"#, Op::Drain, Role::Admin),
        (r#"{"op":"drain","model":"m"}"#, Op::Drain, Role::Admin),
        (r#"{"op":"undrain","model":"m"}"#, Op::Undrain, Role::Admin),
        (
            r#"{"op":"cordon","gpu":"0","evacuate":false}"#,
            Op::Cordon,
            Role::Admin,
        ),
        (r#"{"op":"uncordon","gpu":"0"}"#, Op::Uncordon, Role::Admin),
        (r#"{"op":"reload"}"#, Op::Reload, Role::Admin),
    ];
    for (line, op, role) in all {
        let r = parse_request(line).unwrap();
        assert_eq!((r.op(), r.required_role()), (op, role), "{line}");
        // A request goes out as the line it came in as.
        assert_eq!(serde_json::to_string(&r).unwrap(), line);
    }
}

/// Encodes `answer` (to a request with op `op`), checks the literal line, and decodes it back.
fn round_trip(op: Op, answer: Answer, line: &str) {
    assert_eq!(encode_answer(&answer), line);
    assert_eq!(decode_answer(line, op).unwrap(), answer, "{line}");
}

#[test]
fn answers_are_design_s_lines_and_read_back() {
    round_trip(Op::Reload, Ok(Response::Done {}), r#"{"ok":true}"#);
    round_trip(Op::Watch, Ok(Response::Done {}), r#"{"ok":true}"#);
    round_trip(Op::Report, Ok(Response::Done {}), r#"{"ok":true}"#);
    round_trip(
        Op::Report,
        Ok(Response::Superseded {
            superseded_by: vec!["hearth route a".into()],
        }),
        r#"{"ok":true,"superseded_by":["hearth route a"]}"#,
    );
    round_trip(
        Op::Version,
        Ok(Response::Version {
            version: "0.1.0".into(),
            protocol: 1,
        }),
        r#"{"ok":true,"version":"0.1.0","protocol":1}"#,
    );
    round_trip(
        Op::Status,
        Err(Failure::new(ErrorCode::UnknownModel, "no model \"x\"")),
        r#"{"ok":false,"error":"unknown_model","message":"no model \"x\""}"#,
    );
    for (code, name) in [
        (ErrorCode::BadRequest, "bad_request"),
        (ErrorCode::UnknownOp, "unknown_op"),
        (ErrorCode::UnknownModel, "unknown_model"),
        (ErrorCode::UnknownReplica, "unknown_replica"),
        (ErrorCode::UnknownGpu, "unknown_gpu"),
        (ErrorCode::Forbidden, "forbidden"),
        (ErrorCode::TooLarge, "too_large"),
        (ErrorCode::Busy, "busy"),
    ] {
        assert_eq!(code.to_string(), name);
        round_trip(
            Op::Scale,
            Err(Failure::new(code, "m")),
            &format!(r#"{{"ok":false,"error":"{name}","message":"m"}}"#),
        );
    }
    let gpu = GpuView {
        index: 0,
        uuid: "GPU-a".into(),
        name: "static device".into(),
        memory_total: 1024,
        memory_reserved: 512,
        healthy: true,
        cordoned: false,
        replicas: vec!["m-1".into()],
        memory_used: None,
        memory_foreign: None,
        note: None,
        topology: None,
        memory_driver_reserved: None,
        mig_parent: None,
        nvlink: Vec::new(),
        asleep: Vec::new(),
    };
    round_trip(
        Op::Gpus,
        Ok(Response::Gpus {
            gpus: vec![gpu.clone()],
        }),
        r#"{"ok":true,"gpus":[{"index":0,"uuid":"GPU-a","name":"static device","memory_total":1024,"memory_reserved":512,"healthy":true,"cordoned":false,"replicas":["m-1"],"memory_used":null,"memory_foreign":null,"note":null,"topology":null,"memory_driver_reserved":null,"mig_parent":null,"nvlink":[],"asleep":[]}]}"#,
    );
    // The watch answer is `{"ok":true}`; the snapshot follows on lines of its own.
    let snapshot = vec![WatchEvent::Routed {
        model: "m".into(),
        endpoints: vec![],
    }];
    assert_eq!(
        encode_answer(&Ok(Response::Watching { snapshot })),
        r#"{"ok":true}"#
    );
}

#[test]
fn a_status_answer_carries_typed_states_health_pool_and_rollout() {
    let line = r#"{"ok":true,"status":{"models":[{"name":"m","version":"2","health":"crash_loop","health_reason":"5 failures","routed":1,"warm":0,"starting":1,"pending":0,"draining":0,"desired_routed":1,"desired_warm":1,"min":1,"max":4,"warm_pool":"auto","target_wait_ms":500,"slots":4,"signal":{"oldest_wait_ms":null,"queue_depth":null,"in_flight":null,"age_ms":null},"last_scale":{"at_ms":5,"from":0,"to":1,"reason":"min"},"rollout":{"version":"2","from":"1","updated":0,"halted":null},"time_to_ready_ms":null,"restarts_total":5,"drained":false,"replicas":[{"id":"m-1","state":"routed","pid":10,"port":30000,"addr":"127.0.0.1:30000","gpus":[],"since_ms":5,"restarts":0,"version":"1","reason":"","rss_bytes":52428800,"cpu_seconds":1.25},{"id":"m-2","state":"starting","pid":null,"port":null,"addr":null,"gpus":[],"since_ms":6,"restarts":4,"version":"2","reason":"warm-up: refused","rss_bytes":null,"cpu_seconds":null}]}],"gpus":[],"daemon":{"version":"0.1.0","config_file":{"path":"/etc/hearth/config.toml","state":"differs","reason":"edited, not reloaded"},"upgrade":{"attempt":7,"outcome":"fell_back","to_version":"0.2.0","reason":"it panicked","handed_over":2,"kept":2,"not_kept":[]},"sleeping_host_memory":{"held_bytes":0,"budget_bytes":null}}}}"#;
    let answer = decode_answer(line, Op::Status).unwrap();
    let Ok(Response::Status { status }) = &answer else {
        panic!("{answer:?}");
    };
    let m = &status.models[0];
    assert_eq!(m.health, Health::CrashLoop);
    assert_eq!(m.slots, 4);
    assert_eq!(m.warm_pool, WarmPoolSetting::AUTO);
    assert_eq!(m.warm_pool.to_string(), "auto");
    let states: Vec<ReplicaState> = m.replicas.iter().map(|r| r.state).collect();
    assert_eq!(states, [ReplicaState::Routed, ReplicaState::Starting]);
    assert_eq!(m.replicas[0].rss_bytes, Some(50 << 20));
    assert_eq!(m.replicas[0].cpu_seconds, Some(1.25));
    let rollout = m.rollout.as_ref().unwrap();
    assert_eq!(
        rollout.to_string(),
        "rolling out version 2 (from 1): 0 routed replica(s) updated"
    );
    assert_eq!(status.daemon.config_file.state, ConfigFileState::Differs);
    let upgrade = status.daemon.upgrade.as_ref().unwrap();
    assert_eq!(upgrade.outcome, UpgradeOutcome::FellBack);
    assert_eq!(encode_answer(&answer), line, "and back, byte for byte");
    // A daemon before `daemon` was in status: read as the defaults.
    let older = line.replace(&line[line.find(r#","daemon""#).unwrap()..], "}}");
    let Ok(Response::Status { status }) = decode_answer(&older, Op::Status).unwrap() else {
        panic!("{older}");
    };
    assert_eq!(*status.daemon, crate::protocol::DaemonView::default());
}

#[test]
fn an_upgrade_answer_names_its_attempt() {
    let answer = Ok(Response::Upgrading {
        upgrading: crate::protocol::UpgradePlan {
            attempt: 1_700_000_000_000_000_001,
            version: "0.2.0".into(),
            binary: "/opt/hearth/hearth".into(),
        },
    });
    round_trip(
        Op::Upgrade,
        answer,
        r#"{"ok":true,"upgrading":{"attempt":1700000000000000001,"version":"0.2.0","binary":"/opt/hearth/hearth"}}"#,
    );
}

#[test]
fn a_replica_event_says_a_state_or_gone() {
    let warm = WatchEvent::Replica {
        model: "m".into(),
        replica: "m-1".into(),
        state: ReplicaState::Warm.into(),
    };
    let line = r#"{"event":"replica","model":"m","replica":"m-1","state":"warm"}"#;
    assert_eq!(serde_json::to_string(&warm).unwrap(), line);
    assert_eq!(serde_json::from_str::<WatchEvent>(line).unwrap(), warm);
    let gone = r#"{"event":"replica","model":"m","replica":"m-1","state":"gone"}"#;
    let ev: WatchEvent = serde_json::from_str(gone).unwrap();
    assert!(matches!(
        ev,
        WatchEvent::Replica {
            state: WatchedState::GONE,
            ..
        }
    ));
    assert_eq!(serde_json::to_string(&ev).unwrap(), gone);
    assert!(serde_json::from_str::<WatchEvent>(&gone.replace("gone", "lost")).is_err());
    for (s, name) in [
        (ReplicaState::Pending, "pending"),
        (ReplicaState::Starting, "starting"),
        (ReplicaState::Warm, "warm"),
        (ReplicaState::Routed, "routed"),
        (ReplicaState::Draining, "draining"),
        (ReplicaState::Stopping, "stopping"),
    ] {
        assert_eq!(s.to_string(), name);
    }
}

#[test]
fn lines_that_are_no_answer_are_errors() {
    for (line, op) in [
        ("", Op::Version),
        ("[]", Op::Version),
        (r#"{"okay":true}"#, Op::Version),
        (r#"{"ok":false,"error":"nope","message":""}"#, Op::Status),
        (r#"{"ok":true,"status":{"models":"x"}}"#, Op::Status),
        (r#"{"ok":true,"gpus":7}"#, Op::Gpus),
        // The answer of another op, or a bare yes where a body is due.
        (r#"{"ok":true,"gpus":[]}"#, Op::Reload),
        (r#"{"ok":true}"#, Op::Status),
        (r#"{"ok":true,"version":"0.1.0","protocol":1}"#, Op::Watch),
    ] {
        assert!(decode_answer(line, op).is_err(), "{line}");
    }
}
