//! Container images pulled from a registry into an OCI image layout
//! directory (`vmstore image-pull`), for tools that turn an image into a
//! guest's root file system (`python3 -m ignition.image build`).
//!
//! The reference may name an image index (OCI image-spec `image-index.md`,
//! or Docker's manifest list): the manifest for the platform asked for
//! (`linux/arm64` by default) is picked from it. The manifest (OCI
//! `manifest.md` or Docker's schema 2) is checked before any blob is
//! fetched: media types, sha256 digests, at most [`MAX_IMAGE_LAYERS`]
//! layers, a config of at most [`MAX_IMAGE_CONFIG_BYTES`], and declared
//! sizes that add up to no more than the caller's bound. Each blob is then
//! fetched with the client's limits (never past its declared size, checked
//! against its digest, renamed into place only once whole) into
//! `DIR/blobs/sha256/HEX`; a blob already there is hashed and kept if it
//! matches. `DIR/index.json` then names the pulled manifest (and only it)
//! and `DIR/oci-layout` marks the directory (image-spec
//! `image-layout.md`). Layer contents are not looked into here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::client::{parse_reference, scopes, Registry};
use super::files::{hash_file, partial_path, receive};
use super::layout::{digest_hex, digest_of, Descriptor, OCI_MANIFEST_MEDIA_TYPE};
use super::{block_on, io_err, Connection, RegistryError};

/// An OCI image index.
pub const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// Docker's manifest list (an index).
pub const DOCKER_LIST_MEDIA_TYPE: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker's image manifest, schema 2.
pub const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The layer media types accepted: plain, gzip and zstd tars (OCI), and
/// Docker's gzip tar.
pub const IMAGE_LAYER_MEDIA_TYPES: [&str; 4] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];
/// The config media types accepted (OCI's and Docker's).
pub const IMAGE_CONFIG_MEDIA_TYPES: [&str; 2] = [
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
/// Most layers an image may have.
pub const MAX_IMAGE_LAYERS: usize = 256;
/// Largest image config accepted, in bytes.
pub const MAX_IMAGE_CONFIG_BYTES: u64 = 4 << 20;
/// The default bound on an image's blobs, their declared sizes added up
/// (config and layers, as stored in the registry: compressed).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 8 << 30;

/// What to pull, and the bounds.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// `OS/ARCHITECTURE[/VARIANT]`, e.g. `linux/arm64`.
    pub platform: String,
    /// Most bytes the config and layers may declare, added up.
    pub max_bytes: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            platform: "linux/arm64".into(),
            max_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }
}

/// One blob of a pulled image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBlob {
    /// Its media type.
    pub media_type: String,
    /// `sha256:HEX`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
    /// `false` if the layout had it already.
    pub transferred: bool,
}

/// What `pull_image` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReport {
    /// The reference as resolved (`REGISTRY/REPOSITORY:TAG` or `@DIGEST`).
    pub reference: String,
    /// `sha256:HEX` of the index the reference named, if it named one.
    pub index_digest: Option<String>,
    /// `sha256:HEX` of the platform's image manifest: the image's identity.
    pub digest: String,
    /// The manifest's media type.
    pub media_type: String,
    /// The config blob.
    pub config: ImageBlob,
    /// The layer blobs, bottom first.
    pub layers: Vec<ImageBlob>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Platform {
    architecture: String,
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct IndexEntry {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

/// An index or a manifest, told apart by `mediaType` (or, where an OCI
/// document leaves it out, by which of `manifests` and `layers` it has).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<IndexEntry>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

fn image_err(what: &str, msg: impl Into<String>) -> RegistryError {
    RegistryError::Artifact {
        what: what.to_string(),
        msg: msg.into(),
    }
}

fn parse_document(bytes: &[u8], what: &str) -> Result<Document, RegistryError> {
    let d: Document = serde_json::from_slice(bytes)
        .map_err(|e| image_err(what, format!("not an image index or manifest: {e}")))?;
    if d.schema_version != 2 {
        return Err(image_err(
            what,
            format!("schemaVersion {}, not 2", d.schema_version),
        ));
    }
    Ok(d)
}

/// Whether `p` is the platform `want` (`OS/ARCH[/VARIANT]`; a variant in
/// `want` must match, none matches any).
fn platform_matches(p: &Platform, want: &str) -> bool {
    let mut w = want.split('/');
    let (os, arch, variant) = (w.next(), w.next(), w.next());
    os == Some(p.os.as_str())
        && arch == Some(p.architecture.as_str())
        && variant.is_none_or(|v| p.variant.as_deref() == Some(v))
}

/// The entry of index `d` for `platform`: the only manifest media types
/// taken are OCI's and Docker's.
fn pick_manifest(d: Document, platform: &str, what: &str) -> Result<IndexEntry, RegistryError> {
    let entries = d.manifests.unwrap_or_default();
    let offered: Vec<String> = entries
        .iter()
        .filter_map(|e| e.platform.as_ref())
        .map(|p| match &p.variant {
            Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
            None => format!("{}/{}", p.os, p.architecture),
        })
        .collect();
    let e = entries
        .into_iter()
        .find(|e| {
            e.platform
                .as_ref()
                .is_some_and(|p| platform_matches(p, platform))
        })
        .ok_or_else(|| {
            image_err(
                what,
                format!(
                    "the index has no manifest for {platform} (it has: {})",
                    if offered.is_empty() {
                        "none with a platform".into()
                    } else {
                        offered.join(", ")
                    }
                ),
            )
        })?;
    if e.media_type != OCI_MANIFEST_MEDIA_TYPE && e.media_type != DOCKER_MANIFEST_MEDIA_TYPE {
        return Err(image_err(
            what,
            format!(
                "the {platform} entry is a {}, not an image manifest",
                e.media_type
            ),
        ));
    }
    digest_hex(&e.digest).map_err(|err| image_err(what, err.0))?;
    Ok(e)
}

/// The config and layers of image manifest `d`, checked against the
/// bounds of `opts`.
fn check_manifest(
    d: Document,
    opts: &ImageOptions,
    what: &str,
) -> Result<(String, Descriptor, Vec<Descriptor>), RegistryError> {
    let media_type = d
        .media_type
        .unwrap_or_else(|| OCI_MANIFEST_MEDIA_TYPE.into());
    if media_type != OCI_MANIFEST_MEDIA_TYPE && media_type != DOCKER_MANIFEST_MEDIA_TYPE {
        return Err(image_err(
            what,
            format!("mediaType {media_type:?} is not an image manifest"),
        ));
    }
    let (Some(config), Some(layers)) = (d.config, d.layers) else {
        return Err(image_err(
            what,
            "an image manifest needs a config and layers",
        ));
    };
    if !IMAGE_CONFIG_MEDIA_TYPES.contains(&config.media_type.as_str()) {
        return Err(image_err(
            what,
            format!("config mediaType {:?} is not an image config (an artifact, not a container image?)", config.media_type),
        ));
    }
    if config.size > MAX_IMAGE_CONFIG_BYTES {
        return Err(image_err(
            what,
            format!(
                "config {} declares {} bytes, more than {MAX_IMAGE_CONFIG_BYTES}",
                config.digest, config.size
            ),
        ));
    }
    if layers.is_empty() || layers.len() > MAX_IMAGE_LAYERS {
        return Err(image_err(
            what,
            format!("{} layers, not 1 to {MAX_IMAGE_LAYERS}", layers.len()),
        ));
    }
    let mut total = config.size;
    for (i, l) in std::iter::once(&config).chain(&layers).enumerate() {
        digest_hex(&l.digest).map_err(|e| image_err(what, e.0))?;
        if i > 0 && !IMAGE_LAYER_MEDIA_TYPES.contains(&l.media_type.as_str()) {
            return Err(image_err(
                what,
                format!(
                    "layer {} ({}) has mediaType {:?}, not a tar layer",
                    i - 1,
                    l.digest,
                    l.media_type
                ),
            ));
        }
        total = total.saturating_add(if i > 0 { l.size } else { 0 });
    }
    if total > opts.max_bytes {
        return Err(image_err(
            what,
            format!(
                "the image's blobs declare {total} bytes, more than the bound of {} (--max-bytes)",
                opts.max_bytes
            ),
        ));
    }
    Ok((media_type, config, layers))
}

const ACCEPT_ANY: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// Pull image `reference` (`REGISTRY/REPOSITORY:TAG` or `@sha256:DIGEST`)
/// for `opts.platform` into the OCI image layout `dir` (created if
/// missing). Blocking. Errors: the reference, the registry (with the
/// client's limits), an index without the platform, a manifest outside the
/// bounds, a blob that does not match its digest or size.
pub fn pull_image(
    reference: &str,
    dir: &Path,
    opts: &ImageOptions,
    conn: &Connection,
) -> Result<ImageReport, RegistryError> {
    parse_reference(reference)?;
    block_on(async {
        let reg =
            Registry::connect(reference, conn, |r| scopes(r.repository(), false, None)).await?;
        let (bytes, digest) = reg
            .pull_manifest_accepting(&reg.reference, None, ACCEPT_ANY)
            .await?;
        let doc = parse_document(&bytes, reference)?;
        let is_index = doc.manifests.is_some()
            || matches!(
                doc.media_type.as_deref(),
                Some(OCI_INDEX_MEDIA_TYPE | DOCKER_LIST_MEDIA_TYPE)
            );
        let (index_digest, bytes, digest, doc) = if is_index {
            let e = pick_manifest(doc, &opts.platform, reference)?;
            let at = reg.at(&e.digest);
            let (b, d) = reg
                .pull_manifest_accepting(&at, Some(e.size), ACCEPT_ANY)
                .await?;
            let doc = parse_document(&b, &at.to_string())?;
            (Some(digest), b, d, doc)
        } else {
            (None, bytes, digest, doc)
        };
        let (media_type, config, layers) = check_manifest(doc, opts, reference)?;
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).map_err(|e| io_err(&blobs, "create", e))?;
        let mut fetched = Vec::new();
        for (i, d) in std::iter::once(&config).chain(&layers).enumerate() {
            let name = if i == 0 {
                "config".to_string()
            } else {
                format!("layer {}", i - 1)
            };
            let path = blobs.join(digest_hex(&d.digest).map_err(|e| image_err(reference, e.0))?);
            let have = path.is_file() && hash_file(&path)? == (d.size, d.digest.clone());
            if !have {
                receive(&reg, d, &name, &path).await?;
            }
            fetched.push(ImageBlob {
                media_type: d.media_type.clone(),
                digest: d.digest.clone(),
                size: d.size,
                transferred: !have,
            });
        }
        write_layout(
            dir,
            &blobs,
            &bytes,
            &digest,
            &media_type,
            &reg.reference.to_string(),
        )?;
        let config = fetched.remove(0);
        Ok(ImageReport {
            reference: reg.reference.to_string(),
            index_digest,
            digest,
            media_type,
            config,
            layers: fetched,
        })
    })
}

/// Store the manifest `bytes` as a blob and write `index.json` naming it
/// and `oci-layout`, each through a temporary file of this call's own
/// ([`partial_path`]) and a rename, so that pulls into one layout at once
/// do not write into each other's files.
fn write_layout(
    dir: &Path,
    blobs: &Path,
    bytes: &[u8],
    digest: &str,
    media_type: &str,
    reference: &str,
) -> Result<(), RegistryError> {
    debug_assert_eq!(digest_of(bytes), digest);
    let hex = digest_hex(digest).map_err(|e| image_err(reference, e.0))?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": media_type,
            "digest": digest,
            "size": bytes.len(),
            "annotations": BTreeMap::from([("org.opencontainers.image.ref.name", reference)]),
        }],
    });
    let files: [(PathBuf, Vec<u8>); 3] = [
        (blobs.join(hex), bytes.to_vec()),
        (
            dir.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        (dir.join("index.json"), index.to_string().into_bytes()),
    ];
    for (path, data) in files {
        let tmp = partial_path(&path);
        std::fs::write(&tmp, data).map_err(|e| io_err(&tmp, "write", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, "rename", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(media_type: &str, data: &[u8]) -> serde_json::Value {
        serde_json::json!({"mediaType": media_type, "digest": digest_of(data), "size": data.len()})
    }

    #[test]
    fn an_index_gives_the_platform_s_manifest() {
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX_MEDIA_TYPE,
            "manifests": [
                {"mediaType": OCI_MANIFEST_MEDIA_TYPE, "digest": digest_of(b"amd"), "size": 3,
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": OCI_MANIFEST_MEDIA_TYPE, "digest": digest_of(b"arm"), "size": 3,
                 "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            ],
        });
        let bytes = serde_json::to_vec(&index).unwrap();
        let pick = |p: &str| pick_manifest(parse_document(&bytes, "r").unwrap(), p, "r");
        assert_eq!(pick("linux/arm64").unwrap().digest, digest_of(b"arm"));
        assert_eq!(pick("linux/arm64/v8").unwrap().digest, digest_of(b"arm"));
        let e = pick("linux/riscv64").unwrap_err().to_string();
        assert!(e.contains("linux/amd64, linux/arm64/v8"), "{e}");
        assert!(pick("linux/arm64/v9").is_err());
    }

    fn manifest(config_type: &str, layers: &[(&str, &[u8])]) -> Document {
        let m = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "config": desc(config_type, b"{}"),
            "layers": layers.iter().map(|(t, d)| desc(t, d)).collect::<Vec<_>>(),
        });
        parse_document(&serde_json::to_vec(&m).unwrap(), "r").unwrap()
    }

    #[test]
    fn manifests_are_checked_before_any_blob() {
        let opts = ImageOptions::default();
        let cfg = IMAGE_CONFIG_MEDIA_TYPES[0];
        let tgz = IMAGE_LAYER_MEDIA_TYPES[1];
        let (_, _, layers) =
            check_manifest(manifest(cfg, &[(tgz, b"a"), (tgz, b"b")]), &opts, "r").unwrap();
        assert_eq!(layers.len(), 2);
        let e = check_manifest(
            manifest(
                "application/vnd.ignition.layer.manifest.v1+json",
                &[(tgz, b"a")],
            ),
            &opts,
            "r",
        )
        .unwrap_err();
        assert!(e.to_string().contains("not an image config"), "{e}");
        let e =
            check_manifest(manifest(cfg, &[("application/x-foo", b"a")]), &opts, "r").unwrap_err();
        assert!(e.to_string().contains("layer 0"), "{e}");
        assert!(check_manifest(manifest(cfg, &[]), &opts, "r").is_err());
        let small = ImageOptions {
            max_bytes: 4,
            ..opts
        };
        let e = check_manifest(manifest(cfg, &[(tgz, b"abcd")]), &small, "r").unwrap_err();
        assert!(e.to_string().contains("--max-bytes"), "{e}");
    }
}
