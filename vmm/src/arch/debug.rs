//! AArch64 self-hosted debug (Arm ARM D2, "AArch64 Self-hosted Debug"): when
//! debug exceptions are enabled, what a breakpoint matches, and when a
//! software step exception is due. Pure functions of register values, used
//! by the `emu` backend to classify the exceptions its CPU raises; the guest
//! runs at EL0/EL1 with no EL2 or EL3, so EL1 is always the debug target.

use super::idregs::{BREAKPOINTS, WATCHPOINTS};
use super::sysreg::{DBGBCR0_EL1, DBGBVR0_EL1, DBGWCR0_EL1, DBGWVR0_EL1, DEBUG_SYSREGS};

/// MDSCR_EL1.SS: software step enable.
pub const MDSCR_SS: u64 = 1 << 0;
/// MDSCR_EL1.KDE: debug exceptions from EL1 to EL1.
pub const MDSCR_KDE: u64 = 1 << 13;
/// MDSCR_EL1.MDE: breakpoint and watchpoint exceptions.
pub const MDSCR_MDE: u64 = 1 << 15;
/// PSTATE.D (SPSR bit 9): debug exceptions masked at the current EL.
pub const PSTATE_D: u64 = 1 << 9;
/// PSTATE.SS (SPSR bit 21): software step state (1: active-not-pending).
pub const PSTATE_SS: u64 = 1 << 21;

const _: () = assert!(DEBUG_SYSREGS.len() == 1 + 2 * (BREAKPOINTS + WATCHPOINTS));

/// Whether debug exceptions can be taken from exception level `el` (0 or 1)
/// to EL1 (Arm ARM D2.1.4): never while the OS Lock is locked; from EL0
/// always otherwise; from EL1 only with MDSCR_EL1.KDE set and PSTATE.D
/// clear.
pub fn enabled(el: u8, mdscr: u64, pstate: u64, os_lock: bool) -> bool {
    if os_lock {
        return false;
    }
    match el {
        0 => true,
        1 => mdscr & MDSCR_KDE != 0 && pstate & PSTATE_D == 0,
        _ => false,
    }
}

/// Whether a software step exception is due before the next instruction
/// (Arm ARM D2.12, state "active-pending"): step enabled (MDSCR_EL1.SS),
/// debug exceptions enabled at `el`, and PSTATE.SS clear.
pub fn step_pending(el: u8, mdscr: u64, pstate: u64, os_lock: bool) -> bool {
    mdscr & MDSCR_SS != 0 && pstate & PSTATE_SS == 0 && enabled(el, mdscr, pstate, os_lock)
}

/// Whether software step is active-not-pending before the next instruction
/// (Arm ARM D2.12): step enabled, debug exceptions enabled at `el`, and
/// PSTATE.SS set, so that instruction is stepped: a Software Step exception
/// is due after it.
pub fn step_active_not_pending(el: u8, mdscr: u64, pstate: u64, os_lock: bool) -> bool {
    mdscr & MDSCR_SS != 0 && pstate & PSTATE_SS != 0 && enabled(el, mdscr, pstate, os_lock)
}

/// What an undefined-instruction exception is when the CPU may have raised
/// it for software step (QEMU, as the `emu` backend's CPU, reports a Software
/// Step exception as an UNDEF without its syndrome).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undef {
    /// A Software Step exception: step active-pending with debug exceptions
    /// enabled.
    SoftwareStep,
    /// The end of a stepped instruction that masked debug exceptions (such
    /// as `MSR DAIFSet` setting PSTATE.D): step is now inactive, so no
    /// exception is taken, and it stays pending (PSTATE.SS clear) until
    /// debug exceptions are unmasked. Execution goes on after the
    /// instruction.
    MaskedStep,
    /// An undefined instruction.
    Undefined,
}

/// Classifies an undefined-instruction exception raised at `el` with these
/// MDSCR_EL1, PSTATE and OS Lock values; `stepped` says whether the
/// instruction was stepped ([`step_active_not_pending`] held before it).
/// Stepping an instruction clears PSTATE.SS; an undefined stepped
/// instruction leaves it set.
pub fn classify_undef(el: u8, mdscr: u64, pstate: u64, os_lock: bool, stepped: bool) -> Undef {
    if step_pending(el, mdscr, pstate, os_lock) {
        Undef::SoftwareStep
    } else if stepped && mdscr & MDSCR_SS != 0 && pstate & PSTATE_SS == 0 {
        Undef::MaskedStep
    } else {
        Undef::Undefined
    }
}

/// Whether the breakpoint with control `bcr` and value `bvr` matches the
/// A64 instruction at `pc` executed at `el` (Arm ARM D2.9): enabled (E),
/// an unlinked address match (BT = 0b0000), PMC selecting `el` (bit 1: EL1,
/// bit 2: EL0), BAS = 0b1111, and BVR bits [48:2] equal to the PC's.
/// Breakpoint exceptions also need MDSCR_EL1.MDE and [`enabled`].
pub fn breakpoint_matches(bcr: u64, bvr: u64, pc: u64, el: u8) -> bool {
    let e = bcr & 1 != 0;
    let pmc = (bcr >> 1) & 0b11;
    let bas = (bcr >> 5) & 0xf;
    let bt = (bcr >> 20) & 0xf;
    let el_ok = match el {
        0 => pmc & 0b10 != 0,
        1 => pmc & 0b01 != 0,
        _ => false,
    };
    let mask = ((1u64 << 49) - 1) & !0b11;
    e && bt == 0 && bas == 0xf && el_ok && bvr & mask == pc & mask
}

/// WVR/BVR bits [48:2] sign-extended from bit 48: the virtual address they
/// name.
fn va49(v: u64) -> u64 {
    (((v << 15) as i64) >> 15) as u64 & !0b11
}

/// The bytes the watchpoint with control `wcr` and value `wvr` watches, as
/// `[start, end)` (Arm ARM D2.10), if it is enabled (E): with MASK = 0, the
/// bytes BAS selects in the doubleword at WVR (from its lowest to its
/// highest set bit); with MASK = n (3 to 31), the 2^n-byte block at WVR
/// aligned down. `None` if disabled or BAS is 0.
pub fn watch_range(wcr: u64, wvr: u64) -> Option<(u64, u64)> {
    if wcr & 1 == 0 {
        return None;
    }
    let bas = ((wcr >> 5) & 0xff) as u32;
    let mask = ((wcr >> 24) & 0x1f) as u32;
    let va = va49(wvr);
    if mask >= 3 {
        let start = va & !((1u64 << mask) - 1);
        return Some((start, start.wrapping_add(1 << mask)));
    }
    if bas == 0 {
        return None;
    }
    let base = va & !0b111;
    let first = bas.trailing_zeros();
    let last = 31 - bas.leading_zeros();
    Some((base + u64::from(first), base + u64::from(last) + 1))
}

/// Whether an access of `size` bytes at `addr` (a store if `write`) at
/// `el` hits the watchpoint (`wcr`, `wvr`): it overlaps [`watch_range`],
/// LSC selects the access type (bits 4:3: 0b01 loads, 0b10 stores, 0b11
/// both) and PAC the EL (bits 2:1: 0b01 EL1, 0b10 EL0, 0b11 both).
/// Watchpoint exceptions also need MDSCR_EL1.MDE and [`enabled`].
pub fn watchpoint_matches(wcr: u64, wvr: u64, addr: u64, size: u64, write: bool, el: u8) -> bool {
    let Some((start, end)) = watch_range(wcr, wvr) else {
        return false;
    };
    let lsc = (wcr >> 3) & 0b11;
    let pac = (wcr >> 1) & 0b11;
    let type_ok = if write {
        lsc & 0b10 != 0
    } else {
        lsc & 0b01 != 0
    };
    let el_ok = match el {
        0 => pac & 0b10 != 0,
        1 => pac & 0b01 != 0,
        _ => false,
    };
    type_ok && el_ok && addr < end && addr.wrapping_add(size) > start
}

/// The index in [`DEBUG_SYSREGS`] of watchpoint `n`'s value and control
/// registers.
pub fn watchpoint_regs(n: usize) -> (usize, usize) {
    let at = |r| DEBUG_SYSREGS.iter().position(|&x| x == r).expect("listed");
    (at(DBGWVR0_EL1) + n, at(DBGWCR0_EL1) + n)
}

/// The index in [`DEBUG_SYSREGS`] of breakpoint `n`'s value and control
/// registers.
pub fn breakpoint_regs(n: usize) -> (usize, usize) {
    let at = |r| DEBUG_SYSREGS.iter().position(|&x| x == r).expect("listed");
    (at(DBGBVR0_EL1) + n, at(DBGBCR0_EL1) + n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::sysreg::{DBGBCR5_EL1, DBGBVR5_EL1, DBGWCR3_EL1, DBGWVR3_EL1};

    /// E, PMC = EL0 and EL1, BAS = 0b1111.
    const BCR_BOTH: u64 = 1 | 0b11 << 1 | 0xf << 5;

    #[test]
    fn enabled_follows_the_os_lock_kde_and_pstate_d() {
        assert!(enabled(0, 0, 0, false));
        assert!(!enabled(0, MDSCR_KDE, 0, true));
        assert!(!enabled(1, 0, 0, false), "EL1 needs KDE");
        assert!(enabled(1, MDSCR_KDE, 0, false));
        assert!(
            !enabled(1, MDSCR_KDE, PSTATE_D, false),
            "masked by PSTATE.D"
        );
        assert!(
            enabled(0, 0, PSTATE_D, false),
            "PSTATE.D is EL1's, not EL0's"
        );
    }

    #[test]
    fn step_is_pending_only_with_pstate_ss_clear() {
        let m = MDSCR_SS | MDSCR_KDE;
        assert!(step_pending(1, m, 0, false));
        assert!(!step_pending(1, m, PSTATE_SS, false), "active-not-pending");
        assert!(!step_pending(1, MDSCR_KDE, 0, false), "SS off");
        assert!(!step_pending(0, MDSCR_SS, 0, true), "OS Lock");
        assert!(step_pending(0, MDSCR_SS, 0, false));
    }

    #[test]
    fn undefs_are_told_from_software_steps() {
        let m = MDSCR_SS | MDSCR_KDE;
        assert!(step_active_not_pending(1, m, PSTATE_SS, false));
        assert!(!step_active_not_pending(1, m, PSTATE_SS | PSTATE_D, false));
        assert!(!step_active_not_pending(1, m, 0, false), "active-pending");
        // After a stepped instruction, debug enabled: the step exception.
        assert_eq!(classify_undef(1, m, 0, false, true), Undef::SoftwareStep);
        assert_eq!(
            classify_undef(0, MDSCR_SS, 0, false, true),
            Undef::SoftwareStep
        );
        // The stepped instruction set PSTATE.D: no exception, step pending.
        assert_eq!(
            classify_undef(1, m, PSTATE_D, false, true),
            Undef::MaskedStep
        );
        // A stepped instruction that is itself undefined keeps PSTATE.SS.
        assert_eq!(
            classify_undef(1, m, PSTATE_SS, false, true),
            Undef::Undefined
        );
        // Not stepping (debug masked all along): a plain UNDEF.
        assert_eq!(
            classify_undef(1, m, PSTATE_D, false, false),
            Undef::Undefined
        );
        assert_eq!(
            classify_undef(1, MDSCR_KDE, 0, false, true),
            Undef::Undefined
        );
    }

    #[test]
    fn breakpoints_match_address_el_and_fields() {
        let pc = 0xffff_8000_1234_5678;
        assert!(breakpoint_matches(BCR_BOTH, pc, pc, 1));
        assert!(breakpoint_matches(BCR_BOTH, pc, pc, 0));
        // Bits above 48 (sign extension) and [1:0] are not compared.
        assert!(breakpoint_matches(BCR_BOTH, pc & ((1 << 49) - 1), pc, 1));
        assert!(!breakpoint_matches(BCR_BOTH, pc + 4, pc, 1));
        assert!(!breakpoint_matches(BCR_BOTH & !1, pc, pc, 1), "disabled");
        let el1_only = 1 | 0b01 << 1 | 0xf << 5;
        assert!(breakpoint_matches(el1_only, pc, pc, 1));
        assert!(!breakpoint_matches(el1_only, pc, pc, 0));
        assert!(
            !breakpoint_matches(BCR_BOTH | 0b0001 << 20, pc, pc, 1),
            "linked context type"
        );
        assert!(
            !breakpoint_matches(BCR_BOTH & !(0xf << 5) | 0x3 << 5, pc, pc, 1),
            "BAS"
        );
    }

    /// E, PAC = EL0 and EL1, LSC = stores, BAS = 8 bytes.
    const WCR_STORES: u64 = 1 | 0b11 << 1 | 0b10 << 3 | 0xff << 5;

    #[test]
    fn watch_ranges_follow_bas_and_mask() {
        let a = 0x4008_1230;
        assert_eq!(watch_range(WCR_STORES, a), Some((a, a + 8)));
        assert_eq!(watch_range(WCR_STORES & !1, a), None, "disabled");
        // BAS = 0b0000_1100: bytes 2 and 3.
        let two = 1 | 0b11 << 1 | 0b11 << 3 | 0b1100 << 5;
        assert_eq!(watch_range(two, a), Some((a + 2, a + 4)));
        // MASK = 12: the 4 KiB block.
        let block = WCR_STORES | 12 << 24;
        assert_eq!(
            watch_range(block, a + 0x10),
            Some((0x4008_1000, 0x4008_2000))
        );
        // A kernel address: bit 48 sign-extends.
        let k = 0xffff_8000_0010_0008u64;
        assert_eq!(
            watch_range(WCR_STORES, k & ((1 << 49) - 1)),
            Some((k, k + 8))
        );
    }

    #[test]
    fn watchpoints_match_overlap_type_and_el() {
        let a = 0x4008_1230;
        assert!(watchpoint_matches(WCR_STORES, a, a, 8, true, 1));
        assert!(watchpoint_matches(WCR_STORES, a, a + 7, 1, true, 0));
        assert!(
            watchpoint_matches(WCR_STORES, a, a - 4, 8, true, 1),
            "overlaps the start"
        );
        assert!(
            !watchpoint_matches(WCR_STORES, a, a - 8, 8, true, 1),
            "just before"
        );
        assert!(
            !watchpoint_matches(WCR_STORES, a, a + 8, 8, true, 1),
            "just after"
        );
        assert!(!watchpoint_matches(WCR_STORES, a, a, 8, false, 1), "a load");
        let loads_el1 = 1 | 0b01 << 1 | 0b01 << 3 | 0xff << 5;
        assert!(watchpoint_matches(loads_el1, a, a, 4, false, 1));
        assert!(
            !watchpoint_matches(loads_el1, a, a, 4, false, 0),
            "PAC: EL1 only"
        );
        assert!(
            !watchpoint_matches(loads_el1, a, a, 4, true, 1),
            "LSC: loads only"
        );
    }

    #[test]
    fn debug_register_indices() {
        assert_eq!(breakpoint_regs(0), (1, 11));
        let (v, c) = breakpoint_regs(5);
        assert_eq!(
            (DEBUG_SYSREGS[v], DEBUG_SYSREGS[c]),
            (DBGBVR5_EL1, DBGBCR5_EL1)
        );
        let (v, c) = watchpoint_regs(3);
        assert_eq!(
            (DEBUG_SYSREGS[v], DEBUG_SYSREGS[c]),
            (DBGWVR3_EL1, DBGWCR3_EL1)
        );
    }
}
