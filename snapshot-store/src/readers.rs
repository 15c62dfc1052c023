//! Bounded reads of a layer's binary files, each checked against its own
//! header and against the layer's manifest: the packed diff's prefix, the
//! whole `state.bin`, `disk.chunks`, and the prefix of `disk.diff`. Every length is checked before
//! anything is allocated or read, and every error names the file.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, IoContext, Result};
use crate::format::chunks::{
    check_chunk_geometry, disk_chunks_file_size, parse_disk_chunks, DiskChunks,
};
use crate::format::diff::{parse_diff_header, parse_diff_prefix, DiffHeader, DIFF_HEADER_LEN};
use crate::format::disk_diff::{
    parse_disk_diff_header, parse_disk_diff_prefix, DiskDiffHeader, DISK_DIFF_HEADER_LEN,
};
use crate::format::manifest::{DiskEntry, Manifest};
use crate::format::state::{parse_state, parse_state_header, STATE_HEADER_LEN};
use crate::fsutil::{file_kind, is_not_found, not_regular, open_regular, Links};
use crate::hash::hex;

/// Read `state.bin` at `path` with bounded reads: the header first, then
/// exactly the payload it announces (never more than [`crate::format::state::MAX_STATE_BYTES`]).
pub(crate) fn read_state_file(path: &Path) -> Result<Vec<u8>> {
    let mut f = open_regular(path, Links::Refuse)?;
    let file_len = f.metadata().ctx(path, "stat")?.len();
    let mut head = [0u8; STATE_HEADER_LEN];
    let got = read_up_to(&mut f, &mut head).ctx(path, "read")?;
    let h = parse_state_header(&head[..got]).map_err(|e| Error::corrupt(path, e.0))?;
    if file_len != STATE_HEADER_LEN as u64 + h.payload_len {
        return Err(Error::corrupt(
            path,
            format!(
                "file is {file_len} bytes, header announces {} + {}",
                STATE_HEADER_LEN, h.payload_len
            ),
        ));
    }
    let mut file = head.to_vec();
    file.resize(STATE_HEADER_LEN + h.payload_len as usize, 0);
    let got = read_up_to(&mut f, &mut file[STATE_HEADER_LEN..]).ctx(path, "read")?;
    if got as u64 != h.payload_len {
        return Err(Error::corrupt(path, "truncated while reading"));
    }
    let payload = parse_state(&file).map_err(|e| Error::corrupt(path, e.0))?;
    Ok(payload.to_vec())
}

/// Fill as much of `buf` as the reader provides; returns the bytes read.
pub(crate) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Read and check the header, index and padding of the diff file at
/// `path`, whose length is `file_len`. Reads at most the prefix, which
/// the header check bounds by the real file size.
pub(crate) fn read_diff_prefix(
    f: &File,
    path: &Path,
    file_len: u64,
) -> Result<(DiffHeader, Vec<u64>)> {
    let mut head = [0u8; DIFF_HEADER_LEN];
    let got = read_up_to(&mut &*f, &mut head).ctx(path, "read")?;
    let h = parse_diff_header(&head[..got]).map_err(|e| Error::corrupt(path, e.0))?;
    if file_len != h.file_size() {
        return Err(Error::corrupt(
            path,
            format!(
                "file is {file_len} bytes, but its header announces {} ({} pages)",
                h.file_size(),
                h.page_count
            ),
        ));
    }
    let mut prefix = vec![0u8; h.data_offset as usize];
    f.read_exact_at(&mut prefix, 0).ctx(path, "read")?;
    parse_diff_prefix(&prefix).map_err(|e| Error::corrupt(path, e.0))
}

/// Read and check the header, index and padding of the open `disk.diff`
/// `f` (named `path` in errors; untrusted) against the manifest's disk
/// entry: its size must be the one `entry` implies before anything is
/// read, and its header must say the same chunk size, disk size and chunk
/// count. Reads at most the prefix (below 64 KiB + 8 bytes per chunk).
pub(crate) fn read_disk_diff_prefix(
    f: &File,
    path: &Path,
    entry: &DiskEntry,
) -> Result<(DiskDiffHeader, Vec<u64>)> {
    let want = entry.data_file_size();
    let len = f.metadata().ctx(path, "stat")?.len();
    if len != want {
        return Err(Error::corrupt(
            path,
            format!("is {len} bytes, manifest.json implies {want}"),
        ));
    }
    let mut head = [0u8; DISK_DIFF_HEADER_LEN];
    let got = read_up_to(&mut &*f, &mut head).ctx(path, "read")?;
    let h = parse_disk_diff_header(&head[..got]).map_err(|e| Error::corrupt(path, e.0))?;
    if h.chunk_size != entry.chunk_size
        || h.disk_size != entry.size
        || Some(h.chunk_count) != entry.diff_chunks
    {
        return Err(Error::corrupt(
            path,
            format!(
                "header says {} chunks of {} bytes of a {}-byte disk; manifest.json says {} chunks of {} bytes of {}",
                h.chunk_count,
                h.chunk_size,
                h.disk_size,
                entry.diff_chunks.unwrap_or(0),
                entry.chunk_size,
                entry.size
            ),
        ));
    }
    // The header matches the manifest, whose size the file has: the
    // prefix is inside the file.
    let mut prefix = vec![0u8; h.data_offset as usize];
    f.read_exact_at(&mut prefix, 0).ctx(path, "read")?;
    parse_disk_diff_prefix(&prefix).map_err(|e| Error::corrupt(path, e.0))
}

/// Check the header of the diff file `path` against its layer's manifest
/// `m`.
pub(crate) fn check_diff_against_manifest(m: &Manifest, path: &Path, h: &DiffHeader) -> Result<()> {
    if h.page_size != m.page_size || h.ram_size != m.ram_size || Some(h.page_count) != m.diff_pages
    {
        return Err(Error::corrupt(
            path,
            format!(
                "header says {} pages of {} bytes over {} bytes of RAM; manifest.json says {} pages of {} bytes over {}",
                h.page_count,
                h.page_size,
                h.ram_size,
                m.diff_pages.unwrap_or(0),
                m.page_size,
                m.ram_size
            ),
        ));
    }
    Ok(())
}

/// Read `disk.chunks` at `path` (untrusted, bounded) and check it against
/// the manifest's disk entry; see [`check_disk_chunks_file`].
pub(crate) fn read_disk_chunks(path: &Path, entry: &DiskEntry) -> Result<DiskChunks> {
    let f = open_regular(path, Links::Refuse).map_err(|e| {
        if is_not_found(&e) {
            Error::corrupt(path, "missing")
        } else {
            e
        }
    })?;
    check_disk_chunks_file(&f, path, entry)
}

/// Read the open `disk.chunks` `f` (named `path` in errors; untrusted,
/// bounded: its size must be the one `entry` implies before anything is
/// read) and check it against the manifest's disk entry: well-formed,
/// same chunk size and disk size, and the sha256 of the digest list equal
/// to `entry.sha256`.
pub(crate) fn check_disk_chunks_file(
    f: &File,
    path: &Path,
    entry: &DiskEntry,
) -> Result<DiskChunks> {
    let n = check_chunk_geometry(entry.chunk_size, entry.size)
        .map_err(|e| Error::corrupt(path, format!("manifest disk entry: {e}")))?;
    let want = disk_chunks_file_size(n);
    let meta = f.metadata().ctx(path, "stat")?;
    if !meta.is_file() {
        return Err(not_regular(path, file_kind(meta.file_type())));
    }
    if meta.len() != want {
        return Err(Error::corrupt(
            path,
            format!(
                "is {} bytes, a list of {n} digests is {want} bytes",
                meta.len()
            ),
        ));
    }
    // want <= 72 + 32 * MAX_DISK_CHUNKS: fits a usize.
    let mut bytes = Vec::with_capacity(want as usize);
    f.take(want + 1).read_to_end(&mut bytes).ctx(path, "read")?;
    let chunks = parse_disk_chunks(&bytes).map_err(|e| Error::corrupt(path, e.0))?;
    if chunks.chunk_size != entry.chunk_size || chunks.disk_size != entry.size {
        return Err(Error::corrupt(
            path,
            format!(
                "lists {}-byte chunks of a {}-byte disk, the manifest says {}-byte chunks of {} bytes",
                chunks.chunk_size, chunks.disk_size, entry.chunk_size, entry.size
            ),
        ));
    }
    let found = hex(&chunks.disk_digest());
    if found != entry.sha256 {
        return Err(Error::corrupt(
            path,
            format!(
                "sha256 mismatch: digest list does not match the manifest (disk sha256 {}, list hashes to {found})",
                entry.sha256
            ),
        ));
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::state::encode_state_header;

    fn file(payload: &[u8]) -> Vec<u8> {
        [&encode_state_header(payload).unwrap()[..], payload].concat()
    }

    #[test]
    fn file_reader_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.bin");
        std::fs::write(&p, file(b"abc")).unwrap();
        assert_eq!(read_state_file(&p).unwrap(), b"abc");
        // Header claims more than the file has.
        let mut b = file(b"abc");
        b[16] = 200;
        std::fs::write(&p, &b).unwrap();
        let e = read_state_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("state.bin") && e.contains("header announces"),
            "{e}"
        );
        std::fs::write(&p, b"IGN").unwrap();
        let e = read_state_file(&p).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}
