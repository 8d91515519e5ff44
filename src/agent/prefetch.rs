//! Weight prefetch: reads the files a model's `prefetch` globs match into the page cache before
//! its server reads them. Blocking I/O, run on its own thread, never on the core's task or the
//! spawner thread.
//!
//! Each file is announced with `posix_fadvise(WILLNEED)` (the kernel starts reading it
//! asynchronously) and then streamed through in 8 MiB reads, which waits for it to be resident
//! and measures progress. A pattern that matches nothing, or a file that can't be read, is a
//! warning, never a failure: the server reports its own errors if it needs that file.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One streaming read.
pub const CHUNK: usize = 8 << 20;
/// Progress is reported at most this often (and at the start and the end).
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Patterns that matched no file, and files that could not be read (with why).
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub progress: Progress,
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

/// Reads every file the patterns match, calling `report` at the start, every
/// `PROGRESS_EVERY` while reading, and at the end (`done == total` unless cancelled or a
/// file shrank). Stops early when `cancel` is set.
pub fn run(patterns: &[String], cancel: &AtomicBool, mut report: impl FnMut(&Progress)) -> Outcome {
    let start = Instant::now();
    let (files, missing) = expand(patterns);
    let mut p = Progress {
        done_bytes: 0,
        total_bytes: files.iter().map(|(_, n)| n).sum(),
        missing,
    };
    report(&p);
    let mut last = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut cancelled = false;
    'files: for (path, len) in &files {
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) => {
                p.missing.push(format!("{} ({e})", path.display()));
                p.total_bytes -= len;
                continue;
            }
        };
        // Advice only: on a filesystem that ignores it the reads below still do the work.
        let _ = nix::fcntl::posix_fadvise(
            file.as_fd(),
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        );
        let mut read_here = 0u64;
        loop {
            if cancel.load(Ordering::Relaxed) {
                cancelled = true;
                break 'files;
            }
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    // A file that grew since it was listed: count what is read, not more.
                    let n = n as u64;
                    let counted = n.min(len.saturating_sub(read_here));
                    read_here += n;
                    p.done_bytes += counted;
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
        if read_here < *len {
            p.total_bytes -= len - read_here;
        }
    }
    report(&p);
    Outcome {
        progress: p,
        files: files.len(),
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
    fn a_cancelled_prefetch_stops_early() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("w.bin");
        write(&a, 4 << 20);
        let out = run(&[a.display().to_string()], &AtomicBool::new(true), |_| {});
        assert!(out.cancelled);
        assert_eq!(out.progress.done_bytes, 0);
    }
}
