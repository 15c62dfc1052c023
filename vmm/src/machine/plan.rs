//! What gets built: the plan a fresh boot or a restore makes before the VM
//! exists. A fresh boot's is made here (the kernel and device tree loaded
//! into fresh RAM, Linux arm64 boot protocol); a restore's by
//! [`crate::machine::snapshot::restore`].

use crate::arch::{fdt, idregs, image, layout};
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
use std::fs::File;
use std::path::Path;
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
    /// Whether the snapshot's guest agent had answered (`None`: not
    /// recorded).
    pub agent_answered: Option<bool>,
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
    let kernel = read_kernel(f)?;
    let initrd = f
        .initrd
        .as_deref()
        .map(|path| read_input("initrd", None, path, f.mem_bytes).map(|bytes| (path, bytes)))
        .transpose()?;
    let disk = open_input("disk image", Some("--disk"), &f.disk, true)?;
    let ram = Arc::new(GuestRam::new_anonymous(f.mem_bytes)?);
    // Not into the VM generation ID's page.
    let load = layout::loadable_ram(ram.range());
    let loaded = image::load_image(ram.memory(), load, &kernel)
        .with_context(|| format!("cannot load kernel {}", f.kernel.display()))?;
    tracing::info!(
        entry = format_args!("{:#x}", loaded.entry),
        page_size = ?loaded.page_size,
        "kernel {} loaded",
        f.kernel.display()
    );
    if let Some(page) = loaded.page_size.filter(|&p| !idregs::granule_supported(p)) {
        // It would stop in its first instructions, silently.
        bail!(
            "kernel {} uses {} KiB pages (its Image header), a granule this machine's CPU does not implement (both backends offer 4 KiB and 16 KiB; Apple cores have no 64 KiB granule): use a 4 KiB- or 16 KiB-page kernel",
            f.kernel.display(),
            page >> 10
        );
    }
    let initrd = match initrd {
        Some((path, bytes)) => {
            let len = bytes.len() as u64;
            let gpa = image::initrd_address(load, loaded.entry, loaded.image_end, len)
                .with_context(|| format!("cannot load initrd {}", path.display()))?;
            ram.memory()
                .write_slice(&bytes, GuestAddress(gpa))
                .context("cannot write the initrd into guest RAM")?;
            Some(gpa..gpa + len)
        }
        None => None,
    };
    let dtb = fdt::build_fdt(&fdt::FdtConfig {
        vcpus: f.cpus,
        ram_size: ram.size(),
        cmdline: f.cmdline.clone(),
        rng_seed: Some(host_random()?),
        kaslr_seed: Some(u64::from_le_bytes(host_random()?)),
        virtio_slots: Devices::virtio_slots(net.is_some(), vsock.is_some()),
        initrd,
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

/// Opens the user's file `path` (`what`), read-write if `write`: a
/// regular file (or a symbolic link to one), checked through the open
/// descriptor; the open never waits on a FIFO or a device. Errors say what is there instead: `kernel PATH is a directory`,
/// `disk image PATH is not a regular file (a character device)`, `...
/// not found`; `default_of`: the option whose default is a file of the
/// guest build (`--kernel`), which a missing file's error names.
fn open_input(
    what: &str,
    default_of: Option<&str>,
    path: &Path,
    write: bool,
) -> anyhow::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let named = |is: String| anyhow::anyhow!("{what} {} {is}", path.display());
    let kind = |t: std::fs::FileType| match t {
        t if t.is_dir() => "is a directory".to_string(),
        t => format!("is not a regular file ({})", snapshot_store::file_kind(t)),
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match std::fs::metadata(path) {
            Err(m) if m.kind() == std::io::ErrorKind::NotFound => named(match default_of {
                Some(flag) => {
                    format!("not found (build the guest with guest/build.sh, or pass {flag})")
                }
                None => "not found".to_string(),
            }),
            Ok(m) if !m.is_file() => named(kind(m.file_type())),
            _ => anyhow::anyhow!(
                "cannot open {what} {}{}: {e}",
                path.display(),
                if write { " read-write" } else { "" }
            ),
        })?;
    let t = f
        .metadata()
        .with_context(|| format!("cannot use {what} {}", path.display()))?
        .file_type();
    if !t.is_file() {
        return Err(named(kind(t)));
    }
    {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let flags = fcntl(&f, FcntlArg::F_GETFL).map(OFlag::from_bits_truncate);
        flags
            .and_then(|fl| fcntl(&f, FcntlArg::F_SETFL(fl - OFlag::O_NONBLOCK)))
            .with_context(|| format!("cannot use {what} {}", path.display()))?;
    }
    Ok(f)
}

/// The kernel Image of `f`: its file read whole (a regular file no larger
/// than guest RAM), decompressed if it is `Image.gz` (to at most guest RAM;
/// other compressions are refused, [`image::unpack_kernel`]).
fn read_kernel(f: &FreshBoot) -> anyhow::Result<Vec<u8>> {
    let file = read_input("kernel", Some("--kernel"), &f.kernel, f.mem_bytes)?;
    let (kernel, packing) = image::unpack_kernel(file, f.mem_bytes)
        .with_context(|| format!("cannot load kernel {}", f.kernel.display()))?;
    if packing == image::KernelPacking::Gzip {
        tracing::info!(
            "kernel {}: gzip, {} bytes decompressed",
            f.kernel.display(),
            kernel.len()
        );
    }
    Ok(kernel)
}

/// The user's file `path` (`what`; see [`open_input`]) read whole,
/// refused if larger than `max` bytes (the guest's RAM) or empty.
fn read_input(
    what: &str,
    default_of: Option<&str>,
    path: &Path,
    max: u64,
) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let file = open_input(what, default_of, path, false)?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > max {
        bail!(
            "{what} {} is {len} bytes, more than the guest's {max} bytes of RAM",
            path.display()
        );
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    if bytes.len() as u64 > max {
        bail!(
            "{what} {} is more than the guest's {max} bytes of RAM",
            path.display()
        );
    }
    if bytes.is_empty() {
        bail!("{what} {} is empty", path.display());
    }
    Ok(bytes)
}

/// `N` bytes of host randomness (the OS's CSPRNG): the device tree's
/// `/chosen/rng-seed`, the VM generation ID.
pub fn host_random<const N: usize>() -> anyhow::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("cannot read host randomness: {e}"))?;
    Ok(bytes)
}
