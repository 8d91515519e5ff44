//! What the binary says, with the real binary and real sockets: a socket this user may not use
//! is called that, not a missing daemon; an error that ends the daemon or the front door is
//! printed once; the verbs that change the daemon say what is now in force.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// A uid no account on the host has, as in tests/connections.rs.
const STRANGER: u32 = 60_031;

#[test]
fn a_socket_this_user_may_not_use_is_permission_denied_not_no_daemon() {
    if !needs_root("running the CLI as another user") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("hearth.sock");
    // Something listens: only the mode keeps the stranger out, as a daemon's 0660 socket does.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cmd = Command::new(hearth());
    cmd.args(["status", "--socket"])
        .arg(&path)
        .env_remove("HEARTH_SOCKET")
        .uid(STRANGER)
        .gid(STRANGER);
    let out = run(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("permission denied")
            && out.stderr.contains(&path.display().to_string())
            && !out.stderr.contains("no daemon"),
        "{}",
        out.stderr
    );
    // The same socket gone: a missing daemon, as before.
    drop(_listener);
    std::fs::remove_file(&path).unwrap();
    let out = run(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("no daemon at"), "{}", out.stderr);
}

#[test]
fn an_error_that_ends_the_daemon_is_printed_once() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut d = Daemon::builder()
        .metrics(port)
        .model(Model::toy("m", &[]))
        .spawn();
    let status = d
        .wait_exit(Duration::from_secs(30))
        .expect("the daemon exits when its metrics port is taken");
    assert_eq!(status.code(), Some(1), "{}", d.log());
    let log = d.log();
    let said = format!("binding daemon.metrics 127.0.0.1:{port}");
    assert_eq!(log.matches(&said).count(), 1, "{log}");
}

#[test]
fn an_error_that_ends_the_front_door_is_printed_once() {
    let d = route::front_door_daemon([Model::front_toy("m", &[])], "").start();
    let addr = d.route_addr.expect("[route] listen");
    // Held by someone else: the router cannot bind its port.
    let _taken = TcpListener::bind(addr).unwrap();
    let (k, v) = d.mark();
    let mut cmd = Command::new(hearth());
    cmd.arg("route")
        .arg("--config")
        .arg(&d.config_path)
        .env_remove("HEARTH_SOCKET")
        .env(k, v);
    let out = run(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = format!("binding {addr}");
    assert_eq!(out.stderr.matches(&said).count(), 1, "{}", out.stderr);
}

#[test]
fn scale_drain_cordon_uncordon_and_reload_say_what_they_did() {
    let d = Daemon::builder()
        .tick("100ms")
        .gpus("static", &[("GPU-confirm-0", "80GiB")])
        .model(Model::toy("toy", &[]).scale(1, 3, 0))
        .start();
    d.wait_settled("toy", 1, 0, Duration::from_secs(30));

    let out = d.cli_ok(&["scale", "toy", "--min", "2"]);
    assert_eq!(out, "toy: scaled: min 2, max 3, warm pool 0\n");
    let out = d.cli_ok(&["scale", "toy", "--reset"]);
    assert_eq!(out, "toy: scaled: min 1, max 3, warm pool 0\n");

    let routed = d.wait_model("toy", "a routed replica", Duration::from_secs(30), |m| {
        m["routed"].as_u64() >= Some(1)
    });
    let replica = status::replicas_of(&routed)
        .iter()
        .find(|r| r["state"] == "routed")
        .map(status::id)
        .expect("a routed replica");
    let out = d.cli_ok(&["drain", &replica, "--force"]);
    assert!(
        out.starts_with(&format!("{replica}: draining (forced): ")),
        "{out}"
    );

    let out = d.cli_ok(&["cordon", "GPU-confirm-0"]);
    assert!(out.starts_with("GPU-confirm-0: cordoned: "), "{out}");
    assert!(!out.contains("moving off"), "{out}");
    let out = d.cli_ok(&["uncordon", "GPU-confirm-0"]);
    assert!(out.starts_with("GPU-confirm-0: uncordoned"), "{out}");
    let out = d.cli_ok(&["cordon", "0", "--evacuate"]);
    assert!(
        out.starts_with("0: cordoned: ") && out.contains("moving off"),
        "{out}"
    );
    d.cli_ok(&["uncordon", "0"]);

    let out = d.cli_ok(&["reload"]);
    assert_eq!(out, "reloaded: the configuration file is in force\n");

    // An answer that is an error prints no confirmation.
    let out = d.cli(&["drain", "toy-999"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
}
