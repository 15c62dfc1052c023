//! Taking a synchronous exception to EL1 in AArch64 (Arm ARM D1.3, pseudocode
//! `AArch64.TakeException`), as a pure computation shared by every backend
//! that delivers exceptions itself: `emu` (unicorn reports them to the VMM
//! instead of taking them) and the HVF exit handling (UNDEFINED for refused
//! system registers, external aborts for failed MMIO).

/// PSTATE.M\[4\] (nRW): the interrupted state was AArch32.
pub const PSTATE_NRW: u64 = 1 << 4;
/// PSTATE.SP (M\[0\] in AArch64 state): SP_ELx selected.
pub const PSTATE_SP: u64 = 1 << 0;
/// PSTATE.{D,A,I,F}, bits 9..6.
pub const PSTATE_DAIF: u64 = 0xf << 6;
/// PSTATE.BTYPE, bits 11..10.
pub const PSTATE_BTYPE: u64 = 0b11 << 10;
/// PSTATE.SSBS, bit 12.
pub const PSTATE_SSBS: u64 = 1 << 12;
/// PSTATE.IL, bit 20.
pub const PSTATE_IL: u64 = 1 << 20;
/// PSTATE.SS, bit 21.
pub const PSTATE_SS: u64 = 1 << 21;
/// PSTATE.PAN, bit 22.
pub const PSTATE_PAN: u64 = 1 << 22;
/// PSTATE.UAO, bit 23.
pub const PSTATE_UAO: u64 = 1 << 23;
/// PSTATE.M\[4:0\] = EL1h (AArch64, EL1, SP_EL1).
pub const PSTATE_EL1H: u64 = 0b0_0101;
/// SCTLR_EL1.M, bit 0: stage 1 address translation (the MMU) enabled.
pub const SCTLR_M: u64 = 1 << 0;
/// SCTLR_EL1.C, bit 2: data accesses cacheable.
pub const SCTLR_C: u64 = 1 << 2;
/// SCTLR_EL1.I, bit 12: instruction fetches cacheable.
pub const SCTLR_I: u64 = 1 << 12;
/// SCTLR_EL1.SPAN, bit 23: when 0, PSTATE.PAN is set on exception entry.
pub const SCTLR_SPAN: u64 = 1 << 23;
/// SCTLR_EL1.DSSBS, bit 44: PSTATE.SSBS on exception entry.
pub const SCTLR_DSSBS: u64 = 1 << 44;

/// The exception level of a PSTATE value in SPSR format (AArch32 state is
/// always EL0 for a guest on AArch64-only hardware).
pub const fn current_el(pstate: u64) -> u8 {
    if pstate & PSTATE_NRW != 0 {
        0
    } else {
        ((pstate >> 2) & 3) as u8
    }
}

/// The optional PSTATE features of the vCPU's CPU that change exception
/// entry. Read them from its ID registers ([`CpuFeatures::from_id_regs`]):
/// HVF's Apple cores have both, `emu`'s Cortex-A72 (Armv8.0) neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuFeatures {
    /// FEAT_PAN: entry sets PSTATE.PAN when SCTLR_EL1.SPAN is 0.
    pub pan: bool,
    /// FEAT_SSBS: entry sets PSTATE.SSBS to SCTLR_EL1.DSSBS.
    pub ssbs: bool,
}

impl CpuFeatures {
    /// From ID_AA64MMFR1_EL1.PAN (bits 23:20) and ID_AA64PFR1_EL1.SSBS
    /// (bits 7:4); a non-zero field means the feature is implemented.
    pub const fn from_id_regs(id_aa64mmfr1: u64, id_aa64pfr1: u64) -> Self {
        Self {
            pan: (id_aa64mmfr1 >> 20) & 0xf != 0,
            ssbs: (id_aa64pfr1 >> 4) & 0xf != 0,
        }
    }
}

/// A synchronous exception to deliver to the guest's EL1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestException {
    /// ESR_EL1 value.
    pub esr: u64,
    /// FAR_EL1 value, for aborts (FAR is UNKNOWN for other classes and left
    /// unchanged).
    pub far: Option<u64>,
}

/// The register values after taking a synchronous exception to EL1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExceptionEntry {
    /// ESR_EL1.
    pub esr_el1: u64,
    /// FAR_EL1, if the exception sets it.
    pub far_el1: Option<u64>,
    /// ELR_EL1: the preferred return address.
    pub elr_el1: u64,
    /// SPSR_EL1: PSTATE before the exception.
    pub spsr_el1: u64,
    /// PSTATE after entry (SPSR format).
    pub pstate: u64,
    /// PC after entry: VBAR_EL1 (bits 10:0 are RES0 and ignored) plus the
    /// vector offset.
    pub pc: u64,
    /// The interrupted code ran on SP_EL0 (EL0, or EL1t): a backend whose
    /// PSTATE write does not bank the stack pointer saves the live SP to
    /// SP_EL0 and loads SP_EL1.
    pub from_sp_el0: bool,
}

/// Computes the entry into a synchronous exception taken to EL1 from the
/// state (`return_addr`, `pstate`) with the guest's VBAR_EL1 and SCTLR_EL1,
/// on a CPU with `features` (Arm ARM D1.3.1, AArch64.TakeException).
///
/// Vector offset: 0x000 from EL1 on SP_EL0, 0x200 from EL1 on SP_EL1, 0x400
/// from EL0 in AArch64, 0x600 from EL0 in AArch32. New PSTATE: EL1h,
/// D/A/I/F set, SS, IL, BTYPE and UAO cleared, PAN set when the CPU has PAN
/// and SCTLR_EL1.SPAN is 0, SSBS = SCTLR_EL1.DSSBS when the CPU has SSBS,
/// NZCV and DIT kept. (No MTE or NMI on the CPUs we run: TCO and ALLINT are
/// left alone.) Returns `None` from EL2 or EL3, which an EL1 guest never
/// runs at.
pub const fn exception_entry(
    exc: GuestException,
    return_addr: u64,
    pstate: u64,
    vbar: u64,
    sctlr: u64,
    features: CpuFeatures,
) -> Option<ExceptionEntry> {
    let aarch32 = pstate & PSTATE_NRW != 0;
    let offset = if aarch32 {
        0x600
    } else {
        match current_el(pstate) {
            0 => 0x400,
            1 if pstate & PSTATE_SP != 0 => 0x200,
            1 => 0x000,
            _ => return None,
        }
    };
    let mut new =
        pstate & !(0x1f | PSTATE_SS | PSTATE_IL | PSTATE_BTYPE | PSTATE_UAO | PSTATE_SSBS);
    new |= PSTATE_EL1H | PSTATE_DAIF;
    if features.pan && sctlr & SCTLR_SPAN == 0 {
        new |= PSTATE_PAN;
    }
    if features.ssbs && sctlr & SCTLR_DSSBS != 0 {
        new |= PSTATE_SSBS;
    }
    Some(ExceptionEntry {
        esr_el1: exc.esr,
        far_el1: exc.far,
        elr_el1: return_addr,
        spsr_el1: pstate,
        pstate: new,
        pc: (vbar & !0x7ff).wrapping_add(offset),
        from_sp_el0: !aarch32 && (current_el(pstate) == 0 || pstate & PSTATE_SP == 0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VBAR: u64 = 0xffff_8000_1001_0800;
    const ALL: CpuFeatures = CpuFeatures {
        pan: true,
        ssbs: true,
    };
    const NONE: CpuFeatures = CpuFeatures {
        pan: false,
        ssbs: false,
    };
    const UNDEF: GuestException = GuestException {
        esr: 0x0200_0000,
        far: None,
    };

    fn entry(pstate: u64, sctlr: u64, f: CpuFeatures) -> ExceptionEntry {
        exception_entry(UNDEF, 0x1000, pstate, VBAR, sctlr, f).unwrap()
    }

    #[test]
    fn vector_offsets_and_stack_banking() {
        let e = entry(0x3c5, SCTLR_SPAN, ALL);
        assert_eq!((e.pc, e.from_sp_el0), (VBAR + 0x200, false), "EL1h");
        let e = entry(0x3c4, SCTLR_SPAN, ALL);
        assert_eq!((e.pc, e.from_sp_el0), (VBAR, true), "EL1t");
        let e = entry(0, SCTLR_SPAN, ALL);
        assert_eq!((e.pc, e.from_sp_el0), (VBAR + 0x400, true), "EL0 AArch64");
        let e = entry(0x10, SCTLR_SPAN, ALL);
        assert_eq!((e.pc, e.from_sp_el0), (VBAR + 0x600, false), "EL0 AArch32");
        assert_eq!(exception_entry(UNDEF, 0, 0x9, VBAR, 0, ALL), None, "EL2h");
        assert_eq!(exception_entry(UNDEF, 0, 0xd, VBAR, 0, ALL), None, "EL3h");
        // VBAR_EL1 bits 10:0 are RES0.
        let e = exception_entry(UNDEF, 0, 0x5, 0x4000_07ff, 0, NONE).unwrap();
        assert_eq!(e.pc, 0x4000_0200);
    }

    #[test]
    fn pstate_after_entry() {
        // From EL0 with SS, IL, UAO, BTYPE and SSBS set: all cleared; NZCV,
        // DIT (bit 24) and PAN kept.
        let from = 0xf000_0000
            | 1 << 24
            | PSTATE_PAN
            | PSTATE_SS
            | PSTATE_IL
            | PSTATE_UAO
            | PSTATE_BTYPE
            | PSTATE_SSBS;
        let e = entry(from, SCTLR_SPAN, ALL);
        assert_eq!(e.pstate, 0xf000_0000 | 1 << 24 | PSTATE_PAN | 0x3c5);
        assert_eq!(
            (e.spsr_el1, e.elr_el1, e.esr_el1, e.far_el1),
            (from, 0x1000, 0x0200_0000, None)
        );
        // SPAN = 0 sets PAN and DSSBS sets SSBS, on a CPU that has them.
        assert_eq!(
            entry(0, SCTLR_DSSBS, ALL).pstate,
            PSTATE_PAN | PSTATE_SSBS | 0x3c5
        );
        // A CPU without PAN or SSBS (emu's Cortex-A72) never sets them.
        assert_eq!(entry(0, SCTLR_DSSBS, NONE).pstate, 0x3c5);
    }

    #[test]
    fn features_from_id_registers() {
        assert_eq!(CpuFeatures::from_id_regs(0, 0), NONE);
        assert_eq!(CpuFeatures::from_id_regs(1 << 20, 2 << 4), ALL);
        // Neighbouring fields do not count.
        assert_eq!(
            CpuFeatures::from_id_regs(0xf << 16 | 0xf << 24, 0xf | 0xf << 8),
            NONE
        );
    }
}
