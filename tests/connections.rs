//! Issue 11: a flood of connections from unprivileged users cannot lock an admin out. One user
//! holds at most its share of the socket's connections, and the last slots are kept for admins
//! (src/agent/admission.rs; its unit tests check the same rules without root).
//!
//! Its own test binary, one test: it switches the process's effective uid to connect as other
//! users, which nothing else may see.

use std::os::unix::fs::PermissionsExt;

use testkit::*;

/// The daemon's limits (src/agent/admission.rs).
const MAX_CONNECTIONS: usize = 512;
const RESERVED_FOR_ADMINS: usize = 16;
const PER_USER: usize = 256;

/// Of `conns`, how many were served and how many told busy (with their messages).
fn served(conns: &[std::os::unix::net::UnixStream]) -> (usize, Vec<String>) {
    let mut ok = 0;
    let mut busy = Vec::new();
    for c in conns {
        // Served: answered by the daemon (these users have no role: `forbidden`), not `busy`.
        let a = ask_on(c, &json!({"op": "version"})).unwrap_or_else(|e| panic!("{e}"));
        if a["error"] == json!("busy") {
            busy.push(a["message"].as_str().unwrap_or_default().to_string());
        } else {
            assert_eq!(a["error"], json!("forbidden"), "{a}");
            ok += 1;
        }
    }
    (ok, busy)
}

#[test]
fn other_users_flooding_the_socket_cannot_lock_an_admin_out() {
    if !needs_root("connecting as other users") {
        return;
    }
    let d = Daemon::start([Model::toy("toy", &[]).scale(1, 1, 0)]);
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    // Users no replica runs as (the toy replica's reporter holds a slot of its own).
    let first = connect_as(&d.socket, 60001, PER_USER + 40);
    let (ok, busy) = served(&first);
    assert_eq!(ok, PER_USER, "one user holds at most its share");
    assert!(
        busy.iter().all(|m| m.contains("from uid 60001")),
        "{busy:?}"
    );
    // A second user takes what is left of the general slots; then it is told the rest are
    // kept for admins.
    let second = connect_as(&d.socket, 60002, PER_USER);
    let (ok2, busy2) = served(&second);
    assert!(
        ok + ok2 <= MAX_CONNECTIONS - RESERVED_FOR_ADMINS,
        "{ok} + {ok2} connections of unprivileged users"
    );
    assert!(!busy2.is_empty(), "the general slots ran out");
    assert!(
        busy2.iter().all(|m| m.contains("kept for admins")),
        "{busy2:?}"
    );
    let third = connect_as(&d.socket, 60003, 4);
    let (ok3, _) = served(&third);
    assert_eq!(ok3, 0, "a third user finds only the admins' reserve");
    // An admin (root) is answered, by the CLI as an operator would ask.
    let out = d.cli_ok(&["status"]);
    assert!(out.contains("toy"), "{out}");
    // And once the flood leaves, everyone is served again.
    drop((first, second, third));
    wait_until("room again", std::time::Duration::from_secs(20), || {
        let c = connect_as(&d.socket, 60003, 1);
        (served(&c).0 == 1).then_some(())
    });
}
