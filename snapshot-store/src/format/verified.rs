//! `verified.json`, a layer's verified-file cache (FORMAT.md,
//! "verified.json: verified-file cache"): for each file of the layer, the
//! identity stamp it had when its sha256 was last verified or written, and
//! that sha256. Not part of the layer (no manifest lists it). What a stamp
//! proves, and when one may be recorded, is the store's `cache` module.

use std::collections::BTreeMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use crate::error::ParseError;
use crate::format::LAYER_FILES;
use crate::hash::is_sha256_hex;

/// File name of a layer's verified-file cache (not part of the layer; see
/// `FORMAT.md`).
pub const VERIFIED_FILE: &str = "verified.json";
/// Largest `verified.json` that is read (bytes); larger ones are ignored.
pub const MAX_VERIFIED_BYTES: u64 = 64 << 10;
/// Version of the `verified.json` layout. A cache with another version is
/// ignored (and replaced when the layer is next verified).
pub const VERIFIED_FORMAT: u32 = 1;
/// Prefix of the temporary file a new `verified.json` is written to before
/// it is renamed into place: `.verified.json.tmp-PID-NONCE`.
pub(crate) const VERIFIED_TMP_PREFIX: &str = ".verified.json.tmp-";

/// The identity and change times of a file: `(st_dev, st_ino, st_size,
/// st_mtime, st_ctime)`, times in nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stamp {
    /// The stamp of `m` (from `lstat` or `fstat`).
    pub(crate) fn of(m: &Metadata) -> Stamp {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

/// One file's entry in `verified.json`: its stamp and the sha256 it had
/// when it was verified (lower-case hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheEntry {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sha256: String,
}

impl CacheEntry {
    pub(crate) fn new(s: Stamp, sha256: &str) -> CacheEntry {
        CacheEntry {
            dev: s.dev,
            ino: s.ino,
            size: s.size,
            mtime_ns: s.mtime_ns,
            ctime_ns: s.ctime_ns,
            sha256: sha256.to_string(),
        }
    }

    /// The sha256 recorded for the file, lower-case hex.
    pub(crate) fn sha256(&self) -> &str {
        &self.sha256
    }

    pub(crate) fn stamp(&self) -> Stamp {
        Stamp {
            dev: self.dev,
            ino: self.ino,
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
        }
    }
}

/// The whole file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    format: u32,
    files: BTreeMap<String, CacheEntry>,
}

/// File name -> entry.
pub(crate) type Entries = BTreeMap<String, CacheEntry>;

/// Check the contents of a `verified.json` as a verification reads them
/// (at most [`MAX_VERIFIED_BYTES`], `format` [`VERIFIED_FORMAT`], known
/// fields and file names only, hex digests); returns the number of
/// entries. Whether an entry is then used depends on the files' current
/// stamps and the manifest. For fuzzing and tools.
pub fn parse_verified(bytes: &[u8]) -> Result<usize, ParseError> {
    if bytes.len() as u64 > MAX_VERIFIED_BYTES {
        return Err(ParseError(format!(
            "larger than the {MAX_VERIFIED_BYTES}-byte limit"
        )));
    }
    parse(bytes).map(|e| e.len())
}

/// Parse and check the contents of a `verified.json`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Entries, ParseError> {
    let c: CacheFile =
        serde_json::from_slice(bytes).map_err(|e| ParseError::new(format!("malformed: {e}")))?;
    if c.format != VERIFIED_FORMAT {
        return Err(ParseError::new(format!(
            "cache format {} is not {VERIFIED_FORMAT}",
            c.format
        )));
    }
    for (name, e) in &c.files {
        if !LAYER_FILES.contains(&name.as_str()) {
            return Err(ParseError::new(format!("entry for unknown file {name:?}")));
        }
        if !is_sha256_hex(&e.sha256) {
            return Err(ParseError::new(format!(
                "entry for {name}: sha256 is not 64 lower-case hex digits"
            )));
        }
    }
    Ok(c.files)
}

/// The bytes of a `verified.json` holding `entries`: pretty JSON and `\n`.
pub(crate) fn encode(entries: &Entries) -> Vec<u8> {
    let c = CacheFile {
        format: VERIFIED_FORMAT,
        files: entries.clone(),
    };
    // Serializing plain structs of strings and integers cannot fail.
    let mut bytes = serde_json::to_vec_pretty(&c).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{MEMORY_FILE, STATE_FILE};

    fn entries() -> Entries {
        let s = Stamp {
            dev: u64::MAX,
            ino: 7,
            size: 1 << 40,
            mtime_ns: -5,
            ctime_ns: i128::from(i64::MAX) * 1_000_000_000 + 999_999_999,
        };
        let mut e = Entries::new();
        e.insert(MEMORY_FILE.into(), CacheEntry::new(s, &"ab".repeat(32)));
        e.insert(STATE_FILE.into(), CacheEntry::new(s, &"cd".repeat(32)));
        e
    }

    #[test]
    fn round_trip() {
        let e = entries();
        let bytes = encode(&e);
        assert_eq!(parse(&bytes).unwrap(), e);
        assert_eq!(parse_verified(&bytes), Ok(2));
        assert_eq!(e[MEMORY_FILE].stamp().ino, 7);
        assert_eq!(e[STATE_FILE].sha256(), "cd".repeat(32));
    }

    #[test]
    fn rejects_what_a_verification_would_ignore() {
        let good = String::from_utf8(encode(&entries())).unwrap();
        for (bad, why) in [
            (String::new(), "malformed"),
            (good.replace("\"format\": 1", "\"format\": 2"), "format 2"),
            (good.replace(MEMORY_FILE, "other.bin"), "unknown file"),
            (good.replace(&"ab".repeat(32), &"AB".repeat(32)), "hex"),
            (good.replacen("\"ino\": 7", "\"ino\": -7", 1), "malformed"),
            (
                format!("{good}{}", " ".repeat(MAX_VERIFIED_BYTES as usize)),
                "limit",
            ),
        ] {
            let e = parse_verified(bad.as_bytes()).unwrap_err().0;
            assert!(e.contains(why), "{why}: {e}");
        }
        assert!(parse_verified(b"{}").is_err());
    }
}
