//! `vmstore push`: a chain's layers to a registry, base first, each as an
//! artifact manifest (see `layout`), sending only the blobs the repository
//! does not have; then the top layer's manifest is tagged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::file_hash::sha256_open_file;
use crate::format::manifest::listed_files;
use crate::format::verified::Stamp;
use crate::format::MANIFEST_FILE;
use crate::fsutil::nonce;
use crate::hash::hex;
use crate::layer::Layer;
use crate::store::Store;
use crate::verify::verify_chain_cached;

use super::blobio::{compress_file, file_stream, Tag};
use super::client::{parse_reference, scopes, Registry};
use super::digests::DigestCache;
use super::layout::{digest_of, file_media_type, ArtifactManifest, Compression};
use super::{block_on, io_err, Connection, Event, EventFn, RegistryError};

/// How to push.
#[derive(Clone, Default)]
pub struct PushOptions {
    /// Registry connection (HTTPS or plain HTTP, credentials).
    pub connection: Connection,
    /// Transport compression of the file blobs.
    pub compression: Compression,
    /// A repository of the same registry (`REGISTRY/REPOSITORY`) to mount
    /// missing blobs from before uploading them (distribution-spec,
    /// "Mounting a blob from another repository").
    pub mount_from: Option<String>,
    /// Progress events.
    pub progress: Option<EventFn>,
}

/// What happened to one blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobStatus {
    /// Uploaded.
    Sent,
    /// The repository already had it (`HEAD`): not sent.
    Present,
    /// Mounted from another repository: not sent.
    Mounted,
}

impl std::fmt::Display for BlobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BlobStatus::Sent => "sent",
            BlobStatus::Present => "present",
            BlobStatus::Mounted => "mounted",
        })
    }
}

/// One blob of a pushed layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedBlob {
    /// The layer file (`manifest.json` for the config blob).
    pub file: String,
    /// Its media type.
    pub media_type: String,
    /// `sha256:HEX` of the blob.
    pub digest: String,
    /// Blob size in bytes (compressed, with `--compress zstd`).
    pub size: u64,
    /// The file's size in bytes.
    pub file_size: u64,
    /// Sent, present or mounted.
    pub status: BlobStatus,
}

/// One pushed layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedLayer {
    /// Snapshot name.
    pub name: String,
    /// `sha256:HEX` of its OCI manifest.
    pub manifest_digest: String,
    /// Its OCI manifest's size in bytes.
    pub manifest_size: u64,
    /// Its blobs, config first.
    pub blobs: Vec<PushedBlob>,
}

/// What [`push`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct PushReport {
    /// The tag pushed (`REGISTRY/REPOSITORY:TAG`).
    pub reference: String,
    /// `sha256:HEX` of the top layer's OCI manifest (what the tag names).
    pub digest: String,
    /// Layers, base first.
    pub layers: Vec<PushedLayer>,
    /// Transport compression.
    pub compression: Compression,
    /// Blob bytes uploaded.
    pub bytes_sent: u64,
    /// Blob bytes not uploaded (present or mounted).
    pub bytes_skipped: u64,
    /// Sum of the file sizes of every blob (sent or not).
    pub file_bytes: u64,
    /// Sum of the blob sizes of every blob (sent or not).
    pub blob_bytes: u64,
    /// Seconds spent compressing (0 without compression).
    pub compress_seconds: f64,
    /// Seconds spent uploading blobs.
    pub upload_seconds: f64,
    /// Seconds for the whole push, verification included.
    pub seconds: f64,
}

/// A work directory for compressed blobs, removed on drop.
struct Scratch(Option<PathBuf>, PathBuf);

impl Scratch {
    fn dir(&mut self) -> Result<&Path, RegistryError> {
        if self.0.is_none() {
            let d = self
                .1
                .join(format!(".tmp-push-{}-{:016x}", std::process::id(), nonce()));
            std::fs::create_dir(&d).map_err(|e| io_err(&d, "create work directory", e))?;
            self.0 = Some(d);
        }
        Ok(self.0.as_deref().unwrap_or(Path::new(".")))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Push the chain `spec` of `store` to `reference`
/// (`REGISTRY/REPOSITORY[:TAG]`, tag `latest` if none). The chain is
/// verified first (files the layers' `verified.json` vouch for are not
/// hashed again). Blocking.
pub fn push(
    store: &Store,
    spec: &str,
    reference: &str,
    opts: &PushOptions,
) -> Result<PushReport, RegistryError> {
    let t0 = Instant::now();
    let chain = store.resolve(spec)?;
    let r = parse_reference(reference)?;
    if r.digest().is_some() {
        return Err(RegistryError::Reference {
            reference: reference.to_string(),
            msg: "push takes a tag, not a digest".into(),
        });
    }
    stage(opts, &format!("verifying {}", chain.describe()));
    verify_chain_cached(&chain)?;
    let mut digests = DigestCache::load(store.root());
    let cache = &mut digests;
    let mount_from = match &opts.mount_from {
        None => None,
        Some(m) => {
            let src = parse_reference(m)?;
            if src.resolve_registry() != r.resolve_registry() {
                return Err(RegistryError::Reference {
                    reference: m.clone(),
                    msg: format!(
                        "can only mount from the same registry, {}",
                        r.resolve_registry()
                    ),
                });
            }
            Some(src)
        }
    };
    let r = block_on(async {
        let reg = Registry::connect(reference, &opts.connection, |r| {
            scopes(r.repository(), true, mount_from.as_ref())
        })
        .await?;
        let mut report = PushReport {
            reference: format!(
                "{}:{}",
                reg.repository(),
                reg.reference.tag().unwrap_or("latest")
            ),
            digest: String::new(),
            layers: Vec::new(),
            compression: opts.compression,
            bytes_sent: 0,
            bytes_skipped: 0,
            file_bytes: 0,
            blob_bytes: 0,
            compress_seconds: 0.0,
            upload_seconds: 0.0,
            seconds: 0.0,
        };
        let mut p = Pusher {
            reg: &reg,
            opts,
            mount_from,
            scratch: Scratch(None, store.root().to_path_buf()),
            cache,
            report: &mut report,
        };
        let mut subject: Option<(String, u64)> = None;
        let mut top_bytes = Vec::new();
        for layer in chain.layers() {
            let (pushed, bytes) = p.layer(layer, subject.take()).await?;
            subject = Some((pushed.manifest_digest.clone(), pushed.manifest_size));
            p.report.layers.push(pushed);
            top_bytes = bytes;
        }
        drop(p);
        stage(opts, &format!("tagging {}", report.reference));
        reg.push_manifest(&reg.reference, top_bytes).await?;
        report.digest = subject.map(|s| s.0).unwrap_or_default();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    });
    digests.save();
    r
}

fn stage(opts: &PushOptions, s: &str) {
    tracing::debug!("{s}");
    if let Some(p) = &opts.progress {
        p(Event::Stage(s));
    }
}

/// One push in progress: the registry, the options, and what it has done.
struct Pusher<'a> {
    reg: &'a Registry,
    opts: &'a PushOptions,
    mount_from: Option<oci_spec::distribution::Reference>,
    scratch: Scratch,
    cache: &'a mut DigestCache,
    report: &'a mut PushReport,
}

impl Pusher<'_> {
    /// Push one layer's blobs and its OCI manifest (by digest). Returns the
    /// report and the manifest bytes.
    async fn layer(
        &mut self,
        layer: &Layer,
        subject: Option<(String, u64)>,
    ) -> Result<(PushedLayer, Vec<u8>), RegistryError> {
        let reg = self.reg;
        let (config, config_blob) = self.config_blob(layer).await?;
        let mut blobs = vec![config_blob];
        let mut descriptors = Vec::new();
        for file in listed_files(&layer.manifest).into_iter().skip(1) {
            let blob = self.file_blob(layer, file).await?;
            descriptors.push((file, self.opts.compression, blob.digest.clone(), blob.size));
            blobs.push(blob);
        }
        let art = ArtifactManifest::build(&layer.manifest, &config, &descriptors, subject);
        let bytes = art.to_bytes();
        let manifest_digest = digest_of(&bytes);
        reg.push_manifest(&reg.at(&manifest_digest), bytes.clone())
            .await?;
        tracing::info!("pushed layer '{}' as {manifest_digest}", layer.name);
        Ok((
            PushedLayer {
                name: layer.name.clone(),
                manifest_digest,
                manifest_size: bytes.len() as u64,
                blobs,
            },
            bytes,
        ))
    }

    /// Push the layer's `manifest.json` (the artifact's config blob) unless
    /// the repository has it or can mount it; refuses one that changed
    /// since the chain was verified. Returns its bytes and its report.
    async fn config_blob(&mut self, layer: &Layer) -> Result<(Vec<u8>, PushedBlob), RegistryError> {
        let reg = self.reg;
        let mpath = layer.manifest_path();
        let config = std::fs::read(&mpath).map_err(|e| io_err(&mpath, "read", e))?;
        let config_digest = digest_of(&config);
        if config_digest != format!("sha256:{}", layer.content_sha256) {
            return Err(RegistryError::Chain(format!(
                "{} changed since the chain was verified",
                mpath.display()
            )));
        }
        let status = if reg.has_blob(&config_digest).await? {
            BlobStatus::Present
        } else if self.mount(&config_digest).await {
            BlobStatus::Mounted
        } else {
            reg.push_blob_bytes(config.clone()).await?;
            BlobStatus::Sent
        };
        let n = config.len() as u64;
        self.count(status, n, n);
        let blob = PushedBlob {
            file: MANIFEST_FILE.to_string(),
            media_type: super::layout::CONFIG_MEDIA_TYPE.to_string(),
            digest: config_digest,
            size: n,
            file_size: n,
            status,
        };
        Ok((config, blob))
    }

    /// Push the layer's `file` as a blob (compressed as asked) unless the
    /// repository has it or can mount it. A digest known from the cache of
    /// pushed blobs spares compressing and hashing the file again.
    async fn file_blob(
        &mut self,
        layer: &Layer,
        file: &'static str,
    ) -> Result<PushedBlob, RegistryError> {
        let reg = self.reg;
        let compression = self.opts.compression;
        let path = layer.dir.join(file);
        let file_size = std::fs::symlink_metadata(&path)
            .map_err(|e| io_err(&path, "stat", e))?
            .len();
        let cached = self.cache.get(&layer.name, file, compression, &path);
        let known = match &cached {
            Some((h, size)) => {
                let digest = format!("sha256:{h}");
                reg.has_blob(&digest).await?.then_some((digest, *size))
            }
            None => None,
        };
        let (digest, size, send_path, status) = match known {
            Some((digest, size)) => (digest, size, path.clone(), BlobStatus::Present),
            None => {
                let (digest, size, send_path) = self.blob_of(layer, file, &path, file_size)?;
                let status = if cached.is_none() && reg.has_blob(&digest).await? {
                    BlobStatus::Present
                } else if self.mount(&digest).await {
                    BlobStatus::Mounted
                } else {
                    self.upload(layer, file, &send_path, &digest, size).await?
                };
                (digest, size, send_path, status)
            }
        };
        if send_path != path {
            let _ = std::fs::remove_file(&send_path);
        }
        self.count(status, size, file_size);
        Ok(PushedBlob {
            file: file.to_string(),
            media_type: file_media_type(file, compression).unwrap_or_default(),
            digest,
            size,
            file_size,
            status,
        })
    }

    /// Adds a blob of `size` bytes (of a file of `file_size` bytes) to the
    /// report's totals, as sent or as skipped.
    fn count(&mut self, status: BlobStatus, size: u64, file_size: u64) {
        if status == BlobStatus::Sent {
            self.report.bytes_sent += size;
        } else {
            self.report.bytes_skipped += size;
        }
        self.report.file_bytes += file_size;
        self.report.blob_bytes += size;
    }

    /// Mount `digest` from `--mount-from`, if given; `true` if the registry did.
    async fn mount(&self, digest: &str) -> bool {
        match &self.mount_from {
            Some(m) => self.reg.mount(m, digest).await,
            None => false,
        }
    }

    /// The blob of `layer/file` (at `path`, `file_size` bytes): its digest,
    /// size and the file to send (the layer file, or its compressed copy in
    /// the scratch directory), recorded in the digest cache.
    fn blob_of(
        &mut self,
        layer: &Layer,
        file: &'static str,
        path: &Path,
        file_size: u64,
    ) -> Result<(String, u64, PathBuf), RegistryError> {
        let opts = self.opts;
        let t0 = DigestCache::now_ns();
        let stamp = |p: &Path| -> Result<Stamp, RegistryError> {
            Ok(Stamp::of(
                &std::fs::symlink_metadata(p).map_err(|e| io_err(p, "stat", e))?,
            ))
        };
        let before = stamp(path)?;
        let (hex_digest, size, send) = match opts.compression {
            Compression::None => {
                stage(opts, &format!("hashing {}/{file}", layer.name));
                let f = std::fs::File::open(path).map_err(|e| io_err(path, "open", e))?;
                (
                    hex(&sha256_open_file(&f, path, file_size, None)?),
                    file_size,
                    path.to_path_buf(),
                )
            }
            Compression::Zstd => {
                stage(opts, &format!("compressing {}/{file}", layer.name));
                let t = Instant::now();
                let dst = self
                    .scratch
                    .dir()?
                    .join(format!("{}-{file}.zst", layer.name));
                let (d, s) = compress_file(path, file_size, &dst)?;
                self.report.compress_seconds += t.elapsed().as_secs_f64();
                (d, s, dst)
            }
        };
        let after = stamp(path)?;
        self.cache.put(
            &layer.name,
            file,
            opts.compression,
            (before, after, t0),
            (&hex_digest, size),
        );
        Ok((format!("sha256:{hex_digest}"), size, send))
    }

    /// Upload one file blob from `path`.
    async fn upload(
        &mut self,
        layer: &Layer,
        file: &'static str,
        path: &Path,
        digest: &str,
        size: u64,
    ) -> Result<BlobStatus, RegistryError> {
        let tag = Tag {
            layer: Arc::from(layer.name.as_str()),
            file,
            progress: self.opts.progress.clone(),
        };
        let t = Instant::now();
        self.reg
            .upload(digest, size, || {
                tag.report(0, size);
                file_stream(path.to_path_buf(), size, tag.clone())
            })
            .await?;
        self.report.upload_seconds += t.elapsed().as_secs_f64();
        Ok(BlobStatus::Sent)
    }
}
