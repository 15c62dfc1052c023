//! PSCI calls (Arm DEN 0022) as the run loop answers them: the decisions
//! are [`crate::arch::psci`]'s; this applies them to the run state.

use super::run_state::{RunState, VmExit};
use super::state::VcpuPower;
use super::VcpuEnv;
use crate::arch::psci::{self, PowerState, PsciAction, PsciCall, PsciCpus};
use crate::hv::{self, Reg, Vcpu};

/// PSCI's view of the vCPUs.
struct Cpus<'a>(&'a [VcpuPower]);

impl PsciCpus for Cpus<'_> {
    fn vcpu_count(&self) -> usize {
        self.0.len()
    }
    fn power_state(&self, vcpu: usize) -> PowerState {
        match self.0.get(vcpu) {
            Some(VcpuPower::On) => PowerState::On,
            Some(VcpuPower::OnPending { .. }) => PowerState::OnPending,
            Some(VcpuPower::Off) | None => PowerState::Off,
        }
    }
}

/// What the vCPU does after a PSCI call.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AfterPsci {
    Continue,
    /// CPU_SUSPEND: wait as in WFI.
    Suspend,
}

/// Answers the PSCI call in `vcpu`'s X0..X3 (it has just executed HVC or
/// SMC): power states in `run_state`, CPU_ON entry points checked against
/// guest RAM (`env`), SYSTEM_OFF and SYSTEM_RESET ending the VM.
pub(super) fn handle(
    vcpu: &mut impl Vcpu,
    env: &dyn VcpuEnv,
    run_state: &RunState,
) -> hv::Result<AfterPsci> {
    let call = PsciCall::from_regs([
        vcpu.reg(Reg::X(0))?,
        vcpu.reg(Reg::X(1))?,
        vcpu.reg(Reg::X(2))?,
        vcpu.reg(Reg::X(3))?,
    ]);
    let action = {
        let c = run_state.lock();
        psci::handle(call, &Cpus(&c.power))
    };
    let ret = match action {
        PsciAction::Return(v) => v,
        PsciAction::CpuOn {
            target,
            entry,
            context_id,
        } => {
            let mut c = run_state.lock();
            match c.power.get(target) {
                _ if !env.is_ram(entry, 4) => psci::ret(psci::INVALID_ADDRESS),
                Some(VcpuPower::Off) => {
                    c.power[target] = VcpuPower::OnPending {
                        entry,
                        context: context_id,
                    };
                    c.generation += 1;
                    drop(c);
                    run_state.notify();
                    run_state.kick_where(|v| v == target);
                    psci::ret(psci::SUCCESS)
                }
                Some(VcpuPower::OnPending { .. }) => psci::ret(psci::ON_PENDING),
                Some(VcpuPower::On) => psci::ret(psci::ALREADY_ON),
                None => psci::ret(psci::INVALID_PARAMETERS),
            }
        }
        PsciAction::CpuSuspend => {
            vcpu.set_reg(Reg::X(0), psci::ret(psci::SUCCESS))?;
            return Ok(AfterPsci::Suspend);
        }
        PsciAction::CpuOff => {
            run_state.lock().power[vcpu.id()] = VcpuPower::Off;
            return Ok(AfterPsci::Continue);
        }
        PsciAction::SystemOff => {
            run_state.finish(VmExit::PowerOff);
            return Ok(AfterPsci::Continue);
        }
        PsciAction::SystemReset => {
            run_state.finish(VmExit::Reset);
            return Ok(AfterPsci::Continue);
        }
    };
    vcpu.set_reg(Reg::X(0), ret)?;
    Ok(AfterPsci::Continue)
}
