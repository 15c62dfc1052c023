//! The few Arm architecture encodings the simulator reports in its exits,
//! written from the Arm ARM (DDI 0487): ESR_EL2 (D24.2.41) with the ISS of
//! a data abort (D24.2.41.12), a trapped `MSR`/`MRS` (EC 0x18) and `HVC`,
//! and system-register encodings (op0:op1:CRn:CRm:op2, as
//! `hv_sys_reg_t` packs them). Kept apart from the VMM's own decoder so a
//! test never checks the VMM against itself.

/// ESR.EC of a data abort from a lower exception level.
pub const EC_DATA_ABORT_LOWER: u64 = 0x24;
/// ESR.EC of `HVC` in AArch64 state.
pub const EC_HVC64: u64 = 0x16;
/// ESR.EC of `SMC` in AArch64 state.
pub const EC_SMC64: u64 = 0x17;
/// ESR.EC of a trapped `MSR`, `MRS` or system instruction.
pub const EC_SYSREG: u64 = 0x18;
/// ESR.EC of a trapped `WFI`/`WFE`.
pub const EC_WFX: u64 = 0x01;

/// ESR.IL: a 32-bit instruction.
pub const IL: u64 = 1 << 25;

/// DFSC of a translation fault at level 3.
pub const DFSC_TRANSLATION_L3: u64 = 0b00_0111;
/// DFSC of a permission fault at level 3.
pub const DFSC_PERMISSION_L3: u64 = 0b00_1111;

/// ESR.EC of `esr`.
pub const fn ec(esr: u64) -> u64 {
    (esr >> 26) & 0x3f
}

/// A data abort from EL1 with a valid instruction syndrome (ISV = 1): an
/// access of `size` bytes (1, 2, 4 or 8) with transfer register `rt`, a
/// store if `write`, 64-bit register width (SF) for 8-byte accesses, no
/// sign extension, fault status `dfsc`.
pub const fn data_abort(size: u8, rt: u8, write: bool, dfsc: u64) -> u64 {
    let sas = match size {
        1 => 0,
        2 => 1,
        4 => 2,
        _ => 3,
    };
    EC_DATA_ABORT_LOWER << 26
        | IL
        | 1 << 24 // ISV
        | sas << 22
        | ((rt as u64) & 0x1f) << 16
        | (if size == 8 { 1 << 15 } else { 0 }) // SF
        | (if write { 1 << 6 } else { 0 }) // WnR
        | dfsc
}

/// `HVC #imm` (EC 0x16, IL = 1, ISS = the immediate).
pub const fn hvc(imm: u16) -> u64 {
    EC_HVC64 << 26 | IL | imm as u64
}

/// `SMC #imm` (EC 0x17, IL = 1, ISS = the immediate).
pub const fn smc(imm: u16) -> u64 {
    EC_SMC64 << 26 | IL | imm as u64
}

/// `WFI` (EC 0x01, TI = 0b00).
pub const fn wfi() -> u64 {
    EC_WFX << 26 | IL
}

/// A trapped `MRS Xt, reg` (`read`) or `MSR reg, Xt` (EC 0x18): ISS is
/// Op0 [21:20], Op2 [19:17], Op1 [16:14], CRn [13:10], Rt [9:5], CRm [4:1],
/// Direction [0] (1 = read).
pub const fn sysreg_access(reg: u16, rt: u8, read: bool) -> u64 {
    let reg = reg as u64;
    let op0 = (reg >> 14) & 0x3;
    let op1 = (reg >> 11) & 0x7;
    let crn = (reg >> 7) & 0xf;
    let crm = (reg >> 3) & 0xf;
    let op2 = reg & 0x7;
    EC_SYSREG << 26
        | IL
        | op0 << 20
        | op2 << 17
        | op1 << 14
        | crn << 10
        | ((rt as u64) & 0x1f) << 5
        | crm << 1
        | read as u64
}

/// A system register's op0:op1:CRn:CRm:op2 packing (`hv_sys_reg_t`'s).
pub const fn sysreg(op0: u16, op1: u16, crn: u16, crm: u16, op2: u16) -> u16 {
    op0 << 14 | op1 << 11 | crn << 7 | crm << 3 | op2
}

/// CNTPCT_EL0, the physical count.
pub const CNTPCT_EL0: u16 = sysreg(3, 3, 14, 0, 1);
/// CNTVCT_EL0, the virtual count (physical count minus CNTVOFF_EL2).
pub const CNTVCT_EL0: u16 = sysreg(3, 3, 14, 0, 2);
/// CNTP_TVAL_EL0.
pub const CNTP_TVAL_EL0: u16 = sysreg(3, 3, 14, 2, 0);
/// CNTP_CTL_EL0.
pub const CNTP_CTL_EL0: u16 = sysreg(3, 3, 14, 2, 1);
/// CNTP_CVAL_EL0.
pub const CNTP_CVAL_EL0: u16 = sysreg(3, 3, 14, 2, 2);
/// OSLAR_EL1.
pub const OSLAR_EL1: u16 = sysreg(2, 0, 1, 0, 4);
/// OSLSR_EL1.
pub const OSLSR_EL1: u16 = sysreg(2, 0, 1, 1, 4);
/// OSDLR_EL1.
pub const OSDLR_EL1: u16 = sysreg(2, 0, 1, 3, 4);
/// ICC_PMR_EL1.
pub const ICC_PMR_EL1: u16 = sysreg(3, 0, 4, 6, 0);
/// ICC_SGI1R_EL1.
pub const ICC_SGI1R_EL1: u16 = sysreg(3, 0, 12, 11, 5);

/// Whether `reg` is a GIC CPU-interface register accessed through the
/// system-register interface at EL1 (`ICC_*_EL1`: op0 = 3, op1 = 0, CRn =
/// 12 with CRm 8 to 12, or ICC_PMR_EL1).
pub const fn is_icc_el1(reg: u16) -> bool {
    let (op0, op1, crn, crm) = (
        reg >> 14,
        (reg >> 11) & 7,
        (reg >> 7) & 0xf,
        (reg >> 3) & 0xf,
    );
    reg == ICC_PMR_EL1 || (op0 == 3 && op1 == 0 && crn == 12 && crm >= 8 && crm <= 12)
}

/// CNTV_CTL_EL0.ENABLE.
pub const CNTV_CTL_ENABLE: u64 = 1 << 0;
/// CNTV_CTL_EL0.IMASK.
pub const CNTV_CTL_IMASK: u64 = 1 << 1;
/// CNTV_CTL_EL0.ISTATUS (read-only).
pub const CNTV_CTL_ISTATUS: u64 = 1 << 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_arm_arm() {
        // The hv_sys_reg_t values of two timer registers follow the packing.
        assert_eq!(
            sysreg(3, 3, 14, 3, 1),
            crate::apple::HV_SYS_REG_CNTV_CTL_EL0
        );
        assert_eq!(
            sysreg(3, 3, 14, 3, 2),
            crate::apple::HV_SYS_REG_CNTV_CVAL_EL0
        );
        // STR W1, [X0] faulting on a write-protected page: EC 0x24, IL, ISV,
        // SAS = 0b10, SRT = 1, WnR, DFSC = permission level 3.
        assert_eq!(data_abort(4, 1, true, DFSC_PERMISSION_L3), 0x9381_004f);
        // LDR X5, [X1] from an unmapped page: SAS = 0b11, SF.
        assert_eq!(data_abort(8, 5, false, DFSC_TRANSLATION_L3), 0x93c5_8007);
        assert_eq!(hvc(0), 0x5a00_0000);
        assert_eq!(ec(wfi()), EC_WFX);
        // MRS X3, CNTPCT_EL0: Op0 3, Op2 1, Op1 3, CRn 14, Rt 3, CRm 0, read.
        assert_eq!(sysreg_access(CNTPCT_EL0, 3, true), 0x6232_f861);
        assert!(is_icc_el1(ICC_SGI1R_EL1) && is_icc_el1(ICC_PMR_EL1));
        assert!(!is_icc_el1(CNTPCT_EL0));
    }
}
