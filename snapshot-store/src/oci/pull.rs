//! `vmstore pull`: a chain from a registry into a store. The tag's OCI
//! manifest and its `subject`s are followed down to the full layer and
//! checked (artifact layout, the store's manifest checks, the parent links
//! by content hash) before any blob is fetched; the layers the store does
//! not have are downloaded into work directories, every blob checked
//! against its digest as it arrives, then committed base first with the
//! store's own verification ([`crate::LayerImport::commit`]). A blob that
//! fails its digest, or a request that fails a transfer limit, stops the
//! pull before anything is committed. A blob is never read past the size
//! its descriptor declares, and a declared size must fit the layer's file
//! (exactly, or for a zstd blob within zstd's bound for that file).

use std::time::Instant;

use crate::format::chunks::{disk_chunk_count, disk_chunks_file_size};
use crate::format::manifest::{
    listed_files, parse_manifest, LayerKind, Manifest, MAX_MANIFEST_BYTES,
};
use crate::format::{
    DISK_CHUNKS_FILE, DISK_DIFF_FILE, DISK_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE,
};
use crate::hash::{hex, sha256};
use crate::import::LayerImport;
use crate::name::validate_name;
use crate::store::{Store, MAX_CHAIN_DEPTH};

use super::blobio::{Receiver, Tag};
use super::client::{scopes, Registry};
use super::layout::{digest_hex, ArtifactManifest, Compression, FileBlob};
use super::{block_on, io_err, Connection, Event, EventFn, RegistryError};

/// How to pull.
#[derive(Clone, Default)]
pub struct PullOptions {
    /// Registry connection (HTTPS or plain HTTP, credentials).
    pub connection: Connection,
    /// Store the top layer under this name instead of its own (`--as`).
    /// Its `manifest.json` is rewritten with the new name and sealed again,
    /// so its content hash differs from the pushed one; the layers below
    /// keep their names.
    pub rename_top: Option<String>,
    /// Progress events.
    pub progress: Option<EventFn>,
}

/// One layer of a pulled chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledLayer {
    /// Snapshot name in the store.
    pub name: String,
    /// `sha256:HEX` of its OCI manifest.
    pub manifest_digest: String,
    /// Its content hash in the store (sha256 of `manifest.json`, hex).
    pub content_sha256: String,
    /// `false` if the store already had it (nothing fetched).
    pub pulled: bool,
    /// Blob bytes received for it.
    pub bytes_received: u64,
    /// Bytes of its files written.
    pub file_bytes: u64,
    /// Transport compression of its blobs.
    pub compression: Compression,
}

/// What [`pull`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct PullReport {
    /// The reference pulled.
    pub reference: String,
    /// `sha256:HEX` of the top layer's OCI manifest.
    pub digest: String,
    /// The top layer's name in the store (a restore spec for the chain).
    pub name: String,
    /// Layers, base first.
    pub layers: Vec<PulledLayer>,
    /// Blob bytes received.
    pub bytes_received: u64,
    /// Bytes of layer files written.
    pub file_bytes: u64,
    /// Seconds spent downloading (blobs received, hashed, decompressed and
    /// written).
    pub download_seconds: f64,
    /// Seconds spent verifying and committing.
    pub commit_seconds: f64,
    /// Seconds for the whole pull.
    pub seconds: f64,
}

/// One layer as found in the registry.
struct Remote {
    manifest_digest: String,
    files: Vec<FileBlob>,
    config: Vec<u8>,
    manifest: Manifest,
}

/// Pull `reference` (`REGISTRY/REPOSITORY:TAG` or `@DIGEST`) into `store`.
/// Blocking. On error nothing is committed, except that when the store's
/// own checks refuse a layer after its blobs verified, the layers below it
/// stay committed (each a valid chain).
pub fn pull(
    store: &Store,
    reference: &str,
    opts: &PullOptions,
) -> Result<PullReport, RegistryError> {
    let t0 = Instant::now();
    if let Some(n) = &opts.rename_top {
        validate_name(n)?;
    }
    block_on(async {
        let reg = Registry::connect(reference, &opts.connection, |r| {
            scopes(r.repository(), false, None)
        })
        .await?;
        stage(opts, &format!("resolving {reference}"));
        let mut chain = fetch_chain(&reg).await?;
        if let Some(new) = &opts.rename_top {
            rename_top(&mut chain, new, reference)?;
        }
        let mut report = PullReport {
            reference: reference.to_string(),
            digest: chain
                .last()
                .map(|r| r.manifest_digest.clone())
                .unwrap_or_default(),
            name: chain
                .last()
                .map(|r| r.manifest.name.clone())
                .unwrap_or_default(),
            layers: Vec::new(),
            bytes_received: 0,
            file_bytes: 0,
            download_seconds: 0.0,
            commit_seconds: 0.0,
            seconds: 0.0,
        };
        // Download every missing layer first, so that a bad blob stops the
        // pull before anything is committed.
        let t = Instant::now();
        let pending = download_missing(store, &reg, &chain, opts, &mut report).await?;
        report.download_seconds = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for (imp, content) in pending {
            stage(opts, &format!("verifying and committing {}", imp.name()));
            imp.commit(&content, None)?;
        }
        report.commit_seconds = t.elapsed().as_secs_f64();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    })
}

/// Gives the top layer of `chain` (pulled from `reference`) the name
/// `new`: its manifest is rewritten and sealed again. Refuses a name that
/// a layer below the top has.
fn rename_top(chain: &mut [Remote], new: &str, reference: &str) -> Result<(), RegistryError> {
    let below = chain.len() - 1;
    if chain[..below].iter().any(|r| r.manifest.name == *new) {
        return Err(RegistryError::Chain(format!(
            "--as {new}: the chain at {reference} already has a layer '{new}' below its top"
        )));
    }
    let top = &mut chain[below];
    if top.manifest.name != *new {
        top.manifest.name = new.to_string();
        top.manifest.seal();
        top.config = top.manifest.to_bytes();
    }
    Ok(())
}

/// Downloads the layers of `chain` (base first) that `store` lacks, each
/// into an import's work directory, checking every blob's digest; a layer
/// the store has with the same content hash is skipped, one with other
/// content is refused. Adds each layer to `report`; returns the imports
/// to commit, base first, with their content hashes.
async fn download_missing(
    store: &Store,
    reg: &Registry,
    chain: &[Remote],
    opts: &PullOptions,
    report: &mut PullReport,
) -> Result<Vec<(LayerImport, String)>, RegistryError> {
    let mut pending: Vec<(LayerImport, String)> = Vec::new();
    for (i, r) in chain.iter().enumerate() {
        let name = &r.manifest.name;
        let content = hex(&sha256(&r.config));
        let mut pl = PulledLayer {
            name: name.clone(),
            manifest_digest: r.manifest_digest.clone(),
            content_sha256: content.clone(),
            pulled: false,
            bytes_received: 0,
            file_bytes: 0,
            compression: r.files.first().map(|f| f.compression).unwrap_or_default(),
        };
        if store.contains(name) {
            let have = store.layer(name)?;
            if have.content_sha256 == content {
                tracing::info!("layer '{name}' is already in the store");
                report.layers.push(pl);
                continue;
            }
            let hint = if i + 1 == chain.len() {
                "remove it, or pull the top layer under another name with --as"
            } else {
                "remove it, or pull into another store (--store)"
            };
            return Err(RegistryError::Chain(format!(
                "snapshot '{name}' is already in store {} with other content (content hash {}, the registry's is {content}); {hint}",
                store.root().display(),
                have.content_sha256
            )));
        }
        let imp = store.begin_import(name)?;
        let mpath = imp.work_dir().join(MANIFEST_FILE);
        std::fs::write(&mpath, &r.config).map_err(|e| io_err(&mpath, "write", e))?;
        for blob in &r.files {
            let (received, written) = download(reg, r, blob, &imp, opts).await?;
            pl.bytes_received += received;
            pl.file_bytes += written;
        }
        pl.pulled = true;
        report.bytes_received += pl.bytes_received;
        report.file_bytes += pl.file_bytes;
        report.layers.push(pl);
        pending.push((imp, content));
    }
    Ok(pending)
}

fn stage(opts: &PullOptions, s: &str) {
    tracing::debug!("{s}");
    if let Some(p) = &opts.progress {
        p(Event::Stage(s));
    }
}

/// The chain the reference names, base first: each OCI manifest checked
/// as an Ignition layer artifact, its config checked as a store manifest,
/// each link (the child's `parent` against the parent's name and config
/// digest) checked.
async fn fetch_chain(reg: &Registry) -> Result<Vec<Remote>, RegistryError> {
    let mut chain: Vec<Remote> = Vec::new();
    let mut next = reg.reference.clone();
    let mut declared = None;
    loop {
        let (bytes, digest) = reg.pull_manifest(&next, declared).await?;
        let what = format!("{}@{digest}", reg.repository());
        let (art, files) = ArtifactManifest::parse(&bytes, &what)?;
        let config = fetch_small(reg, &art.config.digest, art.config.size, &what).await?;
        let manifest = parse_manifest(&config).map_err(|e| RegistryError::Artifact {
            what: format!("{what}: config {}", art.config.digest),
            msg: format!("not a valid {MANIFEST_FILE}: {e}"),
        })?;
        check_files(&manifest, &files, &what)?;
        if let Some(child) = chain.last() {
            let link = child.manifest.parent.as_ref();
            let content = digest_hex(&art.config.digest).unwrap_or_default();
            if link.is_none_or(|p| p.name != manifest.name || p.sha256 != content) {
                return Err(RegistryError::Chain(format!(
                    "{what} (layer '{}') is the subject of layer '{}' but not its parent (which is {})",
                    manifest.name,
                    child.manifest.name,
                    link.map_or("none".to_string(), |p| format!("'{}' with content hash {}", p.name, p.sha256))
                )));
            }
        }
        let subject = art.subject.clone();
        match (manifest.kind, &subject) {
            (LayerKind::Full, None) | (LayerKind::Diff, Some(_)) => {}
            (kind, _) => {
                return Err(RegistryError::Artifact {
                    what,
                    msg: format!(
                        "a {kind} layer {} a subject",
                        if kind == LayerKind::Full {
                            "with"
                        } else {
                            "without"
                        }
                    ),
                })
            }
        }
        chain.push(Remote {
            manifest_digest: digest,
            files,
            config,
            manifest,
        });
        match subject {
            None => break,
            Some(s) => {
                if chain.len() >= MAX_CHAIN_DEPTH {
                    return Err(RegistryError::Chain(format!(
                        "the chain at {} is deeper than {MAX_CHAIN_DEPTH} layers",
                        reg.reference
                    )));
                }
                next = reg.at(&s.digest);
                declared = Some(s.size);
            }
        }
    }
    chain.reverse();
    Ok(chain)
}

/// The file sizes the layer's manifest gives.
fn file_size(m: &Manifest, file: &str) -> u64 {
    match file {
        MEMORY_FILE => m.memory.size,
        STATE_FILE => m.state.size,
        DISK_FILE | DISK_DIFF_FILE => m.disk.as_ref().map_or(0, |d| d.data_file_size()),
        DISK_CHUNKS_FILE => m.disk.as_ref().map_or(0, |d| {
            disk_chunks_file_size(disk_chunk_count(d.size, d.chunk_size))
        }),
        _ => 0,
    }
}

/// The largest zstd frame of a file of `size` bytes: zstd's
/// `ZSTD_compressBound`, plus room for the frame's header and checksum.
fn zstd_bound(size: u64) -> u64 {
    let small = if size < 128 << 10 {
        ((128 << 10) - size) >> 11
    } else {
        0
    };
    size.saturating_add(size >> 8).saturating_add(small) + 64
}

/// The blobs must be exactly the files the manifest lists; an
/// uncompressed blob must have the file's size, a zstd one at most
/// [`zstd_bound`] of it.
fn check_files(m: &Manifest, files: &[FileBlob], what: &str) -> Result<(), RegistryError> {
    let mut want: Vec<&str> = listed_files(m).into_iter().skip(1).collect();
    let mut have: Vec<&str> = files.iter().map(|f| f.file).collect();
    want.sort_unstable();
    have.sort_unstable();
    if want != have {
        return Err(RegistryError::Artifact {
            what: what.to_string(),
            msg: format!(
                "layer '{}' has blobs for {} but its {MANIFEST_FILE} lists {}",
                m.name,
                have.join(", "),
                want.join(", ")
            ),
        });
    }
    for f in files {
        let bound = zstd_bound(file_size(m, f.file));
        if f.compression == Compression::Zstd && f.descriptor.size > bound {
            return Err(RegistryError::Artifact {
                what: what.to_string(),
                msg: format!(
                    "blob {} ({}) declares {} bytes, more than a zstd frame of the {} bytes layer '{}' gives that file can be ({bound})",
                    f.descriptor.digest,
                    f.file,
                    f.descriptor.size,
                    file_size(m, f.file),
                    m.name
                ),
            });
        }
        if f.compression == Compression::None && f.descriptor.size != file_size(m, f.file) {
            return Err(RegistryError::Artifact {
                what: what.to_string(),
                msg: format!(
                    "blob {} ({}) is {} bytes, layer '{}' gives {}",
                    f.descriptor.digest,
                    f.file,
                    f.descriptor.size,
                    m.name,
                    file_size(m, f.file)
                ),
            });
        }
    }
    Ok(())
}

/// Fetch a small blob (a config) into memory, checking size and digest.
async fn fetch_small(
    reg: &Registry,
    digest: &str,
    size: u64,
    what: &str,
) -> Result<Vec<u8>, RegistryError> {
    let bad = |msg: String| RegistryError::Artifact {
        what: format!("{what}: config {digest}"),
        msg,
    };
    if size > MAX_MANIFEST_BYTES as u64 {
        return Err(bad(format!(
            "is {size} bytes, more than {MAX_MANIFEST_BYTES}"
        )));
    }
    let op = format!("fetch config {digest} of {what}");
    let out = reg.small_blob(digest, size, &op).await?;
    let found = super::layout::digest_of(&out);
    if found != digest || out.len() as u64 != size {
        return Err(bad(format!(
            "is corrupted or truncated: {} bytes with {found}",
            out.len()
        )));
    }
    Ok(out)
}

/// Download one file blob of layer `r` into the import's work directory,
/// starting again from its first byte after a transient failure (as many
/// times as the connection's limits allow). Returns (blob bytes received,
/// file bytes written).
async fn download(
    reg: &Registry,
    r: &Remote,
    blob: &FileBlob,
    imp: &LayerImport,
    opts: &PullOptions,
) -> Result<(u64, u64), RegistryError> {
    let d = &blob.descriptor;
    let layer = imp.name();
    let want_file = file_size(&r.manifest, blob.file);
    let path = imp.work_dir().join(blob.file);
    let tag = Tag {
        layer: layer.into(),
        file: blob.file,
        progress: opts.progress.clone(),
    };
    let what = format!("blob {} ({layer}/{})", d.digest, blob.file);
    let mut backoff = reg.backoff();
    let rx = loop {
        if backoff.attempts() > 0 {
            std::fs::remove_file(&path).map_err(|e| io_err(&path, "remove", e))?;
        }
        let mut rx = Receiver::create(&path, blob.compression, want_file)?;
        tag.report(0, d.size);
        match receive(reg, blob, &what, &mut rx, &tag).await {
            Ok(()) => break rx,
            Err(Received::Failed(f)) if backoff.retry(&f).await => {}
            Err(Received::Failed(f)) => {
                let op = format!("layer '{layer}': fetch {what}");
                return Err(reg.error(&op, f, backoff.attempts()));
            }
            Err(Received::Refused(e)) => return Err(e),
        }
    };
    let corrupt = |rx: &Receiver| RegistryError::BlobDigest {
        layer: layer.to_string(),
        file: blob.file.to_string(),
        digest: d.digest.clone(),
        size: d.size,
        received: rx.received(),
        found: rx.digest_so_far(),
    };
    if rx.received() != d.size || format!("sha256:{}", rx.digest_so_far()) != d.digest {
        return Err(corrupt(&rx));
    }
    let got = rx
        .finish()
        .map_err(|e| blob_error(imp, blob, e.to_string()))?;
    debug_assert_eq!(format!("sha256:{}", got.sha256), d.digest);
    if got.file_size != want_file {
        return Err(blob_error(
            imp,
            blob,
            format!(
                "decodes to {} bytes, layer '{layer}' gives {want_file}",
                got.file_size
            ),
        ));
    }
    Ok((got.received, got.file_size))
}

/// A [`RegistryError::Blob`] of `blob` of the layer being imported.
fn blob_error(imp: &LayerImport, blob: &FileBlob, msg: String) -> RegistryError {
    RegistryError::Blob {
        layer: imp.name().to_string(),
        file: blob.file.to_string(),
        digest: blob.descriptor.digest.clone(),
        msg,
    }
}

/// Why one attempt at a blob stopped.
enum Received {
    /// The transfer failed (perhaps only for a moment: it may be retried).
    Failed(super::transport::Failure),
    /// The bytes were refused here (a write error, a bad zstd frame, a
    /// file longer than the layer's manifest gives): no retry.
    Refused(RegistryError),
}

/// One attempt at receiving `blob` into `rx`, until the registry ends the
/// body (its size and digest are the caller's to check).
async fn receive(
    reg: &Registry,
    blob: &FileBlob,
    what: &str,
    rx: &mut Receiver,
    tag: &Tag,
) -> Result<(), Received> {
    let d = &blob.descriptor;
    let mut body = reg
        .blob(&d.digest, d.size, what)
        .await
        .map_err(Received::Failed)?;
    while let Some(b) = body.chunk().await.map_err(Received::Failed)? {
        rx.push(&b).map_err(|e| {
            Received::Refused(RegistryError::Blob {
                layer: tag.layer.to_string(),
                file: blob.file.to_string(),
                digest: d.digest.clone(),
                msg: e.to_string(),
            })
        })?;
        tag.report(rx.received(), d.size);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::manifest::tests::sample;
    use crate::format::manifest::DiskEntry;
    use crate::oci::layout::{digest_of, Descriptor};

    fn blob(file: &'static str, compression: Compression, size: u64) -> FileBlob {
        FileBlob {
            file,
            compression,
            descriptor: Descriptor {
                media_type: String::new(),
                digest: digest_of(file.as_bytes()),
                size,
                annotations: Default::default(),
            },
        }
    }

    #[test]
    fn the_blobs_must_be_the_files_the_manifest_lists() {
        let mut m = sample(LayerKind::Full);
        m.disk = None;
        let (mem, state) = (m.memory.size, m.state.size);
        let ok = [
            blob(MEMORY_FILE, Compression::None, mem),
            blob(STATE_FILE, Compression::None, state),
        ];
        check_files(&m, &ok, "x").unwrap();
        // A compressed blob may have any size; an uncompressed one must be the file's.
        check_files(
            &m,
            &[blob(MEMORY_FILE, Compression::Zstd, 7), ok[1].clone()],
            "x",
        )
        .unwrap();
        let e = check_files(
            &m,
            &[blob(MEMORY_FILE, Compression::None, mem - 1), ok[1].clone()],
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("memory.bin") && e.contains(&format!("gives {mem}")),
            "{e}"
        );
        // The manifest lists a disk the artifact does not carry.
        m.disk = Some(DiskEntry {
            size: 1 << 20,
            chunk_size: 1 << 18,
            sha256: "00".repeat(32),
            diff_chunks: None,
        });
        let e = check_files(&m, &ok, "layer@d").unwrap_err().to_string();
        assert!(e.contains("layer@d") && e.contains("disk.img"), "{e}");
        let with_disk = [
            ok[0].clone(),
            ok[1].clone(),
            blob(DISK_FILE, Compression::None, 1 << 20),
            blob(DISK_CHUNKS_FILE, Compression::None, 72 + 32 * 4),
        ];
        check_files(&m, &with_disk, "x").unwrap();
        assert_eq!(file_size(&m, DISK_CHUNKS_FILE), 72 + 32 * 4);
        // A disk stored as a diff of 2 chunks: disk.diff in place of disk.img.
        m.disk.as_mut().unwrap().diff_chunks = Some(2);
        let diff_size = (64 << 10) + 2 * (1 << 18);
        assert_eq!(file_size(&m, DISK_DIFF_FILE), diff_size);
        let e = check_files(&m, &with_disk, "x").unwrap_err().to_string();
        assert!(e.contains("disk.diff"), "{e}");
        let with_diff = [
            ok[0].clone(),
            ok[1].clone(),
            blob(DISK_DIFF_FILE, Compression::None, diff_size),
            blob(DISK_CHUNKS_FILE, Compression::None, 72 + 32 * 4),
        ];
        check_files(&m, &with_diff, "x").unwrap();
    }

    #[test]
    fn zstd_frames_of_incompressible_files_fit_the_bound() {
        // What `--compress zstd` makes of random bytes (which it cannot
        // shrink) must be accepted, however long the file.
        let d = tempfile::tempdir().unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for size in [0usize, 1, 1000, 128 << 10, (1 << 20) + 7, 5 << 20] {
            let data: Vec<u8> = (0..size)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let src = d.path().join(format!("f{size}"));
            std::fs::write(&src, &data).unwrap();
            let dst = d.path().join(format!("f{size}.zst"));
            let (_, blob) = crate::oci::blobio::compress_file(&src, size as u64, &dst).unwrap();
            assert!(
                blob <= zstd_bound(size as u64),
                "{size}: {blob} > {}",
                zstd_bound(size as u64)
            );
        }
        // A blob declared longer than the bound is refused.
        let mut m = sample(LayerKind::Full);
        m.disk = None;
        let too_long = zstd_bound(m.memory.size) + 1;
        let e = check_files(
            &m,
            &[
                blob(MEMORY_FILE, Compression::Zstd, too_long),
                blob(STATE_FILE, Compression::None, m.state.size),
            ],
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("more than a zstd frame"), "{e}");
    }
}
