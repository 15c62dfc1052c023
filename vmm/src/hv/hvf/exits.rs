//! HVF's exit handling: what to do with a vCPU exit, decided by pure
//! functions and completed through the [`Vcpu`]/[`VcpuIo`] traits, so it is
//! compiled and unit-tested on every host (Hypervisor.framework cannot run on
//! Linux CI). The macOS-only FFI layer feeds it exit records and makes the
//! hypervisor calls it decides on.
//!
//! * [`decide`]: exit record (reason, ESR, FAR, IPA) → [`Action`].
//! * [`complete`]: carries out a [`GuestAction`] on a vCPU (MMIO through
//!   the device bus with register write-back and PC advance before the guest
//!   runs again, trapped system registers, PC adjustment of HVC/SMC/WFx,
//!   injection of UNDEFINED and synchronous external aborts).
//!
//! Spec references are to the Arm ARM (DDI 0487): D1.3 (exception entry),
//! C5.2 (PSTATE/SPSR), D24.2.41 (ESR).

use crate::arch::esr::{
    self, data_abort_esr, unknown_esr, DataAbort, FaultKind, Syndrome, SysRegAccess,
    FSC_SYNC_EXTERNAL,
};
use crate::arch::exception::{current_el, exception_entry, CpuFeatures, GuestException};
use crate::arch::idregs::is_pmu;
use crate::arch::layout::{RamRange, PAGE_SIZE};
use crate::arch::sysreg::{
    ELR_EL1, ESR_EL1, FAR_EL1, ID_AA64MMFR1_EL1, ID_AA64PFR1_EL1, OSDLR_EL1, OSLAR_EL1, OSLSR_EL1,
    SCTLR_EL1, SPSR_EL1, VBAR_EL1,
};
use crate::hv::{self, HvError, Reg, Vcpu, VcpuExit, VcpuIo};

// ---------------------------------------------------------------------------
// Exit records and decisions
// ---------------------------------------------------------------------------

/// Why the hypervisor returned control (Hypervisor.framework's
/// `hv_exit_reason_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// A kick (`hv_vcpus_exit`) made the vCPU leave the guest.
    Canceled,
    /// A synchronous exception to EL2: the ESR says which.
    Exception,
    /// The virtual timer's output became asserted; the hypervisor masked it.
    VtimerActivated,
    /// Anything else the hypervisor reports.
    Unknown,
}

/// One vCPU exit as the hypervisor reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitRecord {
    /// Exit reason.
    pub reason: ExitReason,
    /// Exception syndrome (ESR_EL2 layout); meaningful for
    /// [`ExitReason::Exception`].
    pub esr: u64,
    /// Faulting virtual address (FAR_EL2), for aborts.
    pub far: u64,
    /// Faulting intermediate physical (guest-physical) address, for aborts.
    pub ipa: u64,
}

/// A system register the backend completes itself: ones a hypervisor may
/// trap although no device owns them (on HVF, the set QEMU's hvf backend
/// also handles: PMU, OS lock, CNTPCT_EL0, unallocated ID registers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalSysReg {
    /// `MRS` reads 0 (PMU, OS double lock, unallocated ID registers).
    ReadZero,
    /// `MSR` is ignored (PMU, OS double lock).
    IgnoreWrite,
    /// `MRS OSLSR_EL1`: OSLM = 0b10 (lock implemented) and the vCPU's OSLK.
    ReadOsLockStatus,
    /// `MSR OSLAR_EL1`: OSLK = bit 0 of the value.
    WriteOsLock,
    /// `MRS CNTPCT_EL0`: the VM's virtual count. The guest sees CNTVOFF_EL2
    /// = 0, so its physical count is its virtual count, on both backends
    /// ([`crate::arch::timer`]); QEMU's hvf answers the trapped CNTPCT_EL0
    /// the same way.
    ReadVirtualCount,
}

/// An action the backend carries out with its own hypervisor calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return [`VcpuExit::Kicked`] if a kick was requested, else resume (a
    /// cancel left over from a kick that was already reported).
    Kicked,
    /// Raise the vtimer level through [`VcpuIo::vtimer_level`] and keep the
    /// hypervisor's vtimer mask until the guest has handled it.
    VtimerActivated,
    /// A guest write hit write-protected RAM: mark the page dirty, make it
    /// writable and resume without advancing PC (the store is retried).
    WriteProtectFault {
        /// Guest-physical address of the 16 KiB page.
        page: u64,
    },
    /// Completed on the vCPU state through [`complete`].
    Guest(GuestAction),
}

/// An action that [`complete`] carries out through the [`Vcpu`] and
/// [`VcpuIo`] traits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestAction {
    /// A device load or store with a valid instruction syndrome.
    Mmio {
        /// Guest-physical address of the access.
        gpa: u64,
        /// The decoded abort (size, sign extension, register, direction).
        abort: DataAbort,
    },
    /// A trapped `MRS`/`MSR` for the VMM ([`VcpuIo::sysreg_read`] /
    /// [`VcpuIo::sysreg_write`]).
    SysReg(SysRegAccess),
    /// A trapped `MRS`/`MSR` the backend completes itself.
    LocalSysReg {
        /// The access.
        access: SysRegAccess,
        /// What it does.
        op: LocalSysReg,
    },
    /// Make the trapped instruction UNDEFINED for the guest.
    InjectUndef,
    /// Skip the trapped instruction (cache maintenance by VA on device
    /// memory, which nothing caches).
    SkipInstruction,
    /// `HVC #imm`: PC already points past it.
    Hvc {
        /// The immediate.
        imm: u16,
    },
    /// `SMC #imm`: PC still points at it and must be advanced.
    Smc {
        /// The immediate.
        imm: u16,
    },
    /// `WFI`: advance PC, let the run loop wait.
    Wfi,
    /// `WFE`, or a WFIT/WFET whose timeout the run loop would not honour:
    /// advance PC, let the run loop yield (waking early is architecturally
    /// allowed for all of them).
    Wfe,
    /// An exit the VMM cannot handle; the VM stops with
    /// [`VcpuExit::Unhandled`].
    Unhandled {
        /// Why, for the log.
        reason: &'static str,
    },
}

/// Decides what to do with `exit`. `ram` is guest RAM; `write_protect` says
/// whether RAM may be write-protected for dirty tracking (a stage-2
/// permission fault inside RAM is then a dirty-page fault, whatever its ISV,
/// S1PTW or CM bits say: the page-table walker's own access-flag and dirty
/// updates write RAM too).
///
/// Data aborts outside RAM are MMIO when they are translation or access-flag
/// faults with a valid syndrome (ISV = 1) and not on a stage-1 table walk.
pub fn decide(exit: &ExitRecord, ram: RamRange, write_protect: bool) -> Action {
    match exit.reason {
        ExitReason::Canceled => return Action::Kicked,
        ExitReason::VtimerActivated => return Action::VtimerActivated,
        ExitReason::Unknown => {
            return Action::Guest(GuestAction::Unhandled {
                reason: "the hypervisor reported an unknown exit reason",
            })
        }
        ExitReason::Exception => {}
    }
    let unhandled = |reason| Action::Guest(GuestAction::Unhandled { reason });
    match esr::decode(exit.esr) {
        Syndrome::DataAbort(da) if ram.contains(exit.ipa) => {
            if da.dfsc.is_permission_fault() && write_protect {
                Action::WriteProtectFault {
                    page: exit.ipa & !(PAGE_SIZE - 1),
                }
            } else if da.dfsc.is_permission_fault() {
                unhandled("stage-2 permission fault in RAM while RAM is not write-protected")
            } else {
                unhandled("stage-2 fault inside guest RAM (RAM is fully mapped)")
            }
        }
        Syndrome::DataAbort(da) => {
            if !matches!(
                da.dfsc.kind(),
                FaultKind::Translation | FaultKind::AccessFlag
            ) {
                unhandled("data abort outside RAM that is not a translation fault")
            } else if da.cm {
                Action::Guest(GuestAction::SkipInstruction)
            } else if da.s1ptw {
                unhandled("stage-1 page-table walk outside RAM")
            } else if !da.isv {
                unhandled(
                    "device access without a valid instruction syndrome (ISV=0: load/store \
                     pair, writeback or SIMD access to MMIO) cannot be emulated",
                )
            } else {
                Action::Guest(GuestAction::Mmio {
                    gpa: exit.ipa,
                    abort: da,
                })
            }
        }
        Syndrome::SysReg(access) => Action::Guest(sysreg_action(access)),
        Syndrome::Hvc { imm } => Action::Guest(GuestAction::Hvc { imm }),
        Syndrome::Smc { imm } => Action::Guest(GuestAction::Smc { imm }),
        Syndrome::Wfx {
            wfe: false,
            timeout: false,
            ..
        } => Action::Guest(GuestAction::Wfi),
        Syndrome::Wfx { .. } => Action::Guest(GuestAction::Wfe),
        Syndrome::InstrAbort(_) => unhandled("instruction abort at stage 2"),
        _ => unhandled("exception class not handled by the VMM"),
    }
}

fn sysreg_action(access: SysRegAccess) -> GuestAction {
    use crate::arch::sysreg::CNTPCT_EL0;
    let local = |op| GuestAction::LocalSysReg { access, op };
    let reg = access.reg;
    let (op0, op1, crn, crm, _) = reg.fields();
    if is_pmu(reg) || reg == OSDLR_EL1 {
        local(if access.read {
            LocalSysReg::ReadZero
        } else {
            LocalSysReg::IgnoreWrite
        })
    } else if reg == OSLAR_EL1 {
        if access.read {
            GuestAction::InjectUndef
        } else {
            local(LocalSysReg::WriteOsLock)
        }
    } else if reg == OSLSR_EL1 {
        if access.read {
            local(LocalSysReg::ReadOsLockStatus)
        } else {
            GuestAction::InjectUndef
        }
    } else if reg == CNTPCT_EL0 {
        if access.read {
            local(LocalSysReg::ReadVirtualCount)
        } else {
            GuestAction::InjectUndef
        }
    } else if op0 == 3 && op1 == 0 && crn == 0 && (1..=7).contains(&crm) {
        // The AArch64 ID register space: trapped ones are unallocated (RAZ).
        if access.read {
            local(LocalSysReg::ReadZero)
        } else {
            GuestAction::InjectUndef
        }
    } else {
        // The GIC CPU interface, and the EL1 physical timer (CNTP_CTL_EL0,
        // CNTP_CVAL_EL0, CNTP_TVAL_EL0: HVF traps them without EL2, and the
        // VMM emulates the timer for both backends).
        GuestAction::SysReg(access)
    }
}

// ---------------------------------------------------------------------------
// Completion through the Vcpu trait
// ---------------------------------------------------------------------------

/// What the backend does after [`complete`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Resume the guest.
    Resume,
    /// Return this from [`Vcpu::run`].
    Exit(VcpuExit),
}

/// Per-vCPU state of the registers in [`LocalSysReg`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalState {
    /// OSLSR_EL1.OSLK: the OS lock (set on cold reset, Arm ARM D2.5).
    pub os_lock: bool,
}

impl Default for LocalState {
    fn default() -> Self {
        LocalState { os_lock: true }
    }
}

impl LocalState {
    /// OSLSR_EL1 as the guest reads it: OSLM = 0b10 and OSLK.
    pub fn oslsr(self) -> u64 {
        OSLSR_OSLM_IMPLEMENTED | u64::from(self.os_lock) << 1
    }

    /// Sets OSLK from an OSLSR_EL1 value (the VMM's write, as on a reset;
    /// the guest's OSLSR_EL1 is read-only).
    pub fn set_oslsr(&mut self, value: u64) {
        self.os_lock = value & 1 << 1 != 0;
    }
}

/// OSLSR_EL1.OSLM = 0b10 (bits 3 and 0): the OS lock is implemented.
const OSLSR_OSLM_IMPLEMENTED: u64 = 1 << 3;

/// Carries out `action` for `exit` on `vcpu`, calling `io` for the devices
/// and system registers the VMM owns. The instruction is finished (register
/// write-back, sign extension, PC advance) before this returns, so nothing is
/// left pending across a snapshot. `virtual_count` returns the VM's count
/// (for CNTPCT_EL0, see [`LocalSysReg::ReadVirtualCount`]).
///
/// A device error ([`crate::hv::MmioFault`]) becomes a synchronous external
/// abort in the guest; a system register the VMM refuses becomes UNDEFINED.
/// PC moves past trapped instructions by 4 bytes, or 2 when the syndrome's IL
/// bit is clear.
pub fn complete(
    vcpu: &mut dyn Vcpu,
    io: &mut dyn VcpuIo,
    exit: &ExitRecord,
    action: GuestAction,
    local: &mut LocalState,
    virtual_count: &dyn Fn() -> u64,
) -> hv::Result<Step> {
    let id = vcpu.id();
    let il = exit.esr & IL_BIT != 0;
    match action {
        GuestAction::Mmio { gpa, abort } => {
            complete_mmio(vcpu, io, exit, gpa, &abort)?;
        }
        GuestAction::SysReg(access) if access.read => match io.sysreg_read(id, access.reg) {
            Some(value) => complete_sysreg_read(vcpu, &access, value)?,
            None => inject_exception(vcpu, undefined())?,
        },
        GuestAction::SysReg(access) => {
            let value = sysreg_write_value(vcpu, &access)?;
            if io.sysreg_write(id, access.reg, value) {
                advance_pc(vcpu, il)?;
            } else {
                inject_exception(vcpu, undefined())?;
            }
        }
        GuestAction::LocalSysReg { access, op } => match op {
            LocalSysReg::ReadZero => complete_sysreg_read(vcpu, &access, 0)?,
            LocalSysReg::IgnoreWrite => {
                sysreg_write_value(vcpu, &access)?;
                advance_pc(vcpu, il)?;
            }
            LocalSysReg::ReadOsLockStatus => {
                complete_sysreg_read(vcpu, &access, local.oslsr())?;
            }
            LocalSysReg::WriteOsLock => {
                local.os_lock = sysreg_write_value(vcpu, &access)? & 1 != 0;
                advance_pc(vcpu, il)?;
            }
            LocalSysReg::ReadVirtualCount => {
                complete_sysreg_read(vcpu, &access, virtual_count())?;
            }
        },
        GuestAction::InjectUndef => inject_exception(vcpu, undefined())?,
        GuestAction::SkipInstruction => advance_pc(vcpu, il)?,
        GuestAction::Hvc { imm } => return Ok(Step::Exit(VcpuExit::Hvc { imm })),
        GuestAction::Smc { imm } => {
            advance_pc(vcpu, il)?;
            return Ok(Step::Exit(VcpuExit::Smc { imm }));
        }
        GuestAction::Wfi => {
            advance_pc(vcpu, il)?;
            return Ok(Step::Exit(VcpuExit::Wfi));
        }
        GuestAction::Wfe => {
            advance_pc(vcpu, il)?;
            return Ok(Step::Exit(VcpuExit::Wfe));
        }
        GuestAction::Unhandled { reason } => {
            let pc = vcpu.reg(Reg::Pc)?;
            tracing::error!(
                vcpu = id,
                esr = format_args!("{:#x}", exit.esr),
                far = format_args!("{:#x}", exit.far),
                ipa = format_args!("{:#x}", exit.ipa),
                pc = format_args!("{pc:#x}"),
                "unhandled guest exit: {reason}"
            );
            return Ok(Step::Exit(VcpuExit::Unhandled {
                esr: exit.esr,
                far: exit.far,
                ipa: exit.ipa,
                pc,
            }));
        }
    }
    Ok(Step::Resume)
}

/// ESR IL bit: the trapped instruction is 32 bits.
const IL_BIT: u64 = 1 << 25;

fn complete_mmio(
    vcpu: &mut dyn Vcpu,
    io: &mut dyn VcpuIo,
    exit: &ExitRecord,
    gpa: u64,
    abort: &DataAbort,
) -> hv::Result<()> {
    let id = vcpu.id();
    let result = if abort.wnr {
        let data = mmio_write_value(vcpu, abort)?;
        match io.mmio_write(id, gpa, data.bytes()) {
            Ok(()) => return complete_mmio_write(vcpu, abort),
            Err(fault) => fault,
        }
    } else {
        let mut buf = [0u8; 8];
        let data = buf
            .get_mut(..usize::from(abort.size))
            .ok_or_else(|| HvError::Guest(format!("MMIO read of {} bytes", abort.size)))?;
        match io.mmio_read(id, gpa, data) {
            Ok(()) => return complete_mmio_read(vcpu, abort, data),
            Err(fault) => fault,
        }
    };
    // Guest-triggered and repeatable: keep it out of the default log level.
    tracing::debug!(vcpu = id, %result, "external abort injected");
    let pstate = vcpu.reg(Reg::Pstate)?;
    inject_exception(vcpu, external_abort(abort, exit.far, pstate))
}

// ---------------------------------------------------------------------------
// Registers and PC of a trapped instruction
// ---------------------------------------------------------------------------

/// Reads general-purpose register `rt` for a store or `MSR`: 0..=30 are
/// X0..X30, 31 is XZR (reads as 0). Values above 31 are an error.
pub fn read_xt(vcpu: &mut dyn Vcpu, rt: u8) -> hv::Result<u64> {
    match rt {
        0..=30 => vcpu.reg(Reg::X(rt)),
        31 => Ok(0),
        _ => Err(HvError::Guest(format!("register index {rt} out of range"))),
    }
}

/// Writes general-purpose register `rt` for a load or `MRS`: 0..=30 are
/// X0..X30, 31 is XZR (the value is discarded). Values above 31 are an error.
pub fn write_xt(vcpu: &mut dyn Vcpu, rt: u8, value: u64) -> hv::Result<()> {
    match rt {
        0..=30 => vcpu.set_reg(Reg::X(rt), value),
        31 => Ok(()),
        _ => Err(HvError::Guest(format!("register index {rt} out of range"))),
    }
}

/// Advances PC past the trapped instruction: 4 bytes, or 2 if `il` is clear
/// (a 16-bit T32 instruction).
pub fn advance_pc(vcpu: &mut dyn Vcpu, il: bool) -> hv::Result<()> {
    let pc = vcpu.reg(Reg::Pc)?;
    vcpu.set_reg(Reg::Pc, pc.wrapping_add(if il { 4 } else { 2 }))
}

fn check_mmio(da: &DataAbort, write: bool) -> hv::Result<()> {
    if !da.isv {
        return Err(HvError::Guest(format!(
            "data abort without a valid instruction syndrome (ISV=0, ESR {:#x}): \
             the access cannot be emulated",
            da.to_esr()
        )));
    }
    if !matches!(da.size, 1 | 2 | 4 | 8) {
        return Err(HvError::Guest(format!(
            "data abort with invalid access size {} bytes",
            da.size
        )));
    }
    if da.wnr != write {
        return Err(HvError::Guest(format!(
            "data abort (ESR {:#x}) is a {} but was completed as a {}",
            da.to_esr(),
            if da.wnr { "write" } else { "read" },
            if write { "write" } else { "read" },
        )));
    }
    Ok(())
}

/// Finishes an emulated MMIO load: writes the `data` a device returned
/// (little-endian, `da.size` bytes) to Rt, sign-extended per SSE to 32 or
/// 64 bits per SF ([`esr::extend`]); Rt = 31 discards it. Then advances PC.
///
/// Errors (leaving the vCPU unchanged): ISV = 0, the abort is a write, a size
/// other than 1, 2, 4 or 8, or `data.len() != da.size`.
pub fn complete_mmio_read(vcpu: &mut dyn Vcpu, da: &DataAbort, data: &[u8]) -> hv::Result<()> {
    check_mmio(da, false)?;
    if data.len() != usize::from(da.size) {
        return Err(HvError::Guest(format!(
            "MMIO read of {} bytes completed with {} bytes",
            da.size,
            data.len()
        )));
    }
    let mut buf = [0u8; 8];
    buf[..data.len()].copy_from_slice(data);
    let value = esr::extend(u64::from_le_bytes(buf), da.size, da.sse, da.sf);
    write_xt(vcpu, da.srt, value)?;
    advance_pc(vcpu, da.il)
}

/// The bytes of an emulated MMIO store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioWrite {
    buf: [u8; 8],
    len: u8,
}

impl MmioWrite {
    /// The stored bytes, little-endian (1, 2, 4 or 8 of them).
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The stored value, zero-extended.
    pub fn value(&self) -> u64 {
        u64::from_le_bytes(self.buf)
    }
}

/// The data of an emulated MMIO store: Rt (XZR reads 0) truncated to
/// `da.size` bytes. Does not advance PC: call [`complete_mmio_write`] once the
/// device accepted the write.
///
/// Errors: ISV = 0, the abort is a read, or a size other than 1, 2, 4 or 8.
pub fn mmio_write_value(vcpu: &mut dyn Vcpu, da: &DataAbort) -> hv::Result<MmioWrite> {
    check_mmio(da, true)?;
    let value = read_xt(vcpu, da.srt)?;
    let mut buf = value.to_le_bytes();
    buf[usize::from(da.size)..].fill(0);
    Ok(MmioWrite { buf, len: da.size })
}

/// Finishes an emulated MMIO store: advances PC. Errors as
/// [`mmio_write_value`].
pub fn complete_mmio_write(vcpu: &mut dyn Vcpu, da: &DataAbort) -> hv::Result<()> {
    check_mmio(da, true)?;
    advance_pc(vcpu, da.il)
}

/// Finishes a trapped `MRS`: writes `value` to Rt (XZR discards) and advances
/// PC by 4. Errors if the access is an `MSR`.
pub fn complete_sysreg_read(
    vcpu: &mut dyn Vcpu,
    access: &SysRegAccess,
    value: u64,
) -> hv::Result<()> {
    if !access.read {
        return Err(HvError::Guest(format!(
            "MSR {:?} completed as a read",
            access.reg
        )));
    }
    write_xt(vcpu, access.rt, value)?;
    advance_pc(vcpu, true)
}

/// The value of a trapped `MSR` (Rt; XZR reads 0). Does not advance PC: call
/// [`advance_pc`] once the write is accepted. Errors if the access is an `MRS`.
pub fn sysreg_write_value(vcpu: &mut dyn Vcpu, access: &SysRegAccess) -> hv::Result<u64> {
    if access.read {
        return Err(HvError::Guest(format!(
            "MRS {:?} completed as a write",
            access.reg
        )));
    }
    read_xt(vcpu, access.rt)
}

// ---------------------------------------------------------------------------
// Exceptions injected into the guest (entry: `arch::exception`)
// ---------------------------------------------------------------------------

/// An UNDEFINED instruction (EC 0x00, IL = 1).
pub const fn undefined() -> GuestException {
    GuestException {
        esr: unknown_esr(),
        far: None,
    }
}

/// A synchronous external abort on the data access `abort` at virtual
/// address `far`, taken from the exception level in `pstate`: EC 0x25 from
/// EL1 or 0x24 from EL0, ISV = 0, WnR as the access, DFSC 0b010000.
pub const fn external_abort(abort: &DataAbort, far: u64, pstate: u64) -> GuestException {
    GuestException {
        esr: data_abort_esr(current_el(pstate) == 1, abort.wnr, FSC_SYNC_EXTERNAL),
        far: Some(far),
    }
}

/// Delivers `exc` to the guest through the [`Vcpu`] register interface:
/// reads PC, PSTATE, VBAR_EL1, SCTLR_EL1 and the ID registers that say
/// which PSTATE features the CPU has, writes ESR_EL1, FAR_EL1 (for aborts),
/// ELR_EL1, SPSR_EL1, PSTATE and PC ([`exception_entry`]). The backend's
/// PSTATE write banks the stack pointer (HVF does).
pub fn inject_exception(vcpu: &mut dyn Vcpu, exc: GuestException) -> hv::Result<()> {
    let pc = vcpu.reg(Reg::Pc)?;
    let pstate = vcpu.reg(Reg::Pstate)?;
    let vbar = vcpu.sysreg(VBAR_EL1)?;
    let sctlr = vcpu.sysreg(SCTLR_EL1)?;
    let features = CpuFeatures::from_id_regs(
        vcpu.sysreg(ID_AA64MMFR1_EL1)?,
        vcpu.sysreg(ID_AA64PFR1_EL1)?,
    );
    let entry = exception_entry(exc, pc, pstate, vbar, sctlr, features).ok_or_else(|| {
        HvError::Guest(format!(
            "cannot deliver an exception to EL1 from PSTATE {pstate:#x} (PC {pc:#x})"
        ))
    })?;
    vcpu.set_sysreg(ESR_EL1, entry.esr_el1)?;
    if let Some(far) = entry.far_el1 {
        vcpu.set_sysreg(FAR_EL1, far)?;
    }
    vcpu.set_sysreg(ELR_EL1, entry.elr_el1)?;
    vcpu.set_sysreg(SPSR_EL1, entry.spsr_el1)?;
    vcpu.set_reg(Reg::Pstate, entry.pstate)?;
    vcpu.set_reg(Reg::Pc, entry.pc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::esr::FaultStatus;
    use crate::arch::esr_vectors::*;
    use crate::arch::layout::RAM_BASE;
    use crate::arch::sysreg::{SysReg, CNTPCT_EL0, ICC_EOIR1_EL1, ICC_IAR1_EL1, ID_AA64MMFR0_EL1};
    use crate::hv::fake::{FakeVcpu, PC, PSTATE_EL1H_Z, VBAR};
    use crate::hv::{MmioFault, VcpuId};
    const RAM: RamRange = RamRange {
        base: RAM_BASE,
        size: 64 * PAGE_SIZE,
    };
    /// A PL011 register: the MMIO target of the data-abort cases.
    const UART: u64 = 0x0900_0018;

    fn exception(esr: u64, ipa: u64) -> ExitRecord {
        ExitRecord {
            reason: ExitReason::Exception,
            esr,
            far: 0xffff_0000_0900_0018,
            ipa,
        }
    }

    fn guest(action: Action) -> GuestAction {
        match action {
            Action::Guest(g) => g,
            other => panic!("not a guest action: {other:?}"),
        }
    }

    fn mmio(esr: u64) -> (u64, DataAbort) {
        match guest(decide(&exception(esr, UART), RAM, false)) {
            GuestAction::Mmio { gpa, abort } => (gpa, abort),
            other => panic!("{esr:#x}: {other:?}"),
        }
    }

    fn sysreg(esr: u64) -> GuestAction {
        guest(decide(&exception(esr, 0), RAM, false))
    }

    fn is_unhandled(action: Action) -> bool {
        matches!(action, Action::Guest(GuestAction::Unhandled { .. }))
    }

    // ---- decide ----

    #[test]
    fn mmio_reads_of_every_size_and_extension() {
        // (esr, size, sse, sf, rt)
        for (esr, size, sse, sf, rt) in [
            (LDRB_W1, 1, false, false, 1),
            (LDRH_W2, 2, false, false, 2),
            (LDR_W3, 4, false, false, 3),
            (LDR_X4, 8, false, true, 4),
            (LDRSB_X5, 1, true, true, 5),
            (LDRSB_W8, 1, true, false, 8),
            (LDRSH_W6, 2, true, false, 6),
            (LDRSW_X7, 4, true, true, 7),
        ] {
            let (gpa, da) = mmio(esr);
            assert_eq!(gpa, UART);
            assert!(!da.wnr, "{esr:#x}");
            assert_eq!(
                (da.size, da.sse, da.sf, da.srt),
                (size, sse, sf, rt),
                "{esr:#x}"
            );
        }
    }

    #[test]
    fn mmio_writes_of_every_size() {
        for (esr, size, rt) in [
            (STRB_W1, 1, 1),
            (STRH_W2, 2, 2),
            (STR_W3, 4, 3),
            (STR_X4, 8, 4),
            (STR_XZR, 8, 31),
        ] {
            let (_, da) = mmio(esr);
            assert!(da.wnr);
            assert_eq!((da.size, da.srt), (size, rt), "{esr:#x}");
        }
    }

    #[test]
    fn write_protect_fault_marks_the_16k_page() {
        let ipa = RAM_BASE + 5 * PAGE_SIZE + 0x1234;
        for esr in [STR_X1_PERM, STP_PERM, S1PTW_PERM] {
            assert_eq!(
                decide(&exception(esr, ipa), RAM, true),
                Action::WriteProtectFault {
                    page: RAM_BASE + 5 * PAGE_SIZE
                },
                "{esr:#x}"
            );
            // Without write protection the same fault is a bug, not a retry.
            assert!(is_unhandled(decide(&exception(esr, ipa), RAM, false)));
        }
        // The last byte of RAM is in the last page; one past it is MMIO space.
        let last = RAM_BASE + RAM.size - 1;
        assert_eq!(
            decide(&exception(STR_X1_PERM, last), RAM, true),
            Action::WriteProtectFault {
                page: RAM_BASE + RAM.size - PAGE_SIZE
            }
        );
        assert!(is_unhandled(decide(
            &exception(STR_X1_PERM, RAM_BASE + RAM.size),
            RAM,
            true
        )));
    }

    #[test]
    fn aborts_that_cannot_be_emulated_are_unhandled_not_panics() {
        for esr in [LDP_NO_ISV, S1PTW_TRANSLATION, SEA_MMIO, IABT_L3, BRK_BUG] {
            assert!(
                is_unhandled(decide(&exception(esr, UART), RAM, true)),
                "{esr:#x}"
            );
        }
        // A translation fault inside RAM means RAM was not mapped.
        assert!(is_unhandled(decide(
            &exception(LDR_W3, RAM_BASE),
            RAM,
            true
        )));
        // Cache maintenance on device memory is a no-op.
        assert_eq!(
            decide(&exception(DC_CIVAC_MMIO, UART), RAM, false),
            Action::Guest(GuestAction::SkipInstruction)
        );
        // Every ESR decodes to some action.
        for ec in 0..64u64 {
            let _ = decide(&exception(ec << 26 | 0x3ff_ffff, UART), RAM, true);
        }
    }

    #[test]
    fn sysreg_traps_go_to_the_vmm() {
        assert_eq!(
            sysreg(MRS_X5_IAR1),
            GuestAction::SysReg(SysRegAccess {
                reg: ICC_IAR1_EL1,
                rt: 5,
                read: true
            })
        );
        assert_eq!(
            sysreg(MSR_EOIR1_X3),
            GuestAction::SysReg(SysRegAccess {
                reg: ICC_EOIR1_EL1,
                rt: 3,
                read: false
            })
        );
    }

    #[test]
    fn physical_timer_accesses_go_to_the_vmm() {
        use crate::arch::esr::{encode, ExceptionClass};
        use crate::arch::sysreg::{CNTP_CTL_EL0, CNTP_CVAL_EL0, CNTP_TVAL_EL0};
        for reg in [CNTP_CTL_EL0, CNTP_CVAL_EL0, CNTP_TVAL_EL0] {
            for read in [true, false] {
                let access = SysRegAccess { reg, rt: 4, read };
                let esr = encode(ExceptionClass::SysReg, true, access.to_iss());
                assert_eq!(sysreg(esr), GuestAction::SysReg(access), "{reg:?}");
            }
        }
    }

    #[test]
    fn hypervisor_artifact_sysregs_are_completed_locally() {
        let op = |esr| match sysreg(esr) {
            GuestAction::LocalSysReg { op, .. } => Some(op),
            GuestAction::InjectUndef => None,
            other => panic!("{esr:#x}: {other:?}"),
        };
        assert_eq!(op(MSR_PMUSERENR_XZR), Some(LocalSysReg::IgnoreWrite));
        assert_eq!(op(MRS_X2_PMCR), Some(LocalSysReg::ReadZero));
        assert_eq!(op(MSR_OSLAR_X0), Some(LocalSysReg::WriteOsLock));
        assert_eq!(op(MRS_X1_OSLAR), None);
        assert_eq!(op(MRS_X1_OSLSR), Some(LocalSysReg::ReadOsLockStatus));
        assert_eq!(op(MSR_OSDLR_X0), Some(LocalSysReg::IgnoreWrite));
        assert_eq!(op(MRS_X0_CNTPCT), Some(LocalSysReg::ReadVirtualCount));
        assert_eq!(op(MRS_X2_ISAR2), Some(LocalSysReg::ReadZero));
        assert_eq!(op(MSR_MMFR0_X2), None);
        assert_eq!(
            SysRegAccess::from_iss((MSR_MMFR0_X2 & 0x1ff_ffff) as u32).reg,
            ID_AA64MMFR0_EL1
        );
        assert_eq!(
            SysRegAccess::from_iss((MRS_X0_CNTPCT & 0x1ff_ffff) as u32).reg,
            CNTPCT_EL0
        );
        // PMCCFILTR_EL0 and PMEVTYPER0_EL0 are PMU registers; CNTV_CTL is not.
        assert!(is_pmu(SysReg::new(3, 3, 14, 15, 7)));
        assert!(is_pmu(SysReg::new(3, 3, 14, 12, 0)));
        assert!(is_pmu(SysReg::new(3, 0, 9, 14, 2)));
        assert!(!is_pmu(crate::arch::sysreg::CNTV_CTL_EL0));
        assert!(!is_pmu(crate::arch::sysreg::ICC_PMR_EL1));
    }

    #[test]
    fn calls_waits_and_reasons() {
        let d = |esr| guest(decide(&exception(esr, 0), RAM, false));
        assert_eq!(d(HVC_0), GuestAction::Hvc { imm: 0 });
        assert_eq!(d(0x5A00_1234), GuestAction::Hvc { imm: 0x1234 });
        assert_eq!(d(SMC_0), GuestAction::Smc { imm: 0 });
        assert_eq!(d(WFI), GuestAction::Wfi);
        assert_eq!(d(WFE), GuestAction::Wfe);
        assert_eq!(d(WFIT_X7), GuestAction::Wfe);
        let other = |reason| ExitRecord {
            reason,
            esr: 0,
            far: 0,
            ipa: 0,
        };
        assert_eq!(
            decide(&other(ExitReason::Canceled), RAM, true),
            Action::Kicked
        );
        assert_eq!(
            decide(&other(ExitReason::VtimerActivated), RAM, true),
            Action::VtimerActivated
        );
        assert!(is_unhandled(decide(&other(ExitReason::Unknown), RAM, true)));
    }

    // ---- complete, against a fake vCPU and device bus ----

    /// A device bus that records every call.
    #[derive(Default)]
    struct FakeIo {
        read_data: Vec<u8>,
        fail: bool,
        sysreg_value: Option<u64>,
        accept_sysreg_write: bool,
        calls: Vec<String>,
    }

    impl VcpuIo for FakeIo {
        fn mmio_read(&mut self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
            self.calls
                .push(format!("read {vcpu} {gpa:#x} {}", data.len()));
            if self.fail {
                return Err(MmioFault {
                    gpa,
                    len: data.len(),
                    reason: "test",
                });
            }
            data.copy_from_slice(&self.read_data[..data.len()]);
            Ok(())
        }
        fn mmio_write(&mut self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
            self.calls.push(format!("write {vcpu} {gpa:#x} {data:x?}"));
            if self.fail {
                return Err(MmioFault {
                    gpa,
                    len: data.len(),
                    reason: "test",
                });
            }
            Ok(())
        }
        fn sysreg_read(&mut self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
            self.calls.push(format!("mrs {vcpu} {reg:?}"));
            self.sysreg_value
        }
        fn sysreg_write(&mut self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
            self.calls.push(format!("msr {vcpu} {reg:?} {value:#x}"));
            self.accept_sysreg_write
        }
        fn irq_line(&mut self, _vcpu: VcpuId) -> bool {
            false
        }
        fn vtimer_level(&mut self, _vcpu: VcpuId, _level: bool) {}
    }

    fn virtual_count() -> u64 {
        50_000
    }

    /// Decides and completes `esr` at `ipa` on `v` with `io`.
    fn run(v: &mut FakeVcpu, io: &mut FakeIo, esr: u64, ipa: u64) -> Step {
        let exit = exception(esr, ipa);
        let action = guest(decide(&exit, RAM, true));
        complete(
            v,
            io,
            &exit,
            action,
            &mut LocalState::default(),
            &virtual_count,
        )
        .unwrap()
    }

    #[test]
    fn mmio_read_writes_back_extends_and_advances_pc() {
        // (esr, device bytes, register, expected value)
        for (esr, bytes, rt, expected) in [
            (LDRB_W1, &[0x80u8][..], 1, 0x80),
            (LDRH_W2, &[0x34, 0x82], 2, 0x8234),
            (LDR_W3, &[0x78, 0x56, 0x34, 0x92], 3, 0x9234_5678),
            (
                LDR_X4,
                &[1, 2, 3, 4, 5, 6, 7, 0x88],
                4,
                0x8807_0605_0403_0201,
            ),
            (LDRSB_X5, &[0x80], 5, 0xffff_ffff_ffff_ff80),
            (LDRSB_W8, &[0x80], 8, 0xffff_ff80),
            (LDRSH_W6, &[0x00, 0x80], 6, 0xffff_8000),
            (LDRSW_X7, &[0, 0, 0, 0x80], 7, 0xffff_ffff_8000_0000),
            (LDRSW_X7, &[0, 0, 0, 0x7f], 7, 0x7f00_0000),
        ] {
            let mut v = FakeVcpu::new();
            let mut io = FakeIo {
                read_data: bytes.to_vec(),
                ..Default::default()
            };
            let mut expected_x = v.x;
            expected_x[rt] = expected;
            assert_eq!(run(&mut v, &mut io, esr, UART), Step::Resume);
            assert_eq!(io.calls, [format!("read 2 {UART:#x} {}", bytes.len())]);
            assert_eq!(v.x, expected_x, "{esr:#x}");
            assert_eq!(v.pc, PC + 4, "PC advanced before the guest runs again");
        }
    }

    #[test]
    fn mmio_write_sends_truncated_register_and_advances_pc() {
        for (esr, expected) in [
            (STRB_W1, "[1]"),
            (STRH_W2, "[2, 0]"),
            (STR_W3, "[3, 0, 0, 0]"),
            (STR_X4, "[4, 0, 0, 0, ef, be, ad, de]"),
            (STR_XZR, "[0, 0, 0, 0, 0, 0, 0, 0]"),
        ] {
            let mut v = FakeVcpu::new();
            let before = v.x;
            let mut io = FakeIo::default();
            assert_eq!(run(&mut v, &mut io, esr, UART), Step::Resume);
            assert_eq!(io.calls, [format!("write 2 {UART:#x} {expected}")]);
            assert_eq!(v.x, before);
            assert_eq!(v.pc, PC + 4);
        }
    }

    #[test]
    fn mmio_fault_injects_a_synchronous_external_abort() {
        for (esr, wnr) in [(LDR_W3, false), (STR_W3, true)] {
            let mut v = FakeVcpu::new();
            let before = v.x;
            let mut io = FakeIo {
                fail: true,
                ..Default::default()
            };
            assert_eq!(run(&mut v, &mut io, esr, UART), Step::Resume);
            assert_eq!(v.x, before, "no write-back on a fault");
            assert_eq!(v.pc, VBAR + 0x200, "current EL with SP_EL1");
            assert_eq!(v.sys[&ELR_EL1], PC, "return to the faulting access");
            assert_eq!(v.sys[&SPSR_EL1], PSTATE_EL1H_Z);
            assert_eq!(v.sys[&FAR_EL1], 0xffff_0000_0900_0018);
            // EC 0x25 (0x9400_0000) | IL | WnR? | DFSC 0b010000.
            let expected = 0x9600_0010 | if wnr { 0x40 } else { 0 };
            assert_eq!(v.sys[&ESR_EL1], expected);
            assert_eq!(v.pstate, 0x4000_03c5, "EL1h, DAIF masked, Z kept");
        }
    }

    #[test]
    fn sysreg_read_write_and_refusal() {
        let mut v = FakeVcpu::new();
        let mut io = FakeIo {
            sysreg_value: Some(27),
            accept_sysreg_write: true,
            ..Default::default()
        };
        run(&mut v, &mut io, MRS_X5_IAR1, 0);
        assert_eq!((v.x[5], v.pc), (27, PC + 4));
        v.x[3] = 27;
        run(&mut v, &mut io, MSR_EOIR1_X3, 0);
        assert_eq!(v.pc, PC + 8);
        assert_eq!(io.calls, ["mrs 2 ICC_IAR1_EL1", "msr 2 ICC_EOIR1_EL1 0x1b"]);

        // Refused: UNDEFINED at the MRS/MSR itself, Rt untouched.
        for esr in [MRS_X5_IAR1, MSR_EOIR1_X3] {
            let mut v = FakeVcpu::new();
            let before = v.x;
            let mut io = FakeIo::default();
            run(&mut v, &mut io, esr, 0);
            assert_eq!(v.x, before);
            assert_eq!(v.sys[&ESR_EL1], 0x0200_0000, "EC 0, IL 1");
            assert_eq!(v.sys[&ELR_EL1], PC);
            assert_eq!(v.pc, VBAR + 0x200);
            assert!(!v.sys.contains_key(&FAR_EL1));
        }
    }

    #[test]
    fn local_sysregs() {
        let exit = |esr| exception(esr, 0);
        let mut v = FakeVcpu::new();
        let mut io = FakeIo::default();
        let mut local = LocalState::default();
        let mut go = |v: &mut FakeVcpu, esr| {
            let e = exit(esr);
            let a = guest(decide(&e, RAM, false));
            complete(v, &mut io, &e, a, &mut local, &virtual_count).unwrap()
        };
        v.x[1] = 5;
        go(&mut v, MRS_X1_OSLSR);
        assert_eq!(v.x[1], 0b1010, "OSLM=0b10, locked at reset");
        v.x[0] = 0;
        go(&mut v, MSR_OSLAR_X0);
        go(&mut v, MRS_X1_OSLSR);
        assert_eq!(v.x[1], 0b1000, "unlocked");
        go(&mut v, MRS_X0_CNTPCT);
        assert_eq!(v.x[0], 50_000, "CNTPCT_EL0 reads the virtual count");
        v.x[2] = 7;
        go(&mut v, MRS_X2_PMCR);
        assert_eq!(v.x[2], 0);
        go(&mut v, MSR_PMUSERENR_XZR);
        assert_eq!(v.pc, PC + 24, "six instructions completed");
        go(&mut v, MRS_X1_OSLAR);
        assert_eq!(
            v.pc,
            VBAR + 0x200,
            "reading a write-only register is UNDEFINED"
        );
        assert!(io.calls.is_empty(), "none of these reach the VMM");
    }

    #[test]
    fn the_vmm_reads_and_resets_the_os_lock() {
        let mut local = LocalState::default();
        assert_eq!(local.oslsr(), 0b1010, "locked at reset");
        local.set_oslsr(0b1000);
        assert_eq!((local.os_lock, local.oslsr()), (false, 0b1000));
        local.set_oslsr(0b1010);
        assert_eq!(local, LocalState::default());
    }

    #[test]
    fn calls_and_waits_leave_pc_past_the_instruction() {
        for (esr, exit, advance) in [
            (HVC_0, VcpuExit::Hvc { imm: 0 }, 0),
            (SMC_0, VcpuExit::Smc { imm: 0 }, 4),
            (WFI, VcpuExit::Wfi, 4),
            (WFE, VcpuExit::Wfe, 4),
            (WFIT_X7, VcpuExit::Wfe, 4),
        ] {
            let mut v = FakeVcpu::new();
            // HVF reports HVC with PC already past it (preferred return
            // address of HVC is the next instruction), SMC and WFx at them.
            let mut io = FakeIo::default();
            assert_eq!(run(&mut v, &mut io, esr, 0), Step::Exit(exit));
            assert_eq!(v.pc, PC + advance, "{esr:#x}");
        }
        let mut v = FakeVcpu::new();
        let mut io = FakeIo::default();
        assert_eq!(run(&mut v, &mut io, DC_CIVAC_MMIO, UART), Step::Resume);
        assert_eq!(v.pc, PC + 4);
        assert_eq!(
            run(&mut v, &mut io, LDP_NO_ISV, UART),
            Step::Exit(VcpuExit::Unhandled {
                esr: LDP_NO_ISV,
                far: 0xffff_0000_0900_0018,
                ipa: UART,
                pc: PC + 4,
            })
        );
        assert!(io.calls.is_empty());
    }

    // ---- injected exceptions ----

    #[test]
    fn external_abort_syndrome() {
        // External abort from EL0 uses EC 0x24 and keeps FAR.
        let da = match esr::decode(STR_W3) {
            Syndrome::DataAbort(d) => d,
            _ => unreachable!(),
        };
        let sea = external_abort(&da, 0x1234, 0);
        assert_eq!(sea.esr, 0x9200_0050);
        assert_eq!(sea.far, Some(0x1234));
        assert_eq!(
            FaultStatus((sea.esr & 0x3f) as u8).kind(),
            FaultKind::SyncExternal
        );
        assert_eq!(current_el(0x3c5), 1);
        assert_eq!(current_el(0x10), 0);
    }

    // ---- completion helpers ----

    fn da(esr: u64) -> DataAbort {
        match esr::decode(esr) {
            Syndrome::DataAbort(d) => d,
            other => panic!("{esr:#x} decoded as {other:?}"),
        }
    }

    /// A fake vCPU at a low PC (the MMU-off kernel entry).
    fn fake() -> FakeVcpu {
        FakeVcpu {
            pc: 0x4008_0000,
            ..FakeVcpu::new()
        }
    }

    fn load(size: u8, sse: bool, sf: bool, srt: u8) -> DataAbort {
        let mut d = da(LDR_W1);
        d.size = size;
        d.sse = sse;
        d.sf = sf;
        d.srt = srt;
        d
    }

    /// The architectural result, computed with Rust's integer casts.
    fn reference(bytes: &[u8], sse: bool, sf: bool) -> u64 {
        let mut b = [0u8; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        let raw = u64::from_le_bytes(b);
        let v = match (bytes.len(), sse) {
            (1, true) => raw as u8 as i8 as i64 as u64,
            (2, true) => raw as u16 as i16 as i64 as u64,
            (4, true) => raw as u32 as i32 as i64 as u64,
            _ => raw,
        };
        if sf {
            v
        } else {
            v as u32 as u64
        }
    }

    #[test]
    fn mmio_read_every_size_sign_and_width() {
        let patterns: [&[u8]; 8] = [
            &[0x7f],
            &[0x80],
            &[0xff, 0x7f],
            &[0x00, 0x80],
            &[0x78, 0x56, 0x34, 0x12],
            &[0x00, 0x00, 0x00, 0x80],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0xf2],
        ];
        for data in patterns {
            let size = data.len() as u8;
            for sse in [false, true] {
                for sf in [false, true] {
                    for rt in [0u8, 7, 30, 31] {
                        let mut v = fake();
                        let before = v.x;
                        complete_mmio_read(&mut v, &load(size, sse, sf, rt), data).unwrap();
                        assert_eq!(v.pc, 0x4008_0004);
                        let mut expected = before;
                        if rt < 31 {
                            expected[usize::from(rt)] = reference(data, sse, sf);
                        }
                        assert_eq!(v.x, expected, "{data:x?} sse={sse} sf={sf} rt={rt}");
                    }
                }
            }
        }
    }

    #[test]
    fn mmio_read_rejects_bad_completions() {
        let mut v = fake();
        let before = (v.x, v.pc);
        let mut no_isv = load(4, false, false, 1);
        no_isv.isv = false;
        assert!(complete_mmio_read(&mut v, &no_isv, &[0; 4]).is_err());
        assert!(complete_mmio_read(&mut v, &load(4, false, false, 1), &[0; 2]).is_err());
        assert!(complete_mmio_read(&mut v, &load(16, false, true, 1), &[0; 16]).is_err());
        assert!(complete_mmio_read(&mut v, &load(3, false, true, 1), &[0; 3]).is_err());
        assert!(complete_mmio_read(&mut v, &da(STRB_W3), &[0; 1]).is_err());
        assert_eq!((v.x, v.pc), before);
        v.fail_writes = true;
        assert!(complete_mmio_read(&mut v, &load(4, false, false, 1), &[0; 4]).is_err());
    }

    #[test]
    fn mmio_write_truncates_and_reads_xzr_as_zero() {
        let mut v = fake();
        v.x[3] = 0x1122_3344_5566_7788;
        let mut st = da(STRB_W3);
        for (size, expected) in [
            (1u8, &[0x88u8][..]),
            (2, &[0x88, 0x77]),
            (4, &[0x88, 0x77, 0x66, 0x55]),
            (8, &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]),
        ] {
            st.size = size;
            let w = mmio_write_value(&mut v, &st).unwrap();
            assert_eq!(w.bytes(), expected);
            assert_eq!(w.value().to_le_bytes()[..usize::from(size)], *expected);
        }
        st.srt = 31;
        let w = mmio_write_value(&mut v, &st).unwrap();
        assert_eq!(w.bytes(), &[0u8; 8]);
        assert_eq!(v.pc, 0x4008_0000, "reading the value must not move PC");
        complete_mmio_write(&mut v, &st).unwrap();
        assert_eq!(v.pc, 0x4008_0004);
        // A 16-bit T32 instruction (IL=0) advances by 2.
        st.il = false;
        complete_mmio_write(&mut v, &st).unwrap();
        assert_eq!(v.pc, 0x4008_0006);

        assert!(mmio_write_value(&mut v, &da(LDR_W1)).is_err());
        assert!(complete_mmio_write(&mut v, &da(LDR_W1)).is_err());
        st.size = 9;
        assert!(mmio_write_value(&mut v, &st).is_err());
        st.size = 4;
        st.isv = false;
        assert!(mmio_write_value(&mut v, &st).is_err());
    }

    #[test]
    fn sysreg_completion() {
        let Syndrome::SysReg(mrs) = esr::decode(MRS_X5_IAR1) else {
            unreachable!()
        };
        let Syndrome::SysReg(msr) = esr::decode(MSR_EOIR1_X3) else {
            unreachable!()
        };
        let mut v = fake();
        v.x[3] = 27;
        assert_eq!(sysreg_write_value(&mut v, &msr).unwrap(), 27);
        assert!(sysreg_write_value(&mut v, &mrs).is_err());
        complete_sysreg_read(&mut v, &mrs, 0x1b).unwrap();
        assert_eq!((v.x[5], v.pc), (0x1b, 0x4008_0004));
        assert!(complete_sysreg_read(&mut v, &msr, 0).is_err());
        let xzr = SysRegAccess { rt: 31, ..mrs };
        let before = v.x;
        complete_sysreg_read(&mut v, &xzr, 5).unwrap();
        assert_eq!(v.x, before);
        assert_eq!(read_xt(&mut v, 31).unwrap(), 0);
        assert!(read_xt(&mut v, 32).is_err());
        assert!(write_xt(&mut v, 255, 0).is_err());
    }
}
