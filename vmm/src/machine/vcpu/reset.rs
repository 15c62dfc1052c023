//! A vCPU's reset: what the boot CPU and every PSCI CPU_ON start from.

use crate::arch::psci::{self, PSTATE_AT_START, RESET_TIMER, START_ZEROED_X};
use crate::arch::sysreg::{SysReg, MPIDR_EL1};
use crate::hv::{self, Reg, Vcpu};

/// The register values a vCPU's reset writes: [`psci::sysreg_reset`]
/// resolved against the vCPU as the backend created it, so that a core
/// started by PSCI CPU_ON, also after CPU_OFF, is a cold core (MMU and caches
/// off, no state from before) but for its entry point and X0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ResetState {
    /// X0..X30 ([`START_ZEROED_X`] zero; X0 gives way to the context ID).
    x: [u64; 31],
    /// V0..V31.
    v: [u128; 32],
    /// The backend's snapshot registers without MPIDR_EL1, then
    /// [`RESET_TIMER`], in the order they are written.
    sysregs: Vec<(SysReg, u64)>,
}

impl ResetState {
    /// The system registers a reset writes on `vcpu`, in order.
    fn sysregs(vcpu: &impl Vcpu) -> impl Iterator<Item = SysReg> + '_ {
        vcpu.state_sysregs()
            .iter()
            .copied()
            .filter(|&r| r != MPIDR_EL1)
            .chain(RESET_TIMER)
    }

    /// Reads the reset state of a vCPU the backend has just created (on its
    /// thread, before anything else is written to it).
    pub(super) fn of_new(vcpu: &mut impl Vcpu) -> hv::Result<Self> {
        let mut x = [0; 31];
        for (n, slot) in (0u8..).zip(&mut x) {
            if !START_ZEROED_X.contains(&n) {
                *slot = vcpu.reg(Reg::X(n))?;
            }
        }
        let mut v = [0; 32];
        for (n, slot) in (0u8..).zip(&mut v) {
            *slot = vcpu.vreg(n)?;
        }
        let regs: Vec<SysReg> = Self::sysregs(vcpu).collect();
        let sysregs = regs
            .into_iter()
            .map(|r| Ok((r, psci::sysreg_reset(r).resolve(vcpu.sysreg(r)?))))
            .collect::<hv::Result<_>>()?;
        Ok(ResetState { x, v, sysregs })
    }

    /// Starts `vcpu` in this reset state at `entry` in [`PSTATE_AT_START`]
    /// with X0 = `x0`: the boot CPU (Linux arm64 boot protocol, X0 = the
    /// DTB) and every PSCI CPU_ON (X0 = the context ID). PSTATE goes last,
    /// after SP_EL0 and SP_EL1, so a backend that banks the stack pointer on
    /// a PSTATE write banks the reset values.
    pub(super) fn start(&self, vcpu: &mut impl Vcpu, entry: u64, x0: u64) -> hv::Result<()> {
        for &(r, value) in &self.sysregs {
            vcpu.set_sysreg(r, value)?;
        }
        for (n, &value) in (0u8..).zip(&self.x) {
            vcpu.set_reg(Reg::X(n), if n == 0 { x0 } else { value })?;
        }
        for (n, &value) in (0u8..).zip(&self.v) {
            vcpu.set_vreg(n, value)?;
        }
        vcpu.set_reg(Reg::Pstate, PSTATE_AT_START)?;
        vcpu.set_reg(Reg::Pc, entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::psci::SCTLR_CLEAR_AT_START;
    use crate::arch::sysreg::{self as sr, EL1_STATE_SYSREGS, OSLSR_EL1};
    use crate::hv::fake::FakeVcpu;

    const ENTRY: u64 = 0x4020_0000;
    const CONTEXT: u64 = 0x4100_0000;

    /// Every register of `vcpu` a reset covers, by name.
    fn covered(vcpu: &mut impl Vcpu) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for n in 0..31 {
            out.push((format!("X{n}"), vcpu.reg(Reg::X(n)).unwrap()));
        }
        for n in 0..32 {
            let v = vcpu.vreg(n).unwrap();
            out.push((format!("V{n}.lo"), v as u64));
            out.push((format!("V{n}.hi"), (v >> 64) as u64));
        }
        let regs: Vec<SysReg> = ResetState::sysregs(vcpu).collect();
        for r in regs {
            out.push((format!("{r:?}"), vcpu.sysreg(r).unwrap()));
        }
        out.push(("PSTATE".into(), vcpu.reg(Reg::Pstate).unwrap()));
        out.push(("PC".into(), vcpu.reg(Reg::Pc).unwrap()));
        out
    }

    /// Writes something else to every register a reset covers.
    fn dirty(vcpu: &mut impl Vcpu) {
        for n in 0..31 {
            vcpu.set_reg(Reg::X(n), 0x5a5a_0000 + u64::from(n)).unwrap();
        }
        for n in 0..32 {
            vcpu.set_vreg(n, u128::from(n) << 70 | 0x77).unwrap();
        }
        let dirty = [
            (sr::SCTLR_EL1, 0x30d0_1805 | 1 << 12),
            (sr::TCR_EL1, 0x0000_0002_b5b5_b511),
            (sr::TTBR0_EL1, 0x4010_0000),
            (sr::TTBR1_EL1, 0x4011_0000),
            (sr::MAIR_EL1, 0x0400_ff44),
            (sr::VBAR_EL1, 0xffff_8000_1001_0800),
            (sr::ESR_EL1, 0x9600_0047),
            (sr::FAR_EL1, 0x1234_5678),
            (sr::ELR_EL1, 0xffff_8000_1000_1234),
            (sr::SPSR_EL1, 0x6000_03c5),
            (sr::SP_EL0, 0x4000_8000),
            (sr::SP_EL1, 0x4000_9000),
            (sr::TPIDR_EL0, 0x11),
            (sr::TPIDR_EL1, 0x22),
            (sr::TPIDRRO_EL0, 0x33),
            (sr::CONTEXTIDR_EL1, 0x44),
            (sr::CPACR_EL1, 0x30_0000),
            (sr::CNTKCTL_EL1, 0x2),
            (sr::PAR_EL1, 0x800),
            (sr::MDSCR_EL1, 0x1000),
            (sr::CSSELR_EL1, 2),
            (sr::FPCR, 0x0300_0000),
            (sr::FPSR, 0x0800_0000),
            (sr::CNTV_CVAL_EL0, 0x1234_5678_9abc),
            (sr::CNTV_CTL_EL0, 0b1),
            (OSLSR_EL1, 0b1000),
        ];
        for (r, v) in dirty {
            vcpu.set_sysreg(r, v).unwrap();
        }
        // EL1t with NZCV set and interrupts unmasked.
        vcpu.set_reg(Reg::Pstate, 0xf000_0004).unwrap();
        vcpu.set_reg(Reg::Pc, 0xffff_8000_1000_0000).unwrap();
    }

    /// What a started vCPU must hold: `cold`'s registers (a fresh vCPU's,
    /// as read before anything was written) with the reset's rules applied,
    /// and the entry's PC, PSTATE and X0..X3.
    fn expected(cold: &[(String, u64)]) -> Vec<(String, u64)> {
        cold.iter()
            .map(|(name, v)| {
                let v = match name.as_str() {
                    "X0" => CONTEXT,
                    "X1" | "X2" | "X3" => 0,
                    "PSTATE" => PSTATE_AT_START,
                    "PC" => ENTRY,
                    "SCTLR_EL1" => v & !SCTLR_CLEAR_AT_START,
                    "SP_EL0" | "SP_EL1" | "ELR_EL1" | "SPSR_EL1" | "ESR_EL1" | "FAR_EL1" => 0,
                    _ => *v,
                };
                (name.clone(), v)
            })
            .collect()
    }

    #[test]
    fn a_reset_puts_back_every_register_it_covers_on_the_fake() {
        let mut vcpu = FakeVcpu::new();
        let cold = covered(&mut vcpu);
        let reset = ResetState::of_new(&mut vcpu).unwrap();
        // The fake starts with SCTLR_EL1.M and C set: a reset clears them.
        assert_eq!(vcpu.sysreg(sr::SCTLR_EL1).unwrap() & 0b101, 0b101);
        dirty(&mut vcpu);
        reset.start(&mut vcpu, ENTRY, CONTEXT).unwrap();
        assert_eq!(covered(&mut vcpu), expected(&cold));
        assert_eq!(
            vcpu.sysreg(sr::SCTLR_EL1).unwrap() & SCTLR_CLEAR_AT_START,
            0
        );
        // MPIDR_EL1 is the core's identity: no reset writes it.
        assert!(!reset.sysregs.iter().any(|&(r, _)| r == sr::MPIDR_EL1));
        assert_eq!(
            reset.sysregs.len(),
            EL1_STATE_SYSREGS.len() - 1 + RESET_TIMER.len()
        );
        // A failed write is an error, not a half-started vCPU that runs.
        vcpu.fail_writes = true;
        assert!(reset.start(&mut vcpu, ENTRY, CONTEXT).is_err());
    }

    /// On `emu`: a vCPU that had every register changed (its MMU on among
    /// them), once reset, equals a freshly created vCPU (started the same
    /// way) in every register the reset covers, and runs code at a physical
    /// entry point that its old translation tables did not map.
    #[cfg(emu)]
    #[test]
    fn a_reset_emu_vcpu_equals_a_cold_one() {
        use crate::hv::emu::EmuHypervisor;
        use crate::hv::{GicMode, Hypervisor, MmioFault, VcpuExit, VcpuId, VcpuIo, Vm};
        use crate::memory::GuestRam;
        use std::sync::Arc;
        use vm_memory::{Bytes, GuestAddress};

        struct NoIo;
        impl VcpuIo for NoIo {
            fn mmio_read(&mut self, _: VcpuId, _: u64, _: &mut [u8]) -> Result<(), MmioFault> {
                Ok(())
            }
            fn mmio_write(&mut self, _: VcpuId, _: u64, _: &[u8]) -> Result<(), MmioFault> {
                Ok(())
            }
            fn sysreg_read(&mut self, _: VcpuId, _: SysReg) -> Option<u64> {
                None
            }
            fn sysreg_write(&mut self, _: VcpuId, _: SysReg, _: u64) -> bool {
                false
            }
            fn irq_line(&mut self, _: VcpuId) -> bool {
                false
            }
            fn vtimer_level(&mut self, _: VcpuId, _: bool) {}
        }

        let ram = Arc::new(GuestRam::new_anonymous(4 << 20).unwrap());
        // At ENTRY: mov x1, x0; hvc #0x42.
        for (i, w) in [0xaa00_03e1u32, 0xd400_0842].iter().enumerate() {
            ram.memory()
                .write_obj(*w, GuestAddress(ENTRY + 4 * i as u64))
                .unwrap();
        }
        let vm = EmuHypervisor::new()
            .create_vm(ram, 2, GicMode::Userspace)
            .unwrap();
        let mut warm = vm.create_vcpu(0, psci::mpidr(0)).unwrap();
        let reset = ResetState::of_new(&mut warm).unwrap();
        // Among the rest: the MMU and caches on, with translation tables that
        // map nothing at ENTRY (as Linux leaves a CPU at CPU_OFF).
        dirty(&mut warm);
        reset.start(&mut warm, ENTRY, CONTEXT).unwrap();

        let mut cold = vm.create_vcpu(1, psci::mpidr(1)).unwrap();
        let fresh = covered(&mut cold);
        ResetState::of_new(&mut cold)
            .unwrap()
            .start(&mut cold, ENTRY, CONTEXT)
            .unwrap();
        assert_eq!(covered(&mut warm), expected(&fresh));
        assert_eq!(covered(&mut cold), expected(&fresh));

        assert_eq!(warm.run(&mut NoIo).unwrap(), VcpuExit::Hvc { imm: 0x42 });
        assert_eq!(warm.reg(Reg::X(1)).unwrap(), CONTEXT);
        assert_eq!(warm.reg(Reg::Pc).unwrap(), ENTRY + 8);
    }
}
