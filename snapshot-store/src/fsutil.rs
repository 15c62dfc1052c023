//! Small filesystem helpers: opening a store file safely, durable syncs,
//! no-replace rename, pids.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, IoContext, Result};

/// What kind of file `t` is, in words, for error messages: `a regular
/// file`, `a directory`, `a FIFO`, `a socket`, `a character device`, `a
/// block device`, `a symbolic link`.
pub fn file_kind(t: FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "of an unknown type"
    }
}

/// The error for `path`, which is `kind` ([`file_kind`]) where a regular
/// file must be: `PATH: not a regular file (a FIFO)`.
pub(crate) fn not_regular(path: &Path, kind: &str) -> Error {
    Error::corrupt(path, format!("not a regular file ({kind})"))
}

/// How [`open_regular`] treats a symbolic link at the path's last
/// component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Links {
    /// Refused, as a file that is not a regular file (a store's files).
    Refuse,
    /// Followed (a file the user names, such as a VM's disk image).
    Follow,
}

/// Opens `path` read-only and checks, through the open descriptor
/// (`fstat`), that it is a regular file. The open never blocks (a FIFO, a
/// socket or a device in a file's place is refused, not waited on:
/// `O_NONBLOCK`, cleared again once the file is known to be regular) and
/// never makes a terminal the controlling one (`O_NOCTTY`).
///
/// Errors: [`Error::Corrupt`] `PATH: not a regular file (KIND)` for
/// anything else (see [`file_kind`]); [`Error::Io`] (op `open`) if it
/// cannot be opened, of kind `NotFound` if it does not exist.
pub(crate) fn open_regular(path: &Path, links: Links) -> Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            // A symbolic link met with O_NOFOLLOW, a socket (which cannot
            // be opened), a device on a `nodev` mount: name what is there.
            let there = match links {
                Links::Refuse => path.symlink_metadata(),
                Links::Follow => path.metadata(),
            };
            match there {
                Ok(m) if !m.is_file() => not_regular(path, file_kind(m.file_type())),
                _ => Error::io(path, "open", e),
            }
        })?;
    let t = f.metadata().ctx(path, "stat")?.file_type();
    if !t.is_file() {
        return Err(not_regular(path, file_kind(t)));
    }
    set_blocking(&f).ctx(path, "fcntl")?;
    Ok(f)
}

/// Whether `e` is [`open_regular`]'s error for a path that does not exist.
pub(crate) fn is_not_found(e: &Error) -> bool {
    e.io_error()
        .is_some_and(|e| e.kind() == io::ErrorKind::NotFound)
}

/// Clears `O_NONBLOCK` on `f`.
fn set_blocking(f: &File) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFL)?);
    fcntl(f, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Opens the directory `path` without blocking, never through a symbolic
/// link at its last component.
fn open_dir(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match path.symlink_metadata() {
            Ok(m) if !m.is_dir() => Error::corrupt(
                path,
                format!("not a directory ({})", file_kind(m.file_type())),
            ),
            _ => Error::io(path, "open directory", e),
        })
}

/// fsync a regular file (on macOS `sync_all` is `F_FULLFSYNC`).
pub(crate) fn sync_file(path: &Path) -> Result<()> {
    open_regular(path, Links::Refuse)?
        .sync_all()
        .ctx(path, "fsync")
}

/// fsync a directory, so that entries created or renamed in it are durable.
pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    let d = open_dir(path)?;
    match d.sync_all() {
        Ok(()) => Ok(()),
        // Some filesystems refuse F_FULLFSYNC on a directory; plain fsync
        // still orders the directory update.
        Err(e)
            if cfg!(target_os = "macos")
                && matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOTSUP)) =>
        {
            nix::unistd::fsync(&d)
                .map_err(io::Error::from)
                .ctx(path, "fsync directory")
        }
        Err(e) => Err(crate::error::Error::io(path, "fsync directory", e)),
    }
}

/// Rename `from` to `to`, failing with `AlreadyExists` if `to` exists.
/// Atomic where the OS offers it (`renameat2(RENAME_NOREPLACE)` on Linux,
/// `renamex_np(RENAME_EXCL)` on macOS); elsewhere, or where the filesystem
/// refuses the flag, an existence check precedes a plain rename (which
/// still cannot replace a non-empty directory).
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    match rename_excl_native(from, to) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOTEMPTY)) => {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, e));
        }
        Err(e) => return Err(e),
    }
    if to.symlink_metadata().is_ok() {
        return Err(io::Error::from(io::ErrorKind::AlreadyExists));
    }
    std::fs::rename(from, to).map_err(|e| {
        if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOTEMPTY)) {
            io::Error::new(io::ErrorKind::AlreadyExists, e)
        } else {
            e
        }
    })
}

pub(crate) fn cstr(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

#[cfg(target_os = "linux")]
fn rename_excl_native(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both pointers are NUL-terminated strings that outlive the
    // call; AT_FDCWD makes them relative to the working directory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Old kernels (ENOSYS) or filesystems without the flag (EINVAL).
        Some(libc::ENOSYS) | Some(libc::EINVAL) => Err(io::Error::from(io::ErrorKind::Unsupported)),
        _ => Err(e),
    }
}

#[cfg(target_os = "macos")]
fn rename_excl_native(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both pointers are NUL-terminated strings that outlive the call.
    let r = unsafe { libc::renamex_np(f.as_ptr(), t.as_ptr(), libc::RENAME_EXCL) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOTSUP) | Some(libc::EINVAL) => {
            Err(io::Error::from(io::ErrorKind::Unsupported))
        }
        _ => Err(e),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn rename_excl_native(from: &Path, to: &Path) -> io::Result<()> {
    let _ = (from, to, cstr);
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Make a file read-only (mode 0444): committed layer files are immutable.
/// Makes `path` mode 0444. A file that already is (a disk image hard-linked
/// from the parent layer) is left alone: chmod would change its ctime and
/// so invalidate the parent's verified-file cache.
pub(crate) fn set_readonly(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::symlink_metadata(path)
        .ctx(path, "stat")?
        .permissions()
        .mode();
    if mode & 0o7777 == 0o444 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).ctx(path, "chmod")
}

/// `true` unless the process `pid` certainly does not exist (ESRCH).
pub(crate) fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::ESRCH) => false,
        Err(_) => true,
    }
}

/// A value unlikely to repeat across processes and calls, for temp names.
pub(crate) fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    // splitmix64 finaliser over time, pid and counter.
    let mut z = t ^ (u64::from(std::process::id()) << 32) ^ c.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte ranges of the `size`-byte `file` (increasing, disjoint) that hold
/// data according to `SEEK_DATA`/`SEEK_HOLE`; the rest is holes, which read
/// as zeros. Where the file system does not report holes, or reports
/// nonsense, the rest of the file counts as data. Two `lseek`s per region.
pub(crate) fn data_regions(
    file: &std::fs::File,
    path: &Path,
    size: u64,
) -> Result<Vec<std::ops::Range<u64>>> {
    use nix::errno::Errno;
    use nix::unistd::{lseek, Whence};
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let off = libc::off_t::try_from(pos).unwrap_or(libc::off_t::MAX);
        let data = match lseek(file, off, Whence::SeekData) {
            Ok(o) => o as u64,
            // No data after pos: the rest is a hole.
            Err(Errno::ENXIO) => break,
            // SEEK_DATA unsupported: everything is data.
            Err(Errno::EINVAL) => pos,
            Err(e) => return Err(crate::error::Error::io(path, "lseek(SEEK_DATA)", e.into())),
        };
        if data >= size {
            break;
        }
        let hole = match lseek(file, data as libc::off_t, Whence::SeekHole) {
            Ok(o) => (o as u64).min(size),
            Err(Errno::EINVAL) | Err(Errno::ENXIO) => size,
            Err(e) => return Err(crate::error::Error::io(path, "lseek(SEEK_HOLE)", e.into())),
        };
        let hole = if hole <= data { size } else { hole };
        out.push(data..hole);
        pos = hole;
    }
    Ok(out)
}

/// Bytes of `file`'s extents that the file system marks as shared with
/// another file (blocks of a `FICLONE` clone, or of a file it was cloned
/// from, not written since), or `None` where that cannot be known (not
/// Linux, or a file system without `FS_IOC_FIEMAP`). Linux: the FIEMAP
/// ioctl's `FIEMAP_EXTENT_SHARED` flag (Documentation/filesystems/fiemap).
pub(crate) fn shared_bytes(file: &File, path: &Path) -> Result<Option<u64>> {
    #[cfg(target_os = "linux")]
    {
        fiemap::shared_bytes(file, path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, path);
        Ok(None)
    }
}

#[cfg(target_os = "linux")]
mod fiemap {
    use super::*;
    use crate::error::Error;
    use std::os::fd::AsRawFd;

    /// `struct fiemap` (linux/fiemap.h), followed by room for [`BATCH`]
    /// extents.
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [Extent; BATCH],
    }

    /// `struct fiemap_extent`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }

    const BATCH: usize = 128;
    /// `_IOWR('f', 11, struct fiemap)`.
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const FIEMAP_EXTENT_LAST: u32 = 0x1;
    const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

    pub(super) fn shared_bytes(file: &File, path: &Path) -> Result<Option<u64>> {
        let empty = Extent {
            logical: 0,
            physical: 0,
            length: 0,
            reserved64: [0; 2],
            flags: 0,
            reserved: [0; 3],
        };
        let mut shared = 0u64;
        let mut start = 0u64;
        loop {
            let mut m = Box::new(Fiemap {
                start,
                length: u64::MAX - start,
                flags: 0,
                mapped_extents: 0,
                extent_count: BATCH as u32,
                reserved: 0,
                extents: [empty; BATCH],
            });
            // SAFETY: `m` is a `struct fiemap` with room for `extent_count`
            // extents, valid for the call; the kernel writes within it.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP as _, &mut *m) };
            if r != 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => Ok(None),
                    _ => Err(Error::io(path, "FIEMAP", e)),
                };
            }
            let n = (m.mapped_extents as usize).min(BATCH);
            if n == 0 {
                return Ok(Some(shared));
            }
            for x in &m.extents[..n] {
                if x.flags & FIEMAP_EXTENT_SHARED != 0 {
                    shared = shared.saturating_add(x.length);
                }
                if x.flags & FIEMAP_EXTENT_LAST != 0 {
                    return Ok(Some(shared));
                }
            }
            let last = &m.extents[n - 1];
            start = last.logical.saturating_add(last.length);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_never_replaces() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join("f"), b"1").unwrap();
        std::fs::create_dir(&b).unwrap();
        // Even an empty target directory is not replaced.
        let e = rename_noreplace(&a, &b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(a.join("f").exists());
        std::fs::remove_dir(&b).unwrap();
        rename_noreplace(&a, &b).unwrap();
        assert!(b.join("f").exists() && !a.exists());
        sync_dir(d.path()).unwrap();
        sync_file(&b.join("f")).unwrap();
    }

    #[test]
    fn pids() {
        assert!(pid_alive(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!pid_alive(pid));
        assert!(!pid_alive(0));
        assert_ne!(nonce(), nonce());
    }
}
