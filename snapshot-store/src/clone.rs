//! Copy-on-write file clones with a sparse-aware fallback.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, IoContext, Result};
use crate::fsutil::{open_regular, Links};

/// How [`clone_file`] produced the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMethod {
    /// APFS `clonefile(2)` (macOS): shares blocks until written.
    Clonefile,
    /// `ioctl(FICLONE)` (Linux btrfs, XFS, ...): shares extents until written.
    Ficlone,
    /// Byte copy of the data regions found with `SEEK_DATA`/`SEEK_HOLE`;
    /// holes stay holes.
    SparseCopy,
}

impl std::fmt::Display for CloneMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CloneMethod::Clonefile => "clonefile",
            CloneMethod::Ficlone => "FICLONE",
            CloneMethod::SparseCopy => "sparse copy",
        })
    }
}

/// `true` for errors that mean "this filesystem or pair of files cannot be
/// cloned", after which a copy is the right answer. Anything else (ENOSPC,
/// EACCES, EIO, ...) is a real failure and is reported.
fn clone_unsupported(e: &io::Error) -> bool {
    // ENOTSUP and EOPNOTSUPP are the same value on Linux, not on macOS.
    const CODES: [i32; 6] = [
        libc::ENOTSUP,
        libc::EOPNOTSUPP,
        libc::EXDEV,
        libc::EINVAL,
        libc::ENOTTY,
        libc::ENOSYS,
    ];
    e.raw_os_error().is_some_and(|c| CODES.contains(&c))
}

/// Copy the regular file `src` to the new path `dst` (which must not
/// exist), copy-on-write if the filesystem can: `clonefile` on macOS,
/// `FICLONE` on Linux, otherwise a sparse copy ([`CloneMethod::SparseCopy`]:
/// the data regions copied, holes left holes). Falls back only when
/// cloning is unsupported (ENOTSUP, EOPNOTSUPP, EXDEV, EINVAL, ENOTTY,
/// ENOSYS). Returns the method used so the caller can log it. On error
/// `dst` is removed if this call created it.
pub fn clone_file(src: &Path, dst: &Path) -> Result<CloneMethod> {
    open_source(src)?;
    match native_clone(src, dst) {
        Ok(Some(method)) => Ok(method),
        Ok(None) => sparse_copy(src, dst).map(|()| CloneMethod::SparseCopy),
        Err(e) => Err(e),
    }
}

/// Opens `src`, a file to copy (following a symbolic link), checking
/// through the descriptor that it is a regular file, without blocking on
/// anything else. Error: [`Error::Usage`] `SRC: not a regular file (KIND);
/// only regular files can be cloned`, or the open's.
pub(crate) fn open_source(src: &Path) -> Result<File> {
    open_regular(src, Links::Follow).map_err(|e| match e {
        Error::Corrupt { path, msg } => Error::Usage(format!(
            "{}: {msg}; only regular files can be cloned",
            path.display()
        )),
        e => e,
    })
}

/// Clones `src` to the new file `dst` with the filesystem's own clone, if
/// it has one for these files (`None`: it has not; `dst` was not made).
#[cfg(target_os = "macos")]
pub(crate) fn native_clone(src: &Path, dst: &Path) -> Result<Option<CloneMethod>> {
    let to_c = |p: &Path| crate::fsutil::cstr(p).map_err(|e| Error::io(p, "clone", e));
    let (s, d) = (to_c(src)?, to_c(dst)?);
    // SAFETY: both pointers are NUL-terminated strings that outlive the
    // call; flags 0 follows a symlinked source and never overwrites `dst`.
    let r = unsafe { libc::clonefile(s.as_ptr(), d.as_ptr(), 0) };
    if r == 0 {
        return Ok(Some(CloneMethod::Clonefile));
    }
    let e = io::Error::last_os_error();
    if clone_unsupported(&e) {
        Ok(None)
    } else {
        Err(Error::io(dst, "clonefile", e))
    }
}

#[cfg(target_os = "linux")]
pub(crate) fn native_clone(src: &Path, dst: &Path) -> Result<Option<CloneMethod>> {
    use std::os::fd::AsRawFd;
    let s = open_source(src)?;
    let d = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .ctx(dst, "create")?;
    // SAFETY: FICLONE takes the source descriptor as its integer argument;
    // both descriptors are open for the duration of the call.
    let r = unsafe { libc::ioctl(d.as_raw_fd(), libc::FICLONE, s.as_raw_fd()) };
    if r == 0 {
        return Ok(Some(CloneMethod::Ficlone));
    }
    let e = io::Error::last_os_error();
    drop(d);
    // Remove the empty target either way: sparse_copy creates its own.
    let _ = std::fs::remove_file(dst);
    if clone_unsupported(&e) {
        Ok(None)
    } else {
        Err(Error::io(dst, "FICLONE", e))
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(crate) fn native_clone(_src: &Path, _dst: &Path) -> Result<Option<CloneMethod>> {
    Ok(None)
}

const COPY_CHUNK: usize = 1 << 20;

/// Copy `src` to the new file `dst`, reading only the data regions that
/// `SEEK_DATA`/`SEEK_HOLE` report and leaving holes unwritten, then setting
/// the length; the result reads identically and keeps the source's holes.
/// If the filesystem does not report holes the whole file is copied. On
/// Linux the data moves in the kernel (`copy_file_range`), falling back to
/// `read`/`write` through a buffer where that is unsupported. On error
/// `dst` is removed.
fn sparse_copy(src: &Path, dst: &Path) -> Result<()> {
    sparse_copy_with(src, dst, true)
}

/// [`sparse_copy`], with the kernel copy allowed or not (tests cover both).
fn sparse_copy_with(src: &Path, dst: &Path, in_kernel: bool) -> Result<()> {
    let s = open_source(src)?;
    let d = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .ctx(dst, "create")?;
    let r = sparse_copy_fds(&s, src, &d, dst, in_kernel);
    if r.is_err() {
        drop(d);
        let _ = std::fs::remove_file(dst);
    }
    r
}

/// Copies bytes `off..end` of `s` to the same offsets of `d` in the kernel.
/// Returns how far it got: `end`, or less if the kernel cannot copy between
/// these files (the caller copies the rest itself).
#[cfg(target_os = "linux")]
fn kernel_copy(s: &File, src: &Path, d: &File, dst: &Path, mut off: u64, end: u64) -> Result<u64> {
    use std::os::fd::AsRawFd;
    while off < end {
        let mut off_in = off as libc::loff_t;
        let mut off_out = off as libc::loff_t;
        let want = (end - off).min(1 << 30) as usize;
        // SAFETY: both descriptors are open for the call; the offsets are
        // valid pointers to locals the kernel updates; flags must be 0.
        let n = unsafe {
            libc::copy_file_range(
                s.as_raw_fd(),
                &mut off_in,
                d.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        match n {
            0 => {
                return Err(Error::corrupt(
                    src,
                    format!("file shrank while being copied (at offset {off})"),
                ))
            }
            n if n > 0 => off += n as u64,
            _ => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(
                        libc::ENOSYS | libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::EBADF,
                    ) => return Ok(off),
                    _ => return Err(Error::io(dst, "copy_file_range", e)),
                }
            }
        }
    }
    Ok(off)
}

#[cfg(not(target_os = "linux"))]
fn kernel_copy(_: &File, _: &Path, _: &File, _: &Path, off: u64, _end: u64) -> Result<u64> {
    Ok(off)
}

fn sparse_copy_fds(s: &File, src: &Path, d: &File, dst: &Path, mut in_kernel: bool) -> Result<()> {
    let len = s.metadata().ctx(src, "stat")?.len();
    // Allocated on first use: only if the kernel cannot copy.
    let mut buf = Vec::new();
    for region in crate::fsutil::data_regions(s, src, len)? {
        let (mut off, hole) = (region.start, region.end);
        if in_kernel {
            off = kernel_copy(s, src, d, dst, off, hole)?;
            in_kernel = off == hole;
        }
        if off < hole && buf.is_empty() {
            buf = vec![0u8; COPY_CHUNK.min(len.max(1) as usize)];
        }
        while off < hole {
            let want = (hole - off).min(buf.len() as u64) as usize;
            let n = match s.read_at(&mut buf[..want], off) {
                Ok(0) => {
                    return Err(Error::corrupt(
                        src,
                        format!("file shrank while being copied (at offset {off})"),
                    ))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io(src, "read", e)),
            };
            d.write_all_at(&buf[..n], off).ctx(dst, "write")?;
            off += n as u64;
        }
    }
    d.set_len(len).ctx(dst, "set length")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn sparse_copy_keeps_content_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.img");
        let f = File::create(&src).unwrap();
        // 64 MiB file: data at 0, at 20 MiB and the last byte; holes between.
        f.write_all_at(&[1u8; 8192], 0).unwrap();
        f.write_all_at(&[2u8; 100_000], 20 << 20).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[3u8], (64 << 20) - 1).unwrap();
        drop(f);
        for in_kernel in [true, false] {
            let dst = dir.path().join(format!("dst-{in_kernel}.img"));
            sparse_copy_with(&src, &dst, in_kernel).unwrap();
            assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
            let (sm, dm) = (src.metadata().unwrap(), dst.metadata().unwrap());
            assert_eq!(sm.len(), dm.len());
            // The copy allocates about as much as the source, far below 64 MiB.
            assert!(
                dm.blocks() * 512 < 4 << 20,
                "copy not sparse: {} blocks",
                dm.blocks()
            );
            // dst must not exist beforehand.
            assert!(sparse_copy(&src, &dst).is_err());
        }
    }

    #[test]
    fn clone_reports_method_and_is_identical() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("disk.img");
        let f = File::create(&src).unwrap();
        f.set_len(32 << 20).unwrap();
        f.write_all_at(b"superblock", 1024).unwrap();
        f.write_all_at(&[9u8; 5000], 16 << 20).unwrap();
        drop(f);
        let dst = dir.path().join("clone.img");
        let m = clone_file(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let dm = dst.metadata().unwrap();
        assert!(dm.blocks() * 512 < 4 << 20, "{m}: clone not sparse");
        assert!(!m.to_string().is_empty());
        // Refuses to overwrite, and leaves the existing file alone.
        assert!(clone_file(&src, &dst).is_err());
        assert_eq!(std::fs::read(&dst).unwrap().len(), 32 << 20);
        // Not a regular file.
        assert!(clone_file(dir.path(), &dir.path().join("x")).is_err());
        // Empty file.
        let empty = dir.path().join("empty");
        File::create(&empty).unwrap();
        clone_file(&empty, &dir.path().join("empty2")).unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("empty2")).unwrap().len(),
            0
        );
    }
}
