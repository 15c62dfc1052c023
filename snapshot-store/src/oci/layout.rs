//! The artifact layout: how one store layer is an OCI artifact (FORMAT.md,
//! "Registry artifacts"). One OCI image manifest (image-spec v1.1,
//! `manifest.md`, the "artifact" guidance with `artifactType`) per layer:
//! the layer's `manifest.json` is the config blob, each other file of the
//! layer one entry of `layers` (a blob), and a diff names its parent's OCI
//! manifest in `subject`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ParseError;
use crate::format::manifest::Manifest;
use crate::format::{DISK_CHUNKS_FILE, DISK_DIFF_FILE, DISK_FILE, MEMORY_FILE, STATE_FILE};
use crate::hash::{hex, is_sha256_hex, sha256};

use super::RegistryError;

/// `mediaType` of an OCI image manifest (image-spec v1.1, `media-types.md`).
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// `artifactType` of a layer's OCI manifest: an Ignition store layer.
pub const ARTIFACT_TYPE: &str = "application/vnd.ignition.layer.v1";
/// Media type of the config blob: the layer's `manifest.json`, byte for byte.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.ignition.layer.manifest.v1+json";
/// Media type of a `memory.bin` blob.
pub const MEMORY_MEDIA_TYPE: &str = "application/vnd.ignition.layer.memory.v1";
/// Media type of a `state.bin` blob.
pub const STATE_MEDIA_TYPE: &str = "application/vnd.ignition.layer.state.v1";
/// Media type of a `disk.img` blob.
pub const DISK_MEDIA_TYPE: &str = "application/vnd.ignition.layer.disk.v1";
/// Media type of a `disk.diff` blob.
pub const DISK_DIFF_MEDIA_TYPE: &str = "application/vnd.ignition.layer.disk-diff.v1";
/// Media type of a `disk.chunks` blob.
pub const DISK_CHUNKS_MEDIA_TYPE: &str = "application/vnd.ignition.layer.disk-chunks.v1";
/// Suffix of a blob media type whose blob is one zstd frame (RFC 8878) of
/// the file, not the file itself (image-spec's structured-syntax suffix).
pub const ZSTD_SUFFIX: &str = "+zstd";
/// Annotation naming the file a blob holds (image-spec `annotations.md`).
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
/// Annotation with the layer's creation time, RFC 3339 UTC.
pub const ANNOTATION_CREATED: &str = "org.opencontainers.image.created";
/// Annotation with the layer's snapshot name (informational: the config is
/// authoritative).
pub const ANNOTATION_NAME: &str = "dev.ignition.layer.name";
/// Annotation with the layer's kind, `full` or `diff` (informational).
pub const ANNOTATION_KIND: &str = "dev.ignition.layer.kind";
/// Largest OCI manifest read, in bytes: the size every registry must accept
/// (distribution-spec v1.1, "Pushing Manifests": at least 4 MiB).
pub const MAX_OCI_MANIFEST_BYTES: usize = 4 << 20;

/// Transport compression of a layer's file blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Each blob is the file's bytes.
    #[default]
    None,
    /// Each blob is one zstd frame of the file; media types end in
    /// [`ZSTD_SUFFIX`].
    Zstd,
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
        })
    }
}

/// The media type of the blob of layer file `file` (a name from
/// [`crate::format::LAYER_FILES`] other than `manifest.json`), or `None` for any
/// other name.
pub fn file_media_type(file: &str, compression: Compression) -> Option<String> {
    let base = match file {
        MEMORY_FILE => MEMORY_MEDIA_TYPE,
        STATE_FILE => STATE_MEDIA_TYPE,
        DISK_FILE => DISK_MEDIA_TYPE,
        DISK_DIFF_FILE => DISK_DIFF_MEDIA_TYPE,
        DISK_CHUNKS_FILE => DISK_CHUNKS_MEDIA_TYPE,
        _ => return None,
    };
    Some(match compression {
        Compression::None => base.to_string(),
        Compression::Zstd => format!("{base}{ZSTD_SUFFIX}"),
    })
}

/// The layer file and compression a blob media type stands for, or `None`
/// if it is not one of [`file_media_type`]'s.
pub fn parse_file_media_type(media_type: &str) -> Option<(&'static str, Compression)> {
    let (base, compression) = match media_type.strip_suffix(ZSTD_SUFFIX) {
        Some(b) => (b, Compression::Zstd),
        None => (media_type, Compression::None),
    };
    let file = match base {
        MEMORY_MEDIA_TYPE => MEMORY_FILE,
        STATE_MEDIA_TYPE => STATE_FILE,
        DISK_MEDIA_TYPE => DISK_FILE,
        DISK_DIFF_MEDIA_TYPE => DISK_DIFF_FILE,
        DISK_CHUNKS_MEDIA_TYPE => DISK_CHUNKS_FILE,
        _ => return None,
    };
    Some((file, compression))
}

/// An OCI digest string, `sha256:` and 64 lower-case hex digits, for the
/// bytes `data` (image-spec `descriptor.md`, "Digests").
pub fn digest_of(data: &[u8]) -> String {
    format!("sha256:{}", hex(&sha256(data)))
}

/// The 64 hex digits of an OCI digest `sha256:HEX`. Other algorithms are
/// refused (a [`ParseError`] saying so): the store pins everything with
/// sha256.
pub fn digest_hex(digest: &str) -> Result<&str, ParseError> {
    match digest.strip_prefix("sha256:") {
        Some(h) if is_sha256_hex(h) => Ok(h),
        Some(_) => Err(ParseError::new(format!(
            "digest {digest:?} is not sha256: followed by 64 lower-case hex digits"
        ))),
        None => Err(ParseError::new(format!(
            "digest {digest:?} does not use sha256, the only algorithm accepted"
        ))),
    }
}

/// An OCI content descriptor (image-spec `descriptor.md`). Field order is
/// the serialization order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// `sha256:HEX` of the referenced bytes.
    pub digest: String,
    /// Length of the referenced bytes.
    pub size: u64,
    /// Annotations (keys serialized in byte order); absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The OCI image manifest of one layer. Field order is the serialization
/// order; [`ArtifactManifest::to_bytes`] is the exact byte layout.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`OCI_MANIFEST_MEDIA_TYPE`].
    pub media_type: String,
    /// [`ARTIFACT_TYPE`].
    pub artifact_type: String,
    /// The layer's `manifest.json` ([`CONFIG_MEDIA_TYPE`]); its digest is
    /// the layer's content hash.
    pub config: Descriptor,
    /// The layer's other files, in [`crate::format::LAYER_FILES`] order, each with
    /// its [`ANNOTATION_TITLE`].
    pub layers: Vec<Descriptor>,
    /// A diff's parent: the parent layer's OCI manifest. Absent for a full
    /// layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    /// [`ANNOTATION_CREATED`], [`ANNOTATION_KIND`], [`ANNOTATION_NAME`].
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// One file blob of a layer, as listed in its OCI manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBlob {
    /// The layer file it holds, e.g. `memory.bin`.
    pub file: &'static str,
    /// How the blob encodes the file.
    pub compression: Compression,
    /// Its descriptor.
    pub descriptor: Descriptor,
}

impl ArtifactManifest {
    /// The OCI manifest of the layer whose `manifest.json` is `config` (its
    /// parsed form `m`), with the file blobs `blobs` (`(file, compression,
    /// digest, blob size)`, in [`crate::format::LAYER_FILES`] order) and, for a
    /// diff, the parent's OCI manifest `subject` (`(digest, size)`).
    pub fn build(
        m: &Manifest,
        config: &[u8],
        blobs: &[(&str, Compression, String, u64)],
        subject: Option<(String, u64)>,
    ) -> ArtifactManifest {
        let layers = blobs
            .iter()
            .map(|(file, c, digest, size)| Descriptor {
                media_type: file_media_type(file, *c).unwrap_or_default(),
                digest: digest.clone(),
                size: *size,
                annotations: BTreeMap::from([(ANNOTATION_TITLE.to_string(), file.to_string())]),
            })
            .collect();
        ArtifactManifest {
            schema_version: 2,
            media_type: OCI_MANIFEST_MEDIA_TYPE.to_string(),
            artifact_type: ARTIFACT_TYPE.to_string(),
            config: Descriptor {
                media_type: CONFIG_MEDIA_TYPE.to_string(),
                digest: digest_of(config),
                size: config.len() as u64,
                annotations: BTreeMap::new(),
            },
            layers,
            subject: subject.map(|(digest, size)| Descriptor {
                media_type: OCI_MANIFEST_MEDIA_TYPE.to_string(),
                digest,
                size,
                annotations: BTreeMap::new(),
            }),
            annotations: BTreeMap::from([
                (ANNOTATION_CREATED.to_string(), m.created.clone()),
                (ANNOTATION_KIND.to_string(), m.kind.to_string()),
                (ANNOTATION_NAME.to_string(), m.name.clone()),
            ]),
        }
    }

    /// The exact bytes pushed: compact JSON (no whitespace), fields in
    /// declaration order, annotation keys in byte order, no trailing
    /// newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Plain structs of strings and integers cannot fail to serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parse and check an OCI manifest as an Ignition layer artifact:
    /// schema version 2, the image manifest media type, [`ARTIFACT_TYPE`],
    /// a [`CONFIG_MEDIA_TYPE`] config, sha256 digests, a manifest subject
    /// if any, and file blobs of known media types whose title annotation
    /// (if present) agrees, `memory.bin` and `state.bin` exactly once and
    /// the disk's two together or not at all. `what` names the manifest in
    /// errors. Fields this layout does not use are ignored.
    pub fn parse(
        bytes: &[u8],
        what: &str,
    ) -> Result<(ArtifactManifest, Vec<FileBlob>), RegistryError> {
        let bad = |msg: String| RegistryError::Artifact {
            what: what.to_string(),
            msg,
        };
        if bytes.len() > MAX_OCI_MANIFEST_BYTES {
            return Err(bad(format!(
                "manifest is {} bytes, more than {MAX_OCI_MANIFEST_BYTES}",
                bytes.len()
            )));
        }
        let a: ArtifactManifest = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not an OCI image manifest: {e}")))?;
        if a.schema_version != 2 {
            return Err(bad(format!("schemaVersion is {}, not 2", a.schema_version)));
        }
        if a.media_type != OCI_MANIFEST_MEDIA_TYPE {
            return Err(bad(format!(
                "mediaType is {:?}, not {OCI_MANIFEST_MEDIA_TYPE}",
                a.media_type
            )));
        }
        if a.artifact_type != ARTIFACT_TYPE {
            return Err(bad(format!(
                "artifactType is {:?}, not {ARTIFACT_TYPE}: not an Ignition snapshot layer",
                a.artifact_type
            )));
        }
        if a.config.media_type != CONFIG_MEDIA_TYPE {
            return Err(bad(format!(
                "config mediaType is {:?}, not {CONFIG_MEDIA_TYPE}",
                a.config.media_type
            )));
        }
        let mut all = vec![&a.config];
        all.extend(a.subject.as_ref());
        all.extend(&a.layers);
        for d in all {
            digest_hex(&d.digest).map_err(|e| bad(e.0))?;
        }
        if let Some(s) = &a.subject {
            if s.media_type != OCI_MANIFEST_MEDIA_TYPE {
                return Err(bad(format!(
                    "subject mediaType is {:?}, not {OCI_MANIFEST_MEDIA_TYPE}",
                    s.media_type
                )));
            }
        }
        let mut files: Vec<FileBlob> = Vec::new();
        for d in &a.layers {
            let Some((file, compression)) = parse_file_media_type(&d.media_type) else {
                return Err(bad(format!(
                    "blob {} has unknown mediaType {:?}",
                    d.digest, d.media_type
                )));
            };
            if let Some(t) = d.annotations.get(ANNOTATION_TITLE) {
                if t != file {
                    return Err(bad(format!(
                        "blob {} is titled {t:?} but its mediaType is that of {file}",
                        d.digest
                    )));
                }
            }
            if files.iter().any(|f| f.file == file) {
                return Err(bad(format!("{file} is listed twice")));
            }
            files.push(FileBlob {
                file,
                compression,
                descriptor: d.clone(),
            });
        }
        let has = |f: &str| files.iter().any(|b| b.file == f);
        for f in [MEMORY_FILE, STATE_FILE] {
            if !has(f) {
                return Err(bad(format!("no {f} blob")));
            }
        }
        let data = [DISK_FILE, DISK_DIFF_FILE]
            .iter()
            .filter(|f| has(f))
            .count();
        if data > 1 || (data == 1) != has(DISK_CHUNKS_FILE) {
            return Err(bad(format!(
                "{DISK_CHUNKS_FILE} and one of {DISK_FILE} or {DISK_DIFF_FILE} must come together"
            )));
        }
        Ok((a, files))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::manifest::LayerKind;

    fn blobs() -> Vec<(&'static str, Compression, String, u64)> {
        vec![
            (MEMORY_FILE, Compression::None, digest_of(b"m"), 1),
            (STATE_FILE, Compression::None, digest_of(b"s"), 1),
        ]
    }

    #[test]
    fn media_types_round_trip() {
        for f in [
            MEMORY_FILE,
            STATE_FILE,
            DISK_FILE,
            DISK_DIFF_FILE,
            DISK_CHUNKS_FILE,
        ] {
            for c in [Compression::None, Compression::Zstd] {
                let mt = file_media_type(f, c).unwrap();
                assert!(mt.starts_with("application/vnd.ignition.layer."), "{mt}");
                assert_eq!(mt.ends_with("+zstd"), c == Compression::Zstd);
                assert_eq!(parse_file_media_type(&mt), Some((f, c)));
            }
        }
        assert_eq!(file_media_type("manifest.json", Compression::None), None);
        assert_eq!(
            parse_file_media_type("application/vnd.oci.image.layer.v1.tar"),
            None
        );
        assert_eq!(
            file_media_type(MEMORY_FILE, Compression::Zstd).unwrap(),
            "application/vnd.ignition.layer.memory.v1+zstd"
        );
        assert_eq!(
            file_media_type(DISK_CHUNKS_FILE, Compression::None).unwrap(),
            "application/vnd.ignition.layer.disk-chunks.v1"
        );
    }

    #[test]
    fn digests() {
        let d = digest_of(b"abc");
        assert_eq!(
            d,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(digest_hex(&d).unwrap(), &d[7..]);
        assert!(digest_hex("sha512:00").unwrap_err().0.contains("sha256"));
        assert!(digest_hex(&d.to_uppercase().replace("SHA256", "sha256")).is_err());
        assert!(digest_hex("sha256:abc").is_err());
    }

    #[test]
    fn the_manifest_of_a_full_layer_byte_for_byte() {
        let mut m = crate::format::manifest::tests::sample(LayerKind::Full);
        m.name = "golden".into();
        let config = b"{}\n";
        let a = ArtifactManifest::build(&m, config, &blobs(), None);
        let text = String::from_utf8(a.to_bytes()).unwrap();
        let want = format!(
            concat!(
                r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","#,
                r#""artifactType":"application/vnd.ignition.layer.v1","#,
                r#""config":{{"mediaType":"application/vnd.ignition.layer.manifest.v1+json","digest":"{}","size":3}},"#,
                r#""layers":[{{"mediaType":"application/vnd.ignition.layer.memory.v1","digest":"{}","size":1,"annotations":{{"org.opencontainers.image.title":"memory.bin"}}}},"#,
                r#"{{"mediaType":"application/vnd.ignition.layer.state.v1","digest":"{}","size":1,"annotations":{{"org.opencontainers.image.title":"state.bin"}}}}],"#,
                r#""annotations":{{"dev.ignition.layer.kind":"full","dev.ignition.layer.name":"golden","org.opencontainers.image.created":"{}"}}}}"#
            ),
            digest_of(config),
            digest_of(b"m"),
            digest_of(b"s"),
            m.created
        );
        assert_eq!(text, want);
        let (back, files) = ArtifactManifest::parse(text.as_bytes(), "t").unwrap();
        assert_eq!(back, a);
        assert_eq!(
            files.iter().map(|f| f.file).collect::<Vec<_>>(),
            [MEMORY_FILE, STATE_FILE]
        );
    }

    #[test]
    fn a_diff_names_its_parent_manifest_in_subject() {
        let m = crate::format::manifest::tests::sample(LayerKind::Diff);
        let parent = digest_of(b"parent manifest");
        let mut b = blobs();
        b[0].1 = Compression::Zstd;
        let a = ArtifactManifest::build(&m, b"{}", &b, Some((parent.clone(), 99)));
        let text = String::from_utf8(a.to_bytes()).unwrap();
        assert!(text.contains(&format!(
            r#""subject":{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{parent}","size":99}}"#
        )), "{text}");
        assert!(text.contains("memory.v1+zstd"));
        let (back, files) = ArtifactManifest::parse(text.as_bytes(), "t").unwrap();
        assert_eq!(back.subject.unwrap().digest, parent);
        assert_eq!(files[0].compression, Compression::Zstd);
    }

    #[test]
    fn parse_refuses_what_is_not_a_layer() {
        let m = crate::format::manifest::tests::sample(LayerKind::Full);
        let good = ArtifactManifest::build(&m, b"{}", &blobs(), None);
        let check = |f: &dyn Fn(&mut ArtifactManifest), want: &str| {
            let mut a = good.clone();
            f(&mut a);
            let e = ArtifactManifest::parse(&a.to_bytes(), "layer x")
                .unwrap_err()
                .to_string();
            assert!(e.contains("layer x") && e.contains(want), "{e}");
        };
        check(
            &|a| a.artifact_type = "application/vnd.other".into(),
            "artifactType",
        );
        check(&|a| a.schema_version = 1, "schemaVersion");
        check(
            &|a| a.config.media_type = "application/json".into(),
            "config mediaType",
        );
        check(&|a| a.layers[0].digest = "sha256:zz".into(), "digest");
        check(
            &|a| a.layers[1].media_type = "text/plain".into(),
            "unknown mediaType",
        );
        check(&|a| a.layers.truncate(1), "no state.bin");
        check(&|a| a.layers.push(a.layers[0].clone()), "twice");
        check(
            &|a| {
                a.layers[0]
                    .annotations
                    .insert(ANNOTATION_TITLE.into(), "state.bin".into());
            },
            "titled",
        );
        check(
            &|a| {
                let mut d = a.layers[0].clone();
                d.media_type = DISK_MEDIA_TYPE.into();
                d.annotations.clear();
                a.layers.push(d);
            },
            "together",
        );
        assert!(ArtifactManifest::parse(b"[]", "y")
            .unwrap_err()
            .to_string()
            .contains("not an OCI image manifest"));
    }
}
