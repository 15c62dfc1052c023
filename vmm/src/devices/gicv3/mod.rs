//! A userspace GICv3 (distributor, redistributors and system-register CPU
//! interfaces) as a pure state machine.
//!
//! The model follows the GICv3/v4 architecture specification, Arm IHI 0069H,
//! in the configuration a Linux guest on QEMU's `virt` machine sees:
//! - one security state (GICD_CTLR.DS = 1) and affinity routing always on
//!   (ARE = 1); Linux uses group 1 only. Group-0 interrupts are never
//!   signalled (there is no FIQ) and the group-0 CPU interface registers are
//!   RAZ/WI;
//! - [`NUM_SPIS`] SPIs (INTIDs 32..32+NUM_SPIS), 16 SGIs and 16 PPIs per vCPU,
//!   no LPIs or ITS, 16-bit INTID space;
//! - 5 priority bits (priorities and ICC_PMR_EL1 are masked to 0xF8), so 32
//!   group priorities and a single active-priorities register, ICC_AP1R0_EL1;
//! - vCPU `n` has affinity 0.0.0.n ([`mpidr`]);
//! - GICR_WAKER.ProcessorSleep is the guest's power handshake and nothing
//!   more: a VM has no power controller to act on the redistributor's
//!   WakeRequest, so interrupts are forwarded whatever it says, as KVM's and
//!   QEMU's GICv3 do. Guests that never wake their redistributor (bare-metal
//!   tests such as kvm-unit-tests) rely on it. It only makes an asleep vCPU
//!   the last choice for 1-of-N SPIs.
//!
//! Nothing here blocks, spawns or calls out: the backend forwards ICC_*
//! system-register traps ([`Gicv3::sysreg_read`], [`Gicv3::sysreg_write`]),
//! the bus forwards GICD/GICR MMIO ([`GicDistMmio`], [`GicRedistMmio`]),
//! devices drive [`Gicv3::set_spi_level`], and the run loop asks
//! [`Gicv3::irq_pending`] whether to assert a vCPU's IRQ line.

mod cpuif;
mod mmio;
mod regs;
mod state;
#[cfg(test)]
mod tests;

pub use state::{CpuIfState, GicState, GicStateError, IrqState, RedistState, SpiState};

use crate::arch::layout::{MAX_VCPUS, NUM_SPIS, SPI_BASE_INTID};
use crate::devices::{AccessError, MmioDevice, Persist};
use crate::sync::Locked;
use std::sync::{Arc, Mutex};

/// Number of SGIs per vCPU (INTIDs 0-15).
const SGIS: usize = 16;
/// SGIs plus PPIs per vCPU (INTIDs 0-31).
const PRIVATE_IRQS: usize = 32;
/// Implemented priority bits: `[7:3]`.
const PRIORITY_MASK: u8 = 0xF8;
/// Right shift from a group priority to its ICC_AP1R0_EL1 bit.
const PRIORITY_SHIFT: u32 = 3;
/// Running priority when no interrupt is active (ICC_RPR_EL1).
const IDLE_PRIORITY: u8 = 0xFF;
/// One past the highest implemented INTID.
const INTID_END: u32 = SPI_BASE_INTID + NUM_SPIS;

/// The INTID ICC_IAR1_EL1 and ICC_HPPIR1_EL1 return when nothing can be
/// acknowledged (IHI 0069H, "Special INTIDs").
pub const INTID_SPURIOUS: u32 = 1023;

/// The MPIDR_EL1 rule (one definition, in PSCI): GICR_TYPER.Affinity_Value,
/// SGI targeting and IROUTER routing all use this affinity.
pub use crate::arch::psci::mpidr;

/// A set of vCPU indices, bit `n` for vCPU `n`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VcpuSet(pub u64);

/// The vCPUs an ICC_SGI1R_EL1 write made an SGI pending on (the caller kicks
/// them; the sender itself may be among them).
pub type SgiTargets = VcpuSet;

impl VcpuSet {
    /// No vCPU.
    pub const EMPTY: VcpuSet = VcpuSet(0);

    /// Whether `vcpu` is in the set.
    pub fn contains(self, vcpu: usize) -> bool {
        vcpu < 64 && self.0 & (1 << vcpu) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The vCPUs in the set, ascending.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..64).filter(move |&v| self.contains(v))
    }

    fn insert(&mut self, vcpu: usize) {
        if vcpu < 64 {
            self.0 |= 1 << vcpu;
        }
    }
}

/// The GICv3 model. See the module documentation for the configuration.
#[derive(Debug)]
pub struct Gicv3 {
    s: GicState,
}

impl Gicv3 {
    /// A GIC in its reset state for `vcpus` vCPUs: everything disabled, all
    /// interrupts group 1, priority 0, SPIs level-sensitive and routed to
    /// vCPU 0, redistributors asleep (GICR_WAKER.ProcessorSleep = 1).
    ///
    /// # Panics
    ///
    /// If `vcpus` is 0 or more than [`MAX_VCPUS`] (a VMM configuration bug,
    /// not something a guest can cause).
    pub fn new(vcpus: usize) -> Self {
        assert!(
            (1..=MAX_VCPUS).contains(&vcpus),
            "GICv3: {vcpus} vCPUs is not in 1..={MAX_VCPUS}"
        );
        Gicv3 {
            s: GicState::reset(vcpus),
        }
    }

    /// Number of vCPUs (redistributors).
    pub fn vcpus(&self) -> usize {
        self.s.redists.len()
    }

    /// Drives the input line of SPI `intid` (32..32+[`NUM_SPIS`]). For a
    /// level-sensitive SPI the interrupt is pending while the line is high;
    /// for an edge-triggered one a rising edge latches it pending. Other
    /// INTIDs are ignored.
    pub fn set_spi_level(&mut self, intid: u32, level: bool) {
        if (SPI_BASE_INTID..INTID_END).contains(&intid) {
            let irq = &mut self.s.spis[(intid - SPI_BASE_INTID) as usize].irq;
            set_line(irq, level);
        }
    }

    /// Drives the input line of PPI `intid` (16..32, e.g. the virtual timer,
    /// [`crate::arch::layout::VTIMER_INTID`]) of vCPU `vcpu`, as for
    /// [`Gicv3::set_spi_level`]. Other INTIDs and vCPUs are ignored.
    pub fn set_ppi_level(&mut self, vcpu: usize, intid: u32, level: bool) {
        if !(SGIS as u32..PRIVATE_IRQS as u32).contains(&intid) {
            return;
        }
        if let Some(r) = self.s.redists.get_mut(vcpu) {
            set_line(&mut r.private[intid as usize], level);
        }
    }

    /// Whether vCPU `vcpu`'s IRQ line should be asserted: it has an
    /// enabled, pending, inactive group-1 interrupt
    /// whose priority is below ICC_PMR_EL1 and whose group priority is
    /// higher than the running priority, with group 1 enabled in GICD_CTLR
    /// and ICC_IGRPEN1_EL1 (IHI 0069H, "Interrupt prioritization" and
    /// "Preemption"). `false` for a vCPU that does not exist.
    pub fn irq_pending(&self, vcpu: usize) -> bool {
        let Some(r) = self.s.redists.get(vcpu) else {
            return false;
        };
        r.cpuif.igrpen1
            && self
                .hppi(vcpu)
                .is_some_and(|(prio, _)| can_signal(&r.cpuif, prio))
    }

    /// The vCPUs whose IRQ line should be asserted now. A device thread
    /// that changed an SPI, or a vCPU that wrote GIC registers, kicks those
    /// of them that are waiting.
    pub fn pending_vcpus(&self) -> VcpuSet {
        let mut set = VcpuSet::EMPTY;
        for v in (0..self.vcpus()).filter(|&v| self.irq_pending(v)) {
            set.insert(v);
        }
        set
    }

    /// The interrupt `intid` as seen by vCPU `vcpu` (SGIs and PPIs are
    /// per vCPU), if it exists.
    fn irq(&self, vcpu: usize, intid: u32) -> Option<&IrqState> {
        if intid < PRIVATE_IRQS as u32 {
            Some(&self.s.redists.get(vcpu)?.private[intid as usize])
        } else if intid < INTID_END {
            Some(&self.s.spis[(intid - SPI_BASE_INTID) as usize].irq)
        } else {
            None
        }
    }

    /// Mutable [`Gicv3::irq`].
    fn irq_mut(&mut self, vcpu: usize, intid: u32) -> Option<&mut IrqState> {
        if intid < PRIVATE_IRQS as u32 {
            Some(&mut self.s.redists.get_mut(vcpu)?.private[intid as usize])
        } else if intid < INTID_END {
            Some(&mut self.s.spis[(intid - SPI_BASE_INTID) as usize].irq)
        } else {
            None
        }
    }

    /// The highest-priority pending group-1 interrupt forwarded to `vcpu`, as
    /// `(priority, INTID)`, ignoring ICC_PMR_EL1 and the running priority.
    /// Ties go to the lowest INTID.
    fn hppi(&self, vcpu: usize) -> Option<(u8, u32)> {
        let r = self.s.redists.get(vcpu)?;
        if !self.s.enable_grp1 {
            return None;
        }
        let mut best: Option<(u8, u32)> = None;
        let mut consider = |irq: &IrqState, intid: u32| {
            if forwardable(irq) && best.is_none_or(|(p, _)| irq.priority < p) {
                best = Some((irq.priority, intid));
            }
        };
        for (intid, irq) in r.private.iter().enumerate() {
            consider(irq, intid as u32);
        }
        for (i, spi) in self.s.spis.iter().enumerate() {
            if forwardable(&spi.irq) && self.spi_target(spi) == Some(vcpu) {
                consider(&spi.irq, SPI_BASE_INTID + i as u32);
            }
        }
        best
    }

    /// The vCPU an SPI is forwarded to (IHI 0069H, "Affinity routing" and
    /// `GICD_IROUTER<n>`). With Interrupt_Routing_Mode = 1 (1-of-N) it is the
    /// lowest-numbered vCPU that participates (ICC_IGRPEN1_EL1 set), is
    /// awake (GICR_WAKER.ProcessorSleep clear) and could take it now
    /// (priority mask and running priority); else the lowest participating
    /// awake one; else the lowest participating one. Otherwise it is the
    /// vCPU whose affinity matches Aff2.Aff1.Aff0, if any.
    fn spi_target(&self, spi: &SpiState) -> Option<usize> {
        if spi.router & regs::irouter::IRM != 0 {
            let participating = || {
                self.s
                    .redists
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.cpuif.igrpen1)
            };
            participating()
                .find(|(_, r)| !r.processor_sleep && can_signal(&r.cpuif, spi.irq.priority))
                .or_else(|| participating().find(|(_, r)| !r.processor_sleep))
                .or_else(|| participating().next())
                .map(|(v, _)| v)
        } else {
            let aff = spi.router & 0x00FF_FFFF;
            (aff < self.vcpus() as u64).then_some(aff as usize)
        }
    }
}

impl Persist for Gicv3 {
    /// The complete state: the model's own representation, so save is a
    /// clone.
    type State = GicState;
    /// The number of vCPUs (redistributors).
    type Args = usize;
    type Error = GicStateError;

    fn save(&self) -> GicState {
        self.s.clone()
    }

    /// Rebuilds a GIC for `vcpus` vCPUs from a saved state. The state is
    /// untrusted: every length and field is checked ([`GicState::validate`]).
    fn restore(vcpus: usize, state: &GicState) -> Result<Self, GicStateError> {
        state.validate(vcpus)?;
        Ok(Gicv3 { s: state.clone() })
    }
}

/// Applies a new input level: a rising edge latches an edge-triggered
/// interrupt pending; a level-sensitive one follows `level` through
/// [`IrqState::is_pending`].
fn set_line(irq: &mut IrqState, level: bool) {
    if irq.edge && level && !irq.level {
        irq.pending = true;
    }
    irq.level = level;
}

/// Whether an interrupt may be forwarded to a CPU interface at all: group 1,
/// enabled, pending and not active (an active-and-pending interrupt waits for
/// its deactivation).
fn forwardable(irq: &IrqState) -> bool {
    irq.group1 && irq.enabled && irq.is_pending() && !irq.active
}

/// The running priority: that of the highest active group priority, or
/// [`IDLE_PRIORITY`] (IHI 0069H, ICC_RPR_EL1 and `ICC_AP1R<n>_EL1`).
fn running_priority(c: &CpuIfState) -> u8 {
    if c.ap1r0 == 0 {
        IDLE_PRIORITY
    } else {
        (c.ap1r0.trailing_zeros() << PRIORITY_SHIFT) as u8
    }
}

/// Mask selecting the group priority of a group-1 priority: bits `[7:BPR1]`
/// (IHI 0069H, "Priority grouping"; ICC_BPR1_EL1).
fn group_priority_mask(c: &CpuIfState) -> u8 {
    (0xFF_u32 << c.bpr1.clamp(state::MIN_BPR1, 7)) as u8
}

/// Whether an interrupt of priority `prio` is signalled to a CPU interface in
/// state `c`: below the priority mask, and with a group priority higher than
/// the running priority (subpriorities do not preempt).
fn can_signal(c: &CpuIfState, prio: u8) -> bool {
    if prio >= c.pmr {
        return false;
    }
    let running = running_priority(c);
    let mask = group_priority_mask(c);
    running == IDLE_PRIORITY || prio & mask < running & mask
}

/// The distributor on the MMIO bus: map it at
/// [`crate::arch::layout::GICD_BASE`] with size
/// [`crate::arch::layout::GICD_SIZE`].
pub struct GicDistMmio(pub Arc<Mutex<Gicv3>>);

impl MmioDevice for GicDistMmio {
    fn read(&mut self, _vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        self.0.locked().dist_read(offset, data)
    }

    fn write(&mut self, _vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        self.0.locked().dist_write(offset, data)
    }
}

/// The redistributors on the MMIO bus: map them at
/// [`crate::arch::layout::GICR_BASE`] with size
/// [`crate::arch::layout::GICR_SIZE`]. Frames of vCPUs that do not exist
/// answer [`AccessError::NoRegister`] (RAZ/WI).
pub struct GicRedistMmio(pub Arc<Mutex<Gicv3>>);

impl MmioDevice for GicRedistMmio {
    fn read(&mut self, _vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        self.0.locked().redist_read(offset, data)
    }

    fn write(&mut self, _vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        self.0.locked().redist_write(offset, data)
    }
}
