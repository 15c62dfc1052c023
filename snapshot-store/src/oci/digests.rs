//! The push side's blob digest cache, `STORE/.oci-blobs.json`: for a layer
//! file whose identity stamp (device, inode, size, mtime, ctime) has not
//! changed, the digest and size of its blob (plain, or zstd), so that
//! pushing `d4` after `golden+3` does not hash (or compress) golden's RAM
//! again just to learn that the registry has it. Same trust rules as
//! `verified.json` (FORMAT.md): a stamp is recorded only once settled, an
//! entry is used only if the stamp is equal, and anything unreadable is
//! ignored. Deleting the file is always safe. A wrong entry cannot make a
//! pull accept bad data: a pull checks every file against its manifest.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::{recordable, Clock, SystemClock};
use crate::format::verified::Stamp;
use crate::fsutil::nonce;
use crate::store::TMP_PREFIX;

use super::layout::Compression;

/// File name of the cache, in the store directory.
pub const OCI_BLOBS_FILE: &str = ".oci-blobs.json";
/// Largest cache read, in bytes; a larger one is ignored (and replaced).
const MAX_BYTES: u64 = 4 << 20;
/// Layout version of the file; another version is ignored.
const FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    /// `none` or `zstd`.
    compression: String,
    /// The blob's sha256, hex.
    sha256: String,
    /// The blob's size in bytes.
    blob_size: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    format: u32,
    /// `LAYER/FILE@COMPRESSION` -> entry.
    blobs: BTreeMap<String, Entry>,
}

/// The cache as loaded, with what this push learnt.
pub(crate) struct DigestCache {
    path: PathBuf,
    root: PathBuf,
    blobs: BTreeMap<String, Entry>,
    changed: bool,
}

fn key(layer: &str, file: &str, c: Compression) -> String {
    format!("{layer}/{file}@{c}")
}

impl DigestCache {
    /// Load the cache of the store at `root` (empty if missing or unusable).
    pub(crate) fn load(root: &Path) -> DigestCache {
        let path = root.join(OCI_BLOBS_FILE);
        let mut blobs = BTreeMap::new();
        if let Ok(f) = std::fs::File::open(&path) {
            let mut bytes = Vec::new();
            let read = f.take(MAX_BYTES + 1).read_to_end(&mut bytes);
            match serde_json::from_slice::<FileForm>(&bytes) {
                Ok(form)
                    if read.is_ok() && bytes.len() as u64 <= MAX_BYTES && form.format == FORMAT =>
                {
                    blobs = form.blobs
                }
                _ => tracing::debug!("{}: unusable, ignored", path.display()),
            }
        }
        DigestCache {
            path,
            root: root.to_path_buf(),
            blobs,
            changed: false,
        }
    }

    /// The blob `(sha256 hex, size)` recorded for `layer/file` with
    /// `compression`, if the file's current stamp is the recorded one.
    pub(crate) fn get(
        &self,
        layer: &str,
        file: &str,
        c: Compression,
        path: &Path,
    ) -> Option<(String, u64)> {
        let e = self.blobs.get(&key(layer, file, c))?;
        let now = Stamp::of(&std::fs::symlink_metadata(path).ok()?);
        let then = Stamp {
            dev: e.dev,
            ino: e.ino,
            size: e.size,
            mtime_ns: e.mtime_ns,
            ctime_ns: e.ctime_ns,
        };
        (now == then).then(|| (e.sha256.clone(), e.blob_size))
    }

    /// Record the blob `(sha256 hex, size)` of `layer/file`: `read` holds
    /// the file's stamps before and after reading it and a clock reading
    /// taken before that.
    pub(crate) fn put(
        &mut self,
        layer: &str,
        file: &str,
        c: Compression,
        read: (Stamp, Stamp, i128),
        (sha256, blob_size): (&str, u64),
    ) {
        let (before, after, t0_ns) = read;
        let k = key(layer, file, c);
        match recordable(before, after, t0_ns) {
            Some(s) => {
                self.blobs.insert(
                    k,
                    Entry {
                        dev: s.dev,
                        ino: s.ino,
                        size: s.size,
                        mtime_ns: s.mtime_ns,
                        ctime_ns: s.ctime_ns,
                        compression: c.to_string(),
                        sha256: sha256.to_string(),
                        blob_size,
                    },
                );
            }
            None => {
                self.blobs.remove(&k);
            }
        }
        self.changed = true;
    }

    /// A clock reading for [`DigestCache::put`].
    pub(crate) fn now_ns() -> i128 {
        SystemClock.now_ns()
    }

    /// Drop entries of layers no longer in the store, and write the cache
    /// (a temporary file renamed over it) if it changed. Failure is only
    /// logged: the cache is an optimisation.
    pub(crate) fn save(mut self) {
        let before = self.blobs.len();
        let root = self.root.clone();
        self.blobs
            .retain(|k, _| k.split('/').next().is_some_and(|l| root.join(l).is_dir()));
        if !self.changed && before == self.blobs.len() {
            return;
        }
        let tmp = self.root.join(format!(
            "{TMP_PREFIX}oci-blobs-{}-{:016x}",
            std::process::id(),
            nonce()
        ));
        let form = FileForm {
            format: FORMAT,
            blobs: std::mem::take(&mut self.blobs),
        };
        let r = serde_json::to_vec_pretty(&form)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&bytes)?;
                f.sync_all()?;
                std::fs::rename(&tmp, &self.path)
            });
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(
                "{}: not written ({e}); the next push hashes again",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_used_only_while_the_file_is_unchanged() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("g")).unwrap();
        let f = d.path().join("g/memory.bin");
        std::fs::write(&f, b"abc").unwrap();
        let s = Stamp::of(&std::fs::symlink_metadata(&f).unwrap());
        let mut c = DigestCache::load(d.path());
        // Not settled yet (ctime just now): not recorded.
        c.put(
            "g",
            "memory.bin",
            Compression::None,
            (s, s, s.ctime_ns),
            ("aa", 3),
        );
        assert_eq!(c.get("g", "memory.bin", Compression::None, &f), None);
        // Settled.
        c.put(
            "g",
            "memory.bin",
            Compression::None,
            (s, s, s.ctime_ns + 3_000_000_000),
            ("aa", 3),
        );
        assert_eq!(
            c.get("g", "memory.bin", Compression::None, &f),
            Some(("aa".into(), 3))
        );
        assert_eq!(c.get("g", "memory.bin", Compression::Zstd, &f), None);
        c.save();
        let c = DigestCache::load(d.path());
        assert_eq!(
            c.get("g", "memory.bin", Compression::None, &f),
            Some(("aa".into(), 3))
        );
        // A change to the file (a new ctime) invalidates the entry.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, b"abd").unwrap();
        assert_eq!(c.get("g", "memory.bin", Compression::None, &f), None);
        // Garbage is ignored.
        std::fs::write(d.path().join(OCI_BLOBS_FILE), b"{").unwrap();
        assert!(DigestCache::load(d.path()).blobs.is_empty());
    }
}
