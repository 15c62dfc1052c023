//! The VM's interrupt controller as the machine uses it: the userspace
//! GICv3 model or an in-kernel GIC, behind the few operations the run loop,
//! the devices and snapshots need. Nothing else in the machine knows which
//! one it has.

use crate::arch::layout::{PTIMER_INTID, VTIMER_INTID};
use crate::arch::sysreg::SysReg;
use crate::devices::bus::BusRegion;
use crate::devices::gicv3::{GicDistMmio, GicRedistMmio, GicState, Gicv3, VcpuSet};
use crate::devices::Persist;
use crate::hv::{GicMode, KernelGic, VcpuId};
use crate::sync::Locked;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// The interrupt controller's state, by [`GicMode`]. Serialised as
/// `{"userspace": {...}}` or `{"hvf": "<hex>"}` (the mode names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqchipState {
    /// The userspace GICv3 model's state.
    Userspace(GicState),
    /// Hypervisor.framework's in-kernel GIC: its opaque, versioned
    /// `hv_gic_state` blob ([`hv::KernelGic::save`]).
    Hvf(#[serde(with = "hex_bytes")] Vec<u8>),
}

impl IrqchipState {
    /// The mode this state belongs to.
    pub fn mode(&self) -> GicMode {
        match self {
            IrqchipState::Userspace(_) => GicMode::Userspace,
            IrqchipState::Hvf(_) => GicMode::Hvf,
        }
    }
}

/// Bytes as a lowercase hex string (compact in JSON, unlike an array).
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&snapshot_store::hex(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let hex = String::deserialize(d)?;
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom("hex string of odd length"));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom("invalid hex digit"))
            })
            .collect()
    }
}

/// The interrupt controller of a running VM.
#[derive(Clone)]
pub enum Irqchip {
    /// The userspace GICv3 model: distributor and redistributors on the MMIO
    /// bus, the CPU interface through trapped `ICC_*` registers, the vtimer
    /// PPI driven by the backend's [`crate::hv::VcpuIo::vtimer_level`].
    Userspace(Arc<Mutex<Gicv3>>),
    /// An in-kernel GIC: the hypervisor owns the frames, the CPU interface
    /// and the vtimer PPI; the VMM drives only device SPIs.
    Kernel(Arc<dyn KernelGic>),
}

/// An in-kernel GIC's saved state, loaded once every vCPU exists and before
/// any runs (each vCPU's CPU-interface registers go in after it: QEMU's
/// order).
pub struct PendingKernelGicState {
    gic: Arc<dyn KernelGic>,
    blob: Vec<u8>,
}

impl PendingKernelGicState {
    /// Loads the state; call once every vCPU is created
    /// ([`crate::machine::vcpu::run_state::RunState::wait_created`]) and before any runs.
    pub fn load(self) -> crate::hv::Result<()> {
        self.gic.restore(&self.blob)
    }
}

impl Irqchip {
    /// The interrupt controller of a VM of `cpus` vCPUs in `mode`: the
    /// userspace GIC, fresh or restored from `saved` (untrusted), or the
    /// VM's in-kernel GIC `kernel` (created with the VM by the `backend`),
    /// whose saved state is returned to be loaded once the vCPUs exist.
    pub fn build(
        mode: GicMode,
        kernel: Option<Arc<dyn KernelGic>>,
        cpus: usize,
        saved: Option<&IrqchipState>,
        backend: &str,
    ) -> anyhow::Result<(Irqchip, Option<PendingKernelGicState>)> {
        Ok(match (mode, kernel, saved) {
            (GicMode::Userspace, _, None) => (
                Irqchip::Userspace(Arc::new(Mutex::new(Gicv3::new(cpus)))),
                None,
            ),
            (GicMode::Userspace, _, Some(IrqchipState::Userspace(g))) => (
                Irqchip::Userspace(Arc::new(Mutex::new(
                    Gicv3::restore(cpus, g).context("cannot restore the GIC")?,
                ))),
                None,
            ),
            (GicMode::Userspace, _, Some(IrqchipState::Hvf(_))) => {
                bail!("the snapshot's GIC state is not the userspace GIC's")
            }
            (GicMode::Hvf, Some(k), saved) => {
                let pending = match saved {
                    None => None,
                    Some(IrqchipState::Hvf(blob)) => Some(PendingKernelGicState {
                        gic: k.clone(),
                        blob: blob.clone(),
                    }),
                    Some(IrqchipState::Userspace(_)) => {
                        bail!("the snapshot's GIC state is not the in-kernel GIC's")
                    }
                };
                (Irqchip::Kernel(k), pending)
            }
            (GicMode::Hvf, None, _) => {
                bail!("the {backend} backend created the VM without an in-kernel GIC")
            }
        })
    }

    /// The mode, as recorded in snapshots.
    pub fn mode(&self) -> GicMode {
        match self {
            Irqchip::Userspace(_) => GicMode::Userspace,
            Irqchip::Kernel(_) => GicMode::Hvf,
        }
    }

    /// The MMIO regions the VMM must serve: the userspace GIC's distributor
    /// and `vcpus` redistributors; none for an in-kernel GIC (the hypervisor
    /// serves those addresses).
    pub fn mmio_regions(&self, vcpus: usize) -> Vec<BusRegion> {
        use crate::arch::layout::{GICD_BASE, GICD_SIZE, GICR_BASE, GICR_STRIDE};
        match self {
            Irqchip::Userspace(gic) => vec![
                (
                    "gicd",
                    GICD_BASE,
                    GICD_SIZE,
                    Arc::new(Mutex::new(GicDistMmio(gic.clone()))),
                ),
                (
                    "gicr",
                    GICR_BASE,
                    GICR_STRIDE * vcpus as u64,
                    Arc::new(Mutex::new(GicRedistMmio(gic.clone()))),
                ),
            ],
            Irqchip::Kernel(_) => Vec::new(),
        }
    }

    /// Sets a device's level-triggered SPI.
    pub fn set_spi(&self, intid: u32, level: bool) {
        match self {
            Irqchip::Userspace(gic) => gic.locked().set_spi_level(intid, level),
            Irqchip::Kernel(k) => {
                if let Err(e) = k.set_spi(intid, level) {
                    crate::warn_ratelimited!("in-kernel GIC: SPI {intid} level {level}: {e}");
                }
            }
        }
    }

    /// The vCPUs with an interrupt pending, if the VMM can know
    /// (userspace GIC); `None` for an in-kernel GIC.
    pub fn pending_vcpus(&self) -> Option<VcpuSet> {
        match self {
            Irqchip::Userspace(gic) => Some(gic.locked().pending_vcpus()),
            Irqchip::Kernel(_) => None,
        }
    }

    /// Whether `vcpu`'s IRQ line is asserted, if the VMM can know.
    pub fn irq_pending(&self, vcpu: VcpuId) -> Option<bool> {
        match self {
            Irqchip::Userspace(gic) => Some(gic.locked().irq_pending(vcpu)),
            Irqchip::Kernel(_) => None,
        }
    }

    /// A trapped `MRS` of a CPU-interface register. An in-kernel GIC's
    /// registers are not trapped, so there is nothing to answer: `None`.
    pub fn sysreg_read(&self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        match self {
            Irqchip::Userspace(gic) => gic.locked().sysreg_read(vcpu, reg),
            Irqchip::Kernel(_) => None,
        }
    }

    /// A trapped `MSR`: `None` if the register is not the GIC's (or the GIC
    /// is in-kernel), else the vCPUs whose pending state changed.
    pub fn sysreg_write(&self, vcpu: VcpuId, reg: SysReg, value: u64) -> Option<VcpuSet> {
        match self {
            Irqchip::Userspace(gic) => gic.locked().sysreg_write(vcpu, reg, value),
            Irqchip::Kernel(_) => None,
        }
    }

    /// The vCPU's virtual timer output changed. An in-kernel GIC gets the
    /// timer from the hypervisor, which does not report it.
    pub fn vtimer_level(&self, vcpu: VcpuId, level: bool) {
        if let Irqchip::Userspace(gic) = self {
            gic.locked().set_ppi_level(vcpu, VTIMER_INTID, level);
        }
    }

    /// The vCPU's EL1 physical timer output changed (the timer is the
    /// VMM's, `crate::machine::vcpu::clock`). Hypervisor.framework's in-kernel GIC has no
    /// call to drive a PPI, so it does not get it.
    pub fn ptimer_level(&self, vcpu: VcpuId, level: bool) {
        if let Irqchip::Userspace(gic) = self {
            gic.locked().set_ppi_level(vcpu, PTIMER_INTID, level);
        }
    }

    /// The GIC's state for a snapshot (every vCPU stopped). The per-vCPU
    /// registers of an in-kernel GIC are in each vCPU's state.
    pub fn save(&self) -> crate::hv::Result<IrqchipState> {
        Ok(match self {
            Irqchip::Userspace(gic) => IrqchipState::Userspace(gic.locked().save()),
            Irqchip::Kernel(k) => IrqchipState::Hvf(k.save()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::{GICD_BASE, GICR_BASE};
    use crate::arch::sysreg::ICC_PMR_EL1;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An in-kernel GIC that records SPI levels.
    #[derive(Default)]
    struct RecordingGic {
        spis: Mutex<Vec<(u32, bool)>>,
        saves: AtomicUsize,
    }

    impl KernelGic for RecordingGic {
        fn set_spi(&self, intid: u32, level: bool) -> crate::hv::Result<()> {
            self.spis.lock().unwrap().push((intid, level));
            Ok(())
        }
        fn save(&self) -> crate::hv::Result<Vec<u8>> {
            self.saves.fetch_add(1, Ordering::Relaxed);
            Ok(vec![7, 8, 9])
        }
        fn restore(&self, _blob: &[u8]) -> crate::hv::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn userspace_gic_routes_like_the_model() {
        let chip = Irqchip::Userspace(Arc::new(Mutex::new(Gicv3::new(2))));
        assert_eq!(chip.mode(), GicMode::Userspace);
        let regions = chip.mmio_regions(2);
        let names: Vec<_> = regions.iter().map(|r| (r.0, r.1, r.2)).collect();
        assert_eq!(
            names,
            [("gicd", GICD_BASE, 0x1_0000), ("gicr", GICR_BASE, 0x4_0000)]
        );
        assert_eq!(chip.irq_pending(0), Some(false));
        assert_eq!(chip.pending_vcpus().map(|s| s.is_empty()), Some(true));
        // The CPU interface answers (PMR resets to 0).
        assert_eq!(chip.sysreg_read(0, ICC_PMR_EL1), Some(0));
        assert!(chip.sysreg_write(0, ICC_PMR_EL1, 0xf0).is_some());
        chip.set_spi(33, true);
        chip.vtimer_level(1, true);
        chip.ptimer_level(1, true);
        assert!(matches!(chip.save(), Ok(IrqchipState::Userspace(_))));
    }

    #[test]
    fn kernel_gic_gets_spis_and_nothing_else() {
        let k = Arc::new(RecordingGic::default());
        let chip = Irqchip::Kernel(k.clone());
        assert_eq!(chip.mode(), GicMode::Hvf);
        assert!(chip.mmio_regions(4).is_empty());
        chip.set_spi(48, true);
        chip.set_spi(48, false);
        assert_eq!(*k.spis.lock().unwrap(), [(48, true), (48, false)]);
        assert_eq!(chip.irq_pending(0), None);
        assert_eq!(chip.pending_vcpus(), None);
        assert_eq!(chip.sysreg_read(0, ICC_PMR_EL1), None);
        assert_eq!(chip.sysreg_write(0, ICC_PMR_EL1, 1), None);
        chip.vtimer_level(0, true);
        chip.ptimer_level(0, true);
        assert_eq!(chip.save().unwrap(), IrqchipState::Hvf(vec![7, 8, 9]));
        assert_eq!(k.saves.load(Ordering::Relaxed), 1);
    }
}
