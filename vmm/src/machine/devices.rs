//! The machine's device set: the console UART, the boot timer and the virtio
//! devices, each at its region of the memory map ([`crate::arch::layout`])
//! with its interrupt wired to the interrupt controller. The set gives the
//! MMIO bus its regions, the device tree its virtio-mmio slots, and a
//! snapshot the devices' state ([`DevicesState`]).
//!
//! A new device takes its region (and SPI) in the layout, its model in
//! [`crate::devices`], and here: a field of [`Devices`], of
//! [`DevicesState`] and of `Parts` (its construction arguments), its
//! construction in [`Devices::new`] and in the restore, its entry in
//! [`Devices::regions`] and, for a virtio device, its slot in
//! [`Devices::VIRTIO_SLOTS`].

use super::control::Control;
use super::irqchip::Irqchip;
use crate::arch::layout::{self, MmioRegion};
use crate::console;
use crate::devices::boot_timer::{BootTimer, BootTimerState};
use crate::devices::pl011::{Pl011, Pl011State};
use crate::devices::virtio::block::{BackingFile, Block, BlockArgs, BlockState};
use crate::devices::virtio::host_io::HostIo;
use crate::devices::virtio::mmio::{VirtioMmio, VirtioMmioState};
use crate::devices::virtio::net::host_end::{self, OpenedFrames, OpenedHostEnd};
use crate::devices::virtio::net::{format_mac, Net, NetArgs, NetState};
use crate::devices::virtio::vsock::{self, Vsock, VsockArgs, VsockHost, VsockState};
use crate::devices::vmgenid::{VmGenId, VmGenIdArgs, VmGenIdState};
use crate::devices::{IrqLine, MmioDevice, Persist};
use crate::memory::GuestRam;
use crate::sync::Locked;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The root block device's region (`/dev/vda`).
const BLK: MmioRegion = layout::virtio_mmio(layout::VIRTIO_BLK_SLOT);
/// The network device's region.
const NET: MmioRegion = layout::virtio_mmio(layout::VIRTIO_NET_SLOT);
/// The vsock device's region.
const VSOCK: MmioRegion = layout::virtio_mmio(layout::VIRTIO_VSOCK_SLOT);

/// The root disk's serial number (virtio-blk GET_ID).
const ROOT_DISK_SERIAL: &str = "ignition-vda";

/// A region of the MMIO bus: (name, base, size, device). The name is the
/// one the bus's warnings give.
pub(super) type BusRegion = (&'static str, u64, u64, Arc<Mutex<dyn MmioDevice>>);

/// What the devices are made from, besides a saved state.
pub(super) struct DeviceArgs {
    /// Guest RAM, which the virtio devices' queues live in.
    pub(super) ram: Arc<GuestRam>,
    /// The line of SPI `intid` ([`SpiLine`] in a running VM).
    pub(super) irq: Box<dyn Fn(u32) -> Arc<dyn IrqLine>>,
    /// Where the console UART's output goes.
    pub(super) console: Box<dyn Write + Send>,
    /// When the VM started: the boot timer reports the time since.
    pub(super) start: Instant,
    /// The root disk's file (open, or still being copied).
    pub(super) disk: BackingFile,
    /// The root disk's length in bytes.
    pub(super) disk_len: u64,
    /// The VM generation ID to publish: fresh host randomness, on every
    /// boot and every restore.
    pub(super) generation_id: [u8; 16],
    /// The network device, if the VM has one.
    pub(super) net: Option<NetDeviceArgs>,
    /// The vsock device, if the VM has one.
    pub(super) vsock: Option<VsockDeviceArgs>,
}

/// The vsock device's construction arguments.
pub(super) struct VsockDeviceArgs {
    /// Its host end, listening.
    pub(super) host: VsockHost,
    /// The guest's CID; `None` in a restore keeps the snapshot's (a fresh
    /// boot always has one).
    pub(super) cid: Option<u64>,
}

/// The vsock device and the thread that serves its host sockets.
struct VsockSlot {
    dev: Arc<Mutex<VirtioMmio<Vsock>>>,
    _io: HostIo,
}

impl VsockSlot {
    fn start(dev: VirtioMmio<Vsock>) -> anyhow::Result<Self> {
        let dev = Arc::new(Mutex::new(dev));
        let io = vsock::host_end::spawn_host_thread(dev.clone())
            .context("cannot start the vsock device's host I/O thread")?;
        Ok(VsockSlot { dev, _io: io })
    }
}

/// The network device's construction arguments.
pub(super) struct NetDeviceArgs {
    /// Its host end, opened.
    pub(super) end: OpenedHostEnd,
    /// Its MAC address; `None` in a restore keeps the snapshot's (a fresh
    /// boot always has one).
    pub(super) mac: Option<[u8; 6]>,
}

/// The network device and the thread that feeds it from its host end.
struct NetSlot {
    dev: Arc<Mutex<VirtioMmio<Net>>>,
    _io: HostIo,
}

impl NetSlot {
    /// Starts the receiver thread of `dev`, whose frames come from `end`.
    fn start(dev: VirtioMmio<Net>, frames: OpenedFrames) -> anyhow::Result<Self> {
        let dev = Arc::new(Mutex::new(dev));
        let io = host_end::spawn_receiver(dev.clone(), frames)
            .context("cannot start the network device's host I/O thread")?;
        Ok(NetSlot { dev, _io: io })
    }
}

/// The devices of a VM (the interrupt controller aside: see
/// [`super::irqchip`]).
pub(super) struct Devices {
    /// The console UART, fed by the console input thread.
    uart: Arc<Mutex<Pl011>>,
    boot_timer: Arc<Mutex<BootTimer>>,
    /// The root block device, whose disk snapshots capture.
    blk: Arc<Mutex<VirtioMmio<Block>>>,
    /// The VM generation ID; absent in a VM restored from a snapshot taken
    /// before Ignition had one (that guest's device tree lacks it, and its
    /// last RAM page is ordinary memory).
    vmgenid: Option<VmGenId>,
    /// The network device (`boot --net`).
    net: Option<NetSlot>,
    /// The vsock device (`boot --vsock-uds`).
    vsock: Option<VsockSlot>,
}

/// The devices' saved states. [`super::state::MachineState`] flattens it:
/// each field is a top-level key of the state file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DevicesState {
    /// The console UART.
    pub pl011: Pl011State,
    /// The boot-timer.
    pub boot_timer: BootTimerState,
    /// The root block device and its transport.
    pub virtio_blk: VirtioMmioState<BlockState>,
    /// The VM generation ID (absent in snapshots from before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmgenid: Option<VmGenIdState>,
    /// The network device and its transport, if the VM has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_net: Option<VirtioMmioState<NetState>>,
    /// The vsock device and its transport, if the VM has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_vsock: Option<VirtioMmioState<VsockState>>,
}

impl Devices {
    /// The virtio-mmio slots that hold a device, for the device tree (which
    /// is written before the devices exist): the root disk's, and the
    /// network and vsock devices' if there are.
    pub(super) fn virtio_slots(net: bool, vsock: bool) -> Vec<u32> {
        let mut slots = vec![layout::VIRTIO_BLK_SLOT];
        if net {
            slots.push(layout::VIRTIO_NET_SLOT);
        }
        if vsock {
            slots.push(layout::VIRTIO_VSOCK_SLOT);
        }
        slots
    }

    /// The devices of a fresh boot, in their reset states.
    pub(super) fn new(args: DeviceArgs) -> anyhow::Result<Self> {
        let p = args.split();
        let (out, irq) = p.uart;
        let (start, report) = p.boot_timer;
        let (disk, ram, irq_blk) = p.blk;
        let disk = Block::with_backing(disk.file, disk.len, disk.read_only, &disk.serial);
        let net = match p.net {
            None => None,
            Some((args, ram, irq)) => {
                let NetDeviceArgs {
                    end: OpenedHostEnd { backend, frames },
                    mac,
                } = args;
                let mac = mac.context("a fresh network device needs a MAC")?;
                let dev = VirtioMmio::new(Net::new(mac, backend), ram, irq)
                    .expect("a fresh virtio-net transport is valid");
                Some(NetSlot::start(dev, frames)?)
            }
        };
        let vsock = match p.vsock {
            None => None,
            Some((args, ram, irq)) => {
                let cid = args.cid.context("a fresh vsock device needs a CID")?;
                let dev = VirtioMmio::new(Vsock::new(cid, args.host), ram, irq)
                    .expect("a fresh virtio-vsock transport is valid");
                Some(VsockSlot::start(dev)?)
            }
        };
        Ok(Devices {
            uart: Arc::new(Mutex::new(Pl011::new(out, irq))),
            boot_timer: Arc::new(Mutex::new(BootTimer::new(start, report))),
            blk: Arc::new(Mutex::new(
                VirtioMmio::new(disk, ram, irq_blk).expect("a fresh virtio-blk transport is valid"),
            )),
            vmgenid: Some(VmGenId::new(p.vmgenid)?),
            net,
            vsock,
        })
    }

    /// The devices' MMIO regions, at their places in the layout.
    pub(super) fn regions(&self) -> Vec<BusRegion> {
        let at = |name, r: MmioRegion, dev: Arc<Mutex<dyn MmioDevice>>| (name, r.base, r.size, dev);
        vec![
            at("pl011", layout::PL011, self.uart.clone()),
            at("boot-timer", layout::BOOT_TIMER, self.boot_timer.clone()),
            at("virtio-blk", BLK, self.blk.clone()),
        ]
        .into_iter()
        .chain(self.net.as_ref().map(|n| {
            let dev: Arc<Mutex<dyn MmioDevice>> = n.dev.clone();
            at("virtio-net", NET, dev)
        }))
        .chain(self.vsock.as_ref().map(|v| {
            let dev: Arc<Mutex<dyn MmioDevice>> = v.dev.clone();
            at("virtio-vsock", VSOCK, dev)
        }))
        .collect()
    }

    /// Hands console input to the UART; returns how many leading bytes it
    /// took (see [`Pl011::enqueue_rx`]).
    pub(super) fn console_input(&self, bytes: &[u8]) -> usize {
        self.uart.locked().enqueue_rx(bytes)
    }

    /// Waits until no device has a request in flight, and holds the
    /// network and vsock devices (they write nothing into guest RAM, though
    /// their host ends go on), before a snapshot; [`Devices::release`]
    /// ends the hold.
    pub(super) fn quiesce(&self) -> anyhow::Result<()> {
        self.blk
            .locked()
            .prepare_save()
            .context("cannot quiesce the block device")?;
        if let Some(n) = &self.net {
            n.dev.locked().prepare_save()?;
        }
        if let Some(v) = &self.vsock {
            v.dev.locked().prepare_save()?;
        }
        Ok(())
    }

    /// Ends what [`Devices::quiesce`] held: frames and bytes that arrived
    /// meanwhile go to the guest.
    pub(super) fn release(&self) {
        self.blk.locked().after_save();
        if let Some(n) = &self.net {
            n.dev.locked().after_save();
        }
        if let Some(v) = &self.vsock {
            v.dev.locked().after_save();
        }
    }

    /// The root block device, whose disk image a snapshot captures.
    pub(super) fn root_disk(&self) -> MutexGuard<'_, VirtioMmio<Block>> {
        self.blk.locked()
    }

    /// Holds every device that writes guest RAM (its DMA: virtqueue
    /// buffers and used rings) until the result is dropped; a vCPU or host
    /// thread that reaches one meanwhile waits.
    pub(super) fn hold_ram_writers(&self) -> RamWritersHeld<'_> {
        // Always in this order (no other path holds two device locks).
        RamWritersHeld {
            _blk: self.blk.locked(),
            _net: self.net.as_ref().map(|n| n.dev.locked()),
            _vsock: self.vsock.as_ref().map(|v| v.dev.locked()),
        }
    }
}

/// The devices that write guest RAM, held ([`Devices::hold_ram_writers`]).
pub(super) struct RamWritersHeld<'a> {
    _blk: MutexGuard<'a, VirtioMmio<Block>>,
    _net: Option<MutexGuard<'a, VirtioMmio<Net>>>,
    _vsock: Option<MutexGuard<'a, VirtioMmio<Vsock>>>,
}

impl Persist for Devices {
    type State = DevicesState;
    type Args = DeviceArgs;
    type Error = anyhow::Error;

    /// The devices' state, for a snapshot (every vCPU parked, devices
    /// quiesced).
    fn save(&self) -> DevicesState {
        DevicesState {
            pl011: self.uart.locked().save(),
            boot_timer: self.boot_timer.locked().save(),
            virtio_blk: self.blk.locked().save(),
            vmgenid: self.vmgenid.as_ref().map(VmGenId::save),
            virtio_net: self.net.as_ref().map(|n| n.dev.locked().save()),
            virtio_vsock: self.vsock.as_ref().map(|v| v.dev.locked().save()),
        }
    }

    /// The devices rebuilt from a snapshot's (untrusted) `state`, each
    /// checking its own part.
    fn restore(args: DeviceArgs, state: &DevicesState) -> anyhow::Result<Self> {
        let p = args.split();
        let uart = Pl011::restore(p.uart, &state.pl011).context("cannot restore the PL011")?;
        let boot_timer = BootTimer::restore(p.boot_timer, &state.boot_timer)?;
        let blk =
            VirtioMmio::restore(p.blk, &state.virtio_blk).context("cannot restore virtio-blk")?;
        let net = match (p.net, &state.virtio_net) {
            (None, None) => None,
            (Some((args, ram, irq)), Some(saved)) => {
                let NetDeviceArgs {
                    end: OpenedHostEnd { backend, frames },
                    mac,
                } = args;
                let args = NetArgs {
                    mac: mac.unwrap_or(saved.device.mac),
                    backend,
                };
                let dev = VirtioMmio::restore((args, ram, irq), saved)
                    .context("cannot restore virtio-net")?;
                Some(NetSlot::start(dev, frames)?)
            }
            (None, Some(saved)) => anyhow::bail!(
                "the snapshot's VM has a network device (MAC {}) and the command line none: pass --net (stream:PATH or tap:NAME) to restore it",
                format_mac(&saved.device.mac)
            ),
            (Some(_), None) => anyhow::bail!(
                "the snapshot's VM has no network device: a restore cannot add one (drop --net)"
            ),
        };
        let vsock = match (p.vsock, &state.virtio_vsock) {
            (None, None) => None,
            (Some((args, ram, irq)), Some(saved)) => {
                let args = VsockArgs {
                    cid: args.cid,
                    host: args.host,
                };
                let dev = VirtioMmio::restore((args, ram, irq), saved)
                    .context("cannot restore virtio-vsock")?;
                let slot = VsockSlot::start(dev)?;
                // The guest's connections are gone: tell it (§5.10.6.6).
                slot.dev.locked().kick(vsock::EVENT_QUEUE);
                Some(slot)
            }
            (None, Some(saved)) => anyhow::bail!(
                "the snapshot's VM has a vsock device (CID {}) and the command line none: pass --vsock-uds PATH to restore it",
                saved.device.cid
            ),
            (Some(_), None) => anyhow::bail!(
                "the snapshot's VM has no vsock device: a restore cannot add one (drop --vsock-uds)"
            ),
        };
        // Last: it raises its interrupt.
        let vmgenid = state
            .vmgenid
            .as_ref()
            .map(|s| VmGenId::restore(p.vmgenid, s))
            .transpose()?;
        Ok(Devices {
            uart: Arc::new(Mutex::new(uart)),
            boot_timer: Arc::new(Mutex::new(boot_timer)),
            blk: Arc::new(Mutex::new(blk)),
            vmgenid,
            net,
            vsock,
        })
    }
}

/// Each device's construction arguments ([`Persist::Args`]).
struct Parts {
    uart: <Pl011 as Persist>::Args,
    boot_timer: <BootTimer as Persist>::Args,
    blk: <VirtioMmio<Block> as Persist>::Args,
    vmgenid: VmGenIdArgs,
    net: Option<(NetDeviceArgs, Arc<GuestRam>, Arc<dyn IrqLine>)>,
    vsock: Option<(VsockDeviceArgs, Arc<GuestRam>, Arc<dyn IrqLine>)>,
}

impl DeviceArgs {
    /// Hands each device its part: its SPI's line (from the layout), the
    /// console, the start, the disk, guest RAM.
    fn split(self) -> Parts {
        let spi = |r: MmioRegion, what| (self.irq)(r.intid.expect(what));
        let disk = BlockArgs {
            file: self.disk,
            len: self.disk_len,
            read_only: false,
            serial: ROOT_DISK_SERIAL.into(),
        };
        Parts {
            uart: (self.console, spi(layout::PL011, "PL011 has an interrupt")),
            boot_timer: (self.start, Box::new(report_boot_time)),
            vmgenid: VmGenIdArgs {
                ram: self.ram.clone(),
                irq: (self.irq)(layout::VMGENID_INTID),
                id: self.generation_id,
            },
            net: self.net.map(|n| {
                (
                    n,
                    self.ram.clone(),
                    spi(NET, "virtio slots have interrupts"),
                )
            }),
            vsock: self.vsock.map(|v| {
                (
                    v,
                    self.ram.clone(),
                    spi(VSOCK, "virtio slots have interrupts"),
                )
            }),
            blk: (disk, self.ram, spi(BLK, "virtio slots have interrupts")),
        }
    }
}

/// The boot timer's report: `Guest-boot-time = N ms` on the console.
fn report_boot_time(elapsed: Duration) {
    console::message(&BootTimer::message(elapsed));
}

/// A device's level-triggered SPI: drives the interrupt controller's input
/// and, when raised, wakes the vCPUs the interrupt may be for.
pub(super) struct SpiLine {
    intid: u32,
    irqchip: Irqchip,
    control: Arc<Control>,
}

impl SpiLine {
    /// The line of SPI `intid` at `irqchip`, waking vCPUs through `control`.
    pub(super) fn connect(intid: u32, irqchip: Irqchip, control: Arc<Control>) -> Arc<dyn IrqLine> {
        Arc::new(SpiLine {
            intid,
            irqchip,
            control,
        })
    }
}

impl IrqLine for SpiLine {
    fn set_level(&self, level: bool) {
        self.irqchip.set_spi(self.intid, level);
        if level {
            self.control.interrupts_changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::PAGE_SIZE;

    struct NoIrq;
    impl IrqLine for NoIrq {
        fn set_level(&self, _level: bool) {}
    }

    fn args(disk_len: u64) -> DeviceArgs {
        let disk = tempfile::tempfile().unwrap();
        disk.set_len(disk_len).unwrap();
        DeviceArgs {
            ram: Arc::new(GuestRam::new_anonymous(64 * PAGE_SIZE).unwrap()),
            irq: Box::new(|_| Arc::new(NoIrq)),
            console: Box::new(std::io::sink()),
            start: Instant::now(),
            disk: BackingFile::ready(disk),
            disk_len,
            generation_id: [disk_len as u8; 16],
            net: None,
            vsock: None,
        }
    }

    #[test]
    fn regions_are_the_layouts() {
        let d = Devices::new(args(1 << 20)).unwrap();
        let regions: Vec<_> = d.regions().iter().map(|r| (r.0, r.1, r.2)).collect();
        let blk = layout::virtio_mmio(layout::VIRTIO_BLK_SLOT);
        assert_eq!(
            regions,
            [
                ("pl011", layout::PL011.base, layout::PL011.size),
                (
                    "boot-timer",
                    layout::BOOT_TIMER.base,
                    layout::BOOT_TIMER.size
                ),
                ("virtio-blk", blk.base, blk.size),
            ]
        );
        // Every virtio region is a slot the device tree lists, and back.
        let slots: Vec<u32> = Devices::virtio_slots(false, false);
        let virtio: Vec<u32> = regions
            .iter()
            .filter(|r| r.1 >= layout::VIRTIO_MMIO_BASE)
            .map(|r| ((r.1 - layout::VIRTIO_MMIO_BASE) / layout::VIRTIO_MMIO_SIZE) as u32)
            .collect();
        assert_eq!(virtio, slots);
    }

    #[test]
    fn save_restore_round_trip() {
        let d = Devices::new(args(1 << 20)).unwrap();
        assert_eq!(d.console_input(b"x"), 0, "the receiver starts disabled");
        let state = d.save();
        let mut fresh = args(1 << 20);
        fresh.generation_id = [0xee; 16];
        let back = Devices::restore(fresh, &state).unwrap();
        // All the same but the VM generation ID, which a restore renews.
        let mut expect = state.clone();
        expect.vmgenid.as_mut().unwrap().id = [0xee; 16];
        assert_eq!(back.save(), expect);
        // A snapshot from before the VM generation ID restores without one.
        let old = DevicesState {
            vmgenid: None,
            ..state.clone()
        };
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("vmgenid"), "{json}");
        let back: DevicesState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, old);
        assert_eq!(Devices::restore(args(1 << 20), &old).unwrap().save(), old);
        // The disk must keep its shape.
        let e = Devices::restore(args(1 << 19), &state).err().unwrap();
        assert!(
            format!("{e:#}").starts_with("cannot restore virtio-blk"),
            "{e:#}"
        );
        let mut bad = state.clone();
        bad.pl011.cr = u32::MAX;
        let e = Devices::restore(args(1 << 20), &bad).err().unwrap();
        assert!(
            format!("{e:#}").starts_with("cannot restore the PL011"),
            "{e:#}"
        );
    }
}
