//! The packed diff memory file: header, sorted page index, page data.
//!
//! Layout (all integers little-endian; see FORMAT.md):
//!
//! ```text
//! 0    8  magic "IGNDIFF\0"
//! 8    2  format major          10   2  format minor
//! 12   4  header length = 96
//! 16   8  page size (bytes)     24   8  RAM size (bytes)
//! 32   8  page count N          40   8  index offset = 96
//! 48   8  data offset = round_up(96 + 8 N, page size)
//! 56   8  reserved = 0
//! 64  32  sha256(bytes 0..64 ++ index)
//! 96 8N   index: page numbers, strictly increasing, each < RAM size / page size
//! ...     zero padding up to the data offset
//! data    N pages; page i of the index at data offset + i * page size
//! ```

use crate::error::ParseError;
use crate::format::check_geometry;
use crate::format::indexed::{self, Kind};
use crate::format::FormatVersion;

/// Magic bytes at offset 0 of a diff memory file.
pub const DIFF_MAGIC: [u8; 8] = *b"IGNDIFF\0";
/// Length of the fixed header, in bytes.
pub const DIFF_HEADER_LEN: usize = indexed::HEADER_LEN;

const KIND: Kind = Kind {
    magic: DIFF_MAGIC,
    what: "a diff memory file",
    unit: "page",
    whole: "RAM",
    since: None,
    align: |page_size| page_size,
    geometry: |page_size, ram_size| {
        check_geometry(page_size, 0, ram_size)?;
        Ok(ram_size / page_size)
    },
};

/// The decoded fixed header of a diff memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffHeader {
    /// Format version of the file.
    pub version: FormatVersion,
    /// Page size in bytes.
    pub page_size: u64,
    /// Guest RAM size in bytes.
    pub ram_size: u64,
    /// Number of pages stored (entries in the index).
    pub page_count: u64,
    /// Byte offset of the first page's data (a multiple of the page size).
    pub data_offset: u64,
    /// sha256 over header bytes 0..64 followed by the index bytes.
    pub digest: [u8; 32],
}

impl From<indexed::Header> for DiffHeader {
    fn from(h: indexed::Header) -> Self {
        DiffHeader {
            version: h.version,
            page_size: h.unit_size,
            ram_size: h.total_size,
            page_count: h.count,
            data_offset: h.data_offset,
            digest: h.digest,
        }
    }
}

impl DiffHeader {
    /// Length of the index in bytes (8 per page).
    pub fn index_len(&self) -> u64 {
        self.page_count.saturating_mul(8)
    }

    /// Exact length of a well-formed file with this header, in bytes
    /// (saturating, for headers not produced by the parser).
    pub fn file_size(&self) -> u64 {
        self.data_offset
            .saturating_add(self.page_count.saturating_mul(self.page_size))
    }
}

/// Offset of the page data for `pages` pages of `page_size` bytes, or
/// `None` on overflow.
pub fn diff_data_offset(page_size: u64, pages: u64) -> Option<u64> {
    KIND.data_offset(page_size, pages)
}

/// Exact size of a diff file of `pages` pages of `page_size` bytes, or
/// `None` on overflow.
pub fn diff_file_size(page_size: u64, pages: u64) -> Option<u64> {
    KIND.file_size(page_size, pages)
}

/// Parse and check the 96-byte fixed header at the start of `bytes`
/// (untrusted). Does not check the digest, which also covers the index; see
/// [`parse_diff_prefix`].
pub fn parse_diff_header(bytes: &[u8]) -> Result<DiffHeader, ParseError> {
    KIND.parse_header(bytes).map(DiffHeader::from)
}

/// Parse the prefix of a diff file (untrusted): header, index, and the
/// padding up to the data offset. `bytes` must hold at least
/// `data_offset` bytes (more is ignored). Returns the header and the page
/// numbers, strictly increasing.
pub fn parse_diff_prefix(bytes: &[u8]) -> Result<(DiffHeader, Vec<u64>), ParseError> {
    KIND.parse_prefix(bytes).map(|(h, index)| (h.into(), index))
}

/// A whole diff file, parsed.
#[derive(Debug)]
pub struct DiffView<'a> {
    /// The header.
    pub header: DiffHeader,
    /// Page numbers, strictly increasing.
    pub index: Vec<u64>,
    /// Page data: `index.len() * page_size` bytes.
    pub data: &'a [u8],
}

impl DiffView<'_> {
    /// Data of the `i`-th stored page (not page number `i`). Panics if
    /// `i >= index.len()`.
    pub fn page(&self, i: usize) -> &[u8] {
        let ps = self.header.page_size as usize;
        &self.data[i * ps..(i + 1) * ps]
    }
}

/// Parse a complete diff file held in memory (untrusted): the prefix as in
/// [`parse_diff_prefix`], and a total length of exactly
/// [`DiffHeader::file_size`].
pub fn parse_diff_file(bytes: &[u8]) -> Result<DiffView<'_>, ParseError> {
    let (header, index) = parse_diff_prefix(bytes)?;
    if bytes.len() as u64 != header.file_size() {
        return Err(ParseError::new(format!(
            "file is {} bytes, expected {} for {} pages",
            bytes.len(),
            header.file_size(),
            header.page_count
        )));
    }
    Ok(DiffView {
        header,
        index,
        data: &bytes[header.data_offset as usize..],
    })
}

/// Build the prefix of a diff file (header, index, zero padding; exactly
/// `data_offset` bytes) for pages `index` (strictly increasing page
/// numbers) of a RAM of `ram_size` bytes in `page_size`-byte pages.
pub fn encode_diff_prefix(
    page_size: u64,
    ram_size: u64,
    index: &[u64],
) -> Result<Vec<u8>, ParseError> {
    KIND.encode_prefix(page_size, ram_size, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u64 = 4096;
    const RAM: u64 = 64 * PS;

    fn file(index: &[u64]) -> Vec<u8> {
        let mut b = encode_diff_prefix(PS, RAM, index).unwrap();
        for &p in index {
            b.extend(std::iter::repeat_n(p as u8, PS as usize));
        }
        b
    }

    #[test]
    fn round_trip_and_sizes() {
        for index in [
            vec![],
            vec![0],
            vec![0, 1, 2],
            vec![5, 63],
            (0..64).collect(),
        ] {
            let b = file(&index);
            assert_eq!(Some(b.len() as u64), diff_file_size(PS, index.len() as u64));
            let v = parse_diff_file(&b).unwrap();
            assert_eq!(v.index, index);
            assert_eq!(v.header.data_offset % PS, 0);
            for (i, &p) in index.iter().enumerate() {
                assert!(v.page(i).iter().all(|&x| x == p as u8));
            }
        }
        // 96 + 8 * 500 fills 4 KiB exactly; one more page crosses it.
        assert_eq!(diff_data_offset(PS, 0), Some(PS));
        assert_eq!(diff_data_offset(PS, 500), Some(PS));
        assert_eq!(diff_data_offset(PS, 501), Some(2 * PS));
        assert_eq!(diff_data_offset(16384, 32768), Some(16 * 16384 + 16384));
        assert_eq!(diff_file_size(PS, u64::MAX / 4), None);
    }

    #[test]
    fn encode_rejects_bad_index() {
        assert!(encode_diff_prefix(PS, RAM, &[1, 1]).is_err());
        assert!(encode_diff_prefix(PS, RAM, &[2, 1]).is_err());
        assert!(encode_diff_prefix(PS, RAM, &[64]).is_err());
        assert!(encode_diff_prefix(3000, RAM, &[]).is_err());
    }

    #[test]
    fn rejects_malformed() {
        let good = file(&[3, 7, 9]);
        let parse = |b: &[u8]| parse_diff_file(b).map(|_| ());
        indexed::tests::rejects_malformed(&KIND, &good, RAM / PS, 2 * PS, &parse);
        let expect = |b: &[u8], needle: &str| {
            let e = parse_diff_file(b).unwrap_err().0;
            assert!(e.contains(needle), "expected {needle:?} in {e:?}");
        };
        let p = |at, val: &[u8]| indexed::tests::patch(good.clone(), 3, at, val, false);
        expect(&p(24, &(RAM + 1).to_le_bytes()), "RAM size");
        expect(&p(32, &600u64.to_le_bytes()), "page count");
        // The whole file: exactly its pages.
        expect(&good[..good.len() - 1], "expected");
        let mut longer = good.clone();
        longer.push(0);
        expect(&longer, "expected");
    }

    #[test]
    fn huge_claimed_count_is_rejected_without_allocating() {
        // A header claiming 2^28 pages of a 1 TiB RAM, in a 4 KiB input.
        let mut b = encode_diff_prefix(PS, 1 << 40, &[]).unwrap();
        b[32..40].copy_from_slice(&(1u64 << 28).to_le_bytes());
        let off = diff_data_offset(PS, 1 << 28).unwrap();
        b[48..56].copy_from_slice(&off.to_le_bytes());
        let e = parse_diff_prefix(&b).unwrap_err().0;
        assert!(e.contains("truncated"), "{e}");
    }
}
