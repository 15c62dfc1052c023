//! Corruption: every single-byte change of every file of a small chain is
//! detected; a deleted parent and a missing file give clear errors; a
//! failed restore leaves the store unchanged.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use snapshot_store::{map_chain_memory, verify_chain, Chain, Store, DISK_FILE, MEMORY_FILE};

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
    verify_chain(&chain)?;
    let ram = map_chain_memory(&chain)?;
    chain.top().read_state()?;
    Ok(ram.to_vec())
}

fn layer_files(store: &Store) -> Vec<PathBuf> {
    walk(store.root())
        .into_iter()
        .filter(|p| p.is_file())
        .collect()
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
    assert_eq!(files.len(), 12);
    // Resolving reads only manifests; a resolved chain is what the VMM
    // verifies, so other files are checked against it directly.
    let resolved = fx.store.resolve("d2").unwrap();
    let mut checked = 0u64;
    for path in &files {
        let is_manifest = path.ends_with("manifest.json");
        let len = std::fs::metadata(path).unwrap().len();
        for at in 0..len {
            // Vary the changed bits with the position; never zero.
            let mask = (at % 255) as u8 + 1;
            flip(path, at, mask);
            let r = if is_manifest {
                // Both a fresh resolve and the already resolved chain.
                let fresh = fx
                    .store
                    .resolve("d2")
                    .and_then(|c| verify_chain(&c).map(|_| ()));
                assert!(verify_chain(&resolved).is_err(), "{} @{at}", path.display());
                fresh
            } else {
                verify_chain(&resolved).map(|_| ())
            };
            assert!(
                r.is_err(),
                "changing byte {at} of {} (xor {mask:#x}) went undetected",
                path.display()
            );
            flip(path, at, mask);
            checked += 1;
        }
    }
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
    let e = restore(&fx.store, "d2").unwrap_err().to_string();
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
    let e = restore(&fx.store, "d2").unwrap_err().to_string();
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
    // Corrupt one byte of the base memory: verification must stop the
    // restore, and nothing in the store may change (no repair, no temp
    // files, no new layers).
    let p = fx.store.root().join("golden").join(MEMORY_FILE);
    flip(&p, 5000, 0x10);
    let before = fingerprint(fx.store.root());
    let e = restore(&fx.store, "d2").unwrap_err().to_string();
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
        for file in [MEMORY_FILE, DISK_FILE, "state.bin", "manifest.json"] {
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
