//! Per-vCPU hook state and the raw `extern "C"` callbacks registered with
//! unicorn (quirk 15: the crate's closure wrappers cost about 10 %, and its
//! sys-hook wrapper returns the wrong type, quirk 6).
//!
//! Every callback gets `user_data` pointing at the vCPU's [`HookState`]
//! (or at an [`MmioCtx`] inside it). The state is heap-allocated by
//! [`super::EmuVcpu`], never moved, and freed only after the engine is closed,
//! so the pointer is valid whenever unicorn can call a hook. Hooks only run
//! on the vCPU's thread, inside `emu_start` (or inside `uc_ctl` calls the vCPU
//! itself makes), and never re-enter each other, so creating a `&mut` from
//! the pointer does not alias another live reference.

use super::insn::{self, Exc, Kind};
use super::mmu::{self, Access, Fault, Perms};
use super::timer::{self, VTimer};
use super::uc::Uc;
use super::{PaKind, VcpuShared, VmShared, ATTN_IRQ, ATTN_TB, ATTN_TLB};
use crate::arch::esr;
use crate::arch::exception::{exception_entry, CpuFeatures, GuestException, PSTATE_NRW};
use crate::arch::layout::PAGE_SIZE;
use crate::arch::sysreg::{self as sr, SysReg};
use crate::hv::{VcpuExit, VcpuId, VcpuIo};
use std::any::Any;
use std::ffi::{c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;
use unicorn_engine::{uc_engine, Prot, RegisterARM64 as R, RegisterARM64CP, TlbEntry};

/// HCR_EL2.RW: EL1 is AArch64.
pub(crate) const HCR_RW: u64 = 1 << 31;
/// HCR_EL2.IMO: route IRQs to EL2, which makes HCR_EL2.VI a virtual IRQ.
pub(crate) const HCR_IMO: u64 = 1 << 4;
/// HCR_EL2.VI: virtual IRQ pending (quirk 5).
pub(crate) const HCR_VI: u64 = 1 << 7;

/// Synthesised unicorn interrupt numbers (QEMU's `EXCP_*`).
mod excp {
    pub const UDEF: u32 = 1;
    pub const SWI: u32 = 2;
    pub const PREFETCH_ABORT: u32 = 3;
    pub const DATA_ABORT: u32 = 4;
    pub const BKPT: u32 = 7;
    pub const HVC: u32 = 11;
    pub const SMC: u32 = 13;
}

/// Unicorn's `uc_mem_type` values passed to the TLB hook.
const UC_MEM_WRITE: u32 = 17;
const UC_MEM_FETCH: u32 = 18;

/// Why the TLB hook refused a translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultCause {
    /// The guest's page tables fault.
    Walk(Fault),
    /// The physical address is backed by nothing (or is device memory
    /// fetched as code): synchronous external abort.
    External,
    /// A device region the backend emulates by decoding the instruction, at
    /// this (4 KiB-aligned) physical address.
    Mmio(u64),
}

/// A fault recorded by the TLB hook; unicorn then stops with the PC of the
/// faulting instruction (quirk 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingFault {
    /// The 4 KiB-aligned virtual address unicorn asked for (quirk 14).
    pub va: u64,
    /// Kind of access.
    pub access: Access,
    /// What went wrong.
    pub cause: FaultCause,
}

/// `user_data` of one MMIO region: the state and the region's base address.
pub(crate) struct MmioCtx {
    pub state: *mut HookState,
    pub base: u64,
}

/// Recently invalidated code pages of this engine (see [`HookState::ivau`]).
pub(crate) const IC_MEMO: usize = 4;

/// The per-vCPU state the hooks work on.
pub(crate) struct HookState {
    pub id: VcpuId,
    pub uc: Uc,
    pub vm: Arc<VmShared>,
    pub me: Arc<VcpuShared>,
    /// The run loop's I/O handler while `emu_start` runs, else `None`.
    pub io: Option<NonNull<dyn VcpuIo>>,
    /// Cached SCTLR/TCR/TTBR0/TTBR1; `None` after the guest writes one.
    pub walk: Option<mmu::Regs>,
    /// Cached CNTKCTL_EL1 (EL0 access to the counter and timer).
    pub cntkctl: u64,
    /// The EL1 virtual timer.
    pub vtimer: VTimer,
    /// Virtual count = physical count - this, in guest ticks.
    pub vtimer_offset: u64,
    /// The timer output last reported through `VcpuIo::vtimer_level`.
    pub reported_level: Option<bool>,
    /// The wake-up currently armed with the timer thread.
    pub armed: Option<Instant>,
    /// Current HCR_EL2 (VI reflects the IRQ line).
    pub hcr: u64,
    /// A fault the TLB hook refused, for `run` to handle.
    pub fault: Option<PendingFault>,
    /// An exit a hook decided on; `run` returns it after `emu_start`.
    pub exit: Option<VcpuExit>,
    /// The block hook stopped the engine for an attention request.
    pub stopped_by_hook: bool,
    /// Successful TLB fills since the last full flush (TLBI coalescing).
    pub fills: u64,
    /// 16 KiB pages whose code this engine invalidated and has not fetched
    /// from since (`u64::MAX` = empty slot).
    pub ic_memo: [u64; IC_MEMO],
    /// Translate VA = PA with all permissions (used for `remove_cache`).
    pub identity: bool,
    /// A panic caught in a hook, resumed by `run`.
    pub panic: Option<Box<dyn Any + Send>>,
    /// MPIDR_EL1 as the guest reads it.
    pub mpidr: u64,
    /// Emulated ID_AA64MMFR0_EL1 (TGran16 advertised, quirk 13).
    pub id_mmfr0: u64,
    /// Emulated ID_AA64PFR0_EL1 (GIC system registers advertised).
    pub id_pfr0: u64,
    /// PSTATE features of the emulated CPU, for exception entry.
    pub features: CpuFeatures,
    /// `user_data` of the fast-path MMIO regions (filled once, never moved).
    pub mmio_ctx: Vec<MmioCtx>,
    /// Detects a guest looping on WFE or YIELD.
    pub spin: super::spin::SpinDetector,
    /// Spin detection is on (only with more than one vCPU: with one, there
    /// is nobody to yield to).
    pub spin_enabled: bool,
}

/// Reads `[X0..X30, SP]` through the engine for the instruction decoder.
fn xreader(uc: Uc) -> impl Fn(u8) -> u64 {
    move |n| uc.x_or_sp(n)
}

/// The 4 KiB page of `va`, ignoring the top byte (TBI).
pub(crate) fn same_page(a: u64, b: u64) -> bool {
    (a ^ b) & 0x00ff_ffff_ffff_f000 == 0
}

impl HookState {
    /// The I/O handler of the current `run`.
    ///
    /// # Safety
    /// Only valid while `emu_start` runs: `run` sets `io` from a live
    /// `&mut dyn VcpuIo` just before and clears it right after.
    unsafe fn io<'a>(&self) -> Option<&'a mut dyn VcpuIo> {
        // SAFETY: per the function contract the pointer refers to the
        // handler `run` borrowed mutably for the whole of `emu_start`, and
        // hooks (the only callers) do not overlap.
        self.io.map(|mut p| unsafe { p.as_mut() })
    }

    /// Current exception level (0 or 1).
    pub fn el(&self) -> u8 {
        let pstate = self.uc.read(R::PSTATE).unwrap_or(0x5);
        (((pstate >> 2) & 3) as u8).min(1)
    }

    /// The translation registers, cached until the guest writes one.
    pub fn walk_regs(&mut self) -> mmu::Regs {
        if let Some(r) = self.walk {
            return r;
        }
        let uc = self.uc;
        let r = mmu::Regs {
            sctlr: uc.cp_read(sr::SCTLR_EL1).unwrap_or(0),
            tcr: uc.cp_read(sr::TCR_EL1).unwrap_or(0),
            ttbr0: uc.read(R::TTBR0_EL1).unwrap_or(0),
            ttbr1: uc.read(R::TTBR1_EL1).unwrap_or(0),
        };
        self.walk = Some(r);
        r
    }

    /// Translates `va` at the current EL without a permission check.
    pub fn translate(&mut self, va: u64) -> Result<mmu::Translation, Fault> {
        let regs = self.walk_regs();
        let el = self.el();
        mmu::translate(&regs, va, el, &*self.vm)
    }

    /// The instruction word at `va`, if it is mapped to RAM.
    pub fn read_insn(&mut self, va: u64) -> Option<u32> {
        let t = self.translate(va).ok()?;
        self.vm.ram_u32(t.pa)
    }

    /// The virtual count now.
    pub fn vcount(&self) -> u64 {
        self.vm.physical_count().wrapping_sub(self.vtimer_offset)
    }

    /// Re-evaluates the IRQ line and updates HCR_EL2.VI (quirk 5). When the
    /// line rises and `kick` is set, the block hook stops the engine so that
    /// unicorn's main loop notices the interrupt (unicorn's `cpu_interrupt`
    /// does not end the running chain of translated blocks).
    pub fn update_irq(&mut self, io: &mut dyn VcpuIo, kick: bool) {
        let line = io.irq_line(self.id);
        let vi = self.hcr & HCR_VI != 0;
        if line != vi {
            self.hcr ^= HCR_VI;
            if self.uc.cp_write(sr::HCR_EL2, self.hcr).is_err() {
                crate::warn_ratelimited!(vcpu = self.id, "emu: cannot update HCR_EL2.VI");
            }
            if line && kick {
                self.me.request(ATTN_IRQ);
            }
        }
    }

    /// Reports the virtual timer output if it changed (or `force`), and
    /// re-arms the wake-up at the next deadline (quirk 7).
    pub fn vtimer_update(&mut self, io: &mut dyn VcpuIo, force: bool, kick: bool) {
        let vcount = self.vcount();
        let level = self.vtimer.level(vcount);
        if force || self.reported_level != Some(level) {
            self.reported_level = Some(level);
            io.vtimer_level(self.id, level);
            self.update_irq(io, kick);
        }
        let at = self
            .vtimer
            .deadline(vcount, self.vtimer_offset)
            .and_then(|phys| self.vm.epoch.checked_add(timer::duration_of(phys)));
        if at != self.armed {
            self.armed = at;
            self.vm.timer.arm(self.id, at);
        }
    }

    /// Enters the guest's EL1 synchronous exception vector (quirks 1, 2, 4)
    /// as computed by [`exception_entry`]: ESR/FAR/ELR/SPSR, SP banking,
    /// PSTATE, PC. Returns `false` if the vCPU is in a state the backend
    /// cannot take an exception from (EL2/EL3, or AArch32, which it never
    /// runs).
    pub fn deliver_sync(&mut self, esr: u64, far: Option<u64>, elr: u64) -> bool {
        let uc = self.uc;
        let (Ok(pstate), Ok(vbar), Ok(sctlr)) = (
            uc.read(R::PSTATE),
            uc.read(R::VBAR_EL1),
            uc.cp_read(sr::SCTLR_EL1),
        ) else {
            return false;
        };
        if pstate & PSTATE_NRW != 0 {
            return false;
        }
        let exc = GuestException { esr, far };
        let Some(e) = exception_entry(exc, elr, pstate, vbar, sctlr, self.features) else {
            return false;
        };
        let mut ok = uc.write(R::ESR_EL1, e.esr_el1).is_ok();
        if let Some(far) = e.far_el1 {
            ok &= uc.write(R::FAR_EL1, far).is_ok();
        }
        ok &= uc.write(R::ELR_EL1, e.elr_el1).is_ok();
        if e.from_sp_el0 {
            let sp = uc.read(R::SP).unwrap_or(0);
            let sp1 = uc.read(R::SP_EL1).unwrap_or(0);
            ok &= uc.write(R::SP_EL0, sp).is_ok();
            ok &= uc.write(R::SP, sp1).is_ok();
        }
        ok &= uc.write(R::PSTATE, e.pstate).is_ok();
        ok &= uc.write(R::PC, e.pc).is_ok();
        // A CP_REG write rebuilds unicorn's cached flags for the new EL
        // (quirk 4); SPSR_EL1 has no plain register id anyway.
        ok &= uc.cp_write(sr::SPSR_EL1, e.spsr_el1).is_ok();
        ok
    }

    /// Records an exit for `run` and stops the engine.
    fn exit_with(&mut self, exit: VcpuExit) {
        self.exit = Some(exit);
        self.uc.stop();
    }

    /// Delivers a synchronous exception, or stops with `Unhandled` if the
    /// vCPU is in a state that cannot take it.
    fn deliver_or_stop(&mut self, esr: u64, far: Option<u64>, pc: u64) {
        if !self.deliver_sync(esr, far, pc) {
            self.exit_with(VcpuExit::Unhandled {
                esr,
                far: far.unwrap_or(0),
                ipa: 0,
                pc,
            });
        }
    }

    /// Precise fault address of the data access of the instruction at `pc`
    /// that faulted on the 4 KiB page `va_page`: the decoded effective
    /// address if it lies on that page, else the page itself (the first
    /// faulting byte of an access that crosses into it).
    pub fn data_far(&mut self, pc: u64, va_page: u64) -> (u64, Option<insn::LdSt>) {
        let d = self.read_insn(pc).and_then(insn::decode_ldst);
        if let Some(d) = d {
            let (addr, _) = d.address(xreader(self.uc), pc);
            if same_page(addr, va_page) {
                return (va_page | (addr & 0xfff), Some(d));
            }
        }
        (va_page, d)
    }

    // ----- interrupt hook -----------------------------------------------

    fn on_interrupt(&mut self, intno: u32) {
        let pc = self.uc.read(R::PC).unwrap_or(0);
        let same_el = self.el() == 1;
        match intno {
            excp::UDEF => self.deliver_or_stop(esr::unknown_esr(), None, pc),
            excp::SWI => {
                // PC is past the SVC.
                let imm = match self
                    .read_insn(pc.wrapping_sub(4))
                    .and_then(insn::decode_exc)
                {
                    Some(Exc::Svc(imm)) => imm,
                    _ => 0,
                };
                self.deliver_or_stop(esr::svc_esr(imm), None, pc);
            }
            excp::BKPT => {
                // PC is at the BRK.
                let imm = match self.read_insn(pc).and_then(insn::decode_exc) {
                    Some(Exc::Brk(imm)) => imm,
                    _ => 0,
                };
                self.deliver_or_stop(esr::brk_esr(imm), None, pc);
            }
            excp::HVC | excp::SMC => {
                // PC is past the HVC/SMC (quirk 2); return it to the run loop.
                let exit = match self
                    .read_insn(pc.wrapping_sub(4))
                    .and_then(insn::decode_exc)
                {
                    Some(Exc::Hvc(imm)) if intno == excp::HVC => VcpuExit::Hvc { imm },
                    Some(Exc::Smc(imm)) if intno == excp::SMC => VcpuExit::Smc { imm },
                    _ if intno == excp::HVC => VcpuExit::Hvc { imm: 0 },
                    _ => VcpuExit::Smc { imm: 0 },
                };
                self.exit_with(exit);
            }
            excp::DATA_ABORT => {
                // Raised by QEMU itself: alignment faults, without an address
                // (quirk 14), so decode it from the instruction.
                let d = self.read_insn(pc).and_then(insn::decode_ldst);
                let (far, write) = match d {
                    Some(d) => (d.address(xreader(self.uc), pc).0, d.kind == Kind::Store),
                    None => (0, false),
                };
                self.deliver_or_stop(
                    esr::data_abort_esr(same_el, write, esr::FSC_ALIGNMENT),
                    Some(far),
                    pc,
                );
            }
            excp::PREFETCH_ABORT => {
                let esr = if pc & 3 != 0 {
                    esr::pc_align_esr()
                } else {
                    esr::instr_abort_esr(same_el, esr::FSC_SYNC_EXTERNAL)
                };
                self.deliver_or_stop(esr, Some(pc), pc);
            }
            _ => self.exit_with(VcpuExit::Unhandled {
                esr: 0,
                far: 0,
                ipa: 0,
                pc,
            }),
        }
    }

    /// The guest has been cycling through a few blocks for a while: if one
    /// of them contains a WFE or YIELD, it is waiting for another vCPU, so
    /// return [`VcpuExit::Wfe`] and let the run loop switch (see
    /// [`super::spin`]).
    fn check_spin(&mut self) {
        let blocks: Vec<(u64, u32)> = self.spin.blocks().collect();
        let waits = blocks.iter().any(|&(addr, size)| {
            (0..u64::from(size) / 4).any(|i| {
                matches!(
                    self.read_insn(addr.wrapping_add(4 * i)),
                    Some(insn::WFE | insn::YIELD)
                )
            })
        });
        if waits {
            self.spin.reset();
            self.exit_with(VcpuExit::Wfe);
        }
    }

    // ----- TLB fill hook ------------------------------------------------

    fn on_tlb_fill(&mut self, va: u64, ty: u32) -> Option<TlbEntry> {
        if self.identity {
            return Some(TlbEntry {
                paddr: va,
                perms: Prot::ALL,
            });
        }
        let access = match ty {
            UC_MEM_WRITE => Access::Write,
            UC_MEM_FETCH => Access::Fetch,
            _ => Access::Read,
        };
        let regs = self.walk_regs();
        let el = self.el();
        let fault = |cause| PendingFault { va, access, cause };
        let t = match mmu::translate_access(&regs, va, el, access, &*self.vm) {
            Ok(t) => t,
            Err(f) => {
                self.fault = Some(fault(FaultCause::Walk(f)));
                return None;
            }
        };
        let pa = t.pa & !0xfff;
        let mut perms = t.perms;
        match self.vm.classify(pa) {
            PaKind::Ram(page) => {
                let page = page as usize;
                if perms.write && self.vm.wp.is_bit_set(page) {
                    if access == Access::Write {
                        // Dirty tracking: the first store to a protected page
                        // marks it and unprotects it; the store then completes.
                        self.vm.dirty.set_bit(page);
                        self.vm.wp.reset_bit(page);
                    } else {
                        perms.write = false;
                    }
                }
                if access == Access::Fetch {
                    let page16 = pa & !(PAGE_SIZE - 1);
                    for m in &mut self.ic_memo {
                        if *m == page16 {
                            *m = u64::MAX;
                        }
                    }
                }
            }
            PaKind::FastMmio if access != Access::Fetch => perms.exec = false,
            PaKind::TrappedMmio if access != Access::Fetch => {
                self.fault = Some(fault(FaultCause::Mmio(pa)));
                return None;
            }
            _ => {
                self.fault = Some(fault(FaultCause::External));
                return None;
            }
        }
        self.fills += 1;
        Some(TlbEntry {
            paddr: pa,
            perms: to_prot(perms),
        })
    }

    // ----- MMIO callbacks (fast path) -----------------------------------

    fn on_mmio_read(&mut self, gpa: u64, size: usize) -> u64 {
        // SAFETY: MMIO callbacks only run inside `emu_start`.
        let Some(io) = (unsafe { self.io() }) else {
            return 0;
        };
        let mut buf = [0u8; 8];
        let n = size.clamp(1, 8);
        let v = match io.mmio_read(self.id, gpa, &mut buf[..n]) {
            Ok(()) => u64::from_le_bytes(buf),
            Err(e) => {
                // Unicorn cannot stop precisely inside an MMIO callback
                // (quirk 9), so a device error reads as zero.
                crate::warn_ratelimited!(vcpu = self.id, error = %e, "emu: MMIO read fault, read as zero");
                0
            }
        };
        self.update_irq(io, true);
        v
    }

    fn on_mmio_write(&mut self, gpa: u64, size: usize, value: u64) {
        // SAFETY: MMIO callbacks only run inside `emu_start`.
        let Some(io) = (unsafe { self.io() }) else {
            return;
        };
        let n = size.clamp(1, 8);
        if let Err(e) = io.mmio_write(self.id, gpa, &value.to_le_bytes()[..n]) {
            crate::warn_ratelimited!(vcpu = self.id, error = %e, "emu: MMIO write fault, ignored");
        }
        self.update_irq(io, true);
    }

    // ----- system register hooks (quirk 6) -------------------------------

    /// EL0 access to the counter/timer per CNTKCTL_EL1 (Arm ARM D11.2.2).
    fn el0_timer_ok(&self, reg: SysReg) -> bool {
        let k = self.cntkctl;
        match reg {
            sr::CNTVCT_EL0 => k & (1 << 1) != 0,
            sr::CNTPCT_EL0 => k & 1 != 0,
            sr::CNTFRQ_EL0 => k & 3 != 0,
            _ => k & (1 << 8) != 0, // EL0VTEN for CNTV_*
        }
    }

    /// Returns 1 ("skip the instruction") if the access was emulated here.
    fn on_mrs(&mut self, key: SysReg, rt: u8) -> u32 {
        let value = match key {
            sr::CNTVCT_EL0
            | sr::CNTPCT_EL0
            | sr::CNTFRQ_EL0
            | sr::CNTV_CTL_EL0
            | sr::CNTV_CVAL_EL0
            | sr::CNTV_TVAL_EL0 => {
                if self.el() == 0 && !self.el0_timer_ok(key) {
                    return 0; // unicorn's own access check traps it
                }
                let vcount = self.vcount();
                match key {
                    sr::CNTVCT_EL0 => vcount,
                    sr::CNTPCT_EL0 => self.vm.physical_count(),
                    sr::CNTFRQ_EL0 => timer::COUNTER_HZ,
                    sr::CNTV_CTL_EL0 => self.vtimer.read_ctl(vcount),
                    sr::CNTV_CVAL_EL0 => self.vtimer.cval,
                    _ => self.vtimer.read_tval(vcount),
                }
            }
            sr::ID_AA64MMFR0_EL1 | sr::ID_AA64PFR0_EL1 => {
                if self.el() == 0 {
                    return 0; // UNDEFINED at EL0; Linux emulates it
                }
                if key == sr::ID_AA64MMFR0_EL1 {
                    self.id_mmfr0
                } else {
                    self.id_pfr0
                }
            }
            k if is_icc(k) => {
                // Unknown to unicorn: emulate, then step over it ourselves.
                if self.el() == 0 {
                    return 0;
                }
                // SAFETY: sys hooks only run inside `emu_start`.
                let Some(io) = (unsafe { self.io() }) else {
                    return 0;
                };
                let v = io.sysreg_read(self.id, k);
                self.update_irq(io, false);
                let Some(v) = v else {
                    return 0; // UNDEFINED, taken through the interrupt hook
                };
                return self.finish_unknown(rt, Some(v));
            }
            _ => return 0,
        };
        // Unicorn knows these registers: skipping leaves the rest of the
        // translated block running, so only Xt is written (no PC change).
        let _ = self.uc.set_x(rt, value);
        1
    }

    /// Completes an emulated access to a register unicorn does not know: its
    /// block ends right after the instruction, so PC must be advanced here.
    fn finish_unknown(&mut self, rt: u8, value: Option<u64>) -> u32 {
        if let Some(v) = value {
            let _ = self.uc.set_x(rt, v);
        }
        let pc = self.uc.read(R::PC).unwrap_or(0);
        let _ = self.uc.write(R::PC, pc.wrapping_add(4));
        1
    }

    fn on_msr(&mut self, key: SysReg, rt: u8, value: u64) -> u32 {
        match key {
            sr::CNTV_CTL_EL0 | sr::CNTV_CVAL_EL0 | sr::CNTV_TVAL_EL0 => {
                if self.el() == 0 && !self.el0_timer_ok(key) {
                    return 0;
                }
                let vcount = self.vcount();
                match key {
                    sr::CNTV_CTL_EL0 => self.vtimer.write_ctl(value),
                    sr::CNTV_CVAL_EL0 => self.vtimer.cval = value,
                    _ => self.vtimer.write_tval(vcount, value),
                }
                // SAFETY: sys hooks only run inside `emu_start`.
                if let Some(io) = unsafe { self.io() } {
                    // No kick needed: a system register write ends the
                    // block, so unicorn checks for interrupts right after.
                    self.vtimer_update(io, false, false);
                }
                1
            }
            sr::CNTKCTL_EL1 => {
                if self.el() == 1 {
                    self.cntkctl = value;
                }
                0
            }
            sr::SCTLR_EL1 | sr::TCR_EL1 | sr::TTBR0_EL1 | sr::TTBR1_EL1 => {
                // Unicorn performs the write (and its own TLB flush); the
                // walker re-reads the registers on the next fill.
                self.walk = None;
                0
            }
            k if is_icc(k) => {
                if self.el() == 0 {
                    return 0;
                }
                // SAFETY: sys hooks only run inside `emu_start`.
                let Some(io) = (unsafe { self.io() }) else {
                    return 0;
                };
                let ok = io.sysreg_write(self.id, k, value);
                self.update_irq(io, false);
                if !ok {
                    return 0; // UNDEFINED
                }
                let _ = rt;
                self.finish_unknown(31, None)
            }
            _ => 0,
        }
    }

    /// SYS instructions (op0 = 1): TLB maintenance (quirk 13: full flushes
    /// because the guest uses 16 KiB pages and unicorn's TLB 4 KiB), IC
    /// maintenance (quirk 11), and address translation with the VMM's walker.
    fn on_sys(&mut self, op1: u8, crn: u8, crm: u8, op2: u8, value: u64) -> u32 {
        let el = self.el();
        match (op1, crn, crm, op2) {
            (0, 8, _, _) if el == 1 => {
                if self.fills > 0 {
                    let _ = self.uc.flush_tlb();
                    self.fills = 0;
                }
                // Inner/outer shareable forms reach every vCPU (SMP notes).
                if crm == 3 || crm == 1 {
                    self.vm.broadcast(ATTN_TLB, Some(&self.me));
                }
                1
            }
            (0, 7, 1, 0) if el == 1 => {
                // IC IALLUIS.
                self.vm.broadcast(ATTN_TB, None);
                1
            }
            (0, 7, 5, 0) if el == 1 => {
                // IC IALLU.
                self.me.request(ATTN_TB);
                1
            }
            (3, 7, 5, 1) => {
                // IC IVAU; at EL0 only if SCTLR_EL1.UCI.
                if el == 0 && self.walk_regs().sctlr & (1 << 26) == 0 {
                    return 0;
                }
                self.ivau(value);
                1
            }
            (0, 7, 8, 0..=3) if el == 1 => {
                self.at(op2, value);
                1
            }
            _ => 0,
        }
    }

    /// IC IVAU: the translated code of the 16 KiB page holding `va` must go,
    /// on every engine (quirk 11). Unicorn can only drop blocks while it is
    /// not running, so the page is queued and the engines stop at their next
    /// block; pages this engine already dropped and has not fetched from
    /// since are skipped (Linux issues one IC IVAU per cache line).
    fn ivau(&mut self, va: u64) {
        let Ok(t) = self.translate(va) else {
            return;
        };
        if !matches!(self.vm.classify(t.pa), PaKind::Ram(_)) {
            return;
        }
        let page = t.pa & !(PAGE_SIZE - 1);
        let own_done = self.ic_memo.contains(&page);
        for v in &self.vm.vcpus {
            if Arc::ptr_eq(v, &self.me) && own_done {
                continue;
            }
            if v.is_created() {
                v.queue_ic(page);
            }
        }
    }

    /// AT S1E1R/S1E1W/S1E0R/S1E0W: translate with the walker and write
    /// PAR_EL1 (Arm ARM D17.2.113).
    fn at(&mut self, op2: u8, va: u64) {
        let regs = self.walk_regs();
        let el = if op2 >= 2 { 0 } else { 1 };
        let access = if op2 & 1 == 1 {
            Access::Write
        } else {
            Access::Read
        };
        let par = match mmu::translate_access(&regs, va, el, access, &*self.vm) {
            Ok(t) => {
                let mair = self.uc.read(R::MAIR_EL1).unwrap_or(0);
                let attr = (mair >> (8 * u64::from(t.attr_index))) & 0xff;
                (attr << 56)
                    | (t.pa & 0x0000_ffff_ffff_f000)
                    | (1 << 11)
                    | (1 << 9)
                    | (u64::from(t.sh) << 7)
            }
            Err(f) => (1 << 11) | (u64::from(f.code()) << 1) | 1,
        };
        let _ = self.uc.write(R::PAR_EL1, par);
    }
}

/// Whether `r` is an ICC_* register of the GICv3 CPU interface at EL1.
pub(crate) fn is_icc(r: SysReg) -> bool {
    let (op0, op1, crn, crm, op2) = r.fields();
    op0 == 3 && op1 == 0 && ((crn == 12 && crm >= 8) || (crn == 4 && crm == 6 && op2 == 0))
}

fn to_prot(p: Perms) -> Prot {
    let mut v = 0;
    if p.read {
        v |= Prot::READ.0;
    }
    if p.write {
        v |= Prot::WRITE.0;
    }
    if p.exec {
        v |= Prot::EXEC.0;
    }
    Prot(v)
}

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
/// requests and WFE spinning, before the block's first instruction (quirk 9).
pub(crate) unsafe extern "C" fn block_hook(
    _uc: *mut uc_engine,
    address: u64,
    size: u32,
    ud: *mut c_void,
) {
    // SAFETY: `ud` is this engine's HookState (module docs).
    let st = unsafe { &mut *ud.cast::<HookState>() };
    if st.me.pending() {
        stop_for_attention(st);
    } else if st.spin_enabled && st.spin.on_block(address, size) {
        // SAFETY: as above.
        unsafe { check_spin(ud) }
    }
}

// The block hook runs for every block: keep its rare paths out of line.

#[cold]
#[inline(never)]
fn stop_for_attention(st: &mut HookState) {
    st.stopped_by_hook = true;
    st.uc.stop();
}

/// # Safety
/// `ud` must be this engine's HookState.
#[cold]
#[inline(never)]
unsafe fn check_spin(ud: *mut c_void) {
    // SAFETY: per the function contract.
    unsafe { with_state(ud, (), HookState::check_spin) }
}

/// Interrupt hook: synchronous exceptions unicorn diverts (quirks 1, 2, 14).
pub(crate) unsafe extern "C" fn intr_hook(_uc: *mut uc_engine, intno: u32, ud: *mut c_void) {
    // SAFETY: `ud` is this engine's HookState.
    unsafe { with_state(ud, (), |st| st.on_interrupt(intno)) }
}

/// TLB fill hook: the VMM's stage-1 walk, dirty tracking and device routing
/// (quirks 1, 3, 10).
pub(crate) unsafe extern "C" fn tlb_hook(
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
/// `EmuVcpu::setup`); reports "not handled".
pub(crate) unsafe extern "C" fn unmapped_fetch_hook(
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
pub(crate) unsafe extern "C" fn mrs_hook(
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
    if !emulated_mrs(key) {
        return 0; // fast path: the hook runs for every MRS
    }
    // SAFETY: `ud` is this engine's HookState.
    unsafe { with_state(ud, 0, |st| st.on_mrs(key, rt_index(reg))) }
}

/// MSR and SYS hook.
pub(crate) unsafe extern "C" fn msr_hook(
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
    if !emulated_msr(key) {
        return 0;
    }
    // SAFETY: `ud` is this engine's HookState.
    unsafe { with_state(ud, 0, |st| st.on_msr(key, rt_index(reg), value)) }
}

fn emulated_mrs(k: SysReg) -> bool {
    matches!(
        k,
        sr::CNTVCT_EL0
            | sr::CNTPCT_EL0
            | sr::CNTFRQ_EL0
            | sr::CNTV_CTL_EL0
            | sr::CNTV_CVAL_EL0
            | sr::CNTV_TVAL_EL0
            | sr::ID_AA64MMFR0_EL1
            | sr::ID_AA64PFR0_EL1
    ) || is_icc(k)
}

fn emulated_msr(k: SysReg) -> bool {
    matches!(
        k,
        sr::CNTV_CTL_EL0
            | sr::CNTV_CVAL_EL0
            | sr::CNTV_TVAL_EL0
            | sr::CNTKCTL_EL1
            | sr::SCTLR_EL1
            | sr::TCR_EL1
            | sr::TTBR0_EL1
            | sr::TTBR1_EL1
    ) || is_icc(k)
}

/// MMIO read callback of a fast-path device region.
pub(crate) unsafe extern "C" fn mmio_read_cb(
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
pub(crate) unsafe extern "C" fn mmio_write_cb(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icc_register_range() {
        assert!(is_icc(sr::ICC_IAR1_EL1));
        assert!(is_icc(sr::ICC_PMR_EL1));
        assert!(is_icc(sr::ICC_SGI1R_EL1));
        assert!(is_icc(sr::ICC_AP0R0_EL1));
        assert!(!is_icc(sr::VBAR_EL1));
        assert!(!is_icc(SysReg::new(3, 0, 12, 1, 0))); // ISR_EL1
        assert!(!is_icc(SysReg::new(3, 4, 12, 12, 5))); // ICH_LR5_EL2
    }

    #[test]
    fn rt_register_ids() {
        assert_eq!(rt_index(R::X0 as u32), 0);
        assert_eq!(rt_index(R::X28 as u32), 28);
        assert_eq!(rt_index(R::X29 as u32), 29);
        assert_eq!(rt_index(R::X30 as u32), 30);
        assert_eq!(rt_index(R::XZR as u32), 31);
    }
}
