//! System registers (quirk 6): the MRS/MSR/SYS hooks' handlers (the GIC CPU
//! interface and the EL1 physical timer through [`VcpuIo`], the counter and
//! virtual timer, the advertised ID registers ([`crate::arch::idregs`]),
//! the absent PMU (RAZ/WI), TLB and IC maintenance, address
//! translation), the vCPU's entry state, and [`Vcpu::sysreg`] /
//! [`Vcpu::set_sysreg`].

use super::attn::{ATTN_TB, ATTN_TLB, ATTN_WATCH};
use super::mmu::{self, Access};
use super::shared::PaKind;
use super::state::{HookState, HCR_IMO, HCR_RW};
use super::timer;
use super::uc::uc_err;
use crate::arch::debug;
use crate::arch::exception::{CpuFeatures, PSTATE_DAIF, PSTATE_EL1H};
use crate::arch::idregs::{self, WATCHPOINTS};
use crate::arch::layout::PAGE_SIZE;
use crate::arch::sysreg::{self as sr, SysReg};
use crate::hv::Result;
#[cfg(doc)]
use crate::hv::{Vcpu, VcpuIo};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use unicorn_engine::RegisterARM64 as R;

/// Whether `r` is an ICC_* register of the GICv3 CPU interface at EL1.
pub(super) fn is_icc(r: SysReg) -> bool {
    let (op0, op1, crn, crm, op2) = r.fields();
    op0 == 3 && op1 == 0 && ((crn == 12 && crm >= 8) || (crn == 4 && crm == 6 && op2 == 0))
}

/// Whether `r` is a register of the EL1 physical timer, which the VMM
/// emulates for both backends (reached through [`VcpuIo`]).
pub(super) fn is_ptimer(r: SysReg) -> bool {
    matches!(r, sr::CNTP_CTL_EL0 | sr::CNTP_CVAL_EL0 | sr::CNTP_TVAL_EL0)
}

/// Per register: whether the MRS and the MSR hook handle it
/// ([`emulated_mrs`], [`emulated_msr`]), as [`TRAP_KNOWN`] | [`TRAP_MRS`] |
/// [`TRAP_MSR`], 0 until first asked. The hook runs for every MRS and MSR
/// the guest executes, most of them to registers unicorn handles alone, so
/// the answer is a table load once known.
static TRAPS: [AtomicU8; 1 << 16] = [const { AtomicU8::new(0) }; 1 << 16];
/// [`TRAPS`]: the entry has been computed.
const TRAP_KNOWN: u8 = 1;
/// [`TRAPS`]: the MRS hook handles the register.
pub(super) const TRAP_MRS: u8 = 2;
/// [`TRAPS`]: the MSR hook handles the register.
pub(super) const TRAP_MSR: u8 = 4;

/// Which hooks handle `k` ([`TRAP_MRS`], [`TRAP_MSR`]).
#[inline(always)]
pub(super) fn traps(k: SysReg) -> u8 {
    let v = TRAPS[usize::from(k.0)].load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    classify(k)
}

#[cold]
#[inline(never)]
fn classify(k: SysReg) -> u8 {
    let mut v = TRAP_KNOWN;
    if emulated_mrs(k) {
        v |= TRAP_MRS;
    }
    if emulated_msr(k) {
        v |= TRAP_MSR;
    }
    TRAPS[usize::from(k.0)].store(v, Ordering::Relaxed);
    v
}

/// Whether the MRS hook handles `k` (everything else is left to unicorn).
fn emulated_mrs(k: SysReg) -> bool {
    matches!(
        k,
        sr::CNTVCT_EL0
            | sr::CNTPCT_EL0
            | sr::CNTFRQ_EL0
            | sr::CNTV_CTL_EL0
            | sr::CNTV_CVAL_EL0
            | sr::CNTV_TVAL_EL0
    ) || is_icc(k)
        || is_ptimer(k)
        || idregs::is_pmu(k)
        || idregs::advertised(k).is_some()
}

/// Whether the MSR hook handles `k`.
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
        || is_ptimer(k)
        || idregs::is_pmu(k)
        || watch_config(k)
}

/// Whether a write to `k` can change which watchpoints are enabled
/// (MDSCR_EL1.MDE, the OS lock, DBGWVRn_EL1/DBGWCRn_EL1), which the TLB
/// hook applies (quirk 16).
pub(super) fn watch_config(k: SysReg) -> bool {
    matches!(k, sr::MDSCR_EL1 | sr::OSLAR_EL1 | sr::OSLSR_EL1)
        || (0..WATCHPOINTS).any(|n| {
            let (v, c) = debug::watchpoint_regs(n);
            k == sr::DEBUG_SYSREGS[v] || k == sr::DEBUG_SYSREGS[c]
        })
}

impl HookState {
    /// Writes the entry state of a new vCPU.
    pub(super) fn init_sysregs(&mut self) -> Result<()> {
        let uc = self.uc;
        // Entry state (quirk 2): Non-secure, EL2 present with HVC enabled,
        // EL1 AArch64; IRQs routed as virtual IRQs. Unicorn starts at EL1h
        // with the MMU off; make PSTATE exactly EL1h with DAIF masked (its
        // reset value has Z set). The CP_REG writes below rebuild unicorn's
        // cached flags (quirk 4).
        uc.write(R::PSTATE, PSTATE_DAIF | PSTATE_EL1H)
            .map_err(uc_err("write PSTATE"))?;
        let cp = |reg: SysReg, v: u64| uc.cp_write(reg, v).map_err(uc_err("write system register"));
        cp(sr::SCR_EL3, (1 << 10) | (1 << 8) | 1)?; // RW | HCE | NS
        cp(sr::HCR_EL2, HCR_RW | HCR_IMO)?;
        // EL1 physical counter and timer not trapped to EL2.
        cp(sr::CNTHCTL_EL2, 3)?;
        cp(sr::VMPIDR_EL2, self.mpidr)?;
        // The features the guest is told of (arch::idregs), which unicorn's
        // Cortex-A72 has (neither PAN nor SSBS).
        let id = |reg| idregs::advertised(reg).unwrap_or(0);
        self.features =
            CpuFeatures::from_id_regs(id(sr::ID_AA64MMFR1_EL1), id(sr::ID_AA64PFR1_EL1));
        Ok(())
    }

    /// EL0 access to the counter/timer per CNTKCTL_EL1 (Arm ARM D11.2.2).
    fn el0_timer_ok(&self, reg: SysReg) -> bool {
        let k = self.cntkctl;
        match reg {
            sr::CNTVCT_EL0 => k & (1 << 1) != 0,
            sr::CNTPCT_EL0 => k & 1 != 0,
            sr::CNTFRQ_EL0 => k & 3 != 0,
            r if is_ptimer(r) => k & (1 << 9) != 0, // EL0PTEN
            _ => k & (1 << 8) != 0,                 // EL0VTEN for CNTV_*
        }
    }

    /// Returns 1 ("skip the instruction") if the access was emulated here.
    pub(super) fn on_mrs(&mut self, key: SysReg, rt: u8) -> u32 {
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
                let value = match key {
                    // The guest sees CNTVOFF_EL2 = 0 (crate::arch::timer).
                    sr::CNTVCT_EL0 | sr::CNTPCT_EL0 => vcount,
                    sr::CNTFRQ_EL0 => timer::COUNTER_HZ,
                    sr::CNTV_CTL_EL0 => self.vtimer.read_ctl(vcount),
                    sr::CNTV_CVAL_EL0 => self.vtimer.cval,
                    _ => self.vtimer.read_tval(vcount),
                };
                if matches!(key, sr::CNTV_CTL_EL0 | sr::CNTV_TVAL_EL0) {
                    // The timer's output is its ISTATUS: once a read shows
                    // the condition, the PPI is raised, not later when the
                    // timer thread wakes. A read does not end the block, so
                    // kick for the interrupt to be noticed.
                    // SAFETY: sys hooks only run inside `emu_start`.
                    if let Some(io) = unsafe { self.io() } {
                        self.vtimer_update(io, false, true);
                    }
                }
                value
            }
            k if idregs::is_pmu(k) => 0, // no PMU: RAZ at every EL, as on HVF
            k if idregs::advertised(k).is_some() => {
                if self.el() == 0 {
                    return 0; // UNDEFINED at EL0; Linux emulates it
                }
                idregs::advertised(k).unwrap_or(0)
            }
            k if is_ptimer(k) => {
                if self.el() == 0 && !self.el0_timer_ok(k) {
                    return 0; // unicorn's own access check traps it
                }
                // SAFETY: sys hooks only run inside `emu_start`.
                let Some(io) = (unsafe { self.io() }) else {
                    return 0;
                };
                let v = io.sysreg_read(self.id, k);
                // A read that shows the timer condition may raise the line;
                // it does not end the block, so kick.
                self.update_irq(io, true);
                // A register unicorn knows cannot be made UNDEFINED in the
                // middle of its block; the machine always answers these.
                v.unwrap_or(0)
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

    pub(super) fn on_msr(&mut self, key: SysReg, rt: u8, value: u64) -> u32 {
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
            k if is_ptimer(k) => {
                if self.el() == 0 && !self.el0_timer_ok(k) {
                    return 0;
                }
                // SAFETY: sys hooks only run inside `emu_start`.
                if let Some(io) = unsafe { self.io() } {
                    // Refused writes are ignored, as for the read above. No
                    // kick needed: the write ends the block.
                    io.sysreg_write(self.id, k, value);
                    self.update_irq(io, false);
                }
                1
            }
            k if idregs::is_pmu(k) => 1, // no PMU: WI at every EL, as on HVF
            k if watch_config(k) => {
                // Unicorn makes the write; the next block reads it back.
                self.me.request(ATTN_WATCH);
                0
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
                // Unicorn flushes its whole TLB when a TTBR write changes the
                // ASID (bits 63:48), as QEMU does: what was filled is gone.
                // Only at EL1: at EL0 the write is UNDEFINED and nothing is
                // flushed (this hook runs before unicorn's access check).
                let ttbr = match key {
                    sr::TTBR0_EL1 if self.el() == 1 => Some(R::TTBR0_EL1),
                    sr::TTBR1_EL1 if self.el() == 1 => Some(R::TTBR1_EL1),
                    _ => None,
                };
                if let Some(Ok(old)) = ttbr.map(|r| self.uc.read(r)) {
                    if (old ^ value) >> 48 != 0 {
                        self.filled.clear();
                    }
                }
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

    /// SYS instructions (op0 = 1): TLB maintenance (quirk 13: unicorn can
    /// only flush its whole TLB, whose entries are 4 KiB, so a TLBI flushes
    /// everything unless [`HookState::filled`] shows that the TLB holds
    /// nothing it names), IC maintenance (quirk 11), and address translation
    /// with the VMM's walker.
    pub(super) fn on_sys(&mut self, op1: u8, crn: u8, crm: u8, op2: u8, value: u64) -> u32 {
        let el = self.el();
        match (op1, crn, crm, op2) {
            (0, 8, _, _) if el == 1 => {
                let needed = match tlbi_va(crm, op2, value) {
                    Some(va) => self.filled.may_hold(va),
                    None => !self.filled.is_empty(),
                };
                if needed {
                    let _ = self.uc.flush_tlb();
                    self.filled.clear();
                }
                // Inner/outer shareable forms reach every engine: engines
                // share no TLB (see "Several engines" on the quirks page).
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

/// The VA a TLBI by VA (op1 0, CRn 8) names: VAE1, VAAE1, VALE1 and VAALE1,
/// local (CRm 7), inner (3) or outer shareable (1), whose operand holds VA
/// bits `[55:12]` (sign-extended from bit 55, as unicorn does). `None` for
/// every other TLBI (all, by ASID, ranges).
fn tlbi_va(crm: u8, op2: u8, value: u64) -> Option<u64> {
    if matches!(crm, 1 | 3 | 7) && matches!(op2, 1 | 3 | 5 | 7) {
        Some((((value << 12) << 8) as i64 >> 8) as u64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trap_table_agrees_with_the_rules() {
        for key in 0..=u16::MAX {
            let k = SysReg(key);
            let v = traps(k);
            assert_eq!(v & TRAP_MRS != 0, emulated_mrs(k), "{k:?}");
            assert_eq!(v & TRAP_MSR != 0, emulated_msr(k), "{k:?}");
            assert_eq!(traps(k), v, "{k:?}: cached");
        }
        assert_ne!(traps(sr::CNTVCT_EL0) & TRAP_MRS, 0);
        assert_ne!(traps(sr::ICC_SGI1R_EL1) & TRAP_MSR, 0);
        assert_eq!(traps(sr::VBAR_EL1) & (TRAP_MRS | TRAP_MSR), 0);
    }

    #[test]
    fn tlbi_operands_by_va() {
        // TLBI VAE1IS, Xt with ASID 5 and the kernel page 0xffff_8000_1234_c000.
        let op = (5u64 << 48) | ((0xffff_8000_1234_c000u64 >> 12) & ((1 << 44) - 1));
        assert_eq!(tlbi_va(3, 1, op), Some(0xffff_8000_1234_c000));
        assert_eq!(tlbi_va(7, 5, 0x40), Some(0x4_0000)); // VALE1, user page
        assert_eq!(tlbi_va(1, 7, 0x40), Some(0x4_0000)); // VAALE1OS
        assert_eq!(tlbi_va(3, 0, op), None); // VMALLE1IS
        assert_eq!(tlbi_va(7, 2, op), None); // ASIDE1
        assert_eq!(tlbi_va(2, 1, op), None); // RVAE1IS: a range
    }

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
}
