//! A layer's disk image copied while the VM keeps running: copy before
//! write.
//!
//! Where the file system cannot clone (`clonefile`, `FICLONE`), the image
//! must be copied byte by byte, which takes time proportional to its data.
//! Instead of stopping the VM for that, [`DiskCopy`] copies the image's
//! data chunks ([`DISK_CHUNK_SIZE`] bytes) on the snapshot's writer thread
//! while the guest runs, and the VM's block device calls
//! [`DiskCopy::before_write`] before every write to the image: any chunk the
//! write reaches that is not copied yet is copied first, so the layer holds
//! the image exactly as it was when the copy began.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clone::open_source;
use crate::error::{Error, IoContext, Result};
use crate::file_hash::data_chunks;
use crate::format::chunks::{check_chunk_geometry, DISK_CHUNK_SIZE};

/// Granule of the holes a copy keeps, in bytes: a file system block.
const HOLE_GRAIN: usize = 4096;

/// A disk image being copied into a layer while the VM runs. Cloning the
/// handle shares the copy (the block device holds one, the writer another).
#[derive(Clone)]
pub struct DiskCopy(Arc<Inner>);

struct Inner {
    src: File,
    src_path: PathBuf,
    dst: File,
    dst_path: PathBuf,
    size: u64,
    /// Chunks still to copy; 0 once done (or given up after an error), so
    /// that [`DiskCopy::before_write`] costs one load from then on.
    left: AtomicU64,
    state: Mutex<CopyState>,
}

struct CopyState {
    /// One bit per chunk: set while the chunk still has to be copied.
    pending: Vec<u64>,
    /// A chunk's bytes in transit.
    buf: Vec<u8>,
    /// Chunks copied because a write was about to reach them.
    before_write: u64,
    /// The first failure; the copy stops there and the layer fails.
    error: Option<Error>,
}

/// How a finished [`DiskCopy`] went (its `before_write` goes to
/// [`super::DiskClone`], for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CopyCounts {
    /// Chunks that held data when the copy began.
    pub(crate) chunks: u64,
    /// Of those, chunks copied just before a write reached them (the rest
    /// were copied by the writer).
    pub(crate) before_write: u64,
}

fn bit(pending: &[u64], c: u64) -> bool {
    pending[(c / 64) as usize] & (1 << (c % 64)) != 0
}

impl DiskCopy {
    /// Starts copying `src` to the new file `dst`: creates `dst` with
    /// `src`'s length, all hole, and marks every [`DISK_CHUNK_SIZE`] chunk
    /// of `src` that holds data (`SEEK_DATA`/`SEEK_HOLE`) as to be copied.
    /// Nothing is copied yet: that is [`DiskCopy::run`]'s and
    /// [`DiskCopy::before_write`]'s work. Errors if `dst` exists, `src`
    /// cannot be read, or its length is not a valid disk size.
    pub(crate) fn start(src_path: &Path, dst_path: &Path) -> Result<Self> {
        let src = open_source(src_path)?;
        let size = src.metadata().ctx(src_path, "stat")?.len();
        let chunks = check_chunk_geometry(DISK_CHUNK_SIZE, size)
            .map_err(|e| Error::Usage(format!("disk image {}: {e}", src_path.display())))?;
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dst_path)
            .ctx(dst_path, "create")?;
        dst.set_len(size).ctx(dst_path, "set length")?;
        let mut pending = vec![0u64; chunks.div_ceil(64) as usize];
        let mut left = 0;
        for r in data_chunks(&src, src_path, size, DISK_CHUNK_SIZE)? {
            for c in r.start..r.end.min(chunks) {
                pending[(c / 64) as usize] |= 1 << (c % 64);
                left += 1;
            }
        }
        Ok(DiskCopy(Arc::new(Inner {
            src,
            src_path: src_path.to_path_buf(),
            dst,
            dst_path: dst_path.to_path_buf(),
            size,
            left: AtomicU64::new(left),
            state: Mutex::new(CopyState {
                pending,
                buf: Vec::new(),
                before_write: 0,
                error: None,
            }),
        })))
    }

    /// Call before writing bytes `offset..offset + len` of the source
    /// image: copies the chunks of that range that are not copied yet, and
    /// returns once they are. Never fails: a failure is kept for the
    /// writer, whose [`super::SnapshotWriter::complete_disk`] then fails (the
    /// write may go ahead).
    pub fn before_write(&self, offset: u64, len: u64) {
        let inner = &*self.0;
        if inner.left.load(Ordering::Acquire) == 0 || len == 0 || offset >= inner.size {
            return;
        }
        let end = offset.saturating_add(len).min(inner.size);
        let mut s = inner.lock();
        for c in offset / DISK_CHUNK_SIZE..end.div_ceil(DISK_CHUNK_SIZE) {
            if bit(&s.pending, c) {
                inner.copy(&mut s, c);
                s.before_write += 1;
            }
        }
    }

    /// Copies every chunk not copied yet (taking the lock per chunk, so
    /// writes wait for at most one chunk) and returns the counts, or the
    /// first error met here or in [`DiskCopy::before_write`].
    pub(crate) fn run(&self) -> Result<CopyCounts> {
        let inner = &*self.0;
        let chunks = inner.size.div_ceil(DISK_CHUNK_SIZE);
        let mut total = None;
        for c in 0..chunks {
            let mut s = inner.lock();
            if total.is_none() {
                total = Some(inner.left.load(Ordering::Acquire) + s.before_write);
            }
            if bit(&s.pending, c) {
                inner.copy(&mut s, c);
            }
        }
        let mut s = inner.lock();
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        s.buf = Vec::new();
        Ok(CopyCounts {
            chunks: total.unwrap_or(0),
            before_write: s.before_write,
        })
    }

    /// Stops copying: later writes go ahead without copying (the layer is
    /// being given up).
    pub(crate) fn abandon(&self) {
        let mut s = self.0.lock();
        s.pending.fill(0);
        self.0.left.store(0, Ordering::Release);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, CopyState> {
        // A panic while copying leaves at worst a chunk half-copied and
        // still pending, which the next attempt redoes.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies chunk `c` (pending) and clears its bit; on failure records
    /// the error and gives up the whole copy.
    fn copy(&self, s: &mut CopyState, c: u64) {
        match self.copy_chunk(&mut s.buf, c) {
            Ok(()) => {
                s.pending[(c / 64) as usize] &= !(1 << (c % 64));
                self.left.fetch_sub(1, Ordering::AcqRel);
            }
            Err(e) => {
                s.error.get_or_insert(e);
                s.pending.fill(0);
                self.left.store(0, Ordering::Release);
            }
        }
    }

    /// Copies chunk `c`; blocks of zeros ([`HOLE_GRAIN`] bytes) stay holes
    /// in the copy.
    fn copy_chunk(&self, buf: &mut Vec<u8>, c: u64) -> Result<()> {
        let off = c * DISK_CHUNK_SIZE;
        let n = (self.size - off).min(DISK_CHUNK_SIZE) as usize;
        buf.resize(DISK_CHUNK_SIZE as usize, 0);
        let buf = &mut buf[..n];
        self.src.read_exact_at(buf, off).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                Error::corrupt(
                    &self.src_path,
                    format!("file shrank while being copied (at offset {off})"),
                )
            } else {
                Error::io(&self.src_path, "read", e)
            }
        })?;
        let mut at = 0;
        while at < n {
            // The next run of blocks that are not all zeros.
            let is_zero = |i: usize| buf[i..(i + HOLE_GRAIN).min(n)].iter().all(|&b| b == 0);
            while at < n && is_zero(at) {
                at += HOLE_GRAIN;
            }
            let start = at;
            while at < n && !is_zero(at) {
                at += HOLE_GRAIN;
            }
            if start < n {
                let end = at.min(n);
                self.dst
                    .write_all_at(&buf[start..end], off + start as u64)
                    .ctx(&self.dst_path, "write")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = DISK_CHUNK_SIZE;

    fn image(dir: &Path, chunks: u64) -> PathBuf {
        let p = dir.join("src.img");
        let f = File::create(&p).unwrap();
        f.set_len(chunks * CS).unwrap();
        for c in (0..chunks).step_by(2) {
            f.write_all_at(&[c as u8 + 1; 4096], c * CS + 100).unwrap();
        }
        p
    }

    #[test]
    fn copy_holds_the_image_as_it_was_at_start() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 16);
        let before = std::fs::read(&src).unwrap();
        let copy = DiskCopy::start(&src, &d.path().join("dst.img")).unwrap();
        let w = OpenOptions::new().write(true).open(&src).unwrap();
        // Writes into a data chunk, a hole chunk and across two chunks,
        // each preceded by the hook as the block device does.
        for (off, len) in [(100, 10), (CS + 7, 5000), (4 * CS - 3, 10)] {
            copy.before_write(off, len);
            w.write_all_at(&vec![0xEE; len as usize], off).unwrap();
        }
        let counts = copy.run().unwrap();
        assert_eq!(counts.chunks, 8);
        // Chunks 0 and 4 (data) were copied before their writes; 1 and 3
        // are holes, nothing to copy.
        assert_eq!(counts.before_write, 2);
        assert_eq!(std::fs::read(d.path().join("dst.img")).unwrap(), before);
        // Done: later writes are not copied.
        copy.before_write(6 * CS, 10);
        assert_eq!(copy.run().unwrap().before_write, 2);
    }

    #[test]
    fn copy_keeps_holes_and_refuses_an_existing_destination() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 64);
        let dst = d.path().join("dst.img");
        DiskCopy::start(&src, &dst).unwrap().run().unwrap();
        let m = dst.metadata().unwrap();
        assert_eq!(m.len(), 64 * CS);
        assert!(m.blocks() * 512 < 32 * CS, "copy is not sparse");
        assert!(DiskCopy::start(&src, &dst).is_err());
    }

    #[test]
    fn a_failed_copy_reports_its_error_once_and_stops_copying() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 4);
        let copy = DiskCopy::start(&src, &d.path().join("dst.img")).unwrap();
        // The source shrinks under the copy: a clear error naming it.
        File::options()
            .write(true)
            .open(&src)
            .unwrap()
            .set_len(10)
            .unwrap();
        copy.before_write(2 * CS, 1);
        let e = copy.run().unwrap_err().to_string();
        assert!(e.contains("shrank") && e.contains("src.img"), "{e}");
        copy.before_write(0, 1);
        assert!(copy.run().is_ok());
    }

    #[test]
    fn abandon_stops_copying() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 4);
        let dst = d.path().join("dst.img");
        let copy = DiskCopy::start(&src, &dst).unwrap();
        copy.abandon();
        copy.before_write(0, 1);
        assert_eq!(copy.run().unwrap().before_write, 0);
        assert!(std::fs::read(&dst).unwrap().iter().all(|&b| b == 0));
    }
}
