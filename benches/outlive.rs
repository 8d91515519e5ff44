//! Replicas outliving the daemon (issue 14): for 1, 8 and 32 toy replicas, the time from the
//! daemon's `kill -9` to every replica being routed again by a new daemon (its start, the
//! adoption, one warm-up request each), next to the cold start the same replicas paid, and the
//! time `hearth upgrade` takes to hand them all over (during which the routed set never
//! changes).
//!
//! The toy replicas load for `--load-time` (2 s by default; `-- --load-time 30s` to go
//! further); a real model takes minutes, which is what adoption saves. Needs root and a
//! writable cgroup2 (replicas outlive the daemon only in a cgroup); fails saying so otherwise
//! (passes with a note under `HEARTH_ALLOW_SKIP=1`).
//!
//! Run: `cargo bench --bench outlive`. Without `--bench` (`cargo test --all-targets`) it is a
//! smoke run with 1 replica.

use std::time::{Duration, Instant};

use testkit::*;

fn routed_all(d: &Daemon, n: u64, timeout: Duration) -> Vec<String> {
    let m = d.wait_model("a", &format!("{n} routed"), timeout, |m| {
        m["routed"].as_u64() == Some(n)
    });
    let mut ids: Vec<String> = status::replicas_of(&m)
        .iter()
        .filter(|r| r["state"] == "routed")
        .map(status::id)
        .collect();
    ids.sort();
    ids
}

fn main() {
    // Without root or a writable cgroup2 this fails saying so (testkit::needs), unless
    // HEARTH_ALLOW_SKIP=1: no smoke run passes having measured nothing.
    if !needs_root("a cgroup2 subtree, which replicas need to outlive the daemon") {
        return;
    }
    let sizes: Vec<u32> = if bench_full() {
        vec![1, 8, 32]
    } else {
        vec![1]
    };
    let load: String = bench_arg("--load-time").unwrap_or_else(|| "2s".to_string());
    println!("replicas | cold start → all routed | kill -9 → all routed again | of which restart → socket | upgrade (op → new binary answering)");
    for n in sizes {
        let toy = Model::toy("a", &["--load-time", &load]).scale(n, n, 0);
        let t0 = Instant::now();
        let mut d = Daemon::builder()
            .model(toy)
            .tick("100ms")
            .ports((n + 8) as u16)
            .start();
        if !needs_cgroup2(&d) {
            return;
        }
        let before = routed_all(&d, n as u64, Duration::from_secs(300));
        let cold = t0.elapsed();
        let spawned = d.log().matches("spawned: ").count();

        let killed = Instant::now();
        d.signal(Signal::SIGKILL);
        d.wait_exit(Duration::from_secs(10)).expect("killed");
        d.restart();
        let socket_back = killed.elapsed();
        let after = routed_all(&d, n as u64, Duration::from_secs(300));
        let adopted = killed.elapsed();
        assert_eq!(after, before, "the same replicas are routed again");
        assert_eq!(
            d.log().matches("spawned: ").count(),
            spawned,
            "none cold-started"
        );

        let t = Instant::now();
        let out = d.cli(&["upgrade"]);
        let upgrade = t.elapsed();
        assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
        assert_eq!(routed_all(&d, n as u64, Duration::from_secs(60)), before);
        println!(
            "{n:>8} | {:>22.0} ms | {:>26.0} ms | {:>24.0} ms | {:>10.0} ms",
            cold.as_secs_f64() * 1e3,
            adopted.as_secs_f64() * 1e3,
            socket_back.as_secs_f64() * 1e3,
            upgrade.as_secs_f64() * 1e3,
        );
    }
}
