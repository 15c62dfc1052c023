//! `disk.chunks`: the per-chunk sha256 digests of a layer's `disk.img`, and
//! the chunked hashing of disk images.
//!
//! Layout (all integers little-endian; see FORMAT.md):
//!
//! ```text
//! 0   8  magic "IGNCHUNK"
//! 8   2  format major          10  2  format minor
//! 12  4  header length = 72
//! 16  8  chunk size C (bytes)  24  8  disk size S (bytes)
//! 32  8  chunk count N = ceil(S / C)
//! 40 32  sha256(bytes 0..40 ++ digest list)
//! 72 32N digest list: sha256 of chunk i = disk bytes [i C, min((i + 1) C, S))
//! ```
//!
//! The disk's digest (the manifest's `disk.sha256`) is the sha256 of the
//! digest list alone ([`disk_digest`]), so the manifest pins this file.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, IoContext, ParseError, Result};
use crate::format::{check_prelude, u64_at, FormatVersion, FORMAT_VERSION};
use crate::hash::{Sha256Digest, PROGRESS_MIN_BYTES, PROGRESS_STEP_BYTES};
use crate::progress::{Progress, ProgressFn};

/// Chunk size of the disk digests this crate writes, in bytes (256 KiB).
/// The VMM tracks guest disk writes at this granularity.
pub const DISK_CHUNK_SIZE: u64 = 256 << 10;
/// Smallest chunk size accepted when reading, in bytes.
pub const MIN_DISK_CHUNK_SIZE: u64 = 4096;
/// Largest chunk size accepted when reading, in bytes (64 MiB).
pub const MAX_DISK_CHUNK_SIZE: u64 = 64 << 20;
/// Most chunks a disk may have (a 4 TiB disk at [`DISK_CHUNK_SIZE`]); bounds
/// `disk.chunks` to 72 bytes + 512 MiB.
pub const MAX_DISK_CHUNKS: u64 = 1 << 24;
/// Magic bytes at offset 0 of `disk.chunks`.
pub const DISK_CHUNKS_MAGIC: [u8; 8] = *b"IGNCHUNK";
/// Length of the `disk.chunks` header, in bytes.
pub const DISK_CHUNKS_HEADER_LEN: usize = 72;
const DIGEST_AT: usize = 40;
/// Read size while hashing a chunk (bytes): bounds the buffer for any chunk
/// size.
const READ_PIECE: u64 = 1 << 20;

/// The decoded `disk.chunks` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskChunksHeader {
    /// Format version of the file.
    pub version: FormatVersion,
    /// Chunk size in bytes.
    pub chunk_size: u64,
    /// Disk image size in bytes.
    pub disk_size: u64,
    /// Number of chunks (= digests in the list), `ceil(disk_size / chunk_size)`.
    pub chunk_count: u64,
    /// sha256 over header bytes 0..40 followed by the digest list.
    pub checksum: Sha256Digest,
}

impl DiskChunksHeader {
    /// Exact length of a well-formed file with this header, in bytes.
    pub fn file_size(&self) -> u64 {
        disk_chunks_file_size(self.chunk_count)
    }
}

/// A parsed, checked `disk.chunks`: the digest of every chunk of a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskChunks {
    /// Chunk size in bytes.
    pub chunk_size: u64,
    /// Disk image size in bytes.
    pub disk_size: u64,
    /// sha256 of each chunk, `ceil(disk_size / chunk_size)` of them.
    pub digests: Vec<Sha256Digest>,
}

impl DiskChunks {
    /// The disk's digest: sha256 of the concatenated chunk digests.
    pub fn disk_digest(&self) -> Sha256Digest {
        disk_digest(&self.digests)
    }

    /// The file bytes (header and digest list). Errors if the geometry is
    /// invalid or the digest count does not match it.
    pub fn encode(&self) -> Result<Vec<u8>, ParseError> {
        encode_disk_chunks(self.chunk_size, self.disk_size, &self.digests)
    }
}

/// sha256 of the concatenation of `digests` (32 bytes each): a disk's
/// digest as recorded in the manifest.
pub fn disk_digest(digests: &[Sha256Digest]) -> Sha256Digest {
    let mut h = Sha256::new();
    for d in digests {
        h.update(d);
    }
    h.finalize().into()
}

/// Number of chunks of `chunk_size` bytes covering `disk_size` bytes (the
/// last one may be short; a 0-byte disk has none). `chunk_size` must be
/// non-zero.
pub fn disk_chunk_count(disk_size: u64, chunk_size: u64) -> u64 {
    disk_size.div_ceil(chunk_size.max(1))
}

/// Exact size in bytes of a `disk.chunks` listing `chunks` digests
/// (saturating).
pub fn disk_chunks_file_size(chunks: u64) -> u64 {
    chunks
        .saturating_mul(32)
        .saturating_add(DISK_CHUNKS_HEADER_LEN as u64)
}

/// Check a chunk size (a power of two in
/// [`MIN_DISK_CHUNK_SIZE`]..=[`MAX_DISK_CHUNK_SIZE`]) and a disk size (at
/// most [`MAX_DISK_CHUNKS`] chunks); returns the chunk count.
pub fn check_chunk_geometry(chunk_size: u64, disk_size: u64) -> Result<u64, ParseError> {
    if !chunk_size.is_power_of_two()
        || !(MIN_DISK_CHUNK_SIZE..=MAX_DISK_CHUNK_SIZE).contains(&chunk_size)
    {
        return Err(ParseError::new(format!(
            "chunk size {chunk_size} is not a power of two in {MIN_DISK_CHUNK_SIZE}..={MAX_DISK_CHUNK_SIZE}"
        )));
    }
    let n = disk_chunk_count(disk_size, chunk_size);
    if n > MAX_DISK_CHUNKS {
        return Err(ParseError::new(format!(
            "disk of {disk_size} bytes has {n} chunks of {chunk_size} bytes, more than {MAX_DISK_CHUNKS}"
        )));
    }
    Ok(n)
}

/// Parse and bound-check the 72-byte header at the start of `bytes`
/// (untrusted). The digest list and checksum are not checked.
pub fn parse_disk_chunks_header(bytes: &[u8]) -> Result<DiskChunksHeader, ParseError> {
    let version = check_prelude(
        bytes,
        &DISK_CHUNKS_MAGIC,
        DISK_CHUNKS_HEADER_LEN,
        "a disk chunk list",
    )?;
    let chunk_size = u64_at(bytes, 16);
    let disk_size = u64_at(bytes, 24);
    let chunk_count = u64_at(bytes, 32);
    let want = check_chunk_geometry(chunk_size, disk_size)?;
    if chunk_count != want {
        return Err(ParseError::new(format!(
            "chunk count {chunk_count}, but a {disk_size}-byte disk has {want} chunks of {chunk_size} bytes"
        )));
    }
    let mut checksum = [0u8; 32];
    checksum.copy_from_slice(&bytes[DIGEST_AT..DIGEST_AT + 32]);
    Ok(DiskChunksHeader {
        version,
        chunk_size,
        disk_size,
        chunk_count,
        checksum,
    })
}

/// Parse a whole `disk.chunks` held in memory (untrusted): header checks,
/// exact length, checksum.
pub fn parse_disk_chunks(bytes: &[u8]) -> Result<DiskChunks, ParseError> {
    let h = parse_disk_chunks_header(bytes)?;
    if bytes.len() as u64 != h.file_size() {
        return Err(ParseError::new(format!(
            "is {} bytes, a list of {} digests is {}",
            bytes.len(),
            h.chunk_count,
            h.file_size()
        )));
    }
    let list = &bytes[DISK_CHUNKS_HEADER_LEN..];
    let mut sum = Sha256::new();
    sum.update(&bytes[..DIGEST_AT]);
    sum.update(list);
    if <[u8; 32]>::from(sum.finalize()) != h.checksum {
        return Err(ParseError::new(
            "checksum mismatch: chunk list is corrupted",
        ));
    }
    let digests = list
        .chunks_exact(32)
        .map(|d| {
            let mut a = [0u8; 32];
            a.copy_from_slice(d);
            a
        })
        .collect();
    Ok(DiskChunks {
        chunk_size: h.chunk_size,
        disk_size: h.disk_size,
        digests,
    })
}

/// The `disk.chunks` bytes for a `disk_size`-byte disk hashed in chunks of
/// `chunk_size` bytes, one digest per chunk.
pub fn encode_disk_chunks(
    chunk_size: u64,
    disk_size: u64,
    digests: &[Sha256Digest],
) -> Result<Vec<u8>, ParseError> {
    let n = check_chunk_geometry(chunk_size, disk_size)?;
    if digests.len() as u64 != n {
        return Err(ParseError::new(format!(
            "{} digests for a disk of {n} chunks",
            digests.len()
        )));
    }
    let mut b = Vec::with_capacity(DISK_CHUNKS_HEADER_LEN + digests.len() * 32);
    b.extend_from_slice(&DISK_CHUNKS_MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.major.to_le_bytes());
    b.extend_from_slice(&FORMAT_VERSION.minor.to_le_bytes());
    b.extend_from_slice(&(DISK_CHUNKS_HEADER_LEN as u32).to_le_bytes());
    b.extend_from_slice(&chunk_size.to_le_bytes());
    b.extend_from_slice(&disk_size.to_le_bytes());
    b.extend_from_slice(&n.to_le_bytes());
    b.extend_from_slice(&[0u8; 32]);
    for d in digests {
        b.extend_from_slice(d);
    }
    let mut sum = Sha256::new();
    sum.update(&b[..DIGEST_AT]);
    sum.update(&b[DISK_CHUNKS_HEADER_LEN..]);
    b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&sum.finalize());
    Ok(b)
}

/// The byte range of chunk `i` of a `size`-byte disk.
pub(crate) fn chunk_range(i: u64, chunk_size: u64, size: u64) -> Range<u64> {
    let start = i.saturating_mul(chunk_size).min(size);
    start..start.saturating_add(chunk_size).min(size)
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
/// to `SEEK_DATA`/`SEEK_HOLE` ([`crate::fsutil::data_regions`]); the other
/// chunks of the `size`-byte file lie entirely in holes and read as zeros.
pub(crate) fn data_chunks(
    file: &File,
    path: &Path,
    size: u64,
    chunk_size: u64,
) -> Result<Vec<Range<u64>>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for region in crate::fsutil::data_regions(file, path, size)? {
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
    use crate::hash::sha256;

    fn list(n: usize) -> Vec<Sha256Digest> {
        (0..n).map(|i| sha256(&i.to_le_bytes())).collect()
    }

    #[test]
    fn round_trip_and_digest() {
        for (size, n) in [
            (0u64, 0usize),
            (1, 1),
            (DISK_CHUNK_SIZE, 1),
            (DISK_CHUNK_SIZE + 1, 2),
        ] {
            let d = list(n);
            let b = encode_disk_chunks(DISK_CHUNK_SIZE, size, &d).unwrap();
            assert_eq!(b.len(), DISK_CHUNKS_HEADER_LEN + 32 * n);
            let c = parse_disk_chunks(&b).unwrap();
            assert_eq!(
                (c.chunk_size, c.disk_size, &c.digests),
                (DISK_CHUNK_SIZE, size, &d)
            );
            assert_eq!(c.encode().unwrap(), b);
            assert_eq!(c.disk_digest(), sha256(&b[DISK_CHUNKS_HEADER_LEN..]));
        }
        assert!(encode_disk_chunks(DISK_CHUNK_SIZE, 1, &list(2)).is_err());
        assert!(encode_disk_chunks(1000, 1, &list(1)).is_err());
    }

    fn expect(b: &[u8], needle: &str) {
        let e = parse_disk_chunks(b).unwrap_err().0;
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }

    #[test]
    fn rejects_malformed() {
        let good = encode_disk_chunks(4096, 3 * 4096 + 1, &list(4)).unwrap();
        expect(&good[..71], "truncated");
        let mut b = good.clone();
        b[0] ^= 1;
        expect(&b, "bad magic");
        let mut b = good.clone();
        b[8] = 1;
        expect(&b, "format version");
        let mut b = good.clone();
        b[12] = 64;
        expect(&b, "header length");
        let mut b = good.clone();
        b[16..24].copy_from_slice(&3000u64.to_le_bytes());
        expect(&b, "chunk size");
        let mut b = good.clone();
        b[24..32].copy_from_slice(&(4096 * (MAX_DISK_CHUNKS + 1)).to_le_bytes());
        expect(&b, "more than");
        let mut b = good.clone();
        b[32] = 5;
        expect(&b, "chunk count");
        let mut b = good.clone();
        b.push(0);
        expect(&b, "digests is");
        expect(&good[..good.len() - 1], "digests is");
        let mut b = good.clone();
        b[100] ^= 4;
        expect(&b, "checksum");
        let mut b = good.clone();
        b[45] ^= 4;
        expect(&b, "checksum");
        // A huge count is refused before anything is allocated for it.
        let mut b = good.clone();
        b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        expect(&b, "more than");
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
