//! Stage-1 translation of the EL1&0 regime (VMSAv8-64, Arm ARM D8), as a pure
//! function over a descriptor-reading closure.
//!
//! Unicorn's TLB is filled by the VMM (quirk 1): this walker decides
//! the physical address and the permissions, or the fault the guest gets.
//! Implemented: 4 KiB, 16 KiB and 64 KiB granules (TG0 and TG1 use different
//! encodings), T0SZ/T1SZ with the start level derived from them, EPD0/EPD1,
//! TBI0/TBI1, table descriptors with APTable/UXNTable/PXNTable, block and page
//! descriptors, AP bits 2:1, UXN/PXN, SCTLR_EL1.WXN, the implicit PXN of
//! EL0-writable memory, and access-flag faults (no FEAT_HAFDBS: the guest sets
//! AF itself). Output addresses are limited to 48 bits (no FEAT_LPA).

use crate::arch::esr;

/// The registers that control translation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// SCTLR_EL1 (M, bit 0: MMU enable; WXN, bit 19).
    pub sctlr: u64,
    /// TCR_EL1.
    pub tcr: u64,
    /// TTBR0_EL1.
    pub ttbr0: u64,
    /// TTBR1_EL1.
    pub ttbr1: u64,
}

/// Kind of access being translated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Data load.
    Read,
    /// Data store.
    Write,
    /// Instruction fetch.
    Fetch,
}

/// Access permissions granted by a translation, for one exception level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Perms {
    /// Loads allowed.
    pub read: bool,
    /// Stores allowed.
    pub write: bool,
    /// Instruction fetches allowed.
    pub exec: bool,
}

impl Perms {
    /// Read, write and execute.
    pub const ALL: Perms = Perms {
        read: true,
        write: true,
        exec: true,
    };

    /// Whether `access` is allowed.
    pub fn allows(self, access: Access) -> bool {
        match access {
            Access::Read => self.read,
            Access::Write => self.write,
            Access::Fetch => self.exec,
        }
    }
}

/// A successful translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Physical address of the translated byte.
    pub pa: u64,
    /// Permissions at the exception level of the walk.
    pub perms: Perms,
    /// Level of the leaf descriptor (0 with the MMU off).
    pub level: u8,
    /// Leaf AttrIndx (MAIR_EL1 index), 0 with the MMU off.
    pub attr_index: u8,
    /// Leaf shareability field (SH, bits 9:8 of the descriptor), 0 with the MMU off.
    pub sh: u8,
}

/// Why a translation failed: the fault status code (ISS.DFSC/IFSC) with its
/// lookup level, as the walker reports it (Arm ARM D8.15). The walker
/// produces address size, translation, access flag, permission and
/// external-abort-on-walk faults.
pub type Fault = esr::FaultStatus;

/// Reads 8-byte translation table descriptors by physical address.
pub trait TableMemory {
    /// The little-endian descriptor at `pa` (8-byte aligned), or `None` if
    /// `pa` is not backed by RAM.
    fn read_desc(&self, pa: u64) -> Option<u64>;
}

impl<F: Fn(u64) -> Option<u64>> TableMemory for F {
    fn read_desc(&self, pa: u64) -> Option<u64> {
        self(pa)
    }
}

/// Translation granule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granule {
    /// 4 KiB.
    K4,
    /// 16 KiB.
    K16,
    /// 64 KiB.
    K64,
}

impl Granule {
    /// log2 of the granule size in bytes.
    pub fn shift(self) -> u32 {
        match self {
            Granule::K4 => 12,
            Granule::K16 => 14,
            Granule::K64 => 16,
        }
    }

    /// TCR_EL1.TG0 encoding: 0b00 4K, 0b01 64K, 0b10 16K (0b11 reserved,
    /// treated as 4K like QEMU).
    pub fn from_tg0(tg0: u64) -> Self {
        match tg0 & 3 {
            1 => Granule::K64,
            2 => Granule::K16,
            _ => Granule::K4,
        }
    }

    /// TCR_EL1.TG1 encoding: 0b01 16K, 0b10 4K, 0b11 64K (0b00 reserved,
    /// treated as 4K like QEMU).
    pub fn from_tg1(tg1: u64) -> Self {
        match tg1 & 3 {
            1 => Granule::K16,
            3 => Granule::K64,
            _ => Granule::K4,
        }
    }

    /// Whether a block descriptor is allowed at `level` (VMSAv8-64 without
    /// FEAT_LPA/LPA2: 4K at levels 1 and 2, 16K and 64K at level 2).
    fn block_allowed(self, level: u8) -> bool {
        match self {
            Granule::K4 => level == 1 || level == 2,
            Granule::K16 | Granule::K64 => level == 2,
        }
    }
}

/// Output-address bits `[47:0]` of a descriptor.
const OA_MASK: u64 = 0x0000_FFFF_FFFF_FFFF;
/// Descriptor bits `[49:48]`: output-address bits beyond 48 bits (FEAT_LPA),
/// RES0 here. Bits 50 (GP) and 51 (DBM, Linux's PTE_WRITE) are attributes.
const OA_HIGH: u64 = 0x0003_0000_0000_0000;

/// TCR_EL1 fields for one half of the address space.
struct Half {
    tsz: u32,
    granule: Granule,
    epd: bool,
    tbi: bool,
    ttbr: u64,
}

fn half(regs: &Regs, upper: bool) -> Half {
    let tcr = regs.tcr;
    if upper {
        Half {
            tsz: ((tcr >> 16) & 0x3f) as u32,
            granule: Granule::from_tg1(tcr >> 30),
            epd: tcr & (1 << 23) != 0,
            tbi: tcr & (1 << 38) != 0,
            ttbr: regs.ttbr1,
        }
    } else {
        Half {
            tsz: (tcr & 0x3f) as u32,
            granule: Granule::from_tg0(tcr >> 14),
            epd: tcr & (1 << 7) != 0,
            tbi: tcr & (1 << 37) != 0,
            ttbr: regs.ttbr0,
        }
    }
}

/// Translates `va` for an access from exception level `el` (0 or 1) and
/// returns the physical address and the permissions of the mapping at that
/// level, or the fault. The access kind is checked by the caller with
/// [`Perms::allows`] (a permission fault is reported at
/// [`Translation::level`]); see [`translate_access`].
pub fn translate(
    regs: &Regs,
    va: u64,
    el: u8,
    mem: &impl TableMemory,
) -> Result<Translation, Fault> {
    if regs.sctlr & 1 == 0 {
        // MMU off: flat mapping, limited by the 48-bit physical address size.
        if va & !OA_MASK != 0 {
            return Err(Fault::address_size(0));
        }
        return Ok(Translation {
            pa: va,
            perms: Perms::ALL,
            level: 0,
            attr_index: 0,
            sh: 0,
        });
    }

    let upper = va & (1 << 55) != 0;
    let h = half(regs, upper);
    // ARMv8.0 limits: 16 <= TxSZ <= 39 (QEMU clamps the same way).
    let tsz = h.tsz.clamp(16, 39);
    let inputsize = 64 - tsz;

    // The bits above the input range must all equal bit 55 (bits [63:56]
    // are ignored with TBI).
    let top = if h.tbi { 55 } else { 63 };
    let width = top + 1 - inputsize;
    let mask = (1u64 << width) - 1;
    let high = (va >> inputsize) & mask;
    if (upper && high != mask) || (!upper && high != 0) {
        return Err(Fault::translation(0));
    }
    if h.epd {
        return Err(Fault::translation(0));
    }

    let gshift = h.granule.shift();
    let stride = gshift - 3;
    // Number of lookup levels: ceil((inputsize - gshift) / stride).
    let levels = (inputsize - gshift).div_ceil(stride);
    let start = (4 - levels) as u8;

    let level_shift = |l: u8| gshift + stride * (3 - u32::from(l));
    let first_bits = inputsize - level_shift(start);
    let table_align = (8u64 << first_bits).max(8) - 1;
    let mut table = h.ttbr & OA_MASK & !1 & !table_align;

    // Hierarchical attributes accumulated from table descriptors.
    let mut pxn_table = false;
    let mut uxn_table = false;
    let mut ap_table = 0u64;

    let mut level = start;
    loop {
        let shift = level_shift(level);
        let bits = if level == start { first_bits } else { stride };
        let index = (va >> shift) & ((1u64 << bits) - 1);
        let desc = mem
            .read_desc(table + index * 8)
            .ok_or(Fault::external_abort_on_walk(level))?;
        if desc & 1 == 0 {
            return Err(Fault::translation(level));
        }
        let is_table_or_page = desc & 2 != 0;
        if level < 3 && is_table_or_page {
            if desc & OA_HIGH != 0 {
                return Err(Fault::address_size(level));
            }
            pxn_table |= desc & (1 << 59) != 0;
            uxn_table |= desc & (1 << 60) != 0;
            ap_table |= (desc >> 61) & 3;
            table = desc & OA_MASK & !((1u64 << gshift) - 1);
            level += 1;
            continue;
        }
        if level == 3 && !is_table_or_page {
            // Level-3 descriptors with bit 1 clear are reserved.
            return Err(Fault::translation(level));
        }
        if level < 3 && !h.granule.block_allowed(level) {
            return Err(Fault::translation(level));
        }
        // Leaf (block or page).
        if desc & OA_HIGH != 0 {
            return Err(Fault::address_size(level));
        }
        if desc & (1 << 10) == 0 {
            return Err(Fault::access_flag(level));
        }
        let offset_mask = (1u64 << shift) - 1;
        let pa = (desc & OA_MASK & !offset_mask) | (va & offset_mask);
        let perms = leaf_perms(regs.sctlr, desc, ap_table, pxn_table, uxn_table, el);
        return Ok(Translation {
            pa,
            perms,
            level,
            attr_index: ((desc >> 2) & 7) as u8,
            sh: ((desc >> 8) & 3) as u8,
        });
    }
}

/// [`translate`] followed by the permission check for `access`.
pub fn translate_access(
    regs: &Regs,
    va: u64,
    el: u8,
    access: Access,
    mem: &impl TableMemory,
) -> Result<Translation, Fault> {
    let t = translate(regs, va, el, mem)?;
    if t.perms.allows(access) {
        Ok(t)
    } else {
        Err(Fault::permission(t.level))
    }
}

/// Stage-1 permissions of a leaf (Arm ARM D8.4), following QEMU's
/// `get_S1prot` for the interaction of the table attributes.
fn leaf_perms(sctlr: u64, desc: u64, ap_table: u64, pxn_t: bool, uxn_t: bool, el: u8) -> Perms {
    // AP[1] (bit 6): EL0 access; AP[2] (bit 7): read-only.
    let mut el0 = desc & (1 << 6) != 0;
    let mut ro = desc & (1 << 7) != 0;
    // APTable[0]: no EL0 access below; APTable[1]: no write access below.
    if ap_table & 1 != 0 {
        el0 = false;
    }
    if ap_table & 2 != 0 {
        ro = true;
    }
    let uxn = desc & (1 << 54) != 0 || uxn_t;
    let pxn = desc & (1 << 53) != 0 || pxn_t;
    let wxn = sctlr & (1 << 19) != 0;
    let el0_write = el0 && !ro;
    if el == 0 {
        Perms {
            read: el0,
            write: el0_write,
            exec: !(uxn || (wxn && el0_write)),
        }
    } else {
        let write = !ro;
        Perms {
            read: true,
            write,
            // Memory writable at EL0 is never executable at EL1.
            exec: !(pxn || el0_write || (wxn && write)),
        }
    }
}

/// Size of the leaf that translated `va` at lookup `level` (a
/// [`Translation::level`]), as log2 of bytes: the granule of `va`'s half of
/// the address space (TCR_EL1.TG0/TG1) at level 3, a block above it; 4 KiB
/// with the MMU off.
pub fn leaf_shift(regs: &Regs, va: u64, level: u8) -> u32 {
    if regs.sctlr & 1 == 0 {
        return 12;
    }
    let g = half(regs, va & (1 << 55) != 0).granule.shift();
    g + (g - 3) * (3 - u32::from(level.min(3)))
}

/// Every leaf size VMSAv8-64 has without FEAT_LPA/LPA2, as log2 of bytes:
/// 4K, 16K and 64K pages; 2M, 32M, 512M and 1G blocks.
const LEAF_SHIFTS: [u32; 7] = [12, 14, 16, 21, 25, 29, 30];
/// Bits of the [`FillLog`] filter (64 Ki: at a few hundred recorded leaves
/// a probe hits by chance well under 1 % of the time).
const FILL_LOG_BITS: usize = 1 << 16;

/// The leaves the TLB-fill hook has filled since the TLB was last flushed
/// whole, as a Bloom filter over (leaf size, leaf-aligned VA) keys, VA bits
/// `[55:0]` (a tagged address and the sign-extended TLBI operand give the
/// same key).
///
/// A TLBI by VA must drop every entry that translates that VA: each of
/// unicorn's 4 KiB entries comes from one fill of a leaf containing it, so
/// when no leaf of any size holding the VA was recorded, the TLB holds
/// nothing to drop and no flush is needed (QEMU drops only the page's own
/// entries; unicorn's API can only flush everything, quirk 13). False
/// positives only cost a flush that is made anyway.
#[derive(Clone)]
pub struct FillLog {
    bits: Box<[u64; FILL_LOG_BITS / 64]>,
    count: u64,
}

impl Default for FillLog {
    fn default() -> Self {
        FillLog {
            bits: Box::new([0; FILL_LOG_BITS / 64]),
            count: 0,
        }
    }
}

impl std::fmt::Debug for FillLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillLog")
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl FillLog {
    fn key(shift: u32, va: u64) -> usize {
        let region = (va & 0x00ff_ffff_ffff_ffff) >> shift;
        let h = (region ^ (u64::from(shift) << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> (64 - FILL_LOG_BITS.trailing_zeros())) as usize
    }

    /// Records a fill of `va` from a leaf of `1 << shift` bytes
    /// ([`leaf_shift`]).
    #[inline]
    pub fn record(&mut self, va: u64, shift: u32) {
        let k = Self::key(shift, va);
        self.bits[k / 64] |= 1 << (k % 64);
        self.count += 1;
    }

    /// Whether a leaf holding `va` may have been filled since the last
    /// [`FillLog::clear`].
    pub fn may_hold(&self, va: u64) -> bool {
        self.count != 0
            && LEAF_SHIFTS.iter().any(|&s| {
                let k = Self::key(s, va);
                self.bits[k / 64] & (1 << (k % 64)) != 0
            })
    }

    /// Whether nothing was filled since the last [`FillLog::clear`].
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Forgets every fill: call exactly when the whole TLB was flushed.
    pub fn clear(&mut self) {
        if self.count != 0 {
            self.bits.fill(0);
            self.count = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_shifts_follow_the_granule_of_each_half() {
        // TG0 = 16K (0b10 at bits 15:14), TG1 = 4K (0b10 at bits 31:30).
        let regs = Regs {
            sctlr: 1,
            tcr: (2 << 14) | (2 << 30),
            ..Regs::default()
        };
        let user = 0x0000_0000_0040_0000;
        let kernel = 0xffff_8000_0000_0000;
        assert_eq!(leaf_shift(&regs, user, 3), 14);
        assert_eq!(leaf_shift(&regs, user, 2), 25);
        assert_eq!(leaf_shift(&regs, kernel, 3), 12);
        assert_eq!(leaf_shift(&regs, kernel, 2), 21);
        assert_eq!(leaf_shift(&regs, kernel, 1), 30);
        // TG0 = 64K (0b01).
        let regs64 = Regs {
            tcr: 1 << 14,
            ..regs
        };
        assert_eq!(leaf_shift(&regs64, user, 3), 16);
        assert_eq!(leaf_shift(&regs64, user, 2), 29);
        let off = Regs { sctlr: 0, ..regs };
        assert_eq!(leaf_shift(&off, user, 0), 12);
    }

    #[test]
    fn the_fill_log_holds_every_address_of_a_recorded_leaf() {
        let mut log = FillLog::default();
        let page = 0xffff_8000_1234_c000u64; // 16 KiB aligned
        assert!(log.is_empty());
        assert!(!log.may_hold(page));
        log.record(page + 0x1000, 14);
        assert!(!log.is_empty());
        for off in [0, 0x1000, 0x2fff, 0x3ff8] {
            assert!(log.may_hold(page + off), "{off:#x}");
        }
        // The neighbouring 16 KiB pages were not filled.
        assert!(!log.may_hold(page + 0x4000));
        assert!(!log.may_hold(page - 0x4000));
        // A 32 MiB block: any address in it.
        let block = 0xffff_0000_0600_0000u64;
        log.record(block + 0x123_4000, 25);
        assert!(log.may_hold(block));
        assert!(log.may_hold(block + 0x1ff_c000));
        assert!(!log.may_hold(block + 0x200_0000));
        // A tagged address and the TLBI's sign-extended VA are one key.
        let user = 0x0000_ffff_8000_0000u64;
        log.record(user | (0x5a << 56), 14);
        assert!(log.may_hold(user));
        log.clear();
        assert!(log.is_empty());
        assert!(!log.may_hold(page) && !log.may_hold(block) && !log.may_hold(user));
    }
    use std::collections::HashMap;

    /// A sparse physical memory of descriptors.
    #[derive(Default)]
    struct Mem(HashMap<u64, u64>);

    impl Mem {
        fn set(&mut self, table: u64, index: u64, desc: u64) {
            self.0.insert(table + index * 8, desc);
        }
        fn reader(&self) -> impl Fn(u64) -> Option<u64> + '_ {
            move |pa| {
                if pa >= 0x8000_0000 {
                    None
                } else {
                    Some(self.0.get(&pa).copied().unwrap_or(0))
                }
            }
        }
    }

    const AF: u64 = 1 << 10;
    const TABLE: u64 = 3;
    const PAGE: u64 = 3;
    const BLOCK: u64 = 1;
    const AP_EL0: u64 = 1 << 6;
    const AP_RO: u64 = 1 << 7;
    const PXN: u64 = 1 << 53;
    const UXN: u64 = 1 << 54;

    fn tcr_16k(t0sz: u64, t1sz: u64) -> u64 {
        // TG0 = 0b10 (16K), TG1 = 0b01 (16K).
        t0sz | (2 << 14) | (t1sz << 16) | (1 << 30)
    }

    #[test]
    fn mmu_off_is_identity_with_all_permissions() {
        let regs = Regs::default();
        let t = translate(&regs, 0x4000_1234, 1, &Mem::default().reader()).unwrap();
        assert_eq!(t.pa, 0x4000_1234);
        assert_eq!(t.perms, Perms::ALL);
        let e = translate(&regs, 1 << 50, 1, &Mem::default().reader()).unwrap_err();
        assert_eq!(e, Fault::address_size(0));
    }

    #[test]
    fn granule_encodings_differ_between_tg0_and_tg1() {
        assert_eq!(Granule::from_tg0(0), Granule::K4);
        assert_eq!(Granule::from_tg0(1), Granule::K64);
        assert_eq!(Granule::from_tg0(2), Granule::K16);
        assert_eq!(Granule::from_tg1(1), Granule::K16);
        assert_eq!(Granule::from_tg1(2), Granule::K4);
        assert_eq!(Granule::from_tg1(3), Granule::K64);
    }

    /// 4K granule, 48-bit VA: four levels starting at level 0.
    #[test]
    fn walk_4k_four_levels_page_and_block() {
        let mut m = Mem::default();
        let (l0, l1, l2, l3) = (0x1000, 0x2000, 0x3000, 0x4000);
        let va: u64 = 0x0000_1234_5678_9abc;
        m.set(l0, (va >> 39) & 511, l1 | TABLE);
        m.set(l1, (va >> 30) & 511, l2 | TABLE);
        m.set(l2, (va >> 21) & 511, l3 | TABLE);
        m.set(l3, (va >> 12) & 511, 0x7654_3000 | PAGE | AF | AP_EL0);
        // 2 MiB block at level 2 for the next 2 MiB region.
        let vb = va + (1 << 21);
        m.set(l2, (vb >> 21) & 511, 0x4020_0000 | BLOCK | AF);
        let regs = Regs {
            sctlr: 1,
            tcr: 16, // T0SZ=16, TG0=4K
            ttbr0: l0,
            ttbr1: 0,
        };
        let t = translate(&regs, va, 0, &m.reader()).unwrap();
        assert_eq!(t.pa, 0x7654_3abc);
        assert_eq!(t.level, 3);
        assert_eq!(
            t.perms,
            Perms {
                read: true,
                write: true,
                exec: true
            }
        );
        let t = translate(&regs, vb, 1, &m.reader()).unwrap();
        assert_eq!(t.pa, 0x4020_0000 | (vb & 0x1f_ffff));
        assert_eq!(t.level, 2);
        // EL0 cannot access the block (AP[1] = 0).
        let t0 = translate(&regs, vb, 0, &m.reader()).unwrap();
        assert!(!t0.perms.read && !t0.perms.write);
    }

    /// 4K granule with T0SZ = 25 (39-bit VA) starts at level 1; a level-0
    /// style block is not allowed, a level-1 1 GiB block is.
    #[test]
    fn walk_4k_start_level_1_with_1g_block() {
        let mut m = Mem::default();
        let l1 = 0x1000;
        m.set(l1, 1, 0x4000_0000 | BLOCK | AF);
        let regs = Regs {
            sctlr: 1,
            tcr: 25,
            ttbr0: l1,
            ttbr1: 0,
        };
        let t = translate(&regs, 0x4012_3456, 1, &m.reader()).unwrap();
        assert_eq!((t.pa, t.level), (0x4012_3456, 1));
        // Out of range for a 39-bit VA.
        let e = translate(&regs, 1 << 40, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::translation(0));
    }

    /// 16K granule, 47-bit VA (Linux's ARM64_VA_BITS_47): three levels
    /// starting at level 1; TTBR1 upper half.
    #[test]
    fn walk_16k_kernel_half() {
        let mut m = Mem::default();
        let (l1, l2, l3) = (0x10000, 0x14000, 0x18000);
        let va: u64 = 0xffff_8000_1234_5678;
        let t1sz = 64 - 47;
        // Level 1: bits [46:36] (11 bits); level 2: [35:25]; level 3: [24:14].
        m.set(l1, (va >> 36) & 0x7ff, l2 | TABLE);
        m.set(l2, (va >> 25) & 0x7ff, l3 | TABLE);
        m.set(l3, (va >> 14) & 0x7ff, 0x4567_c000 | PAGE | AF | UXN);
        let regs = Regs {
            sctlr: 1,
            tcr: tcr_16k(17, t1sz),
            ttbr0: 0,
            ttbr1: l1,
        };
        let t = translate(&regs, va, 1, &m.reader()).unwrap();
        assert_eq!(t.pa, 0x4567_c000 | (va & 0x3fff));
        assert_eq!(t.level, 3);
        assert!(t.perms.exec && t.perms.write && t.perms.read);
        // Not canonical for a 47-bit upper half.
        let e = translate(&regs, 0xff00_0000_0000_0000, 1, &m.reader()).unwrap_err();
        assert_eq!(e.kind(), esr::FaultKind::Translation);
    }

    /// 16K granule, 48-bit VA: level 0 resolves one bit.
    #[test]
    fn walk_16k_48bit_starts_at_level_0() {
        let mut m = Mem::default();
        let (l0, l1, l2) = (0x10000, 0x14000, 0x18000);
        let va: u64 = 0x0000_8000_0200_0010;
        m.set(l0, (va >> 47) & 1, l1 | TABLE);
        m.set(l1, (va >> 36) & 0x7ff, l2 | TABLE);
        // A 32 MiB block at level 2.
        m.set(l2, (va >> 25) & 0x7ff, 0x4200_0000 | BLOCK | AF);
        let regs = Regs {
            sctlr: 1,
            tcr: tcr_16k(16, 16),
            ttbr0: l0,
            ttbr1: 0,
        };
        let t = translate(&regs, va, 1, &m.reader()).unwrap();
        assert_eq!((t.pa, t.level), (0x4200_0010, 2));
        // A block at level 1 is not valid with 16K pages.
        m.set(l1, (va >> 36) & 0x7ff, 0x4000_0000 | BLOCK | AF);
        let e = translate(&regs, va, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::translation(1));
    }

    /// 16K granule with a small input size starts at level 2.
    #[test]
    fn walk_16k_36bit_starts_at_level_2() {
        let mut m = Mem::default();
        let (l2, l3) = (0x10000, 0x14000);
        let va: u64 = 0x1_0000_4010;
        m.set(l2, (va >> 25) & 0x7ff, l3 | TABLE);
        m.set(l3, (va >> 14) & 0x7ff, 0x4010_0000 | PAGE | AF);
        let regs = Regs {
            sctlr: 1,
            tcr: tcr_16k(28, 28),
            ttbr0: l2,
            ttbr1: 0,
        };
        let t = translate(&regs, va, 1, &m.reader()).unwrap();
        assert_eq!((t.pa, t.level), (0x4010_0010, 3));
        let e = translate(&regs, va + 0x4000, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::translation(3));
    }

    /// 64K granule, 48-bit VA: three levels starting at level 1.
    #[test]
    fn walk_64k() {
        let mut m = Mem::default();
        let (l1, l2, l3) = (0x10000, 0x20000, 0x30000);
        let va: u64 = 0x0000_1234_5678_9abc;
        // Level 1: bits [47:42] (6 bits); level 2: [41:29]; level 3: [28:16].
        m.set(l1, (va >> 42) & 0x3f, l2 | TABLE);
        m.set(l2, (va >> 29) & 0x1fff, l3 | TABLE);
        m.set(l3, (va >> 16) & 0x1fff, 0x7650_0000 | PAGE | AF);
        let regs = Regs {
            sctlr: 1,
            tcr: 16 | (1 << 14), // TG0 = 64K
            ttbr0: l1,
            ttbr1: 0,
        };
        let t = translate(&regs, va, 1, &m.reader()).unwrap();
        assert_eq!((t.pa, t.level), (0x7650_0000 | (va & 0xffff), 3));
        // 512 MiB block at level 2.
        m.set(l2, (va >> 29) & 0x1fff, 0x6000_0000 | BLOCK | AF);
        let t = translate(&regs, va, 1, &m.reader()).unwrap();
        assert_eq!((t.pa, t.level), (0x6000_0000 | (va & 0x1fff_ffff), 2));
    }

    #[test]
    fn epd_and_reserved_level3_and_walk_outside_ram() {
        let mut m = Mem::default();
        let l3 = 0x14000;
        m.set(l3, 0, 0x4000_0000 | BLOCK | AF); // bit 1 clear at level 3
        let mut regs = Regs {
            sctlr: 1,
            tcr: tcr_16k(28, 28),
            ttbr0: 0x10000,
            ttbr1: 0,
        };
        m.set(0x10000, 0, l3 | TABLE);
        let e = translate(&regs, 0x10, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::translation(3));
        regs.tcr |= 1 << 7; // EPD0
        let e = translate(&regs, 0x10, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::translation(0));
        regs.tcr &= !(1 << 7);
        regs.ttbr0 = 0x9000_0000; // outside the test "RAM"
        let e = translate(&regs, 0x10, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::external_abort_on_walk(2));
    }

    fn one_page(desc_attrs: u64, table_attrs: u64, sctlr_extra: u64) -> (Mem, Regs) {
        let mut m = Mem::default();
        m.set(0x10000, 0, 0x14000 | TABLE | table_attrs);
        m.set(0x14000, 0, 0x4000_0000 | PAGE | desc_attrs);
        let regs = Regs {
            sctlr: 1 | sctlr_extra,
            tcr: tcr_16k(28, 28),
            ttbr0: 0x10000,
            ttbr1: 0,
        };
        (m, regs)
    }

    fn perms(desc: u64, table: u64, sctlr: u64, el: u8) -> Perms {
        let (m, regs) = one_page(desc | AF, table, sctlr);
        let t = translate(&regs, 0x123, el, &m.reader()).unwrap();
        t.perms
    }

    const fn p(read: bool, write: bool, exec: bool) -> Perms {
        Perms { read, write, exec }
    }

    #[test]
    fn ap_bits_and_execute_never() {
        // AP = 00: EL1 RW, EL0 none.
        assert_eq!(perms(0, 0, 0, 1), p(true, true, true));
        assert_eq!(perms(0, 0, 0, 0), p(false, false, true));
        // AP = 01: EL1 RW, EL0 RW; EL1 may not execute EL0-writable memory.
        assert_eq!(perms(AP_EL0, 0, 0, 1), p(true, true, false));
        assert_eq!(perms(AP_EL0, 0, 0, 0), p(true, true, true));
        // AP = 10: EL1 RO.
        assert_eq!(perms(AP_RO, 0, 0, 1), p(true, false, true));
        assert_eq!(perms(AP_RO, 0, 0, 0), p(false, false, true));
        // AP = 11: RO at both.
        assert_eq!(perms(AP_RO | AP_EL0, 0, 0, 1), p(true, false, true));
        assert_eq!(perms(AP_RO | AP_EL0, 0, 0, 0), p(true, false, true));
        // UXN / PXN.
        assert_eq!(perms(AP_RO | AP_EL0 | UXN, 0, 0, 0), p(true, false, false));
        assert_eq!(perms(AP_RO | AP_EL0 | UXN, 0, 0, 1), p(true, false, true));
        assert_eq!(perms(PXN, 0, 0, 1), p(true, true, false));
        // WXN makes writable memory execute-never.
        assert_eq!(perms(0, 0, 1 << 19, 1), p(true, true, false));
        assert_eq!(perms(AP_RO, 0, 1 << 19, 1), p(true, false, true));
    }

    #[test]
    fn hierarchical_table_attributes() {
        let ap_table0 = 1 << 61; // no EL0 access below
        let ap_table1 = 1 << 62; // no writes below
        let uxn_table = 1 << 60;
        let pxn_table = 1 << 59;
        assert_eq!(perms(AP_EL0, ap_table0, 0, 0), p(false, false, true));
        // With EL0 access removed, EL1 may execute again.
        assert_eq!(perms(AP_EL0, ap_table0, 0, 1), p(true, true, true));
        assert_eq!(perms(AP_EL0, ap_table1, 0, 0), p(true, false, true));
        assert_eq!(perms(0, ap_table1, 0, 1), p(true, false, true));
        assert_eq!(
            perms(AP_EL0 | AP_RO, uxn_table, 0, 0),
            p(true, false, false)
        );
        assert_eq!(perms(0, pxn_table, 0, 1), p(true, true, false));
    }

    #[test]
    fn access_flag_and_permission_faults() {
        let (m, regs) = one_page(AP_RO, 0, 0);
        let e = translate(&regs, 0, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::access_flag(3));
        let (m, regs) = one_page(AP_RO | AF, 0, 0);
        assert!(translate_access(&regs, 0, 1, Access::Read, &m.reader()).is_ok());
        let e = translate_access(&regs, 0, 1, Access::Write, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::permission(3));
        let e = translate_access(&regs, 0, 0, Access::Read, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::permission(3));
    }

    #[test]
    fn tbi_ignores_the_top_byte_only_when_enabled() {
        let (m, mut regs) = one_page(AF, 0, 0);
        let tagged = 0x5a00_0000_0000_0123;
        assert_eq!(
            translate(&regs, tagged, 1, &m.reader()).unwrap_err().kind(),
            esr::FaultKind::Translation
        );
        regs.tcr |= 1 << 37; // TBI0
        assert_eq!(
            translate(&regs, tagged, 1, &m.reader()).unwrap().pa,
            0x4000_0123
        );
    }

    #[test]
    fn output_address_above_48_bits_is_an_address_size_fault() {
        let (m, regs) = one_page(AF | (1 << 48), 0, 0);
        let e = translate(&regs, 0, 1, &m.reader()).unwrap_err();
        assert_eq!(e, Fault::address_size(3));
        // DBM (bit 51) and GP (bit 50) are attributes, not address bits.
        let (m, regs) = one_page(AF | (1 << 51) | (1 << 50), 0, 0);
        assert_eq!(translate(&regs, 0, 1, &m.reader()).unwrap().pa, 0x4000_0000);
    }
}
