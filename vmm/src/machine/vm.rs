//! The VMM core of one running VM ([`Vmm`]): it owns guest RAM, the MMIO
//! bus, the interrupt controller, the devices, the run state and the
//! guest's clock, is built from a [`Plan`], starts the vCPU threads, and
//! pauses and resumes them. Snapshots and the front-ends use it through
//! its methods; the vCPU threads see it as their [`VcpuEnv`].

use crate::arch::layout;
use crate::arch::sysreg::SysReg;
use crate::devices::virtio::net::host_end;
use crate::devices::virtio::vsock::VsockHost;
use crate::devices::{IrqLine, MmioBus, Persist};
use crate::hv::{Hypervisor, MmioFault, VcpuId, Vm};
use crate::machine::device_manager::irqchip::{Irqchip, IrqchipState, PendingKernelGicState};
use crate::machine::device_manager::root_disk::WorkDir;
use crate::machine::device_manager::{
    DeviceArgs, Devices, DevicesState, NetDeviceArgs, VsockDeviceArgs,
};
use crate::machine::fork::ForkJob;
use crate::machine::ops::PauseError;
use crate::machine::plan::{host_random, Plan};
use crate::machine::vcpu::clock::{Clock, ClockState};
use crate::machine::vcpu::run_state::{ParkError, RunState, VmExit};
use crate::machine::vcpu::state::{VcpuPower, VcpuState};
use crate::machine::vcpu::{self, Start, VcpuEnv};
use crate::memory::GuestRam;
use crate::sync::Locked;
use anyhow::Context;
use snapshot_store::DiskSource;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the vCPU threads and the device interrupt lines share.
struct Core {
    ram: Arc<GuestRam>,
    bus: MmioBus,
    irqchip: Irqchip,
    devices: Devices,
    run_state: Arc<RunState>,
    clock: Clock,
}

/// A running VM.
pub struct Vmm<V: Vm> {
    vm: Arc<V>,
    core: Arc<Core>,
    /// The vCPUs of each vCPU thread.
    groups: Vec<Vec<VcpuId>>,
    /// Serialises pausing and resuming (the pause verb's and snapshots').
    pausing: Mutex<()>,
    /// The vCPUs' states while the pause verb holds the VM paused.
    held: Mutex<Option<Vec<VcpuState>>>,
    /// The VM's disk as snapshots read it.
    disk: Arc<dyn DiskSource>,
    /// The kernel command line, which snapshots record.
    cmdline: String,
    /// A restored VM's work directory, with its disk's overlay file. Kept
    /// for as long as the VM runs; dropping it removes the directory
    /// ([`Vmm::remove_host_files`]).
    work_dir: Mutex<Option<WorkDir>>,
}

/// How long each part of [`Vmm::build`] took (a restore reports them).
#[derive(Debug, Default)]
pub struct BuildTimes {
    /// Creating the hypervisor's VM (it maps RAM).
    pub vm_create: Duration,
    /// The interrupt controller.
    pub gic: Duration,
    /// The devices, the bus and the clock.
    pub devices: Duration,
}

/// What [`Vmm::build`] hands on besides the VM: how its vCPUs start.
pub struct Launch {
    /// How the vCPUs start.
    pub start: Start,
    /// An in-kernel GIC's saved state (a restore), loaded once every vCPU
    /// exists and before any runs.
    pub kernel_gic_state: Option<PendingKernelGicState>,
    /// The layer the next snapshot is a child of (a restore).
    pub parent: Option<snapshot_store::Layer>,
    /// A restore's snapshot records that its guest agent had answered.
    pub agent_answered: bool,
    /// How long the build took, by part.
    pub times: BuildTimes,
}

/// The stopped VM's state for a snapshot, but for the vCPUs' registers
/// ([`Stopped::vcpus`]), RAM and the disk.
pub struct Captured {
    /// Each vCPU's PSCI power state, index order.
    pub power: Vec<VcpuPower>,
    /// The guest's clock (frozen at the stop).
    pub clock: ClockState,
    /// The interrupt controller.
    pub gic: IrqchipState,
    /// The devices.
    pub devices: DevicesState,
}

/// Every vCPU parked at an instruction boundary and the guest's clock
/// stopped ([`Vmm::stop`]) until [`Vmm::restart`]; meanwhile the pause
/// verbs wait.
pub struct Stopped<'a> {
    /// The vCPUs' states, index order.
    pub vcpus: Vec<VcpuState>,
    /// The VM was paused by the pause verb already, and stays so.
    pub was_paused: bool,
    _pausing: MutexGuard<'a, ()>,
}

impl<V: Vm + 'static> Vmm<V> {
    /// Builds the VM `plan` describes on `hv`: the hypervisor's VM, the
    /// interrupt controller, the devices on the bus and the clock; a
    /// restore's from its saved state. The console UART writes to
    /// `console`.
    pub fn build<H: Hypervisor<Vm = V>>(
        hv: &H,
        plan: Plan,
        console: Box<dyn std::io::Write + Send>,
    ) -> anyhow::Result<(Self, Launch)> {
        tracing::info!("GIC mode: {}", plan.gic);
        let mut times = BuildTimes::default();
        // The VM first: it maps RAM and, for an in-kernel GIC, creates the
        // GIC (before any vCPU, as Hypervisor.framework requires).
        let t = Instant::now();
        let vm = Arc::new(hv.create_vm(plan.ram.clone(), plan.cpus, plan.gic)?);
        times.vm_create = t.elapsed();

        let t = Instant::now();
        let saved = plan.saved.as_ref();
        let (irqchip, kernel_gic_state) = Irqchip::build(
            plan.gic,
            vm.kernel_gic(),
            plan.cpus,
            saved.map(|s| &s.gic),
            H::NAME,
        )?;
        times.gic = t.elapsed();

        let t = Instant::now();
        let disk = plan.disk.open()?;
        let groups = vcpu::thread_groups(plan.cpus, H::ROUND_ROBIN);
        let run_state = Arc::new(RunState::new(plan.power, &groups));
        let net = plan
            .net
            .as_ref()
            .map(|n| host_end::open(&n.host).map(|end| NetDeviceArgs { end, mac: n.mac }))
            .transpose()?;
        let vsock = plan
            .vsock
            .as_ref()
            .map(|v| VsockHost::bind(&v.uds).map(|host| VsockDeviceArgs { host, cid: v.cid }))
            .transpose()?;
        let (chip, rs) = (irqchip.clone(), run_state.clone());
        let args = DeviceArgs {
            ram: plan.ram.clone(),
            irq: Box::new(move |intid| SpiLine::connect(intid, chip.clone(), rs.clone())),
            console,
            start: Instant::now(),
            disk: disk.disk,
            disk_len: disk.len,
            generation_id: host_random()?,
            net,
            vsock,
        };
        let devices = match saved {
            None => Devices::new(args)?,
            Some(s) => Devices::restore(args, &s.devices)?,
        };
        // The guest's clock last, just before the vCPUs: a restore's count
        // continues from here.
        let (chip, rs) = (irqchip.clone(), run_state.clone());
        let clock = Clock::new(
            vm.clone(),
            plan.cpus,
            saved.map(|s| &s.clock),
            Box::new(move |vcpu, level| {
                chip.ptimer_level(vcpu, level);
                rs.interrupts_changed(chip.pending_vcpus());
            }),
        )
        .context("cannot start the physical timer thread")?;
        // A round-robin backend's timer asks for its vCPU's turn (and the
        // run state is dropped with the VM, so hold it weakly).
        let rs = Arc::downgrade(&run_state);
        vm.set_run_request(Arc::new(move |vcpu| {
            if let Some(r) = rs.upgrade() {
                r.run_soon(vcpu, false);
            }
        }));
        let core = Arc::new(Core {
            bus: bus(&irqchip, &devices, plan.cpus),
            ram: plan.ram,
            irqchip,
            devices,
            run_state,
            clock,
        });
        times.devices = t.elapsed();
        let vmm = Vmm {
            vm,
            core,
            groups,
            pausing: Mutex::new(()),
            held: Mutex::new(None),
            disk: disk.source,
            cmdline: plan.cmdline,
            work_dir: Mutex::new(disk.work),
        };
        let launch = Launch {
            start: plan.start,
            kernel_gic_state,
            parent: plan.parent,
            agent_answered: saved.and_then(|s| s.agent_answered) == Some(true),
            times,
        };
        Ok((vmm, launch))
    }

    /// Starts the vCPU threads, each group's vCPUs from `start`, and lets
    /// them run once every vCPU exists, a restored in-kernel GIC's state
    /// (`kernel_gic_state`) loaded in between. Returns the threads, and how
    /// long the wait for the vCPUs and the GIC's load took if there was one.
    pub fn start_vcpus(
        &self,
        start: &Start,
        kernel_gic_state: Option<PendingKernelGicState>,
    ) -> anyhow::Result<(Vec<JoinHandle<()>>, Option<Duration>)> {
        let env: Arc<dyn VcpuEnv> = self.core.clone();
        let rs = &self.core.run_state;
        let threads = vcpu::spawn_threads(&self.vm, &env, rs, self.groups.clone(), start)
            .context("cannot spawn a vCPU thread")?;
        let t = Instant::now();
        rs.wait_created();
        let (released, gic) = match kernel_gic_state {
            Some(gic) => (gic.load().map_err(Arc::new), Some(t.elapsed())),
            None => (Ok(()), None),
        };
        rs.release(released);
        Ok((threads, gic))
    }
}

impl<V: Vm> Vmm<V> {
    /// The hypervisor's VM.
    pub fn hv_vm(&self) -> &V {
        &self.vm
    }

    /// Guest RAM.
    pub fn ram(&self) -> &Arc<GuestRam> {
        &self.core.ram
    }

    /// The devices.
    pub fn devices(&self) -> &Devices {
        &self.core.devices
    }

    /// The interrupt controller.
    pub fn irqchip(&self) -> &Irqchip {
        &self.core.irqchip
    }

    /// Number of vCPUs.
    pub fn vcpus(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    /// The VM's disk as snapshots read it.
    pub fn disk(&self) -> &Arc<dyn DiskSource> {
        &self.disk
    }

    /// The kernel command line the guest booted with.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// Waits until every vCPU thread is ready to run (or the VM ended).
    pub fn wait_ready(&self) {
        self.core.run_state.wait_ready();
    }

    /// Ends the VM (the first reason wins) and stops every vCPU.
    pub fn finish(&self, why: VmExit) {
        self.core.run_state.finish(why);
    }

    /// Whether the VM has ended.
    pub fn finished(&self) -> bool {
        self.core.run_state.finished()
    }

    /// Waits for the VM to end and says why.
    pub fn wait_exit(&self) -> VmExit {
        self.core.run_state.wait_exit()
    }

    /// Once the VM has ended and its snapshots are done: removes what it
    /// made on the host file system (the vsock device's socket file, a
    /// restored VM's working directory with its disk), whichever threads
    /// still hold the VM (an idle control-socket client, the console
    /// thread waiting for input).
    pub fn remove_host_files(&self) {
        self.core.devices.remove_host_files();
        drop(self.work_dir.locked().take());
    }

    /// The pause verb: parks every vCPU and stops the guest's clock until
    /// [`Vmm::resume`].
    pub fn pause(&self) -> Result<(), PauseError> {
        let _p = self.pausing.locked();
        if self.held.locked().is_some() {
            return Err(PauseError::AlreadyPaused);
        }
        let states = self.park()?;
        *self.held.locked() = Some(states);
        Ok(())
    }

    /// The resume verb: ends what [`Vmm::pause`] began.
    pub fn resume(&self) -> Result<(), PauseError> {
        let _p = self.pausing.locked();
        if self.held.locked().take().is_none() {
            return Err(PauseError::NotPaused);
        }
        self.unpark();
        Ok(())
    }

    /// Whether the pause verb holds the VM paused.
    pub fn paused(&self) -> bool {
        self.held.locked().is_some()
    }

    /// Stops the VM for a snapshot: every vCPU parked at an instruction
    /// boundary and the clock stopped, or, if the pause verb holds it
    /// paused, its held states.
    pub fn stop(&self) -> Result<Stopped<'_>, PauseError> {
        let pausing = self.pausing.locked();
        let held = self.held.locked().clone();
        let (vcpus, was_paused) = match held {
            Some(states) => (states, true),
            None => (self.park()?, false),
        };
        Ok(Stopped {
            vcpus,
            was_paused,
            _pausing: pausing,
        })
    }

    /// Lets the vCPUs that [`Vmm::stop`] parked run again; a VM the pause
    /// verb holds stays paused.
    pub fn restart(&self, stopped: Stopped<'_>) {
        if !stopped.was_paused {
            self.unpark();
        }
    }

    /// Parks every vCPU thread and stops the clock; the clock goes on and
    /// the vCPUs run again if that fails.
    fn park(&self) -> Result<Vec<VcpuState>, PauseError> {
        let c = &self.core;
        c.run_state.pause(&c.clock).map_err(|e| {
            c.run_state.resume(&c.clock);
            match e {
                ParkError::ShuttingDown => PauseError::ShuttingDown,
                e => PauseError::Capture(e.into()),
            }
        })
    }

    /// With the VM stopped ([`Vmm::stop`]): forks the process on the thread that owns the vCPUs (a
    /// [`crate::hv::Hypervisor::FORKS_VCPUS`] backend's), the child going on
    /// as `job` says ([`crate::machine::fork`]). Returns the child's pid.
    pub fn fork_stopped(&self, _stopped: &Stopped<'_>, job: ForkJob) -> Result<i32, String> {
        self.core.run_state.fork_parked(job)
    }

    fn unpark(&self) {
        self.core.run_state.resume(&self.core.clock);
    }

    /// What a snapshot records of the VM `stopped` (its devices prepared,
    /// [`Devices::prepare_save`]) besides the vCPUs' registers, RAM and the
    /// disk.
    pub fn capture(&self, _stopped: &Stopped<'_>) -> crate::hv::Result<Captured> {
        let c = &self.core;
        Ok(Captured {
            power: c.run_state.lock().power.clone(),
            clock: c.clock.save(),
            gic: c.irqchip.save()?,
            devices: c.devices.save(),
        })
    }

    /// Hands console input to the UART; returns how many leading bytes it
    /// took.
    pub fn console_input(&self, bytes: &[u8]) -> usize {
        self.core.devices.console_input(bytes)
    }
}

/// The bus's fault as the backend takes it (an external abort).
fn abort(f: crate::devices::bus::MmioFault) -> MmioFault {
    MmioFault {
        gpa: f.gpa,
        len: f.len,
        reason: f.reason,
    }
}

impl VcpuEnv for Core {
    fn mmio_read(&self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        let r = self.bus.read(vcpu, gpa, data).map_err(abort);
        if let Err(e) = &r {
            crate::warn_ratelimited!("vCPU {vcpu}: {e}");
        }
        r
    }

    fn mmio_write(&self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        let r = self.bus.write(vcpu, gpa, data).map_err(abort);
        match &r {
            Err(e) => crate::warn_ratelimited!("vCPU {vcpu}: {e}"),
            // A distributor or redistributor write (enable, pending, routing,
            // wake) can make an interrupt pending on another vCPU, which may
            // be waiting in WFI.
            Ok(()) if (layout::GICD_BASE..layout::GIC_WINDOW_END).contains(&gpa) => {
                self.interrupts_changed();
            }
            Ok(()) => {}
        }
        r
    }

    fn sysreg_read(&self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        if let Some(v) = self.clock.sysreg_read(vcpu, reg) {
            return Some(v);
        }
        let v = self.irqchip.sysreg_read(vcpu, reg);
        if v.is_none() {
            crate::warn_ratelimited!("vCPU {vcpu}: read of unimplemented system register {reg}");
        }
        v
    }

    fn sysreg_write(&self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        if self.clock.sysreg_write(vcpu, reg, value) {
            return true;
        }
        let Some(targets) = self.irqchip.sysreg_write(vcpu, reg, value) else {
            crate::warn_ratelimited!("vCPU {vcpu}: write of unimplemented system register {reg}");
            return false;
        };
        if !targets.is_empty() {
            self.interrupts_changed();
        }
        true
    }

    fn irq_pending(&self, vcpu: VcpuId) -> Option<bool> {
        self.irqchip.irq_pending(vcpu)
    }

    fn vtimer_level(&self, vcpu: VcpuId, level: bool) {
        self.irqchip.vtimer_level(vcpu, level);
    }

    fn is_ram(&self, gpa: u64, len: u64) -> bool {
        self.ram.contains(gpa, len)
    }

    fn reset_vcpu(&self, vcpu: VcpuId) {
        self.clock.reset_timer(vcpu);
    }
}

impl Core {
    /// The GIC's pending state may have changed for other vCPUs: wakes and
    /// kicks those it concerns.
    fn interrupts_changed(&self) {
        self.run_state
            .interrupts_changed(self.irqchip.pending_vcpus());
    }
}

/// A device's level-triggered SPI: drives the interrupt controller's input
/// and, when raised, wakes the vCPUs the interrupt may be for.
struct SpiLine {
    intid: u32,
    irqchip: Irqchip,
    run_state: Arc<RunState>,
}

impl SpiLine {
    /// The line of SPI `intid` at `irqchip`, waking vCPUs through
    /// `run_state`.
    fn connect(intid: u32, irqchip: Irqchip, run_state: Arc<RunState>) -> Arc<dyn IrqLine> {
        Arc::new(SpiLine {
            intid,
            irqchip,
            run_state,
        })
    }
}

impl IrqLine for SpiLine {
    fn set_level(&self, level: bool) {
        self.irqchip.set_spi(self.intid, level);
        if level {
            self.run_state
                .interrupts_changed(self.irqchip.pending_vcpus());
        }
    }
}

/// The MMIO bus: the interrupt controller's frames (a userspace GIC's) and
/// the devices' regions.
fn bus(irqchip: &Irqchip, devices: &Devices, cpus: usize) -> MmioBus {
    let mut bus = MmioBus::new();
    for (name, base, size, dev) in irqchip
        .mmio_regions(cpus)
        .into_iter()
        .chain(devices.regions())
    {
        bus.insert(name, base, size, dev)
            .expect("the layout table has no overlapping regions");
    }
    bus
}
