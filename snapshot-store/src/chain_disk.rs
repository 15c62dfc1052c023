//! The disk of a chain ([`ChainDisk`]): the newest whole image
//! (`disk.img`) at the bottom and the disk diffs (`disk.diff`) of the
//! layers above it, each chunk read from the newest layer that stores it.
//! Read-only: the store's files are never opened for writing.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::disk_source::{read_file_at, DiskImage, DiskSource};
use crate::error::{Error, Result};
use crate::format::chunks::chunk_range;
use crate::format::{DISK_DIFF_FILE, DISK_FILE};
use crate::fsutil::{open_regular, Links};
use crate::layer::Chain;
use crate::readers::read_disk_diff_prefix;

/// One layer's `disk.diff`, open.
#[derive(Debug)]
struct DiffFile {
    file: File,
    path: PathBuf,
    len: u64,
    data_offset: u64,
}

/// Where one chunk of a chain's disk is stored, if not in the bottom image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    chunk: u64,
    /// Index into [`ChainDisk::diffs`].
    diff: u32,
    /// Position in that diff's index.
    slot: u64,
}

/// A chain's disk, read-only: see the module's doc. Verify the chain
/// ([`crate::verify_chain_cached`]) before a guest reads it.
#[derive(Debug)]
pub struct ChainDisk {
    size: u64,
    chunk_size: u64,
    base: DiskImage,
    /// Layer names of the bottom image and the diffs, bottom first.
    layers: Vec<String>,
    diffs: Vec<DiffFile>,
    /// Every chunk some diff stores, from the newest diff that has it,
    /// sorted by chunk.
    map: Vec<Stored>,
}

impl ChainDisk {
    /// The disk of `chain` (its top layer's), or `None` if it has none.
    /// Opens the bottom image and every `disk.diff` above it, and reads and
    /// checks the diffs' headers and indexes against their manifests
    /// (bounded reads; errors name the file). Costs no copy.
    pub fn open(chain: &Chain) -> Result<Option<ChainDisk>> {
        let layers = chain.layers();
        let Some(top) = layers.last().and_then(|l| l.manifest.disk.as_ref()) else {
            return Ok(None);
        };
        let (size, chunk_size) = (top.size, top.chunk_size);
        // From the top down to the first layer with a whole image; the
        // chain's links say each diff's parent has a disk of this shape.
        let mut stack = Vec::new();
        let mut bottom = None;
        for layer in layers.iter().rev() {
            let Some(d) = layer.manifest.disk.as_ref() else {
                break;
            };
            if d.size != size || d.chunk_size != chunk_size {
                break;
            }
            if d.diff_chunks.is_none() {
                bottom = Some(layer);
                break;
            }
            stack.push(layer);
        }
        let Some(bottom) = bottom else {
            return Err(Error::Chain(format!(
                "the disk of '{}' has no whole image below its diffs in {}",
                chain.top().name,
                chain.describe()
            )));
        };
        let path = bottom.dir.join(DISK_FILE);
        let base = DiskImage::from_file(open_regular(&path, Links::Refuse)?, &path)?;
        if base.size() != size {
            return Err(Error::corrupt(
                base.path(),
                format!("is {} bytes, manifest.json says {size}", base.size()),
            ));
        }
        stack.reverse();
        let mut names = vec![bottom.name.clone()];
        let mut diffs = Vec::with_capacity(stack.len());
        let mut entries = Vec::new();
        for (i, layer) in stack.iter().enumerate() {
            let path = layer.dir.join(DISK_DIFF_FILE);
            let file = open_regular(&path, Links::Refuse)?;
            let entry = layer
                .manifest
                .disk
                .as_ref()
                .expect("the walk kept layers with a disk");
            let (h, index) = read_disk_diff_prefix(&file, &path, entry)?;
            let diff = u32::try_from(i).map_err(|_| Error::Usage("too many layers".into()))?;
            entries.extend(index.into_iter().enumerate().map(|(slot, chunk)| Stored {
                chunk,
                diff,
                slot: slot as u64,
            }));
            names.push(layer.name.clone());
            diffs.push(DiffFile {
                file,
                len: h.file_size(),
                data_offset: h.data_offset,
                path,
            });
        }
        // Newest first within a chunk, then one entry per chunk.
        entries.sort_unstable_by_key(|e| (e.chunk, std::cmp::Reverse(e.diff)));
        entries.dedup_by_key(|e| e.chunk);
        Ok(Some(ChainDisk {
            size,
            chunk_size,
            base,
            layers: names,
            diffs,
            map: entries,
        }))
    }

    /// The disk's chunk size in bytes (its layers' `disk.chunk_size`).
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// The layers the disk is read from, bottom (the whole image) first.
    pub fn layers(&self) -> &[String] {
        &self.layers
    }

    /// Number of chunks stored in the chain's disk diffs (each counted
    /// once, from its newest layer).
    pub fn diff_chunks(&self) -> u64 {
        self.map.len() as u64
    }

    fn stored(&self, chunk: u64) -> Option<&Stored> {
        self.map
            .binary_search_by_key(&chunk, |e| e.chunk)
            .ok()
            .map(|i| &self.map[i])
    }
}

impl DiskSource for ChainDisk {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(Error::Usage(format!(
                "read of {} bytes at {offset} is beyond the {}-byte disk of '{}'",
                buf.len(),
                self.size,
                self.layers.last().map_or("", String::as_str)
            )));
        }
        let mut at = 0usize;
        while at < buf.len() {
            let off = offset + at as u64;
            let chunk = off / self.chunk_size;
            let within = off - chunk * self.chunk_size;
            let n = ((self.chunk_size - within) as usize).min(buf.len() - at);
            let piece = &mut buf[at..at + n];
            match self.stored(chunk) {
                Some(s) => {
                    let d = &self.diffs[s.diff as usize];
                    let from = d.data_offset + s.slot * self.chunk_size + within;
                    read_file_at(&d.file, &d.path, d.len, piece, from)?;
                }
                None => self.base.read_exact_at(piece, off)?,
            }
            at += n;
        }
        Ok(())
    }

    fn data_chunks(&self, chunk_size: u64) -> Result<Vec<Range<u64>>> {
        let mut ranges = self.base.data_chunks(chunk_size)?;
        ranges.extend(self.diff_ranges(chunk_size));
        Ok(merge_ranges(ranges))
    }

    fn base_file(&self, chunk_size: u64) -> Option<(&Path, Vec<Range<u64>>)> {
        Some((
            self.base.path(),
            merge_ranges(self.diff_ranges(chunk_size).collect()),
        ))
    }
}

impl ChainDisk {
    /// The chunks the diffs store, as ranges of `chunk_size`-byte chunks.
    pub(crate) fn diff_ranges(&self, chunk_size: u64) -> impl Iterator<Item = Range<u64>> + '_ {
        self.map.iter().map(move |s| {
            let r = chunk_range(s.chunk, self.chunk_size, self.size);
            r.start / chunk_size..r.end.div_ceil(chunk_size)
        })
    }
}

/// `ranges` sorted, with overlapping and touching ranges merged.
pub(crate) fn merge_ranges(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges.into_iter().filter(|r| r.start < r.end) {
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        assert_eq!(
            merge_ranges(vec![5..6, 1..3, 2..4, 9..10, 7..7]),
            vec![1..4, 5..6, 9..10]
        );
        assert!(merge_ranges(Vec::new()).is_empty());
    }
}
