//! `vmstore push`: a chain's layers to a registry, base first, each as an
//! artifact manifest (see `layout`), sending only the blobs the repository
//! does not have; then the top layer's manifest is tagged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use oci_client::RegistryOperation;

use crate::format::MANIFEST_FILE;
use crate::fsutil::nonce;
use crate::hash::{hex, sha256_open_file};
use crate::import::listed_files;
use crate::layer::Layer;
use crate::store::Store;
use crate::verify::verify_chain_cached;

use super::blobio::{compress_file, file_stream, Tag};
use super::client::{parse_reference, Registry};
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
    block_on(async {
        let reg = Registry::connect(reference, &opts.connection, RegistryOperation::Push).await?;
        let mount_from = match &opts.mount_from {
            None => None,
            Some(m) => {
                let src = parse_reference(m)?;
                if src.resolve_registry() != reg.reference.resolve_registry() {
                    return Err(RegistryError::Reference {
                        reference: m.clone(),
                        msg: format!(
                            "can only mount from the same registry, {}",
                            reg.reference.resolve_registry()
                        ),
                    });
                }
                Some(src)
            }
        };
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
        let mut scratch = Scratch(None, store.root().to_path_buf());
        let mut subject: Option<(String, u64)> = None;
        let mut top_bytes = Vec::new();
        for layer in chain.layers() {
            let (pushed, bytes) = push_layer(
                &reg,
                layer,
                subject.take(),
                mount_from.as_ref(),
                opts,
                &mut scratch,
                &mut report,
            )
            .await?;
            subject = Some((pushed.manifest_digest.clone(), pushed.manifest_size));
            report.layers.push(pushed);
            top_bytes = bytes;
        }
        stage(opts, &format!("tagging {}", report.reference));
        reg.push_manifest(&reg.reference, top_bytes).await?;
        report.digest = subject.map(|s| s.0).unwrap_or_default();
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    })
}

fn stage(opts: &PushOptions, s: &str) {
    tracing::debug!("{s}");
    if let Some(p) = &opts.progress {
        p(Event::Stage(s));
    }
}

/// Push one layer's blobs and its OCI manifest (by digest). Returns the
/// report and the manifest bytes.
async fn push_layer(
    reg: &Registry,
    layer: &Layer,
    subject: Option<(String, u64)>,
    mount_from: Option<&oci_client::Reference>,
    opts: &PushOptions,
    scratch: &mut Scratch,
    report: &mut PushReport,
) -> Result<(PushedLayer, Vec<u8>), RegistryError> {
    let mpath = layer.manifest_path();
    let config = std::fs::read(&mpath).map_err(|e| io_err(&mpath, "read", e))?;
    let config_digest = digest_of(&config);
    if config_digest != format!("sha256:{}", layer.content_sha256) {
        return Err(RegistryError::Chain(format!(
            "{} changed since the chain was verified",
            mpath.display()
        )));
    }
    let mut blobs = Vec::new();
    let status = if reg.has_blob(&config_digest).await? {
        BlobStatus::Present
    } else {
        reg.push_blob_bytes(config.clone()).await?;
        BlobStatus::Sent
    };
    let n = config.len() as u64;
    if status == BlobStatus::Sent {
        report.bytes_sent += n;
    } else {
        report.bytes_skipped += n;
    }
    report.file_bytes += n;
    report.blob_bytes += n;
    blobs.push(PushedBlob {
        file: MANIFEST_FILE.to_string(),
        media_type: super::layout::CONFIG_MEDIA_TYPE.to_string(),
        digest: config_digest,
        size: config.len() as u64,
        file_size: config.len() as u64,
        status,
    });
    let mut descriptors = Vec::new();
    for file in listed_files(&layer.manifest).into_iter().skip(1) {
        let path = layer.dir.join(file);
        let file_size = std::fs::symlink_metadata(&path)
            .map_err(|e| io_err(&path, "stat", e))?
            .len();
        let (digest_hex, size, send_path) = match opts.compression {
            Compression::None => {
                stage(opts, &format!("hashing {}/{file}", layer.name));
                let f = std::fs::File::open(&path).map_err(|e| io_err(&path, "open", e))?;
                (
                    hex(&sha256_open_file(&f, &path, file_size, None)?),
                    file_size,
                    path.clone(),
                )
            }
            Compression::Zstd => {
                stage(opts, &format!("compressing {}/{file}", layer.name));
                let t = Instant::now();
                let dst = scratch.dir()?.join(format!("{}-{file}.zst", layer.name));
                let (d, s) = compress_file(&path, file_size, &dst)?;
                report.compress_seconds += t.elapsed().as_secs_f64();
                (d, s, dst)
            }
        };
        let digest = format!("sha256:{digest_hex}");
        let status = if reg.has_blob(&digest).await? {
            BlobStatus::Present
        } else if let Some(m) = mount_from {
            if reg.mount(m, &digest).await {
                BlobStatus::Mounted
            } else {
                upload(reg, layer, file, &send_path, &digest, size, opts, report).await?
            }
        } else {
            upload(reg, layer, file, &send_path, &digest, size, opts, report).await?
        };
        if send_path != path {
            let _ = std::fs::remove_file(&send_path);
        }
        if status == BlobStatus::Sent {
            report.bytes_sent += size;
        } else {
            report.bytes_skipped += size;
        }
        report.file_bytes += file_size;
        report.blob_bytes += size;
        descriptors.push((file, opts.compression, digest.clone(), size));
        blobs.push(PushedBlob {
            file: file.to_string(),
            media_type: file_media_type(file, opts.compression).unwrap_or_default(),
            digest,
            size,
            file_size,
            status,
        });
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

/// Upload one file blob from `path`.
#[allow(clippy::too_many_arguments)]
async fn upload(
    reg: &Registry,
    layer: &Layer,
    file: &'static str,
    path: &Path,
    digest: &str,
    size: u64,
    opts: &PushOptions,
    report: &mut PushReport,
) -> Result<BlobStatus, RegistryError> {
    let tag = Tag {
        layer: Arc::from(layer.name.as_str()),
        file,
        progress: opts.progress.clone(),
    };
    tag.report(0, size);
    let t = Instant::now();
    let stream = file_stream(path.to_path_buf(), size, tag)?;
    reg.push_blob_stream(stream, digest, size).await?;
    report.upload_seconds += t.elapsed().as_secs_f64();
    Ok(BlobStatus::Sent)
}
