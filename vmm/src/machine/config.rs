//! What to run: the configuration from the command line, and the plan a
//! fresh boot or a restore makes from it before the VM is built.

use crate::arch::{fdt, image, layout};
use crate::devices::virtio::net::{default_mac, host_end::NetHost};
use crate::hv::{GicMode, Hypervisor};
use crate::machine::device_manager::Devices;
use crate::machine::snapshot::restore::{self, Stages};
use crate::machine::snapshot::state::{MachineState, VcpuPower, VcpuState};
use crate::memory::GuestRam;
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use vm_memory::{Bytes, GuestAddress};

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
    /// How Ctrl-A s writes a layer.
    pub mode: SnapshotMode,
}

/// How a snapshot is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// The vCPUs stop only while the machine's state is captured and the
    /// layer's pages are write-protected; the pages are written while the
    /// guest runs, each saved before anything changes it. Needs
    /// [`SnapshotOptions::track_dirty`] (the backends' write protection).
    Background,
    /// The vCPUs stay stopped until the layer is on disk.
    Stop,
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
    /// Where to listen for control requests (`boot --control`; see
    /// `machine::api`).
    pub control: Option<PathBuf>,
    /// The network device (`boot --net`); `None`: no network device.
    pub net: Option<NetConfig>,
    /// The vsock device (`boot --vsock-uds`); `None`: no vsock device.
    pub vsock: Option<VsockConfig>,
}

/// The vsock device (`boot --vsock-uds`, `--vsock-cid`).
#[derive(Debug, Clone)]
pub struct VsockConfig {
    /// The Unix socket host programs connect to; a guest connection to host
    /// port P goes to `<uds>_P`.
    pub uds: PathBuf,
    /// The guest's CID. `None`: [`DEFAULT_GUEST_CID`] for a fresh boot, the
    /// snapshot's for a restore (a different one reaches the guest with the
    /// transport reset).
    pub cid: Option<u64>,
}

/// The guest CID without `--vsock-cid`: 3, the first one not reserved.
pub const DEFAULT_GUEST_CID: u64 = 3;

/// The network device (`boot --net`, `--mac`).
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Its host end.
    pub host: NetHost,
    /// Its MAC address. `None`: a fresh boot derives one from the VM name
    /// (`--name`, else the disk image's path), the same on every start; a
    /// restore keeps the snapshot's (a different one is refused).
    pub mac: Option<[u8; 6]>,
}

/// How the vCPUs start.
#[derive(Clone)]
pub(in crate::machine) enum Start {
    /// The boot CPU at the kernel entry; the others wait for PSCI CPU_ON.
    Boot(BootRegs),
    /// Every vCPU from a snapshot.
    Restore {
        /// Per vCPU, index order.
        states: Arc<Vec<VcpuState>>,
    },
}

/// Everything a VM needs before it is built: guest RAM with the kernel or
/// the snapshot's memory in it, and what to start the vCPUs and devices from.
pub(in crate::machine) struct Plan {
    pub(in crate::machine) ram: Arc<GuestRam>,
    pub(in crate::machine) cpus: usize,
    pub(in crate::machine) disk: PlanDisk,
    pub(in crate::machine) cmdline: String,
    pub(in crate::machine) gic: GicMode,
    pub(in crate::machine) start: Start,
    pub(in crate::machine) power: Vec<VcpuPower>,
    /// The snapshot's interrupt controller and device states (restore; its
    /// vCPU states are in `start`).
    pub(in crate::machine) saved: Option<Box<MachineState>>,
    /// The layer the next snapshot is a child of (restore with tracking).
    pub(in crate::machine) parent: Option<snapshot_store::Layer>,
    /// The network device (its MAC resolved for a fresh boot).
    pub(in crate::machine) net: Option<NetConfig>,
    /// The vsock device (its CID resolved for a fresh boot).
    pub(in crate::machine) vsock: Option<VsockConfig>,
}

/// The VM's disk image.
pub(in crate::machine) enum PlanDisk {
    /// The user's image, open read-write (a fresh boot).
    Open { file: std::fs::File, path: PathBuf },
    /// A restored VM's private copy of the snapshot's image, still being made.
    Copying(restore::CopyingDisk),
}

/// Refuses a snapshot name (`--name`) that is invalid or already taken in
/// the store, before anything runs.
pub(in crate::machine) fn check_snapshot_name(opts: &SnapshotOptions) -> anyhow::Result<()> {
    if opts.mode == SnapshotMode::Background && !opts.track_dirty {
        bail!("background snapshots need --track-dirty (its write protection saves each page before the guest changes it); use --snapshot-mode stop without it");
    }
    if let Some(name) = &opts.name {
        snapshot_store::validate_name(name)?;
        let store = &opts.store;
        if snapshot_store::Store::open(store).is_ok_and(|s| s.contains(name)) {
            bail!(
                "snapshot '{name}' already exists in {}; choose another --name",
                store.display()
            );
        }
    }
    Ok(())
}

/// The plan for `cfg` on `hv`: a fresh boot's, or a restore's (whose
/// stages are timed in `stages`, from `t0`).
pub(in crate::machine) fn plan<H: Hypervisor>(
    hv: &H,
    cfg: &MachineConfig,
    t0: Instant,
    stages: &mut Stages,
) -> anyhow::Result<Plan> {
    match &cfg.source {
        BootSource::Fresh(f) => {
            let gic = cfg.gic.unwrap_or_default();
            hv.check_gic_mode(gic)?;
            let net = cfg.net.clone().map(|mut n| {
                let name = match &cfg.snapshots.name {
                    Some(name) => name.clone(),
                    None => std::fs::canonicalize(&f.disk)
                        .unwrap_or_else(|_| f.disk.clone())
                        .display()
                        .to_string(),
                };
                n.mac.get_or_insert_with(|| default_mac(&name));
                n
            });
            let vsock = cfg.vsock.clone().map(|mut v| {
                v.cid.get_or_insert(DEFAULT_GUEST_CID);
                v
            });
            plan_fresh(f, gic, net, vsock)
        }
        BootSource::Restore { spec } => {
            let mut plan = restore::plan(hv, spec, cfg.gic, &cfg.snapshots, t0, stages)?;
            plan.net = cfg.net.clone();
            plan.vsock = cfg.vsock.clone();
            Ok(plan)
        }
    }
}

/// Loads the kernel and device tree into fresh RAM.
fn plan_fresh(
    f: &FreshBoot,
    gic: GicMode,
    net: Option<NetConfig>,
    vsock: Option<VsockConfig>,
) -> anyhow::Result<Plan> {
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
    // Not into the VM generation ID's page.
    let load = layout::loadable_ram(ram.range());
    let loaded = image::load_image(ram.memory(), load, &kernel)
        .with_context(|| format!("cannot load kernel {}", f.kernel.display()))?;
    let dtb = fdt::build_fdt(&fdt::FdtConfig {
        vcpus: f.cpus,
        ram_size: ram.size(),
        cmdline: f.cmdline.clone(),
        rng_seed: Some(host_random()?),
        virtio_slots: Devices::virtio_slots(net.is_some(), vsock.is_some()),
    })?;
    let dtb_gpa = image::dtb_address(load, loaded.image_end, dtb.len() as u64)?;
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
        saved: None,
        parent: None,
        net,
        vsock,
    })
}

/// Where the boot CPU starts: the kernel entry point (PC) and the device
/// tree's guest-physical address (X0).
#[derive(Clone, Copy)]
pub(in crate::machine) struct BootRegs {
    pub(in crate::machine) entry: u64,
    pub(in crate::machine) dtb: u64,
}

/// `N` bytes of host randomness (the OS's CSPRNG): the device tree's
/// `/chosen/rng-seed`, the VM generation ID.
pub(in crate::machine) fn host_random<const N: usize>() -> anyhow::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("cannot read host randomness: {e}"))?;
    Ok(bytes)
}
