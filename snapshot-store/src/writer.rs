//! Writing a layer: a work directory inside the store, then an atomic,
//! durable commit. The memory file filled out of order is
//! `writer/memory.rs`, the disk (`disk.img` or `disk.diff`)
//! `writer/disk.rs`, and the disk copied while the VM runs
//! `writer/disk_copy.rs`.

// The submodules in layers, bottom first, as in `lib.rs`
// (`tests/layering.rs` checks it).

// A disk copied while the VM runs.
mod disk_copy;

// The writer's memory file and disk.
mod disk;
mod memory;

use disk::DiskJob;
pub use disk::{DiskClone, DiskMethod};
pub use disk_copy::DiskCopy;
pub use memory::MemoryFile;

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::cache::{record_written, SystemClock, COMMIT_WAIT_MIN_BYTES};
use crate::error::{Error, IoContext, Result};
use crate::format::diff::encode_diff_prefix;
use crate::format::manifest::FileEntry;
use crate::format::memory::{memory_digest, MemoryDigest};
use crate::format::state::encode_state_header;
use crate::format::verified::VERIFIED_FILE;
use crate::format::{DISK_CHUNKS_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE};
use crate::fsutil::{nonce, rename_noreplace, set_readonly, sync_dir, sync_file};
use crate::hash::{hex, sha256};
use crate::layer::{check_same_machine, Layer, LayerMeta};
use crate::name::validate_name;
use crate::store::{Store, DEL_PREFIX, TMP_PREFIX};

/// Check that `meta.parent` exists with the recorded content hash and
/// describes the same machine.
fn check_parent(store: &Store, name: &str, meta: &LayerMeta) -> Result<()> {
    let Some(p) = &meta.parent else {
        return Ok(());
    };
    if !store.contains(&p.name) {
        return Err(Error::MissingParent {
            layer: name.to_string(),
            parent: p.name.clone(),
            store: store.root().to_path_buf(),
        });
    }
    let parent = store.layer(&p.name)?;
    if parent.content_sha256 != p.sha256 {
        return Err(Error::ParentChanged {
            layer: name.to_string(),
            parent: p.name.clone(),
            expected: p.sha256.clone(),
            found: parent.content_sha256.clone(),
            manifest: parent.manifest_path(),
        });
    }
    let probe = meta.manifest(
        name,
        FileEntry {
            size: 0,
            sha256: String::new(),
        },
        None,
        FileEntry {
            size: 0,
            sha256: String::new(),
        },
        None,
        0,
    );
    check_same_machine(&parent.manifest, &probe, &p.name, name)
}

/// A layer being written into a work directory `.tmp-NAME-PID-NONCE`
/// inside the store. Nothing is visible under `NAME` until
/// [`SnapshotWriter::commit`] succeeds; dropping the writer (or any error
/// in `commit`) removes the work directory.
///
/// Order: memory (full or diff, once), state (once), disk (optional, once),
/// then `commit`.
pub struct SnapshotWriter {
    root: PathBuf,
    name: String,
    meta: LayerMeta,
    tmp: PathBuf,
    memory: Option<(FileEntry, Option<u64>)>,
    /// The memory file, created ahead ([`SnapshotWriter::create_memory_file`]).
    memory_ahead: Option<std::fs::File>,
    state: Option<FileEntry>,
    disk: Option<DiskJob>,
    finished: bool,
}

impl std::fmt::Debug for SnapshotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("name", &self.name)
            .field("tmp", &self.tmp)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Start writing snapshot `name` described by `meta`.
    ///
    /// Refuses up front an invalid or existing name, a name equal to the
    /// parent's, a parent that is missing or whose content hash differs,
    /// and a parent of another geometry, backend or GIC mode.
    pub fn begin(&self, name: &str, meta: LayerMeta) -> Result<SnapshotWriter> {
        validate_name(name)?;
        if meta.parent.as_ref().is_some_and(|p| p.name == name) {
            return Err(Error::Usage(format!(
                "snapshot name '{name}' is the name of its parent; choose a new name"
            )));
        }
        meta.validate(name)?;
        check_parent(self, name, &meta)?;
        if self.root().join(name).symlink_metadata().is_ok() {
            return Err(Error::Exists {
                name: name.to_string(),
                store: self.root().to_path_buf(),
            });
        }
        let tmp = create_work_dir(self.root(), name)?;
        Ok(SnapshotWriter {
            root: self.root().to_path_buf(),
            name: name.to_string(),
            meta,
            tmp,
            memory: None,
            memory_ahead: None,
            state: None,
            disk: None,
            finished: false,
        })
    }
}

/// Create the work directory `.tmp-NAME-PID-NONCE` for the layer `name`
/// in the store directory `root`.
pub(crate) fn create_work_dir(root: &Path, name: &str) -> Result<PathBuf> {
    let pid = std::process::id();
    let mut tries = 0;
    loop {
        let tmp = root.join(format!("{TMP_PREFIX}{name}-{pid}-{:016x}", nonce()));
        match std::fs::create_dir(&tmp) {
            Ok(()) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
            Err(e) => return Err(Error::io(&tmp, "create work directory", e)),
        }
    }
}

/// The last steps of a commit (FORMAT.md, "Writing", steps 4 to 7), once
/// every file of the layer `name` is in the work directory `tmp`, read-only
/// and fsynced: fsync `tmp`, check that the parent named by `meta` is still
/// in the store with its content hash, rename `tmp` to `NAME` without
/// replacing anything, fsync the store directory (on failure the layer is
/// taken back out). Sets `*renamed` once `tmp` is gone (renamed into place
/// or taken back out). Returns the layer's directory.
pub(crate) fn publish(
    root: &Path,
    tmp: &Path,
    name: &str,
    meta: &LayerMeta,
    renamed: &mut bool,
) -> Result<PathBuf> {
    sync_dir(tmp)?;
    // The parent may have been removed while we were writing.
    let store = Store::open(root)?;
    check_parent(&store, name, meta)?;

    let dst = root.join(name);
    match rename_noreplace(tmp, &dst) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::Exists {
                name: name.to_string(),
                store: root.to_path_buf(),
            })
        }
        Err(e) => return Err(Error::io(tmp, "rename into place", e)),
    }
    *renamed = true;
    if let Err(e) = sync_dir(root) {
        // Not known to be durable: take it back out rather than leave a
        // layer that may vanish on power loss.
        let doomed = root.join(format!(
            "{DEL_PREFIX}{name}-{}-{:016x}",
            std::process::id(),
            nonce()
        ));
        if std::fs::rename(&dst, &doomed).is_ok() {
            let _ = std::fs::remove_dir_all(&doomed);
        }
        return Err(e);
    }
    Ok(dst)
}

/// Write all of `bufs` with vectored writes.
fn write_all_vectored(f: &mut File, path: &Path, bufs: &[&[u8]]) -> Result<()> {
    const BATCH: usize = 512;
    for batch in bufs.chunks(BATCH) {
        let mut slices: Vec<IoSlice<'_>> = batch.iter().map(|b| IoSlice::new(b)).collect();
        let mut cur: &mut [IoSlice<'_>] = &mut slices;
        while !cur.is_empty() {
            match f.write_vectored(cur) {
                Ok(0) => {
                    return Err(Error::io(
                        path,
                        "write",
                        std::io::Error::from(std::io::ErrorKind::WriteZero),
                    ))
                }
                Ok(n) => IoSlice::advance_slices(&mut cur, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(path, "write", e)),
            }
        }
    }
    Ok(())
}

/// Writes `bufs` (a diff's prefix, then its pages) one after the other to
/// the empty file `f`, leaving pages of zeros as holes, and makes the file
/// `size` bytes long.
fn write_diff_sparse(f: &mut File, path: &Path, bufs: &[&[u8]], size: u64) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut at = 0u64;
    for run in bufs.chunk_by(|a, b| is_zero(a) == is_zero(b)) {
        let len: u64 = run.iter().map(|b| b.len() as u64).sum();
        if !is_zero(run[0]) {
            f.seek(SeekFrom::Start(at)).ctx(path, "seek")?;
            write_all_vectored(f, path, run)?;
        }
        at += len;
    }
    f.set_len(size).ctx(path, "set length")
}

/// Writes `data` to the empty file `f`, leaving its all-zero `page`-byte
/// pages as holes (they read as zero; the file ends up `data.len()` long).
fn write_sparse(f: &mut File, data: &[u8], page: usize) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut at = 0;
    for run in data
        .chunks(page)
        .collect::<Vec<_>>()
        .chunk_by(|a, b| is_zero(a) == is_zero(b))
    {
        let len: usize = run.iter().map(|p| p.len()).sum();
        if !is_zero(run[0]) {
            f.seek(SeekFrom::Start(at as u64))?;
            f.write_all(&data[at..at + len])?;
        }
        at += len;
    }
    f.set_len(data.len() as u64)
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

impl SnapshotWriter {
    /// The snapshot name being written.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The work directory (removed on drop unless committed).
    pub fn work_dir(&self) -> &Path {
        &self.tmp
    }

    fn create(&self, file: &str) -> Result<(File, PathBuf)> {
        let path = self.tmp.join(file);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .ctx(&path, "create")?;
        Ok((f, path))
    }

    /// The memory file to write: the one created ahead, or a new one.
    fn memory_target(&mut self) -> Result<(File, PathBuf)> {
        match self.memory_ahead.take() {
            Some(f) => Ok((f, self.tmp.join(MEMORY_FILE))),
            None => self.create(MEMORY_FILE),
        }
    }

    fn check_no_memory(&self) -> Result<()> {
        if self.memory.is_some() {
            return Err(Error::Usage(format!(
                "memory of snapshot '{}' was already written",
                self.name
            )));
        }
        Ok(())
    }

    /// Write the full RAM image: `ram` is all of guest RAM (`ram_size`
    /// bytes). Only for layers without a parent. Zero pages are left as
    /// holes. The digest ([`MemoryDigest`]) is computed on a second
    /// thread while the file is written.
    pub fn write_full_memory(&mut self, ram: &[u8]) -> Result<()> {
        self.check_no_memory()?;
        if self.meta.parent.is_some() {
            return Err(Error::Usage(format!(
                "snapshot '{}' has a parent, so it is a diff layer: use write_diff_memory",
                self.name
            )));
        }
        if ram.len() as u64 != self.meta.ram_size {
            return Err(Error::Usage(format!(
                "RAM buffer is {} bytes, the layer's RAM size is {}",
                ram.len(),
                self.meta.ram_size
            )));
        }
        let (mut f, path) = self.memory_target()?;
        let page = usize::try_from(self.meta.page_size)
            .map_err(|_| Error::Usage("page size does not fit in memory".into()))?;
        let digest = std::thread::scope(|s| {
            let hasher = s.spawn(|| memory_digest(ram));
            let written = write_sparse(&mut f, ram, page).ctx(&path, "write");
            let digest = hasher.join();
            written?;
            digest.map_err(|_| Error::Panicked("sha256 thread"))
        })?;
        self.memory = Some((
            FileEntry {
                size: ram.len() as u64,
                sha256: hex(&digest),
            },
            None,
        ));
        Ok(())
    }

    /// Write a packed diff of `pages`: `(page number, page bytes)` pairs,
    /// page numbers strictly increasing and below `ram_size / page_size`,
    /// each slice exactly `page_size` bytes. Only for layers with a parent.
    /// Returns the number of pages written.
    pub fn write_diff_memory<'a, I>(&mut self, pages: I) -> Result<u64>
    where
        I: IntoIterator<Item = (u64, &'a [u8])>,
    {
        self.check_no_memory()?;
        if self.meta.parent.is_none() {
            return Err(Error::Usage(format!(
                "snapshot '{}' has no parent, so it is a full layer: use write_full_memory",
                self.name
            )));
        }
        let ps = self.meta.page_size;
        let pages: Vec<(u64, &[u8])> = pages.into_iter().collect();
        let mut index = Vec::with_capacity(pages.len());
        for &(p, data) in &pages {
            if data.len() as u64 != ps {
                return Err(Error::Usage(format!(
                    "page {p} is {} bytes, the page size is {ps}",
                    data.len()
                )));
            }
            index.push(p);
        }
        let prefix = encode_diff_prefix(ps, self.meta.ram_size, &index)
            .map_err(|e| Error::Usage(format!("diff of snapshot '{}': {e}", self.name)))?;
        let (mut f, path) = self.memory_target()?;
        let mut bufs: Vec<&[u8]> = Vec::with_capacity(pages.len() + 1);
        bufs.push(&prefix);
        bufs.extend(pages.iter().map(|&(_, d)| d));
        let size = prefix.len() as u64 + index.len() as u64 * ps;
        let digest = std::thread::scope(|s| {
            let hasher = s.spawn(|| {
                let mut h = MemoryDigest::new();
                for b in &bufs {
                    h.update(b);
                }
                h.finish()
            });
            let written = write_diff_sparse(&mut f, &path, &bufs, size);
            let digest = hasher.join();
            written?;
            digest.map_err(|_| Error::Panicked("sha256 thread"))
        })?;
        self.memory = Some((
            FileEntry {
                size,
                sha256: hex(&digest),
            },
            Some(index.len() as u64),
        ));
        Ok(index.len() as u64)
    }

    /// Write a packed diff of the pages numbered `dirty` (strictly
    /// increasing) taken from `ram`, all of guest RAM (`ram_size` bytes).
    /// Returns the number of pages written.
    pub fn write_diff_from_ram(
        &mut self,
        ram: &[u8],
        dirty: impl IntoIterator<Item = u64>,
    ) -> Result<u64> {
        if ram.len() as u64 != self.meta.ram_size {
            return Err(Error::Usage(format!(
                "RAM buffer is {} bytes, the layer's RAM size is {}",
                ram.len(),
                self.meta.ram_size
            )));
        }
        let ps = self.meta.page_size as usize;
        let pages = ram.len() / ps;
        let mut v = Vec::new();
        for p in dirty {
            let Some(i) = usize::try_from(p).ok().filter(|&i| i < pages) else {
                return Err(Error::Usage(format!(
                    "dirty page {p} is beyond the {pages} pages of RAM"
                )));
            };
            v.push((p, &ram[i * ps..(i + 1) * ps]));
        }
        self.write_diff_memory(v)
    }

    /// Write the VMM's machine state (opaque bytes, at most
    /// [`crate::format::state::MAX_STATE_BYTES`]), wrapped in the `state.bin` envelope.
    pub fn write_state(&mut self, payload: &[u8]) -> Result<()> {
        if self.state.is_some() {
            return Err(Error::Usage(format!(
                "state of snapshot '{}' was already written",
                self.name
            )));
        }
        let header = encode_state_header(payload)
            .map_err(|e| Error::Usage(format!("state of snapshot '{}': {e}", self.name)))?;
        let (mut f, path) = self.create(STATE_FILE)?;
        f.write_all(&header).ctx(&path, "write")?;
        f.write_all(payload).ctx(&path, "write")?;
        let mut h = Sha256::new();
        h.update(header);
        h.update(payload);
        self.state = Some(FileEntry {
            size: (header.len() + payload.len()) as u64,
            sha256: hex(&h.finalize()),
        });
        Ok(())
    }

    /// Make the layer durable and visible: write `manifest.json`, make the
    /// files read-only, fsync every file, record the files' identity
    /// stamps and hashes in `verified.json` (so that
    /// [`crate::verify_chain_cached`] need not hash them again), fsync the
    /// work directory, rename the work directory to `NAME` (never
    /// replacing anything), fsync the store directory. On any error nothing
    /// is left under `NAME` and the work directory is removed. Memory and
    /// state must have been written.
    pub fn commit(self) -> Result<Layer> {
        self.commit_inner(true).map(|(layer, _)| layer)
    }

    /// Like [`SnapshotWriter::commit`], but does not wait (up to 50 ms) for
    /// the new files' timestamps to settle before recording `verified.json`:
    /// the layer is durable and visible when this returns, and the returned
    /// thread records the cache once the timestamps have settled. Join it
    /// before the process exits, or the first restore hashes the layer's
    /// files instead of trusting the cache (never a correctness problem).
    pub fn commit_cache_later(self) -> Result<(Layer, std::thread::JoinHandle<()>)> {
        let (layer, files) = self.commit_inner(false)?;
        let dir = layer.dir.clone();
        let name = layer.name.clone();
        let handle = std::thread::Builder::new()
            .name("vmstore-cache".into())
            .spawn(move || {
                let files: Vec<(&str, &str)> =
                    files.iter().map(|(f, h)| (f.as_str(), h.as_str())).collect();
                // Off the critical path: wait for every file to settle.
                if let Err(e) = record_written(&dir, &files, Some(0), &SystemClock) {
                    tracing::warn!(
                        "snapshot '{name}': {VERIFIED_FILE} not written ({e}); the first restore hashes every file"
                    );
                }
            })
            .map_err(|e| Error::io(&layer.dir, "spawn cache thread", e))?;
        Ok((layer, handle))
    }

    /// Commits; with `wait`, records `verified.json` before the rename
    /// (waiting for timestamps to settle), otherwise only for files that are
    /// already settled. Returns the layer and `(file, sha256)` of its files.
    fn commit_inner(mut self, wait: bool) -> Result<(Layer, Vec<(String, String)>)> {
        let Some((memory, diff_pages)) = self.memory.take() else {
            return Err(Error::Usage(format!(
                "snapshot '{}': no memory written",
                self.name
            )));
        };
        let Some(state) = self.state.take() else {
            return Err(Error::Usage(format!(
                "snapshot '{}': no state written",
                self.name
            )));
        };
        let disk = match self.disk.take() {
            None => None,
            Some(d) => Some(d.finish()?),
        };
        let mut m = self.meta.manifest(
            &self.name,
            memory,
            diff_pages,
            state,
            disk,
            crate::time::now_unix(),
        );
        m.seal();
        m.validate()
            .map_err(|e| Error::Usage(format!("snapshot '{}': {e}", self.name)))?;
        let bytes = m.to_bytes();
        let (mut f, path) = self.create(MANIFEST_FILE)?;
        f.write_all(&bytes).ctx(&path, "write")?;
        drop(f);

        let manifest_sha256 = hex(&sha256(&bytes));
        let mut files = vec![
            (MEMORY_FILE, m.memory.sha256.as_str()),
            (STATE_FILE, m.state.sha256.as_str()),
            (MANIFEST_FILE, manifest_sha256.as_str()),
        ];
        if let Some(d) = &m.disk {
            // Both are recorded with the disk's digest (see FORMAT.md).
            files.push((d.data_file(), d.sha256.as_str()));
            files.push((DISK_CHUNKS_FILE, d.sha256.as_str()));
        }
        // chmod first, fsync after: the fsyncs usually let the ctimes that
        // chmod sets settle before the stamps are recorded.
        for (file, _) in &files {
            set_readonly(&self.tmp.join(file))?;
        }
        for (file, _) in &files {
            sync_file(&self.tmp.join(file))?;
        }
        // The hashes were computed from the bytes written: record them, so
        // that the first restore need not hash the layer again. Optional:
        // without the cache, verification hashes.
        let wait_min_bytes = wait.then_some(COMMIT_WAIT_MIN_BYTES);
        if let Err(e) = record_written(&self.tmp, &files, wait_min_bytes, &SystemClock) {
            tracing::warn!(
                "snapshot '{}': {} not written ({e}); the first restore hashes every file",
                self.name,
                VERIFIED_FILE
            );
        }
        let dst = publish(
            &self.root,
            &self.tmp,
            &self.name,
            &self.meta,
            &mut self.finished,
        )?;
        let files = files
            .iter()
            .map(|(f, h)| (f.to_string(), h.to_string()))
            .collect();
        Ok((
            Layer {
                name: self.name.clone(),
                dir: dst,
                manifest: m,
                content_sha256: manifest_sha256,
            },
            files,
        ))
    }

    /// Give up: remove the work directory now and report failure to do so.
    pub fn abort(mut self) -> Result<()> {
        self.finished = true;
        if let Some(d) = self.disk.take() {
            let _ = d.finish();
        }
        std::fs::remove_dir_all(&self.tmp).ctx(&self.tmp, "remove work directory")
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Some(d) = self.disk.take() {
            let _ = d.finish();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.tmp) {
            tracing::warn!(
                "snapshot '{}': could not remove work directory {}: {e} (vmstore gc removes it later)",
                self.name,
                self.tmp.display()
            );
        }
    }
}
