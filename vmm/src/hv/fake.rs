//! A test-only vCPU: a register file with no CPU behind it, shared by the
//! unit tests of [`crate::arch::esr`], [`crate::hv::hvf::exits`] and the
//! machine's vCPU threads; and a VM of them that logs what it creates.

use crate::arch::exception::SCTLR_SPAN;
use crate::arch::sysreg::{self as sr, SysReg, MPIDR_EL1, SCTLR_EL1, VBAR_EL1};
use crate::hv::{self, HvError, KernelGic, Kick, Prot, Reg, Vcpu, VcpuExit, VcpuId, VcpuIo, Vm};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// PC of a fresh [`FakeVcpu`].
pub(crate) const PC: u64 = 0xffff_8000_1000_0000;
/// VBAR_EL1 of a fresh [`FakeVcpu`].
pub(crate) const VBAR: u64 = 0xffff_8000_0801_0000;
/// EL1h with interrupts enabled and Z set.
pub(crate) const PSTATE_EL1H_Z: u64 = 0x4000_0005;

struct NoKick;
impl Kick for NoKick {
    fn kick(&self) {}
}

/// A register file with no CPU behind it. `X0..X30` start as
/// `0xdead_beef_0000_0000 | n`; system registers not set read as 0.
pub(crate) struct FakeVcpu {
    pub(crate) id: VcpuId,
    pub(crate) x: [u64; 31],
    pub(crate) pc: u64,
    pub(crate) pstate: u64,
    pub(crate) sys: HashMap<SysReg, u64>,
    /// Makes every [`Vcpu::set_reg`] fail.
    pub(crate) fail_writes: bool,
}

impl FakeVcpu {
    /// vCPU 2 at [`PC`] in EL1h ([`PSTATE_EL1H_Z`]), VBAR_EL1 = [`VBAR`],
    /// SCTLR_EL1.SPAN set (PAN unchanged on entry), DSSBS clear.
    pub(crate) fn new() -> Self {
        let mut x = [0u64; 31];
        for (i, r) in x.iter_mut().enumerate() {
            *r = 0xdead_beef_0000_0000 | i as u64;
        }
        let mut sys = HashMap::new();
        sys.insert(VBAR_EL1, VBAR);
        sys.insert(SCTLR_EL1, 0x30d0_1805 | SCTLR_SPAN);
        FakeVcpu {
            id: 2,
            x,
            pc: PC,
            pstate: PSTATE_EL1H_Z,
            sys,
            fail_writes: false,
        }
    }
}

impl Vcpu for FakeVcpu {
    fn id(&self) -> VcpuId {
        self.id
    }
    fn run(&mut self, _io: &mut dyn VcpuIo) -> hv::Result<VcpuExit> {
        Ok(VcpuExit::Kicked)
    }
    fn reg(&mut self, reg: Reg) -> hv::Result<u64> {
        match reg {
            Reg::X(n) if n <= 30 => Ok(self.x[usize::from(n)]),
            Reg::Pc => Ok(self.pc),
            Reg::Pstate => Ok(self.pstate),
            _ => Err(HvError::Call {
                call: "reg",
                detail: format!("{reg:?}"),
            }),
        }
    }
    fn set_reg(&mut self, reg: Reg, value: u64) -> hv::Result<()> {
        if self.fail_writes {
            return Err(HvError::Call {
                call: "set_reg",
                detail: "injected".into(),
            });
        }
        match reg {
            Reg::X(n) if n <= 30 => self.x[usize::from(n)] = value,
            Reg::Pc => self.pc = value,
            Reg::Pstate => self.pstate = value,
            _ => {
                return Err(HvError::Call {
                    call: "set_reg",
                    detail: format!("{reg:?}"),
                })
            }
        }
        Ok(())
    }
    fn vreg(&mut self, _n: u8) -> hv::Result<u128> {
        Ok(0)
    }
    fn set_vreg(&mut self, _n: u8, _value: u128) -> hv::Result<()> {
        Ok(())
    }
    fn sysreg(&mut self, reg: SysReg) -> hv::Result<u64> {
        Ok(self.sys.get(&reg).copied().unwrap_or(0))
    }
    fn set_sysreg(&mut self, reg: SysReg, value: u64) -> hv::Result<()> {
        self.sys.insert(reg, value);
        Ok(())
    }
    /// The EL1 set every backend saves.
    fn state_sysregs(&self) -> &'static [SysReg] {
        &sr::EL1_STATE_SYSREGS
    }
    fn kicker(&self) -> Arc<dyn Kick> {
        Arc::new(NoKick)
    }
    fn gic_cpu_state(&mut self) -> hv::Result<Vec<(SysReg, u64)>> {
        Ok(Vec::new())
    }
    fn set_gic_cpu_state(&mut self, regs: &[(SysReg, u64)]) -> hv::Result<()> {
        if regs.is_empty() {
            Ok(())
        } else {
            Err(HvError::Call {
                call: "set_gic_cpu_state",
                detail: "the fake vCPU has no in-kernel GIC".into(),
            })
        }
    }
}

/// A VM of [`FakeVcpu`]s: logs `create <id>` for each vCPU it creates (in
/// a log the test shares), fails to create vCPU [`FakeVm::fail`].
#[derive(Default)]
pub(crate) struct FakeVm {
    pub(crate) log: Arc<Mutex<Vec<String>>>,
    /// A vCPU whose creation fails.
    pub(crate) fail: Option<VcpuId>,
    pub(crate) counter_offset: AtomicU64,
}

impl Vm for FakeVm {
    type Vcpu = FakeVcpu;
    /// A [`FakeVcpu::new`] with this id and MPIDR_EL1.
    fn create_vcpu(&self, id: VcpuId, mpidr: u64) -> hv::Result<FakeVcpu> {
        if self.fail == Some(id) {
            return Err(HvError::Call {
                call: "create_vcpu",
                detail: "injected".into(),
            });
        }
        self.log.lock().unwrap().push(format!("create {id}"));
        let mut vcpu = FakeVcpu {
            id,
            ..FakeVcpu::new()
        };
        vcpu.sys.insert(MPIDR_EL1, mpidr);
        Ok(vcpu)
    }
    fn protect(&self, _gpa: u64, _size: u64, _prot: Prot) -> hv::Result<()> {
        Ok(())
    }
    fn rearm_dirty_tracking(&self) -> hv::Result<()> {
        Ok(())
    }
    fn dirty_pages(&self) -> hv::Result<Vec<u64>> {
        Ok(Vec::new())
    }
    fn counter_frequency(&self) -> u64 {
        24_000_000
    }
    fn physical_count(&self) -> u64 {
        1 << 40
    }
    fn counter_offset(&self) -> u64 {
        self.counter_offset.load(Ordering::Relaxed)
    }
    fn set_counter_offset(&self, offset: u64) {
        self.counter_offset.store(offset, Ordering::Relaxed);
    }
    fn kernel_gic(&self) -> Option<Arc<dyn KernelGic>> {
        None
    }
}
