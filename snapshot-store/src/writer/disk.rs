//! The disk of a layer being written: `disk.img` cloned from the VM's disk
//! or the parent's, and its chunk digests (`disk.chunks`) computed on a
//! background thread that commit joins.

use std::fs::OpenOptions;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use super::disk_copy::DiskCopy;
use super::SnapshotWriter;
use crate::clone::{clone_file, native_clone, open_source, CloneMethod};
use crate::error::{Error, IoContext, Result};
use crate::file_hash::{data_chunks, ChunkHasher};
use crate::format::chunks::{
    check_chunk_geometry, disk_chunk_count, disk_digest, encode_disk_chunks, DISK_CHUNK_SIZE,
};
use crate::format::manifest::DiskEntry;
use crate::format::{DISK_CHUNKS_FILE, DISK_FILE};
use crate::fsutil::{open_regular, Links};
use crate::hash::hex;
use crate::readers::read_disk_chunks;
use crate::store::Store;

/// The disk's manifest entry: being computed (digests hashed and
/// `disk.chunks` written on a background thread), or known (the parent's).
pub(super) enum DiskJob {
    /// Cloned or being copied ([`SnapshotWriter::begin_disk`]), not yet
    /// hashed.
    Begun {
        method: CloneMethod,
        copy: Option<DiskCopy>,
        written: Option<Vec<u64>>,
    },
    Hashing(JoinHandle<Result<DiskEntry>>),
    Known(DiskEntry),
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

/// What [`SnapshotWriter::clone_disk`] or
/// [`SnapshotWriter::reuse_parent_disk`] did, for the log. Displays as
/// `sparse copy (3 of 256 chunks hashed)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskClone {
    /// How `disk.img` was copied.
    pub method: CloneMethod,
    /// Chunks of the disk ([`DISK_CHUNK_SIZE`] bytes each, the last one
    /// possibly shorter).
    pub chunks: u64,
    /// Chunks read and hashed (on a background thread joined by commit).
    /// The other chunks' digests come from the parent's `disk.chunks`, or
    /// are the digest of zeros for chunks inside holes.
    pub hashed: u64,
    /// Chunks copied just before a write to the VM's image reached them
    /// (a copy made while the VM ran, [`SnapshotWriter::begin_disk`]).
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

    /// Begin the layer's copy of the disk image `src`: a clone where the
    /// filesystem can make one (`clonefile`, `FICLONE`: done when this
    /// returns; `None`), otherwise a [`DiskCopy`] that copies the image's
    /// data chunks while the VM runs (`Some`): until
    /// [`SnapshotWriter::complete_disk`] returns, whatever writes to `src`
    /// must call [`DiskCopy::before_write`] first. Then
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
    pub fn begin_disk(&mut self, src: &Path, written: Option<&[u64]>) -> Result<Option<DiskCopy>> {
        self.check_no_disk()?;
        let dst = self.tmp.join(DISK_FILE);
        let size = open_source(src)?.metadata().ctx(src, "stat")?.len();
        let chunks = check_chunk_geometry(DISK_CHUNK_SIZE, size)
            .map_err(|e| Error::Usage(format!("disk image {}: {e}", src.display())))?;
        let written = match written {
            Some(w) => {
                let mut w = w.to_vec();
                w.sort_unstable();
                w.dedup();
                if let Some(&bad) = w.iter().find(|&&c| c >= chunks) {
                    return Err(Error::Usage(format!(
                        "written chunk {bad} is beyond the {chunks} chunks of disk image {}",
                        src.display()
                    )));
                }
                Some(w)
            }
            None => None,
        };
        let (method, copy) = match native_clone(src, &dst)? {
            Some(method) => (method, None),
            None => (CloneMethod::SparseCopy, Some(DiskCopy::start(src, &dst)?)),
        };
        self.disk = Some(DiskJob::Begun {
            method,
            copy: copy.clone(),
            written,
        });
        Ok(copy)
    }

    /// Finish the disk begun by [`SnapshotWriter::begin_disk`]: copy what
    /// is left to copy, then start computing the clone's
    /// [`DISK_CHUNK_SIZE`]-byte chunk digests and `disk.chunks` on a
    /// background thread (joined by `commit`). Returns the clone method and
    /// the number of chunks to hash, for the log.
    pub fn complete_disk(&mut self) -> Result<DiskClone> {
        let Some(DiskJob::Begun {
            method,
            copy,
            written,
        }) = self.disk.take()
        else {
            return Err(Error::Usage(format!(
                "snapshot '{}': no disk begun to complete",
                self.name
            )));
        };
        let before_write = match copy {
            Some(copy) => copy.run()?.before_write,
            None => 0,
        };
        let dst = self.tmp.join(DISK_FILE);
        let file = open_regular(&dst, Links::Refuse)?;
        let size = file.metadata().ctx(&dst, "stat")?.len();
        let chunks = check_chunk_geometry(DISK_CHUNK_SIZE, size)
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
            _ => HashPlan::All(data_chunks(&file, &dst, size, DISK_CHUNK_SIZE)?),
        };
        let hashed = match &plan {
            HashPlan::Update { chunks, .. } => chunks.len() as u64,
            HashPlan::All(ranges) => ranges.iter().map(|r| r.end - r.start).sum(),
        };
        let list_path = self.tmp.join(DISK_CHUNKS_FILE);
        let handle = std::thread::Builder::new()
            .name("vmstore-disk-hash".into())
            .spawn(move || {
                let mut hasher = ChunkHasher::new(&file, &dst, size, DISK_CHUNK_SIZE, None);
                let digests = match plan {
                    HashPlan::Update {
                        path,
                        entry,
                        chunks,
                    } => {
                        let mut list = read_disk_chunks(&path, &entry)?.digests;
                        hasher.update(&mut list, &chunks)?;
                        list
                    }
                    HashPlan::All(ranges) => hasher.all(&ranges)?,
                };
                let bytes = encode_disk_chunks(DISK_CHUNK_SIZE, size, &digests)
                    .map_err(|e| Error::Usage(format!("{}: {e}", list_path.display())))?;
                write_new(&list_path, &bytes)?;
                Ok(DiskEntry {
                    size,
                    chunk_size: DISK_CHUNK_SIZE,
                    sha256: hex(&disk_digest(&digests)),
                })
            })
            .map_err(|e| Error::io(&self.tmp, "spawn hashing thread", e))?;
        self.disk = Some(DiskJob::Hashing(handle));
        Ok(DiskClone {
            method,
            chunks,
            hashed,
            before_write,
        })
    }

    /// The layer's disk is its parent's, unchanged (the caller knows no
    /// write reached it since the parent was taken): clone the parent's
    /// `disk.img` and `disk.chunks` (immutable, and verified when the
    /// parent was restored; only read, so their identity stamps stay valid)
    /// and reuse its manifest entry instead of hashing anything. Errors if
    /// this is not a diff layer or the parent has no disk image.
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
        let method = clone_file(&layer.dir.join(DISK_FILE), &self.tmp.join(DISK_FILE))?;
        clone_file(
            &layer.dir.join(DISK_CHUNKS_FILE),
            &self.tmp.join(DISK_CHUNKS_FILE),
        )?;
        let chunks = disk_chunk_count(entry.size, entry.chunk_size);
        self.disk = Some(DiskJob::Known(entry));
        Ok(DiskClone {
            method,
            chunks,
            hashed: 0,
            before_write: 0,
        })
    }
}
