//! AArch64 system-register identifiers.
//!
//! A [`SysReg`] is the (op0, op1, CRn, CRm, op2) tuple of an `MRS`/`MSR`
//! encoding (Arm ARM C5.3), packed as `op0<<14 | op1<<11 | CRn<<7 | CRm<<3 | op2`.
//! This is the packing Hypervisor.framework uses for `hv_sys_reg_t`, so the
//! value can be passed to HVF unchanged.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A system register, identified by its `MRS`/`MSR` encoding.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SysReg(pub u16);

impl SysReg {
    /// Builds an identifier from the encoding fields (op0 in 0..=3, op1 and
    /// op2 in 0..=7, CRn and CRm in 0..=15; higher bits are masked off).
    pub const fn new(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> Self {
        SysReg(
            ((op0 as u16 & 0x3) << 14)
                | ((op1 as u16 & 0x7) << 11)
                | ((crn as u16 & 0xf) << 7)
                | ((crm as u16 & 0xf) << 3)
                | (op2 as u16 & 0x7),
        )
    }

    /// The encoding fields `(op0, op1, CRn, CRm, op2)`.
    pub const fn fields(self) -> (u8, u8, u8, u8, u8) {
        let v = self.0;
        (
            (v >> 14) as u8 & 0x3,
            (v >> 11) as u8 & 0x7,
            (v >> 7) as u8 & 0xf,
            (v >> 3) as u8 & 0xf,
            v as u8 & 0x7,
        )
    }

    /// The architectural name, if this is a register the VMM knows by name.
    pub fn name(self) -> Option<&'static str> {
        NAMES.iter().find(|(r, _)| *r == self).map(|(_, n)| *n)
    }
}

impl fmt::Debug for SysReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => {
                let (op0, op1, crn, crm, op2) = self.fields();
                write!(f, "S{op0}_{op1}_C{crn}_C{crm}_{op2}")
            }
        }
    }
}

impl fmt::Display for SysReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

macro_rules! sysregs {
    ($($(#[$doc:meta])* $name:ident = ($op0:expr, $op1:expr, $crn:expr, $crm:expr, $op2:expr);)*) => {
        $( $(#[$doc])* pub const $name: SysReg = SysReg::new($op0, $op1, $crn, $crm, $op2); )*
        const NAMES: &[(SysReg, &str)] = &[$(($name, stringify!($name))),*];
    };
}

sysregs! {
    /// Main ID register.
    MIDR_EL1 = (3, 0, 0, 0, 0);
    /// Multiprocessor affinity register.
    MPIDR_EL1 = (3, 0, 0, 0, 5);
    /// Processor feature register 0.
    ID_AA64PFR0_EL1 = (3, 0, 0, 4, 0);
    /// Processor feature register 1 (SSBS, BTI, MTE).
    ID_AA64PFR1_EL1 = (3, 0, 0, 4, 1);
    /// Debug feature register 0 (debug and PMU versions, breakpoint and
    /// watchpoint counts).
    ID_AA64DFR0_EL1 = (3, 0, 0, 5, 0);
    /// Debug feature register 1.
    ID_AA64DFR1_EL1 = (3, 0, 0, 5, 1);
    /// Instruction set attribute register 0 (AES, SHA, CRC32, atomics).
    ID_AA64ISAR0_EL1 = (3, 0, 0, 6, 0);
    /// Instruction set attribute register 1 (PAuth, LRCPC, JSCVT).
    ID_AA64ISAR1_EL1 = (3, 0, 0, 6, 1);
    /// Memory model feature register 0 (translation granules, PA range).
    ID_AA64MMFR0_EL1 = (3, 0, 0, 7, 0);
    /// Memory model feature register 1 (PAN, VHE, HAFDBS).
    ID_AA64MMFR1_EL1 = (3, 0, 0, 7, 1);
    /// Memory model feature register 2.
    ID_AA64MMFR2_EL1 = (3, 0, 0, 7, 2);
    /// System control register (EL1).
    SCTLR_EL1 = (3, 0, 1, 0, 0);
    /// Architectural feature access control (FP/SIMD enable).
    CPACR_EL1 = (3, 0, 1, 0, 2);
    /// Translation table base 0.
    TTBR0_EL1 = (3, 0, 2, 0, 0);
    /// Translation table base 1.
    TTBR1_EL1 = (3, 0, 2, 0, 1);
    /// Translation control register.
    TCR_EL1 = (3, 0, 2, 0, 2);
    /// Saved program status on exception entry to EL1.
    SPSR_EL1 = (3, 0, 4, 0, 0);
    /// Exception link register (EL1).
    ELR_EL1 = (3, 0, 4, 0, 1);
    /// Stack pointer (EL0).
    SP_EL0 = (3, 0, 4, 1, 0);
    /// Stack pointer (EL1); accessed with op1 = 4.
    SP_EL1 = (3, 4, 4, 1, 0);
    /// Auxiliary fault status 0.
    AFSR0_EL1 = (3, 0, 5, 1, 0);
    /// Auxiliary fault status 1.
    AFSR1_EL1 = (3, 0, 5, 1, 1);
    /// Exception syndrome register (EL1).
    ESR_EL1 = (3, 0, 5, 2, 0);
    /// Fault address register (EL1).
    FAR_EL1 = (3, 0, 6, 0, 0);
    /// Physical address register (result of AT).
    PAR_EL1 = (3, 0, 7, 4, 0);
    /// Memory attribute indirection register.
    MAIR_EL1 = (3, 0, 10, 2, 0);
    /// Auxiliary memory attribute indirection register.
    AMAIR_EL1 = (3, 0, 10, 3, 0);
    /// Vector base address (EL1).
    VBAR_EL1 = (3, 0, 12, 0, 0);
    /// Context ID.
    CONTEXTIDR_EL1 = (3, 0, 13, 0, 1);
    /// Software thread ID (EL1).
    TPIDR_EL1 = (3, 0, 13, 0, 4);
    /// Software thread ID (EL0).
    TPIDR_EL0 = (3, 3, 13, 0, 2);
    /// Read-only software thread ID (EL0).
    TPIDRRO_EL0 = (3, 3, 13, 0, 3);
    /// Cache size selection.
    CSSELR_EL1 = (3, 2, 0, 0, 0);
    /// Pointer-authentication key APIAKey, low half (FEAT_PAuth).
    APIAKEYLO_EL1 = (3, 0, 2, 1, 0);
    /// APIAKey, high half.
    APIAKEYHI_EL1 = (3, 0, 2, 1, 1);
    /// APIBKey, low half.
    APIBKEYLO_EL1 = (3, 0, 2, 1, 2);
    /// APIBKey, high half.
    APIBKEYHI_EL1 = (3, 0, 2, 1, 3);
    /// APDAKey, low half.
    APDAKEYLO_EL1 = (3, 0, 2, 2, 0);
    /// APDAKey, high half.
    APDAKEYHI_EL1 = (3, 0, 2, 2, 1);
    /// APDBKey, low half.
    APDBKEYLO_EL1 = (3, 0, 2, 2, 2);
    /// APDBKey, high half.
    APDBKEYHI_EL1 = (3, 0, 2, 2, 3);
    /// APGAKey, low half.
    APGAKEYLO_EL1 = (3, 0, 2, 3, 0);
    /// APGAKey, high half.
    APGAKEYHI_EL1 = (3, 0, 2, 3, 1);
    /// Monitor debug system control.
    MDSCR_EL1 = (2, 0, 0, 2, 2);
    /// Breakpoint 0 value.
    DBGBVR0_EL1 = (2, 0, 0, 0, 4);
    /// Breakpoint 0 control.
    DBGBCR0_EL1 = (2, 0, 0, 0, 5);
    /// Breakpoint 1 value.
    DBGBVR1_EL1 = (2, 0, 0, 1, 4);
    /// Breakpoint 1 control.
    DBGBCR1_EL1 = (2, 0, 0, 1, 5);
    /// Breakpoint 2 value.
    DBGBVR2_EL1 = (2, 0, 0, 2, 4);
    /// Breakpoint 2 control.
    DBGBCR2_EL1 = (2, 0, 0, 2, 5);
    /// Breakpoint 3 value.
    DBGBVR3_EL1 = (2, 0, 0, 3, 4);
    /// Breakpoint 3 control.
    DBGBCR3_EL1 = (2, 0, 0, 3, 5);
    /// Breakpoint 4 value.
    DBGBVR4_EL1 = (2, 0, 0, 4, 4);
    /// Breakpoint 4 control.
    DBGBCR4_EL1 = (2, 0, 0, 4, 5);
    /// Breakpoint 5 value.
    DBGBVR5_EL1 = (2, 0, 0, 5, 4);
    /// Breakpoint 5 control.
    DBGBCR5_EL1 = (2, 0, 0, 5, 5);
    /// Watchpoint 0 value.
    DBGWVR0_EL1 = (2, 0, 0, 0, 6);
    /// Watchpoint 0 control.
    DBGWCR0_EL1 = (2, 0, 0, 0, 7);
    /// Watchpoint 1 value.
    DBGWVR1_EL1 = (2, 0, 0, 1, 6);
    /// Watchpoint 1 control.
    DBGWCR1_EL1 = (2, 0, 0, 1, 7);
    /// Watchpoint 2 value.
    DBGWVR2_EL1 = (2, 0, 0, 2, 6);
    /// Watchpoint 2 control.
    DBGWCR2_EL1 = (2, 0, 0, 2, 7);
    /// Watchpoint 3 value.
    DBGWVR3_EL1 = (2, 0, 0, 3, 6);
    /// Watchpoint 3 control.
    DBGWCR3_EL1 = (2, 0, 0, 3, 7);
    /// OS lock access (write-only): OSLK = bit 0.
    OSLAR_EL1 = (2, 0, 1, 0, 4);
    /// OS lock status (read-only).
    OSLSR_EL1 = (2, 0, 1, 1, 4);
    /// OS double lock.
    OSDLR_EL1 = (2, 0, 1, 3, 4);
    /// Floating-point control register.
    FPCR = (3, 3, 4, 4, 0);
    /// Floating-point status register.
    FPSR = (3, 3, 4, 4, 1);
    /// Counter-timer kernel control.
    CNTKCTL_EL1 = (3, 0, 14, 1, 0);
    /// Counter-timer frequency (Hz).
    CNTFRQ_EL0 = (3, 3, 14, 0, 0);
    /// Physical count.
    CNTPCT_EL0 = (3, 3, 14, 0, 1);
    /// Virtual count (physical count minus CNTVOFF_EL2).
    CNTVCT_EL0 = (3, 3, 14, 0, 2);
    /// EL1 physical timer value.
    CNTP_TVAL_EL0 = (3, 3, 14, 2, 0);
    /// EL1 physical timer control.
    CNTP_CTL_EL0 = (3, 3, 14, 2, 1);
    /// EL1 physical timer compare value.
    CNTP_CVAL_EL0 = (3, 3, 14, 2, 2);
    /// Virtual timer value (signed 32-bit ticks until the compare value).
    CNTV_TVAL_EL0 = (3, 3, 14, 3, 0);
    /// Virtual timer control (ENABLE, IMASK, ISTATUS).
    CNTV_CTL_EL0 = (3, 3, 14, 3, 1);
    /// Virtual timer compare value (guest ticks).
    CNTV_CVAL_EL0 = (3, 3, 14, 3, 2);
    /// Virtual counter offset (EL2).
    CNTVOFF_EL2 = (3, 4, 14, 0, 3);
    /// Counter-timer hypervisor control (EL1 access to the physical counter
    /// and timer).
    CNTHCTL_EL2 = (3, 4, 14, 1, 0);
    /// Hypervisor configuration (RW, IMO, VI).
    HCR_EL2 = (3, 4, 1, 1, 0);
    /// Virtualization multiprocessor ID: what EL1 reads as MPIDR_EL1 with EL2
    /// present.
    VMPIDR_EL2 = (3, 4, 0, 0, 5);
    /// Secure configuration (NS, HCE, RW).
    SCR_EL3 = (3, 6, 1, 1, 0);
    /// GIC CPU interface: interrupt acknowledge, group 0.
    ICC_IAR0_EL1 = (3, 0, 12, 8, 0);
    /// GIC CPU interface: end of interrupt, group 0.
    ICC_EOIR0_EL1 = (3, 0, 12, 8, 1);
    /// GIC CPU interface: highest priority pending, group 0.
    ICC_HPPIR0_EL1 = (3, 0, 12, 8, 2);
    /// GIC CPU interface: binary point, group 0.
    ICC_BPR0_EL1 = (3, 0, 12, 8, 3);
    /// GIC CPU interface: active priorities group 0, register 0.
    ICC_AP0R0_EL1 = (3, 0, 12, 8, 4);
    /// GIC CPU interface: active priorities group 0, register 1.
    ICC_AP0R1_EL1 = (3, 0, 12, 8, 5);
    /// GIC CPU interface: active priorities group 0, register 2.
    ICC_AP0R2_EL1 = (3, 0, 12, 8, 6);
    /// GIC CPU interface: active priorities group 0, register 3.
    ICC_AP0R3_EL1 = (3, 0, 12, 8, 7);
    /// GIC CPU interface: active priorities group 1, register 0.
    ICC_AP1R0_EL1 = (3, 0, 12, 9, 0);
    /// GIC CPU interface: active priorities group 1, register 1.
    ICC_AP1R1_EL1 = (3, 0, 12, 9, 1);
    /// GIC CPU interface: active priorities group 1, register 2.
    ICC_AP1R2_EL1 = (3, 0, 12, 9, 2);
    /// GIC CPU interface: active priorities group 1, register 3.
    ICC_AP1R3_EL1 = (3, 0, 12, 9, 3);
    /// GIC CPU interface: deactivate interrupt.
    ICC_DIR_EL1 = (3, 0, 12, 11, 1);
    /// GIC CPU interface: running priority.
    ICC_RPR_EL1 = (3, 0, 12, 11, 3);
    /// GIC CPU interface: generate group 1 SGI.
    ICC_SGI1R_EL1 = (3, 0, 12, 11, 5);
    /// GIC CPU interface: generate alias group 1 SGI.
    ICC_ASGI1R_EL1 = (3, 0, 12, 11, 6);
    /// GIC CPU interface: generate group 0 SGI.
    ICC_SGI0R_EL1 = (3, 0, 12, 11, 7);
    /// GIC CPU interface: interrupt acknowledge, group 1.
    ICC_IAR1_EL1 = (3, 0, 12, 12, 0);
    /// GIC CPU interface: end of interrupt, group 1.
    ICC_EOIR1_EL1 = (3, 0, 12, 12, 1);
    /// GIC CPU interface: highest priority pending, group 1.
    ICC_HPPIR1_EL1 = (3, 0, 12, 12, 2);
    /// GIC CPU interface: binary point, group 1.
    ICC_BPR1_EL1 = (3, 0, 12, 12, 3);
    /// GIC CPU interface: control.
    ICC_CTLR_EL1 = (3, 0, 12, 12, 4);
    /// GIC CPU interface: system register enable.
    ICC_SRE_EL1 = (3, 0, 12, 12, 5);
    /// GIC CPU interface: group 0 enable.
    ICC_IGRPEN0_EL1 = (3, 0, 12, 12, 6);
    /// GIC CPU interface: group 1 enable.
    ICC_IGRPEN1_EL1 = (3, 0, 12, 12, 7);
    /// GIC CPU interface: priority mask.
    ICC_PMR_EL1 = (3, 0, 4, 6, 0);
}

/// The self-hosted debug registers a snapshot saves besides MDSCR_EL1: the
/// OS lock (OSLSR_EL1, whose OSLK a VMM may write) and the breakpoint and
/// watchpoint registers both backends implement, as many as
/// [`crate::arch::idregs`] advertises (6 breakpoints, 4 watchpoints),
/// values before controls.
pub const DEBUG_SYSREGS: [SysReg; 21] = [
    OSLSR_EL1,
    DBGBVR0_EL1,
    DBGBVR1_EL1,
    DBGBVR2_EL1,
    DBGBVR3_EL1,
    DBGBVR4_EL1,
    DBGBVR5_EL1,
    DBGWVR0_EL1,
    DBGWVR1_EL1,
    DBGWVR2_EL1,
    DBGWVR3_EL1,
    DBGBCR0_EL1,
    DBGBCR1_EL1,
    DBGBCR2_EL1,
    DBGBCR3_EL1,
    DBGBCR4_EL1,
    DBGBCR5_EL1,
    DBGWCR0_EL1,
    DBGWCR1_EL1,
    DBGWCR2_EL1,
    DBGWCR3_EL1,
];

/// The EL1 system registers a snapshot saves on every backend: the state a
/// Linux guest relies on (translation, exception, thread-ID, FP and timer
/// control registers) and the self-hosted debug state (MDSCR_EL1 and
/// [`DEBUG_SYSREGS`], last). The virtual timer's CNTV_CTL/CVAL are saved
/// apart, after the vtimer offset.
pub const EL1_STATE_SYSREGS: [SysReg; 48] = concat::<48>(&EL1_BASE_SYSREGS, &DEBUG_SYSREGS);

/// [`EL1_STATE_SYSREGS`] without [`DEBUG_SYSREGS`] (what machine states
/// before version 4 hold).
pub const EL1_BASE_SYSREGS: [SysReg; 27] = [
    MPIDR_EL1,
    SCTLR_EL1,
    CPACR_EL1,
    TTBR0_EL1,
    TTBR1_EL1,
    TCR_EL1,
    MAIR_EL1,
    AMAIR_EL1,
    VBAR_EL1,
    ESR_EL1,
    FAR_EL1,
    PAR_EL1,
    AFSR0_EL1,
    AFSR1_EL1,
    ELR_EL1,
    SPSR_EL1,
    SP_EL0,
    SP_EL1,
    TPIDR_EL0,
    TPIDR_EL1,
    TPIDRRO_EL0,
    CONTEXTIDR_EL1,
    CNTKCTL_EL1,
    CSSELR_EL1,
    MDSCR_EL1,
    FPCR,
    FPSR,
];

/// `a` followed by `b` (for building register lists at compile time; `N`
/// must be `a.len() + b.len()`).
pub const fn concat<const N: usize>(a: &[SysReg], b: &[SysReg]) -> [SysReg; N] {
    assert!(a.len() + b.len() == N);
    let mut out = [SysReg(0); N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[i + j] = b[j];
        j += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_matches_hvf_hv_sys_reg_t() {
        // Values of Hypervisor.framework's hv_sys_reg_t enum.
        assert_eq!(SCTLR_EL1.0, 0xc080);
        assert_eq!(TTBR1_EL1.0, 0xc101);
        assert_eq!(SP_EL1.0, 0xe208);
        assert_eq!(CNTV_CTL_EL0.0, 0xdf19);
        assert_eq!(CNTV_CVAL_EL0.0, 0xdf1a);
        assert_eq!(MDSCR_EL1.0, 0x8012);
    }

    #[test]
    fn fields_round_trip_and_names() {
        assert_eq!(ICC_SGI1R_EL1.fields(), (3, 0, 12, 11, 5));
        assert_eq!(format!("{:?}", ICC_IAR1_EL1), "ICC_IAR1_EL1");
        assert_eq!(
            format!("{:?}", SysReg::new(3, 1, 15, 2, 0)),
            "S3_1_C15_C2_0"
        );
        assert_eq!(format!("{OSLAR_EL1:?}"), "OSLAR_EL1");
    }

    #[test]
    fn one_name_per_encoding() {
        for (i, (reg, name)) in NAMES.iter().enumerate() {
            for (other, other_name) in &NAMES[i + 1..] {
                assert_ne!(reg, other, "{name} and {other_name} share an encoding");
                assert_ne!(name, other_name);
            }
        }
    }
}
