//! Guest accesses the TLB cannot simply map, and the exceptions unicorn
//! diverts to the VMM: the TLB fill (the VMM's stage-1 walk, dirty tracking,
//! device routing; quirks 1, 3, 10), delivery of synchronous exceptions to
//! the guest's EL1 vectors (quirks 1, 2, 4, 14), the fast-path MMIO
//! callbacks, and trapped MMIO, emulated by decoding the instruction.

use super::attn::{ATTN_KICK, ATTN_WATCH_BYPASS};
use super::insn::{self, Exc, Kind};
use super::mmu::{self, Access, Perms};
use super::shared::PaKind;
use super::state::{FaultCause, HookState, PendingFault};
use super::uc::{uc_err, Uc};
use super::vcpu::EmuVcpu;
use crate::arch::debug::{self, Undef};
use crate::arch::esr;
use crate::arch::exception::{exception_entry, GuestException, PSTATE_NRW};
use crate::arch::idregs::{BREAKPOINTS, WATCHPOINTS};
use crate::arch::layout::PAGE_SIZE;
use crate::arch::sysreg::{self as sr, DEBUG_SYSREGS};
use crate::hv::{Result, VcpuExit, VcpuIo};
use unicorn_engine::{Prot, RegisterARM64 as R, TlbEntry};

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

/// The self-hosted debug state an exception is classified with.
struct DebugState {
    el: u8,
    mdscr: u64,
    enabled: bool,
}

/// Unicorn's `uc_mem_type` values passed to the TLB hook.
const UC_MEM_WRITE: u32 = 17;
const UC_MEM_FETCH: u32 = 18;

/// Reads `[X0..X30, SP]` through the engine for the instruction decoder.
fn xreader(uc: Uc) -> impl Fn(u8) -> u64 {
    move |n| uc.x_or_sp(n)
}

/// The 4 KiB page of `va`, ignoring the top byte (TBI).
pub(super) fn same_page(a: u64, b: u64) -> bool {
    (a ^ b) & 0x00ff_ffff_ffff_f000 == 0
}

impl HookState {
    /// Enters the guest's EL1 synchronous exception vector (quirks 1, 2, 4)
    /// as computed by [`exception_entry`]: ESR/FAR/ELR/SPSR, SP banking,
    /// PSTATE, PC. Returns `false` if the vCPU is in a state the backend
    /// cannot take an exception from (EL2/EL3, or AArch32, which it never
    /// runs).
    pub(super) fn deliver_sync(&mut self, esr: u64, far: Option<u64>, elr: u64) -> bool {
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

    /// Delivers a synchronous exception, or stops with `Unhandled` if the
    /// vCPU is in a state that cannot take it.
    pub(super) fn deliver_or_stop(&mut self, esr: u64, far: Option<u64>, pc: u64) {
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
    pub(super) fn data_far(&mut self, pc: u64, va_page: u64) -> (u64, Option<insn::LdSt>) {
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

    pub(super) fn on_interrupt(&mut self, intno: u32) {
        let pc = self.uc.read(R::PC).unwrap_or(0);
        let same_el = self.el() == 1;
        match intno {
            // QEMU raises a software step exception as an UNDEF (with a
            // syndrome unicorn does not show): tell them apart by the step
            // state, which leaves PSTATE.SS clear only after a stepped
            // instruction (a real UNDEF of the stepped one keeps it set).
            excp::UDEF => match self.classify_undef() {
                Undef::SoftwareStep => {
                    self.deliver_or_stop(esr::software_step_esr(same_el, false), None, pc)
                }
                // The stepped instruction masked debug exceptions (quirk
                // 17): go on after it, with unicorn's cached flags rebuilt
                // so that its next block is not stepped.
                Undef::MaskedStep => self.refresh_cpu_flags(),
                Undef::Undefined => self.deliver_or_stop(esr::unknown_esr(), None, pc),
            },
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
                // QEMU's hardware breakpoints (from the guest's DBGBVR/
                // DBGBCR) arrive as prefetch aborts; FAR is UNKNOWN for them.
                let (esr, far) = if pc & 3 != 0 {
                    (esr::pc_align_esr(), Some(pc))
                } else if self.breakpoint_at(pc) {
                    (esr::breakpoint_esr(same_el), None)
                } else {
                    (
                        esr::instr_abort_esr(same_el, esr::FSC_SYNC_EXTERNAL),
                        Some(pc),
                    )
                };
                self.deliver_or_stop(esr, far, pc);
            }
            _ => self.exit_with(VcpuExit::Unhandled {
                esr: 0,
                far: 0,
                ipa: 0,
                pc,
            }),
        }
    }

    /// What an UNDEF from unicorn is ([`debug::classify_undef`]).
    fn classify_undef(&self) -> Undef {
        let Some((el, mdscr, pstate, os_lock)) = self.debug_regs() else {
            return Undef::Undefined;
        };
        debug::classify_undef(el, mdscr, pstate, os_lock, self.stepped_block)
    }

    /// Rebuilds unicorn's cached CPU flags from the registers (quirk 4:
    /// writing VBAR_EL1 back is enough).
    fn refresh_cpu_flags(&mut self) {
        if let Ok(vbar) = self.uc.read(R::VBAR_EL1) {
            let _ = self.uc.cp_write(sr::VBAR_EL1, vbar);
        }
    }

    /// Called by the block hook at each block while MDSCR_EL1.SS is set
    /// (quirk 17): unicorn decides whether a block is stepped from flags it
    /// caches and does not rebuild when `MSR DAIFClr` unmasks debug
    /// exceptions, so a step that became active-pending there would never
    /// be taken. If one is due before the block's first instruction at
    /// `pc`, takes the Software Step exception (no instruction stepped:
    /// ISV 0) and returns `true`; the engine leaves the block before its
    /// first instruction, as after any PC write from a hook. Otherwise
    /// notes whether the block is stepped, for [`Self::classify_undef`].
    pub(super) fn step_at_block(&mut self, pc: u64) -> bool {
        let Some((el, mdscr, pstate, os_lock)) = self.debug_regs() else {
            return false;
        };
        self.stepped_block = debug::step_active_not_pending(el, mdscr, pstate, os_lock);
        if !debug::step_pending(el, mdscr, pstate, os_lock) {
            return false;
        }
        self.stepped_block = false;
        self.deliver_or_stop(esr::software_step_pending_esr(el == 1), None, pc);
        true
    }

    /// (EL, MDSCR_EL1, PSTATE, OS Lock locked), `None` if unicorn cannot
    /// read them.
    fn debug_regs(&self) -> Option<(u8, u64, u64, bool)> {
        let mdscr = self.uc.cp_read(sr::MDSCR_EL1).ok()?;
        let oslsr = self.uc.cp_read(sr::OSLSR_EL1).ok()?;
        let pstate = self.uc.read(R::PSTATE).ok()?;
        // OSLSR_EL1.OSLK is bit 1.
        Some((self.el(), mdscr, pstate, oslsr & 0b10 != 0))
    }

    /// The self-hosted debug state of the current EL, `None` if unicorn
    /// cannot read it.
    fn debug_state(&self) -> Option<DebugState> {
        let (el, mdscr, pstate, os_lock) = self.debug_regs()?;
        Some(DebugState {
            el,
            mdscr,
            enabled: debug::enabled(el, mdscr, pstate, os_lock),
        })
    }

    /// Whether an enabled hardware breakpoint matches the instruction at
    /// `pc` at the current EL.
    fn breakpoint_at(&self, pc: u64) -> bool {
        let Some(d) = self.debug_state() else {
            return false;
        };
        if !d.enabled || d.mdscr & debug::MDSCR_MDE == 0 {
            return false;
        }
        (0..BREAKPOINTS).any(|n| {
            let (v, c) = debug::breakpoint_regs(n);
            let read = |i: usize| self.uc.cp_read(DEBUG_SYSREGS[i]).unwrap_or(0);
            debug::breakpoint_matches(read(c), read(v), pc, d.el)
        })
    }

    /// [`crate::memory::GuestRam::before_guest_write_unless_kicked`] for
    /// this vCPU: `false` if a kick ended a wait for another thread's save
    /// of `page` (RAM index); the store must not happen.
    fn before_guest_write(&self, page: u64) -> bool {
        let me = &self.me;
        self.vm
            .ram
            .before_guest_write_unless_kicked(page, &|| me.word() & ATTN_KICK != 0)
    }

    // ----- TLB fill hook ------------------------------------------------

    pub(super) fn on_tlb_fill(&mut self, va: u64, ty: u32) -> Option<TlbEntry> {
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
        // Watchpoints (quirk 16): every data access to a watched page is
        // checked by `watch_fault`; code on it may run.
        let watched = self.watched_page(va);
        if watched && access != Access::Fetch {
            self.fault = Some(fault(FaultCause::Watch));
            return None;
        }
        match self.vm.classify(pa) {
            PaKind::Ram(page) => {
                let page = page as usize;
                if perms.write && self.vm.wp.is_set(page) {
                    if access == Access::Write {
                        // Dirty tracking: the first store to a protected page
                        // marks it and unprotects it; the store then completes
                        // (after a background snapshot has saved the page). A
                        // kick while another thread saves it ends the wait:
                        // the store runs again when the vCPU next runs.
                        if !self.before_guest_write(page as u64) {
                            self.fault = Some(fault(FaultCause::Kicked));
                            return None;
                        }
                        self.vm.dirty.set(page);
                        self.vm.wp.clear(page);
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
        if watched {
            perms.read = false;
            perms.write = false;
        }
        self.filled.record(va, mmu::leaf_shift(&regs, va, t.level));
        Some(TlbEntry {
            paddr: pa,
            perms: to_prot(perms),
        })
    }

    /// Whether the 4 KiB page of `va` holds watched bytes and is not the one
    /// let through for the current block.
    fn watched_page(&self, va: u64) -> bool {
        if self.watch.is_empty() {
            return false;
        }
        let page = va & !0xfff;
        self.watch_bypass.is_none_or(|(p, _)| p != page)
            && self
                .watch
                .iter()
                .any(|&(start, end)| start < page.wrapping_add(0x1000) && end > page)
    }

    /// A data access to a watched page (the TLB hook refused it): a
    /// Watchpoint exception if it hits an enabled watchpoint (the access is
    /// not made; ELR = the instruction, FAR = the first watched byte it
    /// touches), else the page is let through for this access and
    /// protected again at the next block.
    fn watch_fault(&mut self, f: PendingFault, pc: u64) -> Result<Option<VcpuExit>> {
        let write = f.access == Access::Write;
        let d = self.read_insn(pc).and_then(insn::decode_ldst);
        let (addr, len) = match d {
            Some(d) if d.size != 0 => {
                let count = if d.rt2.is_some() { 2 } else { 1 };
                (d.address(xreader(self.uc), pc).0, u64::from(d.size) * count)
            }
            // An access the decoder cannot size: its first byte.
            _ => (f.va, 1),
        };
        match self.watch_hit(addr, len, write) {
            Some(far) => {
                let same_el = self.el() == 1;
                let esr = esr::watchpoint_esr(same_el, write);
                if self.deliver_sync(esr, Some(far), pc) {
                    Ok(None)
                } else {
                    Ok(Some(VcpuExit::Unhandled {
                        esr,
                        far,
                        ipa: 0,
                        pc,
                    }))
                }
            }
            None => {
                // No hit: make the access here, so the page stays checked for
                // the next one; one the decoder cannot make runs with the page
                // let through until the next block.
                if !d.is_some_and(|d| self.emulate_ram_access(d, pc, write)) {
                    self.watch_bypass = Some((f.va & !0xfff, 0));
                    self.me.request(ATTN_WATCH_BYPASS);
                }
                Ok(None)
            }
        }
    }

    /// Makes the general-purpose load or store `d` at `pc` on RAM, as the
    /// CPU would have (registers, base write-back, PC + 4, dirty tracking
    /// and background snapshots for a store). `false`, with nothing done, if
    /// it is not such an access, crosses a 4 KiB page, or does not translate
    /// to RAM with the permission it needs (the CPU then makes it, or
    /// faults, itself).
    fn emulate_ram_access(&mut self, d: insn::LdSt, pc: u64, write: bool) -> bool {
        if !d.emulatable() || d.kind == insn::Kind::Prefetch {
            return false;
        }
        let uc = self.uc;
        let (addr, writeback) = d.address(|n| uc.x_or_sp(n), pc);
        let size = u64::from(d.size);
        let regs = [Some(d.rt), d.rt2];
        let count = regs.iter().flatten().count() as u64;
        if (addr & 0xfff) + size * count > 0x1000 {
            return false;
        }
        let access = if write { Access::Write } else { Access::Read };
        let walk = self.walk_regs();
        let el = self.el();
        let Ok(t) = mmu::translate_access(&walk, addr, el, access, &*self.vm) else {
            return false;
        };
        let PaKind::Ram(page) = self.vm.classify(t.pa) else {
            return false;
        };
        let mem = self.vm.ram.memory();
        let n = d.size as usize;
        if write {
            if !self.before_guest_write(page) {
                return false;
            }
            self.vm.dirty.set(page as usize);
        }
        for (i, rt) in regs.iter().flatten().enumerate() {
            let at = vm_memory::GuestAddress(t.pa + i as u64 * size);
            if write {
                let v = if *rt == 31 { 0 } else { uc.x_or_sp(*rt) };
                if vm_memory::Bytes::write_slice(mem, &v.to_le_bytes()[..n], at).is_err() {
                    return false;
                }
            } else {
                let mut buf = [0u8; 8];
                if vm_memory::Bytes::read_slice(mem, &mut buf[..n], at).is_err() {
                    return false;
                }
                if let insn::Kind::Load { signed, dst64 } = d.kind {
                    let v = esr::extend(u64::from_le_bytes(buf), d.size, signed, dst64);
                    if uc.set_x(*rt, v).is_err() {
                        return false;
                    }
                }
            }
        }
        if let Some(wb) = writeback {
            let reg = if d.rn == 31 { R::SP } else { Uc::xreg(d.rn) };
            if uc.write(reg, wb).is_err() {
                return false;
            }
        }
        uc.write(R::PC, pc + 4).is_ok()
    }

    /// The first watched byte an access of `len` bytes at `addr` touches,
    /// if it hits an enabled watchpoint at the current EL.
    fn watch_hit(&self, addr: u64, len: u64, write: bool) -> Option<u64> {
        let d = self.debug_state()?;
        if !d.enabled || d.mdscr & debug::MDSCR_MDE == 0 {
            return None;
        }
        (0..WATCHPOINTS).find_map(|n| {
            let (v, c) = debug::watchpoint_regs(n);
            let read = |i: usize| self.uc.cp_read(DEBUG_SYSREGS[i]).unwrap_or(0);
            let (wcr, wvr) = (read(c), read(v));
            debug::watchpoint_matches(wcr, wvr, addr, len, write, d.el)
                .then(|| debug::watch_range(wcr, wvr).map_or(addr, |(start, _)| addr.max(start)))
        })
    }

    // ----- MMIO callbacks (fast path) -----------------------------------

    pub(super) fn on_mmio_read(&mut self, gpa: u64, size: usize) -> u64 {
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

    pub(super) fn on_mmio_write(&mut self, gpa: u64, size: usize, value: u64) {
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

impl EmuVcpu {
    /// Handles a fault the TLB hook recorded; `Some` if `run` must return.
    pub(super) fn handle_fault(
        &mut self,
        f: PendingFault,
        io: &mut dyn VcpuIo,
    ) -> Result<Option<VcpuExit>> {
        let uc = self.uc;
        let pc = uc.read(R::PC).map_err(uc_err("read PC"))?;
        let status = match f.cause {
            FaultCause::Walk(fault) => fault.code(),
            FaultCause::External => esr::FSC_SYNC_EXTERNAL,
            FaultCause::Mmio(pa) => return self.emulate_mmio(f, pa, pc, io),
            FaultCause::Watch => return self.state().watch_fault(f, pc),
            // Nothing happened; `run` takes the kick next.
            FaultCause::Kicked => return Ok(None),
        };
        let st = self.state();
        let same_el = st.el() == 1;
        let write = f.access == mmu::Access::Write;
        let (esr, far) = if f.access == mmu::Access::Fetch {
            let far = if (pc ^ f.va) & !0xfff == 0 { pc } else { f.va };
            (esr::instr_abort_esr(same_el, status), far)
        } else {
            let (far, _) = st.data_far(pc, f.va);
            (esr::data_abort_esr(same_el, write, status), far)
        };
        if st.deliver_sync(esr, Some(far), pc) {
            Ok(None)
        } else {
            Ok(Some(VcpuExit::Unhandled {
                esr,
                far,
                ipa: 0,
                pc,
            }))
        }
    }

    /// Emulates a load/store to a trapped device region: exact sizes, the
    /// instruction completed (register write-back, base update, PC + 4), or
    /// a synchronous external abort if the device refuses.
    fn emulate_mmio(
        &mut self,
        f: PendingFault,
        pa_page: u64,
        pc: u64,
        io: &mut dyn VcpuIo,
    ) -> Result<Option<VcpuExit>> {
        let uc = self.uc;
        let id = self.id;
        let st = self.state();
        let write = f.access == mmu::Access::Write;
        let same_el = st.el() == 1;
        let unhandled = |far: u64| VcpuExit::Unhandled {
            // As HVF reports an access it cannot decode: a data abort from
            // EL1 with ISV = 0 (stage-2 translation fault, level 3).
            esr: esr::data_abort_esr(false, write, esr::FSC_TRANSLATION + 3),
            far,
            ipa: pa_page | (far & 0xfff),
            pc,
        };
        let d = match st.read_insn(pc).and_then(insn::decode_ldst) {
            Some(d) if d.emulatable() && d.kind != insn::Kind::Prefetch => d,
            _ => return Ok(Some(unhandled(f.va))),
        };
        let (addr, writeback) = d.address(|n| uc.x_or_sp(n), pc);
        let size = u64::from(d.size);
        let count = if d.rt2.is_some() { 2 } else { 1 };
        let off = addr & 0xfff;
        if !same_page(addr, f.va) || off + size * count > 0x1000 {
            return Ok(Some(unhandled(addr)));
        }
        let gpa = pa_page | off;
        let regs = [Some(d.rt), d.rt2];
        let n = d.size as usize;
        let mut loaded = [0u64; 2];
        for (i, rt) in regs.iter().flatten().enumerate() {
            let a = gpa + i as u64 * size;
            let r = if write {
                let v = if *rt == 31 { 0 } else { uc.x_or_sp(*rt) };
                io.mmio_write(id, a, &v.to_le_bytes()[..n])
            } else {
                let mut buf = [0u8; 8];
                let r = io.mmio_read(id, a, &mut buf[..n]);
                loaded[i] = u64::from_le_bytes(buf);
                r
            };
            if let Err(e) = r {
                crate::warn_ratelimited!(vcpu = id, error = %e, "emu: MMIO fault, external abort to the guest");
                let st = self.state();
                st.update_irq(io, false);
                let far = addr + i as u64 * size;
                let esr = esr::data_abort_esr(same_el, write, esr::FSC_SYNC_EXTERNAL);
                if st.deliver_sync(esr, Some(far), pc) {
                    return Ok(None);
                }
                return Ok(Some(VcpuExit::Unhandled {
                    esr,
                    far,
                    ipa: gpa,
                    pc,
                }));
            }
        }
        let err = uc_err("complete MMIO access");
        if let insn::Kind::Load { signed, dst64 } = d.kind {
            for (i, rt) in regs.iter().flatten().enumerate() {
                let v = esr::extend(loaded[i], d.size, signed, dst64);
                uc.set_x(*rt, v).map_err(&err)?;
            }
        }
        if let Some(wb) = writeback {
            let reg = if d.rn == 31 { R::SP } else { Uc::xreg(d.rn) };
            uc.write(reg, wb).map_err(&err)?;
        }
        uc.write(R::PC, pc + 4).map_err(&err)?;
        self.state().update_irq(io, false);
        Ok(None)
    }
}
