//! The digest of a layer's `memory.bin` (FORMAT.md, "Memory digest"):
//! sha256 over the sha256 digests of its fixed-size chunks, so that chunks
//! of zeros and holes cost a scan or nothing instead of a hash.

use sha2::{Digest, Sha256};

use crate::hash::{sha256, Sha256Digest};

/// Chunk size of a memory file's digest, in bytes (256 KiB).
pub const MEMORY_CHUNK_SIZE: u64 = 256 << 10;

/// The digest of a `memory.bin` (FORMAT.md, "Memory digest"): the sha256 of
/// the concatenated sha256 digests of its [`MEMORY_CHUNK_SIZE`]-byte chunks,
/// the last one possibly shorter. Chunks of zeros cost a scan, not a hash
/// (their digest is computed once), and chunks in holes of a file are not
/// read at all (the store feeds their length to [`MemoryDigest::zeros`]),
/// so the cost follows the data.
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
