//! The guest-physical memory map: one table used by the MMIO bus, the FDT,
//! the interrupt wiring and the backends' MMIO paths (each region's
//! [`MmioAccess`]). The layout follows QEMU's `virt` machine so a guest
//! built for it needs no changes.
//!
//! ```text
//! 0x0800_0000  GICv3 distributor (GICD)            64 KiB
//! 0x080A_0000  GICv3 redistributors (GICR)         128 KiB per vCPU (RD + SGI frames)
//! 0x0900_0000  PL011 UART                          4 KiB, SPI 1 (INTID 33), level
//! 0x0901_0000  PL031 RTC                           4 KiB, SPI 3 (INTID 35), level
//! 0x0910_0000  boot-timer                          4 KiB
//! 0x0A00_0000  virtio-mmio slot n                  0x200 each, SPI 16+n (INTID 48+n), level:
//!                                                  0 virtio-blk, 1 virtio-net
//! 0x4000_0000  RAM                                 --mem MiB; its last 16 KiB page holds the
//!                                                  VM generation ID, SPI 2 (INTID 34), edge
//! ```

/// First INTID of the shared peripheral interrupts (GICv3 spec, 2.2.1).
pub const SPI_BASE_INTID: u32 = 32;

/// Host-independent guest page granule used for dirty tracking and snapshot
/// memory files: 16 KiB, the Apple Silicon stage-2 granule.
pub const PAGE_SIZE: u64 = 16 * 1024;

/// Guest-physical base of RAM.
pub const RAM_BASE: u64 = 0x4000_0000;

/// Highest supported guest RAM size in bytes (IPA space above `RAM_BASE` that
/// fits a 36-bit IPA, the HVF default).
pub const RAM_MAX: u64 = (1 << 36) - RAM_BASE;

/// Guest RAM as a guest-physical range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    /// Guest-physical base (page aligned).
    pub base: u64,
    /// Size in bytes (a multiple of [`PAGE_SIZE`]).
    pub size: u64,
}

impl RamRange {
    /// Whether `gpa` lies in RAM.
    pub fn contains(&self, gpa: u64) -> bool {
        gpa >= self.base && gpa - self.base < self.size
    }

    /// Whether all of `[gpa, gpa + len)` lies in RAM (an empty range at the
    /// end of RAM does).
    pub fn contains_range(&self, gpa: u64, len: u64) -> bool {
        gpa >= self.base
            && gpa
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.size)
    }
}

/// Maximum number of vCPUs (the redistributor region is sized for this many;
/// the guest kernel is built with `NR_CPUS=8`).
pub const MAX_VCPUS: usize = 8;

/// GICv3 distributor base and size (GICv3 spec, 12.9: 64 KiB frame).
pub const GICD_BASE: u64 = 0x0800_0000;
/// Size of the distributor frame in bytes.
pub const GICD_SIZE: u64 = 0x1_0000;
/// GICv3 redistributor region base: one RD_base + SGI_base pair per vCPU.
pub const GICR_BASE: u64 = 0x080A_0000;
/// Bytes per vCPU in the redistributor region (two 64 KiB frames).
pub const GICR_STRIDE: u64 = 0x2_0000;
/// Size of the whole redistributor region in bytes (for `MAX_VCPUS`).
pub const GICR_SIZE: u64 = GICR_STRIDE * MAX_VCPUS as u64;
/// End of the guest-physical window reserved for the GIC (`GICD_BASE` up to
/// here); the first other device ([`PL011`]) starts at this address. An
/// in-kernel GIC may claim a redistributor region larger than
/// [`GICR_SIZE`] (one redistributor per vCPU the hypervisor supports) as
/// long as it ends within this window.
pub const GIC_WINDOW_END: u64 = 0x0900_0000;

/// Number of SPIs the distributor implements (INTIDs 32..32+NUM_SPIS).
pub const NUM_SPIS: u32 = 64;

/// PPI INTIDs of the ARM generic timer, as wired on QEMU virt and expected by
/// Linux's `arm,armv8-timer` binding (order: secure phys, non-secure phys,
/// virtual, hypervisor phys).
pub const TIMER_PPIS: [u32; 4] = [29, 30, 27, 26];
/// INTID of the EL1 virtual timer PPI (CNTV), the one the guest uses.
pub const VTIMER_INTID: u32 = TIMER_PPIS[2];
/// INTID of the EL1 (non-secure) physical timer PPI (CNTP), which the VMM
/// emulates (`machine::clock`).
pub const PTIMER_INTID: u32 = TIMER_PPIS[1];

/// The kind of device behind an MMIO region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// GICv3 distributor.
    GicDistributor,
    /// GICv3 redistributors (one RD + SGI frame pair per vCPU).
    GicRedistributors,
    /// ARM PL011 UART (console).
    Pl011,
    /// ARM PL031 real-time clock.
    Pl031,
    /// The boot-timer MMIO byte (logs `Guest-boot-time`).
    BootTimer,
    /// A virtio-mmio transport slot.
    VirtioMmio,
}

/// What a device region's registers require of the path that carries guest
/// accesses to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioAccess {
    /// Registers of at most 32 bits whose refused accesses read as zero or
    /// are ignored: a backend may serve the region through a path that
    /// splits an 8-byte access into two 4-byte ones and cannot raise an
    /// abort (the `emu` backend's unicorn MMIO callbacks).
    Split,
    /// 64-bit registers and exact access sizes, and a refused access must
    /// become a synchronous external abort: every access is trapped and
    /// emulated whole.
    Exact,
}

/// One MMIO device region in the memory map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioRegion {
    /// What sits here.
    pub kind: DeviceKind,
    /// Guest-physical base address.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
    /// The wired interrupt's INTID, if the device has one (level-triggered SPI).
    pub intid: Option<u32>,
    /// How guest accesses must reach the device.
    pub access: MmioAccess,
}

impl MmioRegion {
    /// Whether `gpa` lies in this region.
    pub fn contains(&self, gpa: u64) -> bool {
        gpa >= self.base && gpa - self.base < self.size
    }
}

/// GICv3 distributor region.
pub const GICD: MmioRegion = MmioRegion {
    kind: DeviceKind::GicDistributor,
    base: GICD_BASE,
    size: GICD_SIZE,
    intid: None,
    access: MmioAccess::Exact,
};

/// GICv3 redistributor region (for [`MAX_VCPUS`]).
pub const GICR: MmioRegion = MmioRegion {
    kind: DeviceKind::GicRedistributors,
    base: GICR_BASE,
    size: GICR_SIZE,
    intid: None,
    access: MmioAccess::Exact,
};

/// PL011 UART region.
pub const PL011: MmioRegion = MmioRegion {
    kind: DeviceKind::Pl011,
    base: GIC_WINDOW_END,
    size: 0x1000,
    intid: Some(SPI_BASE_INTID + 1),
    access: MmioAccess::Split,
};

/// PL031 real-time clock region: where QEMU's `virt` has its RTC, right
/// after the PL011. QEMU wires it to SPI 2, which here is the VM generation
/// ID's ([`VMGENID_INTID`]), so it takes the next free SPI, 3.
pub const PL031: MmioRegion = MmioRegion {
    kind: DeviceKind::Pl031,
    base: 0x0901_0000,
    size: 0x1000,
    intid: Some(SPI_BASE_INTID + 3),
    access: MmioAccess::Split,
};

/// Boot-timer region. The guest's init writes one byte here (its address is
/// passed on the kernel command line as `boottimer=`).
pub const BOOT_TIMER: MmioRegion = MmioRegion {
    kind: DeviceKind::BootTimer,
    base: 0x0910_0000,
    size: 0x1000,
    intid: None,
    access: MmioAccess::Split,
};

/// Base of the first virtio-mmio slot.
pub const VIRTIO_MMIO_BASE: u64 = 0x0A00_0000;
/// Bytes per virtio-mmio slot.
pub const VIRTIO_MMIO_SIZE: u64 = 0x200;
/// Number of virtio-mmio slots.
pub const VIRTIO_MMIO_SLOTS: u32 = 32;
/// INTID of virtio-mmio slot 0; slot n uses `VIRTIO_MMIO_INTID_BASE + n`.
pub const VIRTIO_MMIO_INTID_BASE: u32 = SPI_BASE_INTID + 16;

/// The region of virtio-mmio slot `n` (`n < VIRTIO_MMIO_SLOTS`).
pub const fn virtio_mmio(n: u32) -> MmioRegion {
    assert!(n < VIRTIO_MMIO_SLOTS);
    MmioRegion {
        kind: DeviceKind::VirtioMmio,
        base: VIRTIO_MMIO_BASE + n as u64 * VIRTIO_MMIO_SIZE,
        size: VIRTIO_MMIO_SIZE,
        intid: Some(VIRTIO_MMIO_INTID_BASE + n),
        access: MmioAccess::Split,
    }
}

/// All virtio-mmio slots as one region (no single interrupt).
pub const VIRTIO_MMIO_WINDOW: MmioRegion = MmioRegion {
    kind: DeviceKind::VirtioMmio,
    base: VIRTIO_MMIO_BASE,
    size: VIRTIO_MMIO_SIZE * VIRTIO_MMIO_SLOTS as u64,
    intid: None,
    access: MmioAccess::Split,
};

/// Every device region of the memory map (the virtio-mmio slots as one
/// window), with its access policy. Guest-physical addresses below
/// [`RAM_BASE`] outside these regions are backed by nothing.
pub const MMIO_REGIONS: [MmioRegion; 6] =
    [GICD, GICR, PL011, PL031, BOOT_TIMER, VIRTIO_MMIO_WINDOW];

/// Slot of the root block device (`/dev/vda`).
pub const VIRTIO_BLK_SLOT: u32 = 0;

/// Slot of the network device (`boot --net`; absent without it).
pub const VIRTIO_NET_SLOT: u32 = 1;

/// Slot of the vsock device (`boot --vsock-uds`; absent without it).
pub const VIRTIO_VSOCK_SLOT: u32 = 2;

/// The MMIO devices the VMM may wire to an interrupt (each a
/// level-triggered SPI; an absent device's line stays low).
pub const IRQ_DEVICES: [MmioRegion; 5] = [
    PL011,
    PL031,
    virtio_mmio(VIRTIO_BLK_SLOT),
    virtio_mmio(VIRTIO_NET_SLOT),
    virtio_mmio(VIRTIO_VSOCK_SLOT),
];

/// The VM generation ID's notification: an edge-triggered SPI (the guest has
/// no register to acknowledge it with).
pub const VMGENID_INTID: u32 = SPI_BASE_INTID + 2;

/// Bytes of the VM generation ID (a 128-bit identifier).
pub const VMGENID_SIZE: u64 = 16;

/// Guest-physical address of the VM generation ID: the start of the last
/// 16 KiB page of `ram`, which the device tree reserves (`no-map`), so the
/// guest reads it as a device and never allocates it.
pub const fn vmgenid_gpa(ram: RamRange) -> u64 {
    ram.base + ram.size - PAGE_SIZE
}

/// The part of `ram` the kernel Image and the DTB may be loaded into: all
/// of it but the VM generation ID's page.
pub const fn loadable_ram(ram: RamRange) -> RamRange {
    RamRange {
        base: ram.base,
        size: ram.size - PAGE_SIZE,
    }
}

/// The INTIDs of every device's SPI: [`IRQ_DEVICES`]' and
/// [`VMGENID_INTID`].
pub fn device_intids() -> impl Iterator<Item = u32> {
    IRQ_DEVICES
        .into_iter()
        .filter_map(|r| r.intid)
        .chain([VMGENID_INTID])
}

/// Frequency of the fixed `apb-pclk` clock the PL011 binding requires, in Hz.
pub const APB_PCLK_HZ: u32 = 24_000_000;

/// Alignment of the kernel Image in RAM (Linux arm64 boot protocol: 2 MiB).
pub const KERNEL_ALIGN: u64 = 2 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_sit_below_ram() {
        let mut regions = [
            (GICD_BASE, GICD_SIZE),
            (GICR_BASE, GICR_SIZE),
            (PL011.base, PL011.size),
            (PL031.base, PL031.size),
            (BOOT_TIMER.base, BOOT_TIMER.size),
            (
                VIRTIO_MMIO_BASE,
                VIRTIO_MMIO_SIZE * u64::from(VIRTIO_MMIO_SLOTS),
            ),
        ];
        regions.sort();
        let mut table = MMIO_REGIONS.map(|r| (r.base, r.size));
        table.sort();
        assert_eq!(table, regions, "MMIO_REGIONS lists every region");
        for w in regions.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "{:x?} overlaps {:x?}",
                w[0],
                w[1]
            );
        }
        let (last, size) = regions[regions.len() - 1];
        assert!(last + size <= RAM_BASE);
        // The GIC window holds the GIC and nothing else.
        const { assert!(GICR_BASE + GICR_SIZE <= GIC_WINDOW_END) };
        for (base, _) in regions {
            assert!(base == GICD_BASE || base == GICR_BASE || base >= GIC_WINDOW_END);
        }
        assert_eq!(
            device_intids().collect::<Vec<_>>(),
            [33, 35, 48, 49, 50, 34]
        );
    }

    #[test]
    fn the_vm_generation_id_takes_the_last_ram_page_and_nothing_loads_there() {
        let ram = RamRange {
            base: RAM_BASE,
            size: 64 << 20,
        };
        let gpa = vmgenid_gpa(ram);
        assert_eq!(gpa, RAM_BASE + (64 << 20) - 16 * 1024);
        assert!(ram.contains_range(gpa, PAGE_SIZE));
        let load = loadable_ram(ram);
        assert_eq!(load.base + load.size, gpa);
        assert!(!load.contains(gpa));
    }

    #[test]
    fn virtio_slots_follow_qemu_virt() {
        assert_eq!(virtio_mmio(0).intid, Some(48));
        assert_eq!(virtio_mmio(31).base, 0x0A00_3E00);
        assert!(virtio_mmio(1).contains(0x0A00_0200));
        assert!(!virtio_mmio(1).contains(0x0A00_0400));
        assert!(VIRTIO_MMIO_WINDOW.contains(virtio_mmio(31).base + VIRTIO_MMIO_SIZE - 1));
    }

    #[test]
    fn only_the_gic_needs_exact_accesses() {
        // The GIC has 64-bit registers (GICD_IROUTER<n>, GICR_TYPER); the
        // other devices' registers are at most 32 bits wide.
        for r in MMIO_REGIONS {
            let gic = matches!(
                r.kind,
                DeviceKind::GicDistributor | DeviceKind::GicRedistributors
            );
            assert_eq!(r.access == MmioAccess::Exact, gic, "{r:?}");
        }
    }
}
