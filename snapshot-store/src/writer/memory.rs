//! A layer's memory file filled out of order: a background snapshot saves
//! each page at its final offset, in whatever order the guest's writes
//! force, and the file is hashed once it is complete.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::SnapshotWriter;
use crate::error::{Error, IoContext, Result};
use crate::file_hash::memory_digest_file;
use crate::format::diff::encode_diff_prefix;
use crate::format::manifest::FileEntry;
use crate::format::MEMORY_FILE;
use crate::hash::hex;

/// The memory file of a layer being written out of order
/// ([`SnapshotWriter::memory_file`]). Page `p` of a full layer goes at byte
/// `p * page_size`; the `i`th page of a diff's index at
/// `data_offset + i * page_size`.
#[derive(Debug)]
pub struct MemoryFile {
    /// The file, open for writing (and reading, for the digest).
    pub file: File,
    /// For a diff: file offset of the first page, in bytes; `None` for a
    /// full layer.
    pub data_offset: Option<u64>,
    path: PathBuf,
    size: u64,
    /// The diff's page count.
    pages: Option<u64>,
    /// A diff's prefix (empty for a full layer), written at offset 0 by
    /// [`SnapshotWriter::finish_memory_file`].
    prefix: Vec<u8>,
}

impl SnapshotWriter {
    /// Creates the layer's memory file, empty, ahead of
    /// [`SnapshotWriter::memory_file`], which then only sizes it (and writes
    /// a diff's prefix): a background snapshot creates it before it pauses
    /// the VM. Errors: the memory is written or the file created already,
    /// or it cannot be created.
    pub fn create_memory_file(&mut self) -> Result<()> {
        self.check_no_memory()?;
        if self.memory_ahead.is_some() {
            return Err(Error::Usage(format!(
                "the memory file of snapshot '{}' is created already",
                self.name
            )));
        }
        self.memory_ahead = Some(self.create_memory()?);
        Ok(())
    }

    /// Creates `MEMORY_FILE` in the work directory, for reading and writing.
    fn create_memory(&self) -> Result<File> {
        let path = self.tmp.join(MEMORY_FILE);
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .ctx(&path, "create")
    }

    /// Creates the layer's memory file (or takes the one
    /// [`SnapshotWriter::create_memory_file`] made), to be filled out of
    /// order at the offsets [`MemoryFile`] gives, then handed to
    /// [`SnapshotWriter::finish_memory_file`], which writes a diff's prefix
    /// and sets the file's final size (this call does no I/O with a file
    /// created ahead: a background snapshot makes it inside its pause). A
    /// full layer (no parent) passes `None`: the file is the RAM image
    /// (`ram_size` bytes; pages never written read as zero). A diff passes
    /// its page index (strictly increasing): the prefix, then the pages in
    /// index order.
    pub fn memory_file(&mut self, diff_pages: Option<&[u64]>) -> Result<MemoryFile> {
        self.check_no_memory()?;
        let diff = self.meta.parent.is_some();
        if diff != diff_pages.is_some() {
            return Err(Error::Usage(format!(
                "snapshot '{}' is a {} layer: {}",
                self.name,
                if diff { "diff" } else { "full" },
                if diff {
                    "give its page index"
                } else {
                    "it has no page index"
                }
            )));
        }
        let ps = self.meta.page_size;
        let (size, data_offset, pages, prefix) = match diff_pages {
            None => (self.meta.ram_size, None, None, Vec::new()),
            Some(index) => {
                let prefix = encode_diff_prefix(ps, self.meta.ram_size, index)
                    .map_err(|e| Error::Usage(format!("diff of snapshot '{}': {e}", self.name)))?;
                let n = index.len() as u64;
                (
                    prefix.len() as u64 + n * ps,
                    Some(prefix.len() as u64),
                    Some(n),
                    prefix,
                )
            }
        };
        let file = match self.memory_ahead.take() {
            Some(f) => f,
            None => self.create_memory()?,
        };
        Ok(MemoryFile {
            file,
            data_offset,
            path: self.tmp.join(MEMORY_FILE),
            size,
            pages,
            prefix,
        })
    }

    /// Records a memory file from [`SnapshotWriter::memory_file`] once every
    /// page is in it: writes a diff's prefix, sets the file's size, and
    /// computes its [`crate::format::memory::MemoryDigest`] (reading back
    /// its data; holes are not read).
    pub fn finish_memory_file(&mut self, m: MemoryFile) -> Result<()> {
        self.check_no_memory()?;
        m.file
            .write_all_at(&m.prefix, 0)
            .ctx(&m.path, "write the diff's prefix")?;
        m.file.set_len(m.size).ctx(&m.path, "set length")?;
        let digest = memory_digest_file(&m.file, &m.path, m.size, None)?;
        self.memory = Some((
            FileEntry {
                size: m.size,
                sha256: hex(&digest),
            },
            m.pages,
        ));
        Ok(())
    }
}
