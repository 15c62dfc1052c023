//! `manifest.json`: the description of one layer.
//!
//! The file is the canonical pretty JSON serialization of [`Manifest`] plus a
//! trailing newline; anything else (other whitespace, key order, escapes) is
//! rejected, and `manifest_sha256` seals the content, so every byte of the
//! file is checked even for the top layer of a chain (whose manifest no child
//! pins).

use serde::{Deserialize, Serialize};

use crate::error::ParseError;
use crate::format::chunks::check_chunk_geometry;
use crate::format::diff::diff_file_size;
use crate::format::disk_diff::{disk_diff_file_size, DISK_DIFF_SINCE};
use crate::format::state::{MAX_STATE_BYTES, STATE_HEADER_LEN};
use crate::format::{
    check_geometry, FormatVersion, DISK_CHUNKS_FILE, DISK_DIFF_FILE, DISK_FILE, MANIFEST_FILE,
    MEMORY_FILE, STATE_FILE,
};
use crate::hash::{hex, is_sha256_hex, sha256};
use crate::name::validate_name;

/// Largest accepted `manifest.json`, in bytes.
pub const MAX_MANIFEST_BYTES: usize = 1 << 20;
/// Largest supported vCPU count.
pub const MAX_VCPUS: u32 = 512;
/// Longest `backend` / `gic_mode` string, in bytes.
pub const MAX_TAG_LEN: usize = 64;
/// Longest `creator` string, in bytes.
pub const MAX_CREATOR_LEN: usize = 128;

/// Whether a layer holds all of RAM or only the pages dirtied since its
/// parent.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// `memory.bin` is the raw RAM image (`ram_size` bytes); no parent.
    Full,
    /// `memory.bin` is a packed diff (see FORMAT.md); has a parent.
    Diff,
}

impl std::fmt::Display for LayerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LayerKind::Full => "full",
            LayerKind::Diff => "diff",
        })
    }
}

/// A child's link to its parent layer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ParentRef {
    /// The parent's snapshot name (its directory name in the store).
    pub name: String,
    /// The parent's content hash: sha256 of its `manifest.json` bytes, lower-case hex.
    pub sha256: String,
}

/// Size and digest of one layer file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Length in bytes (`st_size`).
    pub size: u64,
    /// sha256 of the whole file, lower-case hex.
    pub sha256: String,
}

/// Size, chunk size and digest of a layer's disk, and how it is stored:
/// whole (`disk.img`), or as the chunks written since the parent
/// (`disk.diff`, format 3.1).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DiskEntry {
    /// Length of the disk in bytes: of `disk.img` (`st_size`), or of the
    /// disk a `disk.diff` describes.
    pub size: u64,
    /// Chunk size of the digests in `disk.chunks`, in bytes (a power of two,
    /// see [`super::chunks::check_chunk_geometry`]; the writer uses
    /// [`super::chunks::DISK_CHUNK_SIZE`]).
    pub chunk_size: u64,
    /// The disk's digest, lower-case hex: sha256 of the concatenated sha256
    /// digests of its chunks, which is also the sha256 of the digest list
    /// in `disk.chunks`.
    pub sha256: String,
    /// Number of chunks in `disk.diff`, for a diff layer whose disk is
    /// stored as the chunks written since its parent (its other chunks are
    /// the parent's); absent when the layer holds the whole `disk.img`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_chunks: Option<u64>,
}

impl DiskEntry {
    /// The file holding the disk's data: `disk.diff` or `disk.img`.
    pub fn data_file(&self) -> &'static str {
        if self.diff_chunks.is_some() {
            DISK_DIFF_FILE
        } else {
            DISK_FILE
        }
    }

    /// Exact size in bytes of [`DiskEntry::data_file`] (saturating): the
    /// disk's size, or a `disk.diff`'s.
    pub fn data_file_size(&self) -> u64 {
        match self.diff_chunks {
            Some(n) => disk_diff_file_size(self.chunk_size, n).unwrap_or(u64::MAX),
            None => self.size,
        }
    }
}

/// The contents of `manifest.json`. Field order is the serialization order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Store format version of this layer.
    pub format: FormatVersion,
    /// Full or diff.
    pub kind: LayerKind,
    /// The snapshot name; equals the layer's directory name.
    pub name: String,
    /// The parent layer; present exactly for diff layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// Page size in bytes (power of two, 4 KiB to 64 KiB; Ignition uses 16 KiB).
    pub page_size: u64,
    /// Guest-physical address of the first byte of RAM.
    pub ram_base_gpa: u64,
    /// Guest RAM size in bytes (a multiple of `page_size`).
    pub ram_size: u64,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Hypervisor backend that wrote the state, e.g. `emu` or `hvf`.
    pub backend: String,
    /// Interrupt controller mode, e.g. `userspace` or `hvf`; state does not
    /// move between modes.
    pub gic_mode: String,
    /// Program and version that produced the machine state, e.g. `ignition-vmm 0.1.0`.
    pub creator: String,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: u64,
    /// `created_unix` as RFC 3339 UTC (derived; must match).
    pub created: String,
    /// `memory.bin`.
    pub memory: FileEntry,
    /// Number of pages in a diff layer's `memory.bin`; present exactly for diffs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_pages: Option<u64>,
    /// `state.bin`.
    pub state: FileEntry,
    /// `disk.img` and `disk.chunks`, if the VM had a disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskEntry>,
    /// sha256 of this manifest's canonical bytes with this field set to 64
    /// zeros, lower-case hex.
    pub manifest_sha256: String,
}

/// Just the version, read before the strict parse so that a newer file is
/// reported as "newer" rather than as "unknown field".
#[derive(Deserialize)]
struct VersionProbe {
    format: FormatVersion,
}

pub(crate) const ZERO_HASH: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

impl Manifest {
    /// The canonical file bytes: pretty JSON (two-space indent) and `\n`.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain structs of strings and integers cannot fail.
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// The value `manifest_sha256` must have.
    pub fn compute_self_hash(&self) -> String {
        let mut m = self.clone();
        m.manifest_sha256 = ZERO_HASH.to_string();
        hex(&sha256(&m.to_bytes()))
    }

    /// Set `manifest_sha256` from the other fields.
    pub fn seal(&mut self) {
        self.manifest_sha256 = self.compute_self_hash();
    }

    /// RAM size in pages.
    pub fn ram_pages(&self) -> u64 {
        self.ram_size / self.page_size
    }

    /// Check every field and the relations between them (not the files).
    pub fn validate(&self) -> Result<(), ParseError> {
        let err = |m: String| Err(ParseError(m));
        self.format.check_readable()?;
        if let Err(e) = validate_name(&self.name) {
            return err(format!("name: {e}"));
        }
        check_geometry(self.page_size, self.ram_base_gpa, self.ram_size)?;
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return err(format!("vcpus {} is not in 1..={MAX_VCPUS}", self.vcpus));
        }
        check_tag("backend", &self.backend)?;
        check_tag("gic_mode", &self.gic_mode)?;
        if self.creator.is_empty()
            || self.creator.len() > MAX_CREATOR_LEN
            || !self.creator.bytes().all(|b| (0x20..0x7f).contains(&b))
        {
            return err(format!(
                "creator must be 1..={MAX_CREATOR_LEN} printable ASCII characters"
            ));
        }
        if self.created != crate::time::rfc3339(self.created_unix) {
            return err(format!(
                "created {:?} does not match created_unix {}",
                self.created, self.created_unix
            ));
        }
        match (self.kind, &self.parent, self.diff_pages) {
            (LayerKind::Full, None, None) => {
                if self.memory.size != self.ram_size {
                    return err(format!(
                        "memory.size {} of a full layer differs from ram_size {}",
                        self.memory.size, self.ram_size
                    ));
                }
            }
            (LayerKind::Diff, Some(parent), Some(pages)) => {
                if let Err(e) = validate_name(&parent.name) {
                    return err(format!("parent.name: {e}"));
                }
                if parent.name == self.name {
                    return err("parent.name equals the layer's own name".into());
                }
                check_hash("parent.sha256", &parent.sha256)?;
                if pages > self.ram_pages() {
                    return err(format!(
                        "diff_pages {pages} exceeds the {} pages of RAM",
                        self.ram_pages()
                    ));
                }
                let want = diff_file_size(self.page_size, pages);
                if want != Some(self.memory.size) {
                    return err(format!(
                        "memory.size {} does not fit a diff of {pages} pages of {} bytes",
                        self.memory.size, self.page_size
                    ));
                }
            }
            (LayerKind::Full, _, _) => {
                return err("a full layer has neither parent nor diff_pages".into())
            }
            (LayerKind::Diff, _, _) => {
                return err("a diff layer needs both parent and diff_pages".into())
            }
        }
        check_hash("memory.sha256", &self.memory.sha256)?;
        check_hash("state.sha256", &self.state.sha256)?;
        if self.state.size < STATE_HEADER_LEN as u64
            || self.state.size > STATE_HEADER_LEN as u64 + MAX_STATE_BYTES
        {
            return err(format!(
                "state.size {} is outside {STATE_HEADER_LEN}..={}",
                self.state.size,
                STATE_HEADER_LEN as u64 + MAX_STATE_BYTES
            ));
        }
        if let Some(disk) = &self.disk {
            self.validate_disk(disk)?;
        }
        check_hash("manifest_sha256", &self.manifest_sha256)?;
        Ok(())
    }
}

impl Manifest {
    /// The disk entry's geometry and digest; a `diff_chunks` only in a
    /// diff layer of format 3.1 or later, at most the disk's chunk count.
    fn validate_disk(&self, disk: &DiskEntry) -> Result<(), ParseError> {
        let chunks = check_chunk_geometry(disk.chunk_size, disk.size)
            .map_err(|e| ParseError::new(format!("disk: {e}")))?;
        check_hash("disk.sha256", &disk.sha256)?;
        let Some(n) = disk.diff_chunks else {
            return Ok(());
        };
        if self.kind != LayerKind::Diff {
            return Err(ParseError::new(
                "disk.diff_chunks in a full layer (only a diff layer stores its disk as a diff)",
            ));
        }
        if self.format.minor < DISK_DIFF_SINCE.minor {
            return Err(ParseError::new(format!(
                "disk.diff_chunks in a format {} manifest (disk diffs came with {DISK_DIFF_SINCE})",
                self.format
            )));
        }
        if n > chunks {
            return Err(ParseError::new(format!(
                "disk.diff_chunks {n} exceeds the {chunks} chunks of the disk"
            )));
        }
        Ok(())
    }
}

fn check_tag(field: &str, v: &str) -> Result<(), ParseError> {
    if v.is_empty()
        || v.len() > MAX_TAG_LEN
        || !v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ParseError::new(format!(
            "{field} {v:?} must be 1..={MAX_TAG_LEN} of [A-Za-z0-9._-]"
        )));
    }
    Ok(())
}

fn check_hash(field: &str, v: &str) -> Result<(), ParseError> {
    if !is_sha256_hex(v) {
        return Err(ParseError::new(format!(
            "{field} is not 64 lower-case hex digits"
        )));
    }
    Ok(())
}

/// The files a layer with manifest `m` holds, `manifest.json` first.
pub fn listed_files(m: &Manifest) -> Vec<&'static str> {
    let mut files = vec![MANIFEST_FILE, MEMORY_FILE, STATE_FILE];
    if let Some(d) = &m.disk {
        files.extend([d.data_file(), DISK_CHUNKS_FILE]);
    }
    files
}

/// Parse and fully check `manifest.json` bytes (untrusted).
///
/// Checks, in order: size limit ([`MAX_MANIFEST_BYTES`]), format version
/// (before anything else, so a newer file says so), strict schema (unknown
/// or duplicate fields rejected), field values, canonical form, and
/// `manifest_sha256`.
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, ParseError> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ParseError::new(format!(
            "larger than the {MAX_MANIFEST_BYTES}-byte limit"
        )));
    }
    let probe: VersionProbe = serde_json::from_slice(bytes)
        .map_err(|e| ParseError::new(format!("not a valid manifest: {e}")))?;
    probe.format.check_readable()?;
    let m: Manifest = serde_json::from_slice(bytes)
        .map_err(|e| ParseError::new(format!("not a valid manifest: {e}")))?;
    m.validate()?;
    if m.to_bytes() != bytes {
        return Err(ParseError::new(
            "not in canonical form (edited or corrupted: whitespace, key order or escapes differ)",
        ));
    }
    if m.compute_self_hash() != m.manifest_sha256 {
        return Err(ParseError::new(
            "manifest_sha256 does not match the content (corrupted or edited)",
        ));
    }
    Ok(m)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::{FORMAT_VERSION, MAX_RAM_SIZE};

    pub(crate) fn sample(kind: LayerKind) -> Manifest {
        let page_size = 16384;
        let (parent, diff_pages, mem_size) = match kind {
            LayerKind::Full => (None, None, 1 << 20),
            LayerKind::Diff => (
                Some(ParentRef {
                    name: "golden".into(),
                    sha256: "ab".repeat(32),
                }),
                Some(3),
                diff_file_size(page_size, 3).unwrap(),
            ),
        };
        let mut m = Manifest {
            format: FORMAT_VERSION,
            kind,
            name: "d1".into(),
            parent,
            page_size,
            ram_base_gpa: 0x4000_0000,
            ram_size: 1 << 20,
            vcpus: 2,
            backend: "emu".into(),
            gic_mode: "userspace".into(),
            creator: "ignition-vmm 0.1.0".into(),
            created_unix: 1_781_343_667,
            created: "2026-06-13T09:41:07Z".into(),
            memory: FileEntry {
                size: mem_size,
                sha256: "01".repeat(32),
            },
            diff_pages,
            state: FileEntry {
                size: 100,
                sha256: "02".repeat(32),
            },
            disk: Some(DiskEntry {
                size: 4096,
                chunk_size: crate::format::chunks::DISK_CHUNK_SIZE,
                sha256: "03".repeat(32),
                diff_chunks: (kind == LayerKind::Diff).then_some(1),
            }),
            manifest_sha256: String::new(),
        };
        m.seal();
        m
    }

    fn reseal_bytes(f: impl FnOnce(&mut Manifest)) -> Vec<u8> {
        let mut m = sample(LayerKind::Diff);
        f(&mut m);
        m.seal();
        m.to_bytes()
    }

    #[test]
    fn round_trip() {
        for kind in [LayerKind::Full, LayerKind::Diff] {
            let m = sample(kind);
            let b = m.to_bytes();
            assert_eq!(parse_manifest(&b).unwrap(), m);
        }
    }

    #[test]
    fn full_layer_omits_parent() {
        let b = String::from_utf8(sample(LayerKind::Full).to_bytes()).unwrap();
        assert!(!b.contains("parent") && !b.contains("diff_"), "{b}");
    }

    #[test]
    fn a_disk_diff_is_listed_in_place_of_the_image() {
        let diff = sample(LayerKind::Diff);
        let d = diff.disk.as_ref().unwrap();
        assert_eq!(d.data_file(), DISK_DIFF_FILE);
        assert_eq!(d.data_file_size(), (64 << 10) + d.chunk_size);
        assert_eq!(
            listed_files(&diff),
            [
                MANIFEST_FILE,
                MEMORY_FILE,
                STATE_FILE,
                DISK_DIFF_FILE,
                DISK_CHUNKS_FILE
            ]
        );
        let full = sample(LayerKind::Full);
        assert_eq!(full.disk.as_ref().unwrap().data_file_size(), 4096);
        assert_eq!(listed_files(&full)[3], DISK_FILE);
        // A 3.0 manifest (no disk diff) still reads.
        let mut old = sample(LayerKind::Diff);
        old.format.minor = 0;
        old.disk.as_mut().unwrap().diff_chunks = None;
        old.seal();
        assert_eq!(parse_manifest(&old.to_bytes()).unwrap(), old);
    }

    fn expect_err(bytes: &[u8], needle: &str) {
        let e = parse_manifest(bytes).unwrap_err().0;
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }

    #[test]
    fn rejects_newer_or_other_versions_first() {
        for (maj, min) in [(1, 0), (2, 0), (3, 2), (4, 0), (0, 9)] {
            // A newer file may carry fields we do not know: the version
            // error must win over the schema error.
            let mut v: serde_json::Value =
                serde_json::from_slice(&sample(LayerKind::Full).to_bytes()).unwrap();
            v["format"] = serde_json::json!({"major": maj, "minor": min});
            v["new_field"] = serde_json::json!(1);
            expect_err(&serde_json::to_vec(&v).unwrap(), "format version");
        }
    }

    #[test]
    fn rejects_schema_problems() {
        let good = sample(LayerKind::Diff).to_bytes();
        let s = String::from_utf8(good.clone()).unwrap();
        expect_err(
            &s.replacen("{", "{\n  \"extra\": 1,", 1).into_bytes(),
            "unknown field",
        );
        expect_err(
            &s.replace("\"vcpus\": 2,\n", "").into_bytes(),
            "missing field",
        );
        expect_err(
            &s.replacen("\"vcpus\": 2,", "\"vcpus\": 2,\n  \"vcpus\": 2,", 1)
                .into_bytes(),
            "duplicate field",
        );
        expect_err(b"", "not a valid manifest");
        expect_err(b"[]", "not a valid manifest");
        expect_err(&vec![b' '; MAX_MANIFEST_BYTES + 1], "limit");
        // Canonical form: one more space somewhere.
        expect_err(&s.replacen(": 2,", ":  2,", 1).into_bytes(), "canonical");
        let mut no_nl = good.clone();
        no_nl.pop();
        expect_err(&no_nl, "canonical");
        // Seal: a changed value with the old seal.
        expect_err(
            &s.replace("ignition-vmm 0.1.0", "ignition-vmm 0.1.1")
                .into_bytes(),
            "manifest_sha256",
        );
    }

    type Edit = Box<dyn Fn(&mut Manifest)>;

    #[test]
    fn rejects_bad_values() {
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|m| m.name = "a+1".into()), "name"),
            (Box::new(|m| m.page_size = 12288), "page size"),
            (Box::new(|m| m.page_size = 2048), "page size"),
            (Box::new(|m| m.ram_size = 0), "RAM size"),
            (Box::new(|m| m.ram_size = (1 << 20) + 4096), "RAM size"),
            (Box::new(|m| m.ram_size = MAX_RAM_SIZE * 2), "RAM size"),
            (Box::new(|m| m.ram_base_gpa = 4096), "RAM base"),
            (Box::new(|m| m.ram_base_gpa = u64::MAX - 16383), "RAM base"),
            (Box::new(|m| m.vcpus = 0), "vcpus"),
            (Box::new(|m| m.vcpus = 513), "vcpus"),
            (Box::new(|m| m.backend = String::new()), "backend"),
            (Box::new(|m| m.gic_mode = "a b".into()), "gic_mode"),
            (Box::new(|m| m.creator = "x\n".into()), "creator"),
            (Box::new(|m| m.created = "yesterday".into()), "created"),
            (Box::new(|m| m.parent = None), "parent and diff_pages"),
            (Box::new(|m| m.diff_pages = None), "parent and diff_pages"),
            (Box::new(|m| m.diff_pages = Some(65)), "exceeds"),
            (Box::new(|m| m.diff_pages = Some(4)), "does not fit"),
            (
                Box::new(|m| m.parent.as_mut().unwrap().name = "d1".into()),
                "own name",
            ),
            (
                Box::new(|m| m.parent.as_mut().unwrap().sha256 = "AB".repeat(32)),
                "parent.sha256",
            ),
            (Box::new(|m| m.memory.sha256 = "0".into()), "memory.sha256"),
            (Box::new(|m| m.state.size = 3), "state.size"),
            (
                Box::new(|m| m.disk.as_mut().unwrap().sha256 = "x".repeat(64)),
                "disk.sha256",
            ),
            (
                Box::new(|m| m.disk.as_mut().unwrap().chunk_size = 1000),
                "disk: chunk size",
            ),
            (
                Box::new(|m| m.disk.as_mut().unwrap().size = u64::MAX),
                "disk: disk of",
            ),
            (
                Box::new(|m| {
                    m.kind = LayerKind::Full;
                }),
                "neither parent",
            ),
            (
                Box::new(|m| m.disk.as_mut().unwrap().diff_chunks = Some(2)),
                "exceeds the 1 chunks",
            ),
            (
                Box::new(|m| m.format.minor = 0),
                "disk.diff_chunks in a format 3.0 manifest",
            ),
            (
                Box::new(|m| {
                    m.kind = LayerKind::Full;
                    m.parent = None;
                    m.diff_pages = None;
                    m.memory.size = m.ram_size;
                }),
                "disk.diff_chunks in a full layer",
            ),
        ];
        for (f, needle) in cases {
            expect_err(&reseal_bytes(f), needle);
        }
        // A full layer whose memory size is not the RAM size.
        let mut m = sample(LayerKind::Full);
        m.memory.size -= 1;
        m.seal();
        expect_err(&m.to_bytes(), "differs from ram_size");
    }
}
