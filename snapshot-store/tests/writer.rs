//! The write/commit path, removal, gc and listing.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use snapshot_store::format::manifest::{listed_files, LayerKind};
use snapshot_store::format::{DISK_CHUNKS_FILE, MANIFEST_FILE, MEMORY_FILE};
use snapshot_store::{verify_chain, CloneMethod, DiskMethod, Error, Store};

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::create(d.path().join("vmstore")).unwrap();
    (d, s)
}

/// Entries of the store directory whose names start with '.'.
fn work_dirs(s: &Store) -> Vec<String> {
    std::fs::read_dir(s.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn commit_writes_a_complete_readonly_layer() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    disk_image(&disk, 1);
    let mut ram = vec![0u8; 16 * PS as usize];
    Rng(1).fill(&mut ram);
    let mut w = s.begin("golden", meta(ram.len() as u64)).unwrap();
    assert!(w.work_dir().starts_with(s.root()));
    let tmp_name = w
        .work_dir()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        tmp_name.starts_with(&format!(".tmp-golden-{}-", std::process::id())),
        "{tmp_name}"
    );
    w.write_full_memory(&ram).unwrap();
    w.write_state(b"vcpu+gic+devices").unwrap();
    let clone = w.clone_disk(&disk, Some(&[0])).unwrap();
    assert!(matches!(
        clone.method,
        DiskMethod::Image(CloneMethod::Clonefile | CloneMethod::Ficlone | CloneMethod::SparseCopy)
    ));
    // A full layer has no parent: the written set is ignored and the one
    // chunk of the 64 KiB image is hashed.
    assert_eq!((clone.chunks, clone.hashed), (1, 1));
    assert!(
        clone.to_string().ends_with(" (1 of 1 chunks hashed)"),
        "{clone}"
    );
    let layer = w.commit().unwrap();
    assert!(work_dirs(&s).is_empty(), "{:?}", work_dirs(&s));
    assert_eq!(layer.kind(), LayerKind::Full);
    for f in listed_files(&layer.manifest) {
        let m = std::fs::metadata(layer.dir.join(f)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o444, "{f}");
    }
    assert_eq!(std::fs::read(layer.memory_path()).unwrap(), ram);
    assert_eq!(
        std::fs::read(layer.disk_path().unwrap()).unwrap(),
        std::fs::read(&disk).unwrap()
    );
    assert_eq!(layer.read_state().unwrap(), b"vcpu+gic+devices");
    // What commit returned is what the store reads back.
    let again = s.layer("golden").unwrap();
    assert_eq!(again.manifest, layer.manifest);
    assert_eq!(again.content_sha256, layer.content_sha256);
    assert_eq!(
        layer.content_sha256,
        snapshot_store::hex(&snapshot_store::sha256(
            &std::fs::read(layer.manifest_path()).unwrap()
        ))
    );
    let chain = s.resolve("golden").unwrap();
    let rep = verify_chain(&chain).unwrap();
    assert_eq!((rep.layers, rep.files), (1, 5));
}

#[test]
fn existing_name_is_refused_and_untouched() {
    let (_d, s) = store();
    let ram = vec![7u8; 4 * PS as usize];
    let golden = full(&s, "golden", &ram, b"s", None);
    let before = fingerprint(s.root());
    let e = s.begin("golden", meta(ram.len() as u64)).unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
    assert!(e.to_string().contains("already exists"), "{e}");
    // A race: two writers of the same name; the second commit loses.
    let mut a = s.begin("x", meta(ram.len() as u64)).unwrap();
    let mut b = s.begin("x", meta(ram.len() as u64)).unwrap();
    for w in [&mut a, &mut b] {
        w.write_full_memory(&ram).unwrap();
        w.write_state(b"s").unwrap();
    }
    let first = a.commit().unwrap();
    let e = b.commit().unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
    assert_eq!(s.layer("x").unwrap().content_sha256, first.content_sha256);
    assert!(work_dirs(&s).is_empty());
    let _ = golden;
    let after: Vec<_> = fingerprint(s.root())
        .into_iter()
        .filter(|f| !f.0.starts_with('x'))
        .collect();
    assert_eq!(before, after);
}

#[test]
fn name_equal_to_parent_is_refused() {
    let (_d, s) = store();
    let ram = vec![1u8; 4 * PS as usize];
    let golden = full(&s, "golden", &ram, b"s", None);
    let e = s.begin("golden", golden.child_meta("t")).unwrap_err();
    assert!(e.to_string().contains("name of its parent"), "{e}");
    assert!(work_dirs(&s).is_empty());
}

#[test]
fn parent_checks_at_begin() {
    let (_d, s) = store();
    let ram = vec![1u8; 4 * PS as usize];
    let golden = full(&s, "golden", &ram, b"s", None);
    // Missing parent.
    let mut m = golden.child_meta("t");
    m.parent.as_mut().unwrap().name = "ghost".into();
    let e = s.begin("d1", m).unwrap_err();
    assert!(
        matches!(&e, Error::MissingParent { layer, parent, .. } if layer == "d1" && parent == "ghost"),
        "{e}"
    );
    let e = e.to_string();
    assert!(e.contains("'ghost'") && e.contains("not in store"), "{e}");
    // Wrong parent hash.
    let mut m = golden.child_meta("t");
    m.parent.as_mut().unwrap().sha256 = "0".repeat(64);
    let e = s.begin("d1", m).unwrap_err();
    assert!(
        matches!(&e, Error::ParentChanged { expected, found, .. } if *expected == "0".repeat(64) && *found == golden.content_sha256),
        "{e}"
    );
    assert!(e.to_string().contains("has changed"), "{e}");
    // Another GIC mode.
    let mut m = golden.child_meta("t");
    m.gic_mode = "hvf".into();
    let e = s.begin("d1", m).unwrap_err().to_string();
    assert!(e.contains("gic_mode"), "{e}");
    // Another RAM size.
    let mut m = golden.child_meta("t");
    m.ram_size *= 2;
    let e = s.begin("d1", m).unwrap_err().to_string();
    assert!(e.contains("ram_size"), "{e}");
    // Bad metadata.
    let mut m = meta(ram.len() as u64);
    m.vcpus = 0;
    assert!(s.begin("z", m).unwrap_err().to_string().contains("vcpus"));
    let mut m = meta(ram.len() as u64);
    m.page_size = 1000;
    assert!(s.begin("z", m).is_err());
    assert!(matches!(
        s.begin("a+1", meta(4096)).unwrap_err(),
        Error::InvalidName { .. }
    ));
    assert!(work_dirs(&s).is_empty());
}

#[test]
fn work_dir_is_removed_on_every_error() {
    let (d, s) = store();
    let ram = vec![3u8; 8 * PS as usize];
    let golden = full(&s, "golden", &ram, b"s", None);

    // Wrong RAM size, then dropped.
    let mut w = s.begin("a", meta(ram.len() as u64)).unwrap();
    let tmp = w.work_dir().to_path_buf();
    assert!(tmp.is_dir());
    assert!(w.write_full_memory(&ram[..PS as usize]).is_err());
    drop(w);
    assert!(!tmp.exists());

    // Commit without state.
    let mut w = s.begin("a", meta(ram.len() as u64)).unwrap();
    let tmp = w.work_dir().to_path_buf();
    w.write_full_memory(&ram).unwrap();
    let e = w.commit().unwrap_err();
    assert!(e.to_string().contains("no state"), "{e}");
    assert!(!tmp.exists());

    // Commit without memory.
    let mut w = s.begin("a", meta(ram.len() as u64)).unwrap();
    w.write_state(b"s").unwrap();
    assert!(w.commit().unwrap_err().to_string().contains("no memory"));

    // Disk clone of a missing file.
    let mut w = s.begin("a", meta(ram.len() as u64)).unwrap();
    let tmp = w.work_dir().to_path_buf();
    w.write_full_memory(&ram).unwrap();
    let e = w
        .clone_disk(&d.path().join("missing.img"), None)
        .unwrap_err();
    assert!(e.to_string().contains("missing.img"), "{e}");
    drop(w);
    assert!(!tmp.exists());

    // Diff misuse: unsorted pages, short page, full memory on a diff.
    let mut w = s.begin("b", golden.child_meta("t")).unwrap();
    assert!(w.write_full_memory(&ram).is_err());
    let p = &ram[..PS as usize];
    assert!(w.write_diff_memory([(3, p), (1, p)]).is_err());
    assert!(w.write_diff_memory([(1, p), (1, p)]).is_err());
    assert!(w.write_diff_memory([(8, p)]).is_err());
    assert!(w.write_diff_memory([(1, &p[1..])]).is_err());
    assert!(w.write_diff_from_ram(&ram, [9]).is_err());
    w.abort().unwrap();

    // Parent removed between begin and commit.
    let mut w = s.begin("c", golden.child_meta("t")).unwrap();
    let tmp = w.work_dir().to_path_buf();
    w.write_diff_from_ram(&ram, [0, 5]).unwrap();
    w.write_state(b"s").unwrap();
    s.remove("golden", false).unwrap();
    let e = w.commit().unwrap_err();
    assert!(e.to_string().contains("'golden'"), "{e}");
    assert!(!tmp.exists());
    assert!(!s.contains("c"));

    assert!(work_dirs(&s).is_empty(), "{:?}", work_dirs(&s));
    assert!(s.layer_names().unwrap().is_empty());
}

#[test]
fn state_size_is_bounded() {
    let (_d, s) = store();
    let mut w = s.begin("a", meta(4 * PS)).unwrap();
    let big = vec![0u8; snapshot_store::format::state::MAX_STATE_BYTES as usize + 1];
    let e = w.write_state(&big).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    w.write_state(b"ok").unwrap();
    assert!(w.write_state(b"twice").is_err());
}

#[test]
fn gc_removes_stale_work_dirs_only() {
    let (_d, s) = store();
    let ram = vec![3u8; 4 * PS as usize];
    full(&s, "golden", &ram, b"s", None);
    let dead = dead_pid();
    let stale = s.root().join(format!(".tmp-d1-{dead}-00000000deadbeef"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join(MEMORY_FILE), vec![1u8; 10_000]).unwrap();
    let stale_del = s.root().join(format!(".del-old-{dead}-0000000000000001"));
    std::fs::create_dir(&stale_del).unwrap();
    let odd = s.root().join(".tmp-garbage");
    std::fs::create_dir(&odd).unwrap();
    // A writer in progress in this (live) process.
    let w = s.begin("d2", meta(ram.len() as u64)).unwrap();
    let live = w.work_dir().to_path_buf();

    let r = s.gc().unwrap();
    let removed: Vec<&str> = r.removed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(removed.len(), 2, "{r:?}");
    assert!(removed.iter().any(|n| n.starts_with(".tmp-d1-")));
    assert!(removed.iter().any(|n| n.starts_with(".del-old-")));
    assert!(r.removed.iter().any(|(_, b)| *b >= 10_000));
    assert!(!stale.exists() && !stale_del.exists());
    assert!(live.is_dir() && odd.is_dir());
    assert_eq!(r.kept.len(), 2, "{r:?}");
    assert!(r.kept.iter().any(|(_, why)| why.contains("still running")));
    assert!(s.contains("golden"));
    drop(w);
    assert!(!live.exists());
}

#[test]
fn remove_refuses_parents_unless_recursive() {
    let (_d, s) = store();
    let mut ram = vec![0u8; 8 * PS as usize];
    let g = full(&s, "golden", &ram, b"s", None);
    ram[0] = 1;
    let d1 = diff(&s, "d1", &g, &ram, &[0], b"s", None);
    let d2a = diff(&s, "d2a", &d1, &ram, &[0], b"s", None);
    let _d3 = diff(&s, "d3", &d2a, &ram, &[1], b"s", None);
    let _d2b = diff(&s, "d2b", &d1, &ram, &[2], b"s", None);
    let other = full(&s, "other", &ram, b"s", None);

    let e = s.remove("d1", false).unwrap_err();
    assert!(
        matches!(&e, Error::HasChildren { children, .. } if children == &["d2a", "d2b"]),
        "{e}"
    );
    let e = s.remove("nope", false).unwrap_err().to_string();
    assert!(e.contains("not found") && e.contains("golden"), "{e}");
    assert_eq!(s.remove("d3", false).unwrap(), vec!["d3"]);
    let removed = s.remove("d1", true).unwrap();
    assert_eq!(removed.len(), 3);
    assert_eq!(removed.last().unwrap(), "d1");
    assert_eq!(s.layer_names().unwrap(), vec!["golden", "other"]);
    assert!(work_dirs(&s).is_empty());
    let _ = other;
    // A broken layer can still be removed.
    common::make_writable(&s.root().join("golden"));
    std::fs::write(s.root().join("golden").join(MANIFEST_FILE), b"junk").unwrap();
    assert_eq!(s.remove("golden", false).unwrap(), vec!["golden"]);
}

#[test]
fn list_reports_sizes_and_broken_layers() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    disk_image(&disk, 2);
    let ram = vec![5u8; 16 * PS as usize];
    let g = full(&s, "golden", &ram, b"state", Some(&disk));
    diff(&s, "d1", &g, &ram, &[1, 2, 3], b"state", Some(&disk));
    std::fs::create_dir(s.root().join("broken")).unwrap();
    let l = s.list().unwrap();
    let names: Vec<&str> = l.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["broken", "d1", "golden"]);
    let e = l[0].summary.as_ref().unwrap_err().to_string();
    assert!(e.contains("manifest.json") && e.contains("missing"), "{e}");
    let d1 = l[1].summary.as_ref().unwrap();
    assert_eq!(d1.kind, LayerKind::Diff);
    assert_eq!(d1.parent.as_deref(), Some("golden"));
    assert_eq!(d1.pages, Some(3));
    let g = l[2].summary.as_ref().unwrap();
    assert!(g.logical_bytes >= ram.len() as u64 + 64 * 1024);
    assert!(g.physical_bytes > 0);
    // The disk clone is sparse, so fewer bytes are allocated than listed.
    assert!(g.physical_bytes < g.logical_bytes, "{g:?}");
}

#[test]
fn unchanged_disk_is_an_empty_diff_without_hashing() {
    use std::os::unix::fs::MetadataExt;
    let (dir, s) = store();
    let disk = dir.path().join("disk.img");
    disk_image(&disk, 9);
    let ram = vec![7u8; 4 * PS as usize];
    let g = full(&s, "golden", &ram, b"g", Some(&disk));
    settle();
    // Warm golden's verified-file cache.
    snapshot_store::verify_chain(&s.resolve("golden").unwrap()).unwrap();
    let golden_disk = g.dir.join(snapshot_store::format::DISK_FILE);
    let before = std::fs::metadata(&golden_disk).unwrap();

    let mut w = s.begin("d1", g.child_meta("test")).unwrap();
    w.write_diff_memory([(1u64, &ram[..PS as usize])]).unwrap();
    w.write_state(b"d1").unwrap();
    let clone = w.reuse_parent_disk().unwrap();
    assert_eq!((clone.chunks, clone.hashed), (1, 0));
    assert_eq!(clone.method, DiskMethod::Diff);
    let d1 = w.commit().unwrap();
    let after = std::fs::metadata(&golden_disk).unwrap();
    // No image: a diff of no chunks (its header only), the parent's digests.
    assert!(!d1.dir.join(snapshot_store::format::DISK_FILE).exists());
    let diff = d1.dir.join(snapshot_store::format::DISK_DIFF_FILE);
    assert_eq!(std::fs::metadata(&diff).unwrap().len(), 64 << 10);
    let mut want = g.manifest.disk.clone().unwrap();
    want.diff_chunks = Some(0);
    assert_eq!(d1.manifest.disk, Some(want));
    assert_eq!(
        std::fs::read(d1.dir.join(DISK_CHUNKS_FILE)).unwrap(),
        std::fs::read(g.dir.join(DISK_CHUNKS_FILE)).unwrap()
    );
    // The parent's file was not touched (its cache stays valid).
    assert_eq!(
        (after.ctime(), after.ctime_nsec()),
        (before.ctime(), before.ctime_nsec())
    );
    let r = snapshot_store::verify_chain(&s.resolve("d1").unwrap()).unwrap();
    assert_eq!(r.layers, 2);

    // A full layer has no parent disk to reuse; nothing is left behind.
    let mut w = s.begin("full2", meta(ram.len() as u64)).unwrap();
    assert!(w.reuse_parent_disk().is_err());
    drop(w);
    assert!(work_dirs(&s).is_empty());
}

/// A memory file filled out of order (background snapshots) makes the same
/// layer, byte for byte, as the in-order writers.
#[test]
fn memory_files_filled_out_of_order_equal_the_in_order_layers() {
    use std::os::unix::fs::FileExt;
    let (_d, s) = store();
    let ps = PS as usize;
    let mut ram = vec![0u8; 16 * ps];
    Rng(7).fill(&mut ram);

    let golden = full(&s, "golden", &ram, b"state", None);
    let mut w = s.begin("golden-ooo", meta(ram.len() as u64)).unwrap();
    let m = w.memory_file(None).unwrap();
    for p in (0..16).rev().filter(|p| p % 3 != 0) {
        m.file
            .write_all_at(&ram[p * ps..(p + 1) * ps], (p * ps) as u64)
            .unwrap();
    }
    // Pages left out are holes, which read as zero.
    let mut zeroed = ram.clone();
    for p in (0..16).filter(|p| p % 3 == 0) {
        zeroed[p * ps..(p + 1) * ps].fill(0);
    }
    w.finish_memory_file(m).unwrap();
    w.write_state(b"state").unwrap();
    let ooo = w.commit().unwrap();
    let expect = full(&s, "golden-zeroed", &zeroed, b"state", None);
    assert_eq!(ooo.manifest.memory, expect.manifest.memory);
    assert_eq!(
        std::fs::read(ooo.dir.join(MEMORY_FILE)).unwrap(),
        std::fs::read(expect.dir.join(MEMORY_FILE)).unwrap()
    );

    let dirty = [1u64, 4, 5, 11];
    let in_order = diff(&s, "d1", &golden, &ram, &dirty, b"s1", None);
    let mut w = s
        .begin("d1-ooo", golden.child_meta("ignition-vmm 0.1.0"))
        .unwrap();
    assert!(w.memory_file(None).is_err(), "a diff needs its index");
    // Created ahead (before the VM is paused), sized with the index.
    w.create_memory_file().unwrap();
    assert!(w.create_memory_file().is_err(), "created once");
    let m = w.memory_file(Some(&dirty)).unwrap();
    let base = m.data_offset.unwrap();
    for (i, &p) in dirty.iter().enumerate().rev() {
        let p = p as usize;
        m.file
            .write_all_at(&ram[p * ps..(p + 1) * ps], base + (i * ps) as u64)
            .unwrap();
    }
    w.finish_memory_file(m).unwrap();
    w.write_state(b"s1").unwrap();
    let ooo = w.commit().unwrap();
    assert_eq!(ooo.manifest.memory, in_order.manifest.memory);
    assert_eq!(ooo.manifest.diff_pages, in_order.manifest.diff_pages);
    verify_chain(&s.resolve("d1-ooo").unwrap()).unwrap();
}

/// A full layer's zero pages are holes: the file holds only data.
#[test]
fn full_layers_leave_zero_pages_as_holes() {
    use std::os::unix::fs::MetadataExt;
    let (_d, s) = store();
    let ps = PS as usize;
    let mut ram = vec![0u8; 64 * ps];
    ram[3 * ps + 7] = 1;
    ram[40 * ps..42 * ps].fill(9);
    let layer = full(&s, "sparse", &ram, b"state", None);
    let path = layer.dir.join(MEMORY_FILE);
    assert_eq!(std::fs::read(&path).unwrap(), ram);
    let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        allocated <= 4 * PS,
        "{allocated} bytes allocated for 3 pages of data"
    );
    verify_chain(&s.resolve("sparse").unwrap()).unwrap();
}

#[test]
fn zero_pages_of_a_diff_are_holes_that_restore_as_zeros() {
    use std::os::unix::fs::MetadataExt;
    let (_d, s) = store();
    let n = 64usize;
    let mut ram = vec![0u8; n * PS as usize];
    Rng(3).fill(&mut ram);
    let g = full(&s, "g", &ram, b"g", None);
    // Pages 1..=48 become zero, page 50 changes.
    for p in 1..=48 {
        ram[p * PS as usize..(p + 1) * PS as usize].fill(0);
    }
    ram[50 * PS as usize] ^= 0xff;
    let dirty: Vec<u64> = (1..=48).chain([50]).collect();
    let d = diff(&s, "d", &g, &ram, &dirty, b"d", None);
    let m = std::fs::metadata(d.memory_path()).unwrap();
    assert!(
        m.blocks() * 512 < 16 * PS,
        "zero pages were written: {} bytes allocated of {}",
        m.blocks() * 512,
        m.len()
    );
    let chain = s.resolve("d").unwrap();
    verify_chain(&chain).unwrap();
    let mut restored = snapshot_store::map_base_memory(chain.base()).unwrap();
    snapshot_store::overlay_diffs(&mut restored, &chain.layers()[1..]).unwrap();
    assert!(restored[..] == ram[..]);
}
