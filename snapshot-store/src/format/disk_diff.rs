//! `disk.diff`: a diff layer's disk as the chunks written since its
//! parent (format 3.1): header, sorted chunk index, chunk data.
//!
//! Layout (all integers little-endian; see FORMAT.md):
//!
//! ```text
//! 0    8  magic "IGNDDIFF"
//! 8    2  format major          10   2  format minor
//! 12   4  header length = 96
//! 16   8  chunk size C (bytes)  24   8  disk size S (bytes)
//! 32   8  chunk count N         40   8  index offset = 96
//! 48   8  data offset D = round_up(96 + 8 N, 64 KiB)
//! 56   8  reserved = 0
//! 64  32  sha256(bytes 0..64 ++ index)
//! 96 8N   index: chunk numbers, strictly increasing, each < ceil(S / C)
//! ...     zero padding up to D
//! D  N C  data: index entry i's chunk at D + i C; the disk's last chunk,
//!         if shorter than C, is followed by zeros up to C
//! ```
//!
//! Every chunk has a whole slot, so the file's size, `D + N C`, follows
//! from the manifest (`disk.chunk_size`, `disk.diff_chunks`).

use crate::error::ParseError;
use crate::format::chunks::check_chunk_geometry;
use crate::format::indexed::{self, Kind};
use crate::format::FormatVersion;

/// Magic bytes at offset 0 of `disk.diff`.
pub const DISK_DIFF_MAGIC: [u8; 8] = *b"IGNDDIFF";
/// Length of the fixed header, in bytes.
pub const DISK_DIFF_HEADER_LEN: usize = indexed::HEADER_LEN;
/// Alignment of the chunk data, in bytes: a multiple of any file system's
/// block size, so a file system that clones ranges can share the chunks.
pub const DISK_DIFF_ALIGN: u64 = 64 << 10;
/// The first format version with `disk.diff`.
pub const DISK_DIFF_SINCE: FormatVersion = FormatVersion { major: 3, minor: 1 };

const KIND: Kind = Kind {
    magic: DISK_DIFF_MAGIC,
    what: "a disk diff",
    unit: "chunk",
    whole: "the disk",
    since: Some(DISK_DIFF_SINCE),
    align: |_| DISK_DIFF_ALIGN,
    geometry: check_chunk_geometry,
};

/// The decoded fixed header of `disk.diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskDiffHeader {
    /// Format version of the file.
    pub version: FormatVersion,
    /// Chunk size in bytes.
    pub chunk_size: u64,
    /// Size of the whole disk in bytes.
    pub disk_size: u64,
    /// Number of chunks stored (entries in the index).
    pub chunk_count: u64,
    /// Byte offset of the first chunk's data (a multiple of
    /// [`DISK_DIFF_ALIGN`]).
    pub data_offset: u64,
    /// sha256 over header bytes 0..64 followed by the index bytes.
    pub digest: [u8; 32],
}

impl DiskDiffHeader {
    /// Exact length of a well-formed file with this header, in bytes
    /// (saturating, for headers not produced by the parser).
    pub fn file_size(&self) -> u64 {
        self.data_offset
            .saturating_add(self.chunk_count.saturating_mul(self.chunk_size))
    }

    /// Byte offset in the file of the data of the `i`-th stored chunk (not
    /// chunk number `i`).
    pub fn slot_offset(&self, i: u64) -> u64 {
        self.data_offset
            .saturating_add(i.saturating_mul(self.chunk_size))
    }
}

impl From<indexed::Header> for DiskDiffHeader {
    fn from(h: indexed::Header) -> Self {
        DiskDiffHeader {
            version: h.version,
            chunk_size: h.unit_size,
            disk_size: h.total_size,
            chunk_count: h.count,
            data_offset: h.data_offset,
            digest: h.digest,
        }
    }
}

/// Offset of the chunk data for `chunks` stored chunks, or `None` on
/// overflow.
pub fn disk_diff_data_offset(chunks: u64) -> Option<u64> {
    // The alignment does not depend on the chunk size.
    KIND.data_offset(0, chunks)
}

/// Exact size of a `disk.diff` of `chunks` chunks of `chunk_size` bytes, or
/// `None` on overflow.
pub fn disk_diff_file_size(chunk_size: u64, chunks: u64) -> Option<u64> {
    KIND.file_size(chunk_size, chunks)
}

/// Parse and check the 96-byte fixed header at the start of `bytes`
/// (untrusted). Does not check the digest, which also covers the index; see
/// [`parse_disk_diff_prefix`].
pub fn parse_disk_diff_header(bytes: &[u8]) -> Result<DiskDiffHeader, ParseError> {
    KIND.parse_header(bytes).map(DiskDiffHeader::from)
}

/// Parse the prefix of a `disk.diff` (untrusted): header, index, and the
/// padding up to the data offset. `bytes` must hold at least `data_offset`
/// bytes (more is ignored). Returns the header and the chunk numbers,
/// strictly increasing.
pub fn parse_disk_diff_prefix(bytes: &[u8]) -> Result<(DiskDiffHeader, Vec<u64>), ParseError> {
    KIND.parse_prefix(bytes).map(|(h, index)| (h.into(), index))
}

/// Build the prefix of a `disk.diff` (header, index, zero padding: exactly
/// `data_offset` bytes) for the chunks `index` (strictly increasing chunk
/// numbers) of a `disk_size`-byte disk in `chunk_size`-byte chunks.
pub fn encode_disk_diff_prefix(
    chunk_size: u64,
    disk_size: u64,
    index: &[u64],
) -> Result<Vec<u8>, ParseError> {
    KIND.encode_prefix(chunk_size, disk_size, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 4096;
    // 10 chunks, the last one 100 bytes.
    const DISK: u64 = 9 * CS + 100;

    fn prefix(index: &[u64]) -> Vec<u8> {
        encode_disk_diff_prefix(CS, DISK, index).unwrap()
    }

    #[test]
    fn round_trip_and_sizes() {
        for index in [vec![], vec![0], vec![0, 1, 9], (0..10).collect()] {
            let b = prefix(&index);
            let (h, got) = parse_disk_diff_prefix(&b).unwrap();
            assert_eq!(got, index);
            assert_eq!(h.data_offset, DISK_DIFF_ALIGN);
            assert_eq!(b.len() as u64, h.data_offset);
            assert_eq!(
                Some(h.file_size()),
                disk_diff_file_size(CS, index.len() as u64)
            );
            assert_eq!(h.slot_offset(1), DISK_DIFF_ALIGN + CS);
        }
        // 96 + 8 * 8180 fills 64 KiB exactly; one more crosses it.
        assert_eq!(disk_diff_data_offset(8180), Some(DISK_DIFF_ALIGN));
        assert_eq!(disk_diff_data_offset(8181), Some(2 * DISK_DIFF_ALIGN));
        assert_eq!(disk_diff_file_size(CS, u64::MAX / 4), None);
    }

    #[test]
    fn encode_rejects_bad_index() {
        assert!(encode_disk_diff_prefix(CS, DISK, &[1, 1]).is_err());
        assert!(encode_disk_diff_prefix(CS, DISK, &[2, 1]).is_err());
        assert!(encode_disk_diff_prefix(CS, DISK, &[10]).is_err());
        assert!(encode_disk_diff_prefix(3000, DISK, &[]).is_err());
    }

    #[test]
    fn rejects_malformed() {
        let good = prefix(&[3, 7, 9]);
        let parse = |b: &[u8]| parse_disk_diff_prefix(b).map(|_| ());
        indexed::tests::rejects_malformed(&KIND, &good, 10, 4096, &parse);
        // A version before disk diffs.
        let old = indexed::tests::patch(good, 3, 10, &0u16.to_le_bytes(), false);
        let e = parse_disk_diff_prefix(&old).unwrap_err().0;
        assert!(e.contains("needs format version 3.1"), "{e}");
    }

    #[test]
    fn huge_claimed_count_is_rejected_without_allocating() {
        // A header claiming 2^24 chunks of a 4 TiB disk, in a 64 KiB input.
        let mut b = encode_disk_diff_prefix(CS << 6, 1 << 42, &[]).unwrap();
        b[32..40].copy_from_slice(&(1u64 << 24).to_le_bytes());
        let off = disk_diff_data_offset(1 << 24).unwrap();
        b[48..56].copy_from_slice(&off.to_le_bytes());
        let e = parse_disk_diff_prefix(&b).unwrap_err().0;
        assert!(e.contains("truncated"), "{e}");
    }
}
