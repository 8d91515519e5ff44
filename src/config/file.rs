//! Reading the configuration file: the daemon at start, a reload and `check-config` alike.

use std::path::Path;

use hearth_core::config::ConfigError;

/// A configuration file larger than this is refused rather than read into memory.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// The text of the configuration file at `path`, for the daemon at start, a reload and
/// `check-config` alike. Only a regular file of at most `MAX_FILE_BYTES` is read; it is opened
/// with O_NONBLOCK, so that a FIFO at the path is refused at once rather than waited on for
/// ever (a blocking open of a FIFO waits for a writer).
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |why: String| ConfigError {
        file: path.to_path_buf(),
        line: None,
        key: "-".to_string(),
        message: format!("cannot read configuration file: {why}"),
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| unreadable(e.to_string()))?;
    let meta = file.metadata().map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(unreadable(format!(
            "{} bytes; a configuration file is at most {MAX_FILE_BYTES}",
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| unreadable(e.to_string()))?;
    Ok(text)
}
