//! Building a VM from a configuration and running it: the vCPU run loop,
//! PSCI, WFI sleeping, interrupt wiring and the console input path.
//!
//! Threads: one per vCPU, or one for all vCPUs round-robin when the backend
//! asks for it ([`Hypervisor::ROUND_ROBIN`]); one console input thread; and
//! the caller's thread, which waits for the VM to end. Lock order: a device
//! lock may be held while taking the GIC lock (interrupt lines), never the
//! reverse; no lock is held across [`Vcpu::run`].

use crate::arch::exception::{PSTATE_DAIF, PSTATE_EL1H};
use crate::arch::layout;
use crate::arch::psci::{self, PowerState, PsciAction, PsciCall, PsciCpus};
use crate::arch::sysreg::SysReg;
use crate::arch::sysreg::{CNTV_CTL_EL0, CNTV_CVAL_EL0};
use crate::arch::{fdt, image};
use crate::console::{self, EscapeParser, Key};
use crate::devices::boot_timer::BootTimer;
use crate::devices::gicv3::Gicv3;
use crate::devices::pl011::Pl011;
use crate::devices::virtio::block::{BackingFile, Block};
use crate::devices::virtio::mmio::VirtioMmio;
use crate::devices::{IrqLine, MmioBus};
use crate::hv::exit_decision::vtimer_deadline_ns;
use crate::hv::gic::{wfi_wakes, KERNEL_GIC_WFI_MAX_SLEEP};
use crate::hv::{
    self, GicMode, Hypervisor, Kick, MmioFault, Reg, Vcpu, VcpuExit, VcpuId, VcpuIo, Vm,
};
use crate::memory::GuestRam;
use state::{GicSnapshot, MachineState, VcpuPower, VcpuState};
use crate::sync::{Locked, Waited};
use anyhow::{bail, Context};
use irqchip::Irqchip;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

/// PSTATE for entering the kernel: EL1h with D, A, I and F masked
/// (Linux arm64 boot protocol: "all forms of interrupts must be masked").
const PSTATE_EL1H_DAIF: u64 = PSTATE_EL1H | PSTATE_DAIF;

/// Time slice of one vCPU when several share a host thread.
const ROUND_ROBIN_SLICE: Duration = Duration::from_millis(4);

mod irqchip;
mod restore;
pub mod state;
mod take;

/// A fresh boot of a kernel.
#[derive(Debug, Clone)]
pub struct FreshBoot {
    /// Linux arm64 `Image`.
    pub kernel: PathBuf,
    /// Raw disk image for `/dev/vda`, opened read-write.
    pub disk: PathBuf,
    /// Guest RAM in bytes.
    pub mem_bytes: u64,
    /// Number of vCPUs (1..=[`layout::MAX_VCPUS`]).
    pub cpus: usize,
    /// Kernel command line.
    pub cmdline: String,
}

/// Where the VM comes from.
#[derive(Debug, Clone)]
pub enum BootSource {
    /// Boot a kernel.
    Fresh(FreshBoot),
    /// Restore a snapshot chain: `NAME` or `NAME+N` (see
    /// `snapshot_store::Spec`).
    Restore {
        /// The chain to restore.
        spec: String,
    },
}

/// Snapshot options.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// The snapshot store directory.
    pub store: PathBuf,
    /// Name of the first snapshot taken with Ctrl-A s; later ones in the same
    /// run get `.2`, `.3`, ... appended. `None`: Ctrl-A s is refused.
    pub name: Option<String>,
    /// Track dirty pages (write-protect RAM), so snapshots after the first
    /// (or after a restore) are diffs.
    pub track_dirty: bool,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    /// A kernel or a snapshot.
    pub source: BootSource,
    /// The interrupt controller asked for (`boot --gic`). `None`: the
    /// userspace GIC for a fresh boot, the snapshot's mode for a restore. A
    /// restore refuses a mode that differs from the snapshot's.
    pub gic: Option<GicMode>,
    /// Snapshot settings.
    pub snapshots: SnapshotOptions,
}

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest called PSCI SYSTEM_OFF.
    PowerOff,
    /// The guest called PSCI SYSTEM_RESET (the VMM exits rather than reboots).
    Reset,
    /// The user pressed Ctrl-A x.
    Quit,
    /// A vCPU hit something the VMM cannot handle.
    Error(String),
}

/// State guarded by one mutex and its condition variable: the wake-up
/// generation counter, vCPU power states and the VM's end.
struct Control {
    generation: u64,
    power: Vec<VcpuPower>,
    exit: Option<VmExit>,
    /// A snapshot wants every vCPU thread parked.
    pause: bool,
    /// vCPU threads parked for `pause`.
    parked: usize,
    /// Each vCPU's state, captured by its own thread when it parks.
    captured: Vec<Option<Result<VcpuState, String>>>,
    /// vCPU threads whose vCPUs are created and ready to run.
    ready: usize,
    /// vCPU threads whose vCPUs are created (restore with an in-kernel GIC:
    /// its state is loaded once all are, before any runs).
    created: usize,
    /// The in-kernel GIC's state has been loaded (or failed to load).
    gic_loaded: Option<Result<(), String>>,
}

/// State shared by every thread of a running VM.
struct Shared {
    ram: Arc<GuestRam>,
    bus: MmioBus,
    irqchip: Irqchip,
    /// The console UART, fed by the console input thread.
    uart: Arc<Mutex<Pl011>>,
    boot_timer: Arc<Mutex<BootTimer>>,
    blk: Arc<Mutex<VirtioMmio<Block>>>,
    /// Number of vCPU threads.
    threads: usize,
    /// Threads recording snapshot layers' verified-file caches; joined at exit.
    cache_writers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    control: Mutex<Control>,
    wake: Condvar,
    kicks: Mutex<Vec<Option<Arc<dyn Kick>>>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.locked()
    }

    fn kick_where(&self, which: impl Fn(VcpuId) -> bool) {
        let kicks = self.kicks.locked();
        for (id, k) in kicks.iter().enumerate() {
            if let (true, Some(k)) = (which(id), k) {
                k.kick();
            }
        }
    }

    /// Ends the VM (the first reason wins) and stops every vCPU.
    fn finish(&self, why: VmExit) {
        {
            let mut c = self.lock();
            if c.exit.is_none() {
                c.exit = Some(why);
            }
            c.generation += 1;
        }
        self.wake.notify_all();
        self.kick_where(|_| true);
    }

    fn finished(&self) -> bool {
        self.lock().exit.is_some()
    }

    /// Called after the GIC's pending state may have changed for other
    /// vCPUs. With the userspace GIC, wakes and kicks the vCPUs that now
    /// have an interrupt pending; with an in-kernel GIC (which delivers to
    /// running vCPUs itself) wakes the vCPUs sleeping in WFI, which cannot
    /// tell whether it was for them.
    fn interrupts_changed(&self) {
        match self.irqchip.pending_vcpus() {
            Some(pending) if pending.is_empty() => {}
            Some(pending) => {
                self.lock().generation += 1;
                self.wake.notify_all();
                self.kick_where(|v| pending.contains(v));
            }
            None => {
                self.lock().generation += 1;
                self.wake.notify_all();
            }
        }
    }
}

/// Ends the VM with an error if dropped while its thread panics.
struct EndOnPanic<'a>(&'a Shared);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            self.0
                .finish(VmExit::Error(format!("thread {name} panicked (see above)")));
        }
    }
}

/// A level-triggered SPI from a device to the GIC.
struct SpiLine {
    intid: u32,
    shared: std::sync::Weak<Shared>,
    irqchip: Irqchip,
}

impl IrqLine for SpiLine {
    fn set_level(&self, level: bool) {
        self.irqchip.set_spi(self.intid, level);
        if level {
            if let Some(shared) = self.shared.upgrade() {
                shared.interrupts_changed();
            }
        }
    }
}

/// The VMM side of vCPU exits ([`VcpuIo`]).
struct Io<'a> {
    shared: &'a Shared,
}

impl VcpuIo for Io<'_> {
    fn mmio_read(&mut self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        let r = self.shared.bus.read(vcpu, gpa, data);
        if let Err(e) = &r {
            crate::warn_ratelimited!("vCPU {vcpu}: {e}");
        }
        r
    }

    fn mmio_write(&mut self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        let r = self.shared.bus.write(vcpu, gpa, data);
        match &r {
            Err(e) => crate::warn_ratelimited!("vCPU {vcpu}: {e}"),
            // A distributor or redistributor write (enable, pending, routing,
            // wake) can make an interrupt pending on another vCPU, which may
            // be waiting in WFI.
            Ok(()) if (layout::GICD_BASE..layout::GIC_WINDOW_END).contains(&gpa) => {
                self.shared.interrupts_changed();
            }
            Ok(()) => {}
        }
        r
    }

    fn sysreg_read(&mut self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        let v = self.shared.irqchip.sysreg_read(vcpu, reg);
        if v.is_none() {
            crate::warn_ratelimited!("vCPU {vcpu}: read of unimplemented system register {reg}");
        }
        v
    }

    fn sysreg_write(&mut self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        let Some(targets) = self.shared.irqchip.sysreg_write(vcpu, reg, value) else {
            crate::warn_ratelimited!("vCPU {vcpu}: write of unimplemented system register {reg}");
            return false;
        };
        if !targets.is_empty() {
            self.shared.interrupts_changed();
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

/// How the vCPUs start.
#[derive(Clone)]
enum Start {
    /// The boot CPU at the kernel entry; the others wait for PSCI CPU_ON.
    Boot(BootRegs),
    /// Every vCPU from a snapshot.
    Restore {
        /// Per vCPU, index order.
        states: Arc<Vec<VcpuState>>,
        /// An in-kernel GIC's state is loaded once every vCPU is created;
        /// the vCPU threads wait for it before their CPU-interface registers.
        kernel_gic: bool,
    },
}

/// Everything a VM needs before its devices are built.
struct Plan {
    ram: Arc<GuestRam>,
    cpus: usize,
    disk: PlanDisk,
    cmdline: String,
    gic: GicMode,
    start: Start,
    power: Vec<VcpuPower>,
    /// Device states to apply (restore).
    devices: Option<Box<MachineState>>,
    /// The layer the next snapshot is a child of (restore with tracking).
    parent: Option<snapshot_store::Layer>,
}

/// The VM's disk image.
enum PlanDisk {
    /// The user's image, open read-write (a fresh boot).
    Open { file: std::fs::File, path: PathBuf },
    /// A restored VM's private copy of the snapshot's image, still being made.
    Copying(restore::CopyingDisk),
}

/// Boots or restores `cfg` on hypervisor `hv` and runs it until it ends.
pub fn run<H: Hypervisor>(hv: H, cfg: &MachineConfig) -> anyhow::Result<VmExit>
where
    H::Vm: 'static,
{
    let t0 = Instant::now();
    let mut stages = restore::Stages::default();
    if let Some(name) = &cfg.snapshots.name {
        snapshot_store::validate_name(name)?;
        let store = &cfg.snapshots.store;
        if snapshot_store::Store::open(store).is_ok_and(|s| s.contains(name)) {
            bail!(
                "snapshot '{name}' already exists in {}; choose another --name",
                store.display()
            );
        }
    }
    let plan = match &cfg.source {
        BootSource::Fresh(f) => {
            let gic = cfg.gic.unwrap_or_default();
            hv.check_gic_mode(gic)?;
            plan_fresh(f, gic)?
        }
        BootSource::Restore { spec } => {
            restore::plan(&hv, spec, cfg.gic, &cfg.snapshots, t0, &mut stages)?
        }
    };
    let cpus = plan.cpus;
    let ram = plan.ram.clone();
    tracing::info!("GIC mode: {}", plan.gic);

    // The VM first: it maps RAM and, for an in-kernel GIC, creates the GIC
    // (before any vCPU, as Hypervisor.framework requires).
    let t = Instant::now();
    let vm = Arc::new(hv.create_vm(ram.clone(), cpus, plan.gic)?);
    stages.vm_create = t.elapsed();

    let t = Instant::now();
    // An in-kernel GIC's saved state is loaded once the vCPUs exist.
    let mut kernel_gic_state = None;
    let irqchip = match (plan.gic, vm.kernel_gic(), plan.devices.as_deref()) {
        (GicMode::Userspace, _, None) => Irqchip::Userspace(Arc::new(Mutex::new(Gicv3::new(cpus)))),
        (GicMode::Userspace, _, Some(st)) => match &st.gic {
            GicSnapshot::Userspace(g) => Irqchip::Userspace(Arc::new(Mutex::new(
                Gicv3::restore(cpus, g).context("cannot restore the GIC")?,
            ))),
            GicSnapshot::Hvf(_) => bail!("the snapshot's GIC state is not the userspace GIC's"),
        },
        (GicMode::Hvf, Some(k), st) => {
            if let Some(st) = st {
                match &st.gic {
                    GicSnapshot::Hvf(blob) => kernel_gic_state = Some((k.clone(), blob.clone())),
                    GicSnapshot::Userspace(_) => {
                        bail!("the snapshot's GIC state is not the in-kernel GIC's")
                    }
                }
            }
            Irqchip::Kernel(k)
        }
        (GicMode::Hvf, None, _) => bail!(
            "the {} backend created the VM without an in-kernel GIC",
            H::NAME
        ),
    };
    stages.gic = t.elapsed();

    let t = Instant::now();
    // A restored VM's working disk is still being copied: the block device
    // waits for it on first use. `_copying` outlives the device's copy of
    // the wait and removes the work directory at exit.
    let mut _copying = None;
    let blk_region = layout::virtio_mmio(layout::VIRTIO_BLK_SLOT);
    let (blk, disk_path) = match plan.disk {
        PlanDisk::Open { file, path } => (
            Block::new(file, false, "ignition-vda")
                .with_context(|| format!("cannot use disk image {}", path.display()))?,
            path,
        ),
        PlanDisk::Copying(mut copy) => {
            let backing = BackingFile::pending(copy.take_wait());
            let blk = Block::with_backing(backing, copy.len, false, "ignition-vda");
            let path = copy.path.clone();
            _copying = Some(copy);
            (blk, path)
        }
    };
    let vm_start = Instant::now();
    let shared = Arc::new_cyclic(|weak: &std::sync::Weak<Shared>| {
        let spi = |intid: u32| -> Arc<dyn IrqLine> {
            Arc::new(SpiLine {
                intid,
                shared: weak.clone(),
                irqchip: irqchip.clone(),
            })
        };
        let mut bus = MmioBus::new();
        let mut add = |name, base, size, dev| {
            bus.insert(name, base, size, dev)
                .expect("the layout table has no overlapping regions");
        };
        for (name, base, size, dev) in irqchip.mmio_regions(cpus) {
            add(name, base, size, dev);
        }
        let uart = Arc::new(Mutex::new(Pl011::new(
            Box::new(std::io::stdout()),
            spi(layout::PL011.intid.expect("PL011 has an interrupt")),
        )));
        add(
            "pl011",
            layout::PL011.base,
            layout::PL011.size,
            uart.clone(),
        );
        let boot_timer = Arc::new(Mutex::new(BootTimer::new(
            vm_start,
            Box::new(|elapsed: Duration| console::message(&BootTimer::message(elapsed))),
        )));
        add(
            "boot-timer",
            layout::BOOT_TIMER.base,
            layout::BOOT_TIMER.size,
            boot_timer.clone(),
        );
        let blk = Arc::new(Mutex::new(
            VirtioMmio::new(
                blk,
                ram.clone(),
                spi(blk_region.intid.expect("virtio slots have interrupts")),
            )
            .expect("a fresh virtio-blk transport is valid"),
        ));
        add("virtio-blk", blk_region.base, blk_region.size, blk.clone());
        let threads = if H::ROUND_ROBIN { 1 } else { cpus };
        Shared {
            ram: ram.clone(),
            bus,
            irqchip: irqchip.clone(),
            uart,
            boot_timer,
            blk,
            threads,
            cache_writers: Mutex::new(Vec::new()),
            control: Mutex::new(Control {
                generation: 0,
                power: plan.power.clone(),
                exit: None,
                pause: false,
                parked: 0,
                captured: vec![None; cpus],
                ready: 0,
                created: 0,
                gic_loaded: None,
            }),
            wake: Condvar::new(),
            kicks: Mutex::new(vec![None; cpus]),
        }
    });
    if let Some(st) = &plan.devices {
        restore::apply_devices(&shared, st)?;
    }
    stages.devices = t.elapsed();

    if cfg.snapshots.track_dirty {
        vm.rearm_dirty_tracking()
            .context("cannot start dirty tracking")?;
        ram.vmm_dirty().reset();
    }

    let groups: Vec<Vec<VcpuId>> = if H::ROUND_ROBIN {
        vec![(0..cpus).collect()]
    } else {
        (0..cpus).map(|v| vec![v]).collect()
    };
    let _raw = console::RawTerminal::enter().context("cannot put the terminal into raw mode")?;
    let mut snapshotter = take::Snapshotter::new(
        vm.clone(),
        shared.clone(),
        &cfg.snapshots,
        plan.parent,
        disk_path.clone(),
        plan.cmdline.clone(),
        H::NAME,
    );
    spawn_console_input(shared.clone(), Box::new(move || snapshotter.take()));
    let t = Instant::now();
    let mut threads = Vec::new();
    for ids in groups {
        let (shared, vm) = (shared.clone(), vm.clone());
        let start = plan.start.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("vcpu{}", ids[0]))
                .spawn(move || {
                    // A panic ends the VM with an error instead of leaving the
                    // other threads waiting for this one.
                    let _ended = EndOnPanic(&shared);
                    if let Err(e) = vcpu_thread(&*vm, &shared, &ids, start) {
                        shared.finish(VmExit::Error(format!("{e:#}")));
                    }
                })
                .context("cannot spawn a vCPU thread")?,
        );
    }
    if let Some((kgic, blob)) = kernel_gic_state {
        // Every vCPU exists; none runs until its thread sees `gic_loaded`
        // and has written its CPU-interface registers (QEMU's order: the
        // GIC's state, then each vCPU's ICC registers).
        let t = Instant::now();
        let mut c = shared.lock();
        while c.created < shared.threads && c.exit.is_none() {
            c = shared.wake.waited(c);
        }
        drop(c);
        let loaded = kgic
            .restore(&blob)
            .map_err(|e| format!("cannot restore the in-kernel GIC: {e}"));
        shared.lock().gic_loaded = Some(loaded);
        shared.wake.notify_all();
        stages.gic += t.elapsed();
    }
    if let BootSource::Restore { .. } = cfg.source {
        let mut c = shared.lock();
        while c.ready < shared.threads && c.exit.is_none() {
            c = shared.wake.waited(c);
        }
        drop(c);
        stages.vcpus = t.elapsed();
        stages.report(t0.elapsed());
    }
    let why = {
        let mut c = shared.lock();
        while c.exit.is_none() {
            c = shared.wake.waited(c);
        }
        c.exit.clone().expect("checked above")
    };
    for t in threads {
        let _ = t.join();
    }
    let writers = std::mem::take(&mut *shared.cache_writers.locked());
    for w in writers {
        let _ = w.join();
    }
    let _ = std::io::stdout().flush();
    Ok(why)
}

/// Loads the kernel and device tree into fresh RAM.
fn plan_fresh(f: &FreshBoot, gic: GicMode) -> anyhow::Result<Plan> {
    if f.cpus == 0 || f.cpus > layout::MAX_VCPUS {
        bail!(
            "--cpus {} is out of range: this VMM supports 1 to {} vCPUs",
            f.cpus,
            layout::MAX_VCPUS
        );
    }
    let kernel = std::fs::read(&f.kernel)
        .with_context(|| format!("cannot read kernel {}", f.kernel.display()))?;
    let disk = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f.disk)
        .with_context(|| format!("cannot open disk image {} read-write", f.disk.display()))?;
    let ram = Arc::new(GuestRam::new_anonymous(f.mem_bytes)?);
    let loaded = image::load_image(&ram, &kernel)
        .with_context(|| format!("cannot load kernel {}", f.kernel.display()))?;
    let dtb = fdt::build_fdt(&fdt::FdtConfig {
        vcpus: f.cpus,
        ram_size: ram.size(),
        cmdline: f.cmdline.clone(),
        rng_seed: Some(rng_seed()),
        virtio_slots: vec![layout::VIRTIO_BLK_SLOT],
    })?;
    let dtb_gpa = image::dtb_address(&ram, loaded.image_end, dtb.len() as u64)?;
    ram.memory()
        .write_slice(&dtb, GuestAddress(dtb_gpa))
        .context("cannot write the device tree into guest RAM")?;
    let mut power = vec![VcpuPower::Off; f.cpus];
    power[0] = VcpuPower::On;
    Ok(Plan {
        ram,
        cpus: f.cpus,
        disk: PlanDisk::Open {
            file: disk,
            path: f.disk.clone(),
        },
        cmdline: f.cmdline.clone(),
        gic,
        start: Start::Boot(BootRegs {
            entry: loaded.entry,
            dtb: dtb_gpa,
        }),
        power,
        devices: None,
        parent: None,
    })
}

#[derive(Clone, Copy)]
struct BootRegs {
    entry: u64,
    dtb: u64,
}

fn rng_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut seed);
    }
    seed
}

/// Reads the host's stdin, handles the escape keys, and feeds the guest UART
/// at the pace its RX FIFO drains. `Ctrl-A s` calls `snapshot` after the
/// input typed before it has reached the guest.
fn spawn_console_input(shared: Arc<Shared>, mut snapshot: Box<dyn FnMut() + Send>) {
    let spawned = std::thread::Builder::new()
        .name("console".into())
        .spawn(move || {
            let mut parser = EscapeParser::default();
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 256];
            let mut pending = std::collections::VecDeque::new();
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    match parser.feed(b) {
                        Key::Guest(b) => pending.push_back(b),
                        Key::Quit => {
                            shared.finish(VmExit::Quit);
                            return;
                        }
                        Key::Help => console::message(console::ESCAPE_HELP.trim_end()),
                        Key::Snapshot => {
                            feed_uart(&shared, &mut pending);
                            snapshot();
                        }
                        Key::None => {}
                    }
                }
                feed_uart(&shared, &mut pending);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no console input: cannot spawn the console thread: {e}");
    }
}

/// Moves `pending` input into the UART's RX FIFO as space frees up.
fn feed_uart(shared: &Shared, pending: &mut std::collections::VecDeque<u8>) {
    while !pending.is_empty() && !shared.finished() {
        let bytes = pending.make_contiguous();
        let taken = shared.uart.locked().enqueue_rx(bytes);
        pending.drain(..taken);
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Runs vCPUs `ids` on the current thread until the VM ends.
fn vcpu_thread<V: Vm>(vm: &V, shared: &Shared, ids: &[VcpuId], start: Start) -> anyhow::Result<()> {
    let mut vcpus = Vec::with_capacity(ids.len());
    for &id in ids {
        let mut vcpu = vm
            .create_vcpu(id, psci::mpidr(id))
            .with_context(|| format!("cannot create vCPU {id}"))?;
        match &start {
            Start::Boot(boot) if id == 0 => start_vcpu(&mut vcpu, boot.entry, boot.dtb)?,
            Start::Boot(_) => {}
            Start::Restore { states, .. } => {
                let state = states
                    .get(id)
                    .with_context(|| format!("the snapshot has no state for vCPU {id}"))?;
                state::apply_vcpu(vm, &mut vcpu, state)
                    .with_context(|| format!("cannot restore vCPU {id}"))?;
            }
        }
        shared.kicks.locked()[id] = Some(vcpu.kicker());
        vcpus.push(RunVcpu { vcpu, wfi: None });
    }
    if let Start::Restore { states, kernel_gic } = &start {
        if *kernel_gic {
            let mut c = shared.lock();
            c.created += 1;
            shared.wake.notify_all();
            while c.gic_loaded.is_none() && c.exit.is_none() {
                c = shared.wake.waited(c);
            }
            match &c.gic_loaded {
                Some(Ok(())) => {}
                Some(Err(e)) => bail!("{e}"),
                None => return Ok(()),
            }
        }
        for rv in &mut vcpus {
            let id = rv.vcpu.id();
            let state = states
                .get(id)
                .with_context(|| format!("the snapshot has no state for vCPU {id}"))?;
            state::apply_vcpu_gic(&mut rv.vcpu, state)
                .with_context(|| format!("cannot restore vCPU {id}'s GIC CPU interface"))?;
        }
    }
    shared.lock().ready += 1;
    shared.wake.notify_all();
    // Preempts the running vCPU when several share this thread.
    let running = Arc::new(AtomicUsize::new(usize::MAX));
    let _ticker = (vcpus.len() > 1).then(|| {
        Ticker::start(
            running.clone(),
            vcpus.iter().map(|v| v.vcpu.kicker()).collect(),
        )
    });

    let mut io = Io { shared };
    loop {
        let generation = {
            let c = shared.lock();
            if c.exit.is_some() {
                return Ok(());
            }
            if c.pause {
                drop(c);
                park(vm, shared, &mut vcpus);
                continue;
            }
            c.generation
        };
        let mut ran = false;
        let mut next_deadline: Option<Instant> = None;
        for (slot, rv) in vcpus.iter_mut().enumerate() {
            let id = rv.vcpu.id();
            let power = shared.lock().power[id];
            match power {
                VcpuPower::Off => continue,
                VcpuPower::OnPending { entry, context } => {
                    start_vcpu(&mut rv.vcpu, entry, context)?;
                    shared.lock().power[id] = VcpuPower::On;
                    rv.wfi = None;
                }
                VcpuPower::On => {}
            }
            if let Some(wait) = rv.wfi {
                let due = wait.until.is_some_and(|d| d <= Instant::now());
                let pending = shared.irqchip.irq_pending(id);
                if !wfi_wakes(pending, due, generation != wait.generation) {
                    if let Some(d) = wait.until {
                        next_deadline = Some(next_deadline.map_or(d, |n| n.min(d)));
                    }
                    continue;
                }
                rv.wfi = None;
            }
            ran = true;
            running.store(slot, Ordering::Relaxed);
            let exit = rv.vcpu.run(&mut io);
            running.store(usize::MAX, Ordering::Relaxed);
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
        }
        if !ran {
            let c = shared.lock();
            if c.generation != generation || c.exit.is_some() {
                continue;
            }
            match next_deadline {
                Some(d) => {
                    let wait = d.saturating_duration_since(Instant::now());
                    drop(shared.wake.waited_for(c, wait));
                }
                None => {
                    drop(shared.wake.waited(c));
                }
            }
        }
    }
}

/// Snapshot rendezvous: captures this thread's vCPUs (on their own thread,
/// as HVF requires) and waits until the snapshot is done.
fn park<V: Vm>(vm: &V, shared: &Shared, vcpus: &mut [RunVcpu<V::Vcpu>]) {
    let states: Vec<_> = vcpus
        .iter_mut()
        .map(|rv| {
            let id = rv.vcpu.id();
            let st =
                state::capture_vcpu(vm, &mut rv.vcpu).map_err(|e| format!("vCPU {id}: {e}"));
            (id, st)
        })
        .collect();
    let mut c = shared.lock();
    for (id, st) in states {
        c.captured[id] = Some(st);
    }
    c.parked += 1;
    shared.wake.notify_all();
    while c.pause && c.exit.is_none() {
        c = shared.wake.waited(c);
    }
    c.parked -= 1;
}

/// Puts a vCPU at `entry` in EL1h with interrupts masked and X0 = `x0`
/// (Linux arm64 boot protocol for the boot CPU; PSCI CPU_ON for the others).
fn start_vcpu(vcpu: &mut impl Vcpu, entry: u64, x0: u64) -> hv::Result<()> {
    vcpu.set_reg(Reg::X(0), x0)?;
    for n in 1..4 {
        vcpu.set_reg(Reg::X(n), 0)?;
    }
    vcpu.set_reg(Reg::Pstate, PSTATE_EL1H_DAIF)?;
    vcpu.set_reg(Reg::Pc, entry)
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
    let ns = vtimer_deadline_ns(
        vcpu.sysreg(CNTV_CTL_EL0)?,
        vcpu.sysreg(CNTV_CVAL_EL0)?,
        vcpu.vtimer_offset()?,
        vm.physical_count(),
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
        let c = shared.lock();
        psci::handle(call, &Cpus(&c.power))
    };
    let ret = match action {
        PsciAction::Return(v) => v,
        PsciAction::CpuOn {
            target,
            entry,
            context_id,
        } => {
            let mut c = shared.lock();
            match c.power.get(target) {
                _ if !shared.ram.contains(entry, 4) => psci::ret(psci::INVALID_ADDRESS),
                Some(VcpuPower::Off) => {
                    c.power[target] = VcpuPower::OnPending {
                        entry,
                        context: context_id,
                    };
                    c.generation += 1;
                    drop(c);
                    shared.wake.notify_all();
                    shared.kick_where(|v| v == target);
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
            shared.lock().power[vcpu.id()] = VcpuPower::Off;
            return Ok(AfterPsci::Continue);
        }
        PsciAction::SystemOff => {
            shared.finish(VmExit::PowerOff);
            return Ok(AfterPsci::Continue);
        }
        PsciAction::SystemReset => {
            shared.finish(VmExit::Reset);
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
    fn start(running: Arc<AtomicUsize>, kicks: Vec<Arc<dyn Kick>>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let _ = std::thread::Builder::new()
            .name("vcpu-ticker".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(ROUND_ROBIN_SLICE);
                    if let Some(k) = kicks.get(running.load(Ordering::Relaxed)) {
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
