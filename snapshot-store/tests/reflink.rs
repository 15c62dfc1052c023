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
    let mut w = s.begin("g", meta).unwrap();
    w.write_full_memory(&[1u8; 4 * 4096]).unwrap();
    w.write_state(b"g").unwrap();
    w.clone_disk(&disk, None).unwrap();
    let g = w.commit().unwrap();
    // The child reuses the parent's disk image: a clone of it.
    let mut w = s.begin("d", g.child_meta("test")).unwrap();
    w.write_diff_memory(std::iter::empty()).unwrap();
    w.write_state(b"d").unwrap();
    w.reuse_parent_disk().unwrap();
    w.commit().unwrap();
    for (name, u) in s.du().unwrap() {
        let u = u.unwrap();
        let shared = u.shared_bytes.expect("XFS answers FIEMAP");
        assert!(shared >= 1 << 20, "{name}: {u:?}");
        assert!(shared <= u.physical_bytes, "{name}: {u:?}");
    }
}
