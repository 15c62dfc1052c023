//! Recorded ESR_EL2 values for unit tests, hand-assembled from the Arm ARM
//! (DDI 0487) D24.2.41 field layout, shared by every test that decodes or
//! decides on an exit.
//!
//! ESR: EC [31:26], IL [25], ISS [24:0]. Data abort ISS: ISV [24], SAS
//! [23:22] (size 1 << SAS), SSE [21], SRT [20:16], SF [15], AR [14], CM [8],
//! S1PTW [7], WnR [6], DFSC [5:0]. EC 0x24 (data abort from a lower EL: the
//! guest) = 0x9000_0000, IL = 0x0200_0000, ISV = 0x0100_0000. DFSC 0b000111
//! = translation fault at level 3 (MMIO holes are unmapped at stage 2),
//! 0b001111 = permission fault at level 3 (a write-protected RAM page).
//! System-register trap ISS (EC 0x18 = 0x6000_0000): Op0 [21:20], Op2
//! [19:17], Op1 [16:14], CRn [13:10], Rt [9:5], CRm [4:1], Direction [0]
//! (1 = MRS).

/// `ldrb w1, [x0]`: SAS=0, SRT=1 (0x1_0000).
pub(crate) const LDRB_W1: u64 = 0x9301_0007;
/// `ldrh w2, [x0]`: SAS=1 (0x40_0000), SRT=2.
pub(crate) const LDRH_W2: u64 = 0x9342_0007;
/// `ldr w3, [x0]`: SAS=2 (0x80_0000), SRT=3.
pub(crate) const LDR_W3: u64 = 0x9383_0007;
/// `ldr x4, [x0]`: SAS=3 (0xC0_0000), SRT=4, SF (0x8000).
pub(crate) const LDR_X4: u64 = 0x93C4_8007;
/// `ldrsb x5, [x0]`: SAS=0, SSE (0x20_0000), SRT=5, SF.
pub(crate) const LDRSB_X5: u64 = 0x9325_8007;
/// `ldrsb w8, [x0]`: SAS=0, SSE, SRT=8, SF=0.
pub(crate) const LDRSB_W8: u64 = 0x9328_0007;
/// `ldrsh w6, [x0]`: SAS=1, SSE, SRT=6, SF=0.
pub(crate) const LDRSH_W6: u64 = 0x9366_0007;
/// `ldrsw x7, [x0]`: SAS=2, SSE, SRT=7, SF.
pub(crate) const LDRSW_X7: u64 = 0x93A7_8007;
/// `strb w1, [x0]`: as LDRB_W1 plus WnR (0x40).
pub(crate) const STRB_W1: u64 = 0x9301_0047;
/// `strh w2, [x0]`.
pub(crate) const STRH_W2: u64 = 0x9342_0047;
/// `str w3, [x0]`.
pub(crate) const STR_W3: u64 = 0x9383_0047;
/// `str x4, [x0]`: SF set.
pub(crate) const STR_X4: u64 = 0x93C4_8047;
/// `str xzr, [x0]`: SAS=3, SRT=31 (0x1F_0000), SF, WnR.
pub(crate) const STR_XZR: u64 = 0x93DF_8047;
/// `ldp x0, x1, [x2]` on MMIO: no single transfer register, ISV=0; DFSC
/// translation level 2 (0b000110).
pub(crate) const LDP_NO_ISV: u64 = 0x9200_0006;
/// `str x1, [x0]` on a write-protected RAM page: SAS=3, SRT=1, SF, WnR,
/// DFSC permission level 3.
pub(crate) const STR_X1_PERM: u64 = 0x93C1_804F;
/// `stp x0, x1, [x2]` on a write-protected page: ISV=0, WnR, permission
/// level 3.
pub(crate) const STP_PERM: u64 = 0x9200_004F;
/// Hardware access-flag update by the stage-1 walker on a protected page
/// table: S1PTW (0x80), WnR, permission level 3.
pub(crate) const S1PTW_PERM: u64 = 0x9200_00CF;
/// A stage-1 walk reading an unmapped IPA: S1PTW, translation level 3.
pub(crate) const S1PTW_TRANSLATION: u64 = 0x9200_0087;
/// `dc civac, x0` on MMIO: CM (0x100) and WnR (cache maintenance reports
/// WnR=1), ISV=0, translation level 3.
pub(crate) const DC_CIVAC_MMIO: u64 = 0x9200_0147;
/// A data abort with an external abort status (DFSC 0b010000).
pub(crate) const SEA_MMIO: u64 = 0x9200_0010;
/// Instruction fetch from an unmapped IPA: EC 0x20 (0x8000_0000) | IL |
/// IFSC translation level 3.
pub(crate) const IABT_L3: u64 = 0x8200_0007;
/// `mrs x5, icc_iar1_el1`: Op0=3, Op1=0, CRn=12, CRm=12, Op2=0, Rt=5.
pub(crate) const MRS_X5_IAR1: u64 = 0x6230_30B9;
/// `msr icc_eoir1_el1, x3`: Op2=1, Rt=3, Direction=0.
pub(crate) const MSR_EOIR1_X3: u64 = 0x6232_3078;
/// `msr pmuserenr_el0, xzr` (Linux `__cpu_setup`): Op0=3 (0x30_0000),
/// Op1=3 (0xC000), CRn=9 (0x2400), Rt=31 (0x3E0), CRm=14 (0x1C).
pub(crate) const MSR_PMUSERENR_XZR: u64 = 0x6230_E7FC;
/// `mrs x2, pmcr_el0`: Op1=3, CRn=9, CRm=12 (0x18), Rt=2 (0x40), read.
pub(crate) const MRS_X2_PMCR: u64 = 0x6230_E459;
/// `msr oslar_el1, x0`: Op0=2 (0x20_0000), Op2=4 (0x8_0000), CRn=1
/// (0x400), CRm=0.
pub(crate) const MSR_OSLAR_X0: u64 = 0x6228_0400;
/// `mrs x1, oslar_el1` (write-only register): Rt=1 (0x20), read.
pub(crate) const MRS_X1_OSLAR: u64 = 0x6228_0421;
/// `mrs x1, oslsr_el1`: CRm=1 (0x2), Rt=1, read.
pub(crate) const MRS_X1_OSLSR: u64 = 0x6228_0423;
/// `msr osdlr_el1, x0`: CRm=3 (0x6).
pub(crate) const MSR_OSDLR_X0: u64 = 0x6228_0406;
/// `mrs x0, cntpct_el0`: Op0=3, Op2=1 (0x2_0000), Op1=3, CRn=14
/// (0x3800), CRm=0, Rt=0, read.
pub(crate) const MRS_X0_CNTPCT: u64 = 0x6232_F801;
/// `mrs x2, id_aa64isar2_el1` (3,0,0,6,2): Op2=2 (0x4_0000), Rt=2, CRm=6
/// (0xC), read.
pub(crate) const MRS_X2_ISAR2: u64 = 0x6234_004D;
/// `msr id_aa64mmfr0_el1, x2` (read-only register): CRm=7 (0xE), Rt=2.
pub(crate) const MSR_MMFR0_X2: u64 = 0x6230_004E;
/// `hvc #0` (PSCI call): EC 0x16 (0x5800_0000) | IL.
pub(crate) const HVC_0: u64 = 0x5A00_0000;
/// `smc #0`: EC 0x17 (0x5C00_0000) | IL.
pub(crate) const SMC_0: u64 = 0x5E00_0000;
/// `wfi`: EC 0x01 (0x0400_0000) | IL, TI=0b00.
pub(crate) const WFI: u64 = 0x0600_0000;
/// `wfe`: TI=0b01.
pub(crate) const WFE: u64 = 0x0600_0001;
/// `wfit x7`: TI=0b10, RV (0x4), Rn=7 (0xE0).
pub(crate) const WFIT_X7: u64 = 0x0600_00E6;
/// `brk #0x800` (Linux BUG()): EC 0x3C (0xF000_0000) | IL | 0x800.
pub(crate) const BRK_BUG: u64 = 0xF200_0800;
/// `ldr w1, [x0]` (EL1 -> EL2), stage-2 translation fault level 2:
/// EC 0x24 (0x9000_0000) | IL (0x0200_0000) | ISV (0x0100_0000) |
/// SAS=0b10 (0x0080_0000) | SRT=1 (0x0001_0000) | DFSC 0b000110.
pub(crate) const LDR_W1: u64 = 0x9381_0006;
/// `strb w3, [x0]`: SAS=0b00, SRT=3 (0x0003_0000), WnR (0x40), DFSC
/// translation level 3 (0b000111).
pub(crate) const STRB_W3: u64 = 0x9303_0047;
/// `ldrsh x2, [x0]`: SAS=0b01 (0x0040_0000), SSE (0x0020_0000), SRT=2
/// (0x0002_0000), SF (0x8000), DFSC 0b000110.
pub(crate) const LDRSH_X2: u64 = 0x9362_8006;
/// ESR_EL1 of a kernel write hitting a read-only mapping: EC 0x25
/// (0x9400_0000) | IL | WnR | DFSC 0b001111, ISV=0.
pub(crate) const EL1_PERM_WRITE: u64 = 0x9600_004F;
/// `svc #0` from EL0 as Linux reports it: EC 0x15 (0x5400_0000) | IL.
pub(crate) const SVC_0: u64 = 0x5600_0000;
/// UNDEFINED instruction: EC 0 | IL.
pub(crate) const UNDEF: u64 = 0x0200_0000;
/// Kernel instruction fetch from an unmapped address: EC 0x21
/// (0x8400_0000) | IL | IFSC translation level 3.
pub(crate) const IABT_EL1_L3: u64 = 0x8600_0007;
