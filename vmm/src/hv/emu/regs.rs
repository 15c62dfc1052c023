//! The VMM's access to a vCPU's system registers ([`Vcpu::sysreg`],
//! [`Vcpu::set_sysreg`]): from the VMM's own state where the backend
//! emulates the register, raw CP_REG accesses otherwise, and, for the
//! registers whose write matters to unicorn beyond the stored value, an
//! `MSR` run from the vCPU's scratch page.

use super::sysregs::{is_icc, is_ptimer, watch_config};
use super::timer;
use super::uc::uc_err;
use super::vcpu::EmuVcpu;
use crate::arch::exception::{PSTATE_DAIF, PSTATE_EL1H};
use crate::arch::idregs::{self, BREAKPOINTS};
use crate::arch::sysreg::{self as sr, SysReg};
#[cfg(doc)]
use crate::hv::Vcpu;
use crate::hv::{HvError, Result, VcpuExit};
use unicorn_engine::{uc_error, RegisterARM64 as R};

/// Physical address of the page where [`EmuVcpu::write_by_msr`] runs its
/// instructions: below every device region and RAM (the memory map has
/// nothing under the GIC's distributor), so guest translations, which the
/// TLB hook checks against the memory map, never reach it.
pub(super) const SCRATCH_PA: u64 = 0;

/// The registers [`EmuVcpu::write_by_msr`] writes: the breakpoints'.
/// Slot `n` of the scratch page, at `SCRATCH_PA + 8 * n`, holds
/// `MSR reg, X0; HVC #0`; the code never changes, so no translated block of
/// it goes stale.
pub(super) const MSR_SLOTS: [SysReg; 2 * BREAKPOINTS] = {
    let mut out = [SysReg(0); 2 * BREAKPOINTS];
    let mut n = 0;
    while n < BREAKPOINTS {
        out[2 * n] = SysReg::new(2, 0, 0, n as u8, 4);
        out[2 * n + 1] = SysReg::new(2, 0, 0, n as u8, 5);
        n += 1;
    }
    out
};

// The slots are the breakpoint registers a snapshot saves.
const _: () = {
    let mut n = 0;
    while n < BREAKPOINTS {
        assert!(MSR_SLOTS[2 * n].0 == sr::DEBUG_SYSREGS[1 + n].0);
        assert!(MSR_SLOTS[2 * n + 1].0 == sr::DEBUG_SYSREGS[11 + n].0);
        n += 1;
    }
};

/// The scratch page's code: per slot of [`MSR_SLOTS`], `MSR reg, X0` and
/// `HVC #0`.
fn scratch_code() -> Vec<u8> {
    MSR_SLOTS
        .iter()
        .flat_map(|r| {
            let (op0, op1, crn, crm, op2) = r.fields();
            let msr = 0xd510_0000
                | u32::from(op0 - 2) << 19
                | u32::from(op1) << 16
                | u32::from(crn) << 12
                | u32::from(crm) << 8
                | u32::from(op2) << 5;
            [msr, 0xd400_0002]
        })
        .flat_map(u32::to_le_bytes)
        .collect()
}

impl EmuVcpu {
    /// Maps the scratch page at [`SCRATCH_PA`] and writes its code.
    pub(super) fn map_scratch_page(&self) -> Result<()> {
        let handle = self.engine.get_handle();
        // SAFETY: `handle` is this vCPU's live engine; the page is the
        // engine's own (unicorn allocates it).
        let mapped = unsafe {
            unicorn_engine::uc_mem_map(handle, SCRATCH_PA, 4096, unicorn_engine::Prot::ALL.0)
        };
        std::result::Result::<(), uc_error>::from(mapped).map_err(uc_err("map scratch page"))?;
        let code = scratch_code();
        // SAFETY: as above; `code` is a live buffer of `code.len()` bytes,
        // which fit in the page.
        let written = unsafe {
            unicorn_engine::uc_mem_write(handle, SCRATCH_PA, code.as_ptr().cast(), code.len() as _)
        };
        std::result::Result::<(), uc_error>::from(written).map_err(uc_err("write scratch page"))?;
        Ok(())
    }

    /// Writes `reg`, one of [`MSR_SLOTS`], by executing `MSR reg, X0` at
    /// EL1h with interrupts and debug exceptions masked, then puts back X0,
    /// PSTATE and PC. For registers whose write matters to unicorn beyond
    /// the stored value, which a raw register write skips (quirk 16: a
    /// DBGBVR/DBGBCR write updates QEMU's breakpoint list). The instruction
    /// runs from its slot of the scratch page ([`SCRATCH_PA`]) through the
    /// identity TLB, followed by an `HVC` that ends the run.
    pub(super) fn write_by_msr(&mut self, reg: SysReg, value: u64) -> Result<()> {
        let Some(slot) = MSR_SLOTS.iter().position(|&r| r == reg) else {
            return Err(HvError::Call {
                call: "write_by_msr",
                detail: format!("{reg:?} has no MSR slot"),
            });
        };
        let at = SCRATCH_PA + 8 * slot as u64;
        let err = uc_err("write by MSR");
        let uc = self.uc;
        let saved = (
            uc.read(R::X0).map_err(&err)?,
            uc.read(R::PSTATE).map_err(&err)?,
            uc.read(R::PC).map_err(&err)?,
        );
        // Requests for the guest wait: the block hook would stop the engine
        // for them before the MSR.
        let mut att = self.shared.take_requests();
        self.state().identity = true;
        let mut r = uc
            .flush_tlb()
            .and_then(|()| uc.write(R::PSTATE, PSTATE_EL1H | PSTATE_DAIF))
            .and_then(|()| uc.write(R::X0, value))
            .map_err(&err)
            .and_then(|()| self.rebuild_flags());
        // A request from another thread in the meantime stops the engine
        // before the MSR: run again until the HVC is reached. (The HVC's
        // immediate is not decoded: the scratch page is outside the guest's
        // translations; it leaves PC past itself.)
        let mut done = false;
        for _ in 0..16 {
            if r.is_err() {
                break;
            }
            self.state().exit = None;
            att |= self.shared.take_requests();
            r = self.engine.emu_start(at, 0, 0, 0).map_err(&err);
            let exit = self.state().exit.take();
            if matches!(exit, Some(VcpuExit::Hvc { .. })) && uc.read(R::PC).map_err(&err)? == at + 8
            {
                done = true;
                break;
            }
        }
        self.state().identity = false;
        self.shared.request(att);
        let restored = uc
            .flush_tlb()
            .and_then(|()| uc.write(R::X0, saved.0))
            .and_then(|()| uc.write(R::PSTATE, saved.1))
            .map_err(&err)
            .and_then(|()| self.rebuild_flags())
            .and_then(|()| uc.write(R::PC, saved.2).map_err(&err));
        r.and(restored)?;
        if !done {
            return Err(HvError::Call {
                call: "write_by_msr",
                detail: format!("MSR {reg:?} did not complete"),
            });
        }
        Ok(())
    }
    /// [`Vcpu::sysreg`]: the virtual timer and counter (CNTPCT_EL0 reads
    /// the virtual count), MPIDR and the advertised ID registers from the
    /// VMM's state, FPCR/FPSR and SP_EL0/SP_EL1 from unicorn's registers,
    /// anything else unicorn knows through a raw CP_REG read; ICC_* belong
    /// to the VMM's GIC and CNTP_* to its physical timer.
    pub(super) fn read_sysreg(&mut self, reg: SysReg) -> Result<u64> {
        let uc = self.uc;
        let err = uc_err("read system register");
        let st = self.state();
        Ok(match reg {
            sr::CNTV_CTL_EL0 => st.vtimer.read_ctl(st.vcount()),
            sr::CNTV_CVAL_EL0 => st.vtimer.cval,
            sr::CNTV_TVAL_EL0 => st.vtimer.read_tval(st.vcount()),
            sr::CNTVCT_EL0 | sr::CNTPCT_EL0 => st.vcount(),
            sr::CNTFRQ_EL0 => timer::COUNTER_HZ,
            sr::CNTVOFF_EL2 => st.vm.counter_offset(),
            sr::MPIDR_EL1 => st.mpidr,
            r if idregs::advertised(r).is_some() => idregs::advertised(r).unwrap_or(0),
            sr::FPCR => uc.read(R::FPCR).map_err(err)?,
            sr::FPSR => uc.read(R::FPSR).map_err(err)?,
            sr::SP_EL0 | sr::SP_EL1 => {
                let bank = if reg == sr::SP_EL0 { 0 } else { 1 };
                if self.current_sp_bank()? == bank {
                    uc.read(R::SP).map_err(err)?
                } else {
                    uc.read(if bank == 0 { R::SP_EL0 } else { R::SP_EL1 })
                        .map_err(err)?
                }
            }
            r if is_icc(r) => {
                return Err(HvError::Call {
                    call: "sysreg",
                    detail: format!("{r:?} belongs to the VMM's GIC"),
                })
            }
            r if is_ptimer(r) => {
                return Err(HvError::Call {
                    call: "sysreg",
                    detail: format!("{r:?} belongs to the VMM's physical timer"),
                })
            }
            r => uc.cp_read(r).map_err(|e| HvError::Call {
                call: "sysreg",
                detail: format!("{r:?}: {e:?}"),
            })?,
        })
    }

    /// [`Vcpu::set_sysreg`], as [`EmuVcpu::read_sysreg`]; a write of a
    /// translation register drops the cached walk registers and flushes the
    /// TLB.
    pub(super) fn write_sysreg(&mut self, reg: SysReg, value: u64) -> Result<()> {
        let uc = self.uc;
        let err = uc_err("write system register");
        match reg {
            sr::CNTV_CTL_EL0 => self.state().vtimer.write_ctl(value),
            sr::CNTV_CVAL_EL0 => self.state().vtimer.cval = value,
            sr::CNTV_TVAL_EL0 => {
                let st = self.state();
                let vcount = st.vcount();
                st.vtimer.write_tval(vcount, value);
            }
            sr::CNTVOFF_EL2 => {
                return Err(HvError::Call {
                    call: "set_sysreg",
                    detail: "CNTVOFF_EL2 is the VM's counter offset (Vm::set_counter_offset)"
                        .into(),
                })
            }
            sr::MPIDR_EL1 => {
                let v = value | (1 << 31);
                uc.cp_write(sr::VMPIDR_EL2, v).map_err(err)?;
                self.state().mpidr = v;
            }
            sr::FPCR => uc.write(R::FPCR, value).map_err(err)?,
            sr::FPSR => uc.write(R::FPSR, value).map_err(err)?,
            sr::SP_EL0 | sr::SP_EL1 => {
                let bank = if reg == sr::SP_EL0 { 0 } else { 1 };
                let r = if self.current_sp_bank()? == bank {
                    R::SP
                } else if bank == 0 {
                    R::SP_EL0
                } else {
                    R::SP_EL1
                };
                uc.write(r, value).map_err(err)?;
            }
            sr::CNTKCTL_EL1 => {
                uc.cp_write(reg, value).map_err(err)?;
                self.state().cntkctl = value;
            }
            sr::SCTLR_EL1 | sr::TCR_EL1 | sr::TTBR0_EL1 | sr::TTBR1_EL1 => {
                uc.cp_write(reg, value).map_err(err)?;
                self.state().walk = None;
                // Raw writes skip unicorn's own TLB flush.
                uc.flush_tlb().map_err(uc_err("flush TLB"))?;
            }
            // QEMU's breakpoint list follows these only on an MSR (quirk 16).
            r if MSR_SLOTS.contains(&r) => self.write_by_msr(r, value)?,
            r if is_icc(r) => {
                return Err(HvError::Call {
                    call: "set_sysreg",
                    detail: format!("{r:?} belongs to the VMM's GIC"),
                })
            }
            r if is_ptimer(r) => {
                return Err(HvError::Call {
                    call: "set_sysreg",
                    detail: format!("{r:?} belongs to the VMM's physical timer"),
                })
            }
            r => uc
                .cp_read(r)
                .and_then(|_| uc.cp_write(r, value))
                .map_err(|e| HvError::Call {
                    call: "set_sysreg",
                    detail: format!("{r:?}: {e:?}"),
                })?,
        }
        if watch_config(reg) {
            self.update_watchpoints()?;
        }
        Ok(())
    }
}
