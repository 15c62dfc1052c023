//! A directory's files as one OCI artifact (`vmstore push-files` /
//! `vmstore pull-files`), for what is not a snapshot layer: a guest built on
//! one machine (its kernel, root file system and build record) fetched on
//! another that cannot build it, such as a Mac.
//!
//! The artifact is one OCI image manifest (image-spec v1.1) with
//! `artifactType` [`FILES_ARTIFACT_TYPE`], the empty config
//! ([`EMPTY_CONFIG_MEDIA_TYPE`], `{}`) and one blob per file
//! ([`FILE_MEDIA_TYPE`]) whose [`ANNOTATION_TITLE`] is the file's path
//! relative to the directory (`/`-separated, each component a plain name).
//! A push sends only the blobs the repository lacks. A pull checks the
//! manifest before it fetches anything, never reads a blob past its
//! declared size, checks each blob's digest as it arrives, and renames each
//! file into place only once it is whole, so a file is either absent, as it
//! was, or exactly the pushed one.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::blobio::{file_stream, Tag};
use super::client::{parse_reference, scopes, Registry};
use super::layout::{digest_hex, digest_of, Descriptor, ANNOTATION_TITLE, OCI_MANIFEST_MEDIA_TYPE};
use super::transport::Failure;
use super::{block_on, io_err, Connection, RegistryError};
use crate::fsutil::nonce;

/// `artifactType` of a files artifact.
pub const FILES_ARTIFACT_TYPE: &str = "application/vnd.ignition.files.v1";
/// Media type of each file's blob: the file's bytes.
pub const FILE_MEDIA_TYPE: &str = "application/vnd.ignition.file.v1";
/// Media type of the empty config (image-spec v1.1, "Guidance for an Empty
/// Descriptor"): the two bytes `{}`.
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// Most files in one artifact.
pub const MAX_FILES: usize = 1024;

/// The OCI manifest of a files artifact. Field order is the serialization
/// order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct FilesManifest {
    schema_version: u32,
    media_type: String,
    artifact_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// One file of a pushed or pulled artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Its path relative to the directory, `/`-separated.
    pub name: String,
    /// `sha256:HEX` of its bytes.
    pub digest: String,
    /// Its length in bytes.
    pub size: u64,
    /// Push: `false` if the repository had the blob already. Pull: always
    /// `true`.
    pub transferred: bool,
}

/// What a push or pull of files did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesReport {
    /// `REGISTRY/REPOSITORY:TAG` (or `@DIGEST` for a pull by digest).
    pub reference: String,
    /// `sha256:HEX` of the artifact's OCI manifest.
    pub digest: String,
    /// The files, in the artifact's order.
    pub files: Vec<FileEntry>,
}

const EMPTY_CONFIG: &[u8] = b"{}";

/// Whether `name` is a relative path of plain components: no root, no
/// `.` or `..`, no empty component, no backslash.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('\\')
        && name.split('/').all(|c| !c.is_empty())
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn artifact_err(what: &str, msg: impl Into<String>) -> RegistryError {
    RegistryError::Artifact {
        what: what.to_string(),
        msg: msg.into(),
    }
}

/// Size and `sha256:HEX` of a regular file.
pub(super) fn hash_file(path: &Path) -> Result<(u64, String), RegistryError> {
    let mut f = File::open(path).map_err(|e| io_err(path, "open", e))?;
    let meta = f.metadata().map_err(|e| io_err(path, "stat", e))?;
    if !meta.is_file() {
        return Err(io_err(
            path,
            "read",
            std::io::Error::other("not a regular file"),
        ));
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| io_err(path, "read", e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, format!("sha256:{}", crate::hash::hex(&h.finalize()))))
}

/// Push the files `names` (paths relative to `dir`) as one artifact tagged
/// `reference` (`REGISTRY/REPOSITORY[:TAG]`, tag `latest` if none).
/// Blocking.
pub fn push_files(
    dir: &Path,
    names: &[String],
    reference: &str,
    conn: &Connection,
) -> Result<FilesReport, RegistryError> {
    let r = parse_reference(reference)?;
    if r.digest().is_some() {
        return Err(RegistryError::Reference {
            reference: reference.to_string(),
            msg: "push takes a tag, not a digest".into(),
        });
    }
    if names.is_empty() || names.len() > MAX_FILES {
        return Err(artifact_err(
            reference,
            format!(
                "a files artifact holds 1 to {MAX_FILES} files, not {}",
                names.len()
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut files = Vec::new();
    for name in names {
        if !valid_name(name) || !seen.insert(name.as_str()) {
            return Err(artifact_err(
                reference,
                format!("{name:?} is not a relative path of plain names, or is given twice"),
            ));
        }
        let path = dir.join(name);
        let (size, digest) = hash_file(&path)?;
        files.push((name.clone(), path, size, digest));
    }
    block_on(async {
        let reg =
            Registry::connect(reference, conn, |r| scopes(r.repository(), true, None)).await?;
        let config = digest_of(EMPTY_CONFIG);
        if !reg.has_blob(&config).await? {
            reg.push_blob_bytes(EMPTY_CONFIG.to_vec()).await?;
        }
        let mut report = FilesReport {
            reference: format!(
                "{}:{}",
                reg.repository(),
                reg.reference.tag().unwrap_or("latest")
            ),
            digest: String::new(),
            files: Vec::new(),
        };
        let mut layers = Vec::new();
        for (name, path, size, digest) in files {
            let present = reg.has_blob(&digest).await?;
            if !present {
                let tag = Tag {
                    layer: Arc::from(name.as_str()),
                    file: "file",
                    progress: None,
                };
                reg.upload(&digest, size, || {
                    file_stream(path.clone(), size, tag.clone())
                })
                .await?;
            }
            layers.push(Descriptor {
                media_type: FILE_MEDIA_TYPE.to_string(),
                digest: digest.clone(),
                size,
                annotations: BTreeMap::from([(ANNOTATION_TITLE.to_string(), name.clone())]),
            });
            report.files.push(FileEntry {
                name,
                digest,
                size,
                transferred: !present,
            });
        }
        let manifest = FilesManifest {
            schema_version: 2,
            media_type: OCI_MANIFEST_MEDIA_TYPE.to_string(),
            artifact_type: FILES_ARTIFACT_TYPE.to_string(),
            config: Descriptor {
                media_type: EMPTY_CONFIG_MEDIA_TYPE.to_string(),
                digest: config,
                size: EMPTY_CONFIG.len() as u64,
                annotations: BTreeMap::new(),
            },
            layers,
        };
        let bytes =
            serde_json::to_vec(&manifest).map_err(|e| artifact_err(reference, e.to_string()))?;
        report.digest = digest_of(&bytes);
        reg.push_manifest(&reg.reference, bytes).await?;
        Ok(report)
    })
}

/// The files of an artifact's manifest, checked: the artifact type and
/// media types, sha256 digests, and titles that are valid, distinct names.
fn parse_files_manifest(
    bytes: &[u8],
    what: &str,
) -> Result<Vec<(String, Descriptor)>, RegistryError> {
    let m: FilesManifest = serde_json::from_slice(bytes)
        .map_err(|e| artifact_err(what, format!("not an OCI image manifest: {e}")))?;
    if m.schema_version != 2 || m.media_type != OCI_MANIFEST_MEDIA_TYPE {
        return Err(artifact_err(what, "not an OCI image manifest (schema 2)"));
    }
    if m.artifact_type != FILES_ARTIFACT_TYPE {
        return Err(artifact_err(
            what,
            format!("artifactType {:?}, not {FILES_ARTIFACT_TYPE} (a snapshot layer is pulled with vmstore pull)", m.artifact_type),
        ));
    }
    if m.layers.is_empty() || m.layers.len() > MAX_FILES {
        return Err(artifact_err(
            what,
            format!("{} files, not 1 to {MAX_FILES}", m.layers.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for d in m.layers {
        let name = d
            .annotations
            .get(ANNOTATION_TITLE)
            .cloned()
            .unwrap_or_default();
        if d.media_type != FILE_MEDIA_TYPE || digest_hex(&d.digest).is_err() {
            return Err(artifact_err(
                what,
                format!(
                    "blob {} is not a {FILE_MEDIA_TYPE} with a sha256 digest",
                    d.digest
                ),
            ));
        }
        if !valid_name(&name) || !seen.insert(name.clone()) {
            return Err(artifact_err(
                what,
                format!("file name {name:?} is not a relative path of plain names, or is repeated"),
            ));
        }
        out.push((name, d));
    }
    Ok(out)
}

/// Pull the files artifact `reference` (`REGISTRY/REPOSITORY:TAG` or
/// `...@sha256:DIGEST`) into `dir` (created if missing), each file
/// replacing any file of that name. Blocking.
pub fn pull_files(
    reference: &str,
    dir: &Path,
    conn: &Connection,
) -> Result<FilesReport, RegistryError> {
    block_on(async {
        let reg =
            Registry::connect(reference, conn, |r| scopes(r.repository(), false, None)).await?;
        let (bytes, digest) = reg.pull_manifest(&reg.reference, None).await?;
        let files = parse_files_manifest(&bytes, reference)?;
        let mut report = FilesReport {
            reference: reg.reference.to_string(),
            digest,
            files: Vec::new(),
        };
        for (name, d) in files {
            let path = dir.join(&name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_err(parent, "create", e))?;
            }
            receive(&reg, &d, &name, &path).await?;
            report.files.push(FileEntry {
                name,
                digest: d.digest,
                size: d.size,
                transferred: true,
            });
        }
        Ok(report)
    })
}

/// Fetch blob `d` into `path`: written to a temporary file of this call's
/// own beside it ([`partial_path`]), checked against its size and digest,
/// fsynced and renamed into place, so that processes fetching the same
/// blob at once each write their own file and `path` is always whole.
/// Transient failures are retried from the blob's first byte.
pub(super) async fn receive(
    reg: &Registry,
    d: &Descriptor,
    name: &str,
    path: &Path,
) -> Result<(), RegistryError> {
    let tmp = partial_path(path);
    let op = format!("fetch {name} ({})", d.digest);
    let what = format!("blob {} ({name})", d.digest);
    let mut backoff = reg.backoff();
    let (received, found) = loop {
        let mut out = File::create(&tmp).map_err(|e| io_err(&tmp, "create", e))?;
        let mut h = Sha256::new();
        let mut n = 0u64;
        let attempt = async {
            let mut body = reg.blob(&d.digest, d.size, &what).await?;
            while let Some(chunk) = body.chunk().await? {
                h.update(&chunk);
                n += chunk.len() as u64;
                if let Err(e) = out.write_all(&chunk) {
                    return Ok(Err(io_err(&tmp, "write", e)));
                }
            }
            Ok::<_, Failure>(Ok(()))
        };
        match attempt.await {
            Ok(Ok(())) => {
                out.sync_all().map_err(|e| io_err(&tmp, "fsync", e))?;
                break (n, crate::hash::hex(&h.finalize()));
            }
            Ok(Err(e)) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            Err(f) if backoff.retry(&f).await => {}
            Err(f) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(reg.error(&op, f, backoff.attempts()));
            }
        }
    };
    if received != d.size || Ok(found.as_str()) != digest_hex(&d.digest) {
        let _ = std::fs::remove_file(&tmp);
        return Err(artifact_err(
            name,
            format!(
                "blob {} is corrupted or truncated: received {received} bytes (descriptor: {}) with sha256:{found}; {} left as it was",
                d.digest, d.size, path.display()
            ),
        ));
    }
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, "rename", e))
}

/// `DIR/.NAME.PID-NONCE.partial` for `DIR/NAME`: a temporary file beside
/// `path` that no other process or call names (the process ID and a
/// [`nonce`]), to be renamed over `path` once written.
pub(super) fn partial_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.{}-{:016x}.partial",
        std::process::id(),
        nonce()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_relative_paths_of_plain_components() {
        for ok in ["Image", "conformance/sgi.Image", "a.b/c"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/",
            "a\\b",
            ".",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    fn manifest(artifact: &str, titles: &[&str]) -> Vec<u8> {
        let layers: Vec<Descriptor> = titles
            .iter()
            .map(|t| Descriptor {
                media_type: FILE_MEDIA_TYPE.into(),
                digest: digest_of(t.as_bytes()),
                size: t.len() as u64,
                annotations: BTreeMap::from([(ANNOTATION_TITLE.to_string(), t.to_string())]),
            })
            .collect();
        serde_json::to_vec(&FilesManifest {
            schema_version: 2,
            media_type: OCI_MANIFEST_MEDIA_TYPE.into(),
            artifact_type: artifact.into(),
            config: Descriptor {
                media_type: EMPTY_CONFIG_MEDIA_TYPE.into(),
                digest: digest_of(EMPTY_CONFIG),
                size: 2,
                annotations: BTreeMap::new(),
            },
            layers,
        })
        .unwrap()
    }

    #[test]
    fn manifests_are_checked_before_anything_is_fetched() {
        let ok =
            parse_files_manifest(&manifest(FILES_ARTIFACT_TYPE, &["Image", "c/x"]), "r").unwrap();
        assert_eq!(
            ok.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["Image", "c/x"]
        );
        let e = parse_files_manifest(&manifest("application/vnd.ignition.layer.v1", &["a"]), "r")
            .unwrap_err();
        assert!(e.to_string().contains("vmstore pull"), "{e}");
        for titles in [&["a", "a"][..], &["../a"], &["/a"], &[]] {
            assert!(
                parse_files_manifest(&manifest(FILES_ARTIFACT_TYPE, titles), "r").is_err(),
                "{titles:?}"
            );
        }
        assert!(parse_files_manifest(b"{}", "r").is_err());
    }

    #[test]
    fn partial_files_sit_beside_their_target_each_with_a_name_of_its_own() {
        let a = partial_path(Path::new("/d/c/sgi.Image"));
        let b = partial_path(Path::new("/d/c/sgi.Image"));
        assert_ne!(a, b);
        for p in [&a, &b] {
            assert_eq!(p.parent(), Some(Path::new("/d/c")));
            let name = p.file_name().unwrap().to_str().unwrap();
            let own = format!(".sgi.Image.{}-", std::process::id());
            assert!(
                name.starts_with(&own) && name.ends_with(".partial"),
                "{name}"
            );
        }
    }
}
