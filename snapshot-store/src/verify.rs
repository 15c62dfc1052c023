//! Verification: links, sizes, headers, and the sha256 of every file.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, IoContext, Result};
use crate::hash::{hex, sha256_file, Sha256Digest};
use crate::manifest::{FileEntry, LayerKind, MAX_MANIFEST_BYTES};
use crate::restore::{check_diff_against_manifest, read_diff_prefix};
use crate::state::{parse_state_header, read_up_to, STATE_HEADER_LEN};
use crate::store::{check_link, Chain, Layer, Store};
use crate::{ProgressFn, DISK_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE};

/// What a successful verification covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Layers checked.
    pub layers: usize,
    /// Files hashed.
    pub files: usize,
    /// Bytes hashed.
    pub bytes_hashed: u64,
}

struct Job {
    path: PathBuf,
    size: u64,
    expect: String,
    owner: usize,
}

/// Check that `path` is a regular file of `entry.size` bytes.
fn check_file(layer: &Layer, file: &str, entry: &FileEntry) -> Result<PathBuf> {
    let path = layer.dir.join(file);
    let meta = match path.symlink_metadata() {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::corrupt(
                &path,
                format!(
                    "missing (listed in {MANIFEST_FILE} with {} bytes)",
                    entry.size
                ),
            ))
        }
        Err(e) => return Err(Error::io(&path, "stat", e)),
    };
    if !meta.is_file() {
        return Err(Error::corrupt(&path, "not a regular file"));
    }
    if meta.len() != entry.size {
        return Err(Error::corrupt(
            &path,
            format!(
                "is {} bytes, {MANIFEST_FILE} says {}",
                meta.len(),
                entry.size
            ),
        ));
    }
    Ok(path)
}

/// Cheap checks of one layer's files (presence, sizes, diff and state
/// headers); queue the hashing jobs.
fn layer_checks(layer: &Layer, owner: usize, jobs: &mut Vec<Job>) -> Result<()> {
    let m = &layer.manifest;
    let mpath = layer.dir.join(MANIFEST_FILE);
    let mlen = std::fs::symlink_metadata(&mpath).ctx(&mpath, "stat")?.len();
    if mlen > MAX_MANIFEST_BYTES as u64 {
        return Err(Error::corrupt(
            &mpath,
            "larger than the manifest size limit",
        ));
    }
    jobs.push(Job {
        path: mpath,
        size: mlen,
        expect: layer.content_sha256.clone(),
        owner,
    });

    let mem = check_file(layer, MEMORY_FILE, &m.memory)?;
    if m.kind == LayerKind::Diff {
        let f = File::open(&mem).ctx(&mem, "open")?;
        let (h, _) = read_diff_prefix(&f, &mem, m.memory.size)?;
        check_diff_against_manifest(layer, &h)?;
    }
    jobs.push(Job {
        path: mem,
        size: m.memory.size,
        expect: m.memory.sha256.clone(),
        owner,
    });

    let state = check_file(layer, STATE_FILE, &m.state)?;
    let mut head = [0u8; STATE_HEADER_LEN];
    let got =
        read_up_to(&mut File::open(&state).ctx(&state, "open")?, &mut head).ctx(&state, "read")?;
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
        size: m.state.size,
        expect: m.state.sha256.clone(),
        owner,
    });

    if let Some(disk) = &m.disk {
        let path = check_file(layer, DISK_FILE, disk)?;
        jobs.push(Job {
            path,
            size: disk.size,
            expect: disk.sha256.clone(),
            owner,
        });
    }
    Ok(())
}

/// Below this many bytes in total, files are hashed on the calling thread.
const PARALLEL_MIN_BYTES: u64 = 16 << 20;

fn run_job(job: &Job, progress: Option<ProgressFn<'_>>) -> Result<()> {
    let d: Sha256Digest = sha256_file(&job.path, job.size, progress)?;
    let found = hex(&d);
    if found == job.expect {
        Ok(())
    } else {
        Err(Error::corrupt(
            &job.path,
            format!(
                "sha256 mismatch: content is corrupted (expected {}, found {found})",
                job.expect
            ),
        ))
    }
}

/// Hash every job once, largest first, on up to 4 threads (one, the
/// caller's, for small totals); return the results in job order.
fn run_jobs(jobs: &[Job], progress: Option<ProgressFn<'_>>) -> Vec<Result<()>> {
    let total: u64 = jobs.iter().map(|j| j.size).sum();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
        .min(jobs.len().max(1));
    if threads == 1 || total < PARALLEL_MIN_BYTES {
        return jobs.iter().map(|j| run_job(j, progress)).collect();
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(jobs[i].size));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<()>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = order.get(k) else { break };
                let r = run_job(&jobs[i], progress);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| Err(Error::Usage("file was not hashed".into())))
        })
        .collect()
}

/// Verify a resolved chain before a guest runs on it: parent links and
/// machine geometry along the chain, every file present with the size in
/// its manifest, diff headers and indexes and state headers well-formed
/// and consistent with their manifests, and the sha256 of every file
/// (manifests included, against the content hashes the chain was resolved
/// with). Each file is hashed once; files are hashed in parallel. Returns
/// the first problem in chain order.
pub fn verify_chain(chain: &Chain) -> Result<VerifyReport> {
    verify_chain_with_progress(chain, None)
}

/// [`verify_chain`] with progress reports for large files.
pub fn verify_chain_with_progress(
    chain: &Chain,
    progress: Option<ProgressFn<'_>>,
) -> Result<VerifyReport> {
    let layers = chain.layers();
    for w in layers.windows(2) {
        check_link(&w[0], &w[1])?;
    }
    let mut jobs = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        layer_checks(layer, i, &mut jobs)?;
    }
    for r in run_jobs(&jobs, progress) {
        r?;
    }
    Ok(VerifyReport {
        layers: layers.len(),
        files: jobs.len(),
        bytes_hashed: jobs.iter().map(|j| j.size).sum(),
    })
}

impl Store {
    /// Verify every layer in the store: its manifest, its link to its
    /// parent (presence, content hash, geometry), and all of its files as
    /// in [`verify_chain`]. Each file in the store is hashed once. Returns
    /// one result per layer, in name order.
    pub fn verify_all(
        &self,
        progress: Option<ProgressFn<'_>>,
    ) -> Result<Vec<(String, Result<VerifyReport>)>> {
        let names = self.layer_names()?;
        let mut outcome: Vec<Result<VerifyReport>> = Vec::with_capacity(names.len());
        let mut jobs = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let r = self.layer(name).and_then(|layer| {
                if let Some(p) = &layer.manifest.parent {
                    if !self.contains(&p.name) {
                        return Err(Error::Chain(format!(
                            "'{name}' needs its parent '{}', which is not in store {}",
                            p.name,
                            self.root().display()
                        )));
                    }
                    let parent = self.layer(&p.name)?;
                    check_link(&parent, &layer)?;
                }
                let before = jobs.len();
                if let Err(e) = layer_checks(&layer, i, &mut jobs) {
                    jobs.truncate(before);
                    return Err(e);
                }
                Ok(VerifyReport {
                    layers: 1,
                    files: jobs.len() - before,
                    bytes_hashed: jobs[before..].iter().map(|j| j.size).sum(),
                })
            });
            outcome.push(r);
        }
        for (job, r) in jobs.iter().zip(run_jobs(&jobs, progress)) {
            if let Err(e) = r {
                if outcome[job.owner].is_ok() {
                    outcome[job.owner] = Err(e);
                }
            }
        }
        Ok(names.into_iter().zip(outcome).collect())
    }
}
