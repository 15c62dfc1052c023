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

/// Stops a vCPU whose dirty-tracking write faults make no progress.
///
/// [`decide`] takes a write fault's page from the exit's IPA. For a stage-2
/// permission fault that is not on a stage-1 table walk the Arm ARM leaves
/// HPFAR_EL2 UNKNOWN (KVM recomputes the IPA from FAR with a stage-1
/// translation), and Apple does not document where Hypervisor.framework's
/// `physical_address` comes from. Were it ever another page of RAM, the VMM
/// would unprotect that page and retry, and the guest would fault again,
/// forever, with no error. A vCPU's handled write fault makes its page
/// writable, so the same access (FAR) faulting on the same page as the
/// vCPU's very previous exit cannot be on that page: this turns it into an
/// error naming both addresses. (The alternative, translating FAR through
/// the guest's stage-1 tables on every fault, needs a page-table walker
/// this backend does not have, and reads guest tables other vCPUs may be
/// changing; detecting the loop needs nothing.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFaultGuard {
    /// FAR and page of the previous exit, if it was a write fault.
    last: Option<(u64, u64)>,
}

impl WriteFaultGuard {
    /// A write fault on `page` (from [`Action::WriteProtectFault`]) at
    /// virtual address `far`, about to be handled. An error if the
    /// previous exit was a write fault at the same `far` and `page`.
    pub fn write_fault(&mut self, far: u64, page: u64) -> hv::Result<()> {
        if self.last.replace((far, page)) == Some((far, page)) {
            return Err(HvError::Call {
                call: "hv_vcpu_run",
                detail: format!(
                    "the write at FAR {far:#x} faulted on IPA page {page:#x} again right after                      that page was made writable: the exit's IPA is not the page the guest                      writes (a stage-2 permission fault leaves HPFAR_EL2 UNKNOWN), so the vCPU                      would fault forever; it is stopped instead"
                ),
            });
        }
        Ok(())
    }

    /// Any other exit (the vCPU made progress), or a write fault left
    /// unhandled (the vCPU was kicked while the page was being saved): the
    /// next write fault is no repeat.
    pub fn progress(&mut self) {
        self.last = None;
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
mod tests;
