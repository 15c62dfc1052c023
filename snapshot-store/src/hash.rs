//! sha256 helpers and hex encoding.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
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
/// read from its current offset with a bounded buffer; it must be exactly
/// `expected_len` bytes long.
pub(crate) fn sha256_open_file(
    mut file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
) -> Result<Sha256Digest> {
    let mut hasher = Sha256::new();
    let chunk = usize::try_from(expected_len.clamp(1, READ_CHUNK as u64)).unwrap_or(READ_CHUNK);
    let mut buf = vec![0u8; chunk];
    let mut done: u64 = 0;
    let report = progress.filter(|_| expected_len >= PROGRESS_MIN_BYTES);
    let mut next_report = PROGRESS_STEP_BYTES;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, "read", e)),
        };
        hasher.update(&buf[..n]);
        done += n as u64;
        if done > expected_len {
            break;
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
    if done != expected_len {
        return Err(Error::corrupt(
            path,
            format!("changed size while being hashed (expected {expected_len} bytes)"),
        ));
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
}
