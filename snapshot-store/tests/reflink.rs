//! The copy-on-write clone path on a file system that has reflinks (Linux
//! FICLONE). The usual test file systems (ext4, tmpfs) have none, so this
//! runs in a directory named by `IGNITION_REFLINK_DIR` (CI mounts an XFS
//! image there with `scripts/reflink-scratch.sh`) and reports itself skipped
//! without one.

use std::fs::File;
use std::os::unix::fs::FileExt;

use snapshot_store::{clone_file, CloneMethod};

#[test]
fn clone_uses_ficlone_where_the_file_system_has_reflinks() {
    let Some(root) = std::env::var_os("IGNITION_REFLINK_DIR") else {
        eprintln!("skipped: IGNITION_REFLINK_DIR is not set (see scripts/reflink-scratch.sh)");
        return;
    };
    let dir = tempfile::tempdir_in(&root).unwrap();
    let src = dir.path().join("disk.img");
    let f = File::create(&src).unwrap();
    f.set_len(64 << 20).unwrap();
    f.write_all_at(&[7u8; 1 << 20], 3 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let dst = dir.path().join("clone.img");
    let method = clone_file(&src, &dst).unwrap();
    if cfg!(target_os = "linux") {
        assert_eq!(method, CloneMethod::Ficlone);
    }
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    // Writes to the clone stay in the clone.
    File::options()
        .write(true)
        .open(&dst)
        .unwrap()
        .write_all_at(b"changed", 3 << 20)
        .unwrap();
    let mut head = [0u8; 7];
    File::open(&src)
        .unwrap()
        .read_exact_at(&mut head, 3 << 20)
        .unwrap();
    assert_eq!(head, [7u8; 7]);
}

#[test]
fn du_counts_the_blocks_clones_share() {
    let Some(root) = std::env::var_os("IGNITION_REFLINK_DIR") else {
        eprintln!("skipped: IGNITION_REFLINK_DIR is not set (see scripts/reflink-scratch.sh)");
        return;
    };
    let dir = tempfile::tempdir_in(&root).unwrap();
    let s = snapshot_store::Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    let f = File::create(&disk).unwrap();
    f.set_len(8 << 20).unwrap();
    f.write_all_at(&[7u8; 1 << 20], 1 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let meta = snapshot_store::LayerMeta {
        parent: None,
        page_size: 4096,
        ram_base_gpa: 0x4000_0000,
        ram_size: 4 * 4096,
        vcpus: 1,
        backend: "test".into(),
        gic_mode: "test".into(),
        creator: "test".into(),
    };
    // Two full layers of the same image: each disk.img a clone of it.
    for name in ["g", "f"] {
        let mut w = s.begin(name, meta.clone()).unwrap();
        w.write_full_memory(&[1u8; 4 * 4096]).unwrap();
        w.write_state(b"g").unwrap();
        w.clone_disk(&disk, None).unwrap();
        w.commit().unwrap();
    }
    for (name, u) in s.du().unwrap() {
        let u = u.unwrap();
        let shared = u.shared_bytes.expect("XFS answers FIEMAP");
        assert!(shared >= 1 << 20, "{name}: {u:?}");
        assert!(shared <= u.physical_bytes, "{name}: {u:?}");
    }
}

/// A whole image of a restored VM's disk (a full layer of an overlay, or a
/// squash of a chain with disk diffs) is a clone of the image below with
/// only the chunks written since copied over it.
#[test]
fn a_full_layer_of_an_overlay_is_a_clone_with_the_changed_chunks_copied() {
    use snapshot_store::{ChainDisk, DiskMethod, DiskOverlay, DiskSource, Store, DISK_CHUNK_SIZE};
    use std::sync::Arc;
    let Some(root) = std::env::var_os("IGNITION_REFLINK_DIR") else {
        eprintln!("skipped: IGNITION_REFLINK_DIR is not set (see scripts/reflink-scratch.sh)");
        return;
    };
    let dir = tempfile::tempdir_in(&root).unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    let f = File::create(&disk).unwrap();
    f.set_len(32 * DISK_CHUNK_SIZE).unwrap();
    f.write_all_at(&[7u8; 4 << 20], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let meta = snapshot_store::LayerMeta {
        parent: None,
        page_size: 4096,
        ram_base_gpa: 0x4000_0000,
        ram_size: 4 * 4096,
        vcpus: 1,
        backend: "test".into(),
        gic_mode: "test".into(),
        creator: "test".into(),
    };
    let mut w = s.begin("g", meta.clone()).unwrap();
    w.write_full_memory(&[1u8; 4 * 4096]).unwrap();
    w.write_state(b"g").unwrap();
    w.clone_disk(&disk, None).unwrap();
    w.commit().unwrap();
    let base = ChainDisk::open(&s.resolve("g").unwrap()).unwrap().unwrap();
    let ov = Arc::new(DiskOverlay::create(base, &dir.path().join("o")).unwrap());
    ov.write_all_at(&[9u8; 100], 3 * DISK_CHUNK_SIZE + 5)
        .unwrap();
    ov.write_all_at(&[0u8; 4096], 1 << 20).unwrap();
    let mut want = vec![0u8; ov.size() as usize];
    ov.read_exact_at(&mut want, 0).unwrap();
    let mut w = s.begin("f", meta).unwrap();
    w.write_full_memory(&[1u8; 4 * 4096]).unwrap();
    w.write_state(b"f").unwrap();
    assert!(w.begin_disk_from(ov, None).unwrap().is_some());
    let clone = w.complete_disk().unwrap();
    if cfg!(target_os = "linux") {
        assert_eq!(clone.method, DiskMethod::Image(CloneMethod::Ficlone));
    }
    let f = w.commit().unwrap();
    assert_eq!(std::fs::read(f.dir.join("disk.img")).unwrap(), want);
    snapshot_store::verify_chain(&s.resolve("f").unwrap()).unwrap();
}
