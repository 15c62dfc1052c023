//! Distributor and redistributor register maps as data tables.
//!
//! Offsets are relative to the 64 KiB frame that holds them: GICD, the
//! redistributor's RD_base frame or its SGI_base frame. The maps follow the
//! tables "The GIC Distributor register map" and "The GIC Redistributor
//! register map" of the GICv3/v4 architecture specification (Arm IHI 0069H,
//! chapter 12, "Programmers' Model"); each register's behaviour is in its
//! description there, found by name. Registers not listed are reserved and
//! answer [`crate::devices::AccessError::NoRegister`] (the bus makes them
//! RAZ/WI).

use crate::arch::layout::{NUM_SPIS, SPI_BASE_INTID};

/// Permitted access widths of a register (IHI 0069H ch. 12, "GIC memory-mapped
/// register access").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Width {
    /// 32-bit accesses only.
    Word,
    /// 8-bit or 32-bit ("byte-accessible": IPRIORITYR, ITARGETSR, xPENDSGIR).
    ByteOrWord,
    /// 64-bit, or either 32-bit half (IROUTER, GICR_TYPER).
    DoubleOrWord,
}

impl Width {
    /// Whether an access of `len` bytes is permitted.
    pub(super) fn allows(self, len: usize) -> bool {
        match self {
            Width::Word => len == 4,
            Width::ByteOrWord => len == 1 || len == 4,
            Width::DoubleOrWord => len == 8 || len == 4,
        }
    }
}

/// The per-INTID state a bit-array register reads and writes (one bit per
/// INTID, 32 INTIDs per register).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BitOp {
    /// IGROUPR: 1 = group 1. Read/write.
    Group,
    /// ISENABLER: reads the enable, writing 1 sets it.
    SetEnable,
    /// ICENABLER: reads the enable, writing 1 clears it.
    ClearEnable,
    /// ISPENDR: reads the pending state, writing 1 sets the latch.
    SetPending,
    /// ICPENDR: reads the pending state, writing 1 clears the latch.
    ClearPending,
    /// ISACTIVER: reads the active state, writing 1 sets it.
    SetActive,
    /// ICACTIVER: reads the active state, writing 1 clears it.
    ClearActive,
}

/// What a register (or array of registers) holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A read-only constant; writes are refused.
    Const(u32),
    /// The identification block at 0xFFD0..0x10000 ([`ID_REGS`]); read-only.
    Id,
    /// Architecturally present but RAZ/WI in this configuration (single
    /// security state, affinity routing on, no LPIs).
    RazWi,
    /// GICD_CTLR.
    DistCtlr,
    /// One bit per INTID.
    Bits(BitOp),
    /// IPRIORITYR: one byte per INTID.
    Priority,
    /// ICFGR: two bits per INTID, 16 per register.
    Config,
    /// `GICD_IROUTER<n>`: one 64-bit register per SPI; the array starts at n = 32.
    Router,
    /// GICR_TYPER (64-bit, per redistributor); read-only.
    RedistTyper,
    /// GICR_WAKER.
    Waker,
}

/// One register, or an array of identical registers, in a frame.
#[derive(Debug)]
pub(super) struct Reg {
    /// Architectural name (for diagnostics).
    pub name: &'static str,
    /// Offset of the first byte within the frame.
    pub offset: u64,
    /// Bytes covered (4 for a single 32-bit register).
    pub size: u64,
    /// Permitted access widths.
    pub width: Width,
    /// Behaviour.
    pub kind: Kind,
}

/// Finds the register covering `offset` in `table`.
pub(super) fn lookup(table: &'static [Reg], offset: u64) -> Option<&'static Reg> {
    table
        .iter()
        .find(|r| offset >= r.offset && offset - r.offset < r.size)
}

/// GICD_TYPER: ITLinesNumber `[4:0]` = N for 32 * (N + 1) INTIDs; IDbits
/// `[23:19]` = 15 (16-bit INTIDs, as ICC_CTLR_EL1.IDbits = 0). Zero elsewhere:
/// no LPIs, MBIS, ESPI or second security state; A3V = 0 (Aff3 is 0);
/// No1N = 0 (1-of-N routing supported); RSS = 0 (Aff0 of SGI targets 0-15).
pub(super) const GICD_TYPER: u32 = ((SPI_BASE_INTID + NUM_SPIS).div_ceil(32) - 1) | (15 << 19);

/// ProductID 0, Variant/Revision 0, Implementer 0x43B (Arm): an r0p0 GIC-500,
/// the value QEMU's emulated GICv3 reports too (GICD_IIDR, GICR_IIDR).
pub(super) const IIDR: u32 = 0x0000_043B;

/// The identification registers GICD/GICR_PIDR4..7, PIDR0..3, CIDR0..3 at
/// 0xFFD0..0x10000, in offset order (IHI 0069H ch. 12, "Identification
/// registers"). Only PIDR2.ArchRev (bits `[7:4]` = 3: GICv3) is architected;
/// Linux checks it on both frames. The rest are GIC-500's values.
pub(super) const ID_REGS: [u32; 12] = [
    0x44, 0x00, 0x00, 0x00, // PIDR4..PIDR7
    0x92, 0xB4, 0x3B, 0x00, // PIDR0..PIDR3
    0x0D, 0xF0, 0x05, 0xB1, // CIDR0..CIDR3
];
/// Offset of the identification block in both frames.
pub(super) const ID_BASE: u64 = 0xFFD0;

/// GICD_CTLR bits (single-security-state view, DS = 1).
pub(super) mod ctlr {
    /// EnableGrp0.
    pub const ENABLE_GRP0: u32 = 1 << 0;
    /// EnableGrp1.
    pub const ENABLE_GRP1: u32 = 1 << 1;
    /// ARE: affinity routing enable, RAO/WI here.
    pub const ARE: u32 = 1 << 4;
    /// DS: disable security, RAO/WI here.
    pub const DS: u32 = 1 << 6;
}

/// GICR_WAKER bits.
pub(super) mod waker {
    /// ProcessorSleep: the PE is asleep; the redistributor forwards nothing.
    pub const PROCESSOR_SLEEP: u32 = 1 << 1;
    /// ChildrenAsleep (read-only): mirrors ProcessorSleep at once here.
    pub const CHILDREN_ASLEEP: u32 = 1 << 2;
}

/// GICD_IROUTER fields.
pub(super) mod irouter {
    /// Interrupt_Routing_Mode: 1 = 1-of-N (any participating PE).
    pub const IRM: u64 = 1 << 31;
    /// Writable bits: Aff0 `[7:0]`, Aff1 `[15:8]`, Aff2 `[23:16]`, IRM.
    /// Aff3 `[39:32]` is RES0 because GICD_TYPER.A3V = 0.
    pub const MASK: u64 = IRM | 0x00FF_FFFF;
}

/// The distributor frame (IHI 0069H, "The GIC Distributor register map").
/// With ARE = 1 the per-INTID registers of INTIDs 0-31 are RAZ/WI here (the
/// redistributor's SGI_base frame has them), as are those of unimplemented
/// SPIs.
#[rustfmt::skip]
pub(super) const DIST_REGS: &[Reg] = &[
    reg("GICD_CTLR",       0x0000,  4,      Width::Word,         Kind::DistCtlr),
    reg("GICD_TYPER",      0x0004,  4,      Width::Word,         Kind::Const(GICD_TYPER)),
    reg("GICD_IIDR",       0x0008,  4,      Width::Word,         Kind::Const(IIDR)),
    // No vSGIs, no extended ranges.
    reg("GICD_TYPER2",     0x000C,  4,      Width::Word,         Kind::Const(0)),
    // No error reporting.
    reg("GICD_STATUSR",    0x0010,  4,      Width::Word,         Kind::RazWi),
    reg("GICD_IGROUPR",    0x0080,  0x80,   Width::Word,         Kind::Bits(BitOp::Group)),
    reg("GICD_ISENABLER",  0x0100,  0x80,   Width::Word,         Kind::Bits(BitOp::SetEnable)),
    reg("GICD_ICENABLER",  0x0180,  0x80,   Width::Word,         Kind::Bits(BitOp::ClearEnable)),
    reg("GICD_ISPENDR",    0x0200,  0x80,   Width::Word,         Kind::Bits(BitOp::SetPending)),
    reg("GICD_ICPENDR",    0x0280,  0x80,   Width::Word,         Kind::Bits(BitOp::ClearPending)),
    reg("GICD_ISACTIVER",  0x0300,  0x80,   Width::Word,         Kind::Bits(BitOp::SetActive)),
    reg("GICD_ICACTIVER",  0x0380,  0x80,   Width::Word,         Kind::Bits(BitOp::ClearActive)),
    // IPRIORITYR0..254, one byte per INTID 0..1019.
    reg("GICD_IPRIORITYR", 0x0400,  0x3FC,  Width::ByteOrWord,   Kind::Priority),
    // ITARGETSR is RES0 when affinity routing is enabled.
    reg("GICD_ITARGETSR",  0x0800,  0x3FC,  Width::ByteOrWord,   Kind::RazWi),
    reg("GICD_ICFGR",      0x0C00,  0x100,  Width::Word,         Kind::Config),
    // RAZ/WI when GICD_CTLR.DS == 1.
    reg("GICD_IGRPMODR",   0x0D00,  0x80,   Width::Word,         Kind::RazWi),
    // RAZ/WI when GICD_CTLR.DS == 1.
    reg("GICD_NSACR",      0x0E00,  0x100,  Width::Word,         Kind::RazWi),
    // Legacy SGI generation, ignored with affinity routing.
    reg("GICD_SGIR",       0x0F00,  4,      Width::Word,         Kind::RazWi),
    // RAZ/WI with affinity routing.
    reg("GICD_CPENDSGIR",  0x0F10,  0x10,   Width::ByteOrWord,   Kind::RazWi),
    reg("GICD_SPENDSGIR",  0x0F20,  0x10,   Width::ByteOrWord,   Kind::RazWi),
    // IROUTER<n> at 0x6000 + 8n for n = 32..1019.
    reg("GICD_IROUTER",    0x6100,  0x1EE0, Width::DoubleOrWord, Kind::Router),
    reg("GICD_ID",         ID_BASE, 0x30,   Width::Word,         Kind::Id),
];

/// The redistributor's RD_base frame (IHI 0069H, "The GIC Redistributor
/// register map"). There are no LPIs, so PROPBASER, PENDBASER and the LPI
/// invalidation registers are reserved.
#[rustfmt::skip]
pub(super) const RD_REGS: &[Reg] = &[
    // EnableLPIs RES0 (no LPIs), RWP/UWP always 0.
    reg("GICR_CTLR",       0x0000,  4,      Width::Word,         Kind::RazWi),
    reg("GICR_IIDR",       0x0004,  4,      Width::Word,         Kind::Const(IIDR)),
    reg("GICR_TYPER",      0x0008,  8,      Width::DoubleOrWord, Kind::RedistTyper),
    // No error reporting.
    reg("GICR_STATUSR",    0x0010,  4,      Width::Word,         Kind::RazWi),
    reg("GICR_WAKER",      0x0014,  4,      Width::Word,         Kind::Waker),
    reg("GICR_ID",         ID_BASE, 0x30,   Width::Word,         Kind::Id),
];

/// The redistributor's SGI_base frame (same table as [`RD_REGS`]): the
/// per-INTID registers of SGIs 0-15 and PPIs 16-31, at the distributor's
/// offsets.
#[rustfmt::skip]
pub(super) const SGI_REGS: &[Reg] = &[
    reg("GICR_IGROUPR0",   0x0080,  4,      Width::Word,         Kind::Bits(BitOp::Group)),
    reg("GICR_ISENABLER0", 0x0100,  4,      Width::Word,         Kind::Bits(BitOp::SetEnable)),
    reg("GICR_ICENABLER0", 0x0180,  4,      Width::Word,         Kind::Bits(BitOp::ClearEnable)),
    reg("GICR_ISPENDR0",   0x0200,  4,      Width::Word,         Kind::Bits(BitOp::SetPending)),
    reg("GICR_ICPENDR0",   0x0280,  4,      Width::Word,         Kind::Bits(BitOp::ClearPending)),
    reg("GICR_ISACTIVER0", 0x0300,  4,      Width::Word,         Kind::Bits(BitOp::SetActive)),
    reg("GICR_ICACTIVER0", 0x0380,  4,      Width::Word,         Kind::Bits(BitOp::ClearActive)),
    // IPRIORITYR0..7.
    reg("GICR_IPRIORITYR", 0x0400,  0x20,   Width::ByteOrWord,   Kind::Priority),
    // ICFGR0 (SGIs, read-only edge) and ICFGR1 (PPIs).
    reg("GICR_ICFGR",      0x0C00,  8,      Width::Word,         Kind::Config),
    // RAZ/WI when GICD_CTLR.DS == 1.
    reg("GICR_IGRPMODR0",  0x0D00,  4,      Width::Word,         Kind::RazWi),
    // RAZ/WI when GICD_CTLR.DS == 1.
    reg("GICR_NSACR",      0x0E00,  4,      Width::Word,         Kind::RazWi),
];

const fn reg(name: &'static str, offset: u64, size: u64, width: Width, kind: Kind) -> Reg {
    Reg {
        name,
        offset,
        size,
        width,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted_aligned_and_disjoint() {
        for table in [DIST_REGS, RD_REGS, SGI_REGS] {
            for r in table {
                assert_eq!(r.offset % 4, 0, "{}", r.name);
                assert_eq!(r.size % 4, 0, "{}", r.name);
                assert!(r.offset + r.size <= 0x1_0000, "{}", r.name);
            }
            for w in table.windows(2) {
                assert!(
                    w[0].offset + w[0].size <= w[1].offset,
                    "{} overlaps {}",
                    w[0].name,
                    w[1].name
                );
            }
        }
        assert_eq!(ID_REGS[6] >> 4, 3, "PIDR2.ArchRev is GICv3");
    }
}
