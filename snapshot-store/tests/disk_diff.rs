//! Disks without copies (format 3.1): diff layers that store only the
//! chunks written since their parent (`disk.diff`), a chain's disk read
//! through its layers (`ChainDisk`), a restored VM's writable overlay on it
//! (`DiskOverlay`), what verification catches in a disk diff, squash, and
//! layers of format 3.0 (whole images in every layer) read as before.

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use common::*;
use snapshot_store::format::chunks::{encode_disk_chunks, parse_disk_chunks};
use snapshot_store::format::disk_diff::DISK_DIFF_ALIGN;
use snapshot_store::format::memory::memory_digest;
use snapshot_store::format::{
    DISK_CHUNKS_FILE, DISK_DIFF_FILE, DISK_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE,
};
use snapshot_store::{
    hex, sha256, verify_chain, ChainDisk, DiskImage, DiskOverlay, DiskSource, Layer, Store,
    DISK_CHUNK_SIZE,
};

const C: u64 = DISK_CHUNK_SIZE;
/// 12 chunks, the last one short.
const SIZE: u64 = 11 * C + 4096;

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::create(d.path().join("s")).unwrap();
    (d, s)
}

/// A sparse image of [`SIZE`] bytes with data in chunks 0, 3 and 11.
fn image(path: &Path) {
    let f = File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    let mut b = vec![0u8; 9000];
    Rng(1).fill(&mut b);
    for at in [0, 3 * C + 500, 11 * C + 10] {
        f.write_all_at(&b[..(SIZE - at).min(9000) as usize], at)
            .unwrap();
    }
}

/// Writes `len` random bytes at `at` of `path`; returns the chunks touched.
fn scribble(path: &Path, rng: &mut Rng, at: u64, len: u64) -> Vec<u64> {
    let mut b = vec![0u8; len as usize];
    rng.fill(&mut b);
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&b, at).unwrap();
    (at / C..=(at + len - 1) / C).collect()
}

/// Commits a diff layer `name` on `parent` whose disk is a diff of
/// `chunks` of `src`.
fn diff_layer(
    s: &Store,
    name: &str,
    parent: &Layer,
    src: Arc<dyn DiskSource>,
    chunks: &[u64],
) -> Layer {
    let ram = vec![0u8; 4 * PS as usize];
    let mut w = s.begin(name, parent.child_meta("test")).unwrap();
    w.write_diff_from_ram(&ram, [0]).unwrap();
    w.write_state(name.as_bytes()).unwrap();
    if chunks.is_empty() {
        w.reuse_parent_disk().unwrap();
    } else {
        w.begin_disk_diff(src, chunks).unwrap();
        w.complete_disk().unwrap();
    }
    w.commit().unwrap()
}

/// All bytes of a disk.
fn read_all(d: &dyn DiskSource) -> Vec<u8> {
    let mut b = vec![0u8; d.size() as usize];
    d.read_exact_at(&mut b, 0).unwrap();
    b
}

fn chain_disk(s: &Store, name: &str) -> ChainDisk {
    ChainDisk::open(&s.resolve(name).unwrap()).unwrap().unwrap()
}

#[test]
fn diff_layers_store_the_written_chunks_and_the_chain_reads_the_disk() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    image(&disk);
    let ram = vec![0u8; 4 * PS as usize];
    let mut top = full(&s, "g", &ram, b"g", Some(&disk));
    let mut rng = Rng(7);
    for gen in 1..=6u64 {
        // A few writes, one across a chunk boundary, one in the short last
        // chunk; none in generation 5 (unchanged since the parent).
        let mut chunks = Vec::new();
        if gen != 5 {
            let at = rng.below(SIZE - 9000);
            chunks.extend(scribble(&disk, &mut rng, at, 5000));
            chunks.extend(scribble(&disk, &mut rng, (gen % 4 + 1) * C - 100, 300));
        }
        if gen % 2 == 0 {
            chunks.extend(scribble(&disk, &mut rng, SIZE - 50, 50));
        }
        let src = Arc::new(DiskImage::open(&disk).unwrap());
        let name = format!("d{gen}");
        let layer = diff_layer(&s, &name, &top, src, &chunks);
        let entry = layer.manifest.disk.clone().unwrap();
        let mut unique = chunks.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(entry.diff_chunks, Some(unique.len() as u64), "{name}");
        assert_eq!(entry.size, SIZE);
        let diff = layer.dir.join(DISK_DIFF_FILE);
        assert_eq!(
            std::fs::metadata(&diff).unwrap().len(),
            DISK_DIFF_ALIGN + unique.len() as u64 * C
        );
        assert!(!layer.dir.join(DISK_FILE).exists());
        // The chain's disk is the image as it is now; its digests are the
        // image's, chunk by chunk.
        let view = chain_disk(&s, &name);
        assert_eq!(view.layers().len() as u64, gen + 1);
        let bytes = read_all(&view);
        assert!(bytes == std::fs::read(&disk).unwrap(), "{name}");
        let list =
            parse_disk_chunks(&std::fs::read(layer.dir.join(DISK_CHUNKS_FILE)).unwrap()).unwrap();
        let by_hand: Vec<_> = bytes.chunks(C as usize).map(sha256).collect();
        assert_eq!(list.digests, by_hand, "{name}");
        assert_eq!(entry.sha256, hex(&list.disk_digest()));
        top = layer;
    }
    let r = verify_chain(&s.resolve("d6").unwrap()).unwrap();
    assert_eq!(r.layers, 7);
    // Squash writes one whole image: the chain's disk.
    let flat = s.squash("d6", "flat", None).unwrap();
    assert_eq!(
        std::fs::read(flat.dir.join(DISK_FILE)).unwrap(),
        std::fs::read(&disk).unwrap()
    );
    assert_eq!(
        flat.manifest.disk.as_ref().unwrap().sha256,
        top.manifest.disk.as_ref().unwrap().sha256
    );
}

#[test]
fn a_disk_diff_holds_the_disk_as_it_was_when_it_began() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    image(&disk);
    let before = std::fs::read(&disk).unwrap();
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    let mut w = s.begin("d1", g.child_meta("test")).unwrap();
    w.write_diff_from_ram(&ram, [0]).unwrap();
    w.write_state(b"d1").unwrap();
    let src = Arc::new(DiskImage::open(&disk).unwrap());
    let copy = w.begin_disk_diff(src, &[3, 0, 3]).unwrap();
    // The VM writes on: stored chunks are copied first, others are not.
    let mut rng = Rng(3);
    for at in [3 * C + 1, 5 * C] {
        copy.before_write(at, 10);
        scribble(&disk, &mut rng, at, 10);
    }
    let clone = w.complete_disk().unwrap();
    assert_eq!((clone.hashed, clone.chunks, clone.before_write), (2, 12, 1));
    assert_eq!(
        clone.to_string(),
        "disk diff (2 of 12 chunks hashed, 1 copied before a write)"
    );
    w.commit().unwrap();
    let view = read_all(&chain_disk(&s, "d1"));
    assert_eq!(view, before);
    verify_chain(&s.resolve("d1").unwrap()).unwrap();
    // Out of range, or no parent disk: refused before anything is written.
    let mut w = s.begin("d2", g.child_meta("test")).unwrap();
    let src = Arc::new(DiskImage::open(&disk).unwrap());
    let e = w.begin_disk_diff(src, &[12]).unwrap_err().to_string();
    assert!(
        e.contains("written chunk 12 is beyond the 12 chunks"),
        "{e}"
    );
    let nodisk = full(&s, "nodisk", &ram, b"n", None);
    let mut w = s.begin("d3", nodisk.child_meta("test")).unwrap();
    let src = Arc::new(DiskImage::open(&disk).unwrap());
    let e = w.begin_disk_diff(src, &[0]).unwrap_err().to_string();
    assert!(e.contains("no parent with a disk"), "{e}");
}

/// Two restores of one layer, each on its own overlay.
#[test]
fn overlays_keep_each_vm_s_writes_to_itself_and_the_store_unchanged() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    image(&disk);
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    let img = g.dir.join(DISK_FILE);
    let (before, stamp_before) = (std::fs::read(&img).unwrap(), stamp(&img));
    let a = DiskOverlay::create(chain_disk(&s, "g"), &d.path().join("a.overlay")).unwrap();
    let b = DiskOverlay::create(chain_disk(&s, "g"), &d.path().join("b.overlay")).unwrap();
    assert!(DiskOverlay::create(chain_disk(&s, "g"), a.path()).is_err());
    assert_eq!(std::fs::metadata(a.path()).unwrap().mode() & 0o777, 0o600);
    let (mut wa, mut wb) = (before.clone(), before.clone());
    let mut rng = Rng(5);
    // Partial chunks (copied up), a chunk boundary, a whole chunk, a hole
    // chunk, the short last chunk, and writes to chunks already up.
    for (at, len) in [
        (100, 10),
        (3 * C - 7, 20),
        (5 * C, C),
        (8 * C + 9, 1),
        (SIZE - 3, 3),
        (110, 5),
    ] {
        let mut x = vec![0u8; len as usize];
        rng.fill(&mut x);
        a.write_all_at(&x, at).unwrap();
        wa[at as usize..(at + len) as usize].copy_from_slice(&x);
        rng.fill(&mut x);
        b.write_all_at(&x[..1], at).unwrap();
        wb[at as usize] = x[0];
    }
    assert!(read_all(&a) == wa && read_all(&b) == wb);
    assert_eq!(a.overlay_chunks(), 6);
    // The store's image is as it was, not even its ctime changed.
    assert_eq!(std::fs::read(&img).unwrap(), before);
    assert_eq!(stamp(&img), stamp_before);
    verify_chain(&s.resolve("g").unwrap()).unwrap();
    // The overlay holds its chunks' data only: 6 of 12 chunks, sparse.
    let used = std::fs::metadata(a.path()).unwrap().blocks() * 512;
    assert!(used <= 6 * C, "{used} bytes allocated");
    // Reads and writes beyond the disk are refused, naming the overlay.
    let e = a.write_all_at(&[1], SIZE).unwrap_err().to_string();
    assert!(e.contains("a.overlay") && e.contains("beyond"), "{e}");
    assert!(a.read_exact_at(&mut [0u8; 2], SIZE - 1).is_err());
    // Data chunks: the image's and the overlay's.
    let chunks: Vec<u64> = a.data_chunks(C).unwrap().into_iter().flatten().collect();
    assert_eq!(chunks, [0, 2, 3, 5, 8, 11]);
    a.sync_data().unwrap();
}

/// A snapshot of a VM on an overlay stores the chunks written since the
/// layer it was restored from; its restore reads what the VM had.
#[test]
fn a_snapshot_of_an_overlay_is_a_diff_of_its_written_chunks() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    image(&disk);
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    let mut parent = g;
    let mut rng = Rng(9);
    for gen in 1..=3 {
        let name = format!("s{gen}");
        let ov = Arc::new(
            DiskOverlay::create(
                chain_disk(&s, &parent.name),
                &d.path().join(format!("{name}.overlay")),
            )
            .unwrap(),
        );
        let mut want = read_all(&*ov);
        let mut written = Vec::new();
        for _ in 0..3 {
            let at = rng.below(SIZE - 700);
            let mut x = vec![0u8; 700];
            rng.fill(&mut x);
            ov.write_all_at(&x, at).unwrap();
            want[at as usize..at as usize + 700].copy_from_slice(&x);
            written.extend([at / C, (at + 699) / C]);
        }
        let layer = diff_layer(&s, &name, &parent, ov.clone(), &written);
        assert!(read_all(&chain_disk(&s, &name)) == want, "{name}");
        verify_chain(&s.resolve(&name).unwrap()).unwrap();
        // A full layer of the overlay: one whole image of the same disk.
        let mut w = s.begin(&format!("f{gen}"), meta(ram.len() as u64)).unwrap();
        w.write_full_memory(&ram).unwrap();
        w.write_state(b"f").unwrap();
        assert!(w.begin_disk_from(ov.clone(), None).unwrap().is_some());
        w.complete_disk().unwrap();
        let f = w.commit().unwrap();
        assert_eq!(std::fs::read(f.dir.join(DISK_FILE)).unwrap(), want);
        assert_eq!(
            f.manifest.disk.as_ref().unwrap().sha256,
            layer.manifest.disk.as_ref().unwrap().sha256
        );
        parent = layer;
    }
}

/// The top layer `name`'s `disk.chunks` entry `chunk` replaced by `digest`,
/// the list's checksum and the manifest's disk digest and seal made to
/// agree (a consistent forgery, which only the parent link can catch).
fn forge_list(s: &Store, name: &str, chunk: usize, digest: [u8; 32]) {
    let dir = s.root().join(name);
    let list_path = dir.join(DISK_CHUNKS_FILE);
    let mut list = parse_disk_chunks(&std::fs::read(&list_path).unwrap()).unwrap();
    list.digests[chunk] = digest;
    std::fs::write(&list_path, list.encode().unwrap()).unwrap();
    let mut m = s.layer(name).unwrap().manifest;
    m.disk.as_mut().unwrap().sha256 = hex(&list.disk_digest());
    m.seal();
    std::fs::write(dir.join(MANIFEST_FILE), m.to_bytes()).unwrap();
}

#[test]
fn verification_catches_a_damaged_disk_diff_naming_the_chunk() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    image(&disk);
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    let mut rng = Rng(2);
    let mut chunks = scribble(&disk, &mut rng, 2 * C + 5, 10);
    chunks.extend(scribble(&disk, &mut rng, SIZE - 10, 10));
    let src = Arc::new(DiskImage::open(&disk).unwrap());
    diff_layer(&s, "d1", &g, src, &chunks);
    make_writable(s.root());
    let chain = s.resolve("d1").unwrap();
    settle();
    verify_chain(&chain).unwrap();
    let diff = s.root().join("d1").join(DISK_DIFF_FILE);
    // A byte of the first slot (chunk 2), then one in the last slot's padding.
    let slot0 = DISK_DIFF_ALIGN + 5;
    flip_keep_times(&diff, slot0, 1);
    let e = verify_chain(&chain).unwrap_err().to_string();
    assert!(
        e.contains("d1/disk.diff")
            && e.contains(&format!(
                "chunk 2 (disk bytes {}..{}, slot 0)",
                2 * C,
                3 * C
            )),
        "{e}"
    );
    flip_keep_times(&diff, slot0, 1);
    let pad = DISK_DIFF_ALIGN + 2 * C - 1;
    flip_keep_times(&diff, pad, 1);
    let e = verify_chain(&chain).unwrap_err().to_string();
    assert!(
        e.contains("non-zero bytes after the disk's end in slot 1"),
        "{e}"
    );
    flip_keep_times(&diff, pad, 1);
    // The index: its digest no longer matches.
    flip_keep_times(&diff, 96, 1);
    let e = verify_chain(&chain).unwrap_err().to_string();
    assert!(
        e.contains("disk.diff") && e.contains("digest mismatch"),
        "{e}"
    );
    flip_keep_times(&diff, 96, 1);
    verify_chain(&chain).unwrap();
    // A chunk the diff does not store, whose digest in a consistently
    // forged list differs from the parent's.
    forge_list(&s, "d1", 4, [9; 32]);
    let e = verify_chain(&s.resolve("d1").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("chunk 4 is not in") && e.contains("differs from the parent's"),
        "{e}"
    );
    // A truncated diff: refused by its size before it is read.
    let f = OpenOptions::new().write(true).open(&diff).unwrap();
    f.set_len(DISK_DIFF_ALIGN).unwrap();
    let e = ChainDisk::open(&s.resolve("d1").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("disk.diff") && e.contains("manifest.json implies"),
        "{e}"
    );
}

/// Rewrites layer `name` as a format 3.0 writer wrote it: the version in
/// the headers of `state.bin`, a diff's `memory.bin` (its checksum too) and
/// `disk.chunks` (its checksum too), and in the manifest (with the files'
/// new digests and its parent's new content hash). Returns the new content
/// hash.
fn as_format_3_0(s: &Store, name: &str, parent_hash: Option<String>) -> String {
    let dir = s.root().join(name);
    let mut m = s.layer(name).unwrap().manifest;
    let state = dir.join(STATE_FILE);
    let mut b = std::fs::read(&state).unwrap();
    b[10] = 0;
    std::fs::write(&state, &b).unwrap();
    m.state.sha256 = hex(&sha256(&b));
    if m.parent.is_some() {
        let mem = dir.join(MEMORY_FILE);
        let mut b = std::fs::read(&mem).unwrap();
        b[10] = 0;
        let index_end = 96 + 8 * m.diff_pages.unwrap() as usize;
        let mut h = b[..64].to_vec();
        h.extend_from_slice(&b[96..index_end]);
        let sum = sha256(&h);
        b[64..96].copy_from_slice(&sum);
        std::fs::write(&mem, &b).unwrap();
        m.memory.sha256 = hex(&memory_digest(&b));
    }
    let list_path = dir.join(DISK_CHUNKS_FILE);
    let list = parse_disk_chunks(&std::fs::read(&list_path).unwrap()).unwrap();
    let mut b = encode_disk_chunks(list.chunk_size, list.disk_size, &list.digests).unwrap();
    b[10] = 0;
    let mut h = b[..40].to_vec();
    h.extend_from_slice(&b[72..]);
    let sum = sha256(&h);
    b[40..72].copy_from_slice(&sum);
    std::fs::write(&list_path, &b).unwrap();
    m.format.minor = 0;
    if let Some(p) = parent_hash {
        m.parent.as_mut().unwrap().sha256 = p;
    }
    m.seal();
    let bytes = m.to_bytes();
    std::fs::write(dir.join(MANIFEST_FILE), &bytes).unwrap();
    hex(&sha256(&bytes))
}

#[test]
fn format_3_0_chains_with_whole_images_still_read_and_take_disk_diffs() {
    let (d, s) = store();
    let disk = d.path().join("disk.img");
    image(&disk);
    let ram = vec![0u8; 4 * PS as usize];
    let g = full(&s, "g", &ram, b"g", Some(&disk));
    scribble(&disk, &mut Rng(4), 7 * C, 100);
    diff(&s, "d1", &g, &ram, &[1], b"d1", Some(&disk));
    make_writable(s.root());
    let gh = as_format_3_0(&s, "g", None);
    as_format_3_0(&s, "d1", Some(gh));
    let d1 = s.layer("d1").unwrap();
    assert_eq!(d1.manifest.format.to_string(), "3.0");
    verify_chain(&s.resolve("d1").unwrap()).unwrap();
    let view = chain_disk(&s, "d1");
    assert_eq!(view.layers(), ["d1"]);
    assert_eq!(read_all(&view), std::fs::read(&disk).unwrap());
    // A 3.1 disk diff on the 3.0 chain, restored through both.
    let ov = Arc::new(DiskOverlay::create(view, &d.path().join("o")).unwrap());
    ov.write_all_at(b"new", 9 * C).unwrap();
    let want = read_all(&*ov);
    let d2 = diff_layer(&s, "d2", &d1, ov, &[9]);
    assert_eq!(d2.manifest.format.to_string(), "3.1");
    verify_chain(&s.resolve("d2").unwrap()).unwrap();
    assert_eq!(read_all(&chain_disk(&s, "d2")), want);
}
