//! The unicorn floor: how fast stock unicorn runs a fixed aarch64 loop with
//! no VMM code in the loop, and with only the `emu` backend's kind of block
//! hook, beside the same loop under
//! `qemu-system-aarch64` (which `python3 -m ignition.bench.cpu --floor`
//! runs from the image this writes). A measurement, not a test.
//!
//! ```sh
//! cargo run --release --example unicorn_floor -- ITERATIONS MODE
//! cargo run --release --example unicorn_floor -- ITERATIONS image PATH
//! ```
//!
//! MODE is `vtlb` (unicorn's virtual TLB with a fill hook mapping VA = PA,
//! as the backend's TLB is: the hook does not run once the TLB is warm, so
//! nothing of the VMM's runs in the loop), `block-vtlb` (that and one raw
//! block hook that tests a word, as the backend's does), or `bare` and
//! `block` (the same without a virtual TLB: the MMU is off, so QEMU maps the
//! buffer executable and unicorn checks every store to it for
//! self-modifying code; not what a guest with its MMU on sees). Prints the
//! nanoseconds per inner iteration (8 instructions: a load, a store and
//! arithmetic, one translated block). `image PATH` writes the loop as a raw
//! image for QEMU's `-device loader` at [`BASE`], ending in a semihosting
//! exit.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;
use unicorn_engine::{
    uc_engine, uc_hook, uc_hook_add, Arch, HookType, Mode, Prot, TlbEntry, TlbType, Unicorn,
};

/// Where the image is loaded (QEMU virt RAM, above the DTB it places at
/// the start of RAM).
const BASE: u64 = 0x4020_0000;
/// Inner iterations per outer iteration (1 KiB buffer, 8 bytes a step).
const INNER: u64 = 128;

/// The loop, assembled: X0 = outer count (patched into the first two
/// words), X1 = a 1 KiB buffer at BASE + 0x1000; each inner iteration
/// loads, mixes and stores one word; then a semihosting SYS_EXIT.
const CODE: [u32; 28] = [
    0xd2a0_0000, // movz x0, #hi, lsl #16
    0xf280_0000, // movk x0, #lo
    0x1000_7fc1, // adr x1, buf
    0xd282_4684, // mov x4, #0x1234
    0xd280_0002, // outer: mov x2, #0
    0xf862_6823, // inner: ldr x3, [x1, x2]
    0xca03_0084, // eor x4, x4, x3
    0x93c4_1c84, // ror x4, x4, #7
    0x8b04_0063, // add x3, x3, x4
    0xf822_6823, // str x3, [x1, x2]
    0x9100_2042, // add x2, x2, #8
    0xf110_005f, // cmp x2, #1024
    0x54ff_ff21, // b.ne inner
    0xf100_0400, // subs x0, x0, #1
    0x54ff_fec1, // b.ne outer
    0xd280_0300, // done: mov x0, #0x18 (SYS_EXIT)
    0xd2a0_0041, // movz x1, #2, lsl #16
    0xf280_04c1, // movk x1, #0x26 (ADP_Stopped_ApplicationExit)
    0x1000_00c2, // adr x2, block
    0xf900_0041, // str x1, [x2]
    0xaa02_03e1, // mov x1, x2
    0xd45e_0000, // hlt #0xf000
    0x17ff_fff9, // b done
    0xd503_201f, // nop (align)
    0,
    0,
    0,
    0, // block: the SYS_EXIT parameter block
];
/// Byte offset of `done` (where unicorn stops).
const DONE: u64 = 15 * 4;

fn image(outer: u64) -> Vec<u8> {
    let mut code = CODE;
    code[0] |= (((outer >> 16) & 0xffff) as u32) << 5;
    code[1] |= ((outer & 0xffff) as u32) << 5;
    let mut v: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
    v.resize(0x2000, 0);
    v
}

/// The backend's kind of block hook: one relaxed load and a test.
unsafe extern "C" fn block_hook(_uc: *mut uc_engine, _addr: u64, _size: u32, ud: *mut c_void) {
    // SAFETY: `ud` is the `AtomicU32` registered with the hook, alive for
    // the whole run.
    let w = unsafe { &*ud.cast::<AtomicU32>() };
    if w.load(Ordering::Relaxed) != 0 {
        std::hint::black_box(());
    }
}

/// The permissions of the page at `addr`: code is read-only and
/// executable, the buffer read-write and not executable (unicorn checks
/// every store to an executable page for self-modifying code).
fn perms(addr: u64) -> Prot {
    if addr < BASE + 0x1000 {
        Prot(Prot::READ.0 | Prot::EXEC.0)
    } else {
        Prot(Prot::READ.0 | Prot::WRITE.0)
    }
}

/// A virtual-TLB fill that maps VA = PA with the page's permissions.
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
            perms: perms(va),
        })
    };
    true
}

fn add_hook(uc: *mut uc_engine, ty: HookType, cb: *mut c_void, ud: *mut c_void) {
    let mut h: uc_hook = 0;
    // SAFETY: `cb` has the C signature of `ty`, `ud` outlives the engine.
    let e = unsafe { uc_hook_add(uc, &mut h, ty.0 as i32, cb, ud, 1, 0) };
    assert_eq!(e, unicorn_engine::uc_error::OK, "uc_hook_add");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: unicorn_floor ITERATIONS (bare|block|vtlb|block-vtlb|image PATH)";
    let outer: u64 = args.get(1).and_then(|s| s.parse().ok()).expect(usage);
    assert!(outer > 0 && outer < 1 << 32, "ITERATIONS: 1 to 2^32 - 1");
    let mode = args.get(2).map(String::as_str).expect(usage);
    if mode == "image" {
        let path = args.get(3).expect(usage);
        std::fs::write(path, image(outer)).expect("write the image");
        return;
    }
    let word = Box::new(AtomicU32::new(0));
    let mut emu = Unicorn::new(Arch::ARM64, Mode::ARM).expect("uc_open");
    emu.ctl_set_page_size(4096).expect("page size");
    let vtlb = mode.ends_with("vtlb");
    if vtlb {
        emu.ctl_set_tlb_type(TlbType::VIRTUAL).expect("tlb type");
    }
    let img = image(outer);
    emu.mem_map(BASE, img.len() as u64, Prot::ALL)
        .expect("mem_map");
    emu.mem_write(BASE, &img).expect("mem_write");
    for page in [BASE, BASE + 0x1000] {
        emu.mem_protect(page, 0x1000, perms(page))
            .expect("mem_protect");
    }
    let handle = emu.get_handle();
    let ud = (&*word as *const AtomicU32).cast_mut().cast::<c_void>();
    if !matches!(mode, "bare" | "block" | "vtlb" | "block-vtlb") {
        panic!("{usage}");
    }
    if mode.starts_with("block") {
        add_hook(handle, HookType::BLOCK, block_hook as *mut c_void, ud);
    }
    if vtlb {
        add_hook(handle, HookType::TLB_FILL, tlb_hook as *mut c_void, ud);
    }
    let t = Instant::now();
    emu.emu_start(BASE, BASE + DONE, 0, 0).expect("emu_start");
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{mode}: {outer} x {INNER} iterations in {secs:.3} s: {:.2} ns per iteration",
        secs * 1e9 / (outer * INNER) as f64
    );
}
