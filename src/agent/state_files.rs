//! Files under `state_dir`, which paths.rs checked before use, opened without following a link
//! at any step below it: every file by its name in a directory held open (`openat` with
//! `O_NOFOLLOW`), every subdirectory (`logs`) likewise, so that a symlink planted there
//! (`logs` to /etc, `replicas.json` to a secret) is refused and never followed — nothing is
//! read through it, written into its target, or chmod'ed there. Reads take regular files only,
//! bounded, and never wait on a FIFO (`O_NONBLOCK`); writes are atomic: a temporary file
//! created fresh (`O_EXCL`: whatever had its name, a leftover or a planted link, is removed
//! first), fsynced, renamed over the file, then the directory fsynced, so that a crash leaves
//! the old file or the new one, whole.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// What a planted link is called in errors.
const NOT_FOLLOWED: &str = "a symlink: hearth does not follow links in its state directory \
                            (remove it)";

/// A directory held open: `state_dir` itself (opened by its checked path), or one below it
/// opened from it without following links.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl Dir {
    /// `dir` itself, by its path (which paths.rs checked, links on the way included).
    pub fn open(dir: &Path) -> std::io::Result<Dir> {
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// The directory of the file at `path`, and the file's name in it.
    pub fn of_file(path: &Path) -> std::io::Result<(Dir, &OsStr)> {
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::other(format!("{}: no file name", path.display())))?;
        let dir = super::paths::parent_of(path);
        Ok((Dir::open(dir)?, name))
    }

    /// The subdirectory `name`, made with `mode` if it is missing, and given `mode` through
    /// its descriptor (never by path: a link would take the chmod elsewhere).
    pub fn subdir(&self, name: &str, mode: u32) -> std::io::Result<Dir> {
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            // O_DIRECTORY | O_NOFOLLOW on a link says ENOTDIR: say which it is.
            Errno::ENOTDIR if self.is_link(name) => refused(Errno::ELOOP),
            e => refused(e),
        })?;
        fchmod(&fd, Mode::from_bits_truncate(mode))?;
        Ok(Dir { fd })
    }

    fn is_link(&self, name: &str) -> bool {
        fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
    }

    /// The text of the regular file `name`, at most `max` bytes; None when there is none.
    pub fn read(&self, name: &OsStr, max: u64) -> std::io::Result<Option<String>> {
        let fd = match openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(refused(e)),
        };
        let file = File::from(fd);
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if meta.len() > max {
            return Err(std::io::Error::other(format!(
                "{} bytes, more than the {max} it may have",
                meta.len()
            )));
        }
        let mut text = String::new();
        file.take(max).read_to_string(&mut text)?;
        Ok(Some(text))
    }

    /// Replaces the file `name` with `bytes`, atomically (see the module documentation).
    pub fn write_atomic(&self, name: &OsStr, bytes: &[u8], mode: u32) -> std::io::Result<()> {
        let mut tmp = name.to_os_string();
        tmp.push(".tmp");
        match unlinkat(&self.fd, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = openat(
            &self.fd,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )?;
        let mut file = File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        renameat(&self.fd, tmp.as_os_str(), &self.fd, name)?;
        nix::unistd::fsync(self.fd.as_fd())?;
        Ok(())
    }

    /// The file `name` opened for appending, made with `mode` if it is missing.
    pub fn append(&self, name: &str, mode: u32) -> std::io::Result<File> {
        let fd = openat(
            &self.fd,
            name,
            OFlag::O_WRONLY
                | OFlag::O_APPEND
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(refused)?;
        Ok(File::from(fd))
    }

    /// Copies the regular file `name` to `to` (made afresh) and truncates it: rotation of a
    /// file a process keeps appending to.
    pub fn copy_truncate(&self, name: &str, to: &str, mode: u32) -> std::io::Result<()> {
        let src = openat(
            &self.fd,
            name,
            OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(refused)?;
        let mut src = File::from(src);
        if !src.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        self.remove(to)?;
        let dst = openat(
            &self.fd,
            to,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )?;
        std::io::copy(&mut src, &mut File::from(dst))?;
        src.set_len(0)
    }

    /// Removes the entry `name` (a link itself, never its target); a missing one is no error.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The regular files here, by name, with their size and modification time (seconds);
    /// links and everything else left out.
    pub fn files(&self) -> Vec<(String, u64, i64)> {
        let Ok(mut dir) = nix::dir::Dir::openat(
            &self.fd,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in dir.iter().flatten() {
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            let Some(name) = name.to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
                continue;
            }
            out.push((name.to_string(), st.st_size as u64, st.st_mtime));
        }
        out
    }
}

/// An open that `O_NOFOLLOW` stopped says so; other errors as they are. (The caller names the
/// path.)
fn refused(e: Errno) -> std::io::Error {
    match e {
        Errno::ELOOP => std::io::Error::other(NOT_FOLLOWED),
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_refused_at_every_step_and_their_targets_left_alone() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(victim.join("secret"), "precious").unwrap();
        let state = t.path().join("state");
        std::fs::create_dir(&state).unwrap();
        symlink(&victim, state.join("logs")).unwrap();
        symlink(victim.join("secret"), state.join("replicas.json")).unwrap();
        let dir = Dir::open(&state).unwrap();
        let e = dir.subdir("logs", 0o750).unwrap_err().to_string();
        assert!(
            e.contains("symlink") || e.contains("Not a directory"),
            "{e}"
        );
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the link's target was not chmod'ed");
        let e = dir
            .read(OsStr::new("replicas.json"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symlink"), "{e}");
        assert!(dir.append("replicas.json", 0o640).is_err());
        // A write replaces the link itself; the target keeps its content.
        dir.write_atomic(OsStr::new("replicas.json"), b"{}", 0o600)
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(victim.join("secret")).unwrap(),
            "precious"
        );
        assert_eq!(
            dir.read(OsStr::new("replicas.json"), 1 << 20).unwrap(),
            Some("{}".to_string())
        );
        // Listing leaves links out.
        symlink(victim.join("secret"), state.join("x.log")).unwrap();
        let names: Vec<String> = dir.files().into_iter().map(|f| f.0).collect();
        assert_eq!(names, vec!["replicas.json".to_string()]);
        // Rotation never writes through a link at the rotated name.
        let logs = dir.subdir("real-logs", 0o750).unwrap();
        logs.append("a.log", 0o640)
            .unwrap()
            .write_all(b"line\n")
            .unwrap();
        symlink(victim.join("secret"), state.join("real-logs/a.log.1")).unwrap();
        logs.copy_truncate("a.log", "a.log.1", 0o640).unwrap();
        assert_eq!(
            std::fs::read_to_string(victim.join("secret")).unwrap(),
            "precious"
        );
        assert_eq!(
            std::fs::read_to_string(state.join("real-logs/a.log.1")).unwrap(),
            "line\n"
        );
    }
}
