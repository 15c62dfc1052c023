//! The GIC's complete state as plain data, for snapshots, and its validation.
//!
//! [`GicState`] is also the model's working representation, so save is a
//! clone. A restored state is untrusted (it comes from a file):
//! [`GicState::validate`] checks every length and field before the GIC's
//! restore ([`crate::devices::Persist::restore`]) accepts it.

use super::{PRIORITY_MASK, PRIVATE_IRQS, SGIS};
use crate::arch::layout::{MAX_VCPUS, NUM_SPIS};
use serde::{Deserialize, Serialize};

/// Lowest valid ICC_BPR0_EL1 value with 5 priority bits (IHI 0069H,
/// ICC_BPR0_EL1: the minimum is 7 - the number of preemption bits).
pub(super) const MIN_BPR0: u8 = 2;
/// Lowest valid ICC_BPR1_EL1 value: the ICC_BPR0_EL1 minimum plus one.
pub(super) const MIN_BPR1: u8 = MIN_BPR0 + 1;

/// State of one interrupt (IHI 0069H ch. 4, "Interrupt lifecycle").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqState {
    /// Group 1 (`true`) or group 0 (IGROUPR). Only group 1 is ever signalled.
    pub group1: bool,
    /// Forwarding enabled (ISENABLER / ICENABLER).
    pub enabled: bool,
    /// The pending latch: set by a rising edge of an edge-triggered input, by
    /// ISPENDR or by an SGI; cleared by acknowledge and ICPENDR. See
    /// [`IrqState::is_pending`] for the level-sensitive case.
    pub pending: bool,
    /// Active: acknowledged and not yet deactivated.
    pub active: bool,
    /// Edge-triggered (`true`) or level-sensitive (ICFGR `Int_config[1]`).
    /// Always `true` for SGIs.
    pub edge: bool,
    /// Level of the input line (SPIs and PPIs; always low for SGIs).
    pub level: bool,
    /// Priority, 0 highest. Only bits `[7:3]` are implemented (low bits zero).
    pub priority: u8,
}

impl IrqState {
    /// Whether the interrupt is pending: the latch, or for a level-sensitive
    /// interrupt an asserted input (IHI 0069H ch. 4, "Interrupt lifecycle").
    pub fn is_pending(&self) -> bool {
        self.pending || (!self.edge && self.level)
    }

    /// Reset state: group 1 (as KVM's vGICv3 and QEMU's direct kernel boot
    /// leave it), disabled, priority 0; SGIs edge, PPIs and SPIs level.
    pub(super) fn reset(edge: bool) -> Self {
        IrqState {
            group1: true,
            edge,
            ..Default::default()
        }
    }
}

/// One SPI: its state and routing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpiState {
    /// Interrupt state.
    pub irq: IrqState,
    /// GICD_IROUTER value: Aff2.Aff1.Aff0 in bits `[23:0]`, Interrupt_Routing_Mode
    /// in bit 31; other bits zero.
    pub router: u64,
}

/// The CPU interface registers of one vCPU (IHI 0069H ch. 12, "AArch64 System
/// register descriptions", ICC_*_EL1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuIfState {
    /// ICC_PMR_EL1: only interrupts of a priority value below this are
    /// signalled. Low three bits zero.
    pub pmr: u8,
    /// ICC_BPR0_EL1, 2..=7 (group 0 is never signalled; kept for the guest).
    pub bpr0: u8,
    /// ICC_BPR1_EL1, 3..=7: group priority = priority bits `[7:bpr1]`.
    pub bpr1: u8,
    /// ICC_CTLR_EL1.EOImode: EOIR only drops priority; DIR deactivates.
    pub eoi_mode: bool,
    /// ICC_IGRPEN1_EL1.Enable.
    pub igrpen1: bool,
    /// ICC_AP1R0_EL1: bit n set = an interrupt of group priority `n << 3` is
    /// active. The lowest set bit is the running priority.
    pub ap1r0: u32,
}

impl Default for CpuIfState {
    fn default() -> Self {
        CpuIfState {
            pmr: 0,
            bpr0: MIN_BPR0,
            bpr1: MIN_BPR1,
            eoi_mode: false,
            igrpen1: false,
            ap1r0: 0,
        }
    }
}

/// One vCPU's redistributor and CPU interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedistState {
    /// GICR_WAKER.ProcessorSleep (reset 1): the guest's power handshake;
    /// forwarding ignores it (see the module documentation).
    pub processor_sleep: bool,
    /// SGIs 0-15 and PPIs 16-31, indexed by INTID (32 entries).
    pub private: Vec<IrqState>,
    /// CPU interface registers.
    pub cpuif: CpuIfState,
}

impl RedistState {
    fn reset() -> Self {
        RedistState {
            processor_sleep: true,
            private: (0..PRIVATE_IRQS)
                .map(|i| IrqState::reset(i < SGIS))
                .collect(),
            cpuif: CpuIfState::default(),
        }
    }
}

/// The complete GIC state: what the GIC's [`crate::devices::Persist::save`]
/// returns and its restore validates and accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GicState {
    /// GICD_CTLR.EnableGrp0.
    pub enable_grp0: bool,
    /// GICD_CTLR.EnableGrp1.
    pub enable_grp1: bool,
    /// SPIs, INTID 32 + index ([`NUM_SPIS`] entries).
    pub spis: Vec<SpiState>,
    /// One entry per vCPU.
    pub redists: Vec<RedistState>,
}

/// Why a saved [`GicState`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GicStateError {
    /// The VM's vCPU count is not in 1..=MAX_VCPUS.
    #[error("vCPU count {0} is not in 1..={MAX_VCPUS}")]
    VcpuCount(usize),
    /// The state was saved with a different number of vCPUs.
    #[error("state has {found} redistributors, the VM has {expected} vCPUs")]
    VcpuMismatch {
        /// vCPUs of the VM.
        expected: usize,
        /// Redistributors in the state.
        found: usize,
    },
    /// A table has the wrong number of entries.
    #[error("{what} has {found} entries, expected {expected}")]
    Length {
        /// Which table.
        what: &'static str,
        /// Required entries.
        expected: usize,
        /// Entries present.
        found: usize,
    },
    /// A field holds a value the hardware could not hold.
    #[error("{what}: invalid value {value:#x}")]
    Field {
        /// Which field, with its vCPU or INTID.
        what: String,
        /// The value found.
        value: u64,
    },
}

impl GicState {
    /// Reset state for `vcpus` vCPUs.
    pub(super) fn reset(vcpus: usize) -> Self {
        GicState {
            enable_grp0: false,
            enable_grp1: false,
            spis: vec![
                SpiState {
                    irq: IrqState::reset(false),
                    router: 0,
                };
                NUM_SPIS as usize
            ],
            redists: (0..vcpus).map(|_| RedistState::reset()).collect(),
        }
    }

    /// Checks that the state fits a VM of `vcpus` vCPUs and that every field
    /// holds a value the model can produce.
    pub fn validate(&self, vcpus: usize) -> Result<(), GicStateError> {
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(GicStateError::VcpuCount(vcpus));
        }
        if self.redists.len() != vcpus {
            return Err(GicStateError::VcpuMismatch {
                expected: vcpus,
                found: self.redists.len(),
            });
        }
        check_len("spis", self.spis.len(), NUM_SPIS as usize)?;
        for (i, spi) in self.spis.iter().enumerate() {
            let intid = i + 32;
            check_irq(&spi.irq, || format!("SPI {intid}"))?;
            if spi.router & !super::regs::irouter::MASK != 0 {
                return Err(field(format!("SPI {intid} router"), spi.router));
            }
        }
        for (v, r) in self.redists.iter().enumerate() {
            check_len(
                "redistributor private interrupts",
                r.private.len(),
                PRIVATE_IRQS,
            )?;
            for (intid, irq) in r.private.iter().enumerate() {
                check_irq(irq, || format!("vCPU {v} INTID {intid}"))?;
                if intid < SGIS && (!irq.edge || irq.level) {
                    let value = u64::from(irq.edge) | u64::from(irq.level) << 1;
                    return Err(field(format!("vCPU {v} SGI {intid} edge/level"), value));
                }
            }
            let c = &r.cpuif;
            if c.pmr & !PRIORITY_MASK != 0 {
                return Err(field(format!("vCPU {v} ICC_PMR_EL1"), c.pmr.into()));
            }
            if !(MIN_BPR0..=7).contains(&c.bpr0) {
                return Err(field(format!("vCPU {v} ICC_BPR0_EL1"), c.bpr0.into()));
            }
            if !(MIN_BPR1..=7).contains(&c.bpr1) {
                return Err(field(format!("vCPU {v} ICC_BPR1_EL1"), c.bpr1.into()));
            }
        }
        Ok(())
    }
}

fn check_len(what: &'static str, found: usize, expected: usize) -> Result<(), GicStateError> {
    if found == expected {
        Ok(())
    } else {
        Err(GicStateError::Length {
            what,
            expected,
            found,
        })
    }
}

fn check_irq(irq: &IrqState, name: impl Fn() -> String) -> Result<(), GicStateError> {
    if irq.priority & !PRIORITY_MASK != 0 {
        return Err(field(format!("{} priority", name()), irq.priority.into()));
    }
    Ok(())
}

fn field(what: String, value: u64) -> GicStateError {
    GicStateError::Field { what, value }
}
