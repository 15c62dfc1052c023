//! The codecs of a layer's files, one module per file, each with its
//! constants and limits: [`diff`] (a diff layer's packed `memory.bin`),
//! [`memory`] (the digest of any `memory.bin`), [`state`] (`state.bin`),
//! [`chunks`] (`disk.chunks`), [`disk_diff`] (a diff layer's `disk.diff`),
//! [`manifest`] (`manifest.json`, which pins
//! every other file) and [`verified`] (`verified.json`, the verified-file
//! cache). They work on bytes in memory and do no I/O; every parser takes
//! untrusted input and returns a [`ParseError`]. The byte layouts are in
//! `FORMAT.md`.
//!
//! This module has what every file shares: the layer's file names, the
//! store format version ([`FormatVersion`]), the limits on RAM geometry,
//! and the 16-byte prelude every binary file starts with (`memory.bin` of
//! a diff, `state.bin`, `disk.chunks`, `disk.diff`): magic (8 bytes), format major and
//! minor (u16 each), header length (u32), little-endian; also the
//! little-endian field readers the parsers share. It imports nothing but
//! `error`, and the codecs build on it. `indexed` has the layout the two
//! diff files share: a header, a sorted index, one slot per entry.

use serde::{Deserialize, Serialize};

pub use crate::error::ParseError;

// The modules in layers, bottom first, as in `lib.rs`: a module imports
// only from this one and from modules of the groups above its own
// (`tests/layering.rs` checks it).

// The layout the two diff files share (header, index, slots).
mod indexed;

// The memory digest, and the binary files.
pub mod chunks;
pub mod diff;
pub mod memory;
pub mod state;

// A diff layer's disk, in the chunks of `disk.chunks`.
pub mod disk_diff;

// `manifest.json`, which pins every other file of a layer; `verified.json`,
// the cache of which files were verified when.
pub mod manifest;
pub mod verified;

/// File name of a layer's manifest.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of a layer's memory (full RAM image or packed diff).
pub const MEMORY_FILE: &str = "memory.bin";
/// File name of a layer's machine state.
pub const STATE_FILE: &str = "state.bin";
/// File name of a layer's disk image clone.
pub const DISK_FILE: &str = "disk.img";
/// File name of a diff layer's disk as the chunks written since its parent
/// (in place of `disk.img`; format 3.1).
pub const DISK_DIFF_FILE: &str = "disk.diff";
/// File name of a layer's disk chunk digests (present with `disk.img` or
/// `disk.diff`).
pub const DISK_CHUNKS_FILE: &str = "disk.chunks";
/// Every file a layer may hold, in the order they are listed and checked
/// (the disk's only if the VM had a disk: `disk.img` or `disk.diff`, and
/// `disk.chunks`).
pub const LAYER_FILES: [&str; 6] = [
    MANIFEST_FILE,
    MEMORY_FILE,
    STATE_FILE,
    DISK_FILE,
    DISK_DIFF_FILE,
    DISK_CHUNKS_FILE,
];

/// A store format version. All store files (manifest, diff memory, state,
/// disk chunk list) carry one.
///
/// Compatibility rule (Firecracker's): a reader accepts a file whose major
/// equals its own and whose minor is not newer than its own. Minor versions
/// only add; a major bump breaks.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FormatVersion {
    /// Incompatible revisions.
    pub major: u16,
    /// Backward-compatible additions.
    pub minor: u16,
}

/// The format version this crate writes and the newest it reads.
pub const FORMAT_VERSION: FormatVersion = FormatVersion { major: 3, minor: 1 };

impl FormatVersion {
    /// Check that this reader can read a file of version `self`.
    pub fn check_readable(self) -> Result<(), ParseError> {
        let ours = FORMAT_VERSION;
        if self.major != ours.major || self.minor > ours.minor {
            return Err(ParseError::new(format!(
                "format version {self} is not readable by this build (reads {}.0 to {ours})",
                ours.major
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Smallest supported page size, in bytes.
pub const MIN_PAGE_SIZE: u64 = 4096;
/// Largest supported page size, in bytes.
pub const MAX_PAGE_SIZE: u64 = 64 * 1024;
/// Largest supported guest RAM, in bytes (1 TiB).
pub const MAX_RAM_SIZE: u64 = 1 << 40;

/// Check page size, RAM base and RAM size (bytes) against the limits.
pub(crate) fn check_geometry(page_size: u64, base: u64, size: u64) -> Result<(), ParseError> {
    if !page_size.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        return Err(ParseError::new(format!(
            "page size {page_size} is not a power of two in {MIN_PAGE_SIZE}..={MAX_PAGE_SIZE}"
        )));
    }
    if size == 0 || size > MAX_RAM_SIZE || size % page_size != 0 {
        return Err(ParseError::new(format!(
            "RAM size {size} is not a non-zero multiple of the page size {page_size} up to {MAX_RAM_SIZE}"
        )));
    }
    if base % page_size != 0 || base.checked_add(size).is_none() {
        return Err(ParseError::new(format!(
            "RAM base {base:#x} is not page-aligned or RAM wraps the address space"
        )));
    }
    Ok(())
}

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
