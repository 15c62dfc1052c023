//! Corruption: every single-byte change of every file of a small chain is
//! detected, by the full and by the cached verification (with the files'
//! mtimes put back, so that only their ctimes show the change); a deleted
//! parent and a missing file give clear errors; a failed restore leaves
//! the store unchanged.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use snapshot_store::format::verified::VERIFIED_FILE;
use snapshot_store::format::{DISK_CHUNKS_FILE, DISK_FILE, MEMORY_FILE};
use snapshot_store::{map_chain_memory, verify_chain, verify_chain_cached, Chain, Error, Store};

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    ram: Vec<u8>,
}

/// golden (3 pages) -> d1 (2 pages) -> d2 (1 page), each with state and a
/// small disk.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0x5au8; 1024]).unwrap();
    let mut ram = vec![0u8; 3 * PS as usize];
    Rng(7).fill(&mut ram);
    let g = full(&store, "golden", &ram, b"golden state", Some(&disk));
    ram[PS as usize + 3] ^= 0xff;
    ram[2 * PS as usize] ^= 0xff;
    let d1 = diff(&store, "d1", &g, &ram, &[1, 2], b"d1 state", Some(&disk));
    ram[0] ^= 1;
    diff(&store, "d2", &d1, &ram, &[0], b"d2 state", Some(&disk));
    make_writable(store.root());
    Fixture {
        _dir: dir,
        store,
        ram,
    }
}

/// What the VMM does before running a guest; returns the RAM.
fn restore(store: &Store, spec: &str) -> snapshot_store::Result<Vec<u8>> {
    let chain: Chain = store.resolve(spec)?;
    verify_chain_cached(&chain)?;
    let ram = map_chain_memory(&chain)?;
    chain.top().read_state()?;
    Ok(ram.to_vec())
}

/// The layers' files (not their verified-file caches).
fn layer_files(store: &Store) -> Vec<PathBuf> {
    walk(store.root())
        .into_iter()
        .filter(|p| p.is_file() && !p.ends_with(VERIFIED_FILE))
        .collect()
}

fn caches(store: &Store) -> Vec<(String, u64, u32, i64, i64, String)> {
    fingerprint(store.root())
        .into_iter()
        .filter(|f| f.0.ends_with(VERIFIED_FILE))
        .collect()
}

fn file_name(p: &Path) -> &str {
    p.file_name().unwrap().to_str().unwrap()
}

fn flip(path: &Path, at: u64, mask: u8) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ mask], at).unwrap();
}

#[test]
fn every_single_byte_change_is_detected() {
    let fx = fixture();
    assert_eq!(restore(&fx.store, "d2").unwrap(), fx.ram);
    let files = layer_files(&fx.store);
    assert_eq!(files.len(), 15);
    // Resolving reads only manifests; a resolved chain is what the VMM
    // verifies, so other files are checked against it directly.
    let resolved = fx.store.resolve("d2").unwrap();
    // Prime the verified-file caches (the fixture's chmod moved every
    // ctime): once those ctimes have settled, a verification records every
    // file, and a cached verification then hashes nothing.
    settle();
    assert_eq!(verify_chain(&resolved).unwrap().files_hashed, 15);
    let hot = verify_chain_cached(&resolved).unwrap();
    assert_eq!((hot.files_cached, hot.bytes_hashed), (15, 0), "{hot:?}");
    for path in &files {
        let dir = path.parent().unwrap();
        assert_eq!(cached_stamp(dir, file_name(path)), Some(stamp(path)));
    }
    let caches_before = caches(&fx.store);
    let mut checked = 0u64;
    for path in &files {
        let dir = path.parent().unwrap();
        let is_manifest = path.ends_with("manifest.json");
        let len = std::fs::metadata(path).unwrap().len();
        for at in 0..len {
            // Vary the changed bits with the position; never zero.
            let mask = (at % 255) as u8 + 1;
            flip_keep_times(path, at, mask);
            if at == 0 {
                // Same device, inode, size and mtime as recorded in the
                // cache: only the ctime tells the file was written.
                let (now, rec) = (stamp(path), cached_stamp(dir, file_name(path)).unwrap());
                assert_eq!((now.0, now.1, now.2, now.3), (rec.0, rec.1, rec.2, rec.3));
                assert_ne!(now.4, rec.4, "{}", path.display());
            }
            let what = || format!("byte {at} of {} (xor {mask:#x})", path.display());
            if is_manifest {
                // A fresh resolve, both ways.
                let fresh = fx.store.resolve("d2");
                assert!(
                    fresh.as_ref().map_or(true, |c| verify_chain(c).is_err()),
                    "changing {} went undetected by a fresh resolve",
                    what()
                );
                assert!(
                    fresh.map_or(true, |c| verify_chain_cached(&c).is_err()),
                    "changing {} went undetected by a fresh resolve and cached verify",
                    what()
                );
            }
            assert!(
                verify_chain(&resolved).is_err(),
                "changing {} went undetected",
                what()
            );
            assert!(
                verify_chain_cached(&resolved).is_err(),
                "changing {} went undetected by the cached verification",
                what()
            );
            flip_keep_times(path, at, mask);
            checked += 1;
        }
    }
    // Failed verifications never touched the caches.
    assert_eq!(caches(&fx.store), caches_before);
    // Contents are back, but every ctime moved: the cached path hashes
    // every file again (and passes).
    let r = verify_chain_cached(&resolved).unwrap();
    assert_eq!((r.files_hashed, r.files_cached), (15, 0), "{r:?}");
    assert_eq!(restore(&fx.store, "d2").unwrap(), fx.ram);
    assert!(checked > 25_000, "{checked}");
}

#[test]
fn store_wide_verify_blames_the_right_layer() {
    let fx = fixture();
    let r = fx.store.verify_all(None).unwrap();
    assert!(r.iter().all(|(_, r)| r.is_ok()), "{r:?}");
    for (layer, file) in [
        ("golden", MEMORY_FILE),
        ("d1", MEMORY_FILE),
        ("d2", DISK_FILE),
        ("d1", DISK_CHUNKS_FILE),
        ("d1", "state.bin"),
    ] {
        let p = fx.store.root().join(layer).join(file);
        let len = std::fs::metadata(&p).unwrap().len();
        for at in [0, len / 2, len - 1] {
            flip(&p, at, 0x80);
            let r = fx.store.verify_all(None).unwrap();
            for (name, res) in &r {
                assert_eq!(
                    res.is_err(),
                    name == layer,
                    "{layer}/{file}@{at}: {name}: {res:?}"
                );
            }
            let err = r
                .iter()
                .find(|(n, _)| n == layer)
                .unwrap()
                .1
                .as_ref()
                .unwrap_err();
            assert!(err.to_string().contains(file), "{err}");
            flip(&p, at, 0x80);
        }
    }
    // A damaged manifest fails its own layer and (its hash no longer
    // matching) its child.
    let p = fx.store.root().join("d1").join("manifest.json");
    flip(&p, 10, 1);
    let r = fx.store.verify_all(None).unwrap();
    let bad: Vec<&str> = r
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(bad, ["d1", "d2"]);
}

#[test]
fn deleted_parent_is_a_clear_error() {
    let fx = fixture();
    std::fs::remove_dir_all(fx.store.root().join("d1")).unwrap();
    let before = fingerprint(fx.store.root());
    let e = restore(&fx.store, "d2").unwrap_err();
    assert!(matches!(e, Error::MissingParent { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("'d2' needs its parent 'd1'") && e.contains("not in store"),
        "{e}"
    );
    let e = fx.store.resolve("golden+2").unwrap_err().to_string();
    assert!(e.contains("too short"), "{e}");
    assert_eq!(fingerprint(fx.store.root()), before);
    // golden alone still restores.
    assert!(restore(&fx.store, "golden").is_ok());
}

#[test]
fn replaced_parent_is_a_clear_error() {
    let fx = fixture();
    // Move d1 out of the store and write a different, valid d1 in its place.
    let aside = fx._dir.path().join("d1-aside");
    std::fs::rename(fx.store.root().join("d1"), &aside).unwrap();
    let g = fx.store.layer("golden").unwrap();
    diff(&fx.store, "d1", &g, &fx.ram, &[2], b"other", None);
    let before = fingerprint(fx.store.root());
    let e = restore(&fx.store, "d2").unwrap_err();
    assert!(matches!(e, Error::ParentChanged { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("parent 'd1' of 'd2' has changed") && e.contains("d1/manifest.json"),
        "{e}"
    );
    assert_eq!(fingerprint(fx.store.root()), before);
}

#[test]
fn missing_files_are_clear_errors() {
    for (layer, file) in [
        ("d1", DISK_FILE),
        ("d2", DISK_CHUNKS_FILE),
        ("d1", MEMORY_FILE),
        ("golden", MEMORY_FILE),
        ("d2", "state.bin"),
        ("golden", "manifest.json"),
    ] {
        let fx = fixture();
        let p = fx.store.root().join(layer).join(file);
        std::fs::remove_file(&p).unwrap();
        let before = fingerprint(fx.store.root());
        let e = restore(&fx.store, "d2").unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("missing"),
            "{layer}/{file}: {e}"
        );
        assert_eq!(fingerprint(fx.store.root()), before, "{layer}/{file}");
    }
}

#[test]
fn failed_restore_leaves_the_store_unchanged() {
    let fx = fixture();
    // With hot caches (a verified chain)...
    settle();
    assert!(restore(&fx.store, "d2").is_ok());
    let hot = verify_chain_cached(&fx.store.resolve("d2").unwrap()).unwrap();
    assert_eq!(hot.bytes_hashed, 0, "{hot:?}");
    // ...corrupt one byte of the base memory: verification must stop the
    // restore, and nothing in the store may change (no repair, no temp
    // files, no cache updates, no new layers).
    let p = fx.store.root().join("golden").join(MEMORY_FILE);
    flip_keep_times(&p, 5000, 0x10);
    let before = fingerprint(fx.store.root());
    let e = restore(&fx.store, "d2").unwrap_err().to_string();
    assert!(e.contains("golden") && e.contains("sha256 mismatch"), "{e}");
    let e = verify_chain(&fx.store.resolve("d2").unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("golden") && e.contains("sha256 mismatch"), "{e}");
    let e = fx.store.squash("d2", "flat", None).unwrap_err().to_string();
    assert!(e.contains("sha256 mismatch"), "{e}");
    assert_eq!(fingerprint(fx.store.root()), before);
    assert!(!fx.store.contains("flat"));
}

#[test]
fn guest_writes_never_reach_the_store() {
    let fx = fixture();
    let before = fingerprint(fx.store.root());
    let chain = fx.store.resolve("d2").unwrap();
    let mut ram = map_chain_memory(&chain).unwrap();
    ram.fill(0xee);
    drop(ram);
    assert_eq!(fingerprint(fx.store.root()), before);
    assert_eq!(restore(&fx.store, "d2").unwrap(), fx.ram);
}

#[test]
fn truncated_and_extended_files_are_detected() {
    let fx = fixture();
    for layer in ["golden", "d1", "d2"] {
        for file in [
            MEMORY_FILE,
            DISK_FILE,
            DISK_CHUNKS_FILE,
            "state.bin",
            "manifest.json",
        ] {
            let p = fx.store.root().join(layer).join(file);
            let orig = std::fs::read(&p).unwrap();
            for new_len in [
                0,
                orig.len() as u64 - 1,
                orig.len() as u64 + 1,
                orig.len() as u64 + 4096,
            ] {
                let f = OpenOptions::new().write(true).open(&p).unwrap();
                f.set_len(new_len).unwrap();
                let e = restore(&fx.store, "d2").unwrap_err().to_string();
                assert!(
                    e.contains(&p.display().to_string()),
                    "{layer}/{file} len {new_len}: {e}"
                );
                std::fs::write(&p, &orig).unwrap();
            }
        }
    }
    assert_eq!(restore(&fx.store, "d2").unwrap(), fx.ram);
}
