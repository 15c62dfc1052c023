//! The vCPU threads and their run loop: starting vCPUs (boot or restore),
//! running them, PSCI, WFI sleeping, and the thread's side of a pause. The
//! loop hands MMIO and system-register exits to the VM through
//! [`VcpuEnv`]; it knows nothing else of the devices or the interrupt
//! controller.
//!
//! The wing's other parts: the [`run_state`] every thread shares, the
//! guest's [`clock`], a vCPU's [`state`] as a snapshot holds it, its
//! [`reset`] (boot and PSCI CPU_ON) and the [`psci`] calls.

pub mod clock;
mod psci;
mod reset;
pub mod run_state;
pub mod state;

use crate::arch::psci::mpidr;
use crate::arch::sysreg::{SysReg, CNTV_CTL_EL0, CNTV_CVAL_EL0};
use crate::arch::timer::deadline_ns;
use crate::hv::gic::{wfi_wakes, KERNEL_GIC_WFI_MAX_SLEEP};
use crate::hv::{self, Kick, MmioFault, Vcpu, VcpuExit, VcpuId, VcpuIo, Vm};
use crate::machine::fork;
use anyhow::{bail, Context};
use psci::AfterPsci;
use reset::ResetState;
use run_state::{EndOnPanic, RunState, Turns, VmExit};
use state::{VcpuPower, VcpuState};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time slice of one vCPU when several share a host thread.
const ROUND_ROBIN_SLICE: Duration = Duration::from_millis(4);

/// The VM as its vCPU threads see it: where their MMIO and system-register
/// exits go, and what decides whether a vCPU may sleep. Called from any
/// vCPU thread; the machine's VM implements it.
pub trait VcpuEnv: Send + Sync {
    /// A guest load of `data.len()` bytes at `gpa`, outside RAM
    /// ([`VcpuIo::mmio_read`]).
    fn mmio_read(&self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault>;
    /// A guest store at `gpa`, outside RAM ([`VcpuIo::mmio_write`]).
    fn mmio_write(&self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault>;
    /// A trapped `MRS`: the value, or `None` if the VM does not have the
    /// register ([`VcpuIo::sysreg_read`]).
    fn sysreg_read(&self, vcpu: VcpuId, reg: SysReg) -> Option<u64>;
    /// A trapped `MSR`: whether the VM has the register
    /// ([`VcpuIo::sysreg_write`]).
    fn sysreg_write(&self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool;
    /// Whether `vcpu`'s IRQ line is asserted; `None` if the VMM cannot know
    /// (an in-kernel GIC signals the vCPU itself).
    fn irq_pending(&self, vcpu: VcpuId) -> Option<bool>;
    /// The vCPU's virtual timer output changed ([`VcpuIo::vtimer_level`]).
    fn vtimer_level(&self, vcpu: VcpuId, level: bool);
    /// Whether the `len` bytes at `gpa` are guest RAM (a PSCI CPU_ON entry
    /// point must be).
    fn is_ram(&self, gpa: u64, len: u64) -> bool;
    /// vCPU `vcpu` starts cold (PSCI CPU_ON): what the VM keeps of its core
    /// outside the backend (its EL1 physical timer) goes back to reset.
    fn reset_vcpu(&self, vcpu: VcpuId);
}

/// The backend's side of a vCPU's exits, handed on to the [`VcpuEnv`].
struct Io<'a>(&'a dyn VcpuEnv);

impl VcpuIo for Io<'_> {
    fn mmio_read(&mut self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        self.0.mmio_read(vcpu, gpa, data)
    }

    fn mmio_write(&mut self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        self.0.mmio_write(vcpu, gpa, data)
    }

    fn sysreg_read(&mut self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        self.0.sysreg_read(vcpu, reg)
    }

    fn sysreg_write(&mut self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        self.0.sysreg_write(vcpu, reg, value)
    }

    /// Never asserted with an in-kernel GIC, which signals the vCPU itself
    /// (the `hvf` backend does not ask then).
    fn irq_line(&mut self, vcpu: VcpuId) -> bool {
        self.0.irq_pending(vcpu) == Some(true)
    }

    fn vtimer_level(&mut self, vcpu: VcpuId, level: bool) {
        self.0.vtimer_level(vcpu, level);
    }
}

/// How the vCPUs start.
#[derive(Clone)]
pub enum Start {
    /// The boot CPU at the kernel entry; the others wait for PSCI CPU_ON.
    Boot(BootRegs),
    /// Every vCPU from a snapshot.
    Restore {
        /// Per vCPU, index order.
        states: Arc<Vec<VcpuState>>,
    },
}

/// Where the boot CPU starts (Linux arm64 boot protocol): the kernel entry
/// point (PC) and the device tree's guest-physical address (X0).
#[derive(Clone, Copy, Debug)]
pub struct BootRegs {
    /// The kernel's entry point, a GPA.
    pub entry: u64,
    /// The device tree blob's GPA.
    pub dtb: u64,
}

/// What a vCPU did with its turn.
enum Turn {
    /// It ran.
    Ran,
    /// It is off, or in WFI until an interrupt, a wake-up or this deadline.
    Waiting(Option<Instant>),
}

/// What every vCPU thread holds: the VM's hypervisor handle, the VM around
/// it and the run state.
struct Thread<'a, V> {
    vm: &'a V,
    env: &'a dyn VcpuEnv,
    run_state: &'a RunState,
}

/// A vCPU together with its run-loop state.
struct RunVcpu<V> {
    vcpu: V,
    /// Its reset state, for every start (PSCI CPU_ON).
    reset: ResetState,
    /// Set while the vCPU waits in WFI.
    wfi: Option<WfiWait>,
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
pub fn thread_groups(cpus: usize, round_robin: bool) -> Vec<Vec<VcpuId>> {
    if round_robin {
        vec![(0..cpus).collect()]
    } else {
        (0..cpus).map(|v| vec![v]).collect()
    }
}

/// Starts a thread per group of [`thread_groups`]; each runs its vCPUs from
/// `start` until the VM ends, and ends the VM if it fails (or panics).
/// `env`'s exits and `run_state`'s wake-ups.
pub fn spawn_threads<V: Vm + 'static>(
    vm: &Arc<V>,
    env: &Arc<dyn VcpuEnv>,
    run_state: &Arc<RunState>,
    groups: Vec<Vec<VcpuId>>,
    start: &Start,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for ids in groups {
        let (vm, env, run_state) = (vm.clone(), env.clone(), run_state.clone());
        let start = start.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("vcpu{}", ids[0]))
                .spawn(move || {
                    // A panic ends the VM with an error instead of leaving the
                    // other threads waiting for this one.
                    let _ended = EndOnPanic(&run_state);
                    // WFI sleeps until the guest's timer deadline.
                    crate::sync::punctual_wakeups();
                    let t = Thread {
                        vm: &*vm,
                        env: &*env,
                        run_state: &run_state,
                    };
                    if let Err(e) = t.run(&ids, start) {
                        run_state.finish(VmExit::Error(format!("{e:#}")));
                    }
                })?,
        );
    }
    Ok(threads)
}

impl<V: Vm> Thread<'_, V> {
    /// Runs vCPUs `ids` on the current thread until the VM ends.
    fn run(&self, ids: &[VcpuId], start: Start) -> anyhow::Result<()> {
        let Some(mut vcpus) = start_up(self.vm, self.run_state, ids, &start)? else {
            return Ok(());
        };
        let turns = self.run_state.turns(ids[0]);
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

        let mut io = Io(self.env);
        let mut cursor = 0;
        loop {
            let generation = {
                let c = self.run_state.lock();
                if c.exit.is_some() {
                    return Ok(());
                }
                if c.pause_requested() {
                    drop(c);
                    park(self.run_state, &mut vcpus);
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
                match self.take_turn(&mut vcpus[slot], &mut io, &turns, generation)? {
                    Turn::Ran => ran = true,
                    Turn::Waiting(Some(d)) => {
                        next_deadline = Some(next_deadline.map_or(d, |n| n.min(d)));
                    }
                    Turn::Waiting(None) => {}
                }
            }
            if !ran {
                let c = self.run_state.lock();
                if c.generation != generation || c.exit.is_some() || turns.any_urgent() {
                    continue;
                }
                match next_deadline {
                    Some(d) => {
                        let wait = d.saturating_duration_since(Instant::now());
                        drop(self.run_state.wait_for(c, wait));
                    }
                    None => {
                        drop(self.run_state.wait(c));
                    }
                }
            }
        }
    }

    /// Gives `rv` a turn at wake-up generation `generation`: starts it if PSCI
    /// CPU_ON asked for it, skips it while it is off or its WFI lasts, else runs
    /// it until its next exit and handles that.
    fn take_turn(
        &self,
        rv: &mut RunVcpu<V::Vcpu>,
        io: &mut Io<'_>,
        turns: &Turns,
        generation: u64,
    ) -> anyhow::Result<Turn> {
        let id = rv.vcpu.id();
        let power = self.run_state.lock().power[id];
        match power {
            VcpuPower::Off => return Ok(Turn::Waiting(None)),
            VcpuPower::OnPending { entry, context } => {
                rv.reset
                    .start(&mut rv.vcpu, entry, context)
                    .with_context(|| format!("cannot start vCPU {id}"))?;
                // Its physical timer is the machine's, not the backend's.
                self.env.reset_vcpu(id);
                self.run_state.lock().power[id] = VcpuPower::On;
                rv.wfi = None;
            }
            VcpuPower::On => {}
        }
        if let Some(wait) = rv.wfi {
            let due = wait.until.is_some_and(|d| d <= Instant::now());
            let pending = self.env.irq_pending(id);
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
                if psci::handle(&mut rv.vcpu, self.env, self.run_state)? == AfterPsci::Suspend {
                    rv.wfi = self.wfi_wait(&mut rv.vcpu, generation)?;
                }
            }
            VcpuExit::Wfi => rv.wfi = self.wfi_wait(&mut rv.vcpu, generation)?,
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

    /// How a vCPU that executed WFI (or CPU_SUSPEND) waits, taken at wake-up
    /// generation `generation`: not at all if its IRQ line is asserted;
    /// otherwise until its virtual timer deadline, if armed. With an in-kernel
    /// GIC the VMM cannot see the line, so the wait is also capped at
    /// [`KERNEL_GIC_WFI_MAX_SLEEP`] and ends on any device interrupt.
    fn wfi_wait(&self, vcpu: &mut V::Vcpu, generation: u64) -> hv::Result<Option<WfiWait>> {
        let pending = self.env.irq_pending(vcpu.id());
        if pending == Some(true) {
            return Ok(None);
        }
        let ns = deadline_ns(
            vcpu.sysreg(CNTV_CTL_EL0)?,
            vcpu.sysreg(CNTV_CVAL_EL0)?,
            self.vm.virtual_count(),
            self.vm.counter_frequency(),
        );
        let now = Instant::now();
        let mut until = ns.map(|ns| now + Duration::from_nanos(ns));
        if pending.is_none() {
            let cap = now + KERNEL_GIC_WFI_MAX_SLEEP;
            until = Some(until.map_or(cap, |u| u.min(cap)));
        }
        Ok(Some(WfiWait { until, generation }))
    }
}

/// A vCPU thread's start-up: creates vCPUs `ids`, keeps each one's reset
/// state, starts them as `start` says (the boot CPU at the kernel entry, or
/// every vCPU from its snapshot state), and waits until every vCPU of the VM
/// exists (and a restored in-kernel GIC's state is loaded) before any runs:
/// `hv_gic_create`'s topology is final once vCPUs run. A restored in-kernel
/// GIC's CPU-interface registers go in last. `None` if the VM ended first.
fn start_up<V: Vm>(
    vm: &V,
    run_state: &RunState,
    ids: &[VcpuId],
    start: &Start,
) -> anyhow::Result<Option<Vec<RunVcpu<V::Vcpu>>>> {
    let mut vcpus = Vec::with_capacity(ids.len());
    // A forked child's vCPUs, with the code they translated (`fork`).
    let mut inherited = fork::take_vcpus::<(V::Vcpu, ResetState)>().unwrap_or_default();
    for &id in ids {
        let (mut vcpu, reset) = match inherited.iter().position(|(v, _)| v.id() == id) {
            Some(i) => {
                let (v, reset) = inherited.swap_remove(i);
                let v = vm
                    .adopt_vcpu(v)
                    .with_context(|| format!("cannot take over vCPU {id}"))?;
                (v, reset)
            }
            None => {
                let mut vcpu = vm
                    .create_vcpu(id, mpidr(id))
                    .with_context(|| format!("cannot create vCPU {id}"))?;
                let reset = ResetState::of_new(&mut vcpu)
                    .with_context(|| format!("cannot read vCPU {id}'s reset state"))?;
                (vcpu, reset)
            }
        };
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
        run_state.set_kicker(id, vcpu.kicker());
        vcpus.push(RunVcpu {
            vcpu,
            reset,
            wfi: None,
        });
    }
    match run_state.created_wait_release() {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) => bail!("cannot restore the in-kernel GIC: {e}"),
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
    run_state.thread_ready();
    Ok(Some(vcpus))
}

/// Pause rendezvous: captures this thread's vCPUs (on their own thread, as
/// HVF requires) and waits until the pause ends, forking meanwhile if asked
/// ([`RunState::fork_parked`]).
fn park<V: Vcpu + 'static>(run_state: &RunState, vcpus: &mut Vec<RunVcpu<V>>) {
    let states: Vec<_> = vcpus
        .iter_mut()
        .map(|rv| {
            let id = rv.vcpu.id();
            (id, state::capture_vcpu(&mut rv.vcpu))
        })
        .collect();
    run_state.park(states, |job| fork_parked(job, vcpus));
}

/// Forks the process, guest RAM left out ([`fork`]); the child goes on with
/// `vcpus` (and their reset states) as `job` says and never returns
/// ([`fork::run_child`]). Returns the child's pid.
fn fork_parked<V: Vcpu + 'static>(
    job: fork::ForkJob,
    vcpus: &mut Vec<RunVcpu<V>>,
) -> Result<i32, String> {
    // SAFETY: the child runs only on this thread, which owns the vCPUs and
    // holds no lock of the VM's (the run state's is released); it uses none
    // of the parent's other objects (see `fork`), and ends with `_exit`.
    let pid = unsafe { fork::fork_process() }.map_err(|e| format!("fork: {e}"))?;
    if pid == 0 {
        let inherited: Vec<(V, ResetState)> = std::mem::take(vcpus)
            .into_iter()
            .map(|rv| (rv.vcpu, rv.reset))
            .collect();
        fork::run_child(job, inherited);
    }
    Ok(pid)
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
mod tests;
