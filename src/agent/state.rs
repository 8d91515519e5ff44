//! Runtime overrides that survive restarts (`hearth scale`), kept as JSON in `state_dir`, which
//! the daemon checked before use (paths.rs).
//!
//! Read at start: a file that does not read, or whose values the configuration cannot run (a
//! `max` past what `daemon.ports` holds), is never used and never overwritten: it is moved aside
//! as `overrides.json.corrupt-<unix time>`, the log says so and where, and the daemon starts
//! with the configuration file's values.
//!
//! Read and written through state_files.rs: never through a link, atomically.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::state_files::Dir;
use crate::config::Config;
use crate::core::{check_overrides, Overrides};

const FILE: &str = "overrides.json";
/// Far more than any set of overrides takes: a larger file is not read into memory.
const MAX_BYTES: u64 = 1 << 20;

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads the saved overrides for `config`. A missing file is no overrides. A file that cannot be
/// used is moved aside and reported (see the module documentation); only when even that fails
/// is it an error, since the next save would overwrite it.
pub fn load(state_dir: &Path, config: &Config) -> anyhow::Result<BTreeMap<String, Overrides>> {
    let p = path(state_dir);
    let why = match Dir::open(state_dir).and_then(|d| d.read(OsStr::new(FILE), MAX_BYTES)) {
        Ok(None) => return Ok(BTreeMap::new()),
        Ok(Some(text)) => match serde_json::from_str::<BTreeMap<String, Overrides>>(&text) {
            Ok(o) => match check_overrides(config, &o) {
                Ok(()) => return Ok(o),
                Err(e) => format!("its values do not fit the configuration: {e}"),
            },
            Err(e) => format!("it does not read: {e}"),
        },
        Err(e) => format!("it cannot be read: {e}"),
    };
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = state_dir.join(format!("{FILE}.corrupt-{secs}"));
    std::fs::rename(&p, &aside).map_err(|e| {
        anyhow::anyhow!(
            "{}: {why}; moving it aside to {} failed ({e}): fix or remove it",
            p.display(),
            aside.display()
        )
    })?;
    tracing::error!(
        "{}: {why}; kept aside as {} and not used: the configuration file's min, max and \
         warm_pool apply (`hearth scale` sets them again)",
        p.display(),
        aside.display()
    );
    Ok(BTreeMap::new())
}

/// Writes the overrides (see the module documentation for how).
pub fn save(state_dir: &Path, overrides: &BTreeMap<String, Overrides>) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(overrides)?;
    Dir::open(state_dir)?.write_atomic(OsStr::new(FILE), &bytes, 0o600)
}

/// Saves off the event loop: an fsync can take a slow disk tens of milliseconds, which the loop
/// that owns every replica must not wait for. One thread writes, in order; when saves queue up
/// behind a slow one only the newest is written (each is the whole set).
pub struct Saver {
    tx: Option<std::sync::mpsc::Sender<BTreeMap<String, Overrides>>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Saver {
    pub fn start(state_dir: PathBuf) -> Saver {
        let (tx, rx) = std::sync::mpsc::channel::<BTreeMap<String, Overrides>>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let started = std::thread::Builder::new()
            .name("hearth-state".into())
            .spawn(move || {
                let _done = done_tx;
                while let Ok(mut latest) = rx.recv() {
                    while let Ok(newer) = rx.try_recv() {
                        latest = newer;
                    }
                    if let Err(e) = save(&state_dir, &latest) {
                        tracing::error!("saving scale overrides in {}: {e}", state_dir.display());
                    }
                }
            });
        if let Err(e) = started {
            tracing::error!("no thread to save scale overrides with: {e}; they will not be kept");
        }
        Saver { tx: Some(tx), done }
    }

    /// Queues `overrides` to be written.
    pub fn save(&self, overrides: BTreeMap<String, Overrides>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(overrides);
        }
    }

    /// Waits, at most `within`, for what was queued to be written.
    pub fn finish(&mut self, within: std::time::Duration) {
        self.tx = None;
        let _ = self.done.recv_timeout(within);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const TMP: &str = "overrides.json.tmp";

    fn config() -> Config {
        let toml = r#"
[daemon]
ports = "30000-30009"
[[model]]
name = "a"
command = ["server", "{port}"]
gpus = 0
[model.warmup]
url = "http://127.0.0.1:{port}/"
[model.scaling]
max = 4
"#;
        Config::parse(toml, Path::new("t.toml")).unwrap()
    }

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn some() -> BTreeMap<String, Overrides> {
        BTreeMap::from([(
            "a".to_string(),
            Overrides {
                min: Some(2),
                max: Some(5),
                warm_pool: None,
                ..Default::default()
            },
        )])
    }

    #[test]
    fn a_planted_temporary_symlink_is_never_followed() {
        let d = dir();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join(TMP)).unwrap();
        save(d.path(), &some()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(load(d.path(), &config()).unwrap(), some());
        assert!(!d.path().join(TMP).exists());
        // A leftover regular file at the temporary name is replaced, not appended to.
        std::fs::write(d.path().join(TMP), "junk junk junk").unwrap();
        save(d.path(), &BTreeMap::new()).unwrap();
        assert_eq!(load(d.path(), &config()).unwrap(), BTreeMap::new());
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_said_and_never_overwritten() {
        let cases = [
            ("{\"a\": {\"max\": ", "does not read"),
            ("{\"a\": {\"max\": 4294967296}}", "does not read"),
            ("{\"a\": {\"max\": 4294967295}}", "do not fit"),
            ("{\"a\": {\"min\": 100000}}", "do not fit"),
            ("{\"a\": {\"min\": 3, \"max\": 2}}", "do not fit"),
        ];
        for (text, _why) in cases {
            let d = dir();
            std::fs::write(path(d.path()), text).unwrap();
            assert_eq!(
                load(d.path(), &config()).unwrap(),
                BTreeMap::new(),
                "{text}"
            );
            let aside: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("overrides.json.corrupt-"))
                .collect();
            assert_eq!(aside.len(), 1, "{text}: {aside:?}");
            let kept = std::fs::read_to_string(d.path().join(&aside[0])).unwrap();
            assert_eq!(kept, text, "kept as it was");
            assert!(!path(d.path()).exists());
            // The next save writes a new file and leaves the corrupt one alone.
            save(d.path(), &some()).unwrap();
            assert_eq!(
                std::fs::read_to_string(d.path().join(&aside[0])).unwrap(),
                text
            );
        }
    }

    #[test]
    fn a_symlink_or_a_fifo_at_the_file_is_not_read() {
        let d = dir();
        let secret = d.path().join("secret");
        std::fs::write(&secret, "{\"a\":{\"min\":2}}").unwrap();
        std::os::unix::fs::symlink(&secret, path(d.path())).unwrap();
        assert_eq!(load(d.path(), &config()).unwrap(), BTreeMap::new());
        assert!(secret.exists(), "the link's target is left alone");
        let d = dir();
        nix::unistd::mkfifo(
            &path(d.path()),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        // No writer ever comes: a blocking open would hang here.
        assert_eq!(load(d.path(), &config()).unwrap(), BTreeMap::new());
    }
}
