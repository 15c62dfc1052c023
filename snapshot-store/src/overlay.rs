//! A restored VM's writable disk without a copy ([`DiskOverlay`]): the
//! chain's disk ([`ChainDisk`], immutable) below, and a private overlay file
//! above it that holds, chunk by chunk, what the VM wrote. A chunk is read
//! from the chain until the VM first writes to it; that write copies the
//! chunk up into the overlay (its zero blocks left as holes), and from then
//! on the chunk is the overlay's. Starting costs no copy on any file
//! system, and two overlays on one chain never see each other's writes.
//!
//! The overlay file has no metadata: which chunks it holds is in memory
//! (one bit per chunk), so nothing in it is ever parsed. It is the VM's
//! scratch file, removed with the VM's work directory; a snapshot stores
//! the chunks written since its parent (`disk.diff`).

use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::chain_disk::{merge_ranges, ChainDisk};
use crate::disk_source::{read_file_at, DiskSource};
use crate::error::{Error, IoContext, Result};
use crate::format::chunks::chunk_range;

/// Blocks of zeros this long stay holes when a chunk is copied up.
const HOLE_GRAIN: usize = 4096;

/// A chain's disk with the VM's writes in a private overlay file: see the
/// module's doc. Reads and writes may come from several threads; writes are
/// serialised.
#[derive(Debug)]
pub struct DiskOverlay {
    base: ChainDisk,
    file: File,
    path: PathBuf,
    size: u64,
    chunk_size: u64,
    /// One bit per chunk: set once the chunk is in the overlay (after its
    /// data is).
    present: Vec<AtomicU64>,
    /// One bit per chunk whose copy-up failed part way: its next copy-up
    /// writes the whole chunk, zeros included (what the failed one wrote is
    /// not a hole any more).
    tainted: Vec<AtomicU64>,
    /// Held by a write; the buffer of a chunk being copied up.
    write: Mutex<Vec<u8>>,
}

impl DiskOverlay {
    /// Creates the overlay file `path` (which must not exist; mode 0600,
    /// as long as the disk, all hole) over `base`. Nothing is copied.
    pub fn create(base: ChainDisk, path: &Path) -> Result<DiskOverlay> {
        let size = base.size();
        let chunk_size = base.chunk_size();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .ctx(path, "create")?;
        file.set_len(size).ctx(path, "set length")?;
        let words = size.div_ceil(chunk_size).div_ceil(64) as usize;
        Ok(DiskOverlay {
            base,
            file,
            path: path.to_path_buf(),
            size,
            chunk_size,
            present: (0..words).map(|_| AtomicU64::new(0)).collect(),
            tainted: (0..words).map(|_| AtomicU64::new(0)).collect(),
            write: Mutex::new(Vec::new()),
        })
    }

    /// The overlay file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The chain's disk below the overlay.
    pub fn base(&self) -> &ChainDisk {
        &self.base
    }

    /// Chunks (of [`ChainDisk::chunk_size`] bytes) the overlay holds: those
    /// the VM has written since the overlay was made.
    pub fn overlay_chunks(&self) -> u64 {
        self.present
            .iter()
            .map(|w| u64::from(w.load(Ordering::Acquire).count_ones()))
            .sum()
    }

    fn is_present(&self, chunk: u64) -> bool {
        bit(&self.present, chunk)
    }

    /// Calls `each(chunk, offset in the chunk, position in the range, len)`
    /// for the pieces of `len` bytes at `offset`, one per chunk, after
    /// checking the range is inside the disk.
    fn pieces(
        &self,
        offset: u64,
        len: usize,
        mut each: impl FnMut(u64, u64, usize, usize) -> Result<()>,
    ) -> Result<()> {
        if offset.checked_add(len as u64).is_none_or(|e| e > self.size) {
            return Err(Error::Usage(format!(
                "{}: {len} bytes at {offset} are beyond the {}-byte disk",
                self.path.display(),
                self.size
            )));
        }
        let mut at = 0usize;
        while at < len {
            let off = offset + at as u64;
            let chunk = off / self.chunk_size;
            let within = off - chunk * self.chunk_size;
            let n = ((self.chunk_size - within) as usize).min(len - at);
            each(chunk, within, at, n)?;
            at += n;
        }
        Ok(())
    }

    /// Writes `buf` at `offset` of the disk: a chunk the overlay holds is
    /// written in place; any other is first copied up from the chain (the
    /// whole chunk, with `buf`'s part in it). Errors name the file that
    /// failed; a chunk whose copy-up failed stays the chain's.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut scratch = self.write.lock().unwrap_or_else(|e| e.into_inner());
        self.pieces(offset, buf.len(), |chunk, within, at, n| {
            let piece = &buf[at..at + n];
            let off = chunk * self.chunk_size + within;
            if self.is_present(chunk) {
                return self.file.write_all_at(piece, off).ctx(&self.path, "write");
            }
            let r = chunk_range(chunk, self.chunk_size, self.size);
            let whole = (r.end - r.start) as usize;
            let data = if n == whole {
                piece
            } else {
                scratch.resize(whole, 0);
                self.base.read_exact_at(&mut scratch[..whole], r.start)?;
                scratch[within as usize..within as usize + n].copy_from_slice(piece);
                &scratch[..whole]
            };
            let written = if bit(&self.tainted, chunk) {
                self.file
                    .write_all_at(data, r.start)
                    .ctx(&self.path, "write")
            } else {
                self.write_sparse(data, r.start)
            };
            let (word, mask) = ((chunk / 64) as usize, 1 << (chunk % 64));
            if let Err(e) = written {
                self.tainted[word].fetch_or(mask, Ordering::Relaxed);
                return Err(e);
            }
            self.present[word].fetch_or(mask, Ordering::Release);
            Ok(())
        })
    }

    /// Writes `data` at `offset` of the overlay file, where nothing was
    /// written yet, leaving its all-zero blocks as the holes they are.
    fn write_sparse(&self, data: &[u8], offset: u64) -> Result<()> {
        let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
        let mut at = 0usize;
        for run in data
            .chunks(HOLE_GRAIN)
            .collect::<Vec<_>>()
            .chunk_by(|a, b| zero(a) == zero(b))
        {
            let len: usize = run.iter().map(|b| b.len()).sum();
            if !zero(run[0]) {
                self.file
                    .write_all_at(&data[at..at + len], offset + at as u64)
                    .ctx(&self.path, "write")?;
            }
            at += len;
        }
        Ok(())
    }

    /// Makes the overlay's writes durable (`fdatasync`), as a guest's flush
    /// asks. (The overlay is discarded with the VM's work directory; a
    /// snapshot makes its own files durable.)
    pub fn sync_data(&self) -> Result<()> {
        self.file.sync_data().ctx(&self.path, "fsync")
    }
}

/// Bit `chunk` of `bits`.
fn bit(bits: &[AtomicU64], chunk: u64) -> bool {
    bits[(chunk / 64) as usize].load(Ordering::Acquire) & (1 << (chunk % 64)) != 0
}

impl DiskSource for DiskOverlay {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.pieces(offset, buf.len(), |chunk, within, at, n| {
            let piece = &mut buf[at..at + n];
            let off = chunk * self.chunk_size + within;
            if self.is_present(chunk) {
                read_file_at(&self.file, &self.path, self.size, piece, off)
            } else {
                self.base.read_exact_at(piece, off)
            }
        })
    }

    fn data_chunks(&self, chunk_size: u64) -> Result<Vec<Range<u64>>> {
        let mut ranges = self.base.data_chunks(chunk_size)?;
        ranges.extend(self.overlay_ranges(chunk_size));
        Ok(merge_ranges(ranges))
    }

    fn base_file(&self, chunk_size: u64) -> Option<(&Path, Vec<Range<u64>>)> {
        let mut ranges: Vec<Range<u64>> = self.base.diff_ranges(chunk_size).collect();
        ranges.extend(self.overlay_ranges(chunk_size));
        Some((self.base.base_file(chunk_size)?.0, merge_ranges(ranges)))
    }
}

impl DiskOverlay {
    /// The chunks the overlay holds, as ranges of `chunk_size`-byte chunks.
    fn overlay_ranges(&self, chunk_size: u64) -> Vec<Range<u64>> {
        let mut ranges = Vec::new();
        for (w, word) in self.present.iter().enumerate() {
            let mut bits = word.load(Ordering::Acquire);
            while bits != 0 {
                let c = w as u64 * 64 + u64::from(bits.trailing_zeros());
                let r = chunk_range(c, self.chunk_size, self.size);
                ranges.push(r.start / chunk_size..r.end.div_ceil(chunk_size));
                bits &= bits - 1;
            }
        }
        ranges
    }
}
