//! Which GICv3 a VM has, and the backend-neutral decisions about an
//! in-kernel one.
//!
//! * [`GicMode`]: the userspace GICv3 model ([`crate::devices::gicv3`], every
//!   backend) or Hypervisor.framework's in-kernel GICv3 (`hv_gic_create`,
//!   macOS 15 and later, `hvf` backend only). Its [`GicMode::name`] is the
//!   one spelling used by `boot --gic`, the snapshot manifest's `gic_mode`,
//!   logs and the docs.
//! * [`KernelGic`]: the small interface the VMM core uses for an in-kernel
//!   GIC (SPI lines, the opaque state blob).
//! * [`check_kernel_gic_fit`]: whether the hypervisor's GIC frames fit the
//!   guest memory map of [`crate::arch::layout`] (which the FDT also
//!   describes).
//! * [`ICC_STATE_REGS`] / [`icc_state_to_restore`]: which GIC CPU-interface
//!   (`ICC_*_EL1`) registers a snapshot saves per vCPU, in which order, and
//!   what a saved list (also one of an earlier version) restores.
//!
//! These are pure so they are unit-tested on every host; the `hvf` backend
//! only makes the calls.

use crate::arch::layout::{self, GICD_BASE, GICR_BASE, GICR_STRIDE, SPI_BASE_INTID};
use crate::arch::sysreg::{
    SysReg, ICC_AP0R0_EL1, ICC_AP0R1_EL1, ICC_AP0R2_EL1, ICC_AP0R3_EL1, ICC_AP1R0_EL1,
    ICC_AP1R1_EL1, ICC_AP1R2_EL1, ICC_AP1R3_EL1, ICC_BPR0_EL1, ICC_BPR1_EL1, ICC_CTLR_EL1,
    ICC_IGRPEN0_EL1, ICC_IGRPEN1_EL1, ICC_PMR_EL1, ICC_SRE_EL1,
};
use std::fmt;
use std::str::FromStr;

/// Which interrupt controller a VM has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GicMode {
    /// The VMM's own GICv3 model: distributor and redistributors on the MMIO
    /// bus, the CPU interface through trapped `ICC_*` system registers.
    /// Works on every backend (on HVF, macOS 13 and later).
    #[default]
    Userspace,
    /// Hypervisor.framework's in-kernel GICv3 (`hv_gic_create`, macOS 15 and
    /// later): distributor, redistributors, CPU interface and the virtual
    /// timer's interrupt are handled by the hypervisor. `hvf` backend only.
    Hvf,
}

impl GicMode {
    /// Every mode, in `--help` order.
    pub const ALL: [GicMode; 2] = [GicMode::Userspace, GicMode::Hvf];

    /// The stable name: `userspace` or `hvf`.
    pub const fn name(self) -> &'static str {
        match self {
            GicMode::Userspace => "userspace",
            GicMode::Hvf => "hvf",
        }
    }
}

impl fmt::Display for GicMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A GIC mode name this build does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GIC mode '{0}' (this build knows 'userspace' and 'hvf')")]
pub struct UnknownGicMode(pub String);

impl FromStr for GicMode {
    type Err = UnknownGicMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GicMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownGicMode(s.to_string()))
    }
}

/// Why `--gic hvf` is refused with the `emu` backend (one line, as `boot`
/// prints it).
pub const NO_KERNEL_GIC_ON_EMU: &str =
    "--gic hvf: the in-kernel GIC exists only on the hvf backend (Hypervisor.framework); \
     the emu backend has the userspace GIC (--gic userspace)";

/// Why `--gic hvf` is refused on a Mac without the in-kernel GIC API.
pub const KERNEL_GIC_NEEDS_MACOS_15: &str =
    "--gic hvf needs macOS 15 or later (this system's Hypervisor.framework has no hv_gic_create); \
     use --gic userspace";

/// An in-kernel GICv3 as the VMM core sees it. Safe to use from any thread.
///
/// The distributor and redistributors are not on the VMM's MMIO bus, the
/// `ICC_*` registers are not trapped and the virtual timer's PPI is wired by
/// the hypervisor; the VMM only drives device interrupt lines and moves the
/// state in and out for snapshots. Per-vCPU CPU-interface registers go
/// through [`crate::hv::Vcpu::gic_cpu_state`] on the vCPU's own thread.
pub trait KernelGic: Send + Sync {
    /// Sets the level of SPI `intid` (an INTID, `>= 32`; level-triggered
    /// lines: `true` asserts, `false` deasserts).
    fn set_spi(&self, intid: u32, level: bool) -> crate::hv::Result<()>;
    /// The GIC's state (distributor, redistributors, pending and active
    /// state) as the hypervisor's opaque, versioned blob; excludes the
    /// per-vCPU CPU-interface registers. Every vCPU must be stopped.
    fn save(&self) -> crate::hv::Result<Vec<u8>>;
    /// Loads a blob from [`KernelGic::save`]. Call after every vCPU has been
    /// created and before any runs; then restore each vCPU's CPU-interface
    /// registers ([`crate::hv::Vcpu::set_gic_cpu_state`]).
    fn restore(&self, blob: &[u8]) -> crate::hv::Result<()>;
}

/// The in-kernel GIC's frame sizes, alignments and SPI range as the
/// hypervisor reports them (on HVF: `hv_gic_get_distributor_size`,
/// `hv_gic_get_distributor_base_alignment`,
/// `hv_gic_get_redistributor_region_size`, `hv_gic_get_redistributor_size`,
/// `hv_gic_get_redistributor_base_alignment`,
/// `hv_gic_get_spi_interrupt_range`). Sizes and alignments in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelGicParams {
    /// Size of the distributor frame.
    pub dist_size: u64,
    /// Required alignment of the distributor base.
    pub dist_align: u64,
    /// Size of the whole redistributor region the hypervisor claims (one
    /// redistributor per vCPU it supports, contiguous).
    pub redist_region_size: u64,
    /// Size of one vCPU's redistributor (RD_base + SGI_base frames).
    pub redist_size: u64,
    /// Required alignment of the redistributor region base.
    pub redist_align: u64,
    /// First SPI INTID.
    pub spi_base: u32,
    /// Number of SPIs.
    pub spi_count: u32,
}

/// Why an in-kernel GIC does not fit the guest memory map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GicFitError {
    /// An alignment is zero or not a power of two.
    #[error(
        "the hypervisor reports a {what} alignment of {align:#x}, which is not a power of two"
    )]
    BadAlignment {
        /// Which frame.
        what: &'static str,
        /// The reported alignment.
        align: u64,
    },
    /// A base address is not aligned as required.
    #[error("the {what} base {base:#x} is not aligned to the hypervisor's {align:#x}")]
    Misaligned {
        /// Which frame.
        what: &'static str,
        /// Our base address.
        base: u64,
        /// The required alignment.
        align: u64,
    },
    /// The distributor frame would overlap the redistributors.
    #[error("the hypervisor's distributor ({size:#x} bytes at {GICD_BASE:#x}) overlaps the redistributors at {GICR_BASE:#x}")]
    DistributorTooLarge {
        /// The reported size.
        size: u64,
    },
    /// One redistributor is not the size the FDT describes.
    #[error("the hypervisor's redistributor is {size:#x} bytes per vCPU; the memory map and FDT use {GICR_STRIDE:#x}")]
    RedistributorSize {
        /// The reported size.
        size: u64,
    },
    /// The redistributor region does not fit below the next device.
    #[error("the hypervisor's redistributor region ({size:#x} bytes at {GICR_BASE:#x}) would overlap the device at {limit:#x}")]
    RedistributorRegionTooLarge {
        /// The reported region size.
        size: u64,
        /// Where the next device region starts.
        limit: u64,
    },
    /// The region has room for fewer vCPUs than the VM has.
    #[error("the hypervisor's redistributor region holds {fits} vCPUs; this VM has {vcpus}")]
    TooManyVcpus {
        /// vCPUs the region holds.
        fits: u64,
        /// vCPUs requested.
        vcpus: usize,
    },
    /// A device's interrupt is outside the hypervisor's SPI range.
    #[error("INTID {intid} is outside the hypervisor's SPI range {base}..{end}")]
    SpiOutOfRange {
        /// The device INTID.
        intid: u32,
        /// First SPI.
        base: u32,
        /// One past the last SPI.
        end: u64,
    },
}

/// Checks that an in-kernel GIC with `p` can sit at this VMM's
/// [`layout::GICD_BASE`] and [`layout::GICR_BASE`] (the addresses the FDT
/// gives the guest) for `vcpus` vCPUs, without claiming any other device's
/// addresses, and that every device INTID the VMM wires is one of its SPIs.
pub fn check_kernel_gic_fit(p: &KernelGicParams, vcpus: usize) -> Result<(), GicFitError> {
    for (what, base, align) in [
        ("distributor", GICD_BASE, p.dist_align),
        ("redistributor", GICR_BASE, p.redist_align),
    ] {
        if !align.is_power_of_two() {
            return Err(GicFitError::BadAlignment { what, align });
        }
        if base % align != 0 {
            return Err(GicFitError::Misaligned { what, base, align });
        }
    }
    if p.dist_size > GICR_BASE - GICD_BASE {
        return Err(GicFitError::DistributorTooLarge { size: p.dist_size });
    }
    if p.redist_size != GICR_STRIDE {
        return Err(GicFitError::RedistributorSize {
            size: p.redist_size,
        });
    }
    let limit = layout::GIC_WINDOW_END;
    if p.redist_region_size > limit - GICR_BASE {
        return Err(GicFitError::RedistributorRegionTooLarge {
            size: p.redist_region_size,
            limit,
        });
    }
    let fits = p.redist_region_size / GICR_STRIDE;
    if (vcpus as u64) > fits {
        return Err(GicFitError::TooManyVcpus { fits, vcpus });
    }
    let end = u64::from(p.spi_base) + u64::from(p.spi_count);
    for intid in layout::device_intids() {
        if intid < p.spi_base.max(SPI_BASE_INTID) || u64::from(intid) >= end {
            return Err(GicFitError::SpiOutOfRange {
                intid,
                base: p.spi_base,
                end,
            });
        }
    }
    Ok(())
}

/// The CPU-interface registers a snapshot saves for one vCPU of an in-kernel
/// GIC, in save and restore order: those of Hypervisor.framework's
/// `hv_gic_icc_reg_t` (macOS 15 `hv_gic_types.h`) but RPR (read-only,
/// derived from the active priorities) and SRE_EL2 (no EL2 in the guest).
/// IAR/EOIR/DIR/HPPIR/SGI are operations, not state.
///
/// The framework has one active-priority register per group, AP0R0 and
/// AP1R0, whatever ICC_CTLR_EL1.PRIbits says; `hv_gic_get_icc_reg` takes
/// no other. Order (QEMU's `hw/intc/arm_gicv3_hvf.c`,
/// `hvf_gicv3_put_cpu`): SRE first (it selects the system-register
/// interface), CTLR, the group enables, PMR, the binary points, then the
/// active priorities of group 0 and group 1.
pub const ICC_STATE_REGS: [SysReg; 9] = [
    ICC_SRE_EL1,
    ICC_CTLR_EL1,
    ICC_IGRPEN0_EL1,
    ICC_IGRPEN1_EL1,
    ICC_PMR_EL1,
    ICC_BPR0_EL1,
    ICC_BPR1_EL1,
    ICC_AP0R0_EL1,
    ICC_AP1R0_EL1,
];

/// Active-priority registers that snapshots of an earlier version saved
/// when ICC_CTLR_EL1.PRIbits implied them, and that Hypervisor.framework
/// does not have.
const ICC_EXTRA_APRS: [SysReg; 6] = [
    ICC_AP0R1_EL1,
    ICC_AP0R2_EL1,
    ICC_AP0R3_EL1,
    ICC_AP1R1_EL1,
    ICC_AP1R2_EL1,
    ICC_AP1R3_EL1,
];

/// The registers to write back from an untrusted saved CPU-interface
/// state: exactly [`ICC_STATE_REGS`], in that order.
///
/// Snapshots of an earlier version also saved `ICC_AP0R<n>_EL1` and
/// `ICC_AP1R<n>_EL1` for n = 1 to 3 when ICC_CTLR_EL1.PRIbits implied them.
/// Each may appear once, anywhere, and is dropped if it is zero (no active
/// priority in its range, the only value the framework's GIC can hold);
/// a non-zero one cannot be restored and is an error naming it.
pub fn icc_state_to_restore(state: &[(SysReg, u64)]) -> Result<Vec<(SysReg, u64)>, String> {
    let mut extras = Vec::new();
    let mut kept = Vec::with_capacity(ICC_STATE_REGS.len());
    for &(reg, value) in state {
        if !ICC_EXTRA_APRS.contains(&reg) {
            kept.push((reg, value));
        } else if extras.contains(&reg) {
            return Err(format!("the GIC CPU-interface state holds {reg} twice"));
        } else if value != 0 {
            return Err(format!(
                "the GIC CPU-interface state holds {reg} = {value:#x}, an active priority \
                 Hypervisor.framework's GIC cannot hold (it has ICC_AP0R0_EL1 and \
                 ICC_AP1R0_EL1 only)"
            ));
        } else {
            extras.push(reg);
        }
    }
    let have: Vec<SysReg> = kept.iter().map(|&(r, _)| r).collect();
    if have != ICC_STATE_REGS {
        return Err(format!(
            "the GIC CPU-interface state holds {have:?}; expected {ICC_STATE_REGS:?}"
        ));
    }
    Ok(kept)
}

/// Checks an untrusted saved CPU-interface state
/// ([`icc_state_to_restore`]).
pub fn check_icc_state(state: &[(SysReg, u64)]) -> Result<(), String> {
    icc_state_to_restore(state).map(drop)
}

/// How long a vCPU that exited on WFI sleeps at most with an in-kernel GIC.
///
/// With an in-kernel GIC the VMM cannot see whether an interrupt is pending
/// for a vCPU (the hypervisor holds the CPU interface, and SGIs between
/// vCPUs never leave it), so a WFI exit, if the hypervisor reports one,
/// sleeps until the vtimer deadline, a device interrupt, a kick, or this
/// long, whichever comes first, and then lets the hypervisor decide.
pub const KERNEL_GIC_WFI_MAX_SLEEP: std::time::Duration = std::time::Duration::from_millis(1);

/// Whether a vCPU sleeping in WFI runs again.
///
/// `pending`: its IRQ line when the VMM knows it (userspace GIC), `None`
/// when it cannot (in-kernel GIC). `due`: its wake-up deadline has passed.
/// `interrupts_since`: a device interrupt was raised or another vCPU was
/// started since it went to sleep.
pub fn wfi_wakes(pending: Option<bool>, due: bool, interrupts_since: bool) -> bool {
    due || pending.unwrap_or(interrupts_since)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::sysreg::ICC_RPR_EL1;

    /// What HVF reports on an M-series Mac as far as the API documents it:
    /// 64 KiB distributor, two 64 KiB frames per redistributor, 64 KiB
    /// alignment.
    fn hvf_like() -> KernelGicParams {
        KernelGicParams {
            dist_size: 0x1_0000,
            dist_align: 0x1_0000,
            redist_region_size: 0x2_0000 * 8,
            redist_size: 0x2_0000,
            redist_align: 0x1_0000,
            spi_base: 32,
            spi_count: 988,
        }
    }

    #[test]
    fn names_are_stable_and_parse_back() {
        assert_eq!(GicMode::Userspace.name(), "userspace");
        assert_eq!(GicMode::Hvf.name(), "hvf");
        for m in GicMode::ALL {
            assert_eq!(m.name().parse::<GicMode>(), Ok(m));
            assert_eq!(m.to_string(), m.name());
        }
        assert_eq!(GicMode::default(), GicMode::Userspace);
        let e = "kernel".parse::<GicMode>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown GIC mode 'kernel' (this build knows 'userspace' and 'hvf')"
        );
        assert!("HVF".parse::<GicMode>().is_err());
    }

    #[test]
    fn layout_fits_an_hvf_like_gic() {
        for vcpus in 1..=layout::MAX_VCPUS {
            assert_eq!(check_kernel_gic_fit(&hvf_like(), vcpus), Ok(()));
        }
        // A region sized for many more vCPUs still fits below the PL011.
        let big = KernelGicParams {
            redist_region_size: 0x2_0000 * 64,
            ..hvf_like()
        };
        assert_eq!(check_kernel_gic_fit(&big, 8), Ok(()));
    }

    #[test]
    fn alignment_misfits_are_refused_with_the_reason() {
        let fit = |p: KernelGicParams, v| check_kernel_gic_fit(&p, v);
        let base = hvf_like();
        assert!(matches!(
            fit(
                KernelGicParams {
                    dist_align: 0x1000_0000,
                    ..base
                },
                1
            ),
            Err(GicFitError::Misaligned {
                what: "distributor",
                ..
            })
        ));
        assert!(matches!(
            fit(
                KernelGicParams {
                    redist_align: 0x10_0000,
                    ..base
                },
                1
            ),
            Err(GicFitError::Misaligned {
                what: "redistributor",
                ..
            })
        ));
        assert!(matches!(
            fit(
                KernelGicParams {
                    dist_align: 0x3000,
                    ..base
                },
                1
            ),
            Err(GicFitError::BadAlignment { .. })
        ));
        assert!(matches!(
            fit(
                KernelGicParams {
                    dist_align: 0,
                    ..base
                },
                1
            ),
            Err(GicFitError::BadAlignment { .. })
        ));
    }

    #[test]
    fn size_and_range_misfits_are_refused_with_the_reason() {
        let fit = |p: KernelGicParams, v| check_kernel_gic_fit(&p, v);
        let base = hvf_like();
        assert_eq!(
            fit(
                KernelGicParams {
                    dist_size: 0x10_0000,
                    ..base
                },
                1
            ),
            Err(GicFitError::DistributorTooLarge { size: 0x10_0000 })
        );
        assert_eq!(
            fit(
                KernelGicParams {
                    redist_size: 0x4_0000,
                    ..base
                },
                1
            ),
            Err(GicFitError::RedistributorSize { size: 0x4_0000 })
        );
        assert!(matches!(
            fit(
                KernelGicParams {
                    redist_region_size: 0x100_0000,
                    ..base
                },
                1
            ),
            Err(GicFitError::RedistributorRegionTooLarge { .. })
        ));
        assert_eq!(
            fit(
                KernelGicParams {
                    redist_region_size: 0x2_0000 * 2,
                    ..base
                },
                4
            ),
            Err(GicFitError::TooManyVcpus { fits: 2, vcpus: 4 })
        );
        // The PL011's SPI (INTID 33) must be in range.
        assert!(matches!(
            fit(
                KernelGicParams {
                    spi_base: 40,
                    ..base
                },
                1
            ),
            Err(GicFitError::SpiOutOfRange { intid: 33, .. })
        ));
        // virtio-blk's INTID 48 must be in range.
        assert!(matches!(
            fit(
                KernelGicParams {
                    spi_count: 16,
                    ..base
                },
                1
            ),
            Err(GicFitError::SpiOutOfRange { intid: 48, .. })
        ));
    }

    #[test]
    fn icc_registers_are_apples() {
        // hv_gic_icc_reg_t's values (macOS 15 SDK) are our packing.
        let apple: [(SysReg, u16); 9] = [
            (ICC_SRE_EL1, 0xc665),
            (ICC_CTLR_EL1, 0xc664),
            (ICC_IGRPEN0_EL1, 0xc666),
            (ICC_IGRPEN1_EL1, 0xc667),
            (ICC_PMR_EL1, 0xc230),
            (ICC_BPR0_EL1, 0xc643),
            (ICC_BPR1_EL1, 0xc663),
            (ICC_AP0R0_EL1, 0xc644),
            (ICC_AP1R0_EL1, 0xc648),
        ];
        assert_eq!(ICC_STATE_REGS, apple.map(|(r, _)| r));
        for (r, v) in apple {
            assert_eq!(r.0, v, "{r}");
        }
    }

    /// A saved state of [`ICC_STATE_REGS`] with distinct values.
    fn saved() -> Vec<(SysReg, u64)> {
        (1..).zip(ICC_STATE_REGS).map(|(v, r)| (r, v)).collect()
    }

    #[test]
    fn saved_icc_state_is_checked() {
        let good = saved();
        assert_eq!(icc_state_to_restore(&good), Ok(good.clone()));
        assert_eq!(check_icc_state(&good), Ok(()));
        assert!(check_icc_state(&[]).is_err());
        // A register missing, reordered, or one too many.
        let mut short = good.clone();
        short.pop();
        assert!(check_icc_state(&short).is_err());
        let mut swapped = good.clone();
        swapped.swap(2, 3);
        assert!(check_icc_state(&swapped).is_err());
        let mut twice = good.clone();
        twice.push((ICC_PMR_EL1, 0));
        assert!(check_icc_state(&twice).is_err());
        let mut other = good;
        other.push((ICC_RPR_EL1, 0));
        assert!(check_icc_state(&other).is_err());
    }

    /// What an earlier version saved with 7 or 8 priority bits: AP0R3..0
    /// after BPR1, then AP1R3..0.
    fn saved_by_earlier_version(extra: u64) -> Vec<(SysReg, u64)> {
        let mut old = saved();
        let ap1r0 = old.pop().unwrap();
        let ap0r0 = old.pop().unwrap();
        old.extend([
            (ICC_AP0R3_EL1, extra),
            (ICC_AP0R2_EL1, 0),
            (ICC_AP0R1_EL1, 0),
            ap0r0,
            (ICC_AP1R3_EL1, 0),
            (ICC_AP1R2_EL1, 0),
            (ICC_AP1R1_EL1, 0),
            ap1r0,
        ]);
        old
    }

    #[test]
    fn earlier_snapshots_with_zero_extra_active_priorities_restore() {
        assert_eq!(
            icc_state_to_restore(&saved_by_earlier_version(0)),
            Ok(saved())
        );
        // 6 priority bits: one extra per group.
        let mut six = saved();
        six.insert(7, (ICC_AP0R1_EL1, 0));
        six.insert(9, (ICC_AP1R1_EL1, 0));
        assert_eq!(icc_state_to_restore(&six), Ok(saved()));
    }

    #[test]
    fn earlier_snapshots_with_live_extra_active_priorities_are_refused() {
        let e = icc_state_to_restore(&saved_by_earlier_version(0x8000_0000)).unwrap_err();
        assert!(e.contains("ICC_AP0R3_EL1 = 0x80000000"), "{e}");
        assert!(e.contains("cannot hold"), "{e}");
        // The same extra register twice is damage, even when zero.
        let mut twice = saved();
        twice.push((ICC_AP1R2_EL1, 0));
        twice.push((ICC_AP1R2_EL1, 0));
        let e = icc_state_to_restore(&twice).unwrap_err();
        assert!(e.contains("ICC_AP1R2_EL1 twice"), "{e}");
    }

    #[test]
    fn wfi_wake_rule() {
        // Userspace GIC: the line decides, or the deadline.
        assert!(wfi_wakes(Some(true), false, false));
        assert!(!wfi_wakes(Some(false), false, true));
        assert!(wfi_wakes(Some(false), true, false));
        // In-kernel GIC: any interrupt activity, or the deadline.
        assert!(!wfi_wakes(None, false, false));
        assert!(wfi_wakes(None, false, true));
        assert!(wfi_wakes(None, true, false));
    }
}
