//! Disk chunk digests: incremental digest lists equal a from-scratch
//! recompute over random write patterns and generations, holes hash like
//! zeros, a changed disk byte is caught with its chunk named, a damaged
//! parent list is refused, and 1.x layers are refused.

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use common::*;
use snapshot_store::format::chunks::{parse_disk_chunks, DISK_CHUNKS_HEADER_LEN};
use snapshot_store::format::{DISK_CHUNKS_FILE, DISK_FILE, MANIFEST_FILE};
use snapshot_store::{
    hex, sha256, verify_chain, verify_chain_cached, ChainDisk, DiskSource, Layer, Store,
    DISK_CHUNK_SIZE,
};

const C: u64 = DISK_CHUNK_SIZE;

/// The chunk digests of `path`, computed by hand from its bytes.
fn by_hand(path: &Path) -> Vec<[u8; 32]> {
    std::fs::read(path)
        .unwrap()
        .chunks(C as usize)
        .map(sha256)
        .collect()
}

/// Check a layer's disk against a recompute: the chain's disk (its
/// `disk.img`, or the image below with the diffs applied) equals `disk`,
/// `disk.chunks` lists the per-chunk digests, and the manifest's digest is
/// the sha256 of that list.
fn check_layer_disk(s: &Store, layer: &Layer, disk: &Path) {
    let chain = s.resolve(&layer.name).unwrap();
    let view = ChainDisk::open(&chain).unwrap().unwrap();
    let mut bytes = vec![0u8; view.size() as usize];
    view.read_exact_at(&mut bytes, 0).unwrap();
    assert_eq!(bytes, std::fs::read(disk).unwrap());
    let img = disk.with_extension("materialized");
    std::fs::write(&img, &bytes).unwrap();
    let by_hand = by_hand(&img);
    std::fs::remove_file(&img).unwrap();
    let bytes = std::fs::read(layer.dir.join(DISK_CHUNKS_FILE)).unwrap();
    let list = parse_disk_chunks(&bytes).unwrap();
    assert_eq!(list.digests, by_hand, "{}", layer.name);
    let entry = layer.manifest.disk.as_ref().unwrap();
    assert_eq!(entry.chunk_size, C);
    assert_eq!(entry.size, std::fs::metadata(disk).unwrap().len());
    assert_eq!(entry.sha256, hex(&sha256(&bytes[DISK_CHUNKS_HEADER_LEN..])));
    let concat: Vec<u8> = list.digests.concat();
    assert_eq!(entry.sha256, hex(&sha256(&concat)));
}

/// One guest write: `len` bytes at `at` (random bytes, or zeros).
fn write(f: &File, rng: &mut Rng, at: u64, len: u64, zeros: bool) {
    let mut buf = vec![0u8; len as usize];
    if !zeros {
        rng.fill(&mut buf);
    }
    f.write_all_at(&buf, at).unwrap();
}

/// Random writes into `f` (a `size`-byte disk); returns the chunks touched
/// (as a VMM tracks them).
fn random_writes(rng: &mut Rng, f: &File, size: u64) -> Vec<u64> {
    let mut touched = Vec::new();
    let mut mark = |at: u64, len: u64| touched.extend(at / C..(at + len).div_ceil(C));
    match rng.below(6) {
        0 => {}
        1 => {
            // One sector straddling a chunk boundary.
            let b = (1 + rng.below(size / C - 1)) * C;
            write(f, rng, b - 256, 512, false);
            mark(b - 256, 512);
        }
        2 => {
            // The short last chunk.
            write(f, rng, size - 100, 100, false);
            mark(size - 100, 100);
        }
        3 => {
            // Zeros over data and over holes.
            let at = rng.below(size - 3 * C);
            write(f, rng, at, 2 * C + 1, true);
            mark(at, 2 * C + 1);
        }
        _ => {
            for _ in 0..1 + rng.below(6) {
                let len = 1 + rng.below(3 * C);
                let at = rng.below(size - len);
                write(f, rng, at, len, false);
                mark(at, len);
            }
        }
    }
    // Unsorted, with duplicates: the writer accepts any order.
    touched.reverse();
    touched
}

fn commit_disk(
    s: &Store,
    name: &str,
    parent: &Layer,
    disk: &Path,
    written: Option<&[u64]>,
) -> (Layer, snapshot_store::DiskClone) {
    let ram = vec![1u8; 4 * PS as usize];
    let mut w = s.begin(name, parent.child_meta("test")).unwrap();
    w.write_diff_from_ram(&ram, [0]).unwrap();
    w.write_state(name.as_bytes()).unwrap();
    let clone = match written {
        Some([]) => w.reuse_parent_disk().unwrap(),
        _ => w.clone_disk(disk, written).unwrap(),
    };
    (w.commit().unwrap(), clone)
}

#[test]
fn incremental_digests_equal_a_recompute() {
    for seed in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::create(dir.path().join("s")).unwrap();
        let disk = dir.path().join("disk.img");
        // 20 whole chunks and a short one; sparse, some data.
        let size = 20 * C + 12_345;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&disk)
            .unwrap();
        f.set_len(size).unwrap();
        let mut rng = Rng(seed);
        write(&f, &mut rng, 3 * C + 10, 5000, false);
        let ram = vec![0u8; 4 * PS as usize];
        let mut top = full(&s, "g", &ram, b"g", Some(&disk));
        check_layer_disk(&s, &top, &disk);
        for gen in 1..=8 {
            let touched = random_writes(&mut rng, &f, size);
            let mut unique = touched.clone();
            unique.sort_unstable();
            unique.dedup();
            let name = format!("d{gen}");
            let (layer, clone) = commit_disk(&s, &name, &top, &disk, Some(&touched));
            assert_eq!(clone.chunks, 21);
            assert_eq!(clone.hashed, unique.len() as u64, "seed {seed} gen {gen}");
            check_layer_disk(&s, &layer, &disk);
            top = layer;
        }
        // A grown disk: no parent list of that size, every data chunk hashed.
        f.set_len(size + 3 * C).unwrap();
        write(&f, &mut rng, size + C, 10, false);
        let (layer, clone) = commit_disk(&s, "grown", &top, &disk, Some(&[]));
        // Reused the parent's image: the size change is the caller's to know.
        assert_eq!(clone.hashed, 0);
        drop(layer);
        s.remove("grown", false).unwrap();
        let (layer, clone) = commit_disk(&s, "grown", &top, &disk, Some(&[0]));
        assert_eq!(clone.chunks, 24);
        assert!(clone.hashed >= 2, "{clone:?}");
        check_layer_disk(&s, &layer, &disk);
        let r = verify_chain(&s.resolve("grown").unwrap()).unwrap();
        assert_eq!(r.layers, 10);
    }
}

#[test]
fn holes_and_zeros_give_the_same_digests() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let size = 16 * C + 777;
    let sparse = dir.path().join("sparse.img");
    let f = File::create(&sparse).unwrap();
    f.set_len(size).unwrap();
    f.write_all_at(b"superblock", 1024).unwrap();
    f.write_all_at(&[7u8; 100], 9 * C - 50).unwrap();
    drop(f);
    let dense = dir.path().join("dense.img");
    std::fs::write(&dense, std::fs::read(&sparse).unwrap()).unwrap();
    let ram = vec![0u8; 4 * PS as usize];
    let mut w = s.begin("sparse", meta(ram.len() as u64)).unwrap();
    w.write_full_memory(&ram).unwrap();
    w.write_state(b"s").unwrap();
    let cs = w.clone_disk(&sparse, None).unwrap();
    let a = w.commit().unwrap();
    let mut w = s.begin("dense", meta(ram.len() as u64)).unwrap();
    w.write_full_memory(&ram).unwrap();
    w.write_state(b"s").unwrap();
    let cd = w.clone_disk(&dense, None).unwrap();
    let b = w.commit().unwrap();
    assert_eq!(a.manifest.disk, b.manifest.disk);
    assert_eq!(
        std::fs::read(a.dir.join(DISK_CHUNKS_FILE)).unwrap(),
        std::fs::read(b.dir.join(DISK_CHUNKS_FILE)).unwrap()
    );
    check_layer_disk(&s, &a, &sparse);
    // Only the chunks with data are read (0, 8 and 9 here) where the file
    // system reports holes: a clone keeps the source's, a copy also turns
    // blocks of zeros into holes (so the dense image's copy is sparse too).
    assert_eq!(cd.chunks, 17);
    assert!(cd.hashed == 3 || cd.hashed == 17, "{cd:?}");
    eprintln!("sparse image: {cs}");
    assert!(cs.hashed == 3 || cs.hashed == 17, "{cs:?}");
    for l in ["sparse", "dense"] {
        verify_chain(&s.resolve(l).unwrap()).unwrap();
    }
}

#[test]
fn a_changed_disk_byte_is_caught_with_its_chunk_named() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    let mut bytes = vec![0u8; (5 * C + 99) as usize];
    Rng(5).fill(&mut bytes);
    std::fs::write(&disk, &bytes).unwrap();
    let ram = vec![0u8; 4 * PS as usize];
    full(&s, "g", &ram, b"g", Some(&disk));
    make_writable(s.root());
    let chain = s.resolve("g").unwrap();
    settle();
    verify_chain(&chain).unwrap();
    let img = s.root().join("g").join(DISK_FILE);
    for (at, chunk) in [(0, 0), (C - 1, 0), (3 * C + 17, 3), (5 * C + 98, 5)] {
        flip_keep_times(&img, at, 0x20);
        let e = verify_chain(&chain).unwrap_err().to_string();
        let start = chunk * C;
        let end = (start + C).min(5 * C + 99);
        assert!(
            e.contains("disk.img") && e.contains(&format!("chunk {chunk} (bytes {start}..{end})")),
            "byte {at}: {e}"
        );
        // The cached path sees the new ctime and hashes too.
        let e = verify_chain_cached(&chain).unwrap_err().to_string();
        assert!(e.contains(&format!("chunk {chunk} ")), "byte {at}: {e}");
        flip_keep_times(&img, at, 0x20);
    }
    verify_chain(&chain).unwrap();
}

#[test]
fn a_damaged_parent_list_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![3u8; (2 * C) as usize]).unwrap();
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    make_writable(s.root());
    let list = g.dir.join(DISK_CHUNKS_FILE);
    // One bit of the second digest; size and header intact.
    flip_keep_times(&list, DISK_CHUNKS_HEADER_LEN as u64 + 40, 1);
    let mut w = s.begin("d", g.child_meta("test")).unwrap();
    w.write_diff_from_ram(&ram, [0]).unwrap();
    w.write_state(b"d").unwrap();
    w.clone_disk(&disk, Some(&[0])).unwrap();
    let e = w.commit().unwrap_err().to_string();
    assert!(e.contains("g/disk.chunks"), "{e}");
    assert!(!s.contains("d"));
    // An out-of-range written chunk is a usage error, before any hashing.
    let mut w = s.begin("d", g.child_meta("test")).unwrap();
    let e = w.clone_disk(&disk, Some(&[2])).unwrap_err().to_string();
    assert!(e.contains("written chunk 2 is beyond the 2 chunks"), "{e}");
}

#[test]
fn layers_of_older_major_versions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", None);
    make_writable(s.root());
    // What a 1.0 or 2.0 writer wrote: the same fields, resealed (2.0 hashed
    // memory.bin whole; 1.0 also disk.img).
    for major in [1, 2] {
        let mut m = g.manifest.clone();
        m.format = snapshot_store::format::FormatVersion { major, minor: 0 };
        m.seal();
        std::fs::write(g.dir.join(MANIFEST_FILE), m.to_bytes()).unwrap();
        let e = s.resolve("g").unwrap_err().to_string();
        assert!(
            e.contains("manifest.json")
                && e.contains(&format!("format version {major}.0 is not readable")),
            "{e}"
        );
    }
}

/// Timing printout (not asserted): a diff re-hashing one chunk of a 64 MiB
/// disk against a layer hashing all of it.
#[test]
fn one_chunk_rehash_costs_a_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("s")).unwrap();
    let disk = dir.path().join("disk.img");
    let size: u64 = if cfg!(debug_assertions) {
        8 << 20
    } else {
        64 << 20
    };
    let mut bytes = vec![0u8; size as usize];
    Rng(9).fill(&mut bytes);
    std::fs::write(&disk, &bytes).unwrap();
    let ram = vec![0u8; 4 * PS as usize];
    let t = Instant::now();
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    let full_time = t.elapsed();
    let f = OpenOptions::new().write(true).open(&disk).unwrap();
    f.write_all_at(&[1u8; 8192], 5 * C + 100).unwrap();
    let t = Instant::now();
    let (d, clone) = commit_disk(&s, "d", &g, &disk, Some(&[5]));
    let diff_time = t.elapsed();
    assert_eq!((clone.hashed, clone.chunks), (1, size / C));
    check_layer_disk(&s, &d, &disk);
    eprintln!(
        "{} MiB disk: full layer (all {} chunks hashed) {full_time:?}; diff ({clone}) {diff_time:?}",
        size >> 20,
        size / C
    );
}
