//! The vCPU threads and their run loop: starting vCPUs (boot or restore),
//! running them, PSCI, WFI sleeping, the MMIO and system-register exits
//! ([`VcpuIo`]), and the thread's side of the snapshot pause.

use super::config::Start;
use super::control::{Control, EndOnPanic, Turns};
use super::state::{self, VcpuPower};
use super::{Shared, VmExit};
use crate::arch::layout;
use crate::arch::psci::{
    self, PowerState, PsciAction, PsciCall, PsciCpus, PSTATE_AT_START, RESET_TIMER, START_ZEROED_X,
};
use crate::arch::sysreg::{SysReg, CNTV_CTL_EL0, CNTV_CVAL_EL0, MPIDR_EL1};
use crate::arch::timer::deadline_ns;
use crate::hv::gic::{wfi_wakes, KERNEL_GIC_WFI_MAX_SLEEP};
use crate::hv::{self, Kick, MmioFault, Reg, Vcpu, VcpuExit, VcpuId, VcpuIo, Vm};
use anyhow::{bail, Context};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time slice of one vCPU when several share a host thread.
const ROUND_ROBIN_SLICE: Duration = Duration::from_millis(4);

/// The VMM side of vCPU exits ([`VcpuIo`]).
struct Io<'a> {
    shared: &'a Shared,
}

/// The bus's fault as the backend takes it (an external abort).
fn abort(f: crate::devices::bus::MmioFault) -> MmioFault {
    MmioFault {
        gpa: f.gpa,
        len: f.len,
        reason: f.reason,
    }
}

impl VcpuIo for Io<'_> {
    fn mmio_read(&mut self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        let r = self.shared.bus.read(vcpu, gpa, data).map_err(abort);
        if let Err(e) = &r {
            crate::warn_ratelimited!("vCPU {vcpu}: {e}");
        }
        r
    }

    fn mmio_write(&mut self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        let r = self.shared.bus.write(vcpu, gpa, data).map_err(abort);
        match &r {
            Err(e) => crate::warn_ratelimited!("vCPU {vcpu}: {e}"),
            // A distributor or redistributor write (enable, pending, routing,
            // wake) can make an interrupt pending on another vCPU, which may
            // be waiting in WFI.
            Ok(()) if (layout::GICD_BASE..layout::GIC_WINDOW_END).contains(&gpa) => {
                self.shared.control.interrupts_changed();
            }
            Ok(()) => {}
        }
        r
    }

    fn sysreg_read(&mut self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        if let Some(v) = self.shared.clock.sysreg_read(vcpu, reg) {
            return Some(v);
        }
        let v = self.shared.irqchip.sysreg_read(vcpu, reg);
        if v.is_none() {
            crate::warn_ratelimited!("vCPU {vcpu}: read of unimplemented system register {reg}");
        }
        v
    }

    fn sysreg_write(&mut self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        if self.shared.clock.sysreg_write(vcpu, reg, value) {
            return true;
        }
        let Some(targets) = self.shared.irqchip.sysreg_write(vcpu, reg, value) else {
            crate::warn_ratelimited!("vCPU {vcpu}: write of unimplemented system register {reg}");
            return false;
        };
        if !targets.is_empty() {
            self.shared.control.interrupts_changed();
        }
        true
    }

    /// The userspace GIC's output; never asserted with an in-kernel GIC,
    /// which signals the vCPU itself (the `hvf` backend does not ask then).
    fn irq_line(&mut self, vcpu: VcpuId) -> bool {
        self.shared.irqchip.irq_pending(vcpu) == Some(true)
    }

    fn vtimer_level(&mut self, vcpu: VcpuId, level: bool) {
        self.shared.irqchip.vtimer_level(vcpu, level);
    }
}

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

/// A vCPU together with its run-loop state.
struct RunVcpu<V> {
    vcpu: V,
    /// Its reset state, for every start (PSCI CPU_ON).
    reset: ResetState,
    /// Set while the vCPU waits in WFI.
    wfi: Option<WfiWait>,
}

/// The register values a vCPU's reset writes: [`psci::sysreg_reset`]
/// resolved against the vCPU as the backend created it, so that a core
/// started by PSCI CPU_ON, also after CPU_OFF, is a cold core (MMU and caches
/// off, no state from before) but for its entry point and X0.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ResetState {
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
    fn of_new(vcpu: &mut impl Vcpu) -> hv::Result<Self> {
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
    fn start(&self, vcpu: &mut impl Vcpu, entry: u64, x0: u64) -> hv::Result<()> {
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

/// A vCPU waiting in WFI (or PSCI CPU_SUSPEND).
#[derive(Clone, Copy, Debug)]
struct WfiWait {
    /// It runs again at this instant at the latest (`None`: no deadline).
    until: Option<Instant>,
    /// The wake-up generation when it went to sleep: a later one means an
    /// interrupt may have arrived (what an in-kernel GIC goes by).
    generation: u64,
}

/// The vCPUs of each vCPU thread: one thread per vCPU, or one for all of
/// them, round-robin, when the backend asks for it
/// ([`crate::hv::Hypervisor::ROUND_ROBIN`]).
pub(super) fn thread_groups(cpus: usize, round_robin: bool) -> Vec<Vec<VcpuId>> {
    if round_robin {
        vec![(0..cpus).collect()]
    } else {
        (0..cpus).map(|v| vec![v]).collect()
    }
}

/// Starts a thread per group of [`thread_groups`]; each runs its vCPUs from
/// `start` until the VM ends, and ends the VM if it fails (or panics).
pub(super) fn spawn_threads<V: Vm + 'static>(
    vm: &Arc<V>,
    shared: &Arc<Shared>,
    groups: Vec<Vec<VcpuId>>,
    start: &Start,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for ids in groups {
        let (shared, vm) = (shared.clone(), vm.clone());
        let start = start.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("vcpu{}", ids[0]))
                .spawn(move || {
                    // A panic ends the VM with an error instead of leaving the
                    // other threads waiting for this one.
                    let _ended = EndOnPanic(&shared.control);
                    // WFI sleeps until the guest's timer deadline.
                    crate::sync::punctual_wakeups();
                    if let Err(e) = vcpu_thread(&*vm, &shared, &ids, start) {
                        shared.control.finish(VmExit::Error(format!("{e:#}")));
                    }
                })
                .context("cannot spawn a vCPU thread")?,
        );
    }
    Ok(threads)
}

/// Runs vCPUs `ids` on the current thread until the VM ends.
fn vcpu_thread<V: Vm>(vm: &V, shared: &Shared, ids: &[VcpuId], start: Start) -> anyhow::Result<()> {
    let Some(mut vcpus) = start_up(vm, &shared.control, ids, &start)? else {
        return Ok(());
    };
    let turns = shared.control.turns(ids[0]);
    let several = vcpus.len() > 1;
    // Preempts the running vCPU when several share this thread.
    let _ticker = several.then(|| {
        Ticker::start(
            turns.clone(),
            vcpus
                .iter()
                .map(|v| (v.vcpu.id(), v.vcpu.kicker()))
                .collect(),
        )
    });

    let mut io = Io { shared };
    let mut cursor = 0;
    loop {
        let generation = {
            let c = shared.control.lock();
            if c.exit.is_some() {
                return Ok(());
            }
            if c.pause_requested() {
                drop(c);
                park(shared, &mut vcpus);
                continue;
            }
            c.generation
        };
        // One pass: every vCPU in round-robin order, and before each, a vCPU
        // that asked for a turn (an interrupt or its timer), at most one
        // such turn per vCPU of the thread.
        let mut ran = false;
        let mut next_deadline: Option<Instant> = None;
        let (mut in_order, mut asked) = (0, 0);
        while in_order < vcpus.len() {
            let wanted = (several && asked < vcpus.len())
                .then(|| turns.take_urgent(ids))
                .flatten();
            let slot = match wanted {
                Some(slot) => {
                    asked += 1;
                    slot
                }
                None => {
                    let slot = cursor;
                    cursor = (cursor + 1) % vcpus.len();
                    in_order += 1;
                    slot
                }
            };
            match take_turn(vm, shared, &mut vcpus[slot], &mut io, &turns, generation)? {
                Turn::Ran => ran = true,
                Turn::Waiting(Some(d)) => {
                    next_deadline = Some(next_deadline.map_or(d, |n| n.min(d)));
                }
                Turn::Waiting(None) => {}
            }
        }
        if !ran {
            let c = shared.control.lock();
            if c.generation != generation || c.exit.is_some() || turns.any_urgent() {
                continue;
            }
            match next_deadline {
                Some(d) => {
                    let wait = d.saturating_duration_since(Instant::now());
                    drop(shared.control.wait_for(c, wait));
                }
                None => {
                    drop(shared.control.wait(c));
                }
            }
        }
    }
}

/// What a vCPU did with its turn.
enum Turn {
    /// It ran.
    Ran,
    /// It is off, or in WFI until an interrupt, a wake-up or this deadline.
    Waiting(Option<Instant>),
}

/// Gives `rv` a turn at wake-up generation `generation`: starts it if PSCI
/// CPU_ON asked for it, skips it while it is off or its WFI lasts, else runs
/// it until its next exit and handles that.
fn take_turn<V: Vm>(
    vm: &V,
    shared: &Shared,
    rv: &mut RunVcpu<V::Vcpu>,
    io: &mut Io<'_>,
    turns: &Turns,
    generation: u64,
) -> anyhow::Result<Turn> {
    let id = rv.vcpu.id();
    let power = shared.control.lock().power[id];
    match power {
        VcpuPower::Off => return Ok(Turn::Waiting(None)),
        VcpuPower::OnPending { entry, context } => {
            rv.reset
                .start(&mut rv.vcpu, entry, context)
                .with_context(|| format!("cannot start vCPU {id}"))?;
            // Its physical timer is the machine's, not the backend's.
            shared.clock.reset_timer(id);
            shared.control.lock().power[id] = VcpuPower::On;
            rv.wfi = None;
        }
        VcpuPower::On => {}
    }
    if let Some(wait) = rv.wfi {
        let due = wait.until.is_some_and(|d| d <= Instant::now());
        let pending = shared.irqchip.irq_pending(id);
        if !wfi_wakes(pending, due, generation != wait.generation) {
            return Ok(Turn::Waiting(wait.until));
        }
        rv.wfi = None;
    }
    turns.set_running(Some(id));
    let exit = rv.vcpu.run(io);
    turns.set_running(None);
    match exit.with_context(|| format!("vCPU {id}"))? {
        VcpuExit::Hvc { .. } | VcpuExit::Smc { .. } => {
            if handle_psci(&mut rv.vcpu, shared)? == AfterPsci::Suspend {
                rv.wfi = wfi_wait(vm, shared, &mut rv.vcpu, generation)?;
            }
        }
        VcpuExit::Wfi => rv.wfi = wfi_wait(vm, shared, &mut rv.vcpu, generation)?,
        VcpuExit::Wfe | VcpuExit::Kicked => {}
        VcpuExit::Unhandled { esr, far, ipa, pc } => {
            bail!(
                "vCPU {id}: unhandled exception: ESR {esr:#x} (EC {:#x}), FAR {far:#x}, IPA {ipa:#x}, PC {pc:#x}",
                esr >> 26
            );
        }
    }
    Ok(Turn::Ran)
}

/// A vCPU thread's start-up: creates vCPUs `ids`, keeps each one's reset
/// state, starts them as `start` says (the boot CPU at the kernel entry, or
/// every vCPU from its snapshot state), and waits until every vCPU of the VM
/// exists (and a restored in-kernel GIC's state is loaded) before any runs:
/// `hv_gic_create`'s topology is final once vCPUs run. A restored in-kernel
/// GIC's CPU-interface registers go in last. `None` if the VM ended first.
fn start_up<V: Vm>(
    vm: &V,
    control: &Control,
    ids: &[VcpuId],
    start: &Start,
) -> anyhow::Result<Option<Vec<RunVcpu<V::Vcpu>>>> {
    let mut vcpus = Vec::with_capacity(ids.len());
    for &id in ids {
        let mut vcpu = vm
            .create_vcpu(id, psci::mpidr(id))
            .with_context(|| format!("cannot create vCPU {id}"))?;
        let reset = ResetState::of_new(&mut vcpu)
            .with_context(|| format!("cannot read vCPU {id}'s reset state"))?;
        match start {
            Start::Boot(boot) if id == 0 => reset
                .start(&mut vcpu, boot.entry, boot.dtb)
                .context("cannot start the boot vCPU")?,
            Start::Boot(_) => {}
            Start::Restore { states } => {
                let state = states
                    .get(id)
                    .with_context(|| format!("the snapshot has no state for vCPU {id}"))?;
                state::apply_vcpu(&mut vcpu, state)
                    .with_context(|| format!("cannot restore vCPU {id}"))?;
            }
        }
        control.set_kicker(id, vcpu.kicker());
        vcpus.push(RunVcpu {
            vcpu,
            reset,
            wfi: None,
        });
    }
    match control.created_wait_release() {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) => bail!("{e}"),
    }
    if let Start::Restore { states } = start {
        for rv in &mut vcpus {
            let id = rv.vcpu.id();
            let state = states
                .get(id)
                .with_context(|| format!("the snapshot has no state for vCPU {id}"))?;
            state::apply_vcpu_gic(&mut rv.vcpu, state)
                .with_context(|| format!("cannot restore vCPU {id}'s GIC CPU interface"))?;
        }
    }
    control.thread_ready();
    Ok(Some(vcpus))
}

/// Snapshot rendezvous: captures this thread's vCPUs (on their own thread,
/// as HVF requires) and waits until the snapshot is done.
fn park<V: Vcpu>(shared: &Shared, vcpus: &mut [RunVcpu<V>]) {
    let states: Vec<_> = vcpus
        .iter_mut()
        .map(|rv| {
            let id = rv.vcpu.id();
            let st = state::capture_vcpu(&mut rv.vcpu).map_err(|e| format!("vCPU {id}: {e}"));
            (id, st)
        })
        .collect();
    shared.control.park(states);
}

/// How a vCPU that executed WFI (or CPU_SUSPEND) waits, taken at wake-up
/// generation `generation`: not at all if its IRQ line is asserted;
/// otherwise until its virtual timer deadline, if armed. With an in-kernel
/// GIC the VMM cannot see the line, so the wait is also capped at
/// [`KERNEL_GIC_WFI_MAX_SLEEP`] and ends on any device interrupt.
fn wfi_wait<V: Vm>(
    vm: &V,
    shared: &Shared,
    vcpu: &mut V::Vcpu,
    generation: u64,
) -> hv::Result<Option<WfiWait>> {
    let pending = shared.irqchip.irq_pending(vcpu.id());
    if pending == Some(true) {
        return Ok(None);
    }
    let ns = deadline_ns(
        vcpu.sysreg(CNTV_CTL_EL0)?,
        vcpu.sysreg(CNTV_CVAL_EL0)?,
        vm.virtual_count(),
        vm.counter_frequency(),
    );
    let now = Instant::now();
    let mut until = ns.map(|ns| now + Duration::from_nanos(ns));
    if pending.is_none() {
        let cap = now + KERNEL_GIC_WFI_MAX_SLEEP;
        until = Some(until.map_or(cap, |u| u.min(cap)));
    }
    Ok(Some(WfiWait { until, generation }))
}

/// What the vCPU does after a PSCI call.
#[derive(Debug, PartialEq, Eq)]
enum AfterPsci {
    Continue,
    /// CPU_SUSPEND: wait as in WFI.
    Suspend,
}

fn handle_psci(vcpu: &mut impl Vcpu, shared: &Shared) -> anyhow::Result<AfterPsci> {
    let call = PsciCall::from_regs([
        vcpu.reg(Reg::X(0))?,
        vcpu.reg(Reg::X(1))?,
        vcpu.reg(Reg::X(2))?,
        vcpu.reg(Reg::X(3))?,
    ]);
    let action = {
        let c = shared.control.lock();
        psci::handle(call, &Cpus(&c.power))
    };
    let ret = match action {
        PsciAction::Return(v) => v,
        PsciAction::CpuOn {
            target,
            entry,
            context_id,
        } => {
            let mut c = shared.control.lock();
            match c.power.get(target) {
                _ if !shared.ram.contains(entry, 4) => psci::ret(psci::INVALID_ADDRESS),
                Some(VcpuPower::Off) => {
                    c.power[target] = VcpuPower::OnPending {
                        entry,
                        context: context_id,
                    };
                    c.generation += 1;
                    drop(c);
                    shared.control.notify();
                    shared.control.kick_where(|v| v == target);
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
            shared.control.lock().power[vcpu.id()] = VcpuPower::Off;
            return Ok(AfterPsci::Continue);
        }
        PsciAction::SystemOff => {
            shared.control.finish(VmExit::PowerOff);
            return Ok(AfterPsci::Continue);
        }
        PsciAction::SystemReset => {
            shared.control.finish(VmExit::Reset);
            return Ok(AfterPsci::Continue);
        }
    };
    vcpu.set_reg(Reg::X(0), ret)?;
    Ok(AfterPsci::Continue)
}

/// Kicks whichever vCPU of a shared thread is running, every slice.
struct Ticker {
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Ticker {
    /// Kicks whichever of `kicks`' vCPUs `turns` says is running, every
    /// [`ROUND_ROBIN_SLICE`].
    fn start(turns: Arc<Turns>, kicks: Vec<(VcpuId, Arc<dyn Kick>)>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let _ = std::thread::Builder::new()
            .name("vcpu-ticker".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(ROUND_ROBIN_SLICE);
                    let running = turns.running();
                    if let Some((_, k)) = kicks.iter().find(|(id, _)| Some(*id) == running) {
                        k.kick();
                    }
                }
            });
        Ticker { stop }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::psci::SCTLR_CLEAR_AT_START;
    use crate::arch::sysreg::{self as sr, EL1_STATE_SYSREGS, OSLSR_EL1};
    use crate::devices::gicv3::Gicv3;
    use crate::hv::fake::{FakeVcpu, FakeVm};
    use crate::machine::config::BootRegs;
    use crate::machine::irqchip::Irqchip;
    use std::sync::Mutex;
    use std::time::Duration;

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
    #[cfg(feature = "emu")]
    #[test]
    fn a_reset_emu_vcpu_equals_a_cold_one() {
        use crate::hv::emu::EmuHypervisor;
        use crate::hv::{GicMode, Hypervisor};
        use crate::memory::GuestRam;
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

    /// Runs `start_up` for each group on its own thread against a [`FakeVm`]
    /// whose log the threads add `run <id>` to once they may run. The VM's
    /// thread (the test) logs `release` when it lets them go, after every
    /// vCPU exists. Returns the log.
    fn start_up_order(start: Start, groups: Vec<Vec<VcpuId>>, fail: Option<VcpuId>) -> Vec<String> {
        let cpus = groups.iter().map(Vec::len).sum();
        let vm = Arc::new(FakeVm {
            fail,
            ..FakeVm::default()
        });
        let control = Arc::new(Control::new(
            Irqchip::Userspace(Arc::new(Mutex::new(Gicv3::new(cpus)))),
            vec![VcpuPower::Off; cpus],
            &groups,
        ));
        let spawn = |ids: Vec<VcpuId>| {
            let (vm, control, start) = (vm.clone(), control.clone(), start.clone());
            std::thread::spawn(move || match start_up(&*vm, &control, &ids, &start) {
                Ok(Some(vcpus)) => {
                    for rv in vcpus {
                        vm.log.lock().unwrap().push(format!("run {}", rv.vcpu.id()));
                    }
                }
                Ok(None) => {}
                Err(e) => control.finish(VmExit::Error(format!("{e:#}"))),
            })
        };
        let mut groups = groups.into_iter();
        let first = spawn(groups.next().unwrap());
        // The first thread has its vCPUs but not the others: it must not run
        // (a failure here is certain if it would, whatever the timing).
        std::thread::sleep(Duration::from_millis(100));
        assert!(!vm.log.lock().unwrap().iter().any(|e| e.starts_with("run")));
        let mut threads: Vec<_> = groups.map(spawn).collect();
        threads.push(first);
        control.wait_created();
        if !control.finished() {
            vm.log.lock().unwrap().push("release".into());
        }
        control.release(Ok(()));
        for t in threads {
            t.join().unwrap();
        }
        let log = vm.log.lock().unwrap().clone();
        log
    }

    /// Where `event` is in `log`.
    fn at(log: &[String], event: &str) -> usize {
        log.iter()
            .position(|e| e == event)
            .unwrap_or_else(|| panic!("no {event:?} in {log:?}"))
    }

    #[test]
    fn every_vcpu_exists_before_any_runs_on_a_fresh_boot() {
        let boot = Start::Boot(BootRegs {
            entry: ENTRY,
            dtb: CONTEXT,
        });
        for groups in [vec![vec![0], vec![1], vec![2]], vec![vec![0, 1, 2]]] {
            let log = start_up_order(boot.clone(), groups, None);
            let release = at(&log, "release");
            for id in 0..3 {
                assert!(at(&log, &format!("create {id}")) < release, "{log:?}");
                assert!(at(&log, &format!("run {id}")) > release, "{log:?}");
            }
        }
    }

    #[test]
    fn every_vcpu_exists_before_any_runs_on_a_restore() {
        let vm = FakeVm::default();
        let states = (0..3)
            .map(|id| {
                let mut vcpu = vm.create_vcpu(id, psci::mpidr(id)).unwrap();
                state::capture_vcpu(&mut vcpu).unwrap()
            })
            .collect();
        let restore = Start::Restore {
            states: Arc::new(states),
        };
        let log = start_up_order(restore, vec![vec![0], vec![1], vec![2]], None);
        let release = at(&log, "release");
        for id in 0..3 {
            assert!(at(&log, &format!("create {id}")) < release, "{log:?}");
            assert!(at(&log, &format!("run {id}")) > release, "{log:?}");
        }
    }

    #[test]
    fn a_vcpu_that_cannot_be_created_ends_the_start_up() {
        let boot = Start::Boot(BootRegs {
            entry: ENTRY,
            dtb: CONTEXT,
        });
        let log = start_up_order(boot, vec![vec![0], vec![1], vec![2]], Some(1));
        assert!(
            !log.iter().any(|e| e == "release" || e.starts_with("run")),
            "{log:?}"
        );
    }
}
