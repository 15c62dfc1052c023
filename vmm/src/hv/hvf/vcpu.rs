//! HVF vCPUs: the loop around `hv_vcpu_run`, register access and kicks.

use super::abi::{check_vreg_readback, sme_snapshot_check};
use super::exits::{complete, decide, Action, ExitRecord, LocalState, Step, WriteFaultGuard};
use super::ffi::{call_err, vcpus_exit, HvVcpuId, RawVcpu};
use super::host::host_count;
use super::regs;
use super::shared::VmShared;
use crate::arch::exception::{PSTATE_DAIF, PSTATE_EL1H};
use crate::arch::idregs;
use crate::arch::sysreg::{SysReg, OSLSR_EL1};
use crate::arch::timer::timer_asserted;
use crate::hv::{HvError, Kick, Reg, Result, Vcpu, VcpuExit, VcpuId, VcpuIo};
use crate::sync::Locked;
use applevisor_sys::{hv_reg_t, hv_sys_reg_t};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Makes one vCPU leave the guest from any thread (`hv_vcpus_exit`).
///
/// A kick sets a flag before calling `hv_vcpus_exit`; the vCPU checks the
/// flag before every `hv_vcpu_run` and on every CANCELED exit, so a kick
/// that arrives while the vCPU is outside the guest is reported by the next
/// [`Vcpu::run`] at once, and a CANCELED exit left over from a kick already
/// reported resumes the guest. The handle does not keep the VM alive.
pub struct HvfKicker {
    /// The vCPU's id while it exists: the vCPU clears it (under this lock)
    /// before `hv_vcpu_destroy`, so `hv_vcpus_exit` never sees a destroyed
    /// id, nor one the framework has given to a newer vCPU.
    vcpu: Mutex<Option<HvVcpuId>>,
    /// `run` returns [`crate::hv::VcpuExit::Kicked`] for it.
    pending: AtomicBool,
    /// The thread that created (and runs) the vCPU.
    thread: std::thread::ThreadId,
}

impl HvfKicker {
    /// `hv_vcpus_exit`: ends a running `hv_vcpu_run`, or the next one at
    /// once.
    fn exit(&self) {
        let vcpu = self.vcpu.locked();
        let Some(id) = *vcpu else {
            return;
        };
        // SAFETY: the vCPU is not destroyed while `vcpu` is locked (its
        // Drop clears the id under this lock first).
        if let Err(e) = unsafe { vcpus_exit(id) } {
            tracing::debug!("hv_vcpus_exit failed: {e}");
        }
    }
}

impl Kick for HvfKicker {
    fn kick(&self) {
        self.pending.store(true, Ordering::Release);
        self.exit();
    }

    /// `run` sets the line from [`VcpuIo::irq_line`] before every
    /// `hv_vcpu_run`: on the vCPU's own thread (an exit being handled, such
    /// as a trapped ICC_SGI1R_EL1 write to itself) that is enough; from
    /// another thread, the vCPU leaves the guest once (without returning
    /// from `run`) to set it.
    fn irq_line_changed(&self) {
        if std::thread::current().id() != self.thread {
            self.exit();
        }
    }
}

/// A Hypervisor.framework vCPU, bound to the thread that created it (not
/// `Send`).
pub struct HvfVcpu {
    // Field order is drop order: the vCPU is destroyed before the VM state
    // (RAM mapping) it references.
    vcpu: RawVcpu,
    kicker: Arc<HvfKicker>,
    shared: Arc<VmShared>,
    id: VcpuId,
    /// HVF masked the vtimer after VTIMER_ACTIVATED (or at creation) and we
    /// have not unmasked it yet.
    vtimer_masked: bool,
    /// The vtimer level last reported to [`VcpuIo::vtimer_level`].
    vtimer_level: Option<bool>,
    /// The vtimer offset this vCPU has set, the VM's counter offset when it
    /// last entered the guest ([`HvfVcpu::sync_counter_offset`]).
    counter_offset: u64,
    /// The VM has an in-kernel GIC: Hypervisor.framework delivers the IRQ
    /// and the vtimer PPI itself.
    kernel_gic: bool,
    local: LocalState,
    /// Stops the vCPU if a write fault repeats without progress.
    write_faults: WriteFaultGuard,
}

/// Writes the ID registers both backends advertise ([`idregs::ADVERTISED`],
/// all of them `hv_sys_reg_t` registers) before the vCPU first runs, as
/// QEMU's hvf does for ID_AA64PFR0_EL1. A register the
/// framework refuses or changes keeps the host's value, with a warning
/// naming it (the guest then sees a value `emu` does not advertise).
fn set_id_regs(vcpu: &RawVcpu) {
    for (reg, value) in idregs::ADVERTISED {
        let Some(r) = regs::hv_sys_reg(reg) else {
            continue; // never: regs.rs checks every entry has an hv_sys_reg_t
        };
        match vcpu
            .set_sys_reg(r, value)
            .and_then(|()| vcpu.get_sys_reg(r))
        {
            Ok(v) if v == value => {}
            Ok(v) => tracing::warn!("{reg:?}: HVF keeps {v:#x}, not the advertised {value:#x}"),
            Err(e) => tracing::warn!("{reg:?}: hv_vcpu_set_sys_reg failed: {e}"),
        }
    }
}

impl HvfVcpu {
    /// Creates the vCPU on the calling thread (see [`crate::hv::Vm::create_vcpu`]).
    pub(super) fn create(shared: Arc<VmShared>, id: VcpuId, mpidr: u64) -> Result<Self> {
        let vcpu = RawVcpu::create().map_err(call_err("hv_vcpu_create"))?;
        vcpu.set_sys_reg(hv_sys_reg_t::MPIDR_EL1, mpidr)
            .map_err(call_err("hv_vcpu_set_sys_reg"))?;
        set_id_regs(&vcpu);
        vcpu.set_reg(hv_reg_t::CPSR, PSTATE_EL1H | PSTATE_DAIF)
            .map_err(call_err("hv_vcpu_set_reg"))?;
        vcpu.set_trap_debug_exceptions(false)
            .map_err(call_err("hv_vcpu_set_trap_debug_exceptions"))?;
        vcpu.set_trap_debug_reg_accesses(false)
            .map_err(call_err("hv_vcpu_set_trap_debug_reg_accesses"))?;
        let counter_offset = shared.counter_offset.load(Ordering::Acquire);
        vcpu.set_vtimer_offset(counter_offset)
            .map_err(call_err("hv_vcpu_set_vtimer_offset"))?;
        // Userspace GIC: start masked, so the first run reports the timer's
        // level (also after a restore) and unmasks it if it is not asserted.
        // In-kernel GIC: never masked; the hypervisor wires the timer to its
        // PPI.
        let kernel_gic = shared.kgic.is_some();
        vcpu.set_vtimer_mask(!kernel_gic)
            .map_err(call_err("hv_vcpu_set_vtimer_mask"))?;
        let kicker = Arc::new(HvfKicker {
            vcpu: Mutex::new(Some(vcpu.id())),
            pending: AtomicBool::new(false),
            thread: std::thread::current().id(),
        });
        Ok(HvfVcpu {
            vcpu,
            kicker,
            shared,
            id,
            vtimer_masked: !kernel_gic,
            vtimer_level: None,
            counter_offset,
            kernel_gic,
            local: LocalState::default(),
            write_faults: WriteFaultGuard::default(),
        })
    }

    fn report_vtimer(&mut self, io: &mut dyn VcpuIo, level: bool) {
        if self.vtimer_level != Some(level) {
            io.vtimer_level(self.id, level);
            self.vtimer_level = Some(level);
        }
    }

    /// While HVF keeps the vtimer masked, re-reads CNTV_CTL_EL0: once the
    /// guest has handled the timer (output no longer asserted) the level
    /// drops and the mask is lifted, so HVF reports the next expiry.
    fn sync_vtimer(&mut self, io: &mut dyn VcpuIo) -> Result<()> {
        if !self.vtimer_masked {
            return Ok(());
        }
        let ctl = self
            .vcpu
            .get_sys_reg(hv_sys_reg_t::CNTV_CTL_EL0)
            .map_err(call_err("hv_vcpu_get_sys_reg"))?;
        let level = timer_asserted(ctl);
        self.report_vtimer(io, level);
        if !level {
            self.vcpu
                .set_vtimer_mask(false)
                .map_err(call_err("hv_vcpu_set_vtimer_mask"))?;
            self.vtimer_masked = false;
        }
        Ok(())
    }

    /// Takes up the VM's counter offset if it moved (a snapshot's resume)
    /// since this vCPU last set it: one count for every vCPU.
    fn sync_counter_offset(&mut self) -> Result<()> {
        let offset = self.shared.counter_offset.load(Ordering::Acquire);
        if offset != self.counter_offset {
            self.vcpu
                .set_vtimer_offset(offset)
                .map_err(call_err("hv_vcpu_set_vtimer_offset"))?;
            self.counter_offset = offset;
        }
        Ok(())
    }

    /// The last exit, as a record for [`decide`] (an exit reason this VMM
    /// does not know is an error).
    fn exit_record(&self) -> Result<ExitRecord> {
        self.vcpu.exit().record()
    }

    fn unsupported(call: &'static str, what: String) -> HvError {
        HvError::Call {
            call,
            detail: format!("{what} is not accessible through Hypervisor.framework"),
        }
    }
}

impl Vcpu for HvfVcpu {
    fn id(&self) -> VcpuId {
        self.id
    }

    /// Runs the guest until an exit for the run loop. Before each entry the
    /// IRQ line is set from [`VcpuIo::irq_line`] (userspace GIC only; an
    /// in-kernel GIC signals the vCPU itself); MMIO, trapped system
    /// registers and dirty-page faults are completed here, before the guest
    /// runs again.
    fn run(&mut self, io: &mut dyn VcpuIo) -> Result<VcpuExit> {
        let ram = self.shared.ram_range();
        loop {
            if self.kicker.pending.swap(false, Ordering::AcqRel) {
                self.sync_vtimer(io)?;
                return Ok(VcpuExit::Kicked);
            }
            self.sync_vtimer(io)?;
            self.sync_counter_offset()?;
            if !self.kernel_gic {
                let irq = io.irq_line(self.id);
                self.vcpu
                    .set_pending_irq(irq)
                    .map_err(call_err("hv_vcpu_set_pending_interrupt"))?;
            }
            self.vcpu.run().map_err(call_err("hv_vcpu_run"))?;
            let exit = self.exit_record()?;
            let armed = self.shared.write_protect_armed.load(Ordering::Acquire);
            let action = decide(&exit, ram, armed);
            if !matches!(action, Action::WriteProtectFault { .. }) {
                self.write_faults.progress();
            }
            match action {
                Action::Kicked => {
                    if self.kicker.pending.swap(false, Ordering::AcqRel) {
                        self.sync_vtimer(io)?;
                        return Ok(VcpuExit::Kicked);
                    }
                }
                Action::VtimerActivated if self.kernel_gic => {
                    return Err(HvError::Call {
                        call: "hv_vcpu_run",
                        detail: "VTIMER_ACTIVATED exit although the in-kernel GIC handles \
                                 the virtual timer"
                            .into(),
                    });
                }
                Action::VtimerActivated => {
                    // HVF masked the vtimer when it reported this exit.
                    self.vtimer_masked = true;
                    self.report_vtimer(io, true);
                }
                Action::WriteProtectFault { page } => {
                    self.write_faults.write_fault(exit.far, page)?;
                    if !self.shared.write_fault(page, &self.kicker.pending)? {
                        // Kicked while a background snapshot's writer saved
                        // the page: the store is retried, and faults again,
                        // when the vCPU next runs; that is no repeat.
                        self.write_faults.progress();
                    }
                }
                Action::Guest(action) => {
                    let mut local = self.local;
                    let offset = self.counter_offset;
                    let count = move || host_count().wrapping_sub(offset);
                    let step = complete(self, io, &exit, action, &mut local, &count);
                    self.local = local;
                    if let Step::Exit(e) = step? {
                        self.sync_vtimer(io)?;
                        return Ok(e);
                    }
                }
            }
        }
    }

    fn reg(&mut self, reg: Reg) -> Result<u64> {
        let r = regs::hv_reg(reg)
            .ok_or_else(|| Self::unsupported("hv_vcpu_get_reg", format!("{reg:?}")))?;
        self.vcpu.get_reg(r).map_err(call_err("hv_vcpu_get_reg"))
    }

    fn set_reg(&mut self, reg: Reg, value: u64) -> Result<()> {
        let r = regs::hv_reg(reg)
            .ok_or_else(|| Self::unsupported("hv_vcpu_set_reg", format!("{reg:?}")))?;
        self.vcpu
            .set_reg(r, value)
            .map_err(call_err("hv_vcpu_set_reg"))
    }

    /// `hv_vcpu_get_simd_fp_reg`. A snapshot reads V0-V31 through here, so
    /// this refuses while the vCPU has live SME state, which V0-V31 do not
    /// carry ([`sme_snapshot_check`]).
    fn vreg(&mut self, n: u8) -> Result<u128> {
        let r = regs::hv_simd_reg(n)
            .ok_or_else(|| Self::unsupported("hv_vcpu_get_simd_fp_reg", format!("V{n}")))?;
        sme_snapshot_check(self.vcpu.sme_state()).map_err(|detail| HvError::Call {
            call: "snapshot",
            detail,
        })?;
        self.vcpu
            .get_simd_fp_reg(r)
            .map_err(call_err("hv_vcpu_get_simd_fp_reg"))
    }

    /// `hv_vcpu_set_simd_fp_reg`, then `hv_vcpu_get_simd_fp_reg`: a value
    /// that does not read back is an error naming the register.
    fn set_vreg(&mut self, n: u8, value: u128) -> Result<()> {
        let r = regs::hv_simd_reg(n)
            .ok_or_else(|| Self::unsupported("hv_vcpu_set_simd_fp_reg", format!("V{n}")))?;
        self.vcpu
            .set_simd_fp_reg(r, value)
            .map_err(call_err("hv_vcpu_set_simd_fp_reg"))?;
        let read = self
            .vcpu
            .get_simd_fp_reg(r)
            .map_err(call_err("hv_vcpu_get_simd_fp_reg"))?;
        check_vreg_readback(n, value, read)
    }

    /// Any register of [`super::HVF_SYSREGS`] (FPCR and FPSR through
    /// `hv_vcpu_get_reg`), and OSLSR_EL1, which the VMM emulates.
    fn sysreg(&mut self, reg: SysReg) -> Result<u64> {
        if reg == OSLSR_EL1 {
            return Ok(self.local.oslsr());
        }
        if let Some(r) = regs::hv_fp_status_reg(reg) {
            return self.vcpu.get_reg(r).map_err(call_err("hv_vcpu_get_reg"));
        }
        let r = regs::hv_sys_reg(reg)
            .ok_or_else(|| Self::unsupported("hv_vcpu_get_sys_reg", format!("{reg:?}")))?;
        self.vcpu
            .get_sys_reg(r)
            .map_err(call_err("hv_vcpu_get_sys_reg"))
    }

    /// As [`HvfVcpu::sysreg`]; the ID registers are written once, at
    /// creation, from [`crate::arch::idregs`]. An OSLSR_EL1 write sets the
    /// OS lock (a reset's or a restore's).
    fn set_sysreg(&mut self, reg: SysReg, value: u64) -> Result<()> {
        if reg == OSLSR_EL1 {
            self.local.set_oslsr(value);
            return Ok(());
        }
        if let Some(r) = regs::hv_fp_status_reg(reg) {
            return self
                .vcpu
                .set_reg(r, value)
                .map_err(call_err("hv_vcpu_set_reg"));
        }
        let r = regs::hv_sys_reg(reg)
            .ok_or_else(|| Self::unsupported("hv_vcpu_set_sys_reg", format!("{reg:?}")))?;
        self.vcpu
            .set_sys_reg(r, value)
            .map_err(call_err("hv_vcpu_set_sys_reg"))
    }

    fn state_sysregs(&self) -> &'static [SysReg] {
        super::SNAPSHOT_SYSREGS
    }

    fn kicker(&self) -> Arc<dyn Kick> {
        self.kicker.clone()
    }

    /// `hv_gic_get_icc_reg` for each register of
    /// [`crate::hv::gic::ICC_STATE_REGS`]; empty with the userspace GIC.
    fn gic_cpu_state(&mut self) -> Result<Vec<(SysReg, u64)>> {
        match &self.shared.kgic {
            Some(k) => k.cpu_state(self.vcpu.id()),
            None => Ok(Vec::new()),
        }
    }

    /// `hv_gic_set_icc_reg` in the saved order, after the list is checked;
    /// only the empty list with the userspace GIC.
    fn set_gic_cpu_state(&mut self, regs: &[(SysReg, u64)]) -> Result<()> {
        match &self.shared.kgic {
            Some(k) => k.set_cpu_state(self.vcpu.id(), regs),
            None if regs.is_empty() => Ok(()),
            None => Err(HvError::Guest(
                "in-kernel GIC registers given to a VM with the userspace GIC".into(),
            )),
        }
    }
}

impl Drop for HvfVcpu {
    /// Retires the kick handle before the vCPU is destroyed (its field
    /// drops after this).
    fn drop(&mut self) {
        *self.kicker.vcpu.locked() = None;
    }
}

// Compile-time check that `HvfVcpu` is not `Send` (HVF binds a vCPU to its
// thread): if it were, both impls below would apply and the call would be
// ambiguous.
trait AmbiguousIfSend<A> {
    fn check() {}
}
impl<T: ?Sized> AmbiguousIfSend<()> for T {}
impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}
const _: fn() = || <HvfVcpu as AmbiguousIfSend<_>>::check();
