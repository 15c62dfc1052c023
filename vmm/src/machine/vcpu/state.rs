//! One vCPU's architectural state as a snapshot holds it: capturing it on
//! the vCPU's own thread while it is stopped at an instruction boundary, and
//! applying it to a freshly created vCPU. Also the vCPU's PSCI power state.

use crate::arch::sysreg::{SysReg, CNTV_CTL_EL0, CNTV_CVAL_EL0};
use crate::hv::{self, Reg, Vcpu};
use serde::{Deserialize, Serialize};

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
    /// GIC CPU-interface registers held by an in-kernel GIC
    /// ([`Vcpu::gic_cpu_state`], `ICC_*_EL1` in
    /// [`crate::hv::gic::ICC_STATE_REGS`] order); empty with the userspace
    /// GIC, whose CPU interface is in [`IrqchipState::Userspace`].
    #[serde(default)]
    pub gic_cpu: Vec<(SysReg, u64)>,
}

/// Captures a vCPU's state. Call on the vCPU's own thread while it is
/// stopped at an instruction boundary. The guest's count is the VM's, saved
/// once in [`ClockState`].
pub fn capture_vcpu<V: Vcpu>(vcpu: &mut V) -> hv::Result<VcpuState> {
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
        gic_cpu: vcpu.gic_cpu_state()?,
    })
}

/// Applies a captured state to a freshly created vCPU (on its own thread).
/// The VM's counter offset is set before any vCPU is created (the clock), so
/// the timer registers are interpreted in the restored guest's time. The
/// in-kernel GIC's CPU-interface registers are not applied here but by
/// [`apply_vcpu_gic`], after the GIC's own state.
pub fn apply_vcpu<V: Vcpu>(vcpu: &mut V, s: &VcpuState) -> hv::Result<()> {
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

/// Applies a captured vCPU's in-kernel GIC CPU-interface registers (on the
/// vCPU's thread), after [`apply_vcpu`] and after the in-kernel GIC's state
/// ([`hv::KernelGic::restore`]); a no-op list for the userspace GIC.
pub fn apply_vcpu_gic<V: Vcpu>(vcpu: &mut V, s: &VcpuState) -> hv::Result<()> {
    vcpu.set_gic_cpu_state(&s.gic_cpu)
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
