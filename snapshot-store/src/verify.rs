//! Verification: links, sizes, headers, and the sha256 of every file,
//! optionally skipping files that a layer's verified-file cache
//! (`verified.json`, see `cache.rs`) vouches for.

use std::fs::{File, Metadata};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::cache::{self, Clock, SystemClock};
use crate::error::{Error, IoContext, Result};
use crate::file_hash::{hash_disk, memory_digest_file, sha256_open_file, ChunkHasher};
use crate::format::chunks::{chunk_range, disk_chunk_count, disk_chunks_file_size, disk_digest};
use crate::format::manifest::{DiskEntry, LayerKind, MAX_MANIFEST_BYTES};
use crate::format::state::{parse_state_header, STATE_HEADER_LEN};
use crate::format::verified::{CacheEntry, Entries, Stamp, VERIFIED_FILE};
use crate::format::{DISK_CHUNKS_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE};
use crate::fsutil::{is_not_found, open_regular, Links};
use crate::hash::hex;
use crate::layer::{check_link, Chain, Layer};
use crate::progress::ProgressFn;
use crate::readers::{
    check_diff_against_manifest, check_disk_chunks_file, read_diff_prefix, read_disk_chunks,
    read_disk_diff_prefix, read_up_to,
};
use crate::store::Store;

/// How the sha256 of a verified file was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashSource {
    /// The file was read and hashed.
    Hashed,
    /// The layer's `verified.json` vouched for the file: its identity stamp
    /// (device, inode, size, mtime, ctime) is the one it had when it was
    /// last hashed or written, and the sha256 recorded then is the
    /// manifest's. Not read.
    Cache,
}

/// One file covered by a successful verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCheck {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Whether it was hashed or trusted from the cache.
    pub source: HashSource,
}

/// What a successful verification covered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Layers checked.
    pub layers: usize,
    /// Files checked (hashed or trusted from the cache), manifests
    /// included.
    pub files: usize,
    /// Bytes hashed.
    pub bytes_hashed: u64,
    /// Files hashed.
    pub files_hashed: usize,
    /// Files trusted from the layers' `verified.json` without hashing.
    pub files_cached: usize,
    /// Bytes in the files trusted from the cache.
    pub bytes_cached: u64,
    /// Every file checked, in chain order, with how.
    pub checked: Vec<FileCheck>,
    /// Problems with the verified-file caches, one line each: a cache that
    /// was ignored (unreadable, malformed, too large) or could not be
    /// updated (read-only store). They never fail a verification; they
    /// only mean more hashing.
    pub cache_notes: Vec<String>,
}

/// What a job checks about its file.
enum Check {
    /// The sha256 of the whole file equals the job's `expect`.
    File,
    /// `memory.bin`: its [`crate::format::memory::MemoryDigest`] equals the job's `expect`.
    Memory,
    /// `disk.chunks`: well-formed, agrees with the manifest's disk entry,
    /// and its digest list hashes to `expect`.
    ChunkList(DiskEntry),
    /// `disk.img`: its chunk digests (holes skipped as zeros) hash to
    /// `expect`; on a mismatch the first chunk whose digest differs from
    /// the list at `list` is named.
    Disk { list: PathBuf, entry: DiskEntry },
    /// `disk.diff`: each chunk it stores hashes to its digest in the list
    /// at `list` (which hashes to `expect`), and every other chunk's digest
    /// there is the parent's (the list at `parent_list`).
    DiskDiff {
        list: PathBuf,
        entry: DiskEntry,
        parent_list: PathBuf,
        parent_entry: DiskEntry,
    },
}

struct Job {
    path: PathBuf,
    file: &'static str,
    size: u64,
    expect: String,
    check: Check,
    owner: usize,
    /// From the `lstat` of the cheap checks; what the cache is asked about.
    stamp: Stamp,
}

/// The result of checking one file's sha256.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Trusted from the cache.
    Cached,
    /// Hashed; the stamp to record, if the file did not change while it
    /// was hashed and its ctime is settled.
    Hashed(Option<Stamp>),
}

/// A layer's verified-file cache as loaded.
struct LayerCache {
    dir: PathBuf,
    entries: Entries,
    note: Option<String>,
}

impl LayerCache {
    fn load(layer: &Layer) -> LayerCache {
        let (entries, note) = cache::load(&layer.dir);
        LayerCache {
            dir: layer.dir.clone(),
            entries,
            note,
        }
    }
}

/// Open the layer's `file` and check, through the descriptor, that it is
/// a regular file of `size` bytes.
fn check_file(layer: &Layer, file: &str, size: u64) -> Result<(PathBuf, File, Metadata)> {
    let path = layer.dir.join(file);
    let f = match open_regular(&path, Links::Refuse) {
        Ok(f) => f,
        Err(e) if is_not_found(&e) => {
            return Err(Error::corrupt(
                &path,
                format!("missing ({MANIFEST_FILE} implies {size} bytes)"),
            ))
        }
        Err(e) => return Err(e),
    };
    let meta = f.metadata().ctx(&path, "stat")?;
    if meta.len() != size {
        return Err(Error::corrupt(
            &path,
            format!("is {} bytes, {MANIFEST_FILE} says {size}", meta.len()),
        ));
    }
    Ok((path, f, meta))
}

/// Cheap checks of one layer's files (presence, sizes, diff and state
/// headers); queue the hashing jobs. `parent`: the layer's parent (needed
/// for a disk stored as a diff).
fn layer_checks(
    layer: &Layer,
    parent: Option<&Layer>,
    owner: usize,
    jobs: &mut Vec<Job>,
) -> Result<()> {
    let m = &layer.manifest;
    let mpath = layer.dir.join(MANIFEST_FILE);
    let mmeta = open_regular(&mpath, Links::Refuse)?
        .metadata()
        .ctx(&mpath, "stat")?;
    if mmeta.len() > MAX_MANIFEST_BYTES as u64 {
        return Err(Error::corrupt(
            &mpath,
            "larger than the manifest size limit",
        ));
    }
    jobs.push(Job {
        path: mpath,
        file: MANIFEST_FILE,
        size: mmeta.len(),
        expect: layer.content_sha256.clone(),
        check: Check::File,
        owner,
        stamp: Stamp::of(&mmeta),
    });

    let (mem, f, meta) = check_file(layer, MEMORY_FILE, m.memory.size)?;
    if m.kind == LayerKind::Diff {
        let (h, _) = read_diff_prefix(&f, &mem, m.memory.size)?;
        check_diff_against_manifest(m, &mem, &h)?;
    }
    jobs.push(Job {
        path: mem,
        file: MEMORY_FILE,
        size: m.memory.size,
        expect: m.memory.sha256.clone(),
        check: Check::Memory,
        owner,
        stamp: Stamp::of(&meta),
    });

    let (state, mut f, meta) = check_file(layer, STATE_FILE, m.state.size)?;
    let mut head = [0u8; STATE_HEADER_LEN];
    let got = read_up_to(&mut f, &mut head).ctx(&state, "read")?;
    let sh = parse_state_header(&head[..got]).map_err(|e| Error::corrupt(&state, e.0))?;
    if STATE_HEADER_LEN as u64 + sh.payload_len != m.state.size {
        return Err(Error::corrupt(
            &state,
            format!(
                "header announces a {}-byte payload, which does not fit the file size {}",
                sh.payload_len, m.state.size
            ),
        ));
    }
    jobs.push(Job {
        path: state,
        file: STATE_FILE,
        size: m.state.size,
        expect: m.state.sha256.clone(),
        check: Check::File,
        owner,
        stamp: Stamp::of(&meta),
    });

    if let Some(disk) = &m.disk {
        disk_checks(layer, disk, parent, owner, jobs)?;
    }
    Ok(())
}

/// The checks of a layer's disk (`disk.chunks`, and `disk.img` or
/// `disk.diff`); queue their hashing jobs.
fn disk_checks(
    layer: &Layer,
    disk: &DiskEntry,
    parent: Option<&Layer>,
    owner: usize,
    jobs: &mut Vec<Job>,
) -> Result<()> {
    // The manifest's geometry was checked when it was parsed.
    let list_size = disk_chunks_file_size(disk_chunk_count(disk.size, disk.chunk_size));
    let (list, _, meta) = check_file(layer, DISK_CHUNKS_FILE, list_size)?;
    jobs.push(Job {
        path: list.clone(),
        file: DISK_CHUNKS_FILE,
        size: list_size,
        expect: disk.sha256.clone(),
        check: Check::ChunkList(disk.clone()),
        owner,
        stamp: Stamp::of(&meta),
    });
    let file = disk.data_file();
    let (path, f, meta) = check_file(layer, file, disk.data_file_size())?;
    let check = if disk.diff_chunks.is_some() {
        read_disk_diff_prefix(&f, &path, disk)?;
        let Some((p, p_entry)) = parent.and_then(|p| Some((p, p.manifest.disk.clone()?))) else {
            return Err(Error::Chain(format!(
                "'{}' stores its disk as a diff, but its parent's disk is not at hand",
                layer.name
            )));
        };
        Check::DiskDiff {
            list,
            entry: disk.clone(),
            parent_list: p.dir.join(DISK_CHUNKS_FILE),
            parent_entry: p_entry,
        }
    } else {
        Check::Disk {
            list,
            entry: disk.clone(),
        }
    };
    jobs.push(Job {
        path,
        file,
        size: disk.data_file_size(),
        expect: disk.sha256.clone(),
        check,
        owner,
        stamp: Stamp::of(&meta),
    });
    Ok(())
}

/// Below this many bytes in total, files are hashed on the calling thread.
const PARALLEL_MIN_BYTES: u64 = 16 << 20;
/// Most hashing threads (each with a 1 MiB read buffer).
const MAX_HASH_THREADS: usize = 4;

/// Hash one file and compare with the manifest. Returns the stamp to
/// record in the cache, if any: the file's stamp when it was opened, if it
/// was the same after hashing and settled relative to a reading of `clock`
/// taken before it was opened ([`cache::recordable`]).
fn hash_job(
    job: &Job,
    progress: Option<ProgressFn<'_>>,
    clock: &dyn Clock,
) -> Result<Option<Stamp>> {
    let t0 = clock.now_ns();
    // Opened again, checked again: the file may have been replaced since
    // the layer's checks.
    let f = open_regular(&job.path, Links::Refuse)?;
    let before = f.metadata().ctx(&job.path, "stat")?;
    match &job.check {
        Check::File | Check::Memory => {
            let found = hex(&if matches!(job.check, Check::Memory) {
                memory_digest_file(&f, &job.path, job.size, progress)?
            } else {
                sha256_open_file(&f, &job.path, job.size, progress)?
            });
            if found != job.expect {
                return Err(Error::corrupt(
                    &job.path,
                    format!(
                        "sha256 mismatch: content is corrupted (expected {}, found {found})",
                        job.expect
                    ),
                ));
            }
        }
        Check::ChunkList(entry) => {
            check_disk_chunks_file(&f, &job.path, entry)?;
        }
        Check::Disk { list, entry } => check_disk(&f, job, list, entry, progress)?,
        Check::DiskDiff {
            list,
            entry,
            parent_list,
            parent_entry,
        } => {
            let lists = (list.as_path(), parent_list.as_path());
            check_disk_diff(&f, job, lists, (entry, parent_entry), progress)?;
        }
    }
    let after = f.metadata().ctx(&job.path, "stat")?;
    Ok(cache::recordable(Stamp::of(&before), Stamp::of(&after), t0))
}

/// Hash the disk image `f` of `job` in chunks and compare with the
/// manifest; on a mismatch, name the first chunk that differs from the
/// digest list at `list` (if that list is itself intact).
fn check_disk(
    f: &File,
    job: &Job,
    list: &Path,
    entry: &DiskEntry,
    progress: Option<ProgressFn<'_>>,
) -> Result<()> {
    let (digests, _) = hash_disk(f, &job.path, job.size, entry.chunk_size, progress)?;
    let found = hex(&disk_digest(&digests));
    if found == job.expect {
        return Ok(());
    }
    let first_bad = read_disk_chunks(list, entry).ok().and_then(|l| {
        let i = l.digests.iter().zip(&digests).position(|(a, b)| a != b)?;
        Some(i as u64)
    });
    Err(Error::corrupt(
        &job.path,
        match first_bad {
            Some(i) => {
                let r = chunk_range(i, entry.chunk_size, entry.size);
                format!(
                    "sha256 mismatch in chunk {i} (bytes {}..{}): content is corrupted (its digest differs from {})",
                    r.start,
                    r.end,
                    list.display()
                )
            }
            None => format!(
                "sha256 mismatch: content is corrupted (disk digest expected {}, found {found})",
                job.expect
            ),
        },
    ))
}

/// Check the `disk.diff` `f` of `job`: each chunk it stores hashes to its
/// digest in the layer's list (`lists.0`, checked against the manifest's
/// `entries.0`), the padding after a short last chunk is zeros, and every
/// other chunk has the parent's digest (the list `lists.1`, checked
/// against the parent's `entries.1`). Errors name the chunk.
fn check_disk_diff(
    f: &File,
    job: &Job,
    (list, parent_list): (&Path, &Path),
    (entry, parent_entry): (&DiskEntry, &DiskEntry),
    progress: Option<ProgressFn<'_>>,
) -> Result<()> {
    let own = read_disk_chunks(list, entry)?.digests;
    let parent = read_disk_chunks(parent_list, parent_entry)?.digests;
    if own.len() != parent.len() {
        return Err(Error::corrupt(
            list,
            format!(
                "lists {} chunks, the parent's {} lists {}",
                own.len(),
                parent_list.display(),
                parent.len()
            ),
        ));
    }
    let (h, index) = read_disk_diff_prefix(f, &job.path, entry)?;
    let mut hasher = ChunkHasher::new(f, &job.path, job.size, entry.chunk_size, progress);
    for (i, &c) in index.iter().enumerate() {
        let r = chunk_range(c, entry.chunk_size, entry.size);
        let (at, len) = (h.slot_offset(i as u64), r.end - r.start);
        if hasher.hash_bytes(at, len)? != own[c as usize] {
            return Err(Error::corrupt(
                &job.path,
                format!(
                    "sha256 mismatch in chunk {c} (disk bytes {}..{}, slot {i}): content is corrupted (its digest differs from {})",
                    r.start,
                    r.end,
                    list.display()
                ),
            ));
        }
        if len < entry.chunk_size {
            let mut tail = vec![0u8; (entry.chunk_size - len) as usize];
            f.read_exact_at(&mut tail, at + len)
                .ctx(&job.path, "read")?;
            if tail.iter().any(|&b| b != 0) {
                return Err(Error::corrupt(
                    &job.path,
                    format!("non-zero bytes after the disk's end in slot {i}"),
                ));
            }
        }
    }
    let mut stored = index.iter().copied().peekable();
    for (c, (a, b)) in own.iter().zip(&parent).enumerate() {
        if stored.next_if_eq(&(c as u64)).is_none() && a != b {
            return Err(Error::corrupt(
                list,
                format!(
                    "chunk {c} is not in {}, but its digest differs from the parent's ({})",
                    job.path.display(),
                    parent_list.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Hash the jobs numbered `which` once each, largest first, on up to
/// [`MAX_HASH_THREADS`] threads (one, the caller's, for small totals);
/// return the results in the order of `which`.
fn run_jobs(
    jobs: &[Job],
    which: &[usize],
    progress: Option<ProgressFn<'_>>,
    clock: &dyn Clock,
) -> Vec<Result<Option<Stamp>>> {
    let total: u64 = which.iter().map(|&i| jobs[i].size).sum();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_HASH_THREADS)
        .min(which.len().max(1));
    if threads == 1 || total < PARALLEL_MIN_BYTES {
        return which
            .iter()
            .map(|&i| hash_job(&jobs[i], progress, clock))
            .collect();
    }
    let mut order: Vec<usize> = (0..which.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(jobs[which[k]].size));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Option<Stamp>>>>> =
        which.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(&k) = order.get(n) else { break };
                let r = hash_job(&jobs[which[k]], progress, clock);
                *results[k].lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .unwrap_or(Err(Error::Panicked("a hashing thread")))
        })
        .collect()
}

/// Check every job's sha256: trusted from its layer's cache where
/// `use_cache` and the cache vouches for it, hashed otherwise (stamps to
/// record judged by `clock`). Results in job order.
fn check_jobs(
    jobs: &[Job],
    caches: &[LayerCache],
    use_cache: bool,
    progress: Option<ProgressFn<'_>>,
    clock: &dyn Clock,
) -> Vec<Result<Outcome>> {
    let trusted: Vec<bool> = jobs
        .iter()
        .map(|j| use_cache && cache::vouches(&caches[j.owner].entries, j.file, &j.stamp, &j.expect))
        .collect();
    let which: Vec<usize> = (0..jobs.len()).filter(|&i| !trusted[i]).collect();
    let mut hashed = run_jobs(jobs, &which, progress, clock).into_iter();
    trusted
        .iter()
        .map(|&t| {
            if t {
                Ok(Outcome::Cached)
            } else {
                match hashed.next() {
                    Some(r) => r.map(Outcome::Hashed),
                    None => Err(Error::Panicked("a hashing thread")),
                }
            }
        })
        .collect()
}

/// After every file of a layer verified: write its cache if it would
/// change (new stamps recorded, stale or bad entries dropped). Returns a
/// note if the cache could not be written.
fn refresh_cache(cache: &LayerCache, checked: &[(&Job, Outcome)]) -> Option<String> {
    let mut new = Entries::new();
    for (job, outcome) in checked {
        let entry = match outcome {
            Outcome::Cached => cache.entries.get(job.file).cloned(),
            Outcome::Hashed(Some(stamp)) => Some(CacheEntry::new(*stamp, &job.expect)),
            Outcome::Hashed(None) => None,
        };
        if let Some(e) = entry {
            new.insert(job.file.to_string(), e);
        }
    }
    if new == cache.entries && cache.note.is_none() {
        return None;
    }
    match cache::write_entries(&cache.dir, &new) {
        Ok(()) => None,
        Err(e) => {
            let note = format!("{e}; {} not updated", VERIFIED_FILE);
            tracing::debug!("{note}");
            Some(note)
        }
    }
}

/// The report for `checked`, covering `layers` layers.
fn report(layers: usize, checked: &[(&Job, Outcome)], cache_notes: Vec<String>) -> VerifyReport {
    let mut r = VerifyReport {
        layers,
        files: checked.len(),
        cache_notes,
        ..VerifyReport::default()
    };
    for (job, outcome) in checked {
        let source = match outcome {
            Outcome::Cached => {
                r.files_cached += 1;
                r.bytes_cached += job.size;
                HashSource::Cache
            }
            Outcome::Hashed(_) => {
                r.files_hashed += 1;
                r.bytes_hashed += job.size;
                HashSource::Hashed
            }
        };
        r.checked.push(FileCheck {
            path: job.path.clone(),
            size: job.size,
            source,
        });
    }
    r
}

/// Verify a resolved chain before a guest runs on it: parent links and
/// machine geometry along the chain, every file present with the size in
/// its manifest, diff headers and indexes and state headers well-formed
/// and consistent with their manifests, and the sha256 of every file
/// (manifests included, against the content hashes the chain was resolved
/// with). Each file is hashed once; files are hashed in parallel. Returns
/// the first problem in chain order.
///
/// Always hashes every file (this is `vmstore verify`); on success it
/// records what it verified in each layer's `verified.json` for
/// [`verify_chain_cached`]. On failure nothing in the store changes.
pub fn verify_chain(chain: &Chain) -> Result<VerifyReport> {
    verify_chain_with_progress(chain, None)
}

/// [`verify_chain`] with progress reports for large files.
pub fn verify_chain_with_progress(
    chain: &Chain,
    progress: Option<ProgressFn<'_>>,
) -> Result<VerifyReport> {
    verify_chain_impl(chain.layers(), 0, false, progress, &SystemClock)
}

/// [`verify_chain`] for the restore path, at a cost that does not grow
/// with RAM in the common case: every check is made, but a file whose
/// layer's `verified.json` vouches for it (same device, inode, size, mtime
/// and ctime as when it was last hashed or written by
/// [`crate::SnapshotWriter::commit`], and the sha256 recorded then equal to
/// the manifest's) is not re-hashed. Any other file is hashed, and on
/// success the caches are refreshed. The report says which files were
/// hashed and which were trusted.
///
/// This detects any change made to a file through the file system since
/// it was last verified, including one that restores its mtime, since
/// every write updates the ctime and ctime cannot be set. It does not
/// detect corruption below the file system (media or firmware errors that
/// change data without a write) in files it trusts, nor a forged cache
/// written by someone who can write the store; `vmstore verify` (always a
/// full hash) does. See `FORMAT.md`, "Verified-file cache".
pub fn verify_chain_cached(chain: &Chain) -> Result<VerifyReport> {
    verify_chain_cached_with_progress(chain, None)
}

/// [`verify_chain_cached`] with progress reports for large files that are
/// hashed.
pub fn verify_chain_cached_with_progress(
    chain: &Chain,
    progress: Option<ProgressFn<'_>>,
) -> Result<VerifyReport> {
    verify_chain_impl(chain.layers(), 0, true, progress, &SystemClock)
}

/// [`verify_chain`] of the top layer of `chain` only (a layer being
/// imported, whose parents are already in the store): every check of its
/// files, hashing all of them; its link to its parent was checked when the
/// chain was built. Records its `verified.json`.
pub(crate) fn verify_top_layer(
    chain: &Chain,
    progress: Option<ProgressFn<'_>>,
) -> Result<VerifyReport> {
    verify_chain_impl(
        chain.layers(),
        chain.len() - 1,
        false,
        progress,
        &SystemClock,
    )
}

/// [`verify_chain`] (`use_cache` false) or [`verify_chain_cached`] of the
/// layers of a chain from `from` on (the layers below are their parents),
/// with the stamps that may be recorded judged by `clock`.
fn verify_chain_impl(
    chain: &[Layer],
    from: usize,
    use_cache: bool,
    progress: Option<ProgressFn<'_>>,
    clock: &dyn Clock,
) -> Result<VerifyReport> {
    // Parent links were checked when the chain was built (`Chain::new`).
    let layers = &chain[from..];
    let mut jobs = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let parent = (from + i).checked_sub(1).map(|p| &chain[p]);
        layer_checks(layer, parent, i, &mut jobs)?;
    }
    let caches: Vec<LayerCache> = layers.iter().map(LayerCache::load).collect();
    let mut checked = Vec::with_capacity(jobs.len());
    for (job, r) in jobs
        .iter()
        .zip(check_jobs(&jobs, &caches, use_cache, progress, clock))
    {
        checked.push((job, r?));
    }
    let mut notes = Vec::new();
    for (i, c) in caches.iter().enumerate() {
        notes.extend(c.note.clone());
        let mine: Vec<(&Job, Outcome)> = checked
            .iter()
            .filter(|(j, _)| j.owner == i)
            .copied()
            .collect();
        notes.extend(refresh_cache(c, &mine));
    }
    Ok(report(layers.len(), &checked, notes))
}

impl Store {
    /// Verify every layer in the store: its manifest, its link to its
    /// parent (presence, content hash, geometry), and all of its files as
    /// in [`verify_chain`] (always hashed; each file in the store once).
    /// Layers that verify have their `verified.json` refreshed. Returns one
    /// result per layer, in name order.
    pub fn verify_all(
        &self,
        progress: Option<ProgressFn<'_>>,
    ) -> Result<Vec<(String, Result<VerifyReport>)>> {
        let names = self.layer_names()?;
        let mut outcome: Vec<Result<LayerCache>> = Vec::with_capacity(names.len());
        let mut jobs = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let r = self.layer(name).and_then(|layer| {
                let mut parent = None;
                if let Some(p) = &layer.manifest.parent {
                    if !self.contains(&p.name) {
                        return Err(Error::MissingParent {
                            layer: name.clone(),
                            parent: p.name.clone(),
                            store: self.root().to_path_buf(),
                        });
                    }
                    let p = self.layer(&p.name)?;
                    check_link(&p, &layer)?;
                    parent = Some(p);
                }
                let before = jobs.len();
                if let Err(e) = layer_checks(&layer, parent.as_ref(), i, &mut jobs) {
                    jobs.truncate(before);
                    return Err(e);
                }
                Ok(LayerCache::load(&layer))
            });
            outcome.push(r);
        }
        let no_caches: Vec<LayerCache> = Vec::new();
        let results = check_jobs(&jobs, &no_caches, false, progress, &SystemClock);
        let mut checked: Vec<Vec<(&Job, Outcome)>> = names.iter().map(|_| Vec::new()).collect();
        let mut failed: Vec<Option<Error>> = names.iter().map(|_| None).collect();
        for (job, r) in jobs.iter().zip(results) {
            match r {
                Ok(o) => checked[job.owner].push((job, o)),
                Err(e) => {
                    failed[job.owner].get_or_insert(e);
                }
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for (((name, layer), mine), fail) in names.into_iter().zip(outcome).zip(checked).zip(failed)
        {
            let r = match (layer, fail) {
                (Err(e), _) | (Ok(_), Some(e)) => Err(e),
                (Ok(c), None) => {
                    let mut notes: Vec<String> = c.note.iter().cloned().collect();
                    notes.extend(refresh_cache(&c, &mine));
                    Ok(report(1, &mine, notes))
                }
            };
            out.push((name, r));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::FakeClock;
    use crate::layer::LayerMeta;

    /// A store with one small full layer `g`, and the newest ctime of its
    /// files.
    fn store() -> (tempfile::TempDir, Store, i128) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::create(d.path().join("s")).unwrap();
        let meta = LayerMeta {
            parent: None,
            page_size: 4096,
            ram_base_gpa: 0x4000_0000,
            ram_size: 4 * 4096,
            vcpus: 1,
            backend: "emu".into(),
            gic_mode: "userspace".into(),
            creator: "test".into(),
        };
        let mut w = s.begin("g", meta).unwrap();
        w.write_full_memory(&[7u8; 4 * 4096]).unwrap();
        w.write_state(b"state").unwrap();
        let g = w.commit().unwrap();
        let newest = [MANIFEST_FILE, MEMORY_FILE, STATE_FILE]
            .iter()
            .map(|f| Stamp::of(&std::fs::symlink_metadata(g.dir.join(f)).unwrap()).ctime_ns)
            .max()
            .unwrap();
        (d, s, newest)
    }

    /// The files `g`'s `verified.json` has entries for.
    fn recorded(s: &Store) -> Vec<String> {
        cache::load(&s.root().join("g")).0.into_keys().collect()
    }

    #[test]
    fn a_verification_records_only_settled_stamps() {
        let (_d, s, newest) = store();
        let chain = s.resolve("g").unwrap();
        // Files changed just before the clock read: verified, but not
        // recorded (a change in the same clock tick would keep the ctime).
        let r = verify_chain_impl(
            chain.layers(),
            0,
            false,
            None,
            &FakeClock::at(newest + 1_000_000),
        );
        assert_eq!(r.unwrap().files_hashed, 3);
        assert!(recorded(&s).is_empty());
        // A clock behind the files' ctimes (stepped back): not recorded.
        let behind = FakeClock::at(newest - 1_000_000_000);
        verify_chain_impl(chain.layers(), 0, false, None, &behind).unwrap();
        assert!(recorded(&s).is_empty());
        // Settled: every file is recorded, and a cached verification then
        // hashes nothing.
        let later = FakeClock::at(newest + 3_000_000_000);
        verify_chain_impl(chain.layers(), 0, false, None, &later).unwrap();
        assert_eq!(recorded(&s), [MANIFEST_FILE, MEMORY_FILE, STATE_FILE]);
        let r = verify_chain_impl(chain.layers(), 0, true, None, &later).unwrap();
        assert_eq!((r.files_cached, r.files_hashed), (3, 0), "{r:?}");
        // The full verification never trusts the cache.
        let r = verify_chain_impl(chain.layers(), 0, false, None, &later).unwrap();
        assert_eq!((r.files_cached, r.files_hashed), (0, 3), "{r:?}");
    }
}
