//! How often commit's verified-file cache spares the first restore from
//! hashing, on this machine as it is now: `COMMIT_CACHE_RUNS` (default 10)
//! commits of a full layer of `COMMIT_CACHE_MIB` MiB of RAM (default 64)
//! with a 1 MiB disk, each followed at once by the restore path's cached
//! verification. Commit records a file's stamp only once it has settled
//! (waiting up to 50 ms for that when 32 MiB or more are fresh), so a busy
//! disk or a skewed clock shows here as files hashed by the first restore.
//!
//! The store is written under `$CARGO_TARGET_DIR` (default `target/`) and
//! removed at the end. Prints one line per commit and a summary, and writes
//! the figures to `bench-results/commit_cache.json`.
//!
//! ```text
//! cargo run --release -p snapshot-store --example commit_cache
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use snapshot_store::{verify_chain_cached, LayerMeta, Store};

const PAGE: u64 = 16384;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Fill `buf` with a cheap deterministic pattern (splitmix64).
fn fill(buf: &mut [u8], mut seed: u64) {
    for chunk in buf.chunks_mut(8) {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let v = (z ^ (z >> 31)).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib = env_u64("COMMIT_CACHE_MIB", 64).max(1);
    let runs = env_u64("COMMIT_CACHE_RUNS", 10).max(1);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target: PathBuf = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    let dir = target.join("commit-cache-bench");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let store = Store::create(dir.join("store"))?;
    let disk = dir.join("disk.img");
    let mut bytes = vec![0u8; 1 << 20];
    fill(&mut bytes, 7);
    std::fs::write(&disk, &bytes)?;
    let ram_size = mib << 20;
    let mut ram = vec![0u8; ram_size as usize];

    let mut commit_ms = Vec::new();
    let mut first_restore_hashed = Vec::new();
    let mut all_cached = 0;
    for i in 0..runs {
        fill(&mut ram[..PAGE as usize], i);
        let name = format!("g{i}");
        let meta = LayerMeta {
            parent: None,
            page_size: PAGE,
            ram_base_gpa: 0x4000_0000,
            ram_size,
            vcpus: 1,
            backend: "emu".into(),
            gic_mode: "userspace".into(),
            creator: "commit_cache".into(),
        };
        let t = Instant::now();
        let mut w = store.begin(&name, meta)?;
        w.write_full_memory(&ram)?;
        w.write_state(&[0u8; 4096])?;
        w.clone_disk(&disk, None)?;
        w.commit()?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let r = verify_chain_cached(&store.resolve(&name)?)?;
        println!(
            "commit {name}: {ms:.1} ms; first restore: {} of {} files from the cache, {} bytes hashed",
            r.files_cached, r.files, r.bytes_hashed
        );
        if r.files_hashed == 0 {
            all_cached += 1;
        }
        commit_ms.push(ms);
        first_restore_hashed.push(r.bytes_hashed as f64);
        store.remove(&name, false)?;
    }
    let (max_ms, max_hashed) = (
        commit_ms.iter().copied().fold(0.0, f64::max),
        first_restore_hashed.iter().copied().fold(0.0, f64::max),
    );
    let med_ms = median(&mut commit_ms);
    let med_hashed = median(&mut first_restore_hashed);
    println!(
        "{mib} MiB full layer: commit median {med_ms:.1} ms (max {max_ms:.1}); the first restore hashed nothing after {all_cached} of {runs} commits (bytes hashed: median {med_hashed:.0}, max {max_hashed:.0})"
    );
    let json = serde_json::json!({
        "ram_mib": mib,
        "runs": runs,
        "commit_ms": {"median": med_ms, "max": max_ms},
        "first_restore_all_cached": all_cached,
        "first_restore_bytes_hashed": {"median": med_hashed, "max": max_hashed},
    });
    let out = repo.join("bench-results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("commit_cache.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
