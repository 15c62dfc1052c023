//! Building a VM from its [`Plan`]: the hypervisor's VM, the interrupt
//! controller, the devices on the MMIO bus, and the state the VM's threads
//! share.

use crate::devices::virtio::block::BackingFile;
use crate::devices::virtio::net::host_end;
use crate::devices::virtio::vsock::VsockHost;
use crate::devices::MmioBus;
use crate::devices::Persist;
use crate::hv::{Hypervisor, VcpuId, Vm};
use crate::machine::config::{host_random, Plan, PlanDisk, Start};
use crate::machine::device_manager::irqchip::{Irqchip, PendingKernelGicState};
use crate::machine::device_manager::{
    DeviceArgs, Devices, NetDeviceArgs, SpiLine, VsockDeviceArgs,
};
use crate::machine::snapshot::restore::{CopyingDisk, Stages};
use crate::machine::vcpu::clock::Clock;
use crate::machine::vcpu::run_state::Control;
use crate::machine::{vcpu, Shared};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A VM built from a [`Plan`], ready for its vCPU threads.
pub(in crate::machine) struct Machine<V> {
    pub(in crate::machine) vm: Arc<V>,
    pub(in crate::machine) shared: Arc<Shared>,
    /// The vCPUs of each vCPU thread.
    pub(in crate::machine) groups: Vec<Vec<VcpuId>>,
    /// How the vCPUs start.
    pub(in crate::machine) start: Start,
    /// An in-kernel GIC's saved state (restore), loaded once the vCPUs exist.
    pub(in crate::machine) kernel_gic_state: Option<PendingKernelGicState>,
    /// The VM's disk image, which snapshots clone.
    pub(in crate::machine) disk_path: PathBuf,
    /// The kernel command line, which snapshots record.
    pub(in crate::machine) cmdline: String,
    /// The layer the next snapshot is a child of (restore).
    pub(in crate::machine) parent: Option<snapshot_store::Layer>,
    /// A restored VM's working disk, still being copied when the VM starts:
    /// the block device waits for it on first use. Kept for as long as the
    /// VM runs; dropping it removes its work directory.
    pub(in crate::machine) _work_disk: Option<CopyingDisk>,
}

/// Builds the VM `plan` describes on `hv`, timing its stages in `stages`.
pub(in crate::machine) fn build<H: Hypervisor>(
    hv: &H,
    plan: Plan,
    stages: &mut Stages,
) -> anyhow::Result<Machine<H::Vm>>
where
    H::Vm: 'static,
{
    tracing::info!("GIC mode: {}", plan.gic);
    // The VM first: it maps RAM and, for an in-kernel GIC, creates the GIC
    // (before any vCPU, as Hypervisor.framework requires).
    let t = Instant::now();
    let vm = Arc::new(hv.create_vm(plan.ram.clone(), plan.cpus, plan.gic)?);
    stages.vm_create = t.elapsed();

    let t = Instant::now();
    let saved = plan.saved.as_deref();
    let (irqchip, kernel_gic_state) = Irqchip::build(
        plan.gic,
        vm.kernel_gic(),
        plan.cpus,
        saved.map(|s| &s.gic),
        H::NAME,
    )?;
    stages.gic = t.elapsed();

    let t = Instant::now();
    let (disk, disk_len, disk_path, work_disk) = open_disk(plan.disk)?;
    let groups = vcpu::thread_groups(plan.cpus, H::ROUND_ROBIN);
    let control = Arc::new(Control::new(irqchip.clone(), plan.power, &groups));
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
    let (chip, ctl) = (irqchip.clone(), control.clone());
    let args = DeviceArgs {
        ram: plan.ram.clone(),
        irq: Box::new(move |intid| SpiLine::connect(intid, chip.clone(), ctl.clone())),
        console: Box::new(std::io::stdout()),
        start: Instant::now(),
        disk,
        disk_len,
        generation_id: host_random()?,
        net,
        vsock,
    };
    let devices = match saved {
        None => Devices::new(args)?,
        Some(st) => Devices::restore(args, &st.devices)?,
    };
    // The guest's clock last, just before the vCPUs: a restore's count
    // continues from here.
    let (chip, ctl) = (irqchip.clone(), control.clone());
    let clock = Clock::new(
        vm.clone(),
        plan.cpus,
        saved.map(|s| &s.clock),
        Box::new(move |vcpu, level| {
            chip.ptimer_level(vcpu, level);
            ctl.interrupts_changed();
        }),
    )
    .context("cannot start the physical timer thread")?;
    // A round-robin backend's timer asks for its vCPU's turn (and the
    // control block is dropped with the machine, so hold it weakly).
    let ctl = Arc::downgrade(&control);
    vm.set_run_request(Arc::new(move |vcpu| {
        if let Some(c) = ctl.upgrade() {
            c.run_soon(vcpu, false);
        }
    }));
    let shared = Arc::new(Shared {
        bus: bus(&irqchip, &devices, plan.cpus),
        ram: plan.ram,
        irqchip,
        devices,
        control,
        clock,
        cache_writers: Mutex::new(Vec::new()),
        snapshot_writer: Mutex::new(None),
    });
    stages.devices = t.elapsed();
    Ok(Machine {
        vm,
        shared,
        groups,
        start: plan.start,
        kernel_gic_state,
        disk_path,
        cmdline: plan.cmdline,
        parent: plan.parent,
        _work_disk: work_disk,
    })
}

/// The root disk: its file, length and path, and for a restore the working
/// copy still being made.
fn open_disk(disk: PlanDisk) -> anyhow::Result<(BackingFile, u64, PathBuf, Option<CopyingDisk>)> {
    Ok(match disk {
        PlanDisk::Open { file, path } => {
            let len = file
                .metadata()
                .with_context(|| format!("cannot use disk image {}", path.display()))?
                .len();
            (BackingFile::ready(file), len, path, None)
        }
        PlanDisk::Copying(mut copy) => {
            let file = BackingFile::pending(copy.take_wait());
            (file, copy.len, copy.path.clone(), Some(copy))
        }
    })
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

/// Starts tracking guest-RAM writes (`--track-dirty`). What the VMM wrote
/// into RAM before (a fresh VM's kernel, device tree and initrd, loaded into
/// RAM that was zero; a restored VM's new generation ID) stays marked: a
/// fresh VM's first (full) layer then holds exactly the pages ever written,
/// and a restored VM's first diff holds what changed since its layer.
pub(in crate::machine) fn start_dirty_tracking<V: Vm>(vm: &V) -> anyhow::Result<()> {
    vm.rearm_dirty_tracking()
        .context("cannot start dirty tracking")
}
