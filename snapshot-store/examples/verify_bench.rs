//! Full against cached verification of a chain: a full layer of 512 MiB
//! (override with `VERIFY_BENCH_MIB`) and two diffs of 16 MiB each, in a
//! throwaway store (under `$CARGO_TARGET_DIR` or `target/`, or
//! `VERIFY_BENCH_DIR`). Prints one line per measurement (median, min, max
//! of `VERIFY_BENCH_RUNS`, default 5) and a JSON summary.
//!
//! ```text
//! CARGO_TARGET_DIR=target cargo run --release -p snapshot-store --example verify_bench
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use snapshot_store::{verify_chain, verify_chain_cached, Chain, LayerMeta, Store, VerifyReport};

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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Run `f` `runs` times; (median, min, max) in ms and the last report.
fn measure(
    runs: usize,
    mut before: impl FnMut(),
    mut f: impl FnMut() -> VerifyReport,
) -> ((f64, f64, f64), VerifyReport) {
    let mut times = Vec::with_capacity(runs);
    let mut last = VerifyReport::default();
    for _ in 0..runs {
        before();
        let t = Instant::now();
        last = f();
        times.push(ms(t.elapsed()));
    }
    times.sort_by(f64::total_cmp);
    ((times[runs / 2], times[0], times[runs - 1]), last)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib = env_u64("VERIFY_BENCH_MIB", 512);
    let runs = env_u64("VERIFY_BENCH_RUNS", 5).max(1) as usize;
    let dir: PathBuf = match std::env::var_os("VERIFY_BENCH_DIR") {
        Some(d) => d.into(),
        None => PathBuf::from(std::env::var_os("CARGO_TARGET_DIR").unwrap_or("target".into()))
            .join("verify-bench"),
    };
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let store = Store::create(&dir)?;
    let ram_size = mib << 20;
    let mut ram = vec![0u8; ram_size as usize];
    fill(&mut ram, 1);
    let meta = LayerMeta {
        parent: None,
        page_size: PAGE,
        ram_base_gpa: 0x4000_0000,
        ram_size,
        vcpus: 2,
        backend: "emu".into(),
        gic_mode: "userspace".into(),
        creator: "verify_bench".into(),
    };
    let t = Instant::now();
    let mut w = store.begin("base", meta)?;
    w.write_full_memory(&ram)?;
    w.write_state(&[0u8; 4096])?;
    let mut top = w.commit()?;
    println!("commit base ({mib} MiB): {:.1} ms", ms(t.elapsed()));
    let diff_pages = (16 << 20) / PAGE;
    for (i, name) in ["d1", "d2"].into_iter().enumerate() {
        let first = (i as u64 * 7919) % (ram_size / PAGE - diff_pages);
        let pages: Vec<u64> = (first..first + diff_pages).collect();
        for &p in &pages {
            let at = (p * PAGE) as usize;
            fill(&mut ram[at..at + PAGE as usize], p ^ (i as u64 + 2));
        }
        let t = Instant::now();
        let mut w = store.begin(name, top.child_meta("verify_bench"))?;
        w.write_diff_from_ram(&ram, pages)?;
        w.write_state(&[1u8; 4096])?;
        top = w.commit()?;
        println!("commit {name} (16 MiB diff): {:.1} ms", ms(t.elapsed()));
    }
    drop(ram);
    let chain: Chain = store.resolve("d2")?;

    let first = Instant::now();
    let r = verify_chain_cached(&chain)?;
    println!(
        "cached verify right after commit: {:.2} ms ({} files hashed, {} bytes; {} from cache)",
        ms(first.elapsed()),
        r.files_hashed,
        r.bytes_hashed,
        r.files_cached
    );
    // Let the diffs' stamps settle and get recorded.
    std::thread::sleep(Duration::from_millis(100));
    verify_chain_cached(&chain)?;

    let (full, fr) = measure(runs, || {}, || verify_chain(&chain).expect("full verify"));
    let (hot, hr) = measure(
        runs,
        || {},
        || verify_chain_cached(&chain).expect("cached verify"),
    );
    // Every stamp changed (chmod moves ctime, even to the same mode): the
    // cached path hashes all files, in parallel.
    let (cold, cr) = measure(
        runs,
        || {
            use std::os::unix::fs::PermissionsExt;
            for l in chain.layers() {
                for p in [l.manifest_path(), l.memory_path(), l.state_path()] {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))
                        .expect("chmod");
                }
            }
        },
        || verify_chain_cached(&chain).expect("cached verify"),
    );
    let line = |what: &str, (med, min, max): (f64, f64, f64), r: &VerifyReport| {
        println!(
            "{what:<34} median {med:9.3} ms  min {min:9.3}  max {max:9.3}  hashed {:>3} files {:>11} B  cached {:>3} files {:>11} B",
            r.files_hashed, r.bytes_hashed, r.files_cached, r.bytes_cached
        );
    };
    println!("chain: {} ({} runs each)", chain.describe(), runs);
    line("verify_chain (full)", full, &fr);
    line("verify_chain_cached (warm)", hot, &hr);
    line("verify_chain_cached (all changed)", cold, &cr);
    println!(
        "{}",
        serde_json::json!({
            "ram_mib": mib,
            "runs": runs,
            "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "full_ms": {"median": full.0, "min": full.1, "max": full.2, "bytes_hashed": fr.bytes_hashed},
            "cached_warm_ms": {"median": hot.0, "min": hot.1, "max": hot.2, "bytes_hashed": hr.bytes_hashed},
            "cached_all_changed_ms": {"median": cold.0, "min": cold.1, "max": cold.2, "bytes_hashed": cr.bytes_hashed},
        })
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
