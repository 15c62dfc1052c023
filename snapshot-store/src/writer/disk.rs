//! The disk of a layer being written: `disk.img` cloned or copied from the
//! VM's disk, or for a diff layer `disk.diff`, the chunks written since its
//! parent; and the disk's chunk digests (`disk.chunks`), computed on a
//! background thread that commit joins.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::disk_copy::{CopyLayout, DiskCopy};
use super::SnapshotWriter;
use crate::clone::{clone_file, native_clone, CloneMethod};
use crate::disk_source::{DiskImage, DiskSource};
use crate::error::{Error, IoContext, Result};
use crate::file_hash::{data_chunks, ChunkHasher};
use crate::format::chunks::{
    check_chunk_geometry, chunk_range, disk_chunk_count, disk_digest, encode_disk_chunks,
    DISK_CHUNK_SIZE,
};
use crate::format::disk_diff::{
    disk_diff_file_size, encode_disk_diff_prefix, DISK_DIFF_HEADER_LEN,
};
use crate::format::manifest::DiskEntry;
use crate::format::{DISK_CHUNKS_FILE, DISK_DIFF_FILE, DISK_FILE};
use crate::fsutil::{open_regular, Links};
use crate::hash::hex;
use crate::readers::read_disk_chunks;
use crate::store::Store;

/// The disk's manifest entry: being computed (digests hashed and
/// `disk.chunks` written on a background thread), or known (the parent's).
pub(super) enum DiskJob {
    /// Cloned or being copied ([`SnapshotWriter::begin_disk`],
    /// [`SnapshotWriter::begin_disk_diff`]), not yet hashed.
    Begun {
        method: DiskMethod,
        copy: Option<DiskCopy>,
        plan: Begun,
    },
    Hashing(JoinHandle<Result<DiskEntry>>),
    Known(DiskEntry),
}

/// What a begun disk is.
pub(super) enum Begun {
    /// `disk.img`, with the chunks written since the parent if known.
    Image { written: Option<Vec<u64>> },
    /// `disk.diff` of these chunks of a `size`-byte disk, over the
    /// parent's disk.
    Diff {
        chunks: Vec<u64>,
        data_offset: u64,
        size: u64,
    },
}

impl DiskJob {
    pub(super) fn finish(self) -> Result<DiskEntry> {
        match self {
            DiskJob::Known(e) => Ok(e),
            DiskJob::Begun { copy, .. } => {
                if let Some(c) = copy {
                    c.abandon();
                }
                Err(Error::Usage(
                    "the disk was begun but not completed (complete_disk)".into(),
                ))
            }
            DiskJob::Hashing(h) => h
                .join()
                .map_err(|_| Error::Panicked("disk hashing thread"))?,
        }
    }
}

/// How a layer's disk was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskMethod {
    /// The whole image, `disk.img`, cloned or copied.
    Image(CloneMethod),
    /// The chunks written since the parent, `disk.diff`.
    Diff,
}

impl std::fmt::Display for DiskMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskMethod::Image(m) => m.fmt(f),
            DiskMethod::Diff => f.write_str("disk diff"),
        }
    }
}

/// What [`SnapshotWriter::complete_disk`] or
/// [`SnapshotWriter::reuse_parent_disk`] did, for the log. Displays as
/// `sparse copy (3 of 256 chunks hashed)` or `disk diff (3 of 256 chunks
/// hashed)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskClone {
    /// How the disk was stored.
    pub method: DiskMethod,
    /// Chunks of the disk ([`DISK_CHUNK_SIZE`] bytes each, the last one
    /// possibly shorter).
    pub chunks: u64,
    /// Chunks read and hashed (on a background thread joined by commit):
    /// for a disk diff, the chunks it stores. The other chunks' digests
    /// come from the parent's `disk.chunks`, or are the digest of zeros for
    /// chunks inside holes.
    pub hashed: u64,
    /// Chunks copied just before a write to the VM's disk reached them (a
    /// copy made while the VM ran, [`SnapshotWriter::begin_disk`]).
    pub before_write: u64,
}

impl std::fmt::Display for DiskClone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} of {} chunks hashed",
            self.method, self.hashed, self.chunks
        )?;
        if self.before_write > 0 {
            write!(f, ", {} copied before a write", self.before_write)?;
        }
        f.write_str(")")
    }
}

/// Which chunks of a new disk clone to hash.
enum HashPlan {
    /// Start from the parent's digest list (read from `path` and checked
    /// against the parent's manifest entry) and re-hash these chunks.
    Update {
        path: PathBuf,
        entry: DiskEntry,
        chunks: Vec<u64>,
    },
    /// Hash these ranges of chunks; the rest are holes.
    All(Vec<Range<u64>>),
    /// A disk diff: start from the parent's digest list and hash the
    /// diff's slots, `chunks[i]` at `data_offset + i * DISK_CHUNK_SIZE`.
    Slots {
        path: PathBuf,
        entry: DiskEntry,
        chunks: Vec<u64>,
        data_offset: u64,
    },
}

/// Create `path` (which must not exist) holding `bytes`.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .ctx(path, "create")?;
    f.write_all(bytes).ctx(path, "write")
}

/// Sorted, deduplicated `written`, each below `chunks` (the chunk count of
/// the disk `what`).
fn checked_chunks(written: &[u64], chunks: u64, what: &dyn std::fmt::Display) -> Result<Vec<u64>> {
    let mut w = written.to_vec();
    w.sort_unstable();
    w.dedup();
    if let Some(&bad) = w.iter().find(|&&c| c >= chunks) {
        return Err(Error::Usage(format!(
            "written chunk {bad} is beyond the {chunks} chunks of {what}"
        )));
    }
    Ok(w)
}

impl SnapshotWriter {
    fn check_no_disk(&self) -> Result<()> {
        if self.disk.is_some() {
            return Err(Error::Usage(format!(
                "disk of snapshot '{}' was already written",
                self.name
            )));
        }
        Ok(())
    }

    /// The parent's disk entry and `disk.chunks` path, if the parent has a
    /// disk of `size` bytes digested in [`DISK_CHUNK_SIZE`] chunks.
    fn parent_chunks(&self, size: u64) -> Result<Option<(PathBuf, DiskEntry)>> {
        let Some(parent) = &self.meta.parent else {
            return Ok(None);
        };
        let layer = Store::open(&self.root)?.layer(&parent.name)?;
        Ok(layer
            .manifest
            .disk
            .filter(|d| d.size == size && d.chunk_size == DISK_CHUNK_SIZE)
            .map(|d| (layer.dir.join(DISK_CHUNKS_FILE), d)))
    }

    /// Clone the disk image `src` into the layer and start computing its
    /// chunk digests: [`SnapshotWriter::begin_disk`] then
    /// [`SnapshotWriter::complete_disk`], for a caller that keeps `src`
    /// unchanged until this returns.
    pub fn clone_disk(&mut self, src: &Path, written: Option<&[u64]>) -> Result<DiskClone> {
        if let Some(copy) = self.begin_disk(src, written)? {
            copy.run()?;
        }
        self.complete_disk()
    }

    /// [`SnapshotWriter::begin_disk_from`] of the image file `src`.
    pub fn begin_disk(&mut self, src: &Path, written: Option<&[u64]>) -> Result<Option<DiskCopy>> {
        self.begin_disk_from(Arc::new(DiskImage::open(src)?), written)
    }

    /// Begin the layer's `disk.img`, a copy of the disk `src`: a clone
    /// where `src` is one file the file system can clone (`clonefile`,
    /// `FICLONE`: done when this returns; `None`); where it is such a file
    /// but for some chunks ([`DiskSource::base_file`]: a chain's disk, an
    /// overlay), a clone with a [`DiskCopy`] of those chunks over it;
    /// otherwise a [`DiskCopy`] that copies the disk's data chunks. A copy
    /// is made while the VM runs (`Some`): until
    /// [`SnapshotWriter::complete_disk`] returns, whatever writes to the
    /// disk must call [`DiskCopy::before_write`] first. Then
    /// [`SnapshotWriter::complete_disk`] finishes it.
    ///
    /// `written`: the chunk indices (`offset / DISK_CHUNK_SIZE`, any order,
    /// each below the disk's chunk count) that may differ from the parent
    /// layer's disk, if the caller knows them (`None`: unknown). If it does
    /// and the parent has a disk of the same size and chunk size, only those
    /// chunks are read back and hashed; the other digests are taken from the
    /// parent's `disk.chunks`, which is first checked against the parent's
    /// manifest. Otherwise every chunk holding data is hashed, and chunks
    /// inside holes get the digest of zeros without being read.
    pub fn begin_disk_from(
        &mut self,
        src: Arc<dyn DiskSource>,
        written: Option<&[u64]>,
    ) -> Result<Option<DiskCopy>> {
        self.check_no_disk()?;
        let dst = self.tmp.join(DISK_FILE);
        let size = src.size();
        let chunks = check_chunk_geometry(DISK_CHUNK_SIZE, size)
            .map_err(|e| Error::Usage(format!("disk of snapshot '{}': {e}", self.name)))?;
        let what = format!("the disk of snapshot '{}'", self.name);
        let written = written
            .map(|w| checked_chunks(w, chunks, &what))
            .transpose()?;
        // A clone of the file below the disk, the chunks it lacks copied
        // over it; else a copy of the disk's data.
        let cloned = match src.base_file(DISK_CHUNK_SIZE) {
            Some((path, chunks)) => native_clone(path, &dst)?.map(|m| (m, chunks)),
            None => None,
        };
        let (method, copy) = match cloned {
            Some((method, chunks)) if chunks.is_empty() => (method, None),
            Some((method, chunks)) => {
                let layout = CopyLayout::Over { chunks };
                (method, Some(DiskCopy::start(src, &dst, layout, &[], size)?))
            }
            None => (
                CloneMethod::SparseCopy,
                Some(DiskCopy::start(src, &dst, CopyLayout::Image, &[], size)?),
            ),
        };
        self.disk = Some(DiskJob::Begun {
            method: DiskMethod::Image(method),
            copy: copy.clone(),
            plan: Begun::Image { written },
        });
        Ok(copy)
    }

    /// Begin the layer's `disk.diff`: the chunks `written` (indices below
    /// the disk's chunk count, any order) of the disk `src`, copied while
    /// the VM runs; the layer's other chunks are its parent's. As with
    /// [`SnapshotWriter::begin_disk`], whatever writes to the disk must
    /// call [`DiskCopy::before_write`] first until
    /// [`SnapshotWriter::complete_disk`] returns. Errors (nothing begun) if
    /// this is not a diff layer whose parent has a disk of `src`'s size in
    /// [`DISK_CHUNK_SIZE`] chunks.
    pub fn begin_disk_diff(
        &mut self,
        src: Arc<dyn DiskSource>,
        written: &[u64],
    ) -> Result<DiskCopy> {
        self.check_no_disk()?;
        let size = src.size();
        if self.parent_chunks(size)?.is_none() {
            return Err(Error::Usage(format!(
                "snapshot '{}' has no parent with a disk of {size} bytes in {DISK_CHUNK_SIZE}-byte chunks to store its disk as a diff of",
                self.name
            )));
        }
        let what = format!("the disk of snapshot '{}'", self.name);
        let chunks = checked_chunks(written, disk_chunk_count(size, DISK_CHUNK_SIZE), &what)?;
        let prefix = encode_disk_diff_prefix(DISK_CHUNK_SIZE, size, &chunks)
            .map_err(|e| Error::Usage(format!("disk diff of snapshot '{}': {e}", self.name)))?;
        let data_offset = prefix.len() as u64;
        let len = disk_diff_file_size(DISK_CHUNK_SIZE, chunks.len() as u64)
            .ok_or_else(|| Error::Usage("disk diff too large".into()))?;
        let layout = CopyLayout::Packed {
            data_offset,
            chunks: chunks.clone(),
        };
        let dst = self.tmp.join(DISK_DIFF_FILE);
        // The padding up to the data stays a hole.
        let head = &prefix[..DISK_DIFF_HEADER_LEN + 8 * chunks.len()];
        let copy = DiskCopy::start(src, &dst, layout, head, len)?;
        self.disk = Some(DiskJob::Begun {
            method: DiskMethod::Diff,
            copy: Some(copy.clone()),
            plan: Begun::Diff {
                chunks,
                data_offset,
                size,
            },
        });
        Ok(copy)
    }

    /// Finish the disk begun by [`SnapshotWriter::begin_disk`] or
    /// [`SnapshotWriter::begin_disk_diff`]: copy what is left to copy, then
    /// start computing the disk's [`DISK_CHUNK_SIZE`]-byte chunk digests and
    /// `disk.chunks` on a background thread (joined by `commit`). Returns
    /// how the disk was stored and the number of chunks to hash, for the
    /// log.
    pub fn complete_disk(&mut self) -> Result<DiskClone> {
        let Some(DiskJob::Begun { method, copy, plan }) = self.disk.take() else {
            return Err(Error::Usage(format!(
                "snapshot '{}': no disk begun to complete",
                self.name
            )));
        };
        let before_write = match copy {
            Some(copy) => copy.run()?.before_write,
            None => 0,
        };
        let file_name = match plan {
            Begun::Image { .. } => DISK_FILE,
            Begun::Diff { .. } => DISK_DIFF_FILE,
        };
        let dst = self.tmp.join(file_name);
        let file = open_regular(&dst, Links::Refuse)?;
        let (plan, size) = self.hash_plan(plan, &file, &dst)?;
        let chunks = disk_chunk_count(size, DISK_CHUNK_SIZE);
        let hashed = match &plan {
            HashPlan::Update { chunks, .. } | HashPlan::Slots { chunks, .. } => chunks.len() as u64,
            HashPlan::All(ranges) => ranges.iter().map(|r| r.end - r.start).sum(),
        };
        let list_path = self.tmp.join(DISK_CHUNKS_FILE);
        let handle = std::thread::Builder::new()
            .name("vmstore-disk-hash".into())
            .spawn(move || hash_disk_file(&file, &dst, size, plan, &list_path))
            .map_err(|e| Error::io(&self.tmp, "spawn hashing thread", e))?;
        self.disk = Some(DiskJob::Hashing(handle));
        Ok(DiskClone {
            method,
            chunks,
            hashed,
            before_write,
        })
    }

    /// The hashing plan of the begun disk `plan`, whose file `file` (at
    /// `dst`) is complete, and the disk's size.
    fn hash_plan(&self, plan: Begun, file: &File, dst: &Path) -> Result<(HashPlan, u64)> {
        match plan {
            Begun::Diff {
                chunks,
                data_offset,
                size,
            } => {
                let (path, entry) = self.parent_chunks(size)?.ok_or_else(|| {
                    Error::Usage(format!(
                        "the parent of snapshot '{}' has lost its disk",
                        self.name
                    ))
                })?;
                let plan = HashPlan::Slots {
                    path,
                    entry,
                    chunks,
                    data_offset,
                };
                Ok((plan, size))
            }
            Begun::Image { written } => {
                let size = file.metadata().ctx(dst, "stat")?.len();
                check_chunk_geometry(DISK_CHUNK_SIZE, size)
                    .map_err(|e| Error::Usage(format!("disk image {}: {e}", dst.display())))?;
                let parent = match written {
                    Some(_) => self.parent_chunks(size)?,
                    None => None,
                };
                let plan = match (written, parent) {
                    (Some(chunks), Some((path, entry))) => HashPlan::Update {
                        path,
                        entry,
                        chunks,
                    },
                    _ => HashPlan::All(data_chunks(file, dst, size, DISK_CHUNK_SIZE)?),
                };
                Ok((plan, size))
            }
        }
    }

    /// The layer's disk is its parent's, unchanged (the caller knows no
    /// write reached it since the parent was taken): a `disk.diff` of no
    /// chunks, and a copy of the parent's `disk.chunks` (immutable, and
    /// verified when the parent was restored; only read, so its identity
    /// stamp stays valid), whose manifest entry is reused: nothing is hashed
    /// and no disk data is copied. Errors if this is not a diff layer or
    /// the parent has no disk.
    pub fn reuse_parent_disk(&mut self) -> Result<DiskClone> {
        self.check_no_disk()?;
        let Some(parent) = &self.meta.parent else {
            return Err(Error::Usage(format!(
                "snapshot '{}' has no parent whose disk it could reuse",
                self.name
            )));
        };
        let store = Store::open(&self.root)?;
        let layer = store.layer(&parent.name)?;
        let Some(entry) = layer.manifest.disk.clone() else {
            return Err(Error::Usage(format!(
                "parent '{}' has no disk image",
                parent.name
            )));
        };
        let prefix = encode_disk_diff_prefix(entry.chunk_size, entry.size, &[])
            .map_err(|e| Error::corrupt(layer.manifest_path(), format!("disk: {e}")))?;
        // The header; the padding up to the (empty) data stays a hole.
        let path = self.tmp.join(DISK_DIFF_FILE);
        write_new(&path, &prefix[..DISK_DIFF_HEADER_LEN])?;
        OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(prefix.len() as u64))
            .ctx(&path, "set length")?;
        clone_file(
            &layer.dir.join(DISK_CHUNKS_FILE),
            &self.tmp.join(DISK_CHUNKS_FILE),
        )?;
        let chunks = disk_chunk_count(entry.size, entry.chunk_size);
        self.disk = Some(DiskJob::Known(DiskEntry {
            diff_chunks: Some(0),
            ..entry
        }));
        Ok(DiskClone {
            method: DiskMethod::Diff,
            chunks,
            hashed: 0,
            before_write: 0,
        })
    }
}

/// The hashing thread's work: the digests of the disk `file` (at `dst`) of
/// a `size`-byte disk by `plan`, written to `disk.chunks` at `list_path`;
/// returns the manifest's disk entry.
fn hash_disk_file(
    file: &File,
    dst: &Path,
    size: u64,
    plan: HashPlan,
    list_path: &Path,
) -> Result<DiskEntry> {
    let file_len = file.metadata().ctx(dst, "stat")?.len();
    let mut diff_chunks = None;
    let digests = match plan {
        HashPlan::Update {
            path,
            entry,
            chunks,
        } => {
            let mut list = read_disk_chunks(&path, &entry)?.digests;
            ChunkHasher::new(file, dst, size, DISK_CHUNK_SIZE, None).update(&mut list, &chunks)?;
            list
        }
        HashPlan::All(ranges) => {
            ChunkHasher::new(file, dst, size, DISK_CHUNK_SIZE, None).all(&ranges)?
        }
        HashPlan::Slots {
            path,
            entry,
            chunks,
            data_offset,
        } => {
            let mut list = read_disk_chunks(&path, &entry)?.digests;
            let mut hasher = ChunkHasher::new(file, dst, file_len, DISK_CHUNK_SIZE, None);
            for (i, &c) in chunks.iter().enumerate() {
                let r = chunk_range(c, DISK_CHUNK_SIZE, size);
                let at = data_offset + i as u64 * DISK_CHUNK_SIZE;
                list[c as usize] = hasher.hash_bytes(at, r.end - r.start)?;
            }
            diff_chunks = Some(chunks.len() as u64);
            list
        }
    };
    let bytes = encode_disk_chunks(DISK_CHUNK_SIZE, size, &digests)
        .map_err(|e| Error::Usage(format!("{}: {e}", list_path.display())))?;
    write_new(list_path, &bytes)?;
    Ok(DiskEntry {
        size,
        chunk_size: DISK_CHUNK_SIZE,
        sha256: hex(&disk_digest(&digests)),
        diff_chunks,
    })
}
