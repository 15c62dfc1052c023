//! QEMU's stream netdev framing, as `passt` and `socket_vmnet` speak it on a
//! Unix stream socket: each Ethernet frame is preceded by its length as a
//! 4-byte big-endian integer.

use super::MAX_FRAME_LEN;

/// Appends `frame`, framed, to `out`.
pub fn encode_into(out: &mut Vec<u8>, frame: &[u8]) {
    out.extend_from_slice(&(frame.len() as u32).to_be_bytes());
    out.extend_from_slice(frame);
}

/// Splits a byte stream into frames. A frame longer than
/// [`MAX_FRAME_LEN`] is skipped (its bytes are consumed, so the stream
/// stays in step) and counted; memory stays bounded by one frame.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    buf: Vec<u8>,
    /// Bytes of an oversized frame still to skip.
    skip: usize,
    /// Oversized frames skipped.
    pub skipped: u64,
}

impl StreamDecoder {
    /// Feeds bytes read from the socket; calls `frame` for each complete
    /// frame, in order.
    pub fn push(&mut self, mut bytes: &[u8], mut frame: impl FnMut(&[u8])) {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                if self.skip > 0 {
                    return;
                }
            }
            if bytes.is_empty() {
                return;
            }
            // Take what completes the length or the frame; keep the rest.
            let need = match self.buf.len() {
                n if n < 4 => 4 - n,
                _ => 4 + self.len() - self.buf.len(),
            };
            let n = need.min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == 4 && self.len() > MAX_FRAME_LEN {
                self.skip = self.len();
                self.skipped += 1;
                self.buf.clear();
            } else if self.buf.len() >= 4 && self.buf.len() == 4 + self.len() {
                frame(&self.buf[4..]);
                self.buf.clear();
            }
        }
    }

    /// The length field of the frame being read (`buf` holds it).
    fn len(&self) -> usize {
        u32::from_be_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(d: &mut StreamDecoder, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        d.push(bytes, |f| out.push(f.to_vec()));
        out
    }

    #[test]
    fn frames_survive_any_split() {
        let frames: Vec<Vec<u8>> = [60usize, 1514, 1, 0, 300]
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8 + 1; n])
            .collect();
        let mut wire = Vec::new();
        for f in &frames {
            encode_into(&mut wire, f);
        }
        for piece in [1, 2, 3, 5, 7, 64, 4096] {
            let mut d = StreamDecoder::default();
            let got: Vec<Vec<u8>> = wire
                .chunks(piece)
                .flat_map(|c| frames_of(&mut d, c))
                .collect();
            assert_eq!(got, frames, "pieces of {piece}");
        }
    }

    #[test]
    fn oversized_frames_are_skipped_in_step() {
        let mut wire = Vec::new();
        let big = vec![7u8; MAX_FRAME_LEN + 1];
        encode_into(&mut wire, &big);
        encode_into(&mut wire, &[1, 2, 3]);
        let mut d = StreamDecoder::default();
        let got: Vec<Vec<u8>> = wire
            .chunks(1000)
            .flat_map(|c| frames_of(&mut d, c))
            .collect();
        assert_eq!(got, [vec![1, 2, 3]]);
        assert_eq!(d.skipped, 1);
        // A length claiming 4 GiB costs nothing: nothing is buffered.
        let mut d = StreamDecoder::default();
        assert!(frames_of(&mut d, &u32::MAX.to_be_bytes()).is_empty());
        assert!(frames_of(&mut d, &[0u8; 1 << 16]).is_empty());
        assert!(d.buf.capacity() < 64);
    }
}
