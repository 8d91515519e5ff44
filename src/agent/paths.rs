//! The directories the daemon keeps files in (the socket's, `state_dir`), checked before use.
//! hearth usually runs as root: a directory another user could write in would let that user
//! plant a symlink where the daemon writes (and have root overwrite any file), swap the socket
//! for one of their own, or feed it a state file. So each directory, and every directory above
//! it, must belong to root or to the daemon's own user, and none may be writable by anyone else
//! — except, above the last one, a sticky directory like /tmp (nobody can rename or remove
//! another's entries there). A group-writable directory is accepted where the group is root's,
//! or the owner's private group (the owner its only member: the user-private-group scheme, under
//! which a umask of 002 makes every directory group-writable).

use std::ffi::OsStr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use nix::unistd::{Gid, Group, Uid, User};

const STICKY: u32 = 0o1000;
/// Private directories to suggest instead of a shared one.
const PRIVATE_EXAMPLES: &str = "as root the defaults, /run/hearth for the socket and \
     /var/lib/hearth for state_dir; as another user, one of yours such as $XDG_RUNTIME_DIR/hearth";

/// Creates `dir` (and what is missing above it, with `mode`) if it is not there, then checks it
/// and every directory above it, both along the path as written and along the path its symlinks
/// lead to. `what` names it in errors ("state_dir", "socket directory").
pub fn secure_dir(dir: &Path, mode: u32, what: &str) -> anyhow::Result<()> {
    let dir = absolute(dir)?;
    if !dir.exists() {
        create(&dir, mode).with_context(|| format!("{what} {}: creating it", dir.display()))?;
    }
    let own = Uid::effective().as_raw();
    // As written: a symlink on the way must be ours or root's (the directory holding it is
    // checked too, so nobody else can replace it).
    check_chain(&dir, own, what, true)?;
    let real = std::fs::canonicalize(&dir)
        .with_context(|| format!("{what} {}: resolving it", dir.display()))?;
    if real != dir {
        check_chain(&real, own, what, false)?;
    }
    let meta = std::fs::metadata(&real)?;
    if !meta.is_dir() {
        bail!("{what} {}: not a directory", dir.display());
    }
    Ok(())
}

/// Creates `dir` with `mode` and what is missing above it with 0755: replicas running as
/// another account reach the socket through those (a state_dir of 0700 made with its parents
/// would otherwise shut them out of a socket beside it). The modes are set, not left to the
/// umask.
fn create(dir: &Path, mode: u32) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut p = dir;
    while !p.exists() {
        missing.push(p);
        match p.parent() {
            Some(up) => p = up,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        let m = if d == dir { mode } else { 0o755 };
        match std::fs::DirBuilder::new().mode(m).create(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(m))?,
            // Made meanwhile by someone else: checked like any directory that was there.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir()
        .context("the current directory")?
        .join(p))
}

/// Checks every prefix of `path` (absolute), the last one as the directory itself.
fn check_chain(path: &Path, own: u32, what: &str, lstat: bool) -> anyhow::Result<()> {
    let mut prefix = PathBuf::new();
    let parts: Vec<Component> = path.components().collect();
    for (i, c) in parts.iter().enumerate() {
        match c {
            Component::RootDir => prefix.push("/"),
            Component::Normal(n) => prefix.push(n),
            Component::ParentDir => prefix.push(".."),
            Component::CurDir | Component::Prefix(_) => continue,
        }
        let last = i + 1 == parts.len();
        let meta = if lstat {
            std::fs::symlink_metadata(&prefix)
        } else {
            std::fs::metadata(&prefix)
        }
        .with_context(|| format!("{what} {}: {}", path.display(), prefix.display()))?;
        if meta.file_type().is_symlink() {
            if meta.uid() != 0 && meta.uid() != own {
                bail!(
                    "{what} {}: {} is a symlink owned by uid {}: another user could point it \
                     elsewhere; use a path without it",
                    path.display(),
                    prefix.display(),
                    meta.uid()
                );
            }
            continue;
        }
        check_one(&prefix, &meta, own, last).map_err(|why| {
            anyhow::anyhow!(
                "{what} {}: {why}; hearth keeps files there that another user must not be able \
                 to replace",
                path.display()
            )
        })?;
    }
    Ok(())
}

/// One directory: whose it is, and who may write in it.
fn check_one(dir: &Path, meta: &std::fs::Metadata, own: u32, last: bool) -> Result<(), String> {
    let mode = meta.mode() & 0o7777;
    let shown = dir.display();
    if meta.uid() != 0 && meta.uid() != own {
        return Err(format!(
            "{shown} belongs to {} (uid {}), not to root or to the daemon's user",
            user_name(meta.uid()),
            meta.uid()
        ));
    }
    // Above the directory itself, a sticky directory is fine (/tmp): nobody can rename ours.
    let sticky = mode & STICKY != 0;
    let sticky_ok = !last && sticky;
    // A sticky directory is shared on purpose (/tmp, /var/tmp, /dev/shm): taking the others'
    // write permission away would break the machine, so the advice is a directory of its own.
    let remedy = |chmod: &str| {
        if sticky {
            format!(
                "{shown} is shared by design; give hearth a directory of its own that only root                  or the daemon's user can write in ({PRIVATE_EXAMPLES})"
            )
        } else {
            format!(
                "give hearth a directory of its own that only root or the daemon's user can                  write in ({PRIVATE_EXAMPLES}), or, if nothing else needs to write in                  {shown}, {chmod} {shown}"
            )
        }
    };
    if mode & 0o002 != 0 && !sticky_ok {
        return Err(format!(
            "{shown} is writable by every user (mode {mode:04o}): {}",
            remedy("chmod o-w")
        ));
    }
    if mode & 0o020 != 0 && !sticky_ok && !trusted_group(meta.gid(), meta.uid()) {
        return Err(format!(
            "{shown} is writable by group {} (mode {mode:04o}): {}",
            group_name(meta.gid()),
            remedy("chmod g-w")
        ));
    }
    Ok(())
}

/// A group whose write permission gives nobody but the owner anything: root's, or the owner's
/// private group (its primary group, with no member but the owner).
fn trusted_group(gid: u32, owner: u32) -> bool {
    if gid == 0 {
        return true;
    }
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(owner)) else {
        return false;
    };
    if user.gid.as_raw() != gid {
        return false;
    }
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(g)) => g.mem.iter().all(|m| m == &user.name),
        _ => false,
    }
}

fn user_name(uid: u32) -> String {
    User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

fn group_name(gid: u32) -> String {
    Group::from_gid(Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or_else(|| format!("{gid}"), |g| g.name)
}

/// The parent directory of a file path, "." for a bare name.
pub fn parent_of(file: &Path) -> &Path {
    match file.parent() {
        Some(p) if p.as_os_str() != OsStr::new("") => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_is_created_and_accepted() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b/state");
        secure_dir(&d, 0o700, "state_dir").unwrap();
        assert!(d.is_dir());
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // What was made above it is searchable by every account: a socket beside a private
        // state_dir stays reachable for replicas of another account.
        for above in [t.path().join("a"), t.path().join("a/b")] {
            let mode = std::fs::metadata(&above).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o755, "{}", above.display());
        }
    }

    #[test]
    fn a_shared_sticky_directory_gets_a_private_directory_suggested_never_a_chmod() {
        let like_tmp = tempfile::tempdir().unwrap();
        chmod(like_tmp.path(), 0o1777);
        for shared in [Path::new("/tmp"), like_tmp.path()] {
            let e = secure_dir(shared, 0o755, "socket directory")
                .unwrap_err()
                .to_string();
            assert!(e.contains("a directory of its own"), "{e}");
            assert!(!e.contains("chmod"), "advice that breaks the machine: {e}");
        }
        // A directory of one's own that others may write in: either way out is offered.
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("mine");
        std::fs::create_dir(&d).unwrap();
        chmod(&d, 0o777);
        let e = secure_dir(&d, 0o700, "state_dir").unwrap_err().to_string();
        assert!(
            e.contains("a directory of its own") && e.contains("chmod o-w"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_others_can_write_in_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        std::fs::create_dir(&d).unwrap();
        chmod(&d, 0o777);
        let e = secure_dir(&d, 0o700, "state_dir").unwrap_err().to_string();
        assert!(
            e.contains("writable by every user") && e.contains("0777"),
            "{e}"
        );
        assert!(e.starts_with(&format!("state_dir {}", d.display())), "{e}");
        // Sticky does not make the directory itself safe: others could plant files in it.
        chmod(&d, 0o1777);
        assert!(secure_dir(&d, 0o700, "state_dir").is_err());
        // Above it, a sticky directory (like /tmp) is fine; a plain world-writable one is not.
        let inner = d.join("inner");
        std::fs::create_dir(&inner).unwrap();
        chmod(&inner, 0o700);
        secure_dir(&inner, 0o700, "state_dir").unwrap();
        chmod(&d, 0o777);
        let e = secure_dir(&inner, 0o700, "state_dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&d.display().to_string()), "{e}");
    }

    #[test]
    fn a_group_writable_directory_is_refused_unless_the_group_is_root_s() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        std::fs::create_dir(&d).unwrap();
        chmod(&d, 0o770);
        let gid = std::fs::metadata(&d).unwrap().gid();
        let r = secure_dir(&d, 0o700, "state_dir");
        if gid == 0 || trusted_group(gid, Uid::effective().as_raw()) {
            r.unwrap();
        } else {
            assert!(r.unwrap_err().to_string().contains("writable by group"));
        }
        if Uid::effective().is_root() {
            // Root's own directory with a group others are in (nogroup, 65534): refused.
            nix::unistd::chown(&d, None, Some(Gid::from_raw(65534))).unwrap();
            let e = secure_dir(&d, 0o700, "state_dir").unwrap_err().to_string();
            assert!(e.contains("writable by group"), "{e}");
            chmod(&d, 0o750);
            secure_dir(&d, 0o700, "state_dir").unwrap();
        }
    }

    #[test]
    fn as_root_a_directory_of_another_user_is_refused() {
        if !Uid::effective().is_root() {
            eprintln!("NOTE: not root; skipped");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        std::fs::create_dir(&d).unwrap();
        chmod(&d, 0o700);
        nix::unistd::chown(&d, Some(Uid::from_raw(65534)), None).unwrap();
        let e = secure_dir(&d, 0o700, "state_dir").unwrap_err().to_string();
        assert!(e.contains("belongs to") && e.contains("65534"), "{e}");
        // A symlink another user owns on the way is refused too.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &link,
            Some(Uid::from_raw(65534)),
            None,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let mine = t.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        chmod(&mine, 0o700);
        let e = secure_dir(&link.join("mine"), 0o700, "state_dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("symlink owned by uid 65534"), "{e}");
    }
}
