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

use sha2::{Digest, Sha256};

use crate::error::ParseError;
use crate::format::{check_geometry, check_prelude, u64_at, FormatVersion, FORMAT_VERSION};

/// Magic bytes at offset 0 of a diff memory file.
pub const DIFF_MAGIC: [u8; 8] = *b"IGNDIFF\0";
/// Length of the fixed header, in bytes.
pub const DIFF_HEADER_LEN: usize = 96;
const DIGEST_AT: usize = 64;

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
    let end = pages.checked_mul(8)?.checked_add(DIFF_HEADER_LEN as u64)?;
    end.checked_next_multiple_of(page_size)
}

/// Exact size of a diff file of `pages` pages of `page_size` bytes, or
/// `None` on overflow.
pub fn diff_file_size(page_size: u64, pages: u64) -> Option<u64> {
    diff_data_offset(page_size, pages)?.checked_add(pages.checked_mul(page_size)?)
}

/// Parse and check the 96-byte fixed header at the start of `bytes`
/// (untrusted). Does not check the digest, which also covers the index; see
/// [`parse_diff_prefix`].
pub fn parse_diff_header(bytes: &[u8]) -> Result<DiffHeader, ParseError> {
    let err = |m: String| Err(ParseError(m));
    let version = check_prelude(bytes, &DIFF_MAGIC, DIFF_HEADER_LEN, "a diff memory file")?;
    let page_size = u64_at(bytes, 16);
    let ram_size = u64_at(bytes, 24);
    check_geometry(page_size, 0, ram_size)?;
    let page_count = u64_at(bytes, 32);
    if page_count > ram_size / page_size {
        return err(format!(
            "page count {page_count} exceeds the {} pages of RAM",
            ram_size / page_size
        ));
    }
    let index_offset = u64_at(bytes, 40);
    if index_offset != DIFF_HEADER_LEN as u64 {
        return err(format!(
            "index offset {index_offset}, expected {DIFF_HEADER_LEN}"
        ));
    }
    let data_offset = u64_at(bytes, 48);
    // Cannot overflow: page_count <= 2^40 / 4096.
    let want = diff_data_offset(page_size, page_count);
    if Some(data_offset) != want {
        return err(format!(
            "data offset {data_offset}, expected {} for {page_count} pages",
            want.unwrap_or(0)
        ));
    }
    let reserved = u64_at(bytes, 56);
    if reserved != 0 {
        return err(format!("reserved field is {reserved:#x}, expected 0"));
    }
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&bytes[DIGEST_AT..DIGEST_AT + 32]);
    Ok(DiffHeader {
        version,
        page_size,
        ram_size,
        page_count,
        data_offset,
        digest,
    })
}

/// Parse the prefix of a diff file (untrusted): header, index, and the
/// padding up to the data offset. `bytes` must hold at least
/// `data_offset` bytes (more is ignored). Returns the header and the page
/// numbers, strictly increasing.
pub fn parse_diff_prefix(bytes: &[u8]) -> Result<(DiffHeader, Vec<u64>), ParseError> {
    let h = parse_diff_header(bytes)?;
    // data_offset <= 96 + 8 * 2^28 + 64 KiB: fits usize on 64-bit hosts;
    // the length check below bounds everything by the input.
    let Ok(data_offset) = usize::try_from(h.data_offset) else {
        return Err(ParseError::new("data offset does not fit in memory"));
    };
    if bytes.len() < data_offset {
        return Err(ParseError::new(format!(
            "truncated: {} bytes, but the index and padding end at {data_offset}",
            bytes.len()
        )));
    }
    let index_end = DIFF_HEADER_LEN + h.index_len() as usize;
    let index_bytes = &bytes[DIFF_HEADER_LEN..index_end];
    let mut hasher = Sha256::new();
    hasher.update(&bytes[..DIGEST_AT]);
    hasher.update(index_bytes);
    let digest: [u8; 32] = hasher.finalize().into();
    if digest != h.digest {
        return Err(ParseError::new(
            "header/index digest mismatch: header or page index is corrupted",
        ));
    }
    let ram_pages = h.ram_size / h.page_size;
    let mut index = Vec::with_capacity(h.page_count as usize);
    for (i, chunk) in index_bytes.chunks_exact(8).enumerate() {
        let page = u64_at(chunk, 0);
        if page >= ram_pages {
            return Err(ParseError::new(format!(
                "index entry {i}: page {page} is beyond the {ram_pages} pages of RAM"
            )));
        }
        if let Some(&prev) = index.last() {
            if page <= prev {
                return Err(ParseError::new(format!(
                    "index entry {i}: page {page} does not follow page {prev} (index must be strictly increasing)"
                )));
            }
        }
        index.push(page);
    }
    if let Some(off) = bytes[index_end..data_offset].iter().position(|&b| b != 0) {
        return Err(ParseError::new(format!(
            "non-zero padding byte at offset {}",
            index_end + off
        )));
    }
    Ok((h, index))
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
    check_geometry(page_size, 0, ram_size)?;
    let ram_pages = ram_size / page_size;
    for (i, w) in index.iter().enumerate() {
        if *w >= ram_pages {
            return Err(ParseError::new(format!(
                "page {w} is beyond the {ram_pages} pages of RAM"
            )));
        }
        if i > 0 && index[i - 1] >= *w {
            return Err(ParseError::new(format!(
                "pages must be strictly increasing: {} then {w}",
                index[i - 1]
            )));
        }
    }
    let count = index.len() as u64;
    let data_offset =
        diff_data_offset(page_size, count).ok_or_else(|| ParseError::new("too many pages"))?;
    let mut b = vec![0u8; data_offset as usize];
    b[..8].copy_from_slice(&DIFF_MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.major.to_le_bytes());
    b[10..12].copy_from_slice(&FORMAT_VERSION.minor.to_le_bytes());
    b[12..16].copy_from_slice(&(DIFF_HEADER_LEN as u32).to_le_bytes());
    b[16..24].copy_from_slice(&page_size.to_le_bytes());
    b[24..32].copy_from_slice(&ram_size.to_le_bytes());
    b[32..40].copy_from_slice(&count.to_le_bytes());
    b[40..48].copy_from_slice(&(DIFF_HEADER_LEN as u64).to_le_bytes());
    b[48..56].copy_from_slice(&data_offset.to_le_bytes());
    for (i, p) in index.iter().enumerate() {
        let at = DIFF_HEADER_LEN + 8 * i;
        b[at..at + 8].copy_from_slice(&p.to_le_bytes());
    }
    let mut hasher = Sha256::new();
    hasher.update(&b[..DIGEST_AT]);
    hasher.update(&b[DIFF_HEADER_LEN..DIFF_HEADER_LEN + index.len() * 8]);
    let digest: [u8; 32] = hasher.finalize().into();
    b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&digest);
    Ok(b)
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

    fn expect(b: &[u8], needle: &str) {
        let e = parse_diff_file(b).unwrap_err().0;
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }

    fn patch(index: &[u64], at: usize, val: &[u8], reseal: bool) -> Vec<u8> {
        let mut b = file(index);
        b[at..at + val.len()].copy_from_slice(val);
        if reseal {
            let end = DIFF_HEADER_LEN + index.len() * 8;
            let mut h = Sha256::new();
            h.update(&b[..DIGEST_AT]);
            h.update(&b[DIFF_HEADER_LEN..end]);
            let d: [u8; 32] = h.finalize().into();
            b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&d);
        }
        b
    }

    #[test]
    fn rejects_malformed() {
        let idx = [3u64, 7, 9];
        expect(&file(&idx)[..50], "truncated header of a diff memory file");
        expect(&patch(&idx, 0, b"X", false), "bad magic");
        expect(
            &patch(&idx, 8, &1u16.to_le_bytes(), false),
            "format version",
        );
        expect(
            &patch(&idx, 10, &2u16.to_le_bytes(), false),
            "format version",
        );
        expect(
            &patch(&idx, 12, &64u32.to_le_bytes(), false),
            "header length",
        );
        expect(&patch(&idx, 16, &3000u64.to_le_bytes(), false), "page size");
        expect(
            &patch(&idx, 24, &(RAM + 1).to_le_bytes(), false),
            "RAM size",
        );
        expect(&patch(&idx, 32, &65u64.to_le_bytes(), false), "page count");
        expect(&patch(&idx, 32, &4u64.to_le_bytes(), false), "digest");
        expect(&patch(&idx, 32, &600u64.to_le_bytes(), false), "page count");
        expect(
            &patch(&idx, 40, &97u64.to_le_bytes(), false),
            "index offset",
        );
        expect(
            &patch(&idx, 48, &(2 * PS).to_le_bytes(), false),
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
        expect(
            &patch(&idx, 104, &2u64.to_le_bytes(), true),
            "strictly increasing",
        );
        expect(&patch(&idx, 112, &64u64.to_le_bytes(), true), "beyond");
        expect(&patch(&idx, 200, &[1], false), "padding");
        let b = file(&idx);
        expect(&b[..b.len() - 1], "expected");
        expect(&b[..1000], "truncated");
        let mut longer = b.clone();
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
