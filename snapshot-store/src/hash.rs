//! sha256 helpers and hex encoding.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fsutil::data_regions;
use crate::progress::Progress;

/// A sha256 digest (32 bytes).
pub type Sha256Digest = [u8; 32];

/// Files at least this large (bytes) report hashing progress.
pub const PROGRESS_MIN_BYTES: u64 = 64 << 20;
/// Interval between hashing progress reports (bytes).
pub const PROGRESS_STEP_BYTES: u64 = 256 << 20;

/// Read buffer per hashing thread: memory stays bounded (threads x 1 MiB)
/// and the buffer stays in cache between the read and the hash.
const READ_CHUNK: usize = 1 << 20;

/// sha256 of a byte slice.
pub fn sha256(bytes: &[u8]) -> Sha256Digest {
    Sha256::digest(bytes).into()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// `true` if `s` is 64 lower-case hex digits (a sha256 in manifest form).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// sha256 of the whole of the open file `file` (named `path` in errors),
/// which must be exactly `expected_len` bytes long, read with a bounded
/// buffer. Holes (`SEEK_DATA`/`SEEK_HOLE`) are hashed as the zeros they
/// read as without being read: a sparse memory image costs the hashing of
/// its size, not the reading of it.
pub(crate) fn sha256_open_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
) -> Result<Sha256Digest> {
    let size = |f: &File| {
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(path, "stat", e))
    };
    let changed = || {
        Error::corrupt(
            path,
            format!("changed size while being hashed (expected {expected_len} bytes)"),
        )
    };
    if size(file)? != expected_len {
        return Err(changed());
    }
    let mut hasher = Sha256::new();
    let chunk = usize::try_from(expected_len.clamp(1, READ_CHUNK as u64)).unwrap_or(READ_CHUNK);
    let mut buf = vec![0u8; chunk];
    let zeros = vec![0u8; chunk];
    let report = progress.filter(|_| expected_len >= PROGRESS_MIN_BYTES);
    let mut next_report = PROGRESS_STEP_BYTES;
    let mut done: u64 = 0;
    let regions = data_regions(file, path, expected_len)?;
    let mut regions = regions.iter().peekable();
    while done < expected_len {
        // Up to the next boundary between data and hole.
        let (data, end) = match regions.peek() {
            Some(r) if r.start <= done => (true, r.end),
            Some(r) => (false, r.start),
            None => (false, expected_len),
        };
        let n = usize::try_from((end - done).min(chunk as u64)).unwrap_or(chunk);
        if data {
            file.read_exact_at(&mut buf[..n], done).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    changed()
                } else {
                    Error::io(path, "read", e)
                }
            })?;
            hasher.update(&buf[..n]);
        } else {
            hasher.update(&zeros[..n]);
        }
        done += n as u64;
        if done >= end && data {
            regions.next();
        }
        if let Some(p) = report {
            if done >= next_report && done < expected_len {
                p(Progress::Hashing {
                    path,
                    done,
                    total: expected_len,
                });
                next_report += PROGRESS_STEP_BYTES;
            }
        }
    }
    if size(file)? != expected_len {
        return Err(changed());
    }
    if let Some(p) = report {
        p(Progress::Hashing {
            path,
            done,
            total: expected_len,
        });
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest() {
        // FIPS 180-2 example "abc".
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(is_sha256_hex(&hex(&sha256(b""))));
        assert!(!is_sha256_hex(&hex(&sha256(b"")).to_uppercase()));
        assert!(!is_sha256_hex("00"));
    }

    #[test]
    fn file_digest_and_length_check() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let f = |len| sha256_open_file(&File::open(&p).unwrap(), &p, len, None);
        assert_eq!(f(3).unwrap(), sha256(b"abc"));
        let e = f(4).unwrap_err().to_string();
        assert!(e.contains("changed size"), "{e}");
        let e = f(2).unwrap_err().to_string();
        assert!(e.contains("changed size"), "{e}");
    }

    #[test]
    fn holes_hash_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sparse");
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let len = 5 * READ_CHUNK as u64 + 123;
        file.set_len(len).unwrap();
        file.write_all_at(b"data in the middle", 2 * READ_CHUNK as u64 + 7)
            .unwrap();
        file.write_all_at(b"and at the end", len - 14).unwrap();
        let whole = std::fs::read(&p).unwrap();
        assert_eq!(
            sha256_open_file(&file, &p, len, None).unwrap(),
            sha256(&whole)
        );
    }
}
