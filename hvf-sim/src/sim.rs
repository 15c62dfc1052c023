//! The simulated framework's state and rules: one process-wide [`Sim`]
//! behind a mutex, used by the exported functions (`exports`) and by the
//! test API ([`crate::Session`]).

use crate::apple::*;
use crate::arm;
use crate::{Config, Event, FaultIpa, KickBeforeRun, SmeAnswer, Step, VcpuView};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

/// The simulator, while a [`crate::Session`] is open.
pub(crate) static SIM: Mutex<Option<Sim>> = Mutex::new(None);
/// Signalled when a vCPU is asked to exit or blocks in its script.
pub(crate) static WAKE: Condvar = Condvar::new();

/// How many times in a row the same store may fault at the same PC before
/// the simulator stops the vCPU (a VMM that never makes progress would
/// otherwise spin forever in a test).
pub const REFAULT_LIMIT: u32 = 1000;

/// Locks the simulator; a call outside a session is a test bug and aborts.
pub(crate) fn lock(call: &str) -> MutexGuard<'static, Option<Sim>> {
    let guard = SIM.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        fatal(&format!(
            "{call} called with no hvf_sim::Session open (the simulated framework exists only \
             inside one)"
        ));
    }
    guard
}

/// Prints why and aborts the process: what the real framework refuses
/// outright (a vCPU call from a thread that does not own the vCPU, a
/// release of an object that is not live).
pub(crate) fn fatal(msg: &str) -> ! {
    eprintln!("hvf-sim: fatal: {msg}");
    std::process::abort()
}

/// A retained OS object (`hv_gic_config_t`, `hv_gic_state_t`).
pub(crate) enum Object {
    GicConfig {
        distributor: Option<u64>,
        redistributor: Option<u64>,
    },
    GicState {
        data: Vec<u8>,
    },
}

impl Object {
    fn creator(&self) -> &'static str {
        match self {
            Object::GicConfig { .. } => "hv_gic_config_create",
            Object::GicState { .. } => "hv_gic_state_create",
        }
    }
}

pub(crate) struct Live {
    /// Owns the address handed out, so it is never reused in a session.
    _addr: Box<u8>,
    pub(crate) object: Object,
    pub(crate) released: bool,
}

struct Mapping {
    ipa: u64,
    size: u64,
    host: usize,
    /// Stage-2 permissions per 16 KiB page.
    flags: Vec<u64>,
}

struct Gic {
    spi: BTreeMap<u32, bool>,
}

pub(crate) struct Vm {
    maps: Vec<Mapping>,
    gic: Option<Gic>,
    /// vCPUs created in this VM so far (live or destroyed).
    vcpus_created: u32,
    /// A vCPU of this VM has entered `hv_vcpu_run`.
    ran: bool,
}

/// The framework's exit record of a vCPU, written by `hv_vcpu_run` on the
/// vCPU's thread and read by the VMM there.
struct ExitPtr(*mut HvVcpuExit);
// SAFETY: the pointer is only dereferenced by the vCPU's owning thread
// (inside hv_vcpu_run, under the simulator's lock) and freed when the vCPU
// is destroyed or the session ends.
unsafe impl Send for ExitPtr {}

impl Drop for ExitPtr {
    fn drop(&mut self) {
        // SAFETY: allocated by Box::into_raw in hv_vcpu_create, freed once.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

pub(crate) struct Vcpu {
    owner: ThreadId,
    exit: ExitPtr,
    x: [u64; 31],
    pc: u64,
    cpsr: u64,
    fpcr: u64,
    fpsr: u64,
    v: [u128; 32],
    sys: BTreeMap<u16, u64>,
    icc: BTreeMap<u16, u64>,
    icc_written: bool,
    pending_irq: bool,
    pending_fiq: bool,
    vtimer_masked: bool,
    vtimer_offset: u64,
    trap_debug_exceptions: bool,
    trap_debug_reg_accesses: bool,
    script: VecDeque<Step>,
    running: bool,
    blocked: bool,
    exit_requested: bool,
    /// A store that faulted on a write-protected page: its PC and how many
    /// times in a row it faulted.
    retry: Option<(u64, u32)>,
}

/// The whole simulated framework.
pub(crate) struct Sim {
    pub(crate) config: Config,
    pub(crate) clock: u64,
    pub(crate) vm: Option<Vm>,
    pub(crate) vcpus: BTreeMap<u64, Vcpu>,
    next_vcpu: u64,
    /// Steps queued for vCPUs not created yet.
    queued: BTreeMap<u64, VecDeque<Step>>,
    pub(crate) objects: BTreeMap<usize, Live>,
    pub(crate) events: Vec<Event>,
    pub(crate) violations: Vec<String>,
}

/// What `hv_vcpu_run` does next, decided under the lock.
enum RunStep {
    /// Report this exit and return.
    Exit(HvVcpuExit),
    /// Return this error without an exit.
    Fail(HvReturn),
    /// Wait for `hv_vcpus_exit`.
    Block,
}

fn exit(reason: u32, esr: u64, far: u64, ipa: u64) -> HvVcpuExit {
    HvVcpuExit {
        reason,
        syndrome: esr,
        virtual_address: far,
        physical_address: ipa,
    }
}

impl Sim {
    pub(crate) fn new(config: Config) -> Sim {
        Sim {
            clock: config.host_count,
            config,
            vm: None,
            vcpus: BTreeMap::new(),
            next_vcpu: 0,
            queued: BTreeMap::new(),
            objects: BTreeMap::new(),
            events: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// Records a broken rule; the session fails unless the test takes it.
    pub(crate) fn violation(&mut self, msg: String) {
        self.violations.push(msg);
    }

    /// A rule broken with the error code the framework answers.
    pub(crate) fn refuse(&mut self, ret: HvReturn, msg: String) -> HvReturn {
        self.violation(msg);
        ret
    }

    // ---- VM ----

    pub(crate) fn vm_create(&mut self, config: usize) -> HvReturn {
        if config != 0 {
            return self.refuse(
                HV_BAD_ARGUMENT,
                "hv_vm_create: a configuration object the simulator never made (the backend \
                 passes NULL)"
                    .into(),
            );
        }
        if self.vm.is_some() {
            // Documented: one VM per process. An answer, not a VMM bug.
            return HV_BUSY;
        }
        self.vm = Some(Vm {
            maps: Vec::new(),
            gic: None,
            vcpus_created: 0,
            ran: false,
        });
        self.events.push(Event::VmCreate);
        HV_SUCCESS
    }

    pub(crate) fn vm_destroy(&mut self) -> HvReturn {
        if self.vm.is_none() {
            return self.refuse(HV_NO_DEVICE, "hv_vm_destroy: no VM".into());
        }
        if !self.vcpus.is_empty() {
            let ids: Vec<u64> = self.vcpus.keys().copied().collect();
            return self.refuse(
                HV_BUSY,
                format!("hv_vm_destroy while vCPUs {ids:?} still exist (destroy them first)"),
            );
        }
        self.vm = None;
        self.events.push(Event::VmDestroy);
        HV_SUCCESS
    }

    fn vm_mut(&mut self, call: &str) -> Result<&mut Vm, HvReturn> {
        if self.vm.is_none() {
            return Err(self.refuse(HV_NO_DEVICE, format!("{call}: no VM")));
        }
        Ok(self.vm.as_mut().expect("checked"))
    }

    fn check_stage2_range(&mut self, call: &str, ipa: u64, size: u64) -> Result<(), HvReturn> {
        if ipa % STAGE2_PAGE != 0 || size % STAGE2_PAGE != 0 || size == 0 {
            return Err(self.refuse(
                HV_BAD_ARGUMENT,
                format!(
                    "{call}: IPA {ipa:#x} size {size:#x} is not a non-empty range of whole \
                     16 KiB pages"
                ),
            ));
        }
        if ipa.checked_add(size).is_none() {
            return Err(self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: IPA {ipa:#x} size {size:#x} wraps"),
            ));
        }
        Ok(())
    }

    pub(crate) fn vm_map(&mut self, host: usize, ipa: u64, size: u64, flags: u64) -> HvReturn {
        let call = "hv_vm_map";
        if let Err(e) = self.vm_mut(call) {
            return e;
        }
        if let Err(e) = self.check_stage2_range(call, ipa, size) {
            return e;
        }
        let host_page = host_page_size();
        if host == 0 || host % host_page != 0 {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: host address {host:#x} is not aligned to the host page"),
            );
        }
        if flags & !(HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC) != 0 {
            return self.refuse(HV_BAD_ARGUMENT, format!("{call}: flags {flags:#x}"));
        }
        let vm = self.vm.as_mut().expect("checked");
        if let Some(m) = vm
            .maps
            .iter()
            .find(|m| ipa < m.ipa + m.size && m.ipa < ipa + size)
        {
            let (mi, ms) = (m.ipa, m.size);
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: {ipa:#x}+{size:#x} overlaps the mapping {mi:#x}+{ms:#x}"),
            );
        }
        let pages = (size / STAGE2_PAGE) as usize;
        vm.maps.push(Mapping {
            ipa,
            size,
            host,
            flags: vec![flags; pages],
        });
        self.events.push(Event::Map { ipa, size, flags });
        HV_SUCCESS
    }

    pub(crate) fn vm_unmap(&mut self, ipa: u64, size: u64) -> HvReturn {
        let call = "hv_vm_unmap";
        if let Err(e) = self.vm_mut(call) {
            return e;
        }
        if let Err(e) = self.check_stage2_range(call, ipa, size) {
            return e;
        }
        let vm = self.vm.as_mut().expect("checked");
        match vm.maps.iter().position(|m| m.ipa == ipa && m.size == size) {
            Some(i) => {
                vm.maps.remove(i);
                self.events.push(Event::Unmap { ipa, size });
                HV_SUCCESS
            }
            None => self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: {ipa:#x}+{size:#x} is not a mapping made by hv_vm_map"),
            ),
        }
    }

    pub(crate) fn vm_protect(&mut self, ipa: u64, size: u64, flags: u64) -> HvReturn {
        let call = "hv_vm_protect";
        if let Err(e) = self.vm_mut(call) {
            return e;
        }
        if let Err(e) = self.check_stage2_range(call, ipa, size) {
            return e;
        }
        if flags & !(HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC) != 0 {
            return self.refuse(HV_BAD_ARGUMENT, format!("{call}: flags {flags:#x}"));
        }
        let vm = self.vm.as_mut().expect("checked");
        let Some(m) = vm
            .maps
            .iter_mut()
            .find(|m| ipa >= m.ipa && ipa + size <= m.ipa + m.size)
        else {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: {ipa:#x}+{size:#x} is not inside one mapping"),
            );
        };
        let first = ((ipa - m.ipa) / STAGE2_PAGE) as usize;
        let count = (size / STAGE2_PAGE) as usize;
        m.flags[first..first + count].fill(flags);
        self.events.push(Event::Protect { ipa, size, flags });
        HV_SUCCESS
    }

    /// The mapping page holding `ipa`: (host address of `ipa`, flags).
    fn translate(&self, ipa: u64) -> Option<(usize, u64)> {
        let vm = self.vm.as_ref()?;
        let m = vm
            .maps
            .iter()
            .find(|m| ipa >= m.ipa && ipa - m.ipa < m.size)?;
        let off = ipa - m.ipa;
        Some((m.host + off as usize, m.flags[(off / STAGE2_PAGE) as usize]))
    }

    pub(crate) fn page_flags(&self, ipa: u64) -> Option<u64> {
        self.translate(ipa).map(|(_, f)| f)
    }

    // ---- vCPUs ----

    pub(crate) fn vcpu_create(&mut self) -> Result<(u64, *mut HvVcpuExit), HvReturn> {
        let call = "hv_vcpu_create";
        let max = self.config.max_vcpus;
        let me = std::thread::current().id();
        let vm = self.vm_mut(call)?;
        vm.vcpus_created += 1;
        if let Some((id, _)) = self.vcpus.iter().find(|(_, v)| v.owner == me) {
            let id = *id;
            return Err(self.refuse(
                HV_BUSY,
                format!("{call}: this thread already has vCPU {id} (one vCPU per thread)"),
            ));
        }
        if self.vcpus.len() as u32 >= max {
            return Err(self.refuse(
                HV_NO_RESOURCES,
                format!("{call}: {max} vCPUs exist, the maximum hv_vm_get_max_vcpu_count gave"),
            ));
        }
        let id = self.next_vcpu;
        self.next_vcpu += 1;
        let exit_ptr = Box::into_raw(Box::<HvVcpuExit>::default());
        // Steps a test queued before the vCPU existed.
        let script = self.queued.remove(&id).unwrap_or_default();
        self.vcpus.insert(
            id,
            Vcpu {
                owner: me,
                exit: ExitPtr(exit_ptr),
                x: [0; 31],
                pc: 0,
                cpsr: 0,
                fpcr: 0,
                fpsr: 0,
                v: [0; 32],
                sys: BTreeMap::new(),
                icc: BTreeMap::new(),
                icc_written: false,
                pending_irq: false,
                pending_fiq: false,
                vtimer_masked: false,
                vtimer_offset: 0,
                trap_debug_exceptions: true,
                trap_debug_reg_accesses: true,
                script,
                running: false,
                blocked: false,
                exit_requested: false,
                retry: None,
            },
        );
        self.events.push(Event::VcpuCreate { vcpu: id });
        Ok((id, exit_ptr))
    }

    /// The vCPU `id`, which must belong to the calling thread: a call from
    /// any other thread aborts (`hv_vcpu.h`: "Must be called by the owning
    /// thread").
    pub(crate) fn owned(&mut self, call: &str, id: u64) -> Result<&mut Vcpu, HvReturn> {
        let me = std::thread::current().id();
        match self.vcpus.get(&id) {
            None => Err(self.refuse(HV_BAD_ARGUMENT, format!("{call}: vCPU {id} does not exist"))),
            Some(v) if v.owner != me => fatal(&format!(
                "{call}(vCPU {id}) called on thread {me:?}, but vCPU {id} belongs to thread \
                 {:?}: Hypervisor.framework's per-vCPU calls must be made on the owning thread",
                v.owner
            )),
            Some(_) => Ok(self.vcpus.get_mut(&id).expect("checked")),
        }
    }

    pub(crate) fn vcpu_destroy(&mut self, id: u64) -> HvReturn {
        if let Err(e) = self.owned("hv_vcpu_destroy", id) {
            return e;
        }
        self.vcpus.remove(&id);
        self.events.push(Event::VcpuDestroy { vcpu: id });
        HV_SUCCESS
    }

    pub(crate) fn get_reg(&mut self, id: u64, reg: u32) -> Result<u64, HvReturn> {
        let v = self.owned("hv_vcpu_get_reg", id)?;
        let value = match reg {
            0..=30 => v.x[reg as usize],
            HV_REG_PC => v.pc,
            HV_REG_FPCR => v.fpcr,
            HV_REG_FPSR => v.fpsr,
            HV_REG_CPSR => v.cpsr,
            _ => {
                return Err(self.refuse(
                    HV_BAD_ARGUMENT,
                    format!("hv_vcpu_get_reg: {reg} is not an hv_reg_t"),
                ))
            }
        };
        Ok(value)
    }

    pub(crate) fn set_reg(&mut self, id: u64, reg: u32, value: u64) -> HvReturn {
        let v = match self.owned("hv_vcpu_set_reg", id) {
            Ok(v) => v,
            Err(e) => return e,
        };
        if !v.write_reg(reg, value) {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("hv_vcpu_set_reg: {reg} is not an hv_reg_t"),
            );
        }
        HV_SUCCESS
    }

    pub(crate) fn get_simd(&mut self, id: u64, reg: u32) -> Result<u128, HvReturn> {
        let v = self.owned("hv_vcpu_get_simd_fp_reg", id)?;
        match v.v.get(reg as usize) {
            Some(&q) => Ok(q),
            None => Err(self.refuse(
                HV_BAD_ARGUMENT,
                format!("hv_vcpu_get_simd_fp_reg: {reg} is not an hv_simd_fp_reg_t"),
            )),
        }
    }

    pub(crate) fn set_simd(&mut self, id: u64, reg: u32, value: u128) -> HvReturn {
        let v = match self.owned("hv_vcpu_set_simd_fp_reg", id) {
            Ok(v) => v,
            Err(e) => return e,
        };
        match v.v.get_mut(reg as usize) {
            Some(q) => {
                *q = value;
                HV_SUCCESS
            }
            None => self.refuse(
                HV_BAD_ARGUMENT,
                format!("hv_vcpu_set_simd_fp_reg: {reg} is not an hv_simd_fp_reg_t"),
            ),
        }
    }

    pub(crate) fn get_sys_reg(&mut self, id: u64, reg: u16) -> Result<u64, HvReturn> {
        if !is_hv_sys_reg(reg) {
            self.owned("hv_vcpu_get_sys_reg", id)?;
            return Err(self.refuse(
                HV_BAD_ARGUMENT,
                format!("hv_vcpu_get_sys_reg: {reg:#x} is not an hv_sys_reg_t"),
            ));
        }
        let clock = self.clock;
        let v = self.owned("hv_vcpu_get_sys_reg", id)?;
        Ok(v.read_sys(reg, clock))
    }

    pub(crate) fn set_sys_reg(&mut self, id: u64, reg: u16, value: u64) -> HvReturn {
        let v = match self.owned("hv_vcpu_set_sys_reg", id) {
            Ok(v) => v,
            Err(e) => return e,
        };
        if !is_hv_sys_reg(reg) {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("hv_vcpu_set_sys_reg: {reg:#x} is not an hv_sys_reg_t"),
            );
        }
        v.write_sys(reg, value);
        HV_SUCCESS
    }

    pub(crate) fn set_pending_interrupt(&mut self, id: u64, kind: u32, pending: bool) -> HvReturn {
        let v = match self.owned("hv_vcpu_set_pending_interrupt", id) {
            Ok(v) => v,
            Err(e) => return e,
        };
        match kind {
            HV_INTERRUPT_TYPE_IRQ => v.pending_irq = pending,
            HV_INTERRUPT_TYPE_FIQ => v.pending_fiq = pending,
            _ => {
                return self.refuse(
                    HV_BAD_ARGUMENT,
                    format!("hv_vcpu_set_pending_interrupt: {kind} is not an hv_interrupt_type_t"),
                )
            }
        }
        self.events.push(Event::SetPendingInterrupt {
            vcpu: id,
            kind,
            pending,
        });
        HV_SUCCESS
    }

    pub(crate) fn set_trap_debug(&mut self, id: u64, exceptions: bool, trap: bool) -> HvReturn {
        let call = if exceptions {
            "hv_vcpu_set_trap_debug_exceptions"
        } else {
            "hv_vcpu_set_trap_debug_reg_accesses"
        };
        match self.owned(call, id) {
            Ok(v) if exceptions => v.trap_debug_exceptions = trap,
            Ok(v) => v.trap_debug_reg_accesses = trap,
            Err(e) => return e,
        }
        HV_SUCCESS
    }

    pub(crate) fn set_vtimer_mask(&mut self, id: u64, masked: bool) -> HvReturn {
        match self.owned("hv_vcpu_set_vtimer_mask", id) {
            Ok(v) => v.vtimer_masked = masked,
            Err(e) => return e,
        }
        self.events.push(Event::SetVtimerMask { vcpu: id, masked });
        HV_SUCCESS
    }

    pub(crate) fn set_vtimer_offset(&mut self, id: u64, offset: u64) -> HvReturn {
        match self.owned("hv_vcpu_set_vtimer_offset", id) {
            Ok(v) => v.vtimer_offset = offset,
            Err(e) => return e,
        }
        self.events
            .push(Event::SetVtimerOffset { vcpu: id, offset });
        HV_SUCCESS
    }

    pub(crate) fn sme_state(&mut self, id: u64) -> Result<HvVcpuSmeState, HvReturn> {
        self.owned("hv_vcpu_get_sme_state", id)?;
        match self.config.sme {
            SmeAnswer::Unsupported => Err(HV_UNSUPPORTED),
            SmeAnswer::State { streaming, za } => Ok(HvVcpuSmeState {
                streaming_sve_mode_enabled: streaming,
                za_storage_enabled: za,
            }),
        }
    }

    /// `hv_vcpus_exit` for one vCPU, from any thread.
    pub(crate) fn request_exit(&mut self, id: u64) -> HvReturn {
        let latch = self.config.kick_before_run == KickBeforeRun::Latched;
        let Some(v) = self.vcpus.get_mut(&id) else {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!(
                    "hv_vcpus_exit: vCPU {id} does not exist (destroyed, or never created): a \
                     kick must not outlive its vCPU"
                ),
            );
        };
        let running = v.running;
        if running || latch {
            v.exit_requested = true;
        }
        self.events.push(Event::VcpusExit { vcpu: id, running });
        WAKE.notify_all();
        HV_SUCCESS
    }

    // ---- hv_vcpu_run ----

    /// Entry of `hv_vcpu_run` (after `Step::BeforeEntry` hooks): checks the
    /// rules a run must satisfy and records it.
    pub(crate) fn run_enter(&mut self, id: u64) -> Result<(), HvReturn> {
        let clock = self.clock;
        let has_gic = self.vm_mut("hv_vcpu_run")?.gic.is_some();
        self.vm.as_mut().expect("checked").ran = true;
        let v = self.owned("hv_vcpu_run", id)?;
        v.running = true;
        let (irq, fiq, masked) = (v.pending_irq, v.pending_fiq, v.vtimer_masked);
        let asserted = v.vtimer_asserted(clock);
        let skipped = match v.retry {
            Some((pc, _)) if pc != v.pc => {
                v.retry = None;
                v.script.pop_front().map(|s| (pc, v.pc, s))
            }
            _ => None,
        };
        self.events.push(Event::Run {
            vcpu: id,
            irq,
            fiq,
            vtimer_masked: masked,
        });
        if let Some((was, now, step)) = skipped {
            self.violation(format!(
                "vCPU {id}: {step:?} faulted on write-protected RAM at PC {was:#x} and was not \
                 retried: PC moved to {now:#x} (the guest's store was lost)"
            ));
        }
        if !has_gic && masked && !asserted {
            self.violation(format!(
                "vCPU {id} entered hv_vcpu_run with the vtimer masked although its output is \
                 not asserted: its next expiry would never be reported (unmask once the guest \
                 has handled the timer)"
            ));
        }
        if !has_gic && !masked && asserted {
            self.violation(format!(
                "vCPU {id} entered hv_vcpu_run with the vtimer unmasked while its output is \
                 still asserted: every run would exit with VTIMER_ACTIVATED at once (keep it \
                 masked until the guest has handled the timer)"
            ));
        }
        Ok(())
    }

    /// Takes a `Step::BeforeEntry` hook from the front of the script.
    pub(crate) fn take_entry_hook(&mut self, id: u64) -> Option<Box<dyn FnOnce() + Send>> {
        let v = self.vcpus.get_mut(&id)?;
        match v.script.front() {
            Some(Step::BeforeEntry(_)) => match v.script.pop_front() {
                Some(Step::BeforeEntry(f)) => Some(f),
                _ => None,
            },
            _ => None,
        }
    }

    /// Runs the script of vCPU `id` until an exit, an error or a block.
    fn run_steps(&mut self, id: u64) -> RunStep {
        let has_gic = self.vm.as_ref().is_some_and(|vm| vm.gic.is_some());
        loop {
            let clock = self.clock;
            let v = self.vcpus.get_mut(&id).expect("running vCPU");
            if v.exit_requested {
                v.exit_requested = false;
                return RunStep::Exit(exit(HV_EXIT_REASON_CANCELED, 0, 0, 0));
            }
            // Without an in-kernel GIC, the framework exits when the
            // vtimer's output is asserted and unmasked, and masks it.
            if !has_gic && !v.vtimer_masked && v.vtimer_asserted(clock) {
                v.vtimer_masked = true;
                return RunStep::Exit(exit(HV_EXIT_REASON_VTIMER_ACTIVATED, 0, 0, 0));
            }
            let Some(step) = v.script.pop_front() else {
                self.violation(format!(
                    "vCPU {id} ran past the end of its script (PC {:#x})",
                    self.vcpus[&id].pc
                ));
                return RunStep::Fail(HV_ERROR);
            };
            match step {
                Step::Exception { esr, far, ipa } => {
                    if arm::ec(esr) == arm::EC_HVC64 {
                        // HVC's preferred return address is the next
                        // instruction.
                        v.pc = v.pc.wrapping_add(4);
                    }
                    return RunStep::Exit(exit(HV_EXIT_REASON_EXCEPTION, esr, far, ipa));
                }
                Step::Canceled => return RunStep::Exit(exit(HV_EXIT_REASON_CANCELED, 0, 0, 0)),
                Step::Unknown => return RunStep::Exit(exit(HV_EXIT_REASON_UNKNOWN, 0, 0, 0)),
                Step::BlockUntilExit => {
                    v.script.push_front(Step::BlockUntilExit);
                    return RunStep::Block;
                }
                Step::SetReg { reg, value } => {
                    if !v.write_reg(reg, value) {
                        self.violation(format!("script: SetReg of {reg}, not an hv_reg_t"));
                        return RunStep::Fail(HV_ERROR);
                    }
                }
                Step::SetSysReg { reg, value } => {
                    if has_gic && arm::is_icc_el1(reg) {
                        v.icc.insert(reg, value);
                    } else {
                        v.write_sys(reg, value);
                    }
                }
                Step::AdvanceClock(ticks) => self.clock = self.clock.wrapping_add(ticks),
                Step::BeforeEntry(_) => {
                    self.violation("script: BeforeEntry is only taken at a run's entry".into());
                    return RunStep::Fail(HV_ERROR);
                }
                Step::Mrs { reg, rt } => {
                    if self.traps(reg, has_gic) {
                        let esr = arm::sysreg_access(reg, rt, true);
                        return RunStep::Exit(exit(HV_EXIT_REASON_EXCEPTION, esr, 0, 0));
                    }
                    let v = self.vcpus.get_mut(&id).expect("running vCPU");
                    let value = if has_gic && arm::is_icc_el1(reg) {
                        v.icc.get(&reg).copied().unwrap_or(0)
                    } else {
                        v.read_hw(reg, clock)
                    };
                    v.write_x(rt, value);
                    v.pc = v.pc.wrapping_add(4);
                }
                Step::Msr { reg, rt, value } => {
                    v.write_x(rt, value);
                    if self.traps(reg, has_gic) {
                        let esr = arm::sysreg_access(reg, rt, false);
                        return RunStep::Exit(exit(HV_EXIT_REASON_EXCEPTION, esr, 0, 0));
                    }
                    let v = self.vcpus.get_mut(&id).expect("running vCPU");
                    if has_gic && arm::is_icc_el1(reg) {
                        v.icc.insert(reg, value);
                    } else {
                        v.write_sys(reg, value);
                    }
                    v.pc = v.pc.wrapping_add(4);
                }
                Step::Load { va, ipa, size, rt } => {
                    if let Some(out) = self.access(id, va, ipa, size, rt, None) {
                        return out;
                    }
                }
                Step::Store {
                    va,
                    ipa,
                    size,
                    rt,
                    value,
                } => {
                    v.write_x(rt, value);
                    let step = Step::Store {
                        va,
                        ipa,
                        size,
                        rt,
                        value,
                    };
                    if let Some(out) = self.access(id, va, ipa, size, rt, Some((value, step))) {
                        return out;
                    }
                }
            }
        }
    }

    /// A guest load (`store` = None) or store of `size` bytes: performed on
    /// RAM it may access, a data abort otherwise. `None`: performed, go on.
    fn access(
        &mut self,
        id: u64,
        va: u64,
        ipa: u64,
        size: u8,
        rt: u8,
        store: Option<(u64, Step)>,
    ) -> Option<RunStep> {
        let write = store.is_some();
        if !matches!(size, 1 | 2 | 4 | 8) || ipa % u64::from(size) != 0 {
            self.violation(format!(
                "script: a {size}-byte access at {ipa:#x} (sizes 1, 2, 4, 8, naturally aligned)"
            ));
            return Some(RunStep::Fail(HV_ERROR));
        }
        let Some((host, flags)) = self.translate(ipa) else {
            // Not mapped at stage 2: a translation fault the VMM emulates
            // (MMIO) and completes, PC included.
            let esr = arm::data_abort(size, rt, write, arm::DFSC_TRANSLATION_L3);
            return Some(RunStep::Exit(exit(HV_EXIT_REASON_EXCEPTION, esr, va, ipa)));
        };
        let len = usize::from(size);
        match store {
            None => {
                let mut buf = [0u8; 8];
                // SAFETY: `host` is inside a mapping the VMM gave
                // hv_vm_map (alive until hv_vm_unmap) and the access is
                // naturally aligned, so it stays in one page.
                unsafe { std::ptr::copy_nonoverlapping(host as *const u8, buf.as_mut_ptr(), len) };
                let v = self.vcpus.get_mut(&id).expect("running vCPU");
                v.write_x(rt, u64::from_le_bytes(buf));
                v.pc = v.pc.wrapping_add(4);
                None
            }
            Some((value, _)) if flags & HV_MEMORY_WRITE != 0 => {
                let bytes = value.to_le_bytes();
                // SAFETY: as above; the page is writable at stage 2.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), host as *mut u8, len) };
                let v = self.vcpus.get_mut(&id).expect("running vCPU");
                v.retry = None;
                v.pc = v.pc.wrapping_add(4);
                None
            }
            Some((_, step)) => {
                let v = self.vcpus.get_mut(&id).expect("running vCPU");
                let faults = match v.retry {
                    Some((pc, n)) if pc == v.pc => n + 1,
                    _ => 1,
                };
                v.retry = Some((v.pc, faults));
                v.script.push_front(step);
                if faults > REFAULT_LIMIT {
                    let pc = v.pc;
                    self.violation(format!(
                        "vCPU {id}: the store to IPA {ipa:#x} (FAR {va:#x}) at PC {pc:#x} \
                         faulted {REFAULT_LIMIT} times in a row: the VMM makes no progress"
                    ));
                    return Some(RunStep::Fail(HV_ERROR));
                }
                let reported = match self.config.permission_fault_ipa {
                    FaultIpa::Faulting => ipa,
                    FaultIpa::Fixed(other) => other,
                };
                let esr = arm::data_abort(size, rt, true, arm::DFSC_PERMISSION_L3);
                Some(RunStep::Exit(exit(
                    HV_EXIT_REASON_EXCEPTION,
                    esr,
                    va,
                    reported,
                )))
            }
        }
    }

    fn traps(&self, reg: u16, has_gic: bool) -> bool {
        if arm::is_icc_el1(reg) {
            !has_gic
        } else {
            self.config.traps.contains(&reg)
        }
    }

    /// Leaves `hv_vcpu_run`: writes the exit record, clears the pending
    /// interrupts (`hv_vcpu.h`: cleared when `hv_vcpu_run` returns).
    fn run_leave(&mut self, id: u64, out: Option<HvVcpuExit>) {
        let v = self.vcpus.get_mut(&id).expect("running vCPU");
        v.running = false;
        v.blocked = false;
        v.pending_irq = false;
        v.pending_fiq = false;
        if let Some(e) = out {
            // SAFETY: the vCPU's exit record, alive while the vCPU is; only
            // this (the owning) thread reads it, after hv_vcpu_run returns.
            unsafe { v.exit.0.write(e) };
            self.events.push(Event::Exit { vcpu: id, exit: e });
        }
    }

    // ---- the in-kernel GIC ----

    pub(crate) fn new_object(&mut self, object: Object) -> usize {
        let addr = Box::new(0u8);
        let key = &*addr as *const u8 as usize;
        self.objects.insert(
            key,
            Live {
                _addr: addr,
                object,
                released: false,
            },
        );
        key
    }

    pub(crate) fn object(&mut self, call: &str, key: usize) -> &mut Object {
        match self.objects.get_mut(&key) {
            Some(live) if !live.released => &mut live.object,
            Some(live) => fatal(&format!(
                "{call}: object {key:#x} (from {}) was already released (os_release)",
                live.object.creator()
            )),
            None => fatal(&format!(
                "{call}: {key:#x} is not an object the framework returned"
            )),
        }
    }

    pub(crate) fn release(&mut self, key: usize) {
        let live = match self.objects.get_mut(&key) {
            Some(live) => live,
            None => fatal(&format!(
                "os_release({key:#x}): not an object the framework returned"
            )),
        };
        if live.released {
            fatal(&format!(
                "os_release({key:#x}): released twice (from {})",
                live.object.creator()
            ));
        }
        live.released = true;
        let creator = live.object.creator();
        self.events.push(Event::Release { creator });
    }

    pub(crate) fn gic_create(&mut self, config: usize) -> HvReturn {
        let call = "hv_gic_create";
        let (distributor, redistributor) = match self.object(call, config) {
            Object::GicConfig {
                distributor,
                redistributor,
            } => (*distributor, *redistributor),
            Object::GicState { .. } => fatal(&format!("{call}: a GIC state is not a config")),
        };
        let vm = match self.vm_mut(call) {
            Ok(vm) => vm,
            Err(e) => return e,
        };
        let (created, exists) = (vm.vcpus_created, vm.gic.is_some());
        if exists {
            return self.refuse(HV_BUSY, format!("{call}: the VM already has a GIC"));
        }
        if created > 0 {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!(
                    "{call} after {created} vCPU(s) were created: the GIC must be created \
                     before any vCPU"
                ),
            );
        }
        let (Some(distributor), Some(redistributor)) = (distributor, redistributor) else {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: the configuration lacks a distributor or redistributor base"),
            );
        };
        let p = self.config.gic;
        for (what, base, size) in [
            ("distributor", distributor, p.dist_size as u64),
            ("redistributor", redistributor, p.redist_region_size as u64),
        ] {
            if let Some(m) = self
                .vm
                .as_ref()
                .expect("checked")
                .maps
                .iter()
                .find(|m| base < m.ipa + m.size && m.ipa < base + size)
            {
                let (mi, ms) = (m.ipa, m.size);
                return self.refuse(
                    HV_BAD_ARGUMENT,
                    format!("{call}: the {what} at {base:#x} overlaps RAM {mi:#x}+{ms:#x}"),
                );
            }
        }
        self.vm.as_mut().expect("checked").gic = Some(Gic {
            spi: BTreeMap::new(),
        });
        self.events.push(Event::GicCreate {
            distributor,
            redistributor,
        });
        HV_SUCCESS
    }

    pub(crate) fn gic_config_base(
        &mut self,
        config: usize,
        distributor: bool,
        base: u64,
    ) -> HvReturn {
        let (call, align) = if distributor {
            (
                "hv_gic_config_set_distributor_base",
                self.config.gic.dist_align as u64,
            )
        } else {
            (
                "hv_gic_config_set_redistributor_base",
                self.config.gic.redist_align as u64,
            )
        };
        if align == 0 || base % align != 0 {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: base {base:#x} is not aligned to {align:#x}"),
            );
        }
        match self.object(call, config) {
            Object::GicConfig {
                distributor: d,
                redistributor: r,
            } => {
                if distributor {
                    *d = Some(base);
                } else {
                    *r = Some(base);
                }
                HV_SUCCESS
            }
            Object::GicState { .. } => fatal(&format!("{call}: a GIC state is not a config")),
        }
    }

    fn gic_mut(&mut self, call: &str) -> Result<&mut Gic, HvReturn> {
        let has = self.vm.as_ref().is_some_and(|vm| vm.gic.is_some());
        if !has {
            return Err(self.refuse(HV_BAD_ARGUMENT, format!("{call}: the VM has no GIC")));
        }
        Ok(self
            .vm
            .as_mut()
            .and_then(|vm| vm.gic.as_mut())
            .expect("checked"))
    }

    pub(crate) fn gic_set_spi(&mut self, intid: u32, level: bool) -> HvReturn {
        let p = self.config.gic;
        let gic = match self.gic_mut("hv_gic_set_spi") {
            Ok(g) => g,
            Err(e) => return e,
        };
        if intid < p.spi_base || intid - p.spi_base >= p.spi_count {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!(
                    "hv_gic_set_spi: INTID {intid} is not one of the SPIs {}..{}",
                    p.spi_base,
                    p.spi_base + p.spi_count
                ),
            );
        }
        gic.spi.insert(intid, level);
        self.events.push(Event::GicSetSpi { intid, level });
        HV_SUCCESS
    }

    pub(crate) fn gic_icc(
        &mut self,
        id: u64,
        reg: u16,
        write: Option<u64>,
    ) -> Result<u64, HvReturn> {
        let call = if write.is_some() {
            "hv_gic_set_icc_reg"
        } else {
            "hv_gic_get_icc_reg"
        };
        self.owned(call, id)?;
        self.gic_mut(call)?;
        if !HV_GIC_ICC_REGS.iter().any(|&(_, r)| r == reg) {
            return Err(self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: {reg:#x} is not an hv_gic_icc_reg_t"),
            ));
        }
        if reg == HV_GIC_ICC_REG_SRE_EL2 {
            return Err(self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call}: ICC_SRE_EL2 needs a VM with EL2 enabled"),
            ));
        }
        if reg == HV_GIC_ICC_REG_RPR_EL1 && write.is_some() {
            return Err(self.refuse(HV_BAD_ARGUMENT, format!("{call}: ICC_RPR_EL1 is read-only")));
        }
        let v = self.vcpus.get_mut(&id).expect("owned");
        match write {
            Some(value) => {
                v.icc.insert(reg, value);
                v.icc_written = true;
                self.events.push(Event::GicSetIccReg {
                    vcpu: id,
                    reg,
                    value,
                });
                Ok(value)
            }
            // ICC_RPR_EL1 reads 0xff (idle priority) until set otherwise.
            None => Ok(v
                .icc
                .get(&reg)
                .copied()
                .unwrap_or(if reg == HV_GIC_ICC_REG_RPR_EL1 {
                    0xff
                } else {
                    0
                })),
        }
    }

    pub(crate) fn gic_state_create(&mut self) -> usize {
        let call = "hv_gic_state_create";
        if let Err(_e) = self.gic_mut(call) {
            return 0;
        }
        if let Some((&id, _)) = self.vcpus.iter().find(|(_, v)| v.running) {
            self.violation(format!(
                "{call} while vCPU {id} runs (every vCPU must be stopped)"
            ));
            return 0;
        }
        let data = self.gic_blob();
        self.events.push(Event::GicStateSave);
        self.new_object(Object::GicState { data })
    }

    /// The simulator's GIC state: a tag, the vCPU count, the SPI levels.
    fn gic_blob(&self) -> Vec<u8> {
        let gic = self
            .vm
            .as_ref()
            .and_then(|vm| vm.gic.as_ref())
            .expect("checked");
        let mut out = GIC_BLOB_TAG.to_vec();
        out.extend_from_slice(&(self.vcpus.len() as u32).to_le_bytes());
        out.extend_from_slice(&(gic.spi.len() as u32).to_le_bytes());
        for (&intid, &level) in &gic.spi {
            out.extend_from_slice(&intid.to_le_bytes());
            out.push(u8::from(level));
        }
        out
    }

    pub(crate) fn gic_set_state(&mut self, data: &[u8]) -> HvReturn {
        let call = "hv_gic_set_state";
        if let Err(e) = self.gic_mut(call) {
            return e;
        }
        if self.vcpus.is_empty() {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call} before the vCPUs exist (create them first)"),
            );
        }
        if self.vm.as_ref().expect("checked").ran {
            return self.refuse(
                HV_BAD_ARGUMENT,
                format!("{call} after a vCPU ran (restore before the vCPUs run)"),
            );
        }
        if let Some((&id, _)) = self.vcpus.iter().find(|(_, v)| v.icc_written) {
            self.violation(format!(
                "{call} after vCPU {id}'s ICC registers were written: restore the GIC state \
                 first, then the CPU registers compatible with it"
            ));
        }
        let Some(spi) = parse_gic_blob(data, self.vcpus.len()) else {
            return HV_BAD_ARGUMENT;
        };
        let gic = self.gic_mut(call).expect("checked");
        gic.spi = spi;
        self.events.push(Event::GicSetState { size: data.len() });
        HV_SUCCESS
    }

    pub(crate) fn spi_level(&self, intid: u32) -> Option<bool> {
        let gic = self.vm.as_ref()?.gic.as_ref()?;
        Some(gic.spi.get(&intid).copied().unwrap_or(false))
    }

    pub(crate) fn view(&self, id: u64) -> Option<VcpuView> {
        let v = self.vcpus.get(&id)?;
        Some(VcpuView {
            x: v.x,
            pc: v.pc,
            cpsr: v.cpsr,
            fpcr: v.fpcr,
            fpsr: v.fpsr,
            v: v.v,
            sys: v.sys.clone(),
            icc: v.icc.clone(),
            pending_irq: v.pending_irq,
            pending_fiq: v.pending_fiq,
            vtimer_masked: v.vtimer_masked,
            vtimer_offset: v.vtimer_offset,
            vtimer_asserted: v.vtimer_asserted(self.clock),
            trap_debug_exceptions: v.trap_debug_exceptions,
            trap_debug_reg_accesses: v.trap_debug_reg_accesses,
            steps_left: v.script.len(),
            blocked: v.blocked,
        })
    }

    pub(crate) fn push_steps(&mut self, id: u64, steps: Vec<Step>) {
        match self.vcpus.get_mut(&id) {
            Some(v) => v.script.extend(steps),
            None => self.queued.entry(id).or_default().extend(steps),
        }
    }

    pub(crate) fn is_blocked(&self, id: u64) -> bool {
        self.vcpus.get(&id).is_some_and(|v| v.blocked)
    }
}

const GIC_BLOB_TAG: &[u8; 12] = b"hvf-sim-gic1";

fn parse_gic_blob(data: &[u8], vcpus: usize) -> Option<BTreeMap<u32, bool>> {
    let rest = data.strip_prefix(GIC_BLOB_TAG.as_slice())?;
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    if u32_at(rest, 0)? as usize != vcpus {
        return None;
    }
    let n = u32_at(rest, 4)? as usize;
    let mut spi = BTreeMap::new();
    let mut at = 8;
    for _ in 0..n {
        let intid = u32_at(rest, at)?;
        let level = *rest.get(at + 4)?;
        spi.insert(intid, level != 0);
        at += 5;
    }
    (at == rest.len()).then_some(spi)
}

impl Vcpu {
    fn write_reg(&mut self, reg: u32, value: u64) -> bool {
        match reg {
            0..=30 => self.x[reg as usize] = value,
            HV_REG_PC => self.pc = value,
            HV_REG_FPCR => self.fpcr = value,
            HV_REG_FPSR => self.fpsr = value,
            HV_REG_CPSR => self.cpsr = value,
            _ => return false,
        }
        true
    }

    fn write_x(&mut self, rt: u8, value: u64) {
        if let Some(x) = self.x.get_mut(usize::from(rt)) {
            *x = value;
        }
    }

    /// A system register as `hv_vcpu_get_sys_reg` reads it: CNTV_CTL_EL0
    /// with ISTATUS from the count; others as last written (0 at reset).
    fn read_sys(&self, reg: u16, clock: u64) -> u64 {
        let value = self.sys.get(&reg).copied().unwrap_or(0);
        if reg == HV_SYS_REG_CNTV_CTL_EL0 {
            let istatus = value & arm::CNTV_CTL_ENABLE != 0 && self.vtimer_condition(clock);
            (value & (arm::CNTV_CTL_ENABLE | arm::CNTV_CTL_IMASK))
                | if istatus { arm::CNTV_CTL_ISTATUS } else { 0 }
        } else {
            value
        }
    }

    fn write_sys(&mut self, reg: u16, value: u64) {
        let value = if reg == HV_SYS_REG_CNTV_CTL_EL0 {
            value & (arm::CNTV_CTL_ENABLE | arm::CNTV_CTL_IMASK)
        } else {
            value
        };
        self.sys.insert(reg, value);
    }

    /// A register as the guest reads it without a trap: the counters from
    /// the host count, others as `hv_vcpu_get_sys_reg` reads them.
    fn read_hw(&self, reg: u16, clock: u64) -> u64 {
        match reg {
            arm::CNTPCT_EL0 => clock,
            arm::CNTVCT_EL0 => clock.wrapping_sub(self.vtimer_offset),
            _ => self.read_sys(reg, clock),
        }
    }

    /// CNTVCT_EL0 >= CNTV_CVAL_EL0 (Arm ARM D11.2.4, the timer condition).
    fn vtimer_condition(&self, clock: u64) -> bool {
        let cval = self
            .sys
            .get(&HV_SYS_REG_CNTV_CVAL_EL0)
            .copied()
            .unwrap_or(0);
        clock.wrapping_sub(self.vtimer_offset) >= cval
    }

    /// The vtimer's output: ENABLE, not IMASK, and the condition met.
    fn vtimer_asserted(&self, clock: u64) -> bool {
        let ctl = self.sys.get(&HV_SYS_REG_CNTV_CTL_EL0).copied().unwrap_or(0);
        ctl & arm::CNTV_CTL_ENABLE != 0
            && ctl & arm::CNTV_CTL_IMASK == 0
            && self.vtimer_condition(clock)
    }
}

/// `hv_vcpu_run` of vCPU `id`.
pub(crate) fn run(id: u64) -> HvReturn {
    let mut guard = lock("hv_vcpu_run");
    // Hooks at the entry run without the lock (they may call back into the
    // framework, e.g. kick this vCPU from the VMM's own handle).
    loop {
        let sim = guard.as_mut().expect("session");
        if let Err(e) = sim.owned("hv_vcpu_run", id) {
            return e;
        }
        let Some(hook) = sim.take_entry_hook(id) else {
            break;
        };
        drop(guard);
        hook();
        guard = lock("hv_vcpu_run");
    }
    let sim = guard.as_mut().expect("session");
    if let Err(e) = sim.run_enter(id) {
        return e;
    }
    loop {
        let sim = guard.as_mut().expect("session");
        match sim.run_steps(id) {
            RunStep::Exit(e) => {
                sim.run_leave(id, Some(e));
                return HV_SUCCESS;
            }
            RunStep::Fail(ret) => {
                sim.run_leave(id, None);
                return ret;
            }
            RunStep::Block => {
                let v = sim.vcpus.get_mut(&id).expect("running vCPU");
                v.blocked = true;
                WAKE.notify_all();
                while !guard
                    .as_ref()
                    .and_then(|s| s.vcpus.get(&id))
                    .is_some_and(|v| v.exit_requested)
                {
                    guard = WAKE.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                let v = guard
                    .as_mut()
                    .and_then(|s| s.vcpus.get_mut(&id))
                    .expect("running vCPU");
                v.blocked = false;
                // The block ends with the CANCELED exit run_steps reports for
                // the request.
                v.script.pop_front();
            }
        }
    }
}

/// The host's page size (`hv_vm_map`'s host address must be aligned to it:
/// `hv_vm.h`, "page aligned virtual address in the current process").
pub(crate) fn host_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}
