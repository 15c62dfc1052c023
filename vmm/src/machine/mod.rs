//! Building a VM from a configuration and running it.
//!
//! [`run`] goes through these steps, each in its own module: the plan
//! (`config`: a fresh boot loads the kernel and device tree; `restore` maps
//! a snapshot chain and decodes its [`state`]), the build (`build`: the
//! hypervisor's VM, the `irqchip`, the `devices` on the MMIO bus), the
//! console input thread (`input`, whose Ctrl-A s takes a snapshot: `take`),
//! and the vCPU threads (`vcpu`: the run loop, PSCI, WFI, MMIO and
//! system-register exits), which share a `control` block and the guest's
//! `clock` (one count per VM, the physical timers).
//!
//! Threads: one per vCPU, or one for all vCPUs round-robin when the backend
//! asks for it ([`Hypervisor::ROUND_ROBIN`]); one console input thread; the
//! clock's physical timer thread; and the caller's thread, which waits for
//! the VM to end. Lock order: a device lock (the clock's counts as one), then
//! the GIC lock (interrupt lines), then the control block's; never the
//! reverse. No lock is held across [`crate::hv::Vcpu::run`].

use crate::console;
use crate::devices::MmioBus;
use crate::hv::Hypervisor;
use crate::memory::GuestRam;
use crate::sync::Locked;
use anyhow::Context;
use device_manager::irqchip::Irqchip;
use device_manager::Devices;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use vcpu::run_state::Control;

mod config;
mod console_input;
pub mod control_socket;
mod device_manager;
pub mod snapshot;
mod vcpu;
mod vm;

pub use config::{
    BootSource, FreshBoot, MachineConfig, NetConfig, SnapshotMode, SnapshotOptions, VsockConfig,
    DEFAULT_GUEST_CID,
};

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
    devices: Devices,
    control: Arc<Control>,
    /// The guest's clock and physical timers.
    clock: vcpu::clock::Clock,
    /// Threads recording snapshot layers' verified-file caches; joined at exit.
    cache_writers: Mutex<Vec<JoinHandle<()>>>,
    /// The thread writing a background snapshot layer; joined before the
    /// next snapshot and at exit.
    snapshot_writer: Mutex<Option<snapshot::save::BackgroundWriter>>,
}

/// Boots or restores `cfg` on hypervisor `hv` and runs it until it ends.
pub fn run<H: Hypervisor>(hv: H, cfg: &MachineConfig) -> anyhow::Result<VmExit>
where
    H::Vm: 'static,
{
    let t0 = Instant::now();
    let mut stages = snapshot::restore::Stages::default();
    config::check_snapshot_name(&cfg.snapshots)?;
    let plan = config::plan(&hv, cfg, t0, &mut stages)?;
    let m = vm::build(&hv, plan, &mut stages)?;
    if cfg.snapshots.track_dirty {
        vm::start_dirty_tracking(&*m.vm)?;
    }
    let _raw = console::RawTerminal::enter().context("cannot put the terminal into raw mode")?;
    let snapshotter = Arc::new(Mutex::new(snapshot::save::Snapshotter::new(
        m.vm.clone(),
        m.shared.clone(),
        &cfg.snapshots,
        m.parent,
        m.disk_path,
        m.cmdline,
        H::NAME,
    )));
    let _socket = match &cfg.control {
        Some(path) => Some(control_socket::listen(
            path,
            control_socket::Api {
                shared: m.shared.clone(),
                ops: snapshotter.clone(),
                vcpus: m.groups.iter().map(Vec::len).sum(),
                backend: H::NAME,
                started: t0,
                restored_from: match &cfg.source {
                    BootSource::Restore { spec } => Some(spec.clone()),
                    BootSource::Fresh(_) => None,
                },
            },
        )?),
        None => None,
    };
    console_input::spawn(
        m.shared.clone(),
        Box::new(move || snapshotter.locked().take()),
    );

    let t = Instant::now();
    let threads = vcpu::spawn_threads(&m.vm, &m.shared, m.groups, &m.start)?;
    // Every vCPU exists before any runs; a restored in-kernel GIC's state
    // goes in between.
    let t_gic = Instant::now();
    m.shared.control.wait_created();
    let released = match m.kernel_gic_state {
        Some(gic) => {
            let loaded = gic.load();
            stages.gic += t_gic.elapsed();
            loaded
        }
        None => Ok(()),
    };
    m.shared.control.release(released);
    if let BootSource::Restore { .. } = cfg.source {
        m.shared.control.wait_ready();
        stages.vcpus = t.elapsed();
        stages.report(t0.elapsed());
    }
    let why = m.shared.control.wait_exit();
    wind_down(&m.shared, threads);
    Ok(why)
}

/// After the VM has ended: joins the vCPU threads, a background snapshot's
/// writer (its layer is completed) and the snapshot cache writers, and
/// flushes the console output.
fn wind_down(shared: &Shared, threads: Vec<JoinHandle<()>>) {
    for t in threads {
        let _ = t.join();
    }
    let _ = snapshot::save::finish_background(shared, false);
    let writers = std::mem::take(&mut *shared.cache_writers.locked());
    for w in writers {
        let _ = w.join();
    }
    let _ = std::io::stdout().flush();
}
