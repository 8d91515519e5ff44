//! Weight prefetch benchmark: time from spawn to ready of a toy server that reads a 2 GiB
//! "weights" file while loading (`--read-file`), from a cold page cache, with and without
//! hearth's prefetch (`hearth::agent::prefetch::run`, the function the supervisor runs).
//!
//! `cargo bench --bench prefetch` (env: PREFETCH_BENCH_GIB=2, PREFETCH_BENCH_DIR=<dir on disk>,
//! PREFETCH_BENCH_ROUNDS=3, PREFETCH_BENCH_LOAD_S=0,2: the toy's other loading work in seconds,
//! one set of cases per value). Without `--bench` it is a smoke run: 64 MiB, one round, no other
//! loading work, fadvise eviction only.
//!
//! Cases, each from a cold cache:
//! - `none`: spawn → ready, the server reads the file itself.
//! - `prefetch, then spawn`: read the files, then fork the server; time from the start of the
//!   prefetch to ready (what hearth did first; measured slower, so it no longer does).
//! - `prefetch alongside spawn`: the prefetch runs on another thread while the server starts:
//!   what hearth does when a replica is placed at once.
//! - `prefetch during back-off`: the prefetch starts when the replica is wanted, during a
//!   restart back-off (or a wait for GPU room), and the server is spawned when that ends: what
//!   hearth does then; time from the spawn to ready.
//!
//! Cold cache: `echo 1 > /proc/sys/vm/drop_caches` where writable (root outside a container);
//! otherwise `posix_fadvise(DONTNEED)` on the file, which drops its clean pages unprivileged.
//! Residency after eviction is measured with util-linux's `fincore` (mincore(2)) and printed.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use testkit::{bench_full, hearth};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes `bytes` of xorshift noise (incompressible, so no filesystem or device shortcut).
fn write_weights(path: &Path, bytes: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    let f = f.into_inner().map_err(|e| e.into_error())?;
    // Clean pages only can be dropped: flush to disk now.
    f.sync_all()
}

#[derive(Clone, Copy, PartialEq)]
enum Evict {
    DropCaches,
    Fadvise,
}

impl Evict {
    fn describe(self) -> &'static str {
        match self {
            Evict::DropCaches => "echo 1 > /proc/sys/vm/drop_caches",
            Evict::Fadvise => {
                "posix_fadvise(POSIX_FADV_DONTNEED) on the file (a smoke run, or drop_caches is not writable here)"
            }
        }
    }
}

fn evict(path: &Path, how: Evict) -> Evict {
    if how == Evict::DropCaches {
        let ok = std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/sys/vm/drop_caches")
            .and_then(|mut f| f.write_all(b"1\n"))
            .is_ok();
        if ok {
            return Evict::DropCaches;
        }
    }
    let f = std::fs::File::open(path).expect("open weights");
    nix::fcntl::posix_fadvise(
        f.as_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .expect("fadvise DONTNEED");
    Evict::Fadvise
}

/// Share of the file's bytes in the page cache, as `fincore` (mincore(2) on a mapping of the
/// file) counts them; NaN where fincore is missing.
fn resident(path: &Path) -> f64 {
    let len = std::fs::metadata(path).expect("the weights' size").len();
    if len == 0 {
        return 0.0;
    }
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output();
    out.ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(f64::NAN, |res| res as f64 / len as f64)
}

/// Spawns the toy server and returns how long until it says it is ready.
fn spawn_to_ready(weights: &Path, load: Duration) -> Duration {
    let port = testkit::ports::ports(1);
    let t0 = Instant::now();
    let mut child = Command::new(hearth())
        .args(["toy-server", "--port", &port.first.to_string()])
        .arg("--read-file")
        .arg(weights)
        .args(["--load-time", &format!("{}ms", load.as_millis())])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn toy-server");
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut ready = None;
    for line in out.lines() {
        let line = line.expect("toy stdout");
        if line.contains("toy-server ready") {
            ready = Some(t0.elapsed());
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    ready.expect("the toy server became ready")
}

fn prefetch(weights: &Path) -> Duration {
    let t = Instant::now();
    let out = hearth::agent::prefetch::run(
        &[weights.display().to_string()],
        &AtomicBool::new(false),
        |_| {},
    );
    assert_eq!(out.progress.done_bytes, out.progress.total_bytes);
    assert!(out.progress.missing.is_empty());
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    // `cargo bench` passes --bench. Without it (`cargo test --all-targets`, CI's smoke run) the
    // same cases run once on a 64 MiB file with no other loading work, evicted with fadvise
    // alone: a smoke run that drops no one else's page cache.
    let full = bench_full();
    let gib: f64 = env_or("PREFETCH_BENCH_GIB", if full { 2.0 } else { 1.0 / 16.0 });
    let rounds: usize = env_or("PREFETCH_BENCH_ROUNDS", if full { 3 } else { 1 });
    let base: PathBuf = std::env::var_os("PREFETCH_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let weights = dir.path().join("model.safetensors");
    let bytes = (gib * (1u64 << 30) as f64) as u64;
    let t = Instant::now();
    write_weights(&weights, bytes).expect("write the weights file");
    println!(
        "weights: {} ({:.2} GiB, written and synced in {:.1} s)",
        weights.display(),
        bytes as f64 / (1u64 << 30) as f64,
        t.elapsed().as_secs_f64()
    );
    let how = evict(
        &weights,
        if full {
            Evict::DropCaches
        } else {
            Evict::Fadvise
        },
    );
    let cold = resident(&weights);
    println!(
        "cold cache by: {}; resident after eviction: {:.1} %",
        how.describe(),
        cold * 100.0
    );
    // Warm reference: the server reading a file that is already cached.
    let _ = spawn_to_ready(&weights, Duration::ZERO);
    let hot = spawn_to_ready(&weights, Duration::ZERO);
    println!(
        "reference: spawn → ready with the file already cached: {:.2} s",
        hot.as_secs_f64()
    );

    let loads: Vec<Duration> = match std::env::var("PREFETCH_BENCH_LOAD_S") {
        Ok(v) => v
            .split(',')
            .filter_map(|x| x.trim().parse::<f64>().ok())
            .map(Duration::from_secs_f64)
            .collect(),
        Err(_) if full => vec![Duration::ZERO, Duration::from_secs(2)],
        Err(_) => vec![Duration::ZERO],
    };
    for load in loads {
        run_cases(&weights, bytes, how, load, rounds);
    }
}

fn run_cases(weights: &Path, bytes: u64, how: Evict, load: Duration, rounds: usize) {
    println!();
    println!(
        "== the toy's other loading work (--load-time, concurrent with its read): {:.1} s ==",
        load.as_secs_f64()
    );
    let mut none = Vec::new();
    let mut serial = Vec::new();
    let mut alongside = Vec::new();
    let mut backoff = Vec::new();
    let mut prefetch_alone = Vec::new();
    for round in 1..=rounds {
        let mut resident_before = Vec::new();
        cold(weights, how, &mut resident_before);
        let a = spawn_to_ready(weights, load);
        none.push(a.as_secs_f64());

        cold(weights, how, &mut resident_before);
        let t = Instant::now();
        let p = prefetch(weights);
        let s = spawn_to_ready(weights, load);
        let b = t.elapsed();
        serial.push(b.as_secs_f64());
        prefetch_alone.push(p.as_secs_f64());

        // Prefetch on another thread while the server starts and reads.
        cold(weights, how, &mut resident_before);
        let w = weights.to_path_buf();
        let helper = std::thread::spawn(move || prefetch(&w));
        let d = spawn_to_ready(weights, load);
        let _ = helper.join();
        alongside.push(d.as_secs_f64());

        // A restart back-off as long as the prefetch takes (the core's back-off is 1 s doubling
        // to 5 min): the replacement is spawned when the back-off ends.
        cold(weights, how, &mut resident_before);
        let t = Instant::now();
        let p2 = prefetch(weights);
        let back_off = p2.max(Duration::from_secs(1));
        std::thread::sleep(back_off.saturating_sub(t.elapsed()));
        let c = spawn_to_ready(weights, load);
        backoff.push(c.as_secs_f64());
        prefetch_alone.push(p2.as_secs_f64());
        println!(
            "round {round}: none {:.2} s | prefetch {:.2} s then spawn→ready {:.2} s = {:.2} s | alongside {:.2} s | after a {:.1} s back-off {:.2} s   (resident before each: {})",
            a.as_secs_f64(),
            p.as_secs_f64(),
            s.as_secs_f64(),
            b.as_secs_f64(),
            d.as_secs_f64(),
            back_off.as_secs_f64(),
            c.as_secs_f64(),
            resident_before
                .iter()
                .map(|r| format!("{:.1} %", r * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let (n, s, a, c) = (
        median(none),
        median(serial),
        median(alongside),
        median(backoff),
    );
    let p = median(prefetch_alone);
    let mib = bytes as f64 / (1u64 << 20) as f64;
    println!(
        "median of {rounds} (cold prefetch alone: {p:.2} s, {:.0} MiB/s):",
        mib / p.max(1e-3)
    );
    println!("  no prefetch                spawn → ready {n:.2} s   ratio 1.00");
    println!(
        "  prefetch, then spawn       start → ready {s:.2} s   ratio {:.2}   (not done: slower)",
        s / n
    );
    println!(
        "  prefetch alongside spawn   spawn → ready {a:.2} s   ratio {:.2}",
        a / n
    );
    println!(
        "  prefetch during back-off   spawn → ready {c:.2} s   ratio {:.2}",
        c / n
    );
}

/// Evicts the weights, keeps the hearth binary itself cached (so only the weights are cold),
/// and records the weights' residency.
fn cold(weights: &Path, how: Evict, resident_before: &mut Vec<f64>) {
    evict(weights, how);
    let _ = std::fs::read(hearth());
    resident_before.push(resident(weights));
}
