//! The ID register values both backends advertise to the guest: exactly
//! the features both of them implement.
//!
//! The `emu` backend answers the guest's `MRS` of these registers from
//! [`ADVERTISED`]; the HVF backend writes them with `hv_vcpu_set_sys_reg`
//! when it creates a vCPU (they are the ID registers `hv_sys_reg_t` lists).
//! Each value is the intersection of unicorn's Cortex-A72 model and the
//! Apple M-series cores Hypervisor.framework runs on: an Armv8.0 EL0/EL1
//! CPU with FP, AdvSIMD, AES/PMULL, SHA1, SHA2 and CRC32, the GICv3 system
//! registers, 4 KiB and 16 KiB granules, a 36-bit physical address space
//! (the machine's IPA size, [`crate::arch::layout::RAM_MAX`]), self-hosted
//! debug v8.0 with 6 breakpoints and 4 watchpoints, and no PMU: PMUVer = 0,
//! and the PMU registers ([`is_pmu`]) read as zero and ignore writes on both
//! backends. Field layouts: Arm ARM D23.2, the ID_AA64*_EL1 descriptions.

use super::sysreg::{self as sr, SysReg};

/// ID_AA64PFR0_EL1: EL0 = EL1 = 1 (AArch64 only), EL2 = EL3 = 0 (the guest
/// runs at EL1; its HVC and SMC reach the VMM), FP = AdvSIMD = 0
/// (implemented, no half precision), GIC = 1 (GICv3 system registers).
pub const PFR0: u64 = 0x0000_0000_0100_0011;
/// ID_AA64DFR0_EL1: DebugVer = 6 (Armv8.0 debug), TraceVer = 0, PMUVer = 0
/// (no PMU), BRPs = 5 (6 breakpoints), WRPs = 3 (4 watchpoints),
/// CTX_CMPs = 1 (2 context-aware breakpoints).
pub const DFR0: u64 = 0x0000_0000_1030_5006;
/// ID_AA64ISAR0_EL1: AES = 2 (with PMULL), SHA1 = 1, SHA2 = 1 (SHA256),
/// CRC32 = 1.
pub const ISAR0: u64 = 0x0000_0000_0001_1120;
/// ID_AA64MMFR0_EL1: PARange = 1 (36 bits), ASIDBits = 2 (16 bits),
/// BigEnd = SNSMem = BigEndEL0 = 0, TGran16 = 1, TGran64 = 0xF (not
/// supported: Apple cores lack it), TGran4 = 0.
pub const MMFR0: u64 = 0x0000_0000_0F10_0021;

/// Every ID register the VMM sets, with its value; registers of the ID
/// space not listed here read as 0 on `emu` (unicorn's Cortex-A72 has none
/// of their features) and as the host's value on HVF (see the conformance
/// chapter of the book).
pub const ADVERTISED: [(SysReg, u64); 9] = [
    (sr::ID_AA64PFR0_EL1, PFR0),
    (sr::ID_AA64PFR1_EL1, 0),
    (sr::ID_AA64DFR0_EL1, DFR0),
    (sr::ID_AA64DFR1_EL1, 0),
    (sr::ID_AA64ISAR0_EL1, ISAR0),
    (sr::ID_AA64ISAR1_EL1, 0),
    (sr::ID_AA64MMFR0_EL1, MMFR0),
    (sr::ID_AA64MMFR1_EL1, 0),
    (sr::ID_AA64MMFR2_EL1, 0),
];

/// The advertised value of `reg`, if it is one of [`ADVERTISED`].
pub fn advertised(reg: SysReg) -> Option<u64> {
    ADVERTISED.iter().find(|(r, _)| *r == reg).map(|&(_, v)| v)
}

/// The 4-bit ID field of `value` at bit `shift`.
pub const fn field(value: u64, shift: u32) -> u64 {
    (value >> shift) & 0xf
}

/// The number of breakpoints [`DFR0`] advertises (BRPs + 1).
pub const BREAKPOINTS: usize = field(DFR0, 12) as usize + 1;
/// The number of watchpoints [`DFR0`] advertises (WRPs + 1).
pub const WATCHPOINTS: usize = field(DFR0, 20) as usize + 1;

/// Whether the advertised CPU implements the stage-1 translation granule
/// (the guest kernel's page size) of `bytes`: 4 KiB, 16 KiB or 64 KiB, from
/// [`MMFR0`]'s TGran4 (bits 31:28, 0xF = not implemented), TGran16 (bits
/// 23:20, 0 = not implemented) and TGran64 (bits 27:24, 0xF = not
/// implemented). Other sizes: false.
pub const fn granule_supported(bytes: u64) -> bool {
    match bytes {
        0x1000 => field(MMFR0, 28) != 0xf,
        0x4000 => field(MMFR0, 20) != 0,
        0x1_0000 => field(MMFR0, 24) != 0xf,
        _ => false,
    }
}

/// Whether `reg` is a PMUv3 register: op0 = 3, CRn = 9, CRm = 12..=14
/// (PMCR_EL0 to PMOVSSET_EL0, PMUSERENR_EL0, PMINTEN*_EL1), or
/// `PMEVCNTR<n>`/`PMEVTYPER<n>`/PMCCFILTR_EL0 (op0 = 3, op1 = 3, CRn = 14,
/// CRm = 8..=15). Arm ARM D24.5. With no PMU advertised both backends make
/// them RAZ/WI, as QEMU's hvf does.
pub fn is_pmu(reg: SysReg) -> bool {
    let (op0, op1, crn, crm, _) = reg.fields();
    op0 == 3
        && ((crn == 9 && (12..=14).contains(&crm) && (op1 == 0 || op1 == 3))
            || (op1 == 3 && crn == 14 && crm >= 8))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::{RAM_BASE, RAM_MAX};

    #[test]
    fn exception_levels_aarch64_el0_el1_only() {
        assert_eq!(field(PFR0, 0), 1, "EL0 AArch64 only");
        assert_eq!(field(PFR0, 4), 1, "EL1 AArch64 only");
        assert_eq!(field(PFR0, 8), 0, "no EL2");
        assert_eq!(field(PFR0, 12), 0, "no EL3");
        assert_eq!(field(PFR0, 24), 1, "GICv3 system registers");
        assert_eq!((field(PFR0, 16), field(PFR0, 20)), (0, 0), "FP, AdvSIMD");
        // Nothing else: RAS, SVE, SEL2, AMU, DIT, CSV2/3 all 0.
        assert_eq!(PFR0 & !0x0f0f_00ff, 0);
    }

    #[test]
    fn no_pmu_and_v8_debug() {
        assert_eq!(field(DFR0, 8), 0, "PMUVer");
        assert_eq!(field(DFR0, 0), 6, "DebugVer v8.0");
        assert_eq!((BREAKPOINTS, WATCHPOINTS), (6, 4));
        assert_eq!(field(DFR0, 28), 1, "2 context-aware breakpoints");
    }

    #[test]
    fn granules_and_pa_range() {
        assert_eq!(field(MMFR0, 28), 0, "TGran4");
        assert_eq!(field(MMFR0, 20), 1, "TGran16");
        assert_eq!(field(MMFR0, 24), 0xf, "no TGran64");
        assert!(granule_supported(4 << 10) && granule_supported(16 << 10));
        assert!(!granule_supported(64 << 10) && !granule_supported(8 << 10));
        // PARange 1 = 36 bits covers all of RAM.
        assert_eq!(field(MMFR0, 0), 1);
        assert_eq!(RAM_BASE + RAM_MAX, 1 << 36);
        assert_eq!(field(MMFR0, 4), 2, "16-bit ASIDs");
    }

    #[test]
    fn table_is_the_id_register_space() {
        for (i, (reg, _)) in ADVERTISED.iter().enumerate() {
            let (op0, op1, crn, crm, _) = reg.fields();
            assert_eq!((op0, op1, crn), (3, 0, 0), "{reg:?}");
            assert!((4..=7).contains(&crm), "{reg:?}");
            assert!(ADVERTISED[i + 1..].iter().all(|(r, _)| r != reg));
        }
        assert_eq!(advertised(sr::ID_AA64ISAR0_EL1), Some(ISAR0));
        assert_eq!(advertised(sr::ID_AA64PFR1_EL1), Some(0));
        assert_eq!(advertised(sr::MIDR_EL1), None);
    }

    #[test]
    fn pmu_register_range() {
        assert!(is_pmu(SysReg::new(3, 3, 9, 12, 0))); // PMCR_EL0
        assert!(is_pmu(SysReg::new(3, 3, 9, 12, 4))); // PMSWINC_EL0
        assert!(is_pmu(SysReg::new(3, 3, 9, 13, 0))); // PMCCNTR_EL0
        assert!(is_pmu(SysReg::new(3, 3, 9, 14, 0))); // PMUSERENR_EL0
        assert!(is_pmu(SysReg::new(3, 0, 9, 14, 1))); // PMINTENSET_EL1
        assert!(is_pmu(SysReg::new(3, 3, 14, 8, 0))); // PMEVCNTR0_EL0
        assert!(is_pmu(SysReg::new(3, 3, 14, 15, 7))); // PMCCFILTR_EL0
        assert!(!is_pmu(sr::CNTV_CTL_EL0));
        assert!(!is_pmu(SysReg::new(3, 0, 9, 9, 0))); // PMSCR_EL1 (SPE)
    }
}
