//! QEMU's stream netdev framing, as `passt` and `socket_vmnet` speak it on a
//! Unix stream socket: each Ethernet frame is preceded by its length as a
//! 4-byte big-endian integer.

use super::backend::{FrameSource, NetBackend, ReadOutcome};
use super::{MAX_FRAME_LEN, MIN_FRAME_LEN};
use crate::devices::virtio::host_io::Waker;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 << 10;

/// The receive side of a stream host end: the socket (non-blocking) and
/// the frame being reassembled.
pub struct StreamSource {
    sock: UnixStream,
    decoder: StreamDecoder,
    buf: Vec<u8>,
}

impl StreamSource {
    /// Reads frames from `sock` (the second handle [`StreamEnd::connect`]
    /// returned).
    pub fn new(sock: UnixStream) -> Self {
        StreamSource {
            sock,
            decoder: StreamDecoder::default(),
            buf: vec![0u8; READ_CHUNK],
        }
    }
}

impl FrameSource for StreamSource {
    fn max_frames_per_read(&self) -> usize {
        READ_CHUNK / (4 + MIN_FRAME_LEN)
    }

    fn read_frames(&mut self, frame: &mut dyn FnMut(&[u8])) -> io::Result<ReadOutcome> {
        loop {
            return match self.sock.read(&mut self.buf) {
                Ok(0) => Ok(ReadOutcome::Closed),
                Ok(n) => {
                    self.decoder.push(&self.buf[..n], &mut *frame);
                    Ok(ReadOutcome::Data)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(ReadOutcome::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }
}

/// Bytes buffered for a host end that is not reading, at most: a frame that
/// would go past this is refused (`WouldBlock`), and the device waits.
pub const OUT_LIMIT: usize = 1 << 20;

/// The transmit side of a stream host end: a connected, non-blocking Unix
/// stream socket and the bytes it has not taken yet.
pub struct StreamEnd {
    sock: UnixStream,
    out: Vec<u8>,
    /// Told when bytes stay buffered, so that the host I/O thread waits
    /// for the socket to take them.
    waker: Option<Waker>,
}

impl StreamEnd {
    /// Connects to the stream socket at `path`; returns the end and a
    /// second handle of the socket, for the thread that receives.
    pub fn connect(path: &Path) -> io::Result<(Self, UnixStream)> {
        Self::new(UnixStream::connect(path)?)
    }

    /// The end on the connected socket `sock` (made non-blocking); returns
    /// it and a second handle of the socket, for the thread that receives.
    pub fn new(sock: UnixStream) -> io::Result<(Self, UnixStream)> {
        sock.set_nonblocking(true)?;
        let rx = sock.try_clone()?;
        Ok((
            StreamEnd {
                sock,
                out: Vec::new(),
                waker: None,
            },
            rx,
        ))
    }
}

impl NetBackend for StreamEnd {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if self.out.len() + 4 + frame.len() > OUT_LIMIT {
            self.flush()?;
            if self.out.len() + 4 + frame.len() > OUT_LIMIT {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the host end is not taking frames",
                ));
            }
        }
        encode_into(&mut self.out, frame);
        self.flush()?;
        if !self.out.is_empty() {
            if let Some(w) = &self.waker {
                w.wake();
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut done = 0;
        let r = loop {
            if done == self.out.len() {
                break Ok(());
            }
            match self.sock.write(&self.out[done..]) {
                Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.out.drain(..done);
        r
    }

    fn pending(&self) -> bool {
        !self.out.is_empty()
    }

    fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
    }
}

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
    fn the_stream_end_frames_what_it_sends_and_bounds_what_it_keeps() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (mut end, _rx) = StreamEnd::connect(&path).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        end.send(&[1, 2, 3]).unwrap();
        let mut got = [0u8; 7];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(got, [0, 0, 0, 3, 1, 2, 3]);
        // A peer that does not read: bytes pile up to the limit, then
        // frames are refused (dropped by the device), never blocking.
        let frame = vec![9u8; 60_000];
        let mut refused = 0;
        for _ in 0..200 {
            if end.send(&frame).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 0 && end.pending());
        assert!(end.out.len() <= OUT_LIMIT);
        // Once the peer reads, flush sends what was kept, in order.
        peer.set_nonblocking(true).unwrap();
        let mut d = StreamDecoder::default();
        let mut n = 0;
        let mut buf = vec![0u8; 1 << 16];
        for _ in 0..10_000 {
            end.flush().unwrap();
            match peer.read(&mut buf) {
                Ok(k) => d.push(&buf[..k], |f| {
                    assert_eq!(f, &frame[..]);
                    n += 1;
                }),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !end.pending() {
                        break;
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(!end.pending());
        assert_eq!(n, 200 - refused);
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
