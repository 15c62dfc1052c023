//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use snapshot_store::{Layer, LayerMeta, Store};

/// Page size used by the tests (bytes): the smallest supported, to keep
/// files small.
pub const PS: u64 = 4096;

/// Deterministic PRNG (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

pub fn meta(ram_size: u64) -> LayerMeta {
    LayerMeta {
        parent: None,
        page_size: PS,
        ram_base_gpa: 0x4000_0000,
        ram_size,
        vcpus: 2,
        backend: "emu".into(),
        gic_mode: "userspace".into(),
        creator: "ignition-vmm 0.1.0".into(),
    }
}

/// Commit a full layer.
pub fn full(store: &Store, name: &str, ram: &[u8], state: &[u8], disk: Option<&Path>) -> Layer {
    let mut w = store.begin(name, meta(ram.len() as u64)).unwrap();
    w.write_full_memory(ram).unwrap();
    w.write_state(state).unwrap();
    if let Some(d) = disk {
        w.clone_disk(d, None).unwrap();
    }
    w.commit().unwrap()
}

/// Commit a diff layer on top of `parent` holding pages `dirty` of `ram`.
pub fn diff(
    store: &Store,
    name: &str,
    parent: &Layer,
    ram: &[u8],
    dirty: &[u64],
    state: &[u8],
    disk: Option<&Path>,
) -> Layer {
    let mut w = store
        .begin(name, parent.child_meta("ignition-vmm 0.1.0"))
        .unwrap();
    w.write_diff_from_ram(ram, dirty.iter().copied()).unwrap();
    w.write_state(state).unwrap();
    if let Some(d) = disk {
        w.clone_disk(d, None).unwrap();
    }
    w.commit().unwrap()
}

/// A small sparse disk image with some data.
pub fn disk_image(path: &Path, seed: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(64 * 1024).unwrap();
    f.write_all_at(&[seed; 512], 0).unwrap();
    f.write_all_at(b"ignition disk", 40_000).unwrap();
}

/// Make every file under `dir` writable again (layer files are 0444).
pub fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for e in walk(dir) {
        if e.is_file() {
            std::fs::set_permissions(&e, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
}

/// All paths under `dir`, sorted.
pub fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Every path under `dir` with its size, mode, mtime and content digest.
pub fn fingerprint(dir: &Path) -> Vec<(String, u64, u32, i64, i64, String)> {
    use std::os::unix::fs::MetadataExt;
    walk(dir)
        .into_iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let digest = if m.is_file() {
                snapshot_store::hex(&snapshot_store::sha256(&std::fs::read(&p).unwrap()))
            } else {
                String::new()
            };
            (
                p.strip_prefix(dir).unwrap().display().to_string(),
                m.len(),
                m.mode(),
                m.mtime(),
                m.mtime_nsec(),
                digest,
            )
        })
        .collect()
}

/// A process id that is certainly not running (a reaped child's).
pub fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// Wait longer than the store's racy window (50 ms), so that files changed
/// before the call have settled stamps and a verification after it records
/// them in `verified.json`.
pub fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(60));
}

/// Xor byte `at` of `path` with `mask` in place (same inode, same size),
/// then put back the file's access and modification times, as someone
/// covering their tracks would: only the ctime still shows the change.
pub fn flip_keep_times(path: &Path, at: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let m = f.metadata().unwrap();
    let (atime, mtime) = (m.accessed().unwrap(), m.modified().unwrap());
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ mask], at).unwrap();
    f.set_times(
        std::fs::FileTimes::new()
            .set_accessed(atime)
            .set_modified(mtime),
    )
    .unwrap();
}

/// `(st_dev, st_ino, st_size, mtime ns, ctime ns)` of `path` (lstat).
pub fn stamp(path: &Path) -> (u64, u64, u64, i128, i128) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (
        m.dev(),
        m.ino(),
        m.size(),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    )
}

/// The stamp recorded for `file` in `dir/verified.json`, if any.
pub fn cached_stamp(dir: &Path, file: &str) -> Option<(u64, u64, u64, i128, i128)> {
    let text =
        std::fs::read_to_string(dir.join(snapshot_store::format::verified::VERIFIED_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let e = v.get("files")?.get(file)?;
    let int = |k: &str| e.get(k).and_then(|x| x.as_i64()).map(i128::from);
    Some((
        e.get("dev")?.as_u64()?,
        e.get("ino")?.as_u64()?,
        e.get("size")?.as_u64()?,
        int("mtime_ns")?,
        int("ctime_ns")?,
    ))
}
