//! `disk.chunks`: the per-chunk sha256 digests of a layer's `disk.img`.
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

use std::ops::Range;

use sha2::{Digest, Sha256};

use crate::error::ParseError;
use crate::format::{check_prelude, u64_at, FormatVersion, FORMAT_VERSION};
use crate::hash::Sha256Digest;

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
}
