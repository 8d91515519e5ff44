//! Runtime overrides that survive restarts (`hearth scale`), kept as JSON in `state_dir`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::core::Overrides;

const FILE: &str = "overrides.json";

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads the saved overrides. A missing file is no overrides; a broken one is reported and
/// ignored (the configuration file still holds), never a reason not to start.
pub fn load(state_dir: &Path) -> BTreeMap<String, Overrides> {
    let p = path(state_dir);
    match std::fs::read_to_string(&p) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("ignoring {}: {e}", p.display());
                BTreeMap::new()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => {
            tracing::error!("ignoring {}: {e}", p.display());
            BTreeMap::new()
        }
    }
}

/// Writes atomically: a crash mid-write leaves the old file, never half a file.
pub fn save(state_dir: &Path, overrides: &BTreeMap<String, Overrides>) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let p = path(state_dir);
    let tmp = p.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(overrides)?)?;
    std::fs::rename(&tmp, &p)
}
