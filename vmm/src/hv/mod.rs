//! The hypervisor abstraction shared by both backends.
//!
//! A backend provides a [`Hypervisor`] that creates a [`Vm`]; the VM maps guest
//! RAM that the VMM allocated itself ([`crate::memory::GuestRam`]) and creates
//! [`Vcpu`]s. A vCPU runs until an exit that the run loop must decide on
//! ([`VcpuExit`]). Accesses the backend can complete by itself with the VMM's
//! help (MMIO, trapped system registers) go through [`VcpuIo`] *inside*
//! [`Vcpu::run`], and the backend finishes the instruction (register
//! write-back, sign extension, PC advance) before it returns or continues, so
//! a vCPU is at an instruction boundary whenever `run` has returned.
//!
//! Threading: HVF binds a vCPU to the thread that created it, so [`Vcpu`] is
//! not `Send`; only a [`Kick`] handle crosses threads.

use crate::arch::sysreg::SysReg;
use crate::memory::GuestRam;
use std::sync::Arc;

pub use gic::{GicMode, KernelGic};

#[cfg(emu)]
pub mod emu;
#[cfg(test)]
pub(crate) mod fake;
pub mod gic;
pub mod hvf;

/// Index of a vCPU, `0..vcpus`.
pub type VcpuId = usize;

/// Errors from a hypervisor backend.
#[derive(Debug, thiserror::Error)]
pub enum HvError {
    /// The backend cannot be used on this host.
    #[error("the {backend} backend is not available on this host: {reason}")]
    Unavailable {
        /// Backend name.
        backend: &'static str,
        /// Why not.
        reason: String,
    },
    /// A backend call failed.
    #[error("{call} failed: {detail}")]
    Call {
        /// The call or operation that failed.
        call: &'static str,
        /// The backend's return code or message.
        detail: String,
    },
    /// The guest did something the VMM cannot handle; the VM stops.
    #[error("unhandled guest exit: {0}")]
    Guest(String),
    /// The requested GIC mode cannot be used with this backend or host.
    #[error("{reason}")]
    GicModeUnavailable {
        /// The mode asked for.
        mode: GicMode,
        /// Why not, as a sentence for the user.
        reason: String,
    },
}

/// Result type of backend operations.
pub type Result<T> = std::result::Result<T, HvError>;

/// A general-purpose or special register of a vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reg {
    /// `X0`..`X30` (the index must be at most 30).
    X(u8),
    /// Program counter.
    Pc,
    /// PSTATE as saved in SPSR format (NZCV, DAIF, EL and SP selection).
    Pstate,
}

/// Access permissions of guest RAM pages as seen by the guest (stage 2 on
/// HVF, the software TLB on `emu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prot {
    /// Read, write and execute.
    ReadWriteExec,
    /// Read and execute: the first write faults, which dirty tracking uses.
    ReadExec,
}

/// A handle that makes a running vCPU return from [`Vcpu::run`] with
/// [`VcpuExit::Kicked`] at the next instruction boundary (or immediately if it
/// is not running; the next `run` then returns at once). Safe to call from any
/// thread.
pub trait Kick: Send + Sync {
    /// Requests the exit.
    fn kick(&self);

    /// The vCPU's IRQ line may have risen ([`VcpuIo::irq_line`]): the vCPU
    /// re-evaluates it before it next executes guest code, without returning
    /// from [`Vcpu::run`] for it, so that a spinning vCPU takes the
    /// interrupt at once. The default is a [`Kick::kick`].
    fn irq_line_changed(&self) {
        self.kick();
    }
}

/// A round-robin backend's request that vCPU `id` run soon, for a reason
/// only the backend sees ([`Vm::set_run_request`]). Called from any thread.
pub type RunRequest = Arc<dyn Fn(VcpuId) + Send + Sync>;

/// Why [`Vcpu::run`] returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuExit {
    /// `HVC #imm`: PC already points past the instruction; arguments in X0..X3
    /// (SMC Calling Convention), results go back in X0..X3.
    Hvc {
        /// The 16-bit immediate.
        imm: u16,
    },
    /// `SMC #imm`, as for [`VcpuExit::Hvc`].
    Smc {
        /// The 16-bit immediate.
        imm: u16,
    },
    /// `WFI`: PC already points past it. The vCPU should not run again until
    /// its IRQ line is asserted or its virtual timer deadline passes.
    Wfi,
    /// `WFE`: a hint; the run loop may yield.
    Wfe,
    /// A [`Kick`] was requested.
    Kicked,
    /// An exception the VMM does not handle, reported with the syndrome, fault
    /// address and PC. The VM stops with this as an error; it is never a panic.
    Unhandled {
        /// Exception syndrome (ESR_EL2 layout).
        esr: u64,
        /// Faulting virtual address, if known (0 otherwise).
        far: u64,
        /// Faulting guest-physical address, if known (0 otherwise).
        ipa: u64,
        /// PC of the faulting instruction.
        pc: u64,
    },
}

/// A guest MMIO access the VMM could not complete ([`VcpuIo::mmio_read`],
/// [`VcpuIo::mmio_write`]): nothing at the address, or an access size or
/// alignment the device cannot take. The backend turns it into a
/// synchronous external abort where it can deliver one precisely (HVF
/// always; `emu` on its trapped regions). An access a device only ignores
/// (read-as-zero / write-ignored) is not a fault: it completes with `Ok`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MMIO fault at GPA {gpa:#x} ({len} bytes): {reason}")]
pub struct MmioFault {
    /// Guest-physical address of the access.
    pub gpa: u64,
    /// Access size in bytes.
    pub len: usize,
    /// What went wrong, for the log.
    pub reason: &'static str,
}

/// The VMM's side of a vCPU exit that the backend completes in place. The
/// backend calls these from inside [`Vcpu::run`].
pub trait VcpuIo {
    /// A guest load of `data.len()` (1, 2, 4 or 8) bytes from device memory at
    /// `gpa`; the device fills `data` little-endian. On `Err` the guest gets a
    /// synchronous external abort.
    fn mmio_read(
        &mut self,
        vcpu: VcpuId,
        gpa: u64,
        data: &mut [u8],
    ) -> std::result::Result<(), MmioFault>;
    /// A guest store to device memory, as for [`VcpuIo::mmio_read`].
    fn mmio_write(
        &mut self,
        vcpu: VcpuId,
        gpa: u64,
        data: &[u8],
    ) -> std::result::Result<(), MmioFault>;
    /// A trapped `MRS` of a register the backend does not implement itself
    /// (the GIC CPU interface; the EL1 physical timer's CNTP_CTL_EL0,
    /// CNTP_CVAL_EL0 and CNTP_TVAL_EL0, which the VMM emulates for both
    /// backends). `None` makes the instruction UNDEFINED for the guest.
    fn sysreg_read(&mut self, vcpu: VcpuId, reg: SysReg) -> Option<u64>;
    /// A trapped `MSR`; `false` makes the instruction UNDEFINED.
    fn sysreg_write(&mut self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool;
    /// Whether the vCPU's IRQ line is asserted now. Backends re-check it after
    /// every MMIO and system-register access and before resuming the guest.
    fn irq_line(&mut self, vcpu: VcpuId) -> bool;
    /// The output of the vCPU's EL1 virtual timer changed: `level` is
    /// `CNTV_CTL.ENABLE && !CNTV_CTL.IMASK && CNTV_CTL.ISTATUS` (Arm ARM
    /// D11.2.4). The timer is part of the vCPU (hardware on HVF, emulated by
    /// the `emu` backend); the VMM wires it to the timer PPI
    /// ([`crate::arch::layout::VTIMER_INTID`]).
    fn vtimer_level(&mut self, vcpu: VcpuId, level: bool);
}

/// A hypervisor backend.
pub trait Hypervisor {
    /// The VM type.
    type Vm: Vm;
    /// Backend name as used on the command line (`emu`, `hvf`).
    const NAME: &'static str;
    /// Whether all vCPUs must run round-robin on one host thread (`emu`)
    /// rather than one thread per vCPU (HVF binds a vCPU to its thread).
    const ROUND_ROBIN: bool = false;
    /// Whether a child of `fork()` can go on with this backend's vCPUs
    /// ([`Vm::adopt_vcpu`]): `emu` (a unicorn engine is memory of the
    /// process, and its translated code comes along). Not HVF: a VM belongs
    /// to the process that created it.
    const FORKS_VCPUS: bool = false;
    /// Whether this backend on this host can give a VM interrupt controller
    /// `mode`; [`HvError::GicModeUnavailable`] says why not. Cheap and
    /// side-effect free, so a run can refuse early, before it creates
    /// anything.
    fn check_gic_mode(&self, mode: GicMode) -> Result<()>;
    /// Creates a VM with `vcpus` vCPUs (not yet created), maps `ram`, and,
    /// for [`GicMode::Hvf`], creates the in-kernel GIC at the memory map's
    /// GICD/GICR addresses (after the RAM mapping, before any vCPU).
    fn create_vm(&self, ram: Arc<GuestRam>, vcpus: usize, gic: GicMode) -> Result<Self::Vm>;
}

/// A virtual machine: guest RAM mapping, page protection, vCPU creation and
/// the guest's counter.
pub trait Vm: Send + Sync {
    /// The vCPU type.
    type Vcpu: Vcpu + 'static;
    /// Creates vCPU `id` with affinity `mpidr` (MPIDR_EL1 value) in its reset
    /// state (EL1h, MMU off). Must be called on the thread that will run it.
    fn create_vcpu(&self, id: VcpuId, mpidr: u64) -> Result<Self::Vcpu>;
    /// Makes `vcpu`, a vCPU of another VM of this process whose RAM was
    /// mapped at the same host address and size (a VM of the process this
    /// one was forked from, see [`Hypervisor::FORKS_VCPUS`]), this VM's vCPU
    /// of the same id, as [`Vm::create_vcpu`] would make it but with its
    /// registers and its translated code. The other VM must never be used again. Errors:
    /// [`HvError::Call`] if the backend cannot, the id is out of range or
    /// taken, or the vCPU maps other RAM.
    fn adopt_vcpu(&self, vcpu: Self::Vcpu) -> Result<Self::Vcpu> {
        Err(HvError::Call {
            call: "adopt_vcpu",
            detail: format!(
                "vCPU {}: this backend cannot take a vCPU of another VM",
                vcpu.id()
            ),
        })
    }
    /// Changes guest access permissions of `size` bytes of RAM at `gpa`
    /// (both multiples of [`crate::arch::layout::PAGE_SIZE`]).
    fn protect(&self, gpa: u64, size: u64, prot: Prot) -> Result<()>;
    /// Write-protects all of RAM and forgets the pages recorded so far, as one
    /// operation over all of RAM (not a per-page loop). From then on, the
    /// first guest write to each 16 KiB page is recorded and makes the page
    /// writable; the faulting instruction completes exactly once. Used to
    /// start dirty tracking and to re-arm it after a snapshot is on disk.
    /// Call only while no vCPU runs (before they start, or with all of them
    /// parked): the bitmap is cleared before RAM is protected, so a write in
    /// between would be lost.
    fn rearm_dirty_tracking(&self) -> Result<()>;
    /// The 16 KiB pages (indices from the start of RAM, ascending) the guest
    /// wrote since the last [`Vm::rearm_dirty_tracking`]. Does not clear them,
    /// so a snapshot that fails loses nothing. Writes by the VMM itself are in
    /// [`GuestRam::vmm_dirty`].
    fn dirty_pages(&self) -> Result<Vec<u64>>;
    /// Frequency of the guest's generic counter in Hz (CNTFRQ_EL0).
    fn counter_frequency(&self) -> u64;
    /// The backend's physical count now, in guest ticks (the host counter on
    /// HVF, ticks since VM creation on `emu`). The guest never sees it: every
    /// vCPU's virtual count is this minus [`Vm::counter_offset`], and
    /// CNTPCT_EL0 reads the same as CNTVCT_EL0 (the guest sees CNTVOFF_EL2 =
    /// 0; see [`crate::arch::timer`]).
    fn physical_count(&self) -> u64;
    /// The VM's counter offset in guest ticks (CNTVOFF_EL2 of every vCPU):
    /// the guest's count is [`Vm::physical_count`] minus this, wrapping.
    fn counter_offset(&self) -> u64;
    /// Sets the counter offset of every vCPU. A vCPU takes it up before it
    /// next runs guest code (HVF sets CNTVOFF_EL2 per vCPU, on the vCPU's
    /// thread), so call this only while no vCPU runs: before they start or
    /// with all of them parked.
    fn set_counter_offset(&self, offset: u64);
    /// The guest's count now (CNTVCT_EL0 and CNTPCT_EL0 of every vCPU).
    fn virtual_count(&self) -> u64 {
        self.physical_count().wrapping_sub(self.counter_offset())
    }
    /// The in-kernel GIC, if the VM was created with one ([`GicMode::Hvf`]);
    /// `None` for the userspace GIC.
    fn kernel_gic(&self) -> Option<Arc<dyn KernelGic>>;
    /// Registers how the backend asks for a vCPU to be scheduled. Backends
    /// that run several vCPUs on one thread ([`Hypervisor::ROUND_ROBIN`])
    /// call it when a vCPU that may not be the running one has work only the
    /// backend can see (its virtual timer fired), so that the vCPU's thread
    /// can give it the next turn. Others never call it (the default ignores
    /// it).
    fn set_run_request(&self, _request: RunRequest) {}
}

/// A virtual CPU. Not `Send`: it stays on the thread that created it.
pub trait Vcpu {
    /// This vCPU's index.
    fn id(&self) -> VcpuId;
    /// Runs the guest until an exit the run loop must handle.
    fn run(&mut self, io: &mut dyn VcpuIo) -> Result<VcpuExit>;
    /// Reads a general-purpose or special register.
    fn reg(&mut self, reg: Reg) -> Result<u64>;
    /// Writes a general-purpose or special register.
    fn set_reg(&mut self, reg: Reg, value: u64) -> Result<()>;
    /// Reads SIMD/FP register `V<n>` (`n < 32`).
    fn vreg(&mut self, n: u8) -> Result<u128>;
    /// Writes SIMD/FP register `V<n>` (`n < 32`).
    fn set_vreg(&mut self, n: u8, value: u128) -> Result<()>;
    /// Reads a system register held by the backend (including the virtual
    /// timer's CNTV_CTL_EL0 and CNTV_CVAL_EL0, and OSLSR_EL1).
    fn sysreg(&mut self, reg: SysReg) -> Result<u64>;
    /// Writes a system register held by the backend (an OSLSR_EL1 write
    /// sets the OS lock, OSLK).
    fn set_sysreg(&mut self, reg: SysReg, value: u64) -> Result<()>;
    /// The system registers a snapshot saves for this backend (every register
    /// a Linux guest relies on that the backend holds), excluding the virtual
    /// timer's CNTV_CTL_EL0/CNTV_CVAL_EL0, which are saved separately.
    fn state_sysregs(&self) -> &'static [SysReg];
    /// A handle to make this vCPU's `run` return from another thread.
    fn kicker(&self) -> Arc<dyn Kick>;
    /// This vCPU's GIC CPU-interface registers held by an in-kernel GIC
    /// (`ICC_*_EL1`, in [`gic::ICC_STATE_REGS`] order); empty with the
    /// userspace GIC, whose CPU interface is part of its own state. Call on
    /// the vCPU's thread while it is stopped.
    fn gic_cpu_state(&mut self) -> Result<Vec<(SysReg, u64)>>;
    /// Writes registers saved by [`Vcpu::gic_cpu_state`], in their order,
    /// after the in-kernel GIC's state ([`KernelGic::restore`]). An empty list
    /// is the only valid state without an in-kernel GIC.
    fn set_gic_cpu_state(&mut self, regs: &[(SysReg, u64)]) -> Result<()>;
}
