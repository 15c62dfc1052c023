//! Register identifiers: our [`Reg`]/[`SysReg`] to Hypervisor.framework's
//! `hv_reg_t`, `hv_simd_fp_reg_t` and `hv_sys_reg_t`.
//!
//! `hv_sys_reg_t` is a C enum: only its listed values may be passed, so the
//! translation is a table, and compile-time assertions check that our
//! [`SysReg`] packing equals HVF's value for every register both name.

use crate::arch::idregs;
use crate::arch::sysreg::{self, SysReg};
use crate::hv::Reg;
use applevisor_sys::{hv_reg_t, hv_simd_fp_reg_t, hv_sys_reg_t};

/// `X0`..`X30` in index order.
const XREGS: [hv_reg_t; 31] = [
    hv_reg_t::X0,
    hv_reg_t::X1,
    hv_reg_t::X2,
    hv_reg_t::X3,
    hv_reg_t::X4,
    hv_reg_t::X5,
    hv_reg_t::X6,
    hv_reg_t::X7,
    hv_reg_t::X8,
    hv_reg_t::X9,
    hv_reg_t::X10,
    hv_reg_t::X11,
    hv_reg_t::X12,
    hv_reg_t::X13,
    hv_reg_t::X14,
    hv_reg_t::X15,
    hv_reg_t::X16,
    hv_reg_t::X17,
    hv_reg_t::X18,
    hv_reg_t::X19,
    hv_reg_t::X20,
    hv_reg_t::X21,
    hv_reg_t::X22,
    hv_reg_t::X23,
    hv_reg_t::X24,
    hv_reg_t::X25,
    hv_reg_t::X26,
    hv_reg_t::X27,
    hv_reg_t::X28,
    hv_reg_t::X29,
    hv_reg_t::X30,
];

/// `Q0`..`Q31` (the 128-bit views of `V0`..`V31`) in index order.
const QREGS: [hv_simd_fp_reg_t; 32] = [
    hv_simd_fp_reg_t::Q0,
    hv_simd_fp_reg_t::Q1,
    hv_simd_fp_reg_t::Q2,
    hv_simd_fp_reg_t::Q3,
    hv_simd_fp_reg_t::Q4,
    hv_simd_fp_reg_t::Q5,
    hv_simd_fp_reg_t::Q6,
    hv_simd_fp_reg_t::Q7,
    hv_simd_fp_reg_t::Q8,
    hv_simd_fp_reg_t::Q9,
    hv_simd_fp_reg_t::Q10,
    hv_simd_fp_reg_t::Q11,
    hv_simd_fp_reg_t::Q12,
    hv_simd_fp_reg_t::Q13,
    hv_simd_fp_reg_t::Q14,
    hv_simd_fp_reg_t::Q15,
    hv_simd_fp_reg_t::Q16,
    hv_simd_fp_reg_t::Q17,
    hv_simd_fp_reg_t::Q18,
    hv_simd_fp_reg_t::Q19,
    hv_simd_fp_reg_t::Q20,
    hv_simd_fp_reg_t::Q21,
    hv_simd_fp_reg_t::Q22,
    hv_simd_fp_reg_t::Q23,
    hv_simd_fp_reg_t::Q24,
    hv_simd_fp_reg_t::Q25,
    hv_simd_fp_reg_t::Q26,
    hv_simd_fp_reg_t::Q27,
    hv_simd_fp_reg_t::Q28,
    hv_simd_fp_reg_t::Q29,
    hv_simd_fp_reg_t::Q30,
    hv_simd_fp_reg_t::Q31,
];

/// The `hv_reg_t` of a general-purpose or special register; `None` for
/// `X(n)` with `n > 30`.
pub(super) fn hv_reg(reg: Reg) -> Option<hv_reg_t> {
    match reg {
        Reg::X(n) => XREGS.get(usize::from(n)).copied(),
        Reg::Pc => Some(hv_reg_t::PC),
        Reg::Pstate => Some(hv_reg_t::CPSR),
    }
}

/// The `hv_simd_fp_reg_t` of `Q<n>`; `None` for `n > 31`.
pub(super) fn hv_simd_reg(n: u8) -> Option<hv_simd_fp_reg_t> {
    QREGS.get(usize::from(n)).copied()
}

/// FPCR and FPSR are system registers architecturally but `hv_reg_t` values
/// in HVF.
pub(super) fn hv_fp_status_reg(reg: SysReg) -> Option<hv_reg_t> {
    if reg == sysreg::FPCR {
        Some(hv_reg_t::FPCR)
    } else if reg == sysreg::FPSR {
        Some(hv_reg_t::FPSR)
    } else {
        None
    }
}

macro_rules! hv_sysregs {
    ($($name:ident),* $(,)?) => {
        /// Every system register [`super::HvfVcpu`] reads and writes through
        /// `hv_vcpu_get_sys_reg`/`hv_vcpu_set_sys_reg` (the macOS 11 set; the
        /// ID registers are written once, at creation), plus FPCR and FPSR.
        pub const HVF_SYSREGS: &[SysReg] = &[
            $(SysReg(hv_sys_reg_t::$name as u16),)*
            sysreg::FPCR,
            sysreg::FPSR,
        ];

        /// The `hv_sys_reg_t` with the same encoding as `reg`, if HVF has one.
        pub(super) fn hv_sys_reg(reg: SysReg) -> Option<hv_sys_reg_t> {
            $(
                if reg.0 == hv_sys_reg_t::$name as u16 {
                    return Some(hv_sys_reg_t::$name);
                }
            )*
            None
        }
    };
}

hv_sysregs!(
    DBGBVR0_EL1,
    DBGBCR0_EL1,
    DBGWVR0_EL1,
    DBGWCR0_EL1,
    DBGBVR1_EL1,
    DBGBCR1_EL1,
    DBGWVR1_EL1,
    DBGWCR1_EL1,
    MDCCINT_EL1,
    MDSCR_EL1,
    DBGBVR2_EL1,
    DBGBCR2_EL1,
    DBGWVR2_EL1,
    DBGWCR2_EL1,
    DBGBVR3_EL1,
    DBGBCR3_EL1,
    DBGWVR3_EL1,
    DBGWCR3_EL1,
    DBGBVR4_EL1,
    DBGBCR4_EL1,
    DBGWVR4_EL1,
    DBGWCR4_EL1,
    DBGBVR5_EL1,
    DBGBCR5_EL1,
    DBGWVR5_EL1,
    DBGWCR5_EL1,
    DBGBVR6_EL1,
    DBGBCR6_EL1,
    DBGWVR6_EL1,
    DBGWCR6_EL1,
    DBGBVR7_EL1,
    DBGBCR7_EL1,
    DBGWVR7_EL1,
    DBGWCR7_EL1,
    DBGBVR8_EL1,
    DBGBCR8_EL1,
    DBGWVR8_EL1,
    DBGWCR8_EL1,
    DBGBVR9_EL1,
    DBGBCR9_EL1,
    DBGWVR9_EL1,
    DBGWCR9_EL1,
    DBGBVR10_EL1,
    DBGBCR10_EL1,
    DBGWVR10_EL1,
    DBGWCR10_EL1,
    DBGBVR11_EL1,
    DBGBCR11_EL1,
    DBGWVR11_EL1,
    DBGWCR11_EL1,
    DBGBVR12_EL1,
    DBGBCR12_EL1,
    DBGWVR12_EL1,
    DBGWCR12_EL1,
    DBGBVR13_EL1,
    DBGBCR13_EL1,
    DBGWVR13_EL1,
    DBGWCR13_EL1,
    DBGBVR14_EL1,
    DBGBCR14_EL1,
    DBGWVR14_EL1,
    DBGWCR14_EL1,
    DBGBVR15_EL1,
    DBGBCR15_EL1,
    DBGWVR15_EL1,
    DBGWCR15_EL1,
    MIDR_EL1,
    MPIDR_EL1,
    ID_AA64PFR0_EL1,
    ID_AA64PFR1_EL1,
    ID_AA64DFR0_EL1,
    ID_AA64DFR1_EL1,
    ID_AA64ISAR0_EL1,
    ID_AA64ISAR1_EL1,
    ID_AA64MMFR0_EL1,
    ID_AA64MMFR1_EL1,
    ID_AA64MMFR2_EL1,
    SCTLR_EL1,
    CPACR_EL1,
    TTBR0_EL1,
    TTBR1_EL1,
    TCR_EL1,
    APIAKEYLO_EL1,
    APIAKEYHI_EL1,
    APIBKEYLO_EL1,
    APIBKEYHI_EL1,
    APDAKEYLO_EL1,
    APDAKEYHI_EL1,
    APDBKEYLO_EL1,
    APDBKEYHI_EL1,
    APGAKEYLO_EL1,
    APGAKEYHI_EL1,
    SPSR_EL1,
    ELR_EL1,
    SP_EL0,
    AFSR0_EL1,
    AFSR1_EL1,
    ESR_EL1,
    FAR_EL1,
    PAR_EL1,
    MAIR_EL1,
    AMAIR_EL1,
    VBAR_EL1,
    CONTEXTIDR_EL1,
    TPIDR_EL1,
    CNTKCTL_EL1,
    CSSELR_EL1,
    TPIDR_EL0,
    TPIDRRO_EL0,
    CNTV_CTL_EL0,
    CNTV_CVAL_EL0,
    SP_EL1,
);

/// The system registers of a vCPU snapshot on HVF: the EL1 state a Linux
/// guest uses (translation, exception, thread-ID, timer and debug-control
/// registers, FPCR/FPSR, MPIDR) plus the pointer-authentication keys, which
/// a PAuth-enabled kernel needs back to return through signed addresses.
pub const SNAPSHOT_SYSREGS: &[SysReg] = &sysreg::concat::<58>(
    &sysreg::EL1_STATE_SYSREGS,
    &[
        sysreg::APIAKEYLO_EL1,
        sysreg::APIAKEYHI_EL1,
        sysreg::APIBKEYLO_EL1,
        sysreg::APIBKEYHI_EL1,
        sysreg::APDAKEYLO_EL1,
        sysreg::APDAKEYHI_EL1,
        sysreg::APDBKEYLO_EL1,
        sysreg::APDBKEYHI_EL1,
        sysreg::APGAKEYLO_EL1,
        sysreg::APGAKEYHI_EL1,
    ],
);

// Every register a snapshot saves is one HVF reads and writes, but
// OSLSR_EL1, which the VMM emulates (`exits::LocalState`).
const _: () = {
    let mut i = 0;
    while i < SNAPSHOT_SYSREGS.len() {
        if SNAPSHOT_SYSREGS[i].0 == sysreg::OSLSR_EL1.0 {
            i += 1;
            continue;
        }
        let mut j = 0;
        while HVF_SYSREGS[j].0 != SNAPSHOT_SYSREGS[i].0 {
            j += 1;
            assert!(j < HVF_SYSREGS.len(), "a snapshot register HVF lacks");
        }
        i += 1;
    }
};

// Every ID register both backends advertise is one HVF can set.
const _: () = {
    let mut i = 0;
    while i < idregs::ADVERTISED.len() {
        let mut j = 0;
        while HVF_SYSREGS[j].0 != idregs::ADVERTISED[i].0 .0 {
            j += 1;
            assert!(j < HVF_SYSREGS.len(), "an advertised ID register HVF lacks");
        }
        i += 1;
    }
};

macro_rules! same_encoding {
    ($($ours:path => $hv:ident),* $(,)?) => {
        $(const _: () = assert!($ours.0 == hv_sys_reg_t::$hv as u16);)*
    };
}

// Our (op0, op1, CRn, CRm, op2) packing is hv_sys_reg_t's.
same_encoding!(
    sysreg::MIDR_EL1 => MIDR_EL1,
    sysreg::MPIDR_EL1 => MPIDR_EL1,
    sysreg::ID_AA64PFR0_EL1 => ID_AA64PFR0_EL1,
    sysreg::ID_AA64PFR1_EL1 => ID_AA64PFR1_EL1,
    sysreg::ID_AA64DFR0_EL1 => ID_AA64DFR0_EL1,
    sysreg::ID_AA64DFR1_EL1 => ID_AA64DFR1_EL1,
    sysreg::ID_AA64ISAR0_EL1 => ID_AA64ISAR0_EL1,
    sysreg::ID_AA64ISAR1_EL1 => ID_AA64ISAR1_EL1,
    sysreg::ID_AA64MMFR0_EL1 => ID_AA64MMFR0_EL1,
    sysreg::ID_AA64MMFR1_EL1 => ID_AA64MMFR1_EL1,
    sysreg::ID_AA64MMFR2_EL1 => ID_AA64MMFR2_EL1,
    sysreg::SCTLR_EL1 => SCTLR_EL1,
    sysreg::CPACR_EL1 => CPACR_EL1,
    sysreg::TTBR0_EL1 => TTBR0_EL1,
    sysreg::TTBR1_EL1 => TTBR1_EL1,
    sysreg::TCR_EL1 => TCR_EL1,
    sysreg::SPSR_EL1 => SPSR_EL1,
    sysreg::ELR_EL1 => ELR_EL1,
    sysreg::SP_EL0 => SP_EL0,
    sysreg::SP_EL1 => SP_EL1,
    sysreg::AFSR0_EL1 => AFSR0_EL1,
    sysreg::AFSR1_EL1 => AFSR1_EL1,
    sysreg::ESR_EL1 => ESR_EL1,
    sysreg::FAR_EL1 => FAR_EL1,
    sysreg::PAR_EL1 => PAR_EL1,
    sysreg::MAIR_EL1 => MAIR_EL1,
    sysreg::AMAIR_EL1 => AMAIR_EL1,
    sysreg::VBAR_EL1 => VBAR_EL1,
    sysreg::CONTEXTIDR_EL1 => CONTEXTIDR_EL1,
    sysreg::TPIDR_EL1 => TPIDR_EL1,
    sysreg::TPIDR_EL0 => TPIDR_EL0,
    sysreg::TPIDRRO_EL0 => TPIDRRO_EL0,
    sysreg::CSSELR_EL1 => CSSELR_EL1,
    sysreg::MDSCR_EL1 => MDSCR_EL1,
    sysreg::CNTKCTL_EL1 => CNTKCTL_EL1,
    sysreg::CNTV_CTL_EL0 => CNTV_CTL_EL0,
    sysreg::CNTV_CVAL_EL0 => CNTV_CVAL_EL0,
    sysreg::APIAKEYLO_EL1 => APIAKEYLO_EL1,
    sysreg::APIAKEYHI_EL1 => APIAKEYHI_EL1,
    sysreg::APIBKEYLO_EL1 => APIBKEYLO_EL1,
    sysreg::APIBKEYHI_EL1 => APIBKEYHI_EL1,
    sysreg::APDAKEYLO_EL1 => APDAKEYLO_EL1,
    sysreg::APDAKEYHI_EL1 => APDAKEYHI_EL1,
    sysreg::APDBKEYLO_EL1 => APDBKEYLO_EL1,
    sysreg::APDBKEYHI_EL1 => APDBKEYHI_EL1,
    sysreg::APGAKEYLO_EL1 => APGAKEYLO_EL1,
    sysreg::APGAKEYHI_EL1 => APGAKEYHI_EL1,
);
