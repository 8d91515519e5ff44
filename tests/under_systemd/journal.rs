//! The journal under systemd: every line the daemon wrote about a replica carries MODEL and
//! REPLICA, over every run of the test (restarts, the upgrade, the watchdog's kill included);
//! and what each replica printed is in the journal under its own identifier.

use std::collections::BTreeSet;

use crate::host::Host;

/// The replica ids (`MODEL-N` of one of `models`) a message names.
fn named(message: &str, models: &[&str]) -> BTreeSet<String> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|w| {
            models.iter().any(|m| {
                w.strip_prefix(m)
                    .and_then(|r| r.strip_prefix('-'))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .map(str::to_string)
        .collect()
}

/// Checks every daemon line since `cursor`; returns how many were about a replica.
pub fn lines_about_replicas_carry_their_fields(h: &Host, cursor: &str, models: &[&str]) -> usize {
    let entries = h.daemon_log(cursor);
    assert!(!entries.is_empty());
    let mut about = 0;
    let mut replicas = BTreeSet::new();
    for e in &entries {
        let message = e["MESSAGE"].as_str().unwrap_or_default();
        let field = |k: &str| e[k].as_str().map(str::to_string);
        let (model, replica) = (field("MODEL"), field("REPLICA"));
        let names = named(message, models);
        if replica.is_none() && names.is_empty() {
            continue;
        }
        about += 1;
        // A line that names one replica is about it; one that names several (a replacement, a
        // summary) is about the replica in its fields, which it must still have.
        let replica =
            replica.unwrap_or_else(|| panic!("a line about {names:?} without REPLICA: {e}"));
        let model = model.unwrap_or_else(|| panic!("a line about {replica} without MODEL: {e}"));
        assert!(
            replica
                .strip_prefix(&model)
                .is_some_and(|r| r.starts_with('-')),
            "REPLICA={replica} is not of MODEL={model}: {e}"
        );
        if names.len() == 1 {
            assert!(
                names.contains(&replica),
                "REPLICA={replica}, the line names {names:?}: {e}"
            );
        }
        replicas.insert(replica);
    }
    assert!(about > 0, "no line about a replica");
    // What each replica printed: a journal stream under its id (toy-server's first line, or
    // anything at all from llama.cpp's server).
    for r in &replicas {
        let out = h.sh_ok(&format!("journalctl -q --no-pager -o cat -t {r}"));
        assert!(!out.trim().is_empty(), "nothing under the identifier {r}");
        if r.starts_with("toy-") {
            assert!(
                out.contains("toy-server listening on 127.0.0.1:"),
                "{r}: {out}"
            );
        }
    }
    eprintln!(
        "journal: {about} of {} daemon lines about {} replicas, each with MODEL and REPLICA",
        entries.len(),
        replicas.len()
    );
    about
}

#[test]
fn replica_ids_are_found_in_messages() {
    let n = named(
        "toy-12 replaces toy-3 (llama-1x, toy-, xtoy-2)",
        &["toy", "llama"],
    );
    assert_eq!(
        n,
        BTreeSet::from(["toy-12".to_string(), "toy-3".to_string()])
    );
}
