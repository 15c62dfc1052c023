//! Does a unicorn engine survive `fork()`, and does the child keep the code
//! its parent translated? The premise of children forked from a warm parent
//! (book: Benchmarks, "Branch"). A measurement, not a test.
//!
//! ```sh
//! cargo run --release --no-default-features --features emu --example unicorn_fork -- \
//!     [RAM_MIB] [BLOCKS] [CHILDREN] [anon|file]
//! ```
//!
//! The parent maps `RAM_MIB` MiB (default 512) as guest RAM through
//! `uc_mem_map_ptr`, as the `emu` backend does: `anon`, anonymous private
//! memory with every 4 KiB page written (a fresh boot's RAM, populated;
//! `fork` copies the page tables of what is populated), or `file`, a
//! private mapping of a file with every page read and only the chain's
//! pages written (a restored layer's RAM: its pages are the page cache's
//! until written). Guest code is a
//! chain of `BLOCKS` distinct translated blocks (default 20000; four
//! instructions each, the last a branch to the next), run with unicorn's
//! virtual TLB (a fill hook mapping VA = PA, as the backend's walker does).
//! The parent runs the chain twice (the first pass translates it, the second
//! runs translated code), then forks `CHILDREN` children (default 4), one
//! after the other. Each child runs the chain once on the thread that forked
//! (the only thread a child of `fork` has) and once on a thread it starts,
//! checks X0 after each pass, and reports its pass times, its unique memory
//! (`Private_Clean + Private_Dirty` of `/proc/self/smaps_rollup`) and the
//! private bytes of the translation buffer (unicorn's one read-write-execute
//! mapping). Prints one line per figure.

use std::ffi::c_void;
use std::time::{Duration, Instant};
use unicorn_engine::{
    uc_emu_start, uc_engine, uc_error, uc_hook, uc_hook_add, uc_reg_read, uc_reg_write, Arch,
    HookType, Mode, Prot, RegisterARM64, TlbEntry, TlbType, Unicorn,
};

/// Guest physical (and virtual) address of RAM and of the chain.
const BASE: u64 = 0x4000_0000;
/// Bytes of one block: `add x0, x0, #1; eor x1, x1, x0; ror x1, x1, #3; b .+4`.
const BLOCK_BYTES: u64 = 16;
const BLOCK: [u32; 4] = [0x9100_0400, 0xca00_0021, 0x93c1_0c21, 0x1400_0001];

/// A virtual-TLB fill mapping VA = PA, everything allowed.
unsafe extern "C" fn tlb_hook(
    _uc: *mut uc_engine,
    va: u64,
    _ty: u32,
    out: *mut TlbEntry,
    _ud: *mut c_void,
) -> bool {
    // SAFETY: unicorn passes a valid entry to fill in.
    unsafe {
        out.write(TlbEntry {
            paddr: va,
            perms: Prot::ALL,
        })
    };
    true
}

/// One pass over the chain of `blocks` on engine `uc` from this thread:
/// its time, and whether X0 counted every block.
fn pass(uc: usize, blocks: u64) -> (Duration, bool) {
    let uc = uc as *mut uc_engine;
    let zero = 0u64;
    // SAFETY: `uc` is a live engine used by one thread at a time (the
    // caller's); X0 is 8 bytes.
    let e = unsafe { uc_reg_write(uc, RegisterARM64::X0 as i32, (&raw const zero).cast()) };
    assert_eq!(e, uc_error::OK, "write X0");
    let t = Instant::now();
    // SAFETY: as above; the chain ends at BASE + blocks * BLOCK_BYTES.
    let e = unsafe { uc_emu_start(uc, BASE, BASE + blocks * BLOCK_BYTES, 0, 0) };
    let took = t.elapsed();
    assert_eq!(e, uc_error::OK, "uc_emu_start");
    let mut x0 = 0u64;
    // SAFETY: as above.
    let e = unsafe { uc_reg_read(uc, RegisterARM64::X0 as i32, (&raw mut x0).cast()) };
    assert_eq!(e, uc_error::OK, "read X0");
    (took, x0 == blocks)
}

/// `Private_Clean + Private_Dirty` of this process, and the private bytes of
/// its read-write-execute mappings (unicorn's translation buffer), in KiB.
fn private_kib() -> (u64, u64) {
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let uss = rollup
        .lines()
        .filter_map(|l| field(l, "Private_Clean:").or_else(|| field(l, "Private_Dirty:")))
        .sum();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut in_rwx = false;
    let mut rwx = 0;
    for l in smaps.lines() {
        let mut words = l.split_whitespace();
        if let (Some(range), Some(perms)) = (words.next(), words.next()) {
            if range.contains('-') && perms.len() == 4 {
                in_rwx = perms == "rwxp";
                continue;
            }
        }
        if in_rwx {
            rwx += field(l, "Private_Clean:")
                .or_else(|| field(l, "Private_Dirty:"))
                .unwrap_or(0);
        }
    }
    (uss, rwx)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let arg = |i: usize, default: u64| -> u64 {
        std::env::args()
            .nth(i)
            .map(|s| {
                s.parse()
                    .expect("usage: unicorn_fork [RAM_MIB] [BLOCKS] [CHILDREN]")
            })
            .unwrap_or(default)
    };
    let (ram_mib, blocks, children) = (arg(1, 512), arg(2, 20_000), arg(3, 4));
    let kind = std::env::args().nth(4).unwrap_or_else(|| "anon".into());
    let ram_bytes = ram_mib << 20;
    assert!(
        blocks * BLOCK_BYTES < ram_bytes,
        "the chain must fit in RAM"
    );

    let mut ram = match kind.as_str() {
        "anon" | "huge" => {
            let mut ram = memmap2::MmapOptions::new()
                .len(ram_bytes as usize)
                .map_anon()
                .expect("mmap guest RAM");
            if kind == "huge" {
                ram.advise(memmap2::Advice::HugePage)
                    .expect("madvise(MADV_HUGEPAGE)");
            }
            for page in ram.chunks_mut(4096) {
                page[0] = 1;
            }
            ram
        }
        "file" => {
            let file = tempfile::tempfile().expect("a temporary file");
            let page = [1u8; 4096];
            let mut w = std::io::BufWriter::new(&file);
            for _ in 0..ram_bytes / 4096 {
                std::io::Write::write_all(&mut w, &page).expect("write the file");
            }
            drop(w);
            // SAFETY: a private mapping of a file only this process has.
            let ram = unsafe { memmap2::MmapOptions::new().map_copy(&file) }.expect("mmap");
            let sum: u64 = ram.chunks(4096).map(|p| u64::from(p[0])).sum();
            assert_eq!(sum, ram_bytes / 4096);
            ram
        }
        other => panic!("RAM kind {other:?}: anon or file"),
    };
    for (i, word) in (0..blocks).flat_map(|_| BLOCK).enumerate() {
        ram[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
    }

    let mut emu = Unicorn::new(Arch::ARM64, Mode::ARM).expect("uc_open");
    emu.ctl_set_page_size(4096).expect("page size");
    emu.ctl_set_tlb_type(TlbType::VIRTUAL).expect("tlb type");
    // SAFETY: `ram` outlives the engine (both live until the process ends).
    unsafe {
        emu.mem_map_ptr(BASE, ram_bytes, Prot::ALL, ram.as_mut_ptr().cast())
            .expect("uc_mem_map_ptr");
    }
    let uc = emu.get_handle();
    let mut hook: uc_hook = 0;
    // SAFETY: `tlb_hook` has the TLB fill signature; no user data.
    let e = unsafe {
        uc_hook_add(
            uc,
            &mut hook,
            HookType::TLB_FILL.0 as i32,
            tlb_hook as *mut c_void,
            std::ptr::null_mut(),
            1,
            0,
        )
    };
    assert_eq!(e, uc_error::OK, "uc_hook_add");

    let (cold, ok_cold) = pass(uc as usize, blocks);
    let (warm, ok_warm) = pass(uc as usize, blocks);
    assert!(ok_cold && ok_warm, "the parent's passes counted wrong");
    let (uss, rwx) = private_kib();
    println!("RAM {ram_mib} MiB ({kind}) populated; {blocks} blocks of 4 instructions");
    println!(
        "parent: first pass {:.1} ms (translates), second {:.2} ms; USS {:.1} MiB, translation buffer {:.1} MiB",
        ms(cold),
        ms(warm),
        uss as f64 / 1024.0,
        rwx as f64 / 1024.0
    );

    for c in 1..=children {
        let t = Instant::now();
        // SAFETY: the child runs only this thread's engine and memory, the
        // standard library's allocator (fork-safe in glibc) and new threads;
        // it ends with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let started = t.elapsed();
            let (here, ok_here) = pass(uc as usize, blocks);
            let handle = uc as usize;
            let (there, ok_there) = std::thread::spawn(move || pass(handle, blocks))
                .join()
                .expect("the pass thread");
            let (uss, rwx) = private_kib();
            println!(
                "child {c}: running {:.2} ms after fork; pass on the forking thread {:.2} ms (X0 {}), on a new thread {:.2} ms (X0 {}); USS {:.1} MiB, translation buffer {:.2} MiB private",
                ms(started),
                ms(here),
                if ok_here { "ok" } else { "WRONG" },
                ms(there),
                if ok_there { "ok" } else { "WRONG" },
                uss as f64 / 1024.0,
                rwx as f64 / 1024.0,
            );
            use std::io::Write;
            let _ = std::io::stdout().flush();
            // SAFETY: ends the child without running the parent's
            // destructors a second time.
            unsafe { libc::_exit(i32::from(!(ok_here && ok_there))) };
        }
        let forked = t.elapsed();
        let mut status = 0;
        // SAFETY: `pid` is this process's child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        println!(
            "fork {c}: {:.2} ms in the parent; child exited with {}",
            ms(forked),
            libc::WEXITSTATUS(status)
        );
    }
    drop(emu);
}
