//! Machine state for snapshots: what is captured at Ctrl-A s and applied at
//! restore, besides guest RAM and the disk (which the snapshot store keeps).
//!
//! The state is serialised as JSON inside the store's `state.bin` envelope
//! (which bounds and checksums it). Everything read back is untrusted:
//! [`MachineState::decode`] checks the format version and the shape, and each
//! device's `restore` validates its own fields.

use crate::arch::sysreg::{SysReg, CNTV_CTL_EL0, CNTV_CVAL_EL0};
use crate::devices::boot_timer::BootTimerState;
use crate::devices::gicv3::GicState;
use crate::devices::pl011::Pl011State;
use crate::devices::virtio::block::BlockState;
use crate::devices::virtio::mmio::VirtioMmioState;
use crate::hv::{self, Reg, Vcpu, Vm};
use serde::{Deserialize, Serialize};

/// Version of the machine-state encoding; bump on incompatible changes.
pub const MACHINE_STATE_VERSION: u32 = 1;

/// Name of the GIC mode recorded in snapshots (the userspace GICv3 model).
pub const GIC_MODE_USERSPACE: &str = "userspace";

/// One vCPU's architectural state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    /// X0..X30.
    pub x: Vec<u64>,
    /// Program counter.
    pub pc: u64,
    /// PSTATE in SPSR format.
    pub pstate: u64,
    /// V0..V31 as (low, high) 64-bit halves.
    pub v: Vec<(u64, u64)>,
    /// System registers held by the backend ([`Vcpu::state_sysregs`]),
    /// excluding the virtual timer.
    pub sysregs: Vec<(SysReg, u64)>,
    /// CNTV_CTL_EL0.
    pub cntv_ctl: u64,
    /// CNTV_CVAL_EL0 (guest ticks).
    pub cntv_cval: u64,
    /// The virtual count (CNTVCT_EL0) at capture; restore sets the vtimer
    /// offset so the guest's clock continues from here.
    pub virtual_count: u64,
}

/// Captures a vCPU's state. Call on the vCPU's own thread while it is
/// stopped at an instruction boundary.
pub fn capture_vcpu<V: Vm>(vm: &V, vcpu: &mut V::Vcpu) -> hv::Result<VcpuState> {
    let x = (0..31)
        .map(|n| vcpu.reg(Reg::X(n)))
        .collect::<hv::Result<_>>()?;
    let v = (0..32)
        .map(|n| vcpu.vreg(n).map(|q| (q as u64, (q >> 64) as u64)))
        .collect::<hv::Result<_>>()?;
    let sysregs = vcpu
        .state_sysregs()
        .iter()
        .map(|&r| vcpu.sysreg(r).map(|v| (r, v)))
        .collect::<hv::Result<_>>()?;
    Ok(VcpuState {
        x,
        pc: vcpu.reg(Reg::Pc)?,
        pstate: vcpu.reg(Reg::Pstate)?,
        v,
        sysregs,
        cntv_ctl: vcpu.sysreg(CNTV_CTL_EL0)?,
        cntv_cval: vcpu.sysreg(CNTV_CVAL_EL0)?,
        virtual_count: vm.physical_count().wrapping_sub(vcpu.vtimer_offset()?),
    })
}

/// Applies a captured state to a freshly created vCPU (on its own thread).
/// The vtimer offset is set first so the timer registers are interpreted in
/// the restored guest's time.
pub fn apply_vcpu<V: Vm>(vm: &V, vcpu: &mut V::Vcpu, s: &VcpuState) -> hv::Result<()> {
    if s.x.len() != 31 || s.v.len() != 32 {
        return Err(hv::HvError::Guest(format!(
            "vCPU state has {} general and {} vector registers (expected 31 and 32)",
            s.x.len(),
            s.v.len()
        )));
    }
    let wanted = vcpu.state_sysregs();
    if s.sysregs.len() != wanted.len() || s.sysregs.iter().any(|(r, _)| !wanted.contains(r)) {
        return Err(hv::HvError::Guest(
            "vCPU state's system-register set does not match this backend's".into(),
        ));
    }
    vcpu.set_vtimer_offset(vm.physical_count().wrapping_sub(s.virtual_count))?;
    for (n, &val) in (0u8..).zip(&s.x) {
        vcpu.set_reg(Reg::X(n), val)?;
    }
    for (n, &(lo, hi)) in (0u8..).zip(&s.v) {
        vcpu.set_vreg(n, u128::from(lo) | u128::from(hi) << 64)?;
    }
    for &(r, val) in &s.sysregs {
        vcpu.set_sysreg(r, val)?;
    }
    vcpu.set_sysreg(CNTV_CVAL_EL0, s.cntv_cval)?;
    vcpu.set_sysreg(CNTV_CTL_EL0, s.cntv_ctl)?;
    vcpu.set_reg(Reg::Pstate, s.pstate)?;
    vcpu.set_reg(Reg::Pc, s.pc)
}

/// PSCI power state of a vCPU, as the run loop keeps it and a snapshot
/// saves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VcpuPower {
    /// Off (never started, or CPU_OFF).
    Off,
    /// CPU_ON accepted, not yet started.
    OnPending {
        /// Entry point (guest-physical).
        entry: u64,
        /// X0 at entry.
        context: u64,
    },
    /// Running.
    On,
}

/// Everything but RAM and the disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineState {
    /// [`MACHINE_STATE_VERSION`].
    pub version: u32,
    /// Backend that wrote it (`emu`, `hvf`).
    pub backend: String,
    /// Guest RAM size in bytes.
    pub ram_size: u64,
    /// Kernel command line the guest booted with (informational).
    pub cmdline: String,
    /// Per vCPU, index order.
    pub vcpus: Vec<VcpuState>,
    /// Per vCPU, index order.
    pub power: Vec<VcpuPower>,
    /// The GICv3.
    pub gic: GicState,
    /// The console UART.
    pub pl011: Pl011State,
    /// The boot-timer.
    pub boot_timer: BootTimerState,
    /// The root block device and its transport.
    pub virtio_blk: VirtioMmioState<BlockState>,
}

/// Errors decoding a machine state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Not valid JSON of the expected shape.
    #[error("machine state is malformed: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Written by an incompatible version.
    #[error("machine state version {found} is not supported (this build reads version {MACHINE_STATE_VERSION})")]
    Version {
        /// The version found.
        found: u32,
    },
    /// Inconsistent contents.
    #[error("machine state is inconsistent: {0}")]
    Inconsistent(String),
}

impl MachineState {
    /// Serialises the state.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("machine state serialises")
    }

    /// Parses and checks the shape of an untrusted state.
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        let s: MachineState = serde_json::from_slice(bytes)?;
        if s.version != MACHINE_STATE_VERSION {
            return Err(StateError::Version { found: s.version });
        }
        let n = s.vcpus.len();
        if n == 0 || n > crate::arch::layout::MAX_VCPUS || s.power.len() != n {
            return Err(StateError::Inconsistent(format!(
                "{} vCPU states and {} power states",
                n,
                s.power.len()
            )));
        }
        Ok(s)
    }
}
