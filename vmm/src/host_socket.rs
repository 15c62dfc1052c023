//! Unix stream sockets the VMM listens on for host programs: the control
//! socket (`boot --control`) and the vsock device's host end (`boot
//! --vsock-uds`). Both are made the same way: a socket file left by a
//! process that is gone is replaced; a live one, or any other kind of file,
//! is refused and left alone; the new socket is its owner's only (mode
//! 0600) from the moment it exists.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Listens on `path` (see the module's doc). Errors: `AddrInUse` (a
/// process listens there), `AlreadyExists` (a file that is not a socket),
/// or the removal's or the bind's; the caller names the path.
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "in use: another process is listening on it",
                ))
            }
            // No one listens: a socket left by a process that is gone.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot remove the stale socket: {e}"))
                })?,
            Err(e) => return Err(e),
        },
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Owner-only from the start: no other user may connect in between.
    // (The umask is the process's: a file another thread creates meanwhile
    // is owner-only too, never more open.)
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn sockets_are_owner_only_stale_ones_replaced_live_ones_and_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.sock");
        // Even under a umask that would leave it open to all.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let live = listen(&p);
        nix::sys::stat::umask(old);
        let live = live.unwrap();
        let mode = std::fs::symlink_metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let e = listen(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert!(
            e.to_string().contains("another process is listening"),
            "{e}"
        );
        drop(live);
        listen(&p).unwrap();
        let f = dir.path().join("file");
        std::fs::write(&f, b"keep").unwrap();
        let e = listen(&f).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), b"keep");
    }
}
