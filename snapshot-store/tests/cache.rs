//! The verified-file cache (`verified.json`) and `verify_chain_cached`:
//! commit and successful verifications record files; unchanged files are
//! not hashed again; any change through the file system is detected; a
//! bad cache is ignored; a failed verification records nothing.

mod common;

use std::path::Path;

use common::*;
use snapshot_store::format::manifest::listed_files;
use snapshot_store::format::verified::{MAX_VERIFIED_BYTES, VERIFIED_FILE};
use snapshot_store::format::{LAYER_FILES, MEMORY_FILE, STATE_FILE};
use snapshot_store::{verify_chain, verify_chain_cached, HashSource, Store, VerifyReport};

/// Larger than the size above which commit waits for stamps to settle
/// (32 MiB), so that commit takes that path.
const BIG_RAM: usize = 40 << 20;

struct Fx {
    dir: tempfile::TempDir,
    store: Store,
}

/// golden (`ram_len` bytes, with disk) -> d1 -> d2, as written by commit
/// (no chmod afterwards).
fn chain(ram_len: usize) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    disk_image(&disk, 3);
    let mut ram = vec![0u8; ram_len];
    Rng(11).fill(&mut ram);
    let g = full(&store, "golden", &ram, b"g", Some(&disk));
    ram[7] ^= 1;
    let d1 = diff(&store, "d1", &g, &ram, &[0], b"d1", None);
    ram[PS as usize + 1] ^= 1;
    diff(&store, "d2", &d1, &ram, &[1], b"d2", Some(&disk));
    Fx { dir, store }
}

fn cached(fx: &Fx) -> snapshot_store::Result<VerifyReport> {
    verify_chain_cached(&fx.store.resolve("d2")?)
}

fn source(r: &VerifyReport, path: &Path) -> HashSource {
    r.checked
        .iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| panic!("{} not in {r:?}", path.display()))
        .source
}

/// Wait until a cached verification hashes nothing (at most a few tries:
/// each settles and records the files hashed before).
fn warm(fx: &Fx) -> VerifyReport {
    for _ in 0..3 {
        settle();
        let r = cached(fx).unwrap();
        if r.bytes_hashed == 0 {
            return r;
        }
    }
    panic!("cache never warmed up");
}

#[test]
fn commit_records_and_cached_verify_skips_hashing() {
    let fx = chain(BIG_RAM);
    // Which files commit could record depends on the clock (its wait for
    // their stamps to settle is tested with a fake clock in cache.rs and
    // measured by `examples/commit_cache.rs`). Whatever it recorded, the
    // first restore trusts exactly those files and hashes the others.
    let mut vouched = Vec::new();
    for layer in ["golden", "d1", "d2"] {
        let dir = fx.store.root().join(layer);
        for f in LAYER_FILES {
            let p = dir.join(f);
            if p.exists() && cached_stamp(&dir, f) == Some(stamp(&p)) {
                vouched.push(p);
            }
        }
    }
    let first = cached(&fx).unwrap();
    assert_eq!(first.layers, 3);
    assert_eq!(first.files, 13);
    assert_eq!(first.files_hashed + first.files_cached, 13);
    for c in &first.checked {
        let from_cache = c.source == HashSource::Cache;
        assert_eq!(
            from_cache,
            vouched.contains(&c.path),
            "{}",
            c.path.display()
        );
    }
    assert!(first.cache_notes.is_empty(), "{first:?}");
    // The small diffs may have been too fresh to record at commit; once
    // verified they are recorded too, and then nothing is hashed.
    let hot = warm(&fx);
    assert_eq!((hot.files_cached, hot.files_hashed), (13, 0), "{hot:?}");
    assert_eq!(hot.bytes_cached, first.bytes_cached + first.bytes_hashed);
    assert!(hot.checked.iter().all(|c| c.source == HashSource::Cache));
    // A hot cached verification writes nothing.
    let before = fingerprint(fx.store.root());
    cached(&fx).unwrap();
    assert_eq!(fingerprint(fx.store.root()), before);
    // The full verification still hashes everything.
    let full = verify_chain(&fx.store.resolve("d2").unwrap()).unwrap();
    assert_eq!((full.files_hashed, full.files_cached), (13, 0));
    assert_eq!(full.bytes_hashed, hot.bytes_cached);
    assert!(full.checked.iter().all(|c| c.source == HashSource::Hashed));
}

#[test]
fn modification_with_restored_mtime_is_detected() {
    let fx = chain(8 * PS as usize);
    make_writable(fx.store.root());
    warm(&fx);
    let mem = fx.store.root().join("golden").join(MEMORY_FILE);
    let rec = cached_stamp(mem.parent().unwrap(), MEMORY_FILE).unwrap();
    let orig = std::fs::read(&mem).unwrap();
    let orig_stamp = stamp(&mem);
    assert_eq!(orig_stamp, rec);

    flip_keep_times(&mem, 3 * PS + 17, 0x40);
    let now = stamp(&mem);
    assert_eq!((now.0, now.1, now.2, now.3), (rec.0, rec.1, rec.2, rec.3));
    let e = cached(&fx).unwrap_err().to_string();
    assert!(
        e.contains(&mem.display().to_string()) && e.contains("sha256 mismatch"),
        "{e}"
    );
    // The failure recorded nothing.
    assert_eq!(cached_stamp(mem.parent().unwrap(), MEMORY_FILE), Some(rec));

    // Put the byte back: correct again, and hashed (not trusted) because
    // the stamp no longer matches.
    flip_keep_times(&mem, 3 * PS + 17, 0x40);
    assert_eq!(std::fs::read(&mem).unwrap(), orig);
    let r = cached(&fx).unwrap();
    assert_eq!(source(&r, &mem), HashSource::Hashed);
    assert_eq!(r.files_hashed, 1, "{r:?}");
    assert_eq!(r.bytes_hashed, orig.len() as u64);

    // Replaced by a same-size file with the old mtime (a new inode).
    let t = std::fs::metadata(&mem).unwrap().modified().unwrap();
    let mut other = orig.clone();
    other[0] ^= 1;
    let tmp = mem.with_extension("new");
    std::fs::write(&tmp, &other).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(t)
        .unwrap();
    std::fs::rename(&tmp, &mem).unwrap();
    let e = cached(&fx).unwrap_err().to_string();
    assert!(e.contains("sha256 mismatch"), "{e}");
    std::fs::write(&mem, &orig).unwrap();
    cached(&fx).unwrap();

    // Truncated and re-extended to the same size, mtime put back.
    let f = std::fs::OpenOptions::new().write(true).open(&mem).unwrap();
    warm(&fx);
    let t = f.metadata().unwrap().modified().unwrap();
    f.set_len(PS).unwrap();
    f.set_len(orig.len() as u64).unwrap();
    f.set_modified(t).unwrap();
    assert_eq!(
        stamp(&mem).3,
        cached_stamp(mem.parent().unwrap(), MEMORY_FILE).unwrap().3
    );
    let e = cached(&fx).unwrap_err().to_string();
    assert!(e.contains("sha256 mismatch"), "{e}");
}

#[test]
fn full_verify_records_and_a_changed_file_is_hashed_again() {
    let fx = chain(8 * PS as usize);
    let state = fx.store.root().join("d1").join(STATE_FILE);
    make_writable(fx.store.root());
    settle();
    // A full verification records what it hashed.
    let full = verify_chain(&fx.store.resolve("d2").unwrap()).unwrap();
    assert_eq!(full.files_hashed, 13);
    let r = cached(&fx).unwrap();
    assert_eq!((r.files_cached, r.bytes_hashed), (13, 0), "{r:?}");

    // A file changed since is hashed again (that its stamp is recorded only
    // once settled is tested with a fake clock in verify.rs).
    flip_keep_times(&state, 56, 1);
    flip_keep_times(&state, 56, 1);
    let r = cached(&fx).unwrap();
    assert_eq!(source(&r, &state), HashSource::Hashed);
    let r = warm(&fx);
    assert_eq!(r.files_cached, 13);
    assert_eq!(
        cached_stamp(state.parent().unwrap(), STATE_FILE),
        Some(stamp(&state))
    );
}

#[test]
fn bad_cache_files_are_ignored() {
    let fx = chain(8 * PS as usize);
    make_writable(fx.store.root());
    warm(&fx);
    let golden = fx.store.root().join("golden");
    let cache = golden.join(VERIFIED_FILE);
    let mem = golden.join(MEMORY_FILE);
    let mem_bytes = std::fs::read(&mem).unwrap();
    let other_sha = snapshot_store::hex(&snapshot_store::sha256(b"other"));
    let manifest = fx.store.layer("golden").unwrap().manifest;
    type Make = Box<dyn Fn(&str) -> Vec<u8>>;
    let cases: Vec<(&str, Make, Option<&str>)> = vec![
        (
            "garbage",
            Box::new(|_| b"\x00\xff garbage {{".to_vec()),
            Some("malformed"),
        ),
        ("empty", Box::new(|_| Vec::new()), Some("malformed")),
        (
            "truncated",
            Box::new(|good| good.as_bytes()[..good.len() / 2].to_vec()),
            Some("malformed"),
        ),
        (
            "oversized",
            Box::new(|good| {
                let mut v = good.as_bytes().to_vec();
                v.resize(MAX_VERIFIED_BYTES as usize + 1, b' ');
                v
            }),
            Some("limit"),
        ),
        (
            "unknown field",
            Box::new(|good| {
                good.replacen("\"format\"", "\"extra\": 0, \"format\"", 1)
                    .into_bytes()
            }),
            Some("malformed"),
        ),
        (
            "newer format",
            Box::new(|good| {
                good.replacen("\"format\": 1", "\"format\": 9", 1)
                    .into_bytes()
            }),
            Some("format 9"),
        ),
        // Well-formed, current stamps, but vouching for a hash the
        // manifest does not list: that entry is not used.
        (
            "wrong hash",
            Box::new(move |good| {
                assert!(good.contains(&manifest.memory.sha256));
                good.replace(&manifest.memory.sha256, &other_sha)
                    .into_bytes()
            }),
            None,
        ),
    ];
    for (what, make, note) in cases {
        // Built from the current (warm) cache: its stamps are current.
        let good = std::fs::read_to_string(&cache).unwrap();
        assert_eq!(cached_stamp(&golden, MEMORY_FILE), Some(stamp(&mem)));
        let bytes = make(&good);
        std::fs::write(&cache, &bytes).unwrap();
        let r = cached(&fx).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(source(&r, &mem), HashSource::Hashed, "{what}");
        match note {
            Some(n) => assert!(
                r.cache_notes.len() == 1
                    && r.cache_notes[0].contains(&cache.display().to_string())
                    && r.cache_notes[0].contains(n),
                "{what}: {:?}",
                r.cache_notes
            ),
            None => assert!(r.cache_notes.is_empty(), "{what}: {:?}", r.cache_notes),
        }
        // The successful verification replaced the bad cache.
        let r = cached(&fx).unwrap();
        assert_eq!(source(&r, &mem), HashSource::Cache, "{what}");
        assert!(r.cache_notes.is_empty(), "{what}");
        // A bad cache does not hide real corruption either.
        std::fs::write(&cache, &bytes).unwrap();
        flip_keep_times(&mem, 5, 0x11);
        let e = cached(&fx).unwrap_err().to_string();
        assert!(e.contains("sha256 mismatch"), "{what}: {e}");
        flip_keep_times(&mem, 5, 0x11);
        assert_eq!(std::fs::read(&mem).unwrap(), mem_bytes);
        warm(&fx);
    }
}

#[test]
fn a_cache_that_is_a_directory_is_ignored() {
    // Ignored, and not replaceable; the verification passes and says so.
    let fx = chain(8 * PS as usize);
    make_writable(fx.store.root());
    warm(&fx);
    let golden = fx.store.root().join("golden");
    let cache = golden.join(VERIFIED_FILE);
    let mem = golden.join(MEMORY_FILE);
    std::fs::remove_file(&cache).unwrap();
    std::fs::create_dir(&cache).unwrap();
    std::fs::write(cache.join("x"), b"x").unwrap();
    flip_keep_times(&mem, 5, 1);
    flip_keep_times(&mem, 5, 1);
    let r = cached(&fx).unwrap();
    assert_eq!(source(&r, &mem), HashSource::Hashed);
    assert!(
        r.cache_notes
            .iter()
            .any(|n| n.contains("not a regular file"))
            && r.cache_notes.iter().any(|n| n.contains("not updated")),
        "{:?}",
        r.cache_notes
    );
    assert!(cache.join("x").exists());
    // No temporary files were left behind.
    let stray: Vec<_> = std::fs::read_dir(&golden)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn forged_cache_is_the_documented_limit() {
    // Whoever can write the store can write a cache that vouches for a
    // modified file: the cached path trusts it, the full path does not.
    let fx = chain(8 * PS as usize);
    make_writable(fx.store.root());
    warm(&fx);
    let golden = fx.store.root().join("golden");
    let mem = golden.join(MEMORY_FILE);
    flip_keep_times(&mem, 9, 0x20);
    let (dev, ino, size, mtime, ctime) = stamp(&mem);
    let cache = golden.join(VERIFIED_FILE);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    let e = &mut v["files"][MEMORY_FILE];
    e["dev"] = dev.into();
    e["ino"] = ino.into();
    e["size"] = size.into();
    e["mtime_ns"] = (mtime as i64).into();
    e["ctime_ns"] = (ctime as i64).into();
    std::fs::write(&cache, serde_json::to_string(&v).unwrap()).unwrap();
    assert!(cached(&fx).is_ok());
    let e = verify_chain(&fx.store.resolve("d2").unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("golden/memory.bin: sha256 mismatch"), "{e}");
}

#[test]
fn verify_all_records_per_layer_and_gc_removes_stale_temp_files() {
    let fx = chain(8 * PS as usize);
    make_writable(fx.store.root());
    settle();
    // Corrupt d1: the store-wide verification fails d1 (and records
    // nothing for it) but records golden and d2.
    let d1_state = fx.store.root().join("d1").join(STATE_FILE);
    flip_keep_times(&d1_state, 57, 2);
    let r = fx.store.verify_all(None).unwrap();
    let ok: Vec<&str> = r
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(ok, ["d2", "golden"]);
    for (layer, recorded) in [("golden", true), ("d2", true), ("d1", false)] {
        let dir = fx.store.root().join(layer);
        assert_eq!(
            cached_stamp(&dir, STATE_FILE) == Some(stamp(&dir.join(STATE_FILE))),
            recorded,
            "{layer}"
        );
    }
    flip_keep_times(&d1_state, 57, 2);

    // An interrupted cache update of a dead process is removed by gc; one
    // of a live process is kept.
    let dir = fx.store.root().join("d1");
    let stale = dir.join(format!(
        ".verified.json.tmp-{}-00000000000000aa",
        dead_pid()
    ));
    let live = dir.join(format!(
        ".verified.json.tmp-{}-00000000000000bb",
        std::process::id()
    ));
    std::fs::write(&stale, b"{").unwrap();
    std::fs::write(&live, b"{").unwrap();
    let g = fx.store.gc().unwrap();
    assert!(!stale.exists() && live.exists());
    assert!(
        g.removed
            .iter()
            .any(|(n, _)| n.starts_with("d1/.verified.json.tmp-")),
        "{g:?}"
    );
    assert!(
        g.kept
            .iter()
            .any(|(n, _)| n.starts_with("d1/.verified.json.tmp-")),
        "{g:?}"
    );
    // Neither disturbs a verification.
    warm(&fx);
    let _ = &fx.dir;
}

#[test]
fn commit_cache_later_is_visible_first_and_its_cache_is_used_once_joined() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    disk_image(&disk, 5);
    let mut ram = vec![0u8; 1 << 20];
    Rng(3).fill(&mut ram);
    let mut w = store.begin("golden", meta(ram.len() as u64)).unwrap();
    w.write_full_memory(&ram).unwrap();
    w.write_state(b"s").unwrap();
    w.clone_disk(&disk, None).unwrap();
    let (layer, cache) = w.commit_cache_later().unwrap();
    // Durable and visible before the cache thread is done.
    assert!(store.contains("golden"));
    cache.join().unwrap();
    // The thread waits for every file to settle before recording (tested
    // with a fake clock in cache.rs); what it recorded, restore trusts.
    let vouched = listed_files(&layer.manifest)
        .iter()
        .filter(|f| cached_stamp(&layer.dir, f) == Some(stamp(&layer.dir.join(f))))
        .count();
    assert!(layer.dir.join(VERIFIED_FILE).is_file());
    let r = verify_chain_cached(&store.resolve("golden").unwrap()).unwrap();
    assert_eq!(
        (r.files_cached, r.files_hashed),
        (vouched, 5 - vouched),
        "{r:?}"
    );
}
