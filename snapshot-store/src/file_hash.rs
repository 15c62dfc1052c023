//! Hashing a layer's files as read from disk, with bounded buffers: the
//! sha256 of a whole file, the memory digest of `memory.bin`, and the chunk
//! digests of a disk image. Holes (`SEEK_DATA`/`SEEK_HOLE`) are hashed as
//! the zeros they read as, without being read.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, IoContext, Result};
use crate::format::chunks::{chunk_range, disk_chunk_count};
use crate::format::memory::MemoryDigest;
use crate::fsutil::data_regions;
use crate::hash::Sha256Digest;
use crate::progress::{Progress, ProgressFn, PROGRESS_MIN_BYTES, PROGRESS_STEP_BYTES};

/// Read buffer per hashing thread: memory stays bounded (threads x 1 MiB)
/// and the buffer stays in cache between the read and the hash.
const READ_CHUNK: usize = 1 << 20;
/// Read size while hashing a chunk (bytes): bounds the buffer for any chunk
/// size.
const READ_PIECE: u64 = 1 << 20;

/// What a file is hashed with: fed its data, and its holes' lengths.
trait Feed {
    fn data(&mut self, bytes: &[u8]);
    fn hole(&mut self, n: u64);
}

/// sha256 of the bytes, holes hashed as the zeros they read as.
struct PlainFeed {
    hasher: Sha256,
    zeros: Vec<u8>,
}

impl Feed for PlainFeed {
    fn data(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }
    fn hole(&mut self, mut n: u64) {
        while n > 0 {
            let take = n.min(self.zeros.len() as u64) as usize;
            self.hasher.update(&self.zeros[..take]);
            n -= take as u64;
        }
    }
}

impl Feed for MemoryDigest {
    fn data(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
    fn hole(&mut self, n: u64) {
        self.zeros(n);
    }
}

/// sha256 of the whole of the open file `file` (named `path` in errors),
/// which must be exactly `expected_len` bytes long, read with a bounded
/// buffer. Holes (`SEEK_DATA`/`SEEK_HOLE`) are hashed as the zeros they
/// read as without being read.
pub(crate) fn sha256_open_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
) -> Result<Sha256Digest> {
    let mut feed = PlainFeed {
        hasher: Sha256::new(),
        zeros: vec![0u8; READ_CHUNK],
    };
    read_open_file(file, path, expected_len, progress, &mut feed)?;
    Ok(feed.hasher.finalize().into())
}

/// [`MemoryDigest`] of the open file `file` (named `path` in errors), which
/// must be exactly `expected_len` bytes long; its holes are not read.
pub(crate) fn memory_digest_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
) -> Result<Sha256Digest> {
    let mut feed = MemoryDigest::new();
    read_open_file(file, path, expected_len, progress, &mut feed)?;
    Ok(feed.finish())
}

/// Feeds the `expected_len` bytes of `file` to `feed` in order, data read
/// with a bounded buffer and holes by length; errors if the file's length
/// is not `expected_len` before or after.
fn read_open_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
    feed: &mut dyn Feed,
) -> Result<()> {
    let size = |f: &File| {
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(path, "stat", e))
    };
    let changed = || {
        Error::corrupt(
            path,
            format!("changed size while being hashed (expected {expected_len} bytes)"),
        )
    };
    if size(file)? != expected_len {
        return Err(changed());
    }
    let chunk = usize::try_from(expected_len.clamp(1, READ_CHUNK as u64)).unwrap_or(READ_CHUNK);
    let mut buf = vec![0u8; chunk];
    let report = progress.filter(|_| expected_len >= PROGRESS_MIN_BYTES);
    let mut next_report = PROGRESS_STEP_BYTES;
    let mut done: u64 = 0;
    let regions = data_regions(file, path, expected_len)?;
    let mut regions = regions.iter().peekable();
    while done < expected_len {
        // Up to the next boundary between data and hole.
        let (data, end) = match regions.peek() {
            Some(r) if r.start <= done => (true, r.end),
            Some(r) => (false, r.start),
            None => (false, expected_len),
        };
        let n = if data {
            let n = usize::try_from((end - done).min(chunk as u64)).unwrap_or(chunk);
            file.read_exact_at(&mut buf[..n], done).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    changed()
                } else {
                    Error::io(path, "read", e)
                }
            })?;
            feed.data(&buf[..n]);
            n as u64
        } else {
            feed.hole(end - done);
            end - done
        };
        done += n;
        if done >= end && data {
            regions.next();
        }
        if let Some(p) = report {
            if done >= next_report && done < expected_len {
                p(Progress::Hashing {
                    path,
                    done,
                    total: expected_len,
                });
                while next_report <= done {
                    next_report += PROGRESS_STEP_BYTES;
                }
            }
        }
    }
    if size(file)? != expected_len {
        return Err(changed());
    }
    if let Some(p) = report {
        p(Progress::Hashing {
            path,
            done: expected_len,
            total: expected_len,
        });
    }
    Ok(())
}

/// sha256 of `len` zero bytes: the digest of a chunk inside a hole.
fn zero_digest(len: u64) -> Sha256Digest {
    let zeros = [0u8; 4096];
    let mut h = Sha256::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        h.update(&zeros[..n]);
        left -= n as u64;
    }
    h.finalize().into()
}

/// Ranges of chunk indices (increasing, disjoint) that hold data according
/// to `SEEK_DATA`/`SEEK_HOLE` ([`data_regions`]); the other
/// chunks of the `size`-byte file lie entirely in holes and read as zeros.
pub(crate) fn data_chunks(
    file: &File,
    path: &Path,
    size: u64,
    chunk_size: u64,
) -> Result<Vec<Range<u64>>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for region in data_regions(file, path, size)? {
        let r = region.start / chunk_size..region.end.div_ceil(chunk_size);
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    Ok(out)
}

/// Reads and hashes chunks of one open disk image, with a bounded buffer.
pub(crate) struct ChunkHasher<'a> {
    file: &'a File,
    path: &'a Path,
    size: u64,
    chunk_size: u64,
    buf: Vec<u8>,
    progress: Option<ProgressFn<'a>>,
    next_report: u64,
}

impl<'a> ChunkHasher<'a> {
    /// A hasher for `file` (named `path` in errors), which must stay
    /// `size` bytes long, in chunks of `chunk_size` bytes (non-zero).
    /// Progress is reported by disk offset for disks of at least
    /// [`PROGRESS_MIN_BYTES`].
    pub(crate) fn new(
        file: &'a File,
        path: &'a Path,
        size: u64,
        chunk_size: u64,
        progress: Option<ProgressFn<'a>>,
    ) -> Self {
        let piece = chunk_size.clamp(1, READ_PIECE).min(size.max(1));
        ChunkHasher {
            file,
            path,
            size,
            chunk_size,
            // piece <= 1 MiB.
            buf: vec![0u8; piece as usize],
            progress: progress.filter(|_| size >= PROGRESS_MIN_BYTES),
            next_report: PROGRESS_STEP_BYTES,
        }
    }

    /// Number of chunks of the disk.
    pub(crate) fn count(&self) -> u64 {
        disk_chunk_count(self.size, self.chunk_size)
    }

    /// Read and hash chunk `i` (which must be below [`Self::count`]).
    pub(crate) fn hash(&mut self, i: u64) -> Result<Sha256Digest> {
        let r = chunk_range(i, self.chunk_size, self.size);
        self.hash_bytes(r.start, r.end - r.start)
    }

    /// Read and hash the `len` bytes of the file at `offset` (inside its
    /// size).
    pub(crate) fn hash_bytes(&mut self, offset: u64, len: u64) -> Result<Sha256Digest> {
        let r = offset..offset.saturating_add(len);
        if r.end > self.size {
            return Err(Error::corrupt(
                self.path,
                format!("is {} bytes, shorter than {}", self.size, r.end),
            ));
        }
        let mut h = Sha256::new();
        let mut off = r.start;
        while off < r.end {
            let want = (r.end - off).min(self.buf.len() as u64) as usize;
            let buf = &mut self.buf[..want];
            match self.file.read_at(buf, off) {
                Ok(0) => {
                    return Err(Error::corrupt(
                        self.path,
                        format!(
                            "changed size while being hashed (expected {} bytes)",
                            self.size
                        ),
                    ))
                }
                Ok(n) => {
                    h.update(&buf[..n]);
                    off += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(self.path, "read", e)),
            }
        }
        self.report(r.end);
        Ok(h.finalize().into())
    }

    fn report(&mut self, done: u64) {
        if let Some(p) = self.progress {
            if done >= self.next_report || done == self.size {
                p(Progress::Hashing {
                    path: self.path,
                    done,
                    total: self.size,
                });
                while self.next_report <= done {
                    self.next_report += PROGRESS_STEP_BYTES;
                }
            }
        }
    }

    /// The digest of every chunk: chunks in `data` (from [`data_chunks`])
    /// are read and hashed, the others are holes and get the digest of
    /// zeros without being read. Checks at the end that the file still has
    /// its size.
    pub(crate) fn all(&mut self, data: &[Range<u64>]) -> Result<Vec<Sha256Digest>> {
        let n = self.count();
        let full_zero = zero_digest(self.chunk_size.min(self.size));
        // Capacity bounded by the caller's geometry check (MAX_DISK_CHUNKS).
        let mut digests = vec![full_zero; usize::try_from(n).unwrap_or(0)];
        if let Some(last) = n.checked_sub(1) {
            let r = chunk_range(last, self.chunk_size, self.size);
            digests[last as usize] = zero_digest(r.end - r.start);
        }
        for r in data {
            for i in r.clone() {
                let Some(d) = digests.get_mut(i as usize) else {
                    break;
                };
                *d = self.hash(i)?;
            }
        }
        self.report(self.size);
        self.check_size()?;
        Ok(digests)
    }

    /// Re-hash the chunks `which` (each below [`Self::count`]) into
    /// `digests`, then check that the file still has its size.
    pub(crate) fn update(&mut self, digests: &mut [Sha256Digest], which: &[u64]) -> Result<()> {
        for &i in which {
            let Some(slot) = usize::try_from(i).ok().filter(|&k| k < digests.len()) else {
                return Err(Error::Usage(format!(
                    "chunk {i} is beyond the {} chunks of {}",
                    digests.len(),
                    self.path.display()
                )));
            };
            digests[slot] = self.hash(i)?;
        }
        self.check_size()
    }

    fn check_size(&self) -> Result<()> {
        let now = self.file.metadata().ctx(self.path, "stat")?.len();
        if now != self.size {
            return Err(Error::corrupt(
                self.path,
                format!(
                    "changed size while being hashed (expected {} bytes, now {now})",
                    self.size
                ),
            ));
        }
        Ok(())
    }
}

/// The digest of every `chunk_size`-byte chunk of the `size`-byte image
/// `file`, holes skipped as zeros (see [`data_chunks`]); returns the
/// digests and the number of chunks read.
pub(crate) fn hash_disk(
    file: &File,
    path: &Path,
    size: u64,
    chunk_size: u64,
    progress: Option<ProgressFn<'_>>,
) -> Result<(Vec<Sha256Digest>, u64)> {
    let data = data_chunks(file, path, size, chunk_size)?;
    let read = data.iter().map(|r| r.end - r.start).sum();
    let digests = ChunkHasher::new(file, path, size, chunk_size, progress).all(&data)?;
    Ok((digests, read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::chunks::{disk_digest, DISK_CHUNK_SIZE};
    use crate::format::memory::{memory_digest, MEMORY_CHUNK_SIZE};
    use crate::hash::sha256;

    #[test]
    fn file_digest_and_length_check() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let f = |len| sha256_open_file(&File::open(&p).unwrap(), &p, len, None);
        assert_eq!(f(3).unwrap(), sha256(b"abc"));
        let e = f(4).unwrap_err().to_string();
        assert!(e.contains("changed size"), "{e}");
        let e = f(2).unwrap_err().to_string();
        assert!(e.contains("changed size"), "{e}");
    }

    #[test]
    fn memory_file_with_holes() {
        const C: usize = MEMORY_CHUNK_SIZE as usize;
        let mut bytes = vec![0u8; 5 * C + 1000];
        bytes[C + 5] = 1;
        bytes[4 * C - 1] = 2;
        bytes[5 * C + 999] = 3;
        let want = memory_digest(&bytes);
        // A file with holes, the same.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m");
        let f = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(bytes.len() as u64).unwrap();
        for (at, b) in [(C + 5, 1u8), (4 * C - 1, 2), (5 * C + 999, 3)] {
            f.write_all_at(&[b], at as u64).unwrap();
        }
        assert_eq!(
            memory_digest_file(&f, &p, bytes.len() as u64, None).unwrap(),
            want
        );
    }

    #[test]
    fn holes_hash_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sparse");
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let len = 5 * READ_CHUNK as u64 + 123;
        file.set_len(len).unwrap();
        file.write_all_at(b"data in the middle", 2 * READ_CHUNK as u64 + 7)
            .unwrap();
        file.write_all_at(b"and at the end", len - 14).unwrap();
        let whole = std::fs::read(&p).unwrap();
        assert_eq!(
            sha256_open_file(&file, &p, len, None).unwrap(),
            sha256(&whole)
        );
    }

    #[test]
    fn holes_hash_like_zeros_and_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let cs = 4096u64;
        let size = 40 * cs + 100;
        let sparse = dir.path().join("sparse");
        let f = File::create(&sparse).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(b"data", 5 * cs + 7).unwrap();
        f.write_all_at(&[1u8; 9000], 20 * cs - 10).unwrap();
        drop(f);
        let mut dense_bytes = std::fs::read(&sparse).unwrap();
        let dense = dir.path().join("dense");
        std::fs::write(&dense, &dense_bytes).unwrap();
        let by_hand: Vec<Sha256Digest> = dense_bytes.chunks(cs as usize).map(sha256).collect();
        let (fs, fd) = (File::open(&sparse).unwrap(), File::open(&dense).unwrap());
        let (a, read_sparse) = hash_disk(&fs, &sparse, size, cs, None).unwrap();
        let (b, read_dense) = hash_disk(&fd, &dense, size, cs, None).unwrap();
        assert_eq!(a, by_hand);
        assert_eq!(b, by_hand);
        assert_eq!(read_dense, 41);
        // Where the file system reports holes (tmpfs, ext4, btrfs, XFS,
        // APFS), only the chunks with data are read.
        let data = data_chunks(&fs, &sparse, size, cs).unwrap();
        if data.iter().map(|r| r.end - r.start).sum::<u64>() < 41 {
            assert!(read_sparse <= 8, "{data:?}");
            assert!(data.iter().any(|r| r.contains(&5)));
            assert!(data.iter().any(|r| r.contains(&19) && r.contains(&21)));
        }
        // Incremental update equals a recompute.
        dense_bytes[33 * cs as usize] ^= 0xff;
        std::fs::write(&dense, &dense_bytes).unwrap();
        let fd = File::open(&dense).unwrap();
        let mut c = b.clone();
        ChunkHasher::new(&fd, &dense, size, cs, None)
            .update(&mut c, &[33])
            .unwrap();
        assert_eq!(c, hash_disk(&fd, &dense, size, cs, None).unwrap().0);
        assert_ne!(c, b);
        // Out of range and a changed size are errors.
        assert!(ChunkHasher::new(&fd, &dense, size, cs, None)
            .update(&mut c, &[41])
            .is_err());
        let e = ChunkHasher::new(&fd, &dense, size + 1, cs, None)
            .update(&mut c, &[40])
            .unwrap_err()
            .to_string();
        assert!(e.contains("changed size"), "{e}");
        // Empty disk: no chunks.
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let (d, n) = hash_disk(&File::open(&empty).unwrap(), &empty, 0, cs, None).unwrap();
        assert!(d.is_empty() && n == 0);
        assert_eq!(disk_digest(&d), sha256(b""));
    }

    /// Timing printout (not asserted): hashing every chunk of a 64 MiB
    /// image (8 MiB in debug builds) against re-hashing one chunk.
    #[test]
    fn one_chunk_against_all() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let size: u64 = if cfg!(debug_assertions) {
            8 << 20
        } else {
            64 << 20
        };
        let bytes: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let t = std::time::Instant::now();
        let (mut d, read) = hash_disk(&f, &p, size, DISK_CHUNK_SIZE, None).unwrap();
        let all = t.elapsed();
        let t = std::time::Instant::now();
        ChunkHasher::new(&f, &p, size, DISK_CHUNK_SIZE, None)
            .update(&mut d, &[7])
            .unwrap();
        let top = disk_digest(&d);
        let one = t.elapsed();
        eprintln!(
            "{} MiB image: all {read} chunks hashed in {all:?}; 1 chunk re-hashed and top digest in {one:?}",
            size >> 20,
        );
        assert_eq!(read, size / DISK_CHUNK_SIZE);
        assert_eq!(top, sha256(&d.concat()));
    }
}
