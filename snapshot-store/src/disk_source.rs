//! A disk as a snapshot reads it ([`DiskSource`]): a plain image file
//! ([`DiskImage`]), a chain's disk (`ChainDisk`) or a VM's working overlay
//! (`DiskOverlay`). A layer's copy of the disk is read through it, chunk
//! by chunk.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::clone::open_source;
use crate::error::{Error, IoContext, Result};
use crate::file_hash::data_chunks;

/// A disk's bytes, readable from any thread while a VM may write to it
/// (a snapshot's copy reads each chunk before the VM's next write to it
/// reaches it: [`crate::DiskCopy`]).
pub trait DiskSource: Send + Sync {
    /// Length of the disk in bytes.
    fn size(&self) -> u64;

    /// Fills `buf` with the disk's bytes at `offset`. Errors (naming the
    /// file) if the range is beyond [`DiskSource::size`] or a read fails.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// The ranges of `chunk_size`-byte chunk indices (increasing, disjoint)
    /// that may hold data; every other chunk reads as zeros.
    fn data_chunks(&self, chunk_size: u64) -> Result<Vec<Range<u64>>>;

    /// A regular file as long as the disk that holds the disk's bytes but
    /// for the returned ranges of `chunk_size`-byte chunk indices, if there
    /// is one: a copy of the disk can then be a file system clone of it
    /// with those chunks copied over.
    fn base_file(&self, chunk_size: u64) -> Option<(&Path, Vec<Range<u64>>)> {
        let _ = chunk_size;
        None
    }
}

/// A disk that is one image file, opened read-only.
#[derive(Debug)]
pub struct DiskImage {
    file: File,
    path: PathBuf,
    size: u64,
}

impl DiskImage {
    /// Opens the image `path` (following a symbolic link; a regular file,
    /// checked through the descriptor without blocking) for reading; its
    /// size is its length now.
    pub fn open(path: &Path) -> Result<DiskImage> {
        let file = open_source(path)?;
        let size = file.metadata().ctx(path, "stat")?.len();
        Ok(DiskImage {
            file,
            path: path.to_path_buf(),
            size,
        })
    }

    /// A store's image `path`, opened by the caller (never through a
    /// symbolic link: [`crate::fsutil::open_regular`]).
    pub(crate) fn from_file(file: File, path: &Path) -> Result<DiskImage> {
        let size = file.metadata().ctx(path, "stat")?.len();
        Ok(DiskImage {
            file,
            path: path.to_path_buf(),
            size,
        })
    }

    /// The image's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads `buf.len()` bytes of `file` (named `path` in errors, `size`
/// bytes long) at `offset`: an error if the range is beyond `size`, and
/// [`Error::Corrupt`] if the file is shorter than that.
pub(crate) fn read_file_at(
    file: &File,
    path: &Path,
    size: u64,
    buf: &mut [u8],
    offset: u64,
) -> Result<()> {
    let end = offset.checked_add(buf.len() as u64);
    if end.is_none_or(|e| e > size) {
        return Err(Error::Usage(format!(
            "{}: read of {} bytes at {offset} is beyond its {size} bytes",
            path.display(),
            buf.len()
        )));
    }
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::corrupt(
                path,
                format!("shorter than {size} bytes (read at {offset})"),
            )
        } else {
            Error::io(path, "read", e)
        }
    })
}

impl DiskSource for DiskImage {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        read_file_at(&self.file, &self.path, self.size, buf, offset)
    }

    fn data_chunks(&self, chunk_size: u64) -> Result<Vec<Range<u64>>> {
        data_chunks(&self.file, &self.path, self.size, chunk_size)
    }

    fn base_file(&self, _chunk_size: u64) -> Option<(&Path, Vec<Range<u64>>)> {
        Some((&self.path, Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_reads_inside_its_size_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("disk.img");
        std::fs::write(&p, b"0123456789").unwrap();
        let img = DiskImage::open(&p).unwrap();
        assert_eq!(img.size(), 10);
        let mut b = [0u8; 4];
        img.read_exact_at(&mut b, 6).unwrap();
        assert_eq!(&b, b"6789");
        let e = img.read_exact_at(&mut b, 7).unwrap_err().to_string();
        assert!(e.contains("disk.img") && e.contains("beyond"), "{e}");
        // The file shrinks under it: corrupt, naming the file.
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(5)
            .unwrap();
        let e = img.read_exact_at(&mut b, 4).unwrap_err().to_string();
        assert!(e.contains("disk.img") && e.contains("shorter"), "{e}");
        assert_eq!(img.base_file(4096), Some((p.as_path(), Vec::new())));
    }
}
