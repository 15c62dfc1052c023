//! ESR_ELx syndrome encoders (Arm ARM D17.2.37) for the exceptions the `emu`
//! backend synthesises. Small on purpose; they can be merged into the shared
//! `arch::esr` helpers later.

use super::mmu::{Fault, FaultKind};

/// Exception classes (ESR_ELx.EC).
pub mod ec {
    /// Unknown reason (also undefined instructions).
    pub const UNKNOWN: u8 = 0x00;
    /// Trapped WFI/WFE.
    pub const WFX: u8 = 0x01;
    /// SVC in AArch64.
    pub const SVC64: u8 = 0x15;
    /// HVC in AArch64.
    pub const HVC64: u8 = 0x16;
    /// SMC in AArch64.
    pub const SMC64: u8 = 0x17;
    /// Trapped MSR/MRS/system instruction.
    pub const SYS64: u8 = 0x18;
    /// Instruction abort from a lower exception level.
    pub const IABT_LOW: u8 = 0x20;
    /// Instruction abort without a change in exception level.
    pub const IABT_CUR: u8 = 0x21;
    /// PC alignment fault.
    pub const PC_ALIGN: u8 = 0x22;
    /// Data abort from a lower exception level.
    pub const DABT_LOW: u8 = 0x24;
    /// Data abort without a change in exception level.
    pub const DABT_CUR: u8 = 0x25;
    /// BRK in AArch64.
    pub const BRK64: u8 = 0x3c;
}

/// Fault status codes (ISS.DFSC / ISS.IFSC).
pub mod fsc {
    /// Address size fault, level 0 (add the level).
    pub const ADDRESS_SIZE: u8 = 0x00;
    /// Translation fault, level 0 (add the level).
    pub const TRANSLATION: u8 = 0x04;
    /// Access flag fault, level 0 (add the level).
    pub const ACCESS_FLAG: u8 = 0x08;
    /// Permission fault, level 0 (add the level).
    pub const PERMISSION: u8 = 0x0c;
    /// Synchronous external abort, not on a translation table walk.
    pub const EXTERNAL: u8 = 0x10;
    /// Synchronous external abort on a translation table walk, level 0 (add
    /// the level).
    pub const EXTERNAL_ON_WALK: u8 = 0x14;
    /// Alignment fault.
    pub const ALIGNMENT: u8 = 0x21;
}

/// ESR.IL: 32-bit instruction.
const IL: u64 = 1 << 25;
/// Data abort ISS.WnR: the access was a write.
const WNR: u64 = 1 << 6;

/// A syndrome with the given class, IL = 1, and `iss` (25 bits).
pub fn syndrome(ec: u8, iss: u32) -> u64 {
    (u64::from(ec) << 26) | IL | u64::from(iss & 0x1ff_ffff)
}

/// Undefined instruction (EC 0; quirk 14: unicorn gives no better syndrome).
pub fn unknown() -> u64 {
    syndrome(ec::UNKNOWN, 0)
}

/// `SVC #imm16`.
pub fn svc(imm16: u16) -> u64 {
    syndrome(ec::SVC64, u32::from(imm16))
}

/// `HVC #imm16` (as reported to EL2).
pub fn hvc(imm16: u16) -> u64 {
    syndrome(ec::HVC64, u32::from(imm16))
}

/// `BRK #imm16`.
pub fn brk(imm16: u16) -> u64 {
    syndrome(ec::BRK64, u32::from(imm16))
}

/// PC alignment fault.
pub fn pc_alignment() -> u64 {
    syndrome(ec::PC_ALIGN, 0)
}

/// Data abort with fault status `dfsc`; `same_el` selects EC 0x25 over 0x24.
pub fn data_abort(same_el: bool, dfsc: u8, write: bool) -> u64 {
    let ec = if same_el { ec::DABT_CUR } else { ec::DABT_LOW };
    let wnr = if write { WNR } else { 0 };
    syndrome(ec, 0) | wnr | u64::from(dfsc & 0x3f)
}

/// Instruction abort with fault status `ifsc`; `same_el` selects EC 0x21
/// over 0x20.
pub fn instruction_abort(same_el: bool, ifsc: u8) -> u64 {
    let ec = if same_el { ec::IABT_CUR } else { ec::IABT_LOW };
    syndrome(ec, 0) | u64::from(ifsc & 0x3f)
}

/// The fault status code of a translation fault.
pub fn fault_status(f: Fault) -> u8 {
    let base = match f.kind {
        FaultKind::AddressSize => fsc::ADDRESS_SIZE,
        FaultKind::Translation => fsc::TRANSLATION,
        FaultKind::AccessFlag => fsc::ACCESS_FLAG,
        FaultKind::Permission => fsc::PERMISSION,
        FaultKind::ExternalOnWalk => fsc::EXTERNAL_ON_WALK,
    };
    base + (f.level & 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_arm_arm() {
        assert_eq!(unknown(), 0x0200_0000);
        assert_eq!(svc(0x1234), 0x5600_1234);
        assert_eq!(hvc(5), 0x5a00_0005);
        assert_eq!(brk(0x800), 0xf200_0800);
        // Data abort, same EL, translation fault level 3, write.
        assert_eq!(data_abort(true, fsc::TRANSLATION + 3, true), 0x9600_0047);
        // Data abort from EL0, permission fault level 2, read.
        assert_eq!(data_abort(false, fsc::PERMISSION + 2, false), 0x9200_000e);
        // Instruction abort from EL0, access flag level 3.
        assert_eq!(instruction_abort(false, fsc::ACCESS_FLAG + 3), 0x8200_000b);
        assert_eq!(
            fault_status(Fault {
                kind: FaultKind::ExternalOnWalk,
                level: 1
            }),
            0x15
        );
    }
}
