//! Exception entry to EL1 in AArch64 (Arm ARM D1.10), as a pure computation.
//!
//! Unicorn reports synchronous exceptions to the VMM instead of taking them
//! (notes, quirk 1 and 2), so the backend enters the guest's vector itself.
//! The caller writes the results back and banks SP (quirk 4).

/// PSTATE.M (bits 3:0) for EL1 using SP_EL1 (EL1h).
pub const MODE_EL1H: u64 = 0b0101;
/// PSTATE.{D,A,I,F} (bits 9..6 in SPSR layout).
pub const DAIF: u64 = 0xf << 6;
/// PSTATE.{N,Z,C,V} (bits 31..28).
const NZCV: u64 = 0xf << 28;

/// The class of an exception, which selects the vector entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Synchronous exception (offset 0x000 within the group).
    Sync,
    /// IRQ (0x080).
    Irq,
    /// FIQ (0x100).
    Fiq,
    /// SError (0x180).
    SError,
}

impl Class {
    fn offset(self) -> u64 {
        match self {
            Class::Sync => 0x000,
            Class::Irq => 0x080,
            Class::Fiq => 0x100,
            Class::SError => 0x180,
        }
    }
}

/// The register values after taking an exception to EL1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// New PC: VBAR_EL1 + group offset + class offset.
    pub pc: u64,
    /// ELR_EL1: the preferred return address.
    pub elr: u64,
    /// SPSR_EL1: PSTATE before the exception.
    pub spsr: u64,
    /// New PSTATE: EL1h, DAIF masked, NZCV kept.
    pub pstate: u64,
    /// The interrupted code ran on SP_EL0 (EL0, or EL1t), so the live SP must
    /// be saved to SP_EL0 and SP_EL1 loaded.
    pub switch_from_sp_el0: bool,
}

/// Computes exception entry to EL1 from `pstate` (SPSR layout), with
/// preferred return address `return_addr`. Returns `None` if the interrupted
/// state is not AArch64 EL0/EL1 (nRW set, or EL2/EL3), which the emulated
/// vCPU never runs in.
pub fn enter_el1(pstate: u64, return_addr: u64, vbar: u64, class: Class) -> Option<Entry> {
    if pstate & (1 << 4) != 0 {
        return None; // AArch32
    }
    let el = (pstate >> 2) & 3;
    let sp_el0 = el == 0 || pstate & 1 == 0;
    let group = match el {
        0 => 0x400,           // lower EL using AArch64
        1 if sp_el0 => 0x000, // current EL with SP_EL0
        1 => 0x200,           // current EL with SP_ELx
        _ => return None,
    };
    Some(Entry {
        pc: (vbar & !0x7ff) + group + class.offset(),
        elr: return_addr,
        spsr: pstate,
        pstate: (pstate & NZCV) | DAIF | MODE_EL1H,
        switch_from_sp_el0: sp_el0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VBAR: u64 = 0xffff_8000_1001_0800;

    #[test]
    fn sync_from_el1h_uses_the_current_el_spx_group() {
        let e = enter_el1(0x3c5 | (0b0110 << 28), 0x1000, VBAR, Class::Sync).unwrap();
        assert_eq!(e.pc, VBAR + 0x200);
        assert_eq!(e.elr, 0x1000);
        assert_eq!(e.spsr, 0x6000_03c5);
        assert_eq!(e.pstate, 0x6000_03c5);
        assert!(!e.switch_from_sp_el0);
    }

    #[test]
    fn sync_and_irq_from_el0_use_the_lower_el_group() {
        let e = enter_el1(0, 0x40_0000, VBAR, Class::Sync).unwrap();
        assert_eq!(e.pc, VBAR + 0x400);
        assert_eq!(e.pstate, 0x3c5);
        assert!(e.switch_from_sp_el0);
        let e = enter_el1(0, 0x40_0000, VBAR, Class::Irq).unwrap();
        assert_eq!(e.pc, VBAR + 0x480);
    }

    #[test]
    fn el1t_uses_the_sp_el0_group_and_other_offsets() {
        let e = enter_el1(0x3c4, 0x10, VBAR, Class::Sync).unwrap();
        assert_eq!(e.pc, VBAR);
        assert!(e.switch_from_sp_el0);
        let irq = enter_el1(0x5, 0x10, VBAR, Class::Irq).unwrap();
        assert_eq!(irq.pc, VBAR + 0x280);
        assert_eq!(irq.pstate, 0x3c5);
        let fiq = enter_el1(0x5, 0x10, VBAR, Class::Fiq).unwrap();
        assert_eq!(fiq.pc, VBAR + 0x300);
        let se = enter_el1(0x5, 0x10, VBAR, Class::SError).unwrap();
        assert_eq!(se.pc, VBAR + 0x380);
    }

    #[test]
    fn vbar_low_bits_are_ignored_and_el2_is_rejected() {
        let e = enter_el1(0x5, 0, 0x4000_07ff, Class::Sync).unwrap();
        assert_eq!(e.pc, 0x4000_0200);
        assert!(enter_el1(0x9, 0, 0, Class::Sync).is_none());
        assert!(enter_el1(0x10, 0, 0, Class::Sync).is_none());
    }
}
