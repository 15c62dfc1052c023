//! The 16-byte prelude every binary file of a layer starts with (`memory.bin`
//! of a diff, `state.bin`, `disk.chunks`; FORMAT.md): magic (8 bytes),
//! format major and minor (u16 each), header length (u32), little-endian.
//! Also the little-endian field readers the parsers share.

use crate::error::ParseError;
use crate::manifest::FormatVersion;

/// The little-endian u16 at `b[at..at + 2]` (the caller checked the length).
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian u32 at `b[at..at + 4]` (the caller checked the length).
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The little-endian u64 at `b[at..at + 8]` (the caller checked the length).
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Checks the prelude of an untrusted header: at least `header_len` bytes,
/// `magic`, a readable format version, and the header length field equal
/// to `header_len`. `what` names the file kind in errors ("a state file").
/// Returns the version.
pub(crate) fn check_prelude(
    bytes: &[u8],
    magic: &[u8; 8],
    header_len: usize,
    what: &str,
) -> Result<FormatVersion, ParseError> {
    if bytes.len() < header_len {
        return Err(ParseError(format!(
            "truncated header of {what}: {} bytes, need {header_len}",
            bytes.len()
        )));
    }
    if bytes[..8] != magic[..] {
        return Err(ParseError(format!("bad magic: not {what}")));
    }
    let version = FormatVersion {
        major: u16_at(bytes, 8),
        minor: u16_at(bytes, 10),
    };
    version.check_readable()?;
    let len = u32_at(bytes, 12);
    if len as usize != header_len {
        return Err(ParseError(format!(
            "header length {len}, expected {header_len}"
        )));
    }
    Ok(version)
}
