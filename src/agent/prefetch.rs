//! Weight prefetch: reads the files a model's `prefetch` globs match into the page cache before
//! its server reads them. Blocking I/O, run on its own thread, never on the core's task or the
//! spawner thread.
//!
//! Each file is announced with `posix_fadvise(WILLNEED)` (the kernel starts reading it
//! asynchronously) and then streamed through in 8 MiB reads, which waits for it to be resident
//! and measures progress. A pattern that matches nothing, or a file that can't be read, is a
//! warning, never a failure: the server reports its own errors if it needs that file.
//!
//! Weights that cannot all stay in memory are not worth reading in full: by the time the last
//! byte is in, the first have been evicted, along with everything else the host had cached. So
//! the prefetch reads only as much as fits: the memory the kernel calls available (free plus
//! reclaimable), within the cgroup's limit where one applies, less a tenth kept for the server
//! that is starting, less what other prefetches under way will fill. Files are read in pattern
//! order, whole while they fit, then the part of the next that does; the server reads the rest
//! from disk itself.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One streaming read.
pub const CHUNK: usize = 8 << 20;
/// Progress is reported at most this often (and at the start and the end).
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Share of the room (in tenths) the prefetch plans to fill; the rest is kept for the server
/// that is starting and the rest of the host, whose allocations come out of the page cache.
const ROOM_TENTHS_USED: u64 = 9;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    pub done_bytes: u64,
    /// What this prefetch reads: every matched byte, or what fits (see `limit`).
    pub total_bytes: u64,
    /// Patterns that matched no file, and files that could not be read (with why).
    pub missing: Vec<String>,
    /// Set when the matched files would not fit in memory and only part of them is read.
    pub limit: Option<Limit>,
}

/// A prefetch cut short to what fits in memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Bytes the patterns matched.
    pub matched_bytes: u64,
    /// Memory available for the page cache when the prefetch started.
    pub room_bytes: u64,
    /// Of that, bytes other prefetches under way will fill.
    pub others_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub progress: Progress,
    /// Files read (in part, where only part of them fit).
    pub files: usize,
    pub elapsed: Duration,
    /// Stopped early because `cancel` was set.
    pub cancelled: bool,
}

/// The regular files `patterns` match, in pattern order, each once; and the patterns that
/// matched none (or are not valid globs).
pub fn expand(patterns: &[String]) -> (Vec<(PathBuf, u64)>, Vec<String>) {
    let mut files: Vec<(PathBuf, u64)> = Vec::new();
    let mut missing = Vec::new();
    for pat in patterns {
        let paths = match glob::glob(pat) {
            Ok(p) => p,
            Err(e) => {
                missing.push(format!("{pat} (not a valid pattern: {e})"));
                continue;
            }
        };
        let mut matched = false;
        for entry in paths {
            let Ok(path) = entry else { continue };
            // Directories and devices are not weights; `dir/**/*` reaches into a tree.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            matched = true;
            if !files.iter().any(|(p, _)| p == &path) {
                files.push((path, meta.len()));
            }
        }
        if !matched {
            missing.push(pat.clone());
        }
    }
    (files, missing)
}

/// The memory the page cache can grow into now: `MemAvailable` (free plus reclaimable), and
/// within a memory-limited cgroup (a container) no more than its limit less its anonymous
/// memory. None where the system does not say.
pub fn memory_room() -> Option<u64> {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    if sys.total_memory() == 0 {
        return None;
    }
    let available = sys.available_memory();
    // Page cache is charged to the cgroup of the process that reads it, and reclaimed within
    // the cgroup when it reaches its limit; only anonymous memory cannot make way.
    let in_cgroup = sys
        .cgroup_limits()
        .map(|c| c.total_memory.saturating_sub(c.rss));
    Some(in_cgroup.map_or(available, |c| c.min(available)))
}

/// What the prefetches under way in this process will fill, by file: a second prefetch must
/// not plan on memory the first is about to use, but replicas of one model read the same
/// files, which count once.
#[derive(Default)]
pub struct Plans(Mutex<HashMap<PathBuf, (u64, usize)>>);

/// The process's prefetches.
static PLANS: std::sync::LazyLock<Plans> = std::sync::LazyLock::new(Plans::default);

/// One prefetch's entries in [`Plans`], removed when it is dropped.
pub struct Planned<'a> {
    plans: &'a Plans,
    files: Vec<PathBuf>,
}

impl Plans {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (u64, usize)>> {
        // Plain counts, left consistent by every holder: a panicked holder broke nothing.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Plans to read `files` (in order, with their sizes) within `room` (None: unknown, no
    /// limit). Returns how much of each file to read, the limit when not all of it fits, and
    /// the entries that hold the plan until dropped.
    pub fn plan(
        &self,
        files: &[(PathBuf, u64)],
        room: Option<u64>,
    ) -> (Vec<u64>, Option<Limit>, Planned<'_>) {
        let mut plans = self.lock();
        let matched_bytes: u64 = files.iter().map(|(_, n)| n).sum();
        let mut want: Vec<u64> = files.iter().map(|(_, n)| *n).collect();
        let mut limit = None;
        if let Some(room_bytes) = room {
            let others_bytes: u64 = plans
                .iter()
                .filter(|(path, _)| !files.iter().any(|(p, _)| p == *path))
                .map(|(_, (bytes, _))| bytes)
                .sum();
            let budget = (room_bytes / 10)
                .saturating_mul(ROOM_TENTHS_USED)
                .saturating_sub(others_bytes);
            if matched_bytes > budget {
                let mut left = budget;
                for w in &mut want {
                    *w = (*w).min(left);
                    left -= *w;
                }
                limit = Some(Limit {
                    matched_bytes,
                    room_bytes,
                    others_bytes,
                });
            }
        }
        let mut held = Vec::new();
        for ((path, _), &bytes) in files.iter().zip(&want) {
            if bytes == 0 {
                continue;
            }
            let entry = plans.entry(path.clone()).or_insert((0, 0));
            entry.0 = entry.0.max(bytes);
            entry.1 += 1;
            held.push(path.clone());
        }
        let planned = Planned {
            plans: self,
            files: held,
        };
        (want, limit, planned)
    }

    /// Bytes planned by the prefetches under way.
    pub fn bytes(&self) -> u64 {
        self.lock().values().map(|(bytes, _)| bytes).sum()
    }
}

impl Drop for Planned<'_> {
    fn drop(&mut self) {
        let mut plans = self.plans.lock();
        for path in &self.files {
            if let Some(entry) = plans.get_mut(path) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    plans.remove(path);
                }
            }
        }
    }
}

/// Reads the files the patterns match, as much as fits in memory (see the module's comment),
/// calling `report` at the start, every `PROGRESS_EVERY` while reading, and at the end
/// (`done == total` unless cancelled or a file shrank). Stops early when `cancel` is set.
pub fn run(patterns: &[String], cancel: &AtomicBool, report: impl FnMut(&Progress)) -> Outcome {
    run_within(patterns, memory_room(), &PLANS, cancel, report)
}

/// [`run`] with the memory room and the plans of other prefetches given.
pub fn run_within(
    patterns: &[String],
    room: Option<u64>,
    plans: &Plans,
    cancel: &AtomicBool,
    mut report: impl FnMut(&Progress),
) -> Outcome {
    let start = Instant::now();
    let (files, missing) = expand(patterns);
    let (want, limit, _planned) = plans.plan(&files, room);
    let mut p = Progress {
        done_bytes: 0,
        total_bytes: want.iter().sum(),
        missing,
        limit,
    };
    report(&p);
    let mut last = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut cancelled = false;
    'files: for ((path, _), &len) in files.iter().zip(&want) {
        if len == 0 {
            continue;
        }
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) => {
                p.missing.push(format!("{} ({e})", path.display()));
                p.total_bytes -= len;
                continue;
            }
        };
        // Advice only: on a filesystem that ignores it the reads below still do the work. The
        // planned part only (length 0 would mean the whole file, past what fits).
        let _ = nix::fcntl::posix_fadvise(
            file.as_fd(),
            0,
            libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX),
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        );
        let mut read_here = 0u64;
        // Only the planned part: a file that grew since it was listed is not read further.
        while read_here < len {
            if cancel.load(Ordering::Relaxed) {
                cancelled = true;
                break 'files;
            }
            let max = usize::try_from(len - read_here).map_or(CHUNK, |left| left.min(CHUNK));
            match file.read(&mut buf[..max]) {
                Ok(0) => break,
                Ok(n) => {
                    read_here += n as u64;
                    p.done_bytes += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    p.missing.push(format!("{} ({e})", path.display()));
                    break;
                }
            }
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                report(&p);
            }
        }
        // A file that shrank (or failed half way): what was not read is not coming.
        if read_here < len {
            p.total_bytes -= len - read_here;
        }
    }
    report(&p);
    Outcome {
        progress: p,
        files: want.iter().filter(|&&w| w > 0).count(),
        elapsed: start.elapsed(),
        cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(path: &std::path::Path, len: usize) {
        let mut f = std::fs::File::create(path).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i| (i * 31 % 251) as u8).collect();
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            f.write_all(&block[..n]).unwrap();
            left -= n;
        }
    }

    #[test]
    fn reads_every_byte_reports_progress_and_warns_about_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("model-00001.safetensors");
        let b = dir.path().join("model-00002.safetensors");
        write(&a, 20 << 20);
        write(&b, 3 << 20);
        std::fs::create_dir(dir.path().join("sub.safetensors")).unwrap();
        let patterns = vec![
            format!("{}/*.safetensors", dir.path().display()),
            // Overlaps the first: each file is read once.
            a.display().to_string(),
            format!("{}/nothing-*.bin", dir.path().display()),
        ];
        let mut reports = Vec::new();
        let out = run(&patterns, &AtomicBool::new(false), |p| {
            reports.push(p.clone())
        });
        assert_eq!(out.files, 2, "regular files only, each once");
        assert_eq!(out.progress.total_bytes, 23 << 20);
        assert_eq!(out.progress.done_bytes, 23 << 20, "every byte read");
        assert_eq!(out.progress.missing, vec![patterns[2].clone()]);
        assert!(!out.cancelled);
        let first = reports.first().unwrap();
        assert_eq!((first.done_bytes, first.total_bytes), (0, 23 << 20));
        assert_eq!(reports.last().unwrap(), &out.progress);
        assert!(
            reports
                .windows(2)
                .all(|w| w[0].done_bytes <= w[1].done_bytes),
            "progress never goes back"
        );
    }

    #[test]
    fn nothing_to_read_is_not_a_failure() {
        let out = run(
            &["/nonexistent/hearth/*.bin".to_string(), "[".to_string()],
            &AtomicBool::new(false),
            |_| {},
        );
        assert_eq!(out.files, 0);
        assert_eq!((out.progress.done_bytes, out.progress.total_bytes), (0, 0));
        assert_eq!(out.progress.missing.len(), 2);
        assert!(out.progress.missing[1].contains("not a valid pattern"));
    }

    #[test]
    fn what_does_not_fit_is_left_to_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("model-00001.safetensors");
        let b = dir.path().join("model-00002.safetensors");
        let c = dir.path().join("model-00003.safetensors");
        write(&a, 6 << 20);
        write(&b, 6 << 20);
        write(&c, 6 << 20);
        let patterns = vec![format!("{}/*.safetensors", dir.path().display())];
        let plans = Plans::default();
        // 10 MiB of room, nine tenths of it used: 9 MiB, the first file and half the second.
        let mut first = None;
        let out = run_within(
            &patterns,
            Some(10 << 20),
            &plans,
            &AtomicBool::new(false),
            |p| {
                first.get_or_insert_with(|| p.clone());
            },
        );
        let limit = Limit {
            matched_bytes: 18 << 20,
            room_bytes: 10 << 20,
            others_bytes: 0,
        };
        let first = first.unwrap();
        assert_eq!((first.total_bytes, first.limit), (9 << 20, Some(limit)));
        assert_eq!(out.progress.done_bytes, 9 << 20);
        assert_eq!(out.progress.total_bytes, 9 << 20);
        assert_eq!(out.files, 2);
        assert!(out.progress.missing.is_empty());
        assert_eq!(plans.bytes(), 0, "the plan ends with the prefetch");

        // Everything fits: no limit, every byte.
        let out = run_within(
            &patterns,
            Some(100 << 20),
            &plans,
            &AtomicBool::new(false),
            |_| {},
        );
        assert_eq!(out.progress.limit, None);
        assert_eq!(out.progress.done_bytes, 18 << 20);
        // No room at all: nothing is read, and that is said.
        let out = run_within(&patterns, Some(0), &plans, &AtomicBool::new(false), |_| {});
        assert_eq!((out.progress.done_bytes, out.files), (0, 0));
        assert_eq!(out.progress.limit.unwrap().matched_bytes, 18 << 20);
    }

    #[test]
    fn prefetches_under_way_share_the_room_and_count_shared_files_once() {
        let file = |name: &str, len: u64| (PathBuf::from(format!("/w/{name}")), len);
        let plans = Plans::default();
        let model_a = [file("a1", 40), file("a2", 40)];
        let (want, limit, held_a) = plans.plan(&model_a, Some(100));
        assert_eq!((want, limit), (vec![40, 40], None));
        // A second replica of the same model plans the same files: they count once.
        let (want, limit, held_a2) = plans.plan(&model_a, Some(100));
        assert_eq!((want, limit), (vec![40, 40], None));
        assert_eq!(plans.bytes(), 80);
        // Another model gets what is left of the 90 usable: 10.
        let model_b = [file("b1", 30)];
        let (want, limit, held_b) = plans.plan(&model_b, Some(100));
        assert_eq!(want, vec![10]);
        assert_eq!(
            limit,
            Some(Limit {
                matched_bytes: 30,
                room_bytes: 100,
                others_bytes: 80
            })
        );
        drop(held_b);
        // Model a's files stay planned while either of its prefetches runs.
        drop(held_a);
        assert_eq!(plans.bytes(), 80);
        drop(held_a2);
        assert_eq!(plans.bytes(), 0);
        let (want, _, _held) = plans.plan(&model_b, Some(100));
        assert_eq!(want, vec![30]);
        // Unknown room: no limit.
        let (want, limit, _held) = plans.plan(&[file("huge", u64::MAX / 2)], None);
        assert_eq!((want, limit), (vec![u64::MAX / 2], None));
    }

    #[test]
    fn the_room_is_the_hosts_available_memory_at_most() {
        let room = memory_room().expect("Linux says how much memory is available");
        let mut sys = sysinfo::System::new();
        sys.refresh_memory();
        assert!(room > 0);
        assert!(
            room <= sys.total_memory(),
            "{room} > {}",
            sys.total_memory()
        );
    }

    #[test]
    fn a_cancelled_prefetch_stops_early() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("w.bin");
        write(&a, 4 << 20);
        let out = run(&[a.display().to_string()], &AtomicBool::new(true), |_| {});
        assert!(out.cancelled);
        assert_eq!(out.progress.done_bytes, 0);
    }
}
