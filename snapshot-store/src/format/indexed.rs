//! The layout the packed diff memory file (`memory.diff`: pages) and the
//! disk diff (`disk.diff`: chunks) share: a fixed header, a sorted index of
//! unit numbers, zero padding, then one whole slot per index entry.
//!
//! ```text
//! 0    8  magic
//! 8    2  format major          10   2  format minor
//! 12   4  header length = 96
//! 16   8  unit size U (bytes)   24   8  size of the whole (RAM, disk; bytes)
//! 32   8  unit count N          40   8  index offset = 96
//! 48   8  data offset D = round_up(96 + 8 N, the kind's alignment)
//! 56   8  reserved = 0
//! 64  32  sha256(bytes 0..64 ++ index)
//! 96 8N   index: unit numbers, strictly increasing, each < the whole's units
//! ...     zero padding up to D
//! D  N U  data: index entry i's unit at D + i U
//! ```

use sha2::{Digest, Sha256};

use crate::error::ParseError;
use crate::format::{check_prelude, u64_at, FormatVersion, FORMAT_VERSION};

/// Length of the fixed header, in bytes.
pub(crate) const HEADER_LEN: usize = 96;
const DIGEST_AT: usize = 64;

/// What differs between the files of this layout.
pub(crate) struct Kind {
    /// Magic bytes at offset 0.
    pub magic: [u8; 8],
    /// The file, for messages ("a diff memory file").
    pub what: &'static str,
    /// One unit ("page", "chunk").
    pub unit: &'static str,
    /// What the units make up ("RAM", "the disk").
    pub whole: &'static str,
    /// The first format version with this file; `None`: every version this
    /// crate reads has it.
    pub since: Option<FormatVersion>,
    /// Alignment of the data offset for a unit size, in bytes.
    pub align: fn(u64) -> u64,
    /// Checks a unit size and the whole's size (untrusted); returns how many
    /// units the whole has.
    pub geometry: fn(u64, u64) -> Result<u64, ParseError>,
}

/// A decoded fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: FormatVersion,
    pub unit_size: u64,
    pub total_size: u64,
    pub count: u64,
    pub data_offset: u64,
    pub digest: [u8; 32],
}

impl Kind {
    /// Offset of the data for `count` units of `unit_size` bytes, or `None`
    /// on overflow.
    pub fn data_offset(&self, unit_size: u64, count: u64) -> Option<u64> {
        let end = count.checked_mul(8)?.checked_add(HEADER_LEN as u64)?;
        end.checked_next_multiple_of((self.align)(unit_size))
    }

    /// Exact size of a file of `count` units of `unit_size` bytes, or `None`
    /// on overflow.
    pub fn file_size(&self, unit_size: u64, count: u64) -> Option<u64> {
        self.data_offset(unit_size, count)?
            .checked_add(count.checked_mul(unit_size)?)
    }

    /// Parses and checks the fixed header at the start of `bytes`
    /// (untrusted). The digest, which also covers the index, is checked by
    /// [`Kind::parse_prefix`].
    pub fn parse_header(&self, bytes: &[u8]) -> Result<Header, ParseError> {
        let err = |m: String| Err(ParseError(m));
        let (what, unit, whole) = (self.what, self.unit, self.whole);
        let version = check_prelude(bytes, &self.magic, HEADER_LEN, what)?;
        if let Some(since) = self
            .since
            .filter(|s| (version.major, version.minor) < (s.major, s.minor))
        {
            return err(format!(
                "{what} needs format version {since} or later, not {version}"
            ));
        }
        let unit_size = u64_at(bytes, 16);
        let total_size = u64_at(bytes, 24);
        let units = (self.geometry)(unit_size, total_size)?;
        let count = u64_at(bytes, 32);
        if count > units {
            return err(format!(
                "{unit} count {count} exceeds the {units} {unit}s of {whole}"
            ));
        }
        let index_offset = u64_at(bytes, 40);
        if index_offset != HEADER_LEN as u64 {
            return err(format!(
                "index offset {index_offset}, expected {HEADER_LEN}"
            ));
        }
        let data_offset = u64_at(bytes, 48);
        // Cannot overflow: the geometry bounds the unit count.
        let want = self.data_offset(unit_size, count);
        if Some(data_offset) != want {
            return err(format!(
                "data offset {data_offset}, expected {} for {count} {unit}s",
                want.unwrap_or(0)
            ));
        }
        let reserved = u64_at(bytes, 56);
        if reserved != 0 {
            return err(format!("reserved field is {reserved:#x}, expected 0"));
        }
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&bytes[DIGEST_AT..DIGEST_AT + 32]);
        Ok(Header {
            version,
            unit_size,
            total_size,
            count,
            data_offset,
            digest,
        })
    }

    /// Parses the prefix of a file (untrusted): header, index, and the
    /// padding up to the data offset. `bytes` must hold at least
    /// `data_offset` bytes (more is ignored). Returns the header and the
    /// unit numbers, strictly increasing.
    pub fn parse_prefix(&self, bytes: &[u8]) -> Result<(Header, Vec<u64>), ParseError> {
        let unit = self.unit;
        let h = self.parse_header(bytes)?;
        // The length check below bounds everything by the input.
        let Ok(data_offset) = usize::try_from(h.data_offset) else {
            return Err(ParseError::new("data offset does not fit in memory"));
        };
        if bytes.len() < data_offset {
            return Err(ParseError::new(format!(
                "truncated: {} bytes, but the index and padding end at {data_offset}",
                bytes.len()
            )));
        }
        let index_end = HEADER_LEN + h.count as usize * 8;
        let index_bytes = &bytes[HEADER_LEN..index_end];
        if digest(&bytes[..DIGEST_AT], index_bytes) != h.digest {
            return Err(ParseError::new(format!(
                "header/index digest mismatch: header or {unit} index is corrupted"
            )));
        }
        let units = (self.geometry)(h.unit_size, h.total_size)?;
        let mut index: Vec<u64> = Vec::with_capacity(h.count as usize);
        for (i, entry) in index_bytes.chunks_exact(8).enumerate() {
            let n = u64_at(entry, 0);
            if n >= units {
                return Err(ParseError::new(format!(
                    "index entry {i}: {unit} {n} is beyond the {units} {unit}s of {}",
                    self.whole
                )));
            }
            if let Some(&prev) = index.last() {
                if n <= prev {
                    return Err(ParseError::new(format!(
                        "index entry {i}: {unit} {n} does not follow {unit} {prev} (index must be strictly increasing)"
                    )));
                }
            }
            index.push(n);
        }
        if let Some(off) = bytes[index_end..data_offset].iter().position(|&b| b != 0) {
            return Err(ParseError::new(format!(
                "non-zero padding byte at offset {}",
                index_end + off
            )));
        }
        Ok((h, index))
    }

    /// Builds the prefix of a file (header, index, zero padding: exactly
    /// `data_offset` bytes) for the units `index` (strictly increasing) of
    /// a `total_size`-byte whole in `unit_size`-byte units.
    pub fn encode_prefix(
        &self,
        unit_size: u64,
        total_size: u64,
        index: &[u64],
    ) -> Result<Vec<u8>, ParseError> {
        let (unit, whole) = (self.unit, self.whole);
        let units = (self.geometry)(unit_size, total_size)?;
        for (i, &n) in index.iter().enumerate() {
            if n >= units {
                return Err(ParseError::new(format!(
                    "{unit} {n} is beyond the {units} {unit}s of {whole}"
                )));
            }
            if i > 0 && index[i - 1] >= n {
                return Err(ParseError::new(format!(
                    "{unit}s must be strictly increasing: {} then {n}",
                    index[i - 1]
                )));
            }
        }
        let count = index.len() as u64;
        let data_offset = self
            .data_offset(unit_size, count)
            .ok_or_else(|| ParseError::new(format!("too many {unit}s")))?;
        let mut b = vec![0u8; data_offset as usize];
        b[..8].copy_from_slice(&self.magic);
        b[8..10].copy_from_slice(&FORMAT_VERSION.major.to_le_bytes());
        b[10..12].copy_from_slice(&FORMAT_VERSION.minor.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&unit_size.to_le_bytes());
        b[24..32].copy_from_slice(&total_size.to_le_bytes());
        b[32..40].copy_from_slice(&count.to_le_bytes());
        b[40..48].copy_from_slice(&(HEADER_LEN as u64).to_le_bytes());
        b[48..56].copy_from_slice(&data_offset.to_le_bytes());
        for (i, n) in index.iter().enumerate() {
            let at = HEADER_LEN + 8 * i;
            b[at..at + 8].copy_from_slice(&n.to_le_bytes());
        }
        let d = digest(
            &b[..DIGEST_AT],
            &b[HEADER_LEN..HEADER_LEN + index.len() * 8],
        );
        b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&d);
        Ok(b)
    }
}

/// sha256 of the header's first 64 bytes followed by the index.
fn digest(head: &[u8], index: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(head);
    h.update(index);
    h.finalize().into()
}

#[cfg(test)]
pub(crate) mod tests {
    //! The malformed inputs every kind refuses; each kind's module runs
    //! [`rejects_malformed`] with its own geometry.
    use super::*;

    /// Writes `val` at `at` into `b`; with `reseal`, the digest is made to
    /// match again (`count` index entries).
    pub(crate) fn patch(
        mut b: Vec<u8>,
        count: usize,
        at: usize,
        val: &[u8],
        reseal: bool,
    ) -> Vec<u8> {
        b[at..at + val.len()].copy_from_slice(val);
        if reseal {
            let d = digest(&b[..DIGEST_AT], &b[HEADER_LEN..HEADER_LEN + count * 8]);
            b[DIGEST_AT..DIGEST_AT + 32].copy_from_slice(&d);
        }
        b
    }

    /// Checks `parse` refuses every malformed variant of `good`, a valid
    /// prefix of units 3, 7, 9 of a whole of `units` units whose data
    /// offset is not `bad_offset`; `parse` error messages must contain the
    /// expected words.
    pub(crate) fn rejects_malformed(
        kind: &Kind,
        good: &[u8],
        units: u64,
        bad_offset: u64,
        parse: &dyn Fn(&[u8]) -> Result<(), ParseError>,
    ) {
        let expect = |b: &[u8], needle: &str| {
            let e = parse(b).unwrap_err().0;
            assert!(e.contains(needle), "expected {needle:?} in {e:?}");
        };
        let p = |at: usize, val: &[u8], reseal: bool| patch(good.to_vec(), 3, at, val, reseal);
        let unit_count = format!("{} count", kind.unit);
        expect(&good[..50], &format!("truncated header of {}", kind.what));
        expect(&p(0, b"X", false), "bad magic");
        expect(&p(8, &4u16.to_le_bytes(), false), "format version");
        expect(&p(10, &9u16.to_le_bytes(), false), "format version");
        expect(&p(12, &64u32.to_le_bytes(), false), "header length");
        expect(
            &p(16, &3000u64.to_le_bytes(), false),
            &format!("{} size", kind.unit),
        );
        expect(&p(32, &(units + 1).to_le_bytes(), false), &unit_count);
        expect(&p(32, &4u64.to_le_bytes(), false), "digest");
        expect(&p(40, &97u64.to_le_bytes(), false), "index offset");
        expect(&p(48, &bad_offset.to_le_bytes(), false), "data offset");
        expect(&p(56, &1u64.to_le_bytes(), false), "reserved");
        expect(&p(64, &[0xff], false), "digest");
        expect(&p(96, &[4], false), "digest");
        // Index problems behind a valid digest.
        expect(&p(104, &3u64.to_le_bytes(), true), "strictly increasing");
        expect(&p(104, &2u64.to_le_bytes(), true), "strictly increasing");
        expect(&p(112, &units.to_le_bytes(), true), "beyond");
        expect(&p(200, &[1], false), "padding");
        expect(&good[..1000], "truncated");
    }
}
