//! The test's side: a [`Session`] opens the simulated framework with a
//! [`Config`], scripts vCPUs with [`Step`]s and inspects what happened
//! ([`Event`], [`VcpuView`], violations).

use crate::sim::{self, Sim, SIM, WAKE};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

/// Which IPA a stage-2 permission fault reports in the exit's
/// `physical_address`. Apple does not document it; on Arm, HPFAR_EL2 is
/// UNKNOWN for a permission fault that is not on a stage-1 walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultIpa {
    /// The faulting address (what the backend assumes).
    Faulting,
    /// Always this address (e.g. another page of RAM: a stale HPFAR).
    Fixed(u64),
}

/// Whether `hv_vcpus_exit` on a vCPU that is not in `hv_vcpu_run` makes the
/// next run return `CANCELED` at once. `hv_vcpu.h` says it does; the mode
/// shows what the backend does if that ever stops being so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KickBeforeRun {
    /// The request is kept for the next `hv_vcpu_run` (the header's word).
    Latched,
    /// The request is dropped.
    Dropped,
}

/// What `hv_vcpu_get_sme_state` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmeAnswer {
    /// `HV_UNSUPPORTED` (M1 to M3).
    Unsupported,
    /// `HV_SUCCESS` with this state.
    State {
        /// PSTATE.SM.
        streaming: bool,
        /// PSTATE.ZA.
        za: bool,
    },
}

/// The in-kernel GIC's parameters as its `hv_gic_get_*` getters report
/// them (bytes; the SPI range as first INTID and count). Apple documents
/// the getters, not the values: the defaults are the simulator's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GicParams {
    /// `hv_gic_get_distributor_size`.
    pub dist_size: usize,
    /// `hv_gic_get_distributor_base_alignment`.
    pub dist_align: usize,
    /// `hv_gic_get_redistributor_region_size`.
    pub redist_region_size: usize,
    /// `hv_gic_get_redistributor_size`.
    pub redist_size: usize,
    /// `hv_gic_get_redistributor_base_alignment`.
    pub redist_align: usize,
    /// `hv_gic_get_spi_interrupt_range`: first SPI.
    pub spi_base: u32,
    /// `hv_gic_get_spi_interrupt_range`: number of SPIs.
    pub spi_count: u32,
}

impl Default for GicParams {
    /// A GICv3 with 64 KiB distributor and two 64 KiB frames per
    /// redistributor, one per vCPU of [`Config::default`]'s eight.
    fn default() -> Self {
        GicParams {
            dist_size: 0x1_0000,
            dist_align: 0x1_0000,
            redist_region_size: 8 * 0x2_0000,
            redist_size: 0x2_0000,
            redist_align: 0x2_0000,
            spi_base: 32,
            spi_count: 256,
        }
    }
}

/// A session's framework and host.
#[derive(Clone, Debug)]
pub struct Config {
    /// `hv_vm_get_max_vcpu_count`.
    pub max_vcpus: u32,
    /// `hw.tbfrequency` in Hz (also `mach_timebase_info`).
    pub timebase_hz: u64,
    /// `mach_absolute_time()` at the start; moves only by
    /// [`Step::AdvanceClock`] and [`Session::set_host_count`].
    pub host_count: u64,
    /// What a stage-2 permission fault reports as its IPA.
    pub permission_fault_ipa: FaultIpa,
    /// Whether a kick before `hv_vcpu_run` is latched.
    pub kick_before_run: KickBeforeRun,
    /// The system registers (`hv_sys_reg_t` packing) whose guest accesses
    /// trap to the VMM (EC 0x18) besides the GIC CPU interface, which traps
    /// when the VM has no in-kernel GIC. Accesses to others are performed
    /// by the simulated hardware.
    pub traps: BTreeSet<u16>,
    /// The in-kernel GIC's getters.
    pub gic: GicParams,
    /// `hv_vcpu_get_sme_state`.
    pub sme: SmeAnswer,
}

impl Default for Config {
    /// Eight vCPUs, 24 MHz (M1 to M3), the counter at 10^9 ticks, the
    /// faulting IPA, latched kicks, the counter, EL1 physical timer and OS
    /// lock registers trapped (what the backend's exit handling expects of
    /// macOS 13 to 15), no SME.
    fn default() -> Self {
        use crate::arm::*;
        Config {
            max_vcpus: 8,
            timebase_hz: 24_000_000,
            host_count: 1_000_000_000,
            permission_fault_ipa: FaultIpa::Faulting,
            kick_before_run: KickBeforeRun::Latched,
            traps: [
                CNTPCT_EL0,
                CNTP_CTL_EL0,
                CNTP_CVAL_EL0,
                CNTP_TVAL_EL0,
                OSLAR_EL1,
                OSLSR_EL1,
                OSDLR_EL1,
            ]
            .into_iter()
            .collect(),
            gic: GicParams::default(),
            sme: SmeAnswer::Unsupported,
        }
    }
}

/// What the guest does next on a vCPU, inside `hv_vcpu_run`.
pub enum Step {
    /// The instruction at PC traps with this syndrome (ESR_EL2), FAR and
    /// IPA: an `EXCEPTION` exit. For `HVC` (EC 0x16) PC first moves past the
    /// instruction (its preferred return address); otherwise PC stays, for
    /// the VMM to complete the instruction.
    Exception {
        /// ESR_EL2.
        esr: u64,
        /// FAR_EL2.
        far: u64,
        /// The faulting IPA.
        ipa: u64,
    },
    /// `LDR` of `size` bytes from `ipa` (its VA `va`) into X`rt`: performed
    /// from RAM (PC + 4), or a translation-fault exit with a valid syndrome
    /// where nothing is mapped (MMIO).
    Load {
        /// The virtual address (FAR).
        va: u64,
        /// The guest-physical address.
        ipa: u64,
        /// 1, 2, 4 or 8 bytes, naturally aligned.
        size: u8,
        /// The transfer register.
        rt: u8,
    },
    /// `STR` of the low `size` bytes of `value` (first placed in X`rt`) to
    /// `ipa`: performed on writable RAM (PC + 4); a permission-fault exit on
    /// write-protected RAM, after which the store is retried at the next
    /// run if PC has not moved; a translation-fault exit (MMIO) where
    /// nothing is mapped.
    Store {
        /// The virtual address (FAR).
        va: u64,
        /// The guest-physical address.
        ipa: u64,
        /// 1, 2, 4 or 8 bytes, naturally aligned.
        size: u8,
        /// The transfer register.
        rt: u8,
        /// The value stored.
        value: u64,
    },
    /// `MRS X<rt>, reg`: an EC 0x18 exit if `reg` traps, else read from the
    /// simulated registers (PC + 4).
    Mrs {
        /// The register (`hv_sys_reg_t` packing).
        reg: u16,
        /// The destination register.
        rt: u8,
    },
    /// `MSR reg, X<rt>` with X`rt` = `value`, as [`Step::Mrs`].
    Msr {
        /// The register (`hv_sys_reg_t` packing).
        reg: u16,
        /// The source register.
        rt: u8,
        /// The value written.
        value: u64,
    },
    /// A `CANCELED` exit that no `hv_vcpus_exit` asked for.
    Canceled,
    /// An `HV_EXIT_REASON_UNKNOWN` exit.
    Unknown,
    /// The guest runs until `hv_vcpus_exit` asks this vCPU to exit; then a
    /// `CANCELED` exit.
    BlockUntilExit,
    /// The guest sets a register without trapping (`hv_reg_t`).
    SetReg {
        /// `hv_reg_t`.
        reg: u32,
        /// The value.
        value: u64,
    },
    /// The guest writes a system register without trapping (e.g.
    /// CNTV_CTL_EL0 as it handles its timer).
    SetSysReg {
        /// The register (`hv_sys_reg_t` packing).
        reg: u16,
        /// The value.
        value: u64,
    },
    /// Time passes: the host count moves by this many ticks. If the
    /// vtimer's output becomes asserted while unmasked (no in-kernel GIC),
    /// the run exits with `VTIMER_ACTIVATED` and the framework masks the
    /// timer, as before any step.
    AdvanceClock(u64),
    /// Called on the vCPU's thread at the start of the `hv_vcpu_run` that
    /// reaches it, before the vCPU counts as running, with the simulator
    /// unlocked: whatever happens there lands "just before" the guest is
    /// entered (e.g. a kick racing the run loop's check). Only at the front
    /// of the script at a run's entry.
    BeforeEntry(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Exception { esr, far, ipa } => write!(
                f,
                "Exception {{ esr: {esr:#x}, far: {far:#x}, ipa: {ipa:#x} }}"
            ),
            Step::Load { va, ipa, size, rt } => {
                write!(
                    f,
                    "Load {{ va: {va:#x}, ipa: {ipa:#x}, size: {size}, rt: {rt} }}"
                )
            }
            Step::Store {
                va,
                ipa,
                size,
                rt,
                value,
            } => write!(
                f,
                "Store {{ va: {va:#x}, ipa: {ipa:#x}, size: {size}, rt: {rt}, value: {value:#x} }}"
            ),
            Step::Mrs { reg, rt } => write!(f, "Mrs {{ reg: {reg:#x}, rt: {rt} }}"),
            Step::Msr { reg, rt, value } => {
                write!(f, "Msr {{ reg: {reg:#x}, rt: {rt}, value: {value:#x} }}")
            }
            Step::Canceled => f.write_str("Canceled"),
            Step::Unknown => f.write_str("Unknown"),
            Step::BlockUntilExit => f.write_str("BlockUntilExit"),
            Step::SetReg { reg, value } => write!(f, "SetReg {{ reg: {reg}, value: {value:#x} }}"),
            Step::SetSysReg { reg, value } => {
                write!(f, "SetSysReg {{ reg: {reg:#x}, value: {value:#x} }}")
            }
            Step::AdvanceClock(t) => write!(f, "AdvanceClock({t})"),
            Step::BeforeEntry(_) => f.write_str("BeforeEntry(..)"),
        }
    }
}

/// A call the simulator records (register reads and writes are not
/// recorded; see [`Session::vcpu`] for their effect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `hv_vm_create`.
    VmCreate,
    /// `hv_vm_destroy`.
    VmDestroy,
    /// `hv_vm_map`.
    Map {
        /// IPA.
        ipa: u64,
        /// Bytes.
        size: u64,
        /// `HV_MEMORY_*`.
        flags: u64,
    },
    /// `hv_vm_unmap`.
    Unmap {
        /// IPA.
        ipa: u64,
        /// Bytes.
        size: u64,
    },
    /// `hv_vm_protect`.
    Protect {
        /// IPA.
        ipa: u64,
        /// Bytes.
        size: u64,
        /// `HV_MEMORY_*`.
        flags: u64,
    },
    /// `hv_vcpu_create`.
    VcpuCreate {
        /// The new vCPU.
        vcpu: u64,
    },
    /// `hv_vcpu_destroy`.
    VcpuDestroy {
        /// The vCPU.
        vcpu: u64,
    },
    /// `hv_vcpu_run` entered the guest, with these pending interrupts and
    /// vtimer mask.
    Run {
        /// The vCPU.
        vcpu: u64,
        /// `HV_INTERRUPT_TYPE_IRQ` pending.
        irq: bool,
        /// `HV_INTERRUPT_TYPE_FIQ` pending.
        fiq: bool,
        /// The vtimer mask.
        vtimer_masked: bool,
    },
    /// `hv_vcpu_run` returned this exit.
    Exit {
        /// The vCPU.
        vcpu: u64,
        /// The exit record.
        exit: crate::apple::HvVcpuExit,
    },
    /// `hv_vcpu_set_pending_interrupt`.
    SetPendingInterrupt {
        /// The vCPU.
        vcpu: u64,
        /// `hv_interrupt_type_t`.
        kind: u32,
        /// Pending.
        pending: bool,
    },
    /// `hv_vcpu_set_vtimer_mask`.
    SetVtimerMask {
        /// The vCPU.
        vcpu: u64,
        /// Masked.
        masked: bool,
    },
    /// `hv_vcpu_set_vtimer_offset`.
    SetVtimerOffset {
        /// The vCPU.
        vcpu: u64,
        /// CNTVOFF_EL2.
        offset: u64,
    },
    /// `hv_vcpus_exit` for this vCPU.
    VcpusExit {
        /// The vCPU.
        vcpu: u64,
        /// Whether it was in `hv_vcpu_run`.
        running: bool,
    },
    /// `hv_gic_create`.
    GicCreate {
        /// Distributor base.
        distributor: u64,
        /// Redistributor region base.
        redistributor: u64,
    },
    /// `hv_gic_set_spi`.
    GicSetSpi {
        /// INTID.
        intid: u32,
        /// Level.
        level: bool,
    },
    /// `hv_gic_state_create`.
    GicStateSave,
    /// `hv_gic_set_state`.
    GicSetState {
        /// Blob size.
        size: usize,
    },
    /// `hv_gic_set_icc_reg`.
    GicSetIccReg {
        /// The vCPU.
        vcpu: u64,
        /// `hv_gic_icc_reg_t`.
        reg: u16,
        /// The value.
        value: u64,
    },
    /// `os_release` of an object from this creator.
    Release {
        /// `hv_gic_config_create` or `hv_gic_state_create`.
        creator: &'static str,
    },
}

/// A vCPU's simulated state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuView {
    /// X0..X30.
    pub x: [u64; 31],
    /// PC.
    pub pc: u64,
    /// CPSR (PSTATE).
    pub cpsr: u64,
    /// FPCR.
    pub fpcr: u64,
    /// FPSR.
    pub fpsr: u64,
    /// V0..V31, lane 0 in the low byte.
    pub v: [u128; 32],
    /// System registers written so far (`hv_sys_reg_t` packing).
    pub sys: BTreeMap<u16, u64>,
    /// In-kernel GIC CPU-interface registers written so far.
    pub icc: BTreeMap<u16, u64>,
    /// `HV_INTERRUPT_TYPE_IRQ` pending for the next run.
    pub pending_irq: bool,
    /// `HV_INTERRUPT_TYPE_FIQ` pending for the next run.
    pub pending_fiq: bool,
    /// The framework's vtimer mask.
    pub vtimer_masked: bool,
    /// CNTVOFF_EL2.
    pub vtimer_offset: u64,
    /// The vtimer's output (ENABLE, not IMASK, condition met).
    pub vtimer_asserted: bool,
    /// `hv_vcpu_set_trap_debug_exceptions`.
    pub trap_debug_exceptions: bool,
    /// `hv_vcpu_set_trap_debug_reg_accesses`.
    pub trap_debug_reg_accesses: bool,
    /// Steps not yet carried out.
    pub steps_left: usize,
    /// In a [`Step::BlockUntilExit`].
    pub blocked: bool,
}

/// Serialises sessions: the framework is one per process.
static SESSION: Mutex<()> = Mutex::new(());

/// The simulated framework, open for one test. Sessions are serialised
/// process-wide (a second one waits), since the framework allows one VM per
/// process. When it ends, every object must have been released and every
/// violation taken by the test, or it panics with the list.
pub struct Session {
    _one: MutexGuard<'static, ()>,
}

fn with<R>(f: impl FnOnce(&mut Sim) -> R) -> R {
    let mut guard = sim::lock("hvf_sim::Session");
    f(guard.as_mut().expect("session"))
}

impl Session {
    /// Opens the framework with `config` (after any other session ends).
    pub fn start(config: Config) -> Session {
        let one = SESSION.lock().unwrap_or_else(|e| e.into_inner());
        *SIM.lock().unwrap_or_else(|e| e.into_inner()) = Some(Sim::new(config));
        Session { _one: one }
    }

    /// Appends `steps` to vCPU `vcpu`'s script (ids count from 0 in
    /// creation order; a vCPU not created yet gets them when it is).
    pub fn script(&self, vcpu: u64, steps: impl IntoIterator<Item = Step>) {
        let steps = steps.into_iter().collect();
        with(|s| s.push_steps(vcpu, steps));
    }

    /// Every recorded call so far.
    pub fn events(&self) -> Vec<Event> {
        with(|s| s.events.clone())
    }

    /// The recorded calls so far, forgetting them.
    pub fn take_events(&self) -> Vec<Event> {
        with(|s| std::mem::take(&mut s.events))
    }

    /// The rules broken so far, forgetting them (so the session's end does
    /// not fail on them).
    pub fn take_violations(&self) -> Vec<String> {
        with(|s| std::mem::take(&mut s.violations))
    }

    /// vCPU `vcpu`'s state, if it exists.
    pub fn vcpu(&self, vcpu: u64) -> Option<VcpuView> {
        with(|s| s.view(vcpu))
    }

    /// `mach_absolute_time()` now.
    pub fn host_count(&self) -> u64 {
        with(|s| s.clock)
    }

    /// Sets `mach_absolute_time()`.
    pub fn set_host_count(&self, count: u64) {
        with(|s| s.clock = count);
    }

    /// The level the in-kernel GIC holds for SPI `intid`; `None` without a
    /// GIC.
    pub fn spi_level(&self, intid: u32) -> Option<bool> {
        with(|s| s.spi_level(intid))
    }

    /// Stage-2 permissions (`HV_MEMORY_*`) of the page holding `ipa`;
    /// `None` where nothing is mapped.
    pub fn page_flags(&self, ipa: u64) -> Option<u64> {
        with(|s| s.page_flags(ipa))
    }

    /// Whether the process has a VM.
    pub fn vm_exists(&self) -> bool {
        with(|s| s.vm.is_some())
    }

    /// Waits (without a timeout) until vCPU `vcpu` is inside a
    /// [`Step::BlockUntilExit`] of a run.
    pub fn wait_blocked(&self, vcpu: u64) {
        let mut guard = sim::lock("hvf_sim::Session::wait_blocked");
        while !guard.as_ref().is_some_and(|s| s.is_blocked(vcpu)) {
            guard = WAKE.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let sim = SIM.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut sim) = sim else { return };
        let leaks: Vec<String> = sim
            .objects
            .values()
            .filter(|l| !l.released)
            .map(|l| match &l.object {
                sim::Object::GicConfig { .. } => "hv_gic_config_create",
                sim::Object::GicState { .. } => "hv_gic_state_create",
            })
            .map(|c| format!("an object from {c} was never released (os_release)"))
            .collect();
        sim.violations.extend(leaks);
        if !sim.violations.is_empty() && !std::thread::panicking() {
            panic!(
                "hvf-sim: the session broke Hypervisor.framework's rules:\n  {}",
                sim.violations.join("\n  ")
            );
        }
    }
}
