//! Building a VM from a configuration and running it: the vCPU run loop,
//! PSCI, WFI sleeping, interrupt wiring and the console input path.
//!
//! Threads: one per vCPU, or one for all vCPUs round-robin when the backend
//! asks for it ([`Hypervisor::ROUND_ROBIN`]); one console input thread; and
//! the caller's thread, which waits for the VM to end. Lock order: a device
//! lock may be held while taking the GIC lock (interrupt lines), never the
//! reverse; no lock is held across [`Vcpu::run`].

use crate::arch::layout;
use crate::console;
use crate::devices::boot_timer::BootTimer;
use crate::devices::gicv3::Gicv3;
use crate::devices::pl011::Pl011;
use crate::devices::virtio::block::{BackingFile, Block};
use crate::devices::virtio::mmio::VirtioMmio;
use crate::devices::{IrqLine, MmioBus};
use crate::hv::{GicMode, Hypervisor, Kick, VcpuId, Vm};
use crate::memory::GuestRam;
use crate::sync::{Locked, Waited};
use anyhow::{bail, Context};
use config::{plan_fresh, PlanDisk};
use control::{Control, EndOnPanic};
use input::spawn_console_input;
use irqchip::Irqchip;
use state::GicSnapshot;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vcpu::vcpu_thread;

mod config;
mod control;
mod input;
mod irqchip;
mod restore;
pub mod state;
mod take;
mod vcpu;

pub use config::{BootSource, FreshBoot, MachineConfig, SnapshotOptions};

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
