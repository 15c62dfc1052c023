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

/// Chunk size of a memory file's digest, in bytes (256 KiB).
pub const MEMORY_CHUNK_SIZE: u64 = 256 << 10;

/// The digest of a `memory.bin` (FORMAT.md, "Memory digest"): the sha256 of
/// the concatenated sha256 digests of its [`MEMORY_CHUNK_SIZE`]-byte chunks,
/// the last one possibly shorter. Chunks of zeros cost a scan, not a hash
/// (their digest is computed once), and chunks in holes of a file are not
/// read at all ([`memory_digest_file`]), so the cost follows the data.
pub struct MemoryDigest {
    outer: Sha256,
    chunk: Sha256,
    /// Bytes of the current chunk fed so far (< [`MEMORY_CHUNK_SIZE`]).
    filled: u64,
}

/// sha256 of one whole chunk of zeros.
fn zero_chunk_digest() -> &'static Sha256Digest {
    static ZERO: std::sync::OnceLock<Sha256Digest> = std::sync::OnceLock::new();
    ZERO.get_or_init(|| sha256(&[0u8; MEMORY_CHUNK_SIZE as usize]))
}

impl Default for MemoryDigest {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryDigest {
    /// A digest of no bytes yet.
    pub fn new() -> Self {
        MemoryDigest {
            outer: Sha256::new(),
            chunk: Sha256::new(),
            filled: 0,
        }
    }

    /// Feeds the next `bytes` of the file.
    pub fn update(&mut self, mut bytes: &[u8]) {
        const C: u64 = MEMORY_CHUNK_SIZE;
        while !bytes.is_empty() {
            let take = (C - self.filled).min(bytes.len() as u64) as usize;
            let (now, rest) = bytes.split_at(take);
            if self.filled == 0 && take as u64 == C && now.iter().all(|&b| b == 0) {
                self.outer.update(zero_chunk_digest());
            } else {
                self.chunk.update(now);
                self.filled += take as u64;
                if self.filled == C {
                    self.outer.update(self.chunk.finalize_reset());
                    self.filled = 0;
                }
            }
            bytes = rest;
        }
    }

    /// Feeds `n` zero bytes (a hole), whole chunks without hashing.
    pub fn zeros(&mut self, mut n: u64) {
        const C: u64 = MEMORY_CHUNK_SIZE;
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while n > 0 {
            if self.filled == 0 && n >= C {
                self.outer.update(zero_chunk_digest());
                n -= C;
            } else {
                let take = (C - self.filled).min(n).min(ZEROS.len() as u64);
                self.update(&ZEROS[..take as usize]);
                n -= take;
            }
        }
    }

    /// The digest of everything fed.
    pub fn finish(mut self) -> Sha256Digest {
        if self.filled > 0 {
            self.outer.update(self.chunk.finalize());
        }
        self.outer.finalize().into()
    }
}

/// [`MemoryDigest`] of a byte slice.
pub fn memory_digest(bytes: &[u8]) -> Sha256Digest {
    let mut d = MemoryDigest::new();
    d.update(bytes);
    d.finish()
}

/// What a file is hashed with: fed its data, and its holes' lengths.
trait Feed {
    fn data(&mut self, bytes: &[u8]);
    fn hole(&mut self, n: u64);
}

/// sha256 of the bytes, holes hashed as the zeros they read as.
struct PlainFeed {
    hasher: Sha256,
    zeros: Vec<u8>,
}

impl Feed for PlainFeed {
    fn data(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }
    fn hole(&mut self, mut n: u64) {
        while n > 0 {
            let take = n.min(self.zeros.len() as u64) as usize;
            self.hasher.update(&self.zeros[..take]);
            n -= take as u64;
        }
    }
}

impl Feed for MemoryDigest {
    fn data(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
    fn hole(&mut self, n: u64) {
        self.zeros(n);
    }
}

/// sha256 of the whole of the open file `file` (named `path` in errors),
/// which must be exactly `expected_len` bytes long, read with a bounded
/// buffer. Holes (`SEEK_DATA`/`SEEK_HOLE`) are hashed as the zeros they
/// read as without being read.
pub(crate) fn sha256_open_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
) -> Result<Sha256Digest> {
    let mut feed = PlainFeed {
        hasher: Sha256::new(),
        zeros: vec![0u8; READ_CHUNK],
    };
    read_open_file(file, path, expected_len, progress, &mut feed)?;
    Ok(feed.hasher.finalize().into())
}

/// [`MemoryDigest`] of the open file `file` (named `path` in errors), which
/// must be exactly `expected_len` bytes long; its holes are not read.
pub(crate) fn memory_digest_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
) -> Result<Sha256Digest> {
    let mut feed = MemoryDigest::new();
    read_open_file(file, path, expected_len, progress, &mut feed)?;
    Ok(feed.finish())
}

/// Feeds the `expected_len` bytes of `file` to `feed` in order, data read
/// with a bounded buffer and holes by length; errors if the file's length
/// is not `expected_len` before or after.
fn read_open_file(
    file: &File,
    path: &Path,
    expected_len: u64,
    progress: Option<&(dyn Fn(Progress<'_>) + Sync)>,
    feed: &mut dyn Feed,
) -> Result<()> {
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
    let chunk = usize::try_from(expected_len.clamp(1, READ_CHUNK as u64)).unwrap_or(READ_CHUNK);
    let mut buf = vec![0u8; chunk];
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
        let n = if data {
            let n = usize::try_from((end - done).min(chunk as u64)).unwrap_or(chunk);
            file.read_exact_at(&mut buf[..n], done).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    changed()
                } else {
                    Error::io(path, "read", e)
                }
            })?;
            feed.data(&buf[..n]);
            n as u64
        } else {
            feed.hole(end - done);
            end - done
        };
        done += n;
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
                while next_report <= done {
                    next_report += PROGRESS_STEP_BYTES;
                }
            }
        }
    }
    if size(file)? != expected_len {
        return Err(changed());
    }
    if let Some(p) = report {
        p(Progress::Hashing {
            path,
            done: expected_len,
            total: expected_len,
        });
    }
    Ok(())
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

    /// The definition, computed the plain way.
    fn memory_digest_by_definition(bytes: &[u8]) -> Sha256Digest {
        let mut outer = Sha256::new();
        for c in bytes.chunks(MEMORY_CHUNK_SIZE as usize) {
            outer.update(sha256(c));
        }
        outer.finalize().into()
    }

    #[test]
    fn memory_digest_follows_its_definition() {
        const C: usize = MEMORY_CHUNK_SIZE as usize;
        let mut bytes = vec![0u8; 5 * C + 1000];
        bytes[C + 5] = 1;
        bytes[4 * C - 1] = 2;
        bytes[5 * C + 999] = 3;
        let want = memory_digest_by_definition(&bytes);
        assert_eq!(memory_digest(&bytes), want);
        // Fed in odd pieces, and with holes fed by length.
        let mut d = MemoryDigest::new();
        for piece in bytes.chunks(C / 3 + 7) {
            d.update(piece);
        }
        assert_eq!(d.finish(), want);
        let mut d = MemoryDigest::new();
        d.update(&bytes[..C + 100]);
        d.zeros((3 * C - 101) as u64);
        d.update(&bytes[4 * C - 1..]);
        assert_eq!(d.finish(), want);
        assert_eq!(memory_digest(&[]), memory_digest_by_definition(&[]));
        assert_ne!(memory_digest(&bytes), sha256(&bytes));
        // A file with holes, the same.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m");
        let f = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(bytes.len() as u64).unwrap();
        for (at, b) in [(C + 5, 1u8), (4 * C - 1, 2), (5 * C + 999, 3)] {
            f.write_all_at(&[b], at as u64).unwrap();
        }
        assert_eq!(
            memory_digest_file(&f, &p, bytes.len() as u64, None).unwrap(),
            want
        );
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
