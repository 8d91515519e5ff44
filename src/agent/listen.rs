//! Binding the control socket, as pueue does: check its directory, replace only a stale socket
//! nobody answers on (never a file of another kind), then bind, chmod, listen.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

use super::paths;

/// Binds the socket: checks its directory first (paths.rs), replaces only a stale socket nobody
/// answers on (never a file of another kind), then binds, chmods 0660 and listens, so nobody
/// connects before the permissions hold.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    paths::secure_dir(paths::parent_of(path), 0o755, "socket directory")?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => anyhow::bail!("{}: another daemon is listening there", path.display()),
                Err(_) => {
                    // Nobody answers: a socket left by a daemon that died. Safe to replace.
                    std::fs::remove_file(path).map_err(|e| {
                        anyhow::anyhow!("removing stale socket {}: {e}", path.display())
                    })?;
                }
            }
        }
        Ok(meta) => anyhow::bail!(
            "{}: there is a {} there, not a socket; hearth does not delete it: remove it if it \
             is not needed, or set daemon.socket to another path",
            path.display(),
            kind(&meta.file_type())
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("{}: {e}", path.display()),
    }
    let fd: OwnedFd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &UnixAddr::new(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
    )
    .map_err(|e| anyhow::anyhow!("binding {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    listen(&fd, Backlog::new(1024)?)?;
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    Ok(UnixListener::from_std(std_listener)?)
}

/// What a file type is, in words.
fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_file() {
        "regular file"
    } else if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "file"
    }
}
