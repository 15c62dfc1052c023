//! Property test (deterministic seeds): for random dirty patterns over
//! several generations, restoring the chain gives exactly the simulated
//! RAM, i.e. a full dump at the same point.

mod common;

use common::*;
use snapshot_store::{
    map_base_memory, map_chain_memory, overlay_diffs, verify_chain, Layer, Store,
};

/// Pick the pages a generation dirties (sorted, unique).
fn dirty_pattern(rng: &mut Rng, pages: u64) -> Vec<u64> {
    let mut v: Vec<u64> = match rng.below(8) {
        0 => vec![],
        1 => (0..pages).collect(),
        2 => vec![pages - 1],
        3 => vec![0],
        4 => {
            let start = rng.below(pages);
            let len = 1 + rng.below(pages - start);
            (start..start + len).collect()
        }
        5 => (0..pages).filter(|p| p % 2 == 1).collect(),
        _ => {
            let density = 1 + rng.below(100);
            (0..pages).filter(|_| rng.below(100) < density).collect()
        }
    };
    v.sort_unstable();
    v.dedup();
    v
}

/// Write into `ram` and the model what a guest would: random bytes at a
/// random spot of each page in `written`.
fn guest_writes(rng: &mut Rng, ram: &mut [u8], model: &mut [u8], written: &[u64]) {
    let ps = PS as usize;
    for &p in written {
        let off = rng.below(PS) as usize;
        let len = 1 + rng.below(PS - off as u64) as usize;
        let at = p as usize * ps + off;
        let mut bytes = vec![0u8; len];
        rng.fill(&mut bytes);
        ram[at..at + len].copy_from_slice(&bytes);
        model[at..at + len].copy_from_slice(&bytes);
    }
}

fn run_seed(seed: u64) {
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let pages = 1 + rng.below(40);
    let generations = 1 + rng.below(6);
    let mut model = vec![0u8; (pages * PS) as usize];
    // Leave some pages zero, fill the others.
    for p in 0..pages as usize {
        if rng.below(3) != 0 {
            rng.fill(&mut model[p * PS as usize..(p + 1) * PS as usize]);
        }
    }
    let base = full(&store, "g0", &model, b"gen 0", None);
    let base_digest = base.manifest.memory.sha256.clone();
    let mut top: Layer = base;
    for g in 1..=generations {
        // Restore the previous generation as the VMM would.
        let chain = store.resolve(&top.name).unwrap();
        assert_eq!(chain.len() as u64, g, "seed {seed}");
        verify_chain(&chain).unwrap();
        let mut ram = map_chain_memory(&chain).unwrap();
        assert!(
            ram[..] == model[..],
            "seed {seed}: restore of gen {} differs",
            g - 1
        );
        // The guest runs: it writes some pages; tracking reports those and
        // possibly a few more (spuriously dirty, unchanged).
        let written = dirty_pattern(&mut rng, pages);
        guest_writes(&mut rng, &mut ram, &mut model, &written);
        let mut dirty = written.clone();
        if rng.below(2) == 0 {
            dirty.push(rng.below(pages));
            dirty.sort_unstable();
            dirty.dedup();
        }
        let name = format!("g{g}");
        let state = format!("gen {g}");
        top = diff(&store, &name, &top, &ram, &dirty, state.as_bytes(), None);
        assert_eq!(top.manifest.diff_pages, Some(dirty.len() as u64));
    }
    // The final chain, by name and by NAME+N, equals the model.
    for spec in [top.name.clone(), format!("g0+{generations}")] {
        let chain = store.resolve(&spec).unwrap();
        assert_eq!(chain.top().name, top.name, "seed {seed} spec {spec}");
        verify_chain(&chain).unwrap();
        let ram = map_chain_memory(&chain).unwrap();
        assert!(ram[..] == model[..], "seed {seed}: final restore differs");
        // The copying overlay (macOS, unaligned diffs) gives the same RAM.
        let mut copied = map_base_memory(chain.base()).unwrap();
        overlay_diffs(&mut copied, &chain.layers()[1..]).unwrap();
        assert!(
            copied[..] == model[..],
            "seed {seed}: copied overlay differs"
        );
        assert_eq!(
            chain.top().read_state().unwrap(),
            format!("gen {generations}").as_bytes()
        );
    }
    // Squash gives a full layer equal to the model, on its own.
    let sq = store.squash(&top.name, "flat", None).unwrap();
    assert!(sq.manifest.parent.is_none());
    assert_eq!(
        std::fs::read(sq.memory_path()).unwrap(),
        model,
        "seed {seed}"
    );
    let flat = store.resolve("flat").unwrap();
    assert_eq!(flat.len(), 1);
    verify_chain(&flat).unwrap();
    // Restoring never wrote to the base file.
    let b = store.layer("g0").unwrap();
    assert_eq!(
        snapshot_store::hex(&snapshot_store::format::memory::memory_digest(
            &std::fs::read(b.memory_path()).unwrap()
        )),
        base_digest
    );
}

#[test]
fn restored_chain_equals_full_dump() {
    for seed in 0..48 {
        run_seed(seed);
    }
}

#[test]
fn overlay_coalesces_runs_without_offset_errors() {
    // Pages whose contents encode their own number make any offset error
    // visible: a full layer of zeros, then diffs writing runs that end at
    // RAM's last page (where an off-by-one in merging a run of pages would
    // drop or shift the final page) and single pages.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let pages = 20u64;
    let mut ram = vec![0u8; (pages * PS) as usize];
    let g = full(&store, "g", &ram, b"", None);
    let stamp = |ram: &mut [u8], p: u64, gen: u8| {
        let at = (p * PS) as usize;
        for (i, b) in ram[at..at + PS as usize].iter_mut().enumerate() {
            *b = (p as u8) ^ gen ^ (i as u8);
        }
    };
    let sets: [&[u64]; 3] = [&[17, 18, 19], &[0, 1, 2, 5, 6, 19], &[3, 10, 11, 12, 13]];
    let mut top = g;
    for (i, set) in sets.iter().enumerate() {
        for &p in *set {
            stamp(&mut ram, p, i as u8 + 1);
        }
        top = diff(&store, &format!("d{i}"), &top, &ram, set, b"", None);
    }
    let chain = store.resolve(&top.name).unwrap();
    assert_eq!(chain.describe(), "g -> d0 -> d1 -> d2");
    assert!(map_chain_memory(&chain).unwrap()[..] == ram[..]);
}

/// A free host address for `len` bytes (mapped, then unmapped).
#[cfg(target_os = "linux")]
fn free_address(len: usize) -> usize {
    let probe = memmap2::MmapMut::map_anon(len).unwrap();
    probe.as_ptr() as usize
}

#[cfg(target_os = "linux")]
#[test]
fn a_chain_maps_at_a_chosen_address_as_anywhere_and_never_over_a_mapping() {
    use snapshot_store::map_chain_memory_at;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("s")).unwrap();
    let mut rng = Rng(7);
    let pages = 12u64;
    let mut ram = vec![0u8; (pages * PS) as usize];
    rng.fill(&mut ram[..(4 * PS) as usize]);
    let g = full(&store, "g", &ram, b"", None);
    rng.fill(&mut ram[(5 * PS) as usize..(7 * PS) as usize]);
    let top = diff(&store, "d", &g, &ram, &[5, 6], b"", None);
    let chain = store.resolve(&top.name).unwrap();
    let len = ram.len();
    let at = free_address(len);
    let mut fixed = map_chain_memory_at(&chain, at).unwrap();
    assert_eq!(fixed.as_ptr() as usize, at);
    assert!(fixed[..] == ram[..] && map_chain_memory(&chain).unwrap()[..] == ram[..]);
    // Private: a write reaches neither the store's files nor another mapping.
    fixed[5 * PS as usize] ^= 0xff;
    assert!(map_chain_memory(&chain).unwrap()[..] == ram[..]);
    // Where something is mapped, nothing is replaced.
    let e = map_chain_memory_at(&chain, at).unwrap_err().to_string();
    assert!(e.contains("memory.bin") && e.contains("mmap"), "{e}");
    assert_eq!(fixed[5 * PS as usize], ram[5 * PS as usize] ^ 0xff);
    drop(fixed);
    // Unmapped on drop: the address is free again.
    assert_eq!(
        map_chain_memory_at(&chain, at).unwrap().as_ptr() as usize,
        at
    );
}
