//! What benchmarks read off the machine and the processes they run.

use nix::time::{clock_gettime, ClockId};
use nix::unistd::{sysconf, SysconfVar};

use crate::procs::stat;

/// User + system CPU time of a process so far, in clock ticks ([`clk_tck`] a second).
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    stat(pid).map(|s| s.utime + s.stime)
}

/// Clock ticks per second.
pub fn clk_tck() -> f64 {
    sysconf(SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// Resident set size (VmRSS) in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The load averages ("load average 1.23 0.98 0.75 on 2 CPUs").
pub fn machine_load() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("load average {} on {cpus} CPUs", load.join(" "))
}

/// Nearest-rank percentile `p` (0–100) of sorted values; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// CLOCK_MONOTONIC in µs: the clock of sd_notify's MONOTONIC_USEC.
pub fn monotonic_usec() -> u64 {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000
}

/// Whether this benchmark runs in full: `cargo bench` passes `--bench`; without it (`cargo test
/// --all-targets`), benchmarks make a short smoke run.
pub fn bench_full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// A benchmark's option `NAME VALUE` from its command line (`cargo bench --bench B -- NAME V`).
pub fn bench_arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}
