//! Blob bytes to and from files: a file read as a stream of chunks (push),
//! a file compressed into a zstd blob (push `--compress zstd`), and a blob
//! received into a layer file, hashed as it arrives, decompressed if it is
//! a zstd frame, written with its zero blocks left as holes (pull).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;
use sha2::{Digest, Sha256};

use crate::hash::hex;

use super::layout::Compression;
use super::{io_err, Event, EventFn, RegistryError};

/// Bytes per read of a file being sent, and per progress report.
pub(crate) const CHUNK: usize = 1 << 20;
/// Blocks of zeros this long, at this alignment, are left as holes in
/// received files (the store's readers treat holes and zeros alike).
const HOLE_BLOCK: usize = 4096;
/// zstd compression level of `--compress zstd` (zstd's default).
pub(crate) const ZSTD_LEVEL: i32 = 3;

/// Who a transfer belongs to, for progress events.
#[derive(Clone)]
pub(crate) struct Tag {
    pub layer: Arc<str>,
    pub file: &'static str,
    pub progress: Option<EventFn>,
}

impl Tag {
    pub(crate) fn report(&self, done: u64, total: u64) {
        if let Some(p) = &self.progress {
            p(Event::Bytes {
                layer: &self.layer,
                file: self.file,
                done,
                total,
            });
        }
    }
}

/// The `size` bytes of the file at `path` as a stream of chunks of at most
/// [`CHUNK`] bytes, reporting progress through `tag`. A file that turns
/// out shorter or longer is an error in the stream.
pub(crate) fn file_stream(
    path: PathBuf,
    size: u64,
    tag: Tag,
) -> Result<impl Stream<Item = std::io::Result<Bytes>> + Send + 'static, RegistryError> {
    let f = File::open(&path).map_err(|e| io_err(&path, "open", e))?;
    let state = (f, path, 0u64, tag);
    Ok(futures_util::stream::unfold(
        Some(state),
        move |st| async move {
            let (mut f, path, done, tag) = st?;
            if done == size {
                let mut probe = [0u8; 1];
                return match f.read(&mut probe) {
                    Ok(0) => None,
                    Ok(_) => Some((Err(grew(&path, size)), None)),
                    Err(e) => Some((Err(e), None)),
                };
            }
            let want = (size - done).min(CHUNK as u64) as usize;
            let mut buf = vec![0u8; want];
            let mut got = 0;
            while got < want {
                match f.read(&mut buf[got..]) {
                    Ok(0) => {
                        let e = std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!(
                                "{} ended at byte {}, expected {size}",
                                path.display(),
                                done + got as u64
                            ),
                        );
                        return Some((Err(e), None));
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Some((Err(e), None)),
                }
            }
            let done = done + want as u64;
            tag.report(done, size);
            Some((Ok(Bytes::from(buf)), Some((f, path, done, tag))))
        },
    ))
}

fn grew(path: &Path, size: u64) -> std::io::Error {
    std::io::Error::other(format!(
        "{} grew beyond {size} bytes while being sent",
        path.display()
    ))
}

/// A writer that hashes and counts what passes through.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Compress the file `src` (`size` bytes) into a new file `dst` as one zstd
/// frame with its content size. Returns the blob's sha256 (hex) and size.
pub(crate) fn compress_file(
    src: &Path,
    size: u64,
    dst: &Path,
) -> Result<(String, u64), RegistryError> {
    let mut input = File::open(src).map_err(|e| io_err(src, "open", e))?;
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| io_err(dst, "create", e))?;
    let sink = Hashing {
        inner: std::io::BufWriter::with_capacity(CHUNK, out),
        hasher: Sha256::new(),
        count: 0,
    };
    let mut enc = zstd::stream::write::Encoder::new(sink, ZSTD_LEVEL)
        .map_err(|e| io_err(dst, "start zstd", e))?;
    enc.include_contentsize(true)
        .map_err(|e| io_err(dst, "start zstd", e))?;
    enc.set_pledged_src_size(Some(size))
        .map_err(|e| io_err(dst, "start zstd", e))?;
    let copied = std::io::copy(&mut (&mut input).take(size), &mut enc)
        .map_err(|e| io_err(src, "compress", e))?;
    if copied != size {
        return Err(io_err(
            src,
            "compress",
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{copied} bytes read, expected {size}"),
            ),
        ));
    }
    let mut sink = enc.finish().map_err(|e| io_err(dst, "compress", e))?;
    sink.flush().map_err(|e| io_err(dst, "write", e))?;
    Ok((hex(&sink.hasher.finalize()), sink.count))
}

/// Writes a file sequentially, leaving aligned all-zero blocks of
/// [`HOLE_BLOCK`] bytes as holes; refuses to grow past `limit` bytes.
struct SparseFile {
    file: File,
    path: PathBuf,
    pos: u64,
    pending: Vec<u8>,
    limit: u64,
}

impl SparseFile {
    fn flush_blocks(&mut self, all: bool) -> std::io::Result<()> {
        let keep = if all {
            0
        } else {
            self.pending.len() % HOLE_BLOCK
        };
        let upto = self.pending.len() - keep;
        let mut at = 0;
        while at < upto {
            let end = (at + HOLE_BLOCK).min(upto);
            let zero = self.pending[at..end].iter().all(|&b| b == 0);
            // A run of blocks of the same kind.
            let mut run_end = end;
            while run_end < upto {
                let next = (run_end + HOLE_BLOCK).min(upto);
                if self.pending[run_end..next].iter().all(|&b| b == 0) != zero {
                    break;
                }
                run_end = next;
            }
            if !zero {
                self.file.seek(SeekFrom::Start(self.pos + at as u64))?;
                self.file.write_all(&self.pending[at..run_end])?;
            }
            at = run_end;
        }
        self.pos += upto as u64;
        self.pending.drain(..upto);
        Ok(())
    }

    /// Write what is pending and set the length. Returns the file size.
    fn finish(mut self) -> std::io::Result<u64> {
        self.flush_blocks(true)?;
        self.file.set_len(self.pos)?;
        Ok(self.pos)
    }
}

impl Write for SparseFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pos + (self.pending.len() + buf.len()) as u64 > self.limit {
            return Err(std::io::Error::other(format!(
                "more than the {} bytes the layer's manifest gives {}",
                self.limit,
                self.path.display()
            )));
        }
        self.pending.extend_from_slice(buf);
        if self.pending.len() >= CHUNK {
            self.flush_blocks(false)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Sink {
    Plain(SparseFile),
    Zstd(Box<zstd::stream::write::Decoder<'static, SparseFile>>),
}

/// One blob being received into a layer file.
pub(crate) struct Receiver {
    sink: Sink,
    hasher: Sha256,
    received: u64,
}

/// What [`Receiver::finish`] found.
pub(crate) struct Received {
    /// sha256 of the blob bytes received, hex.
    pub sha256: String,
    /// Blob bytes received.
    pub received: u64,
    /// Bytes of the file written.
    pub file_size: u64,
}

impl Receiver {
    /// Receive into the new file `path`, which may become at most
    /// `file_limit` bytes long.
    pub(crate) fn create(
        path: &Path,
        compression: Compression,
        file_limit: u64,
    ) -> Result<Receiver, RegistryError> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| io_err(path, "create", e))?;
        let sparse = SparseFile {
            file,
            path: path.to_path_buf(),
            pos: 0,
            pending: Vec::with_capacity(2 * CHUNK),
            limit: file_limit,
        };
        let sink = match compression {
            Compression::None => Sink::Plain(sparse),
            Compression::Zstd => Sink::Zstd(Box::new(
                zstd::stream::write::Decoder::new(sparse)
                    .map_err(|e| io_err(path, "start zstd", e))?,
            )),
        };
        Ok(Receiver {
            sink,
            hasher: Sha256::new(),
            received: 0,
        })
    }

    /// Bytes received so far.
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// Take the next bytes of the blob.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hasher.update(bytes);
        self.received += bytes.len() as u64;
        match &mut self.sink {
            Sink::Plain(f) => f.write_all(bytes),
            Sink::Zstd(d) => d.write_all(bytes),
        }
    }

    /// The digest of what was received (whatever happened).
    pub(crate) fn digest_so_far(&self) -> String {
        hex(&self.hasher.clone().finalize())
    }

    /// End of the blob: finish decompressing, write what is pending.
    pub(crate) fn finish(self) -> std::io::Result<Received> {
        let sha256 = hex(&self.hasher.finalize());
        let file_size = match self.sink {
            Sink::Plain(f) => f.finish()?,
            Sink::Zstd(mut d) => {
                d.flush()?;
                let f = d.into_inner();
                f.finish()?
            }
        };
        Ok(Received {
            sha256,
            received: self.received,
            file_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn received_files_keep_zero_blocks_as_holes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut data = vec![0u8; 8 << 20];
        data[5] = 1;
        data[(6 << 20) + 7] = 2;
        let mut r = Receiver::create(&p, Compression::None, data.len() as u64).unwrap();
        for c in data.chunks(100_003) {
            r.push(c).unwrap();
        }
        let got = r.finish().unwrap();
        assert_eq!(
            (got.received, got.file_size),
            (data.len() as u64, data.len() as u64)
        );
        assert_eq!(got.sha256, hex(&crate::hash::sha256(&data)));
        assert_eq!(std::fs::read(&p).unwrap(), data);
        assert!(
            std::fs::metadata(&p).unwrap().blocks() * 512 < 1 << 20,
            "zero blocks should be holes"
        );
    }

    #[test]
    fn zstd_round_trip_and_limits() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        let blob = d.path().join("blob");
        let (digest, size) = compress_file(&src, data.len() as u64, &blob).unwrap();
        let bytes = std::fs::read(&blob).unwrap();
        assert_eq!(
            (bytes.len() as u64, digest.clone()),
            (size, hex(&crate::hash::sha256(&bytes)))
        );
        assert!(size < data.len() as u64 / 10);
        let out = d.path().join("out");
        let mut r = Receiver::create(&out, Compression::Zstd, data.len() as u64).unwrap();
        for c in bytes.chunks(4097) {
            r.push(c).unwrap();
        }
        let got = r.finish().unwrap();
        assert_eq!((got.sha256, got.file_size), (digest, data.len() as u64));
        assert_eq!(std::fs::read(&out).unwrap(), data);
        // A file longer than the manifest allows is refused.
        let out2 = d.path().join("out2");
        let mut r = Receiver::create(&out2, Compression::Zstd, 1000).unwrap();
        let e = bytes
            .chunks(4097)
            .try_for_each(|c| r.push(c))
            .and_then(|_| r.finish().map(|_| ()));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("more than the 1000 bytes"));
        // A corrupt frame is an error.
        let out3 = d.path().join("out3");
        let mut r = Receiver::create(&out3, Compression::Zstd, data.len() as u64).unwrap();
        let e = r
            .push(b"not a zstd frame at all")
            .and_then(|_| r.finish().map(|_| ()));
        assert!(e.is_err());
    }

    #[test]
    fn file_stream_reads_exactly_the_size() {
        use futures_util::StreamExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..(CHUNK + 10)).map(|i| i as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let tag = Tag {
            layer: "l".into(),
            file: "memory.bin",
            progress: None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got: Vec<u8> = rt.block_on(async {
            let s = file_stream(p.clone(), data.len() as u64, tag.clone()).unwrap();
            let parts: Vec<_> = s.collect().await;
            parts
                .into_iter()
                .flat_map(|b| b.unwrap().to_vec())
                .collect()
        });
        assert_eq!(got, data);
        let short = rt.block_on(async {
            let s = file_stream(p.clone(), data.len() as u64 + 5, tag.clone()).unwrap();
            s.collect::<Vec<_>>().await
        });
        assert!(short.last().unwrap().is_err());
        let long = rt.block_on(async {
            let s = file_stream(p.clone(), 10, tag).unwrap();
            s.collect::<Vec<_>>().await
        });
        assert!(long.last().unwrap().is_err());
    }
}
