//! A layer's disk copied while the VM keeps running: copy before write.
//!
//! Where the file system cannot clone the disk (`clonefile`, `FICLONE`), or
//! the layer stores only the chunks written since its parent (`disk.diff`),
//! the chunks must be copied, which takes time proportional to their data.
//! Instead of stopping the VM for that, [`DiskCopy`] copies them
//! ([`DISK_CHUNK_SIZE`] bytes each) on the snapshot's writer thread while
//! the guest runs, and the VM's block device calls [`DiskCopy::before_write`]
//! before every write to the disk: any chunk the write reaches that is not
//! copied yet is copied first, so the layer holds the disk exactly as it
//! was when the copy began.

use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::disk_source::DiskSource;
use crate::error::{Error, IoContext, Result};
use crate::format::chunks::{check_chunk_geometry, chunk_range, DISK_CHUNK_SIZE};

/// Granule of the holes a copy keeps, in bytes: a file system block.
const HOLE_GRAIN: usize = 4096;

/// A disk being copied into a layer while the VM runs. Cloning the handle
/// shares the copy (the block device holds one, the writer another).
#[derive(Clone)]
pub struct DiskCopy(Arc<Inner>);

impl std::fmt::Debug for DiskCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCopy")
            .field("dst", &self.0.dst_path)
            .field("left", &self.0.left.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Where the copy puts each chunk.
pub(crate) enum CopyLayout {
    /// A whole image (`disk.img`): chunk `c` at `c * DISK_CHUNK_SIZE`; the
    /// chunks that hold data are copied.
    Image,
    /// A clone of a file that holds the disk but for `chunks` (ranges of
    /// chunk indices), which are copied over it at `c * DISK_CHUNK_SIZE`,
    /// zeros included.
    Over {
        /// The chunks the clone lacks.
        chunks: Vec<Range<u64>>,
    },
    /// The slots of a `disk.diff`: `chunks[i]` at `data_offset + i *
    /// DISK_CHUNK_SIZE`; only those chunks are copied.
    Packed {
        /// The data offset of the diff.
        data_offset: u64,
        /// The chunks stored, strictly increasing.
        chunks: Vec<u64>,
    },
}

struct Inner {
    src: Arc<dyn DiskSource>,
    dst: File,
    dst_path: PathBuf,
    size: u64,
    layout: CopyLayout,
    /// The chunks to copy, as ranges, increasing.
    todo: Vec<Range<u64>>,
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
    /// Chunks to copy when the copy began.
    pub(crate) chunks: u64,
    /// Of those, chunks copied just before a write reached them (the rest
    /// were copied by the writer).
    pub(crate) before_write: u64,
}

fn bit(pending: &[u64], c: u64) -> bool {
    pending[(c / 64) as usize] & (1 << (c % 64)) != 0
}

impl DiskCopy {
    /// Starts copying the disk `src` into `dst`, a new file (with `prefix`
    /// written at its start) of `dst_len` bytes, all hole but the prefix
    /// (for [`CopyLayout::Over`], the clone, which must exist), and marks
    /// the chunks `layout` copies as to be copied: for [`CopyLayout::Image`]
    /// every [`DISK_CHUNK_SIZE`] chunk of `src` that holds data. Nothing else is copied yet: that is [`DiskCopy::run`]'s
    /// and [`DiskCopy::before_write`]'s work. Errors if `dst` exists or the
    /// disk's size is not a valid disk size.
    pub(crate) fn start(
        src: Arc<dyn DiskSource>,
        dst_path: &Path,
        layout: CopyLayout,
        prefix: &[u8],
        dst_len: u64,
    ) -> Result<Self> {
        let size = src.size();
        let chunks = check_chunk_geometry(DISK_CHUNK_SIZE, size)
            .map_err(|e| Error::Usage(format!("disk of {}: {e}", dst_path.display())))?;
        let todo = match &layout {
            CopyLayout::Image => src.data_chunks(DISK_CHUNK_SIZE)?,
            CopyLayout::Over { chunks } => chunks.clone(),
            CopyLayout::Packed { chunks, .. } => chunks.iter().map(|&c| c..c + 1).collect(),
        };
        let dst = match layout {
            CopyLayout::Over { .. } => OpenOptions::new().write(true).open(dst_path),
            _ => OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dst_path),
        }
        .ctx(dst_path, "open")?;
        dst.write_all_at(prefix, 0).ctx(dst_path, "write")?;
        dst.set_len(dst_len).ctx(dst_path, "set length")?;
        let mut pending = vec![0u64; chunks.div_ceil(64) as usize];
        let mut left = 0;
        for r in &todo {
            for c in r.start..r.end.min(chunks) {
                pending[(c / 64) as usize] |= 1 << (c % 64);
                left += 1;
            }
        }
        Ok(DiskCopy(Arc::new(Inner {
            src,
            dst,
            dst_path: dst_path.to_path_buf(),
            size,
            layout,
            todo,
            left: AtomicU64::new(left),
            state: Mutex::new(CopyState {
                pending,
                buf: Vec::new(),
                before_write: 0,
                error: None,
            }),
        })))
    }

    /// Call before writing bytes `offset..offset + len` of the disk: copies
    /// the chunks of that range that are not copied yet, and returns once
    /// they are. Never fails: a failure is kept for the writer, whose
    /// [`super::SnapshotWriter::complete_disk`] then fails (the write may go
    /// ahead).
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
        let mut total = None;
        for c in inner.todo.iter().flat_map(Clone::clone) {
            let mut s = inner.lock();
            if total.is_none() {
                total = Some(inner.left.load(Ordering::Acquire) + s.before_write);
            }
            if c / 64 < s.pending.len() as u64 && bit(&s.pending, c) {
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

    /// Where chunk `c` goes in the destination.
    fn dst_offset(&self, c: u64) -> Result<u64> {
        match &self.layout {
            CopyLayout::Image | CopyLayout::Over { .. } => Ok(c * DISK_CHUNK_SIZE),
            CopyLayout::Packed {
                data_offset,
                chunks,
            } => chunks
                .binary_search(&c)
                .map(|i| data_offset + i as u64 * DISK_CHUNK_SIZE)
                .map_err(|_| Error::Usage(format!("chunk {c} is not in the diff"))),
        }
    }

    /// Copies chunk `c`; blocks of zeros ([`HOLE_GRAIN`] bytes) stay holes
    /// in the copy (but over a clone, whose bytes there are others).
    fn copy_chunk(&self, buf: &mut Vec<u8>, c: u64) -> Result<()> {
        let r = chunk_range(c, DISK_CHUNK_SIZE, self.size);
        let n = (r.end - r.start) as usize;
        let to = self.dst_offset(c)?;
        buf.resize(DISK_CHUNK_SIZE as usize, 0);
        let buf = &mut buf[..n];
        self.src.read_exact_at(buf, r.start)?;
        if let CopyLayout::Over { .. } = self.layout {
            return self.dst.write_all_at(buf, to).ctx(&self.dst_path, "write");
        }
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
                    .write_all_at(&buf[start..end], to + start as u64)
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

    fn start(src: &Path, dst: &Path) -> Result<DiskCopy> {
        let img = Arc::new(crate::disk_source::DiskImage::open(src)?);
        let len = img.size();
        DiskCopy::start(img, dst, CopyLayout::Image, &[], len)
    }

    #[test]
    fn copy_holds_the_image_as_it_was_at_start() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 16);
        let before = std::fs::read(&src).unwrap();
        let copy = start(&src, &d.path().join("dst.img")).unwrap();
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
        start(&src, &dst).unwrap().run().unwrap();
        let m = dst.metadata().unwrap();
        assert_eq!(m.len(), 64 * CS);
        assert!(m.blocks() * 512 < 32 * CS, "copy is not sparse");
        assert!(start(&src, &dst).is_err());
    }

    #[test]
    fn a_failed_copy_reports_its_error_once_and_stops_copying() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 4);
        let copy = start(&src, &d.path().join("dst.img")).unwrap();
        // The source shrinks under the copy: a clear error naming it.
        File::options()
            .write(true)
            .open(&src)
            .unwrap()
            .set_len(10)
            .unwrap();
        copy.before_write(2 * CS, 1);
        let e = copy.run().unwrap_err().to_string();
        assert!(e.contains("shorter") && e.contains("src.img"), "{e}");
        copy.before_write(0, 1);
        assert!(copy.run().is_ok());
    }

    #[test]
    fn a_packed_copy_holds_only_its_chunks_in_slots() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 8);
        let before = std::fs::read(&src).unwrap();
        let img = Arc::new(crate::disk_source::DiskImage::open(&src).unwrap());
        let dst = d.path().join("disk.diff");
        let layout = CopyLayout::Packed {
            data_offset: 4096,
            chunks: vec![2, 5],
        };
        let copy = DiskCopy::start(img, &dst, layout, b"head", 4096 + 2 * CS).unwrap();
        // A write to chunk 2 (copied first), one to chunk 3 (not stored).
        let w = OpenOptions::new().write(true).open(&src).unwrap();
        for off in [2 * CS + 100, 3 * CS] {
            copy.before_write(off, 10);
            w.write_all_at(&[0xEE; 10], off).unwrap();
        }
        let counts = copy.run().unwrap();
        assert_eq!((counts.chunks, counts.before_write), (2, 1));
        let out = std::fs::read(&dst).unwrap();
        assert_eq!(out.len() as u64, 4096 + 2 * CS);
        assert_eq!(&out[..4], b"head");
        let slot = |i: u64| &out[(4096 + i * CS) as usize..(4096 + (i + 1) * CS) as usize];
        assert_eq!(slot(0), &before[(2 * CS) as usize..(3 * CS) as usize]);
        assert_eq!(slot(1), &before[(5 * CS) as usize..(6 * CS) as usize]);
    }

    #[test]
    fn abandon_stops_copying() {
        let d = tempfile::tempdir().unwrap();
        let src = image(d.path(), 4);
        let dst = d.path().join("dst.img");
        let copy = start(&src, &dst).unwrap();
        copy.abandon();
        copy.before_write(0, 1);
        assert_eq!(copy.run().unwrap().before_write, 0);
        assert!(std::fs::read(&dst).unwrap().iter().all(|&b| b == 0));
    }
}
