//! `state.bin`: the VMM's opaque machine state in a bounded, checksummed
//! envelope.
//!
//! ```text
//! 0   8  magic "IGNSTATE"
//! 8   2  format major      10  2  format minor
//! 12  4  header length = 56
//! 16  8  payload length L (bytes, <= MAX_STATE_BYTES)
//! 24 32  sha256(payload)
//! 56  L  payload
//! ```

use crate::error::{ParseError, Result};
use crate::format::{check_prelude, u64_at, FormatVersion, FORMAT_VERSION};
use crate::hash::sha256;

/// Magic bytes at offset 0 of `state.bin`.
pub const STATE_MAGIC: [u8; 8] = *b"IGNSTATE";
/// Length of the `state.bin` header, in bytes.
pub const STATE_HEADER_LEN: usize = 56;
/// Largest accepted state payload, in bytes (64 MiB).
pub const MAX_STATE_BYTES: u64 = 64 << 20;

/// The decoded `state.bin` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateHeader {
    /// Format version of the file.
    pub version: FormatVersion,
    /// Payload length in bytes.
    pub payload_len: u64,
    /// sha256 of the payload.
    pub payload_sha256: [u8; 32],
}

/// Parse and bound-check the 56-byte header at the start of `bytes`
/// (untrusted). The payload is not looked at.
pub fn parse_state_header(bytes: &[u8]) -> Result<StateHeader, ParseError> {
    let version = check_prelude(bytes, &STATE_MAGIC, STATE_HEADER_LEN, "a state file")?;
    let payload_len = u64_at(bytes, 16);
    if payload_len > MAX_STATE_BYTES {
        return Err(ParseError::new(format!(
            "payload length {payload_len} exceeds the {MAX_STATE_BYTES}-byte limit"
        )));
    }
    let mut payload_sha256 = [0u8; 32];
    payload_sha256.copy_from_slice(&bytes[24..56]);
    Ok(StateHeader {
        version,
        payload_len,
        payload_sha256,
    })
}

/// Parse a whole `state.bin` held in memory (untrusted) and return the
/// payload: header checks, exact length, payload digest.
pub fn parse_state(bytes: &[u8]) -> Result<&[u8], ParseError> {
    let h = parse_state_header(bytes)?;
    let payload = &bytes[STATE_HEADER_LEN..];
    if payload.len() as u64 != h.payload_len {
        return Err(ParseError::new(format!(
            "payload is {} bytes, header says {}",
            payload.len(),
            h.payload_len
        )));
    }
    if sha256(payload) != h.payload_sha256 {
        return Err(ParseError::new(
            "payload digest mismatch: state is corrupted",
        ));
    }
    Ok(payload)
}

/// The `state.bin` header for `payload`. Errors if it exceeds
/// [`MAX_STATE_BYTES`].
pub fn encode_state_header(payload: &[u8]) -> Result<[u8; STATE_HEADER_LEN], ParseError> {
    if payload.len() as u64 > MAX_STATE_BYTES {
        return Err(ParseError::new(format!(
            "state of {} bytes exceeds the {MAX_STATE_BYTES}-byte limit",
            payload.len()
        )));
    }
    let mut h = [0u8; STATE_HEADER_LEN];
    h[..8].copy_from_slice(&STATE_MAGIC);
    h[8..10].copy_from_slice(&FORMAT_VERSION.major.to_le_bytes());
    h[10..12].copy_from_slice(&FORMAT_VERSION.minor.to_le_bytes());
    h[12..16].copy_from_slice(&(STATE_HEADER_LEN as u32).to_le_bytes());
    h[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[24..56].copy_from_slice(&sha256(payload));
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(payload: &[u8]) -> Vec<u8> {
        let mut b = encode_state_header(payload).unwrap().to_vec();
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn round_trip() {
        for p in [&b""[..], b"x", &[7u8; 5000]] {
            assert_eq!(parse_state(&file(p)).unwrap(), p);
        }
    }

    fn expect(b: &[u8], needle: &str) {
        let e = parse_state(b).unwrap_err().0;
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }

    #[test]
    fn rejects_malformed() {
        let good = file(b"vcpu state");
        expect(&good[..55], "truncated");
        let mut b = good.clone();
        b[3] ^= 1;
        expect(&b, "bad magic");
        let mut b = good.clone();
        b[8] = 1;
        expect(&b, "format version");
        let mut b = good.clone();
        b[12] = 64;
        expect(&b, "header length");
        let mut b = good.clone();
        b[16..24].copy_from_slice(&(MAX_STATE_BYTES + 1).to_le_bytes());
        expect(&b, "limit");
        let mut b = good.clone();
        b[16] += 1;
        expect(&b, "header says");
        let mut b = good.clone();
        b.push(0);
        expect(&b, "header says");
        let mut b = good.clone();
        *b.last_mut().unwrap() ^= 0x40;
        expect(&b, "digest");
        let mut b = good.clone();
        b[30] ^= 1;
        expect(&b, "digest");
    }

    #[test]
    fn oversized_payload_refused() {
        let big = vec![0u8; MAX_STATE_BYTES as usize + 1];
        assert!(encode_state_header(&big).is_err());
    }
}
