//! The raw `extern "C"` callbacks registered with unicorn, and their
//! registration (quirk 15: the crate's closure wrappers cost about 10 %, and
//! its sys-hook wrapper returns the wrong type, quirk 6). Each shim recovers
//! the vCPU's [`HookState`] and calls its handler in [`super::faults`],
//! [`super::sysregs`] or [`super::vcpu`]; only the block hook, which runs for
//! every block, tests the attention word inline (and, with several vCPUs,
//! counts down to the next spin-detector sample).
//!
//! Every callback gets `user_data` pointing at the vCPU's [`HookState`]
//! (or at an [`MmioCtx`] inside it). The state is heap-allocated by
//! [`super::EmuVcpu`], never moved, and freed only after the engine is closed,
//! so the pointer is valid whenever unicorn can call a hook. Hooks only run
//! on the vCPU's thread, inside `emu_start` (or inside `uc_ctl` calls the vCPU
//! itself makes), and never re-enter each other, so creating a `&mut` from
//! the pointer does not alias another live reference.

use super::attn::{ATTN_REQUESTS, ATTN_STEP, ATTN_WATCH, ATTN_WATCH_BYPASS};
use super::shared::fast_mmio;
use super::state::{HookState, MmioCtx};
use super::sysregs::{traps, TRAP_MRS, TRAP_MSR};
use super::uc::uc_err;
use crate::arch::layout::RAM_BASE;
use crate::arch::sysreg::SysReg;
use crate::hv::Result;
use std::ffi::{c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use unicorn_engine::{
    uc_engine, uc_error, uc_hook, uc_hook_add, uc_mmio_map, Arm64Insn, HookType,
    RegisterARM64 as R, RegisterARM64CP, TlbEntry,
};

/// Index of the Rt register from unicorn's register id (31 = XZR).
fn rt_index(reg: u32) -> u8 {
    let x0 = R::X0 as u32;
    match reg {
        r if (x0..=x0 + 28).contains(&r) => (r - x0) as u8,
        r if r == R::X29 as u32 => 29,
        r if r == R::X30 as u32 => 30,
        _ => 31,
    }
}

/// Runs `f` on the state behind `ud`, catching panics: a panic is stored for
/// `run` to resume and the engine is stopped; `default` is returned.
///
/// # Safety
/// `ud` must be the `HookState` pointer registered with this engine.
unsafe fn with_state<T>(ud: *mut c_void, default: T, f: impl FnOnce(&mut HookState) -> T) -> T {
    // SAFETY: per the module docs the pointer is valid and unaliased while
    // a hook runs.
    let st = unsafe { &mut *ud.cast::<HookState>() };
    match catch_unwind(AssertUnwindSafe(|| f(&mut *st))) {
        Ok(v) => v,
        Err(p) => {
            st.panic = Some(p);
            st.uc.stop();
            default
        }
    }
}

/// Block hook: the only place the engine is stopped for kicks, internal
/// requests and WFE spinning, before the block's first instruction (quirk
/// 9). It runs before every translated block, so its fast path is one test
/// of the attention word (requests and per-block work, see
/// [`super::attn`]); everything else is out of line.
unsafe extern "C" fn block_hook(_uc: *mut uc_engine, address: u64, _size: u32, ud: *mut c_void) {
    // SAFETY: `ud` is this engine's HookState (module docs).
    let st = unsafe { &mut *ud.cast::<HookState>() };
    if st.me.word() != 0 {
        // SAFETY: as above.
        unsafe { block_attention(ud, address) };
    }
}

/// The block hook of a VM with several vCPUs, which also feeds the WFE/YIELD
/// spin detector ([`super::spin`]).
unsafe extern "C" fn block_hook_spin(
    _uc: *mut uc_engine,
    address: u64,
    size: u32,
    ud: *mut c_void,
) {
    // SAFETY: `ud` is this engine's HookState (module docs).
    let st = unsafe { &mut *ud.cast::<HookState>() };
    if st.me.word() != 0 {
        // SAFETY: as above.
        unsafe { block_attention(ud, address) };
    } else if st.spin.on_block(address, size) {
        // SAFETY: as above.
        unsafe { check_spin(ud) }
    }
}

// The block hook runs for every block: keep its rare paths out of line.

/// The attention word is non-zero: stop for a request, or do the per-block
/// work (a due Software Step exception, quirk 17; re-protecting a watched
/// page, quirk 16).
///
/// # Safety
/// `ud` must be this engine's HookState.
#[cold]
#[inline(never)]
unsafe fn block_attention(ud: *mut c_void, address: u64) {
    // SAFETY: per the function contract (module docs).
    let st = unsafe { &mut *ud.cast::<HookState>() };
    let word = st.me.word();
    if word & ATTN_REQUESTS != 0 {
        stop_for_attention(st);
    // SAFETY: as above.
    } else if word & ATTN_STEP != 0 && unsafe { check_step(ud, address) } {
        // A Software Step exception was due before this block: taken.
    } else if word & ATTN_WATCH_BYPASS != 0 {
        end_watch_bypass(st);
    }
}

fn stop_for_attention(st: &mut HookState) {
    st.stopped_by_hook = true;
    st.uc.stop();
}

/// A watched page was let through for one access: the block that made it
/// runs, the next one stops so that the page is protected again.
fn end_watch_bypass(st: &mut HookState) {
    if let Some((page, blocks)) = st.watch_bypass {
        if blocks == 0 {
            st.watch_bypass = Some((page, 1));
        } else {
            st.me.request(ATTN_WATCH);
            stop_for_attention(st);
        }
    }
}

/// # Safety
/// `ud` must be this engine's HookState.
#[cold]
#[inline(never)]
unsafe fn check_spin(ud: *mut c_void) {
    // SAFETY: per the function contract.
    unsafe { with_state(ud, (), HookState::check_spin) }
}

/// While software step is enabled: takes a Software Step exception that is
/// due before this block (quirk 17). Returns whether it did.
///
/// # Safety
/// `ud` must be this engine's HookState.
#[cold]
#[inline(never)]
unsafe fn check_step(ud: *mut c_void, address: u64) -> bool {
    // SAFETY: per the function contract.
    unsafe { with_state(ud, false, |st| st.step_at_block(address)) }
}

/// Interrupt hook: synchronous exceptions unicorn diverts (quirks 1, 2, 14).
unsafe extern "C" fn intr_hook(_uc: *mut uc_engine, intno: u32, ud: *mut c_void) {
    // SAFETY: `ud` is this engine's HookState.
    unsafe { with_state(ud, (), |st| st.on_interrupt(intno)) }
}

/// TLB fill hook: the VMM's stage-1 walk, dirty tracking and device routing
/// (quirks 1, 3, 10).
unsafe extern "C" fn tlb_hook(
    _uc: *mut uc_engine,
    va: u64,
    ty: u32,
    out: *mut TlbEntry,
    ud: *mut c_void,
) -> bool {
    // SAFETY: `ud` is this engine's HookState.
    let e = unsafe { with_state(ud, None, |st| st.on_tlb_fill(va, ty)) };
    match e {
        Some(e) => {
            // SAFETY: unicorn passes a valid entry to fill in.
            unsafe { out.write(e) };
            true
        }
        None => false,
    }
}

/// Unmapped-fetch hook, registered only for its side effect (see
/// [`register`]); reports "not handled".
unsafe extern "C" fn unmapped_fetch_hook(
    _uc: *mut uc_engine,
    _ty: u32,
    _address: u64,
    _size: i32,
    _value: i64,
    _ud: *mut c_void,
) -> bool {
    false
}

/// MRS hook. Returns non-zero to skip unicorn's own handling (quirk 6).
unsafe extern "C" fn mrs_hook(
    _uc: *mut uc_engine,
    reg: u32,
    cp: *const RegisterARM64CP,
    ud: *mut c_void,
) -> u32 {
    // SAFETY: unicorn passes a valid descriptor of the accessed register.
    let cp = unsafe { &*cp };
    let key = SysReg::new(
        cp.op0 as u8,
        cp.op1 as u8,
        cp.crn as u8,
        cp.crm as u8,
        cp.op2 as u8,
    );
    if traps(key) & TRAP_MRS == 0 {
        return 0; // fast path: the hook runs for every MRS
    }
    // SAFETY: `ud` is this engine's HookState.
    unsafe { with_state(ud, 0, |st| st.on_mrs(key, rt_index(reg))) }
}

/// MSR and SYS hook.
unsafe extern "C" fn msr_hook(
    _uc: *mut uc_engine,
    reg: u32,
    cp: *const RegisterARM64CP,
    ud: *mut c_void,
) -> u32 {
    // SAFETY: unicorn passes a valid descriptor of the accessed register.
    let cp = unsafe { &*cp };
    let (op0, op1, crn, crm, op2) = (
        cp.op0 as u8,
        cp.op1 as u8,
        cp.crn as u8,
        cp.crm as u8,
        cp.op2 as u8,
    );
    let value = cp.val;
    if op0 == 1 {
        if crn != 7 && crn != 8 {
            return 0;
        }
        // SAFETY: `ud` is this engine's HookState.
        return unsafe { with_state(ud, 0, |st| st.on_sys(op1, crn, crm, op2, value)) };
    }
    let key = SysReg::new(op0, op1, crn, crm, op2);
    if traps(key) & TRAP_MSR == 0 {
        return 0;
    }
    // SAFETY: `ud` is this engine's HookState.
    unsafe { with_state(ud, 0, |st| st.on_msr(key, rt_index(reg), value)) }
}

/// MMIO read callback of a fast-path device region.
unsafe extern "C" fn mmio_read_cb(
    _uc: *mut uc_engine,
    offset: u64,
    size: c_uint,
    ud: *mut c_void,
) -> u64 {
    // SAFETY: `ud` is an MmioCtx inside this engine's HookState; it is
    // read before the state is borrowed mutably.
    let (state, base) = unsafe {
        let c = &*ud.cast::<MmioCtx>();
        (c.state, c.base)
    };
    // SAFETY: `state` is this engine's HookState.
    unsafe {
        with_state(state.cast(), 0, |st| {
            st.on_mmio_read(base + offset, size as usize)
        })
    }
}

/// MMIO write callback of a fast-path device region.
unsafe extern "C" fn mmio_write_cb(
    _uc: *mut uc_engine,
    offset: u64,
    size: c_uint,
    value: u64,
    ud: *mut c_void,
) {
    // SAFETY: as in `mmio_read_cb`.
    let (state, base) = unsafe {
        let c = &*ud.cast::<MmioCtx>();
        (c.state, c.base)
    };
    // SAFETY: `state` is this engine's HookState.
    unsafe {
        with_state(state.cast(), (), |st| {
            st.on_mmio_write(base + offset, size as usize, value)
        })
    }
}

/// Registers a raw hook.
///
/// # Safety
/// `cb` must have the C signature unicorn uses for `ty`, and `ud` must stay
/// valid until the engine is closed.
unsafe fn add_hook(
    handle: *mut unicorn_engine::uc_engine,
    ty: HookType,
    cb: *mut c_void,
    ud: *mut c_void,
    (begin, end): (u64, u64),
    insn: Option<Arm64Insn>,
) -> Result<()> {
    let mut hh: uc_hook = 0;
    // SAFETY: per the function contract; INSN hooks take the instruction id
    // as the variadic argument.
    let e = unsafe {
        match insn {
            Some(i) => uc_hook_add(handle, &mut hh, ty.0 as i32, cb, ud, begin, end, i as i32),
            None => uc_hook_add(handle, &mut hh, ty.0 as i32, cb, ud, begin, end),
        }
    };
    std::result::Result::<(), uc_error>::from(e).map_err(uc_err("uc_hook_add"))
}

/// Maps the fast-path device regions to the MMIO callbacks and registers
/// every hook of a vCPU's engine (all raw, quirk 15). `ram_size` is the size
/// of RAM mapped at [`RAM_BASE`].
///
/// # Safety
/// `handle` must be a live engine and `state` its [`HookState`], valid and
/// unmoved until the engine is closed; no hook may run yet, so this is the
/// only reference to the state.
pub(super) unsafe fn register(
    handle: *mut uc_engine,
    state: *mut HookState,
    ram_size: u64,
) -> Result<()> {
    let ud = state.cast::<c_void>();
    // Fast-path device regions. The contexts live in the hook state,
    // whose vector is filled once here and never reallocated.
    let (ctxs, spin) = {
        // SAFETY: per the function contract, this is the only reference.
        let st = unsafe { &mut *state };
        st.mmio_ctx = fast_mmio()
            .map(|r| MmioCtx {
                state,
                base: r.base,
            })
            .collect();
        (st.mmio_ctx.as_mut_ptr(), st.spin_enabled)
    };
    for (i, r) in fast_mmio().enumerate() {
        // SAFETY: `i` is in bounds of the vector, which stays allocated
        // (and unmoved) until the engine is closed in `Drop`.
        let ctx = unsafe { ctxs.add(i) };
        // SAFETY: the callbacks match unicorn's MMIO callback types and
        // `ctx` outlives the engine.
        let e = unsafe {
            uc_mmio_map(
                handle,
                r.base,
                r.size,
                Some(mmio_read_cb),
                ctx.cast(),
                Some(mmio_write_cb),
                ctx.cast(),
            )
        };
        std::result::Result::<(), uc_error>::from(e).map_err(uc_err("uc_mmio_map"))?;
    }
    // Hooks, all raw (quirk 15). A range with begin > end covers every
    // address.
    let all = (1u64, 0u64);
    // SAFETY: each callback has the C signature unicorn expects for its
    // hook type, and `ud` outlives the engine.
    unsafe {
        // The only block hook: with one, unicorn calls it directly from the
        // translated code instead of through its hook list.
        let block = if spin {
            block_hook_spin as *mut c_void
        } else {
            block_hook as *mut c_void
        };
        add_hook(handle, HookType::BLOCK, block, ud, all, None)?;
        add_hook(
            handle,
            HookType::INTR,
            intr_hook as *mut c_void,
            ud,
            all,
            None,
        )?;
        // Never fires (the TLB hook sends every unbacked access to the
        // guest), but its presence over an address makes unicorn skip,
        // for blocks translated at that virtual address, a walk of the
        // whole TLB that re-arms its own self-modifying-code detection
        // (about a fifth of boot time). Coherence comes from the guest's
        // IC maintenance instead (quirk 11). The ranges leave out RAM's
        // physical window, where unicorn also consults memory hooks and
        // any hook would slow every store (quirk 10).
        let ram_end = RAM_BASE + ram_size;
        for range in [(0, RAM_BASE - 1), (ram_end, u64::MAX)] {
            add_hook(
                handle,
                HookType::MEM_FETCH_UNMAPPED,
                unmapped_fetch_hook as *mut c_void,
                ud,
                range,
                None,
            )?;
        }
        add_hook(
            handle,
            HookType::TLB_FILL,
            tlb_hook as *mut c_void,
            ud,
            all,
            None,
        )?;
        // MSR and SYS share one handler.
        for (hook, insn) in [
            (mrs_hook as *mut c_void, Arm64Insn::UC_ARM64_INS_MRS),
            (msr_hook as *mut c_void, Arm64Insn::UC_ARM64_INS_MSR),
            (msr_hook as *mut c_void, Arm64Insn::UC_ARM64_INS_SYS),
        ] {
            add_hook(handle, HookType::INSN, hook, ud, all, Some(insn))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rt_register_ids() {
        assert_eq!(rt_index(R::X0 as u32), 0);
        assert_eq!(rt_index(R::X28 as u32), 28);
        assert_eq!(rt_index(R::X29 as u32), 29);
        assert_eq!(rt_index(R::X30 as u32), 30);
        assert_eq!(rt_index(R::XZR as u32), 31);
    }
}
