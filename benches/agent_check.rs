//! The front door's CPU per HAProxy agent check (docs/fleet.md): a real daemon with the toy
//! model (2 routed + 1 warm, 4 slots each) and `hearth route` with `[route] agent_listen`;
//! `--checks` (default 10,000; 1,000 as a smoke run without `--bench`) checks from
//! `--clients` (default 4) threads, each a connection that sends `toy\n` and reads the answer
//! line, as HAProxy's agent does. Printed: the front door's process CPU (user + system, from
//! /proc) over the checks ÷ their number, raw and less what the idle front door spends in the
//! same time (its reports and ticker). The bar: ≤ 50 µs a check.
//! Run: `cargo bench --bench agent_check` (`-- --checks N --clients N`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use testkit::route::*;
use testkit::{bench_arg, bench_full, clk_tck, cpu_ticks, machine_load};

fn check(agent: SocketAddr) -> String {
    let mut s = TcpStream::connect(agent).expect("connect to the agent");
    s.write_all(b"toy\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

fn main() {
    let checks: usize = bench_arg("--checks").unwrap_or(if bench_full() { 10_000 } else { 1_000 });
    let clients: usize = bench_arg("--clients").unwrap_or(4);
    let block = ports::ports(1);
    let agent = SocketAddr::from(([127, 0, 0, 1], block.first));
    let (daemon, router, _addr) = front_door(
        [Model::front_toy("toy", &["--concurrency", "4"]).slots(4)],
        &format!("agent_listen = \"{agent}\"\n"),
    );
    daemon.wait_routed("toy", 2, Duration::from_secs(60));
    wait_until("the agent answering ready", Duration::from_secs(30), || {
        check(agent).starts_with("up ready").then_some(())
    });
    let pid = router.pid().expect("the front door runs");
    let seconds = |ticks: u64| ticks as f64 / clk_tck();
    // The idle front door over a comparable stretch: its reports every 100 ms and its ticker.
    let idle_for = Duration::from_secs(3);
    let c0 = cpu_ticks(pid).unwrap();
    std::thread::sleep(idle_for);
    let idle_per_sec = seconds(cpu_ticks(pid).unwrap() - c0) / idle_for.as_secs_f64();

    let c0 = cpu_ticks(pid).unwrap();
    let t0 = Instant::now();
    let per = checks.div_ceil(clients);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                (0..per)
                    .filter(|_| check(agent).starts_with("up ready"))
                    .count()
            })
        })
        .collect();
    let ready: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let wall = t0.elapsed();
    let cpu = seconds(cpu_ticks(pid).unwrap() - c0);
    let n = (per * clients) as f64;
    let net = (cpu - idle_per_sec * wall.as_secs_f64()).max(0.0);
    println!(
        "agent checks: {} from {clients} clients in {:.2} s ({:.0}/s), {ready} answered ready; {}",
        per * clients,
        wall.as_secs_f64(),
        n / wall.as_secs_f64(),
        machine_load()
    );
    println!(
        "front door CPU: {:.1} µs a check ({:.3} s over the checks); {:.1} µs less the idle front \
         door's {:.1} ms/s (bar: 50 µs)",
        cpu * 1e6 / n,
        cpu,
        net * 1e6 / n,
        idle_per_sec * 1000.0
    );
    drop(router);
}
