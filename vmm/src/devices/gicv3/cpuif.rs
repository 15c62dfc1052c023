//! The system-register CPU interface: ICC_*_EL1 (IHI 0069H ch. 12, "AArch64
//! System register descriptions"; the interrupt life cycle it drives is
//! chapter 4, "Physical Interrupt Handling and Prioritization").

use super::state::{MIN_BPR0, MIN_BPR1};
use super::{
    can_signal, group_priority_mask, mpidr, running_priority, Gicv3, VcpuSet, INTID_END,
    INTID_SPURIOUS, PRIORITY_MASK, PRIORITY_SHIFT,
};
use crate::arch::sysreg::{self, SysReg};

/// The ICC registers the model answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Icc {
    /// ICC_IAR1_EL1 (RO): acknowledge.
    Iar1,
    /// ICC_EOIR1_EL1 (WO): priority drop (and deactivation if EOImode = 0).
    Eoir1,
    /// ICC_HPPIR1_EL1 (RO): highest-priority pending interrupt.
    Hppir1,
    /// ICC_BPR1_EL1: binary point for group 1.
    Bpr1,
    /// ICC_CTLR_EL1: EOImode; PRIbits and IDbits read-only.
    Ctlr,
    /// ICC_SRE_EL1: RAO/WI (SRE, DFB, DIB).
    Sre,
    /// ICC_IGRPEN1_EL1: group-1 enable.
    Igrpen1,
    /// ICC_PMR_EL1: priority mask.
    Pmr,
    /// ICC_RPR_EL1 (RO): running priority.
    Rpr,
    /// ICC_DIR_EL1 (WO): deactivation when EOImode = 1.
    Dir,
    /// ICC_SGI1R_EL1 (WO): generate a group-1 SGI.
    Sgi1r,
    /// `ICC_AP1R<n>_EL1`: active priorities. Only n = 0 is backed: 5 priority
    /// bits give 32 group priorities. n = 1..3 are RAZ/WI.
    Ap1r(u8),
    /// ICC_IAR0_EL1 / ICC_HPPIR0_EL1 (RO): always 1023, group 0 is never
    /// signalled.
    Group0Ack,
    /// ICC_BPR0_EL1: stored (and saved) but affects nothing.
    Bpr0,
    /// Group-0 and alias registers that are RAZ/WI here: `ICC_AP0R<n>_EL1`,
    /// ICC_IGRPEN0_EL1.
    RazWi,
    /// Write-only registers whose writes are ignored: ICC_EOIR0_EL1,
    /// ICC_SGI0R_EL1, ICC_ASGI1R_EL1.
    IgnoredWrite,
}

/// The ICC register encodings, with what each is here.
const ICC_REGS: &[(SysReg, Icc)] = &[
    (sysreg::ICC_IAR1_EL1, Icc::Iar1),
    (sysreg::ICC_EOIR1_EL1, Icc::Eoir1),
    (sysreg::ICC_HPPIR1_EL1, Icc::Hppir1),
    (sysreg::ICC_BPR1_EL1, Icc::Bpr1),
    (sysreg::ICC_CTLR_EL1, Icc::Ctlr),
    (sysreg::ICC_SRE_EL1, Icc::Sre),
    (sysreg::ICC_IGRPEN1_EL1, Icc::Igrpen1),
    (sysreg::ICC_PMR_EL1, Icc::Pmr),
    (sysreg::ICC_RPR_EL1, Icc::Rpr),
    (sysreg::ICC_DIR_EL1, Icc::Dir),
    (sysreg::ICC_SGI1R_EL1, Icc::Sgi1r),
    (sysreg::ICC_AP1R0_EL1, Icc::Ap1r(0)),
    (sysreg::ICC_AP1R1_EL1, Icc::Ap1r(1)),
    (sysreg::ICC_AP1R2_EL1, Icc::Ap1r(2)),
    (sysreg::ICC_AP1R3_EL1, Icc::Ap1r(3)),
    (sysreg::ICC_IAR0_EL1, Icc::Group0Ack),
    (sysreg::ICC_HPPIR0_EL1, Icc::Group0Ack),
    (sysreg::ICC_BPR0_EL1, Icc::Bpr0),
    // Linux writes ICC_AP0R<n> at boot when it finds group 0 usable (DS = 1).
    (sysreg::ICC_AP0R0_EL1, Icc::RazWi),
    (sysreg::ICC_AP0R1_EL1, Icc::RazWi),
    (sysreg::ICC_AP0R2_EL1, Icc::RazWi),
    (sysreg::ICC_AP0R3_EL1, Icc::RazWi),
    (sysreg::ICC_IGRPEN0_EL1, Icc::RazWi),
    (sysreg::ICC_EOIR0_EL1, Icc::IgnoredWrite),
    (sysreg::ICC_SGI0R_EL1, Icc::IgnoredWrite),
    (sysreg::ICC_ASGI1R_EL1, Icc::IgnoredWrite),
];

/// ICC_CTLR_EL1.EOImode.
const CTLR_EOIMODE: u64 = 1 << 1;
/// ICC_CTLR_EL1 read-only fields: PRIbits `[10:8]` = 4 (5 bits), IDbits `[13:11]`
/// = 0 (16 bits); CBPR, PMHE, SEIS, A3V, RSS, ExtRange all 0.
const CTLR_RO: u64 = 4 << 8;
/// ICC_SRE_EL1: SRE, DFB and DIB, all RAO/WI.
const SRE_VALUE: u64 = 0b111;
/// Width of an INTID field in IAR/EOIR/DIR (24 bits; 16 are implemented).
const INTID_FIELD: u64 = 0xFF_FFFF;

impl Gicv3 {
    /// A trapped `MRS` of `reg` on vCPU `vcpu`. `None` if `reg` is not an ICC
    /// register read here (write-only ones included) or `vcpu` does not
    /// exist: the instruction is then UNDEFINED for the guest.
    ///
    /// Reading ICC_IAR1_EL1 acknowledges an interrupt, so call this once per
    /// guest `MRS`.
    pub fn sysreg_read(&mut self, vcpu: usize, reg: SysReg) -> Option<u64> {
        let icc = lookup(reg)?;
        let c = self.s.redists.get(vcpu)?.cpuif;
        Some(match icc {
            Icc::Iar1 => self.acknowledge(vcpu).into(),
            Icc::Hppir1 => match self.hppi(vcpu) {
                Some((_, intid)) if c.igrpen1 => intid.into(),
                _ => INTID_SPURIOUS.into(),
            },
            Icc::Bpr1 => c.bpr1.into(),
            Icc::Ctlr => CTLR_RO | if c.eoi_mode { CTLR_EOIMODE } else { 0 },
            Icc::Sre => SRE_VALUE,
            Icc::Igrpen1 => c.igrpen1.into(),
            Icc::Pmr => c.pmr.into(),
            Icc::Rpr => running_priority(&c).into(),
            Icc::Ap1r(0) => c.ap1r0.into(),
            Icc::Ap1r(_) | Icc::RazWi => 0,
            Icc::Group0Ack => INTID_SPURIOUS.into(),
            Icc::Bpr0 => c.bpr0.into(),
            Icc::Eoir1 | Icc::Dir | Icc::Sgi1r | Icc::IgnoredWrite => return None,
        })
    }

    /// A trapped `MSR` of `value` to `reg` on vCPU `vcpu`. `None` if `reg` is
    /// not an ICC register written here (read-only ones included) or `vcpu`
    /// does not exist: the instruction is then UNDEFINED. Otherwise the vCPUs
    /// that an ICC_SGI1R_EL1 write made an SGI pending on (empty for other
    /// registers).
    pub fn sysreg_write(&mut self, vcpu: usize, reg: SysReg, value: u64) -> Option<VcpuSet> {
        let icc = lookup(reg)?;
        let c = &mut self.s.redists.get_mut(vcpu)?.cpuif;
        match icc {
            Icc::Iar1 | Icc::Hppir1 | Icc::Rpr | Icc::Group0Ack => return None,
            Icc::Bpr1 => c.bpr1 = (value & 7).max(MIN_BPR1.into()) as u8,
            Icc::Bpr0 => c.bpr0 = (value & 7).max(MIN_BPR0.into()) as u8,
            Icc::Ctlr => c.eoi_mode = value & CTLR_EOIMODE != 0,
            Icc::Igrpen1 => c.igrpen1 = value & 1 != 0,
            Icc::Pmr => c.pmr = value as u8 & PRIORITY_MASK,
            Icc::Ap1r(0) => c.ap1r0 = value as u32,
            Icc::Ap1r(_) | Icc::Sre | Icc::RazWi | Icc::IgnoredWrite => {}
            Icc::Eoir1 => self.end_of_interrupt(vcpu, value),
            Icc::Dir => self.deactivate_dir(vcpu, value),
            Icc::Sgi1r => return Some(self.send_sgi(vcpu, value)),
        }
        Some(VcpuSet::EMPTY)
    }

    /// ICC_IAR1_EL1: if the highest-priority pending interrupt can be
    /// signalled, make it active (an asserted level-sensitive input leaves it
    /// active and pending), set its group priority's bit in ICC_AP1R0_EL1 so
    /// that it becomes the running priority, and return its INTID; otherwise
    /// 1023.
    fn acknowledge(&mut self, vcpu: usize) -> u32 {
        let c = self.s.redists[vcpu].cpuif;
        let Some((prio, intid)) = self.hppi(vcpu) else {
            return INTID_SPURIOUS;
        };
        if !c.igrpen1 || !can_signal(&c, prio) {
            return INTID_SPURIOUS;
        }
        let bit = (prio & group_priority_mask(&c)) >> PRIORITY_SHIFT;
        self.s.redists[vcpu].cpuif.ap1r0 |= 1 << bit;
        if let Some(irq) = self.irq_mut(vcpu, intid) {
            irq.active = true;
            irq.pending = false;
        }
        intid
    }

    /// ICC_EOIR1_EL1: drop the running priority (clear the highest active
    /// priority bit) and, with EOImode = 0, deactivate the INTID written
    /// (IHI 0069H ch. 4, "Priority drop and interrupt deactivation"). Special
    /// and unimplemented INTIDs, and EOIs with no active priority, are
    /// ignored (the architecture makes them UNPREDICTABLE).
    fn end_of_interrupt(&mut self, vcpu: usize, value: u64) {
        let intid = (value & INTID_FIELD) as u32;
        let c = &mut self.s.redists[vcpu].cpuif;
        if intid >= INTID_END || c.ap1r0 == 0 {
            return;
        }
        c.ap1r0 &= c.ap1r0 - 1;
        if !c.eoi_mode {
            self.deactivate(vcpu, intid);
        }
    }

    /// ICC_DIR_EL1: deactivate an INTID when EOImode = 1; ignored otherwise
    /// (UNPREDICTABLE) and for unimplemented INTIDs.
    fn deactivate_dir(&mut self, vcpu: usize, value: u64) {
        if self.s.redists[vcpu].cpuif.eoi_mode {
            self.deactivate(vcpu, (value & INTID_FIELD) as u32);
        }
    }

    fn deactivate(&mut self, vcpu: usize, intid: u32) {
        if let Some(irq) = self.irq_mut(vcpu, intid) {
            if irq.group1 {
                irq.active = false;
            }
        }
    }

    /// ICC_SGI1R_EL1: make SGI INTID `[27:24]` pending on every vCPU but the
    /// sender if IRM `[40]` is set, else on those whose affinity is
    /// Aff3 `[55:48]` . Aff2 `[39:32]` . Aff1 `[23:16]` . (RS `[47:44]` * 16 + n)
    /// for each bit n of TargetList `[15:0]`. Only targets where that SGI is
    /// group 1 receive it (IHI 0069H ch. 12, ICC_SGI1R_EL1).
    fn send_sgi(&mut self, sender: usize, value: u64) -> VcpuSet {
        let intid = (value >> 24 & 0xF) as usize;
        let irm = value >> 40 & 1 != 0;
        let field = |shift: u32| value >> shift & 0xFF;
        let mut targets = VcpuSet::EMPTY;
        for (v, r) in self.s.redists.iter_mut().enumerate() {
            let m = mpidr(v);
            let hit = if irm {
                v != sender
            } else {
                field(48) == m >> 32 & 0xFF
                    && field(32) == m >> 16 & 0xFF
                    && field(16) == m >> 8 & 0xFF
                    && (value >> 44 & 0xF) == (m & 0xFF) >> 4
                    && value >> (m & 0xF) & 1 != 0
            };
            let irq = &mut r.private[intid];
            if hit && irq.group1 {
                irq.pending = true;
                targets.insert(v);
            }
        }
        targets
    }
}

fn lookup(reg: SysReg) -> Option<Icc> {
    ICC_REGS
        .iter()
        .find(|(r, _)| *r == reg)
        .map(|&(_, icc)| icc)
}
