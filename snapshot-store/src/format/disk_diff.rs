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

use sha2::{Digest, Sha256};

use crate::error::ParseError;
use crate::format::chunks::check_chunk_geometry;
use crate::format::{check_prelude, u64_at, FormatVersion, FORMAT_VERSION};

/// Magic bytes at offset 0 of `disk.diff`.
pub const DISK_DIFF_MAGIC: [u8; 8] = *b"IGNDDIFF";
/// Length of the fixed header, in bytes.
pub const DISK_DIFF_HEADER_LEN: usize = 96;
/// Alignment of the chunk data, in bytes: a multiple of any file system's
/// block size, so a file system that clones ranges can share the chunks.
pub const DISK_DIFF_ALIGN: u64 = 64 << 10;
/// The first format version with `disk.diff`.
pub const DISK_DIFF_SINCE: FormatVersion = FormatVersion { major: 3, minor: 1 };
const DIGEST_AT: usize = 64;

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

/// Offset of the chunk data for `chunks` stored chunks, or `None` on
/// overflow.
pub fn disk_diff_data_offset(chunks: u64) -> Option<u64> {
    let end = chunks
        .checked_mul(8)?
        .checked_add(DISK_DIFF_HEADER_LEN as u64)?;
    end.checked_next_multiple_of(DISK_DIFF_ALIGN)
}

/// Exact size of a `disk.diff` of `chunks` chunks of `chunk_size` bytes, or
/// `None` on overflow.
pub fn disk_diff_file_size(chunk_size: u64, chunks: u64) -> Option<u64> {
    disk_diff_data_offset(chunks)?.checked_add(chunks.checked_mul(chunk_size)?)
}

/// Parse and check the 96-byte fixed header at the start of `bytes`
/// (untrusted). Does not check the digest, which also covers the index; see
/// [`parse_disk_diff_prefix`].
pub fn parse_disk_diff_header(bytes: &[u8]) -> Result<DiskDiffHeader, ParseError> {
    let err = |m: String| Err(ParseError(m));
    let version = check_prelude(bytes, &DISK_DIFF_MAGIC, DISK_DIFF_HEADER_LEN, "a disk diff")?;
    if version.minor < DISK_DIFF_SINCE.minor {
        return err(format!(
            "format version {version} has no disk diffs (they came with {DISK_DIFF_SINCE})"
        ));
    }
    let chunk_size = u64_at(bytes, 16);
    let disk_size = u64_at(bytes, 24);
    let chunks = check_chunk_geometry(chunk_size, disk_size)?;
    let chunk_count = u64_at(bytes, 32);
    if chunk_count > chunks {
        return err(format!(
            "chunk count {chunk_count} exceeds the {chunks} chunks of the disk"
        ));
    }
    let index_offset = u64_at(bytes, 40);
    if index_offset != DISK_DIFF_HEADER_LEN as u64 {
        return err(format!(
            "index offset {index_offset}, expected {DISK_DIFF_HEADER_LEN}"
        ));
    }
    let data_offset = u64_at(bytes, 48);
    // Cannot overflow: chunk_count <= 2^24.
    let want = disk_diff_data_offset(chunk_count);
    if Some(data_offset) != want {
        return err(format!(
            "data offset {data_offset}, expected {} for {chunk_count} chunks",
            want.unwrap_or(0)
        ));
    }
    let reserved = u64_at(bytes, 56);
    if reserved != 0 {
        return err(format!("reserved field is {reserved:#x}, expected 0"));
    }
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&bytes[DIGEST_AT..DIGEST_AT + 32]);
    Ok(DiskDiffHeader {
        version,
        chunk_size,
        disk_size,
        chunk_count,
        data_offset,
        digest,
    })
}

/// Parse the prefix of a `disk.diff` (untrusted): header, index, and the
/// padding up to the data offset. `bytes` must hold at least `data_offset`
/// bytes (more is ignored). Returns the header and the chunk numbers,
/// strictly increasing.
pub fn parse_disk_diff_prefix(bytes: &[u8]) -> Result<(DiskDiffHeader, Vec<u64>), ParseError> {
    let h = parse_disk_diff_header(bytes)?;
    // data_offset <= 96 + 8 * 2^24 + 64 KiB: fits a usize.
    let Ok(data_offset) = usize::try_from(h.data_offset) else {
        return Err(ParseError::new("data offset does not fit in memory"));
    };
    if bytes.len() < data_offset {
        return Err(ParseError::new(format!(
            "truncated: {} bytes, but the index and padding end at {data_offset}",
            bytes.len()
        )));
    }
    let index_end = DISK_DIFF_HEADER_LEN + h.chunk_count as usize * 8;
    let index_bytes = &bytes[DISK_DIFF_HEADER_LEN..index_end];
    let mut hasher = Sha256::new();
    hasher.update(&bytes[..DIGEST_AT]);
    hasher.update(index_bytes);
    if <[u8; 32]>::from(hasher.finalize()) != h.digest {
        return Err(ParseError::new(
            "header/index digest mismatch: header or chunk index is corrupted",
        ));
    }
    let chunks = h.disk_size.div_ceil(h.chunk_size);
    let mut index: Vec<u64> = Vec::with_capacity(h.chunk_count as usize);
    for (i, entry) in index_bytes.chunks_exact(8).enumerate() {
        let c = u64_at(entry, 0);
        if c >= chunks {
            return Err(ParseError::new(format!(
                "index entry {i}: chunk {c} is beyond the {chunks} chunks of the disk"
            )));
        }
        if let Some(&prev) = index.last() {
            if c <= prev {
                return Err(ParseError::new(format!(
                    "index entry {i}: chunk {c} does not follow chunk {prev} (index must be strictly increasing)"
                )));
            }
        }
        index.push(c);
    }
    if let Some(off) = bytes[index_end..data_offset].iter().position(|&b| b != 0) {
        return Err(ParseError::new(format!(
            "non-zero padding byte at offset {}",
            index_end + off
        )));
    }
    Ok((h, index))
}

/// Build the prefix of a `disk.diff` (header, index, zero padding: exactly
/// `data_offset` bytes) for the chunks `index` (strictly increasing chunk
/// numbers) of a `disk_size`-byte disk in `chunk_size`-byte chunks.
pub fn encode_disk_diff_prefix(
    chunk_size: u64,
    disk_size: u64,
    index: &[u64],
) -> Result<Vec<u8>, ParseError> {
    let chunks = check_chunk_geometry(chunk_size, disk_size)?;
    for (i, &c) in index.iter().enumerate() {
        if c >= chunks {
            return Err(ParseError::new(format!(
                "chunk {c} is beyond the {chunks} chunks of the disk"
            )));
        }
        if i > 0 && index[i - 1] >= c {
            return Err(ParseError::new(format!(
                "chunks must be strictly increasing: {} then {c}",
                index[i - 1]
            )));
        }
    }
    let count = index.len() as u64;
    let data_offset =
        disk_diff_data_offset(count).ok_or_else(|| ParseError::new("too many chunks"))?;
    let mut b = vec![0u8; data_offset as usize];
    b[..8].copy_from_slice(&DISK_DIFF_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.major.to_le_bytes());
    b[10..12].copy_from_slice(&FORMAT_VERSION.minor.to_le_bytes());
    b[12..16].copy_from_slice(&(DISK_DIFF_HEADER_LEN as u32).to_le_bytes());
    b[16..24].copy_from_slice(&chunk_size.to_le_bytes());
    b[24..32].copy_from_slice(&disk_size.to_le_bytes());
    b[32..40].copy_from_slice(&count.to_le_bytes());
    b[40..48].copy_from_slice(&(DISK_DIFF_HEADER_LEN as u64).to_le_bytes());
    b[48..56].copy_from_slice(&data_offset.to_le_bytes());
    for (i, c) in index.iter().enumerate() {
        let at = DISK_DIFF_HEADER_LEN + 8 * i;
        b[at..at + 8].copy_from_slice(&c.to_le_bytes());
    }
    let mut hasher = Sha256::new();
    hasher.update(&b[..DIGEST_AT]);
    hasher.update(&b[DISK_DIFF_HEADER_LEN..DISK_DIFF_HEADER_LEN + index.len() * 8]);
    let digest: [u8; 32] = hasher.finalize().into();
    b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&digest);
    Ok(b)
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

    fn expect(b: &[u8], needle: &str) {
        let e = parse_disk_diff_prefix(b).unwrap_err().0;
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }

    fn patch(index: &[u64], at: usize, val: &[u8], reseal: bool) -> Vec<u8> {
        let mut b = prefix(index);
        b[at..at + val.len()].copy_from_slice(val);
        if reseal {
            let end = DISK_DIFF_HEADER_LEN + index.len() * 8;
            let mut h = Sha256::new();
            h.update(&b[..DIGEST_AT]);
            h.update(&b[DISK_DIFF_HEADER_LEN..end]);
            let d: [u8; 32] = h.finalize().into();
            b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&d);
        }
        b
    }

    #[test]
    fn rejects_malformed() {
        let idx = [3u64, 7, 9];
        expect(&prefix(&idx)[..50], "truncated header of a disk diff");
        expect(&patch(&idx, 0, b"X", false), "bad magic");
        expect(
            &patch(&idx, 8, &4u16.to_le_bytes(), false),
            "format version",
        );
        expect(
            &patch(&idx, 10, &9u16.to_le_bytes(), false),
            "format version",
        );
        expect(
            &patch(&idx, 10, &0u16.to_le_bytes(), false),
            "has no disk diffs",
        );
        expect(
            &patch(&idx, 12, &64u32.to_le_bytes(), false),
            "header length",
        );
        expect(
            &patch(&idx, 16, &3000u64.to_le_bytes(), false),
            "chunk size",
        );
        expect(&patch(&idx, 32, &11u64.to_le_bytes(), false), "chunk count");
        expect(&patch(&idx, 32, &4u64.to_le_bytes(), false), "digest");
        expect(
            &patch(&idx, 40, &97u64.to_le_bytes(), false),
            "index offset",
        );
        expect(
            &patch(&idx, 48, &4096u64.to_le_bytes(), false),
            "data offset",
        );
        expect(&patch(&idx, 56, &1u64.to_le_bytes(), false), "reserved");
        expect(&patch(&idx, 64, &[0xff], false), "digest");
        expect(&patch(&idx, 96, &[4], false), "digest");
        // Index problems behind a valid digest.
        expect(
            &patch(&idx, 104, &3u64.to_le_bytes(), true),
            "strictly increasing",
        );
        expect(&patch(&idx, 112, &10u64.to_le_bytes(), true), "beyond");
        expect(&patch(&idx, 200, &[1], false), "padding");
        expect(&prefix(&idx)[..1000], "truncated");
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
