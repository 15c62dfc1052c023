//! Writes the seed corpus of the fuzz targets, `fuzz/seeds/<target>/`:
//! valid files made by this store (`valid-*`) and a few edge cases
//! (`edge-*`) for each of the six targets, a few KiB each (the prefix of a
//! disk diff is 64 KiB). Replaces what
//! is there. The seeds are checked in; `tests/fuzz_seeds.rs` checks that
//! the valid ones still parse, and `scripts/fuzz.sh` fuzzes a copy of them.
//!
//! ```text
//! cargo run -p snapshot-store --example fuzz_seeds
//! ```

use std::path::Path;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use snapshot_store::format::chunks::encode_disk_chunks;
use snapshot_store::format::disk_diff::DISK_DIFF_ALIGN;
use snapshot_store::format::state::MAX_STATE_BYTES;
use snapshot_store::format::verified::VERIFIED_FILE;
use snapshot_store::format::{
    DISK_CHUNKS_FILE, DISK_DIFF_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE,
};
use snapshot_store::{verify_chain, DiskImage, Layer, LayerMeta, Store, DISK_CHUNK_SIZE};

const PAGE: u64 = 4096;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A seed: fuzz target, file name, bytes.
type Seed = (&'static str, &'static str, Vec<u8>);

fn main() -> Res<()> {
    let tmp = std::env::temp_dir().join(format!("fuzz-seeds-{}", std::process::id()));
    let [golden, d1, d2] = write_chain(&tmp)?;
    let mut seeds = manifest_and_diff_seeds(&golden, &d1, &d2)?;
    seeds.extend(state_chunks_and_cache_seeds(&golden, &d1)?);
    seeds.extend(disk_diff_seeds(&d1, &d2)?);

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    let mut total = 0;
    for (target, name, bytes) in &seeds {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
        total += bytes.len();
    }
    println!(
        "{} seeds, {total} bytes, in {}",
        seeds.len(),
        root.display()
    );
    std::fs::remove_dir_all(&tmp)?;
    Ok(())
}

/// A store under `tmp` with `golden` (full, with a disk of three chunks,
/// the last one short), `d1` (a diff of two pages, its disk a diff of the
/// last chunk) and `d2` (an empty diff, its disk unchanged), every file of
/// `golden` recorded in its `verified.json`.
fn write_chain(tmp: &Path) -> Res<[Layer; 3]> {
    let store = Store::create(tmp.join("store"))?;
    // A disk of three chunks, the last one short.
    let disk = tmp.join("disk.img");
    let mut bytes = vec![0u8; 2 * DISK_CHUNK_SIZE as usize + 100];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    std::fs::write(&disk, &bytes)?;
    let mut ram = vec![0u8; 8 * PAGE as usize];
    ram[..11].copy_from_slice(b"golden page");

    let meta = LayerMeta {
        parent: None,
        page_size: PAGE,
        ram_base_gpa: 0x4000_0000,
        ram_size: ram.len() as u64,
        vcpus: 2,
        backend: "emu".into(),
        gic_mode: "userspace".into(),
        creator: "ignition-vmm 0.1.0".into(),
    };
    let mut w = store.begin("golden", meta)?;
    w.write_full_memory(&ram)?;
    w.write_state(b"vcpu and device state")?;
    w.clone_disk(&disk, None)?;
    let golden = w.commit()?;

    // A diff of two pages whose disk is a diff of its short last chunk, then
    // an empty diff whose disk is unchanged.
    ram[PAGE as usize] = 1;
    ram[3 * PAGE as usize] = 3;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&disk)?
        .write_all_at(b"d1", 2 * DISK_CHUNK_SIZE + 7)?;
    let mut w = store.begin("d1", golden.child_meta("ignition-vmm 0.1.0"))?;
    w.write_diff_from_ram(&ram, [1, 3])?;
    w.write_state(b"")?;
    w.begin_disk_diff(Arc::new(DiskImage::open(&disk)?), &[2])?;
    w.complete_disk()?;
    let d1 = w.commit()?;
    let mut w = store.begin("d2", d1.child_meta("ignition-vmm 0.1.0"))?;
    w.write_diff_memory(std::iter::empty())?;
    w.write_state(b"d2")?;
    w.reuse_parent_disk()?;
    let d2 = w.commit()?;

    // Let every stamp settle (the racy window is 50 ms), so that a full
    // verification records every file of golden in its verified.json.
    std::thread::sleep(std::time::Duration::from_millis(100));
    verify_chain(&store.resolve("golden")?)?;
    Ok([golden, d1, d2])
}

fn read(dir: &Path, f: &str) -> std::io::Result<Vec<u8>> {
    std::fs::read(dir.join(f))
}

/// `b` with bit 0 of byte `at` flipped.
fn flip(b: &[u8], at: usize) -> Vec<u8> {
    let mut b = b.to_vec();
    b[at] ^= 1;
    b
}

/// `b` with the little-endian u64 at `at` set to `v`.
fn with_u64(b: &[u8], at: usize, v: u64) -> Vec<u8> {
    let mut b = b.to_vec();
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    b
}

fn manifest_and_diff_seeds(golden: &Layer, d1: &Layer, d2: &Layer) -> Res<Vec<Seed>> {
    let golden_manifest = read(&golden.dir, MANIFEST_FILE)?;
    let d1_diff = read(&d1.dir, MEMORY_FILE)?;
    Ok(vec![
        ("manifest", "valid-full-with-disk", golden_manifest.clone()),
        ("manifest", "valid-diff", read(&d1.dir, MANIFEST_FILE)?),
        (
            "manifest",
            "valid-empty-diff",
            read(&d2.dir, MANIFEST_FILE)?,
        ),
        ("manifest", "edge-empty", Vec::new()),
        (
            "manifest",
            "edge-truncated",
            golden_manifest[..golden_manifest.len() / 2].to_vec(),
        ),
        (
            "manifest",
            "edge-newer-minor",
            String::from_utf8(golden_manifest.clone())?
                .replacen("\"minor\": 1", "\"minor\": 2", 1)
                .into_bytes(),
        ),
        ("diff", "valid-two-pages", d1_diff.clone()),
        ("diff", "valid-no-pages", read(&d2.dir, MEMORY_FILE)?),
        ("diff", "edge-header-only", d1_diff[..96].to_vec()),
        ("diff", "edge-bad-digest", flip(&d1_diff[..4096], 100)),
        (
            "diff",
            "edge-huge-page-count",
            with_u64(&d1_diff, 32, u64::MAX),
        ),
    ])
}

fn state_chunks_and_cache_seeds(golden: &Layer, d1: &Layer) -> Res<Vec<Seed>> {
    let golden_state = read(&golden.dir, STATE_FILE)?;
    let chunks = read(&golden.dir, DISK_CHUNKS_FILE)?;
    let verified = read(&golden.dir, VERIFIED_FILE)?;
    let verified_text = String::from_utf8(verified.clone())?;
    Ok(vec![
        ("state", "valid-payload", golden_state.clone()),
        ("state", "valid-empty-payload", read(&d1.dir, STATE_FILE)?),
        (
            "state",
            "edge-truncated-header",
            golden_state[..40].to_vec(),
        ),
        ("state", "edge-bad-digest", flip(&golden_state, 60)),
        (
            "state",
            "edge-oversized-payload",
            with_u64(&golden_state, 16, MAX_STATE_BYTES + 1),
        ),
        ("disk_chunks", "valid-three-chunks", chunks.clone()),
        (
            "disk_chunks",
            "valid-empty-disk",
            encode_disk_chunks(DISK_CHUNK_SIZE, 0, &[])?,
        ),
        (
            "disk_chunks",
            "edge-bad-checksum",
            flip(&chunks, chunks.len() - 1),
        ),
        (
            "disk_chunks",
            "edge-truncated",
            chunks[..chunks.len() - 32].to_vec(),
        ),
        ("verified", "valid-all-files", verified),
        (
            "verified",
            "valid-no-entries",
            b"{\n  \"format\": 1,\n  \"files\": {}\n}\n".to_vec(),
        ),
        (
            "verified",
            "edge-unknown-file",
            verified_text
                .replacen(MEMORY_FILE, "other.bin", 1)
                .into_bytes(),
        ),
        (
            "verified",
            "edge-newer-format",
            verified_text
                .replacen("\"format\": 1", "\"format\": 2", 1)
                .into_bytes(),
        ),
    ])
}

/// Seeds of the `disk.diff` prefix parser: the header, index and padding
/// (the chunk data is not parsed) of `d1`'s diff of one chunk and `d2`'s
/// empty one, and edges.
fn disk_diff_seeds(d1: &Layer, d2: &Layer) -> Res<Vec<Seed>> {
    let prefix = |l: &Layer| -> Res<Vec<u8>> {
        let mut b = read(&l.dir, DISK_DIFF_FILE)?;
        b.truncate(DISK_DIFF_ALIGN as usize);
        Ok(b)
    };
    let one = prefix(d1)?;
    Ok(vec![
        ("disk_diff", "valid-one-chunk", one.clone()),
        ("disk_diff", "valid-no-chunks", prefix(d2)?),
        ("disk_diff", "edge-header-only", one[..96].to_vec()),
        ("disk_diff", "edge-bad-digest", flip(&one, 100)),
        ("disk_diff", "edge-huge-count", with_u64(&one, 32, u64::MAX)),
    ])
}
