//! What gets built: the plan a fresh boot or a restore makes before the VM
//! exists. A fresh boot's is made here (the kernel and device tree loaded
//! into fresh RAM, Linux arm64 boot protocol); a restore's by
//! [`crate::machine::snapshot::restore`].

use crate::arch::{fdt, image, layout};
use crate::devices::virtio::net::default_mac;
use crate::hv::GicMode;
use crate::machine::config::{FreshBoot, NetConfig, VsockConfig, DEFAULT_GUEST_CID};
use crate::machine::device_manager::irqchip::IrqchipState;
use crate::machine::device_manager::root_disk::RootDisk;
use crate::machine::device_manager::{Devices, DevicesState};
use crate::machine::vcpu::clock::ClockState;
use crate::machine::vcpu::state::VcpuPower;
use crate::machine::vcpu::{BootRegs, Start};
use crate::memory::GuestRam;
use anyhow::{bail, Context};
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

/// Everything a VM needs before it is built: guest RAM with the kernel or
/// the snapshot's memory in it, and what to start the vCPUs and devices
/// from.
pub struct Plan {
    /// Guest RAM, loaded.
    pub ram: Arc<GuestRam>,
    /// Number of vCPUs.
    pub cpus: usize,
    /// The root disk.
    pub disk: RootDisk,
    /// The kernel command line (recorded in snapshots).
    pub cmdline: String,
    /// The interrupt controller.
    pub gic: GicMode,
    /// How the vCPUs start.
    pub start: Start,
    /// Each vCPU's PSCI power state, index order.
    pub power: Vec<VcpuPower>,
    /// A restore's saved machine, but for its vCPUs (in `start`).
    pub saved: Option<Saved>,
    /// The layer the next snapshot is a child of (a restore).
    pub parent: Option<snapshot_store::Layer>,
    /// The network device (its MAC resolved for a fresh boot).
    pub net: Option<NetConfig>,
    /// The vsock device (its CID resolved for a fresh boot).
    pub vsock: Option<VsockConfig>,
}

/// A snapshot's interrupt controller, clock and devices, which the build
/// restores (each checks its own part: the state is untrusted).
pub struct Saved {
    /// The interrupt controller.
    pub gic: IrqchipState,
    /// The guest's clock.
    pub clock: ClockState,
    /// The devices.
    pub devices: DevicesState,
}

/// The plan of a fresh boot of `f` with interrupt controller `gic`: the
/// kernel and the device tree loaded into fresh RAM, the boot CPU at the
/// kernel's entry. `net` gets a MAC derived from `vm_name` (the snapshot
/// name, else the disk's path) unless it names one; `vsock` gets
/// [`DEFAULT_GUEST_CID`] unless it names one.
pub fn fresh(
    f: &FreshBoot,
    gic: GicMode,
    vm_name: Option<&str>,
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
    let net = net.map(|mut n| {
        let name = match vm_name {
            Some(name) => name.to_string(),
            None => std::fs::canonicalize(&f.disk)
                .unwrap_or_else(|_| f.disk.clone())
                .display()
                .to_string(),
        };
        n.mac.get_or_insert_with(|| default_mac(&name));
        n
    });
    let vsock = vsock.map(|mut v| {
        v.cid.get_or_insert(DEFAULT_GUEST_CID);
        v
    });
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
        disk: RootDisk::Open {
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

/// `N` bytes of host randomness (the OS's CSPRNG): the device tree's
/// `/chosen/rng-seed`, the VM generation ID.
pub fn host_random<const N: usize>() -> anyhow::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("cannot read host randomness: {e}"))?;
    Ok(bytes)
}
