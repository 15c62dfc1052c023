//! The machine's device set: the console UART, the boot timer, the VM
//! generation ID and the virtio devices, each at its region of the memory
//! map ([`crate::arch::layout`]) with its interrupt line. The set gives the
//! MMIO bus its regions, the device tree its virtio-mmio slots, and a
//! snapshot the devices' state ([`DevicesState`]). The wing also holds the
//! interrupt controller ([`irqchip`]) and the root disk's file
//! ([`root_disk`]).
//!
//! A new device takes its region (and SPI) in the layout, its model in
//! [`crate::devices`], and here: a field of [`Devices`], of
//! [`DevicesState`] and of `Parts` (its construction arguments), its
//! construction in [`Devices::new`] and in the restore, and its entry in
//! [`Devices::regions`]; a virtio device also its slot in
//! [`Devices::virtio_slots`].

pub mod irqchip;
pub mod root_disk;
mod rtc;

use crate::arch::layout::{self, MmioRegion};
use crate::console;
use crate::devices::boot_timer::{BootTimer, BootTimerState};
use crate::devices::bus::BusRegion;
use crate::devices::pl011::{Pl011, Pl011State};
use crate::devices::pl031::{HostClock, Pl031, Pl031State, WallClock};
use crate::devices::virtio::block::{Block, BlockArgs, BlockDisk, BlockState};
use crate::devices::virtio::host_io::HostIo;
use crate::devices::virtio::mmio::{VirtioMmio, VirtioMmioState};
use crate::devices::virtio::net::host_end::{self, OpenedHostEnd};
use crate::devices::virtio::net::{format_mac, Net, NetArgs, NetState};
use crate::devices::virtio::vsock::{self, Vsock, VsockArgs, VsockHost, VsockState};
use crate::devices::virtio::VirtioDevice;
use crate::devices::vmgenid::{VmGenId, VmGenIdArgs, VmGenIdState};
use crate::devices::{IrqLine, MmioDevice, Persist};
use crate::memory::GuestRam;
use crate::sync::Locked;
use anyhow::Context;
use rtc::Rtc;
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

/// What the devices are made from, besides a saved state.
pub struct DeviceArgs {
    /// Guest RAM, which the virtio devices' queues live in.
    pub ram: Arc<GuestRam>,
    /// The line of SPI `intid` (a running VM's drives the interrupt
    /// controller and wakes the vCPUs).
    pub irq: Box<dyn Fn(u32) -> Arc<dyn IrqLine>>,
    /// Where the console UART's output goes.
    pub console: Box<dyn Write + Send>,
    /// When the VM started: the boot timer reports the time since.
    pub start: Instant,
    /// The root disk.
    pub disk: BlockDisk,
    /// The root disk's length in bytes.
    pub disk_len: u64,
    /// The VM generation ID to publish: fresh host randomness, on every
    /// boot and every restore.
    pub generation_id: [u8; 16],
    /// The network device, if the VM has one.
    pub net: Option<NetDeviceArgs>,
    /// The vsock device, if the VM has one.
    pub vsock: Option<VsockDeviceArgs>,
}

/// The vsock device's construction arguments.
pub struct VsockDeviceArgs {
    /// Its host end, listening.
    pub host: VsockHost,
    /// The guest's CID; `None` in a restore keeps the snapshot's (a fresh
    /// boot always has one).
    pub cid: Option<u64>,
}

/// The network device's construction arguments.
pub struct NetDeviceArgs {
    /// Its host end, opened.
    pub end: OpenedHostEnd,
    /// Its MAC address; `None` in a restore keeps the snapshot's, another
    /// replaces it (a fresh boot always has one).
    pub mac: Option<[u8; 6]>,
}

/// A virtio device on its MMIO transport, with the host I/O thread that
/// serves its host end, if it has one (stopped when the slot is dropped).
struct VirtioSlot<D: VirtioDevice> {
    dev: Arc<Mutex<VirtioMmio<D>>>,
    _io: Option<HostIo>,
}

impl<D: VirtioDevice + 'static> VirtioSlot<D> {
    /// `dev` in a slot, with the host I/O thread `io` starts for it.
    fn start(
        dev: VirtioMmio<D>,
        io: impl FnOnce(Arc<Mutex<VirtioMmio<D>>>) -> std::io::Result<HostIo>,
    ) -> anyhow::Result<Self> {
        let name = dev.device().name();
        let dev = Arc::new(Mutex::new(dev));
        let io = io(dev.clone())
            .with_context(|| format!("cannot start the {name} device's host I/O thread"))?;
        Ok(VirtioSlot { dev, _io: Some(io) })
    }

    /// `dev` in a slot, without a host I/O thread.
    fn without_io(dev: VirtioMmio<D>) -> Self {
        VirtioSlot {
            dev: Arc::new(Mutex::new(dev)),
            _io: None,
        }
    }

    /// [`VirtioMmio::prepare_save`], its failure naming the device.
    fn prepare_save(&self) -> anyhow::Result<()> {
        let mut dev = self.dev.locked();
        let name = dev.device().name();
        dev.prepare_save()
            .with_context(|| format!("cannot prepare the {name} device for a snapshot"))
    }

    /// [`VirtioMmio::after_save`].
    fn after_save(&self) {
        self.dev.locked().after_save();
    }

    /// Its bus region at `r`, named as the device names itself.
    fn region(&self, r: MmioRegion) -> BusRegion {
        let name = self.dev.locked().device().name();
        let dev: Arc<Mutex<dyn MmioDevice>> = self.dev.clone();
        (name, r.base, r.size, dev)
    }
}

/// The devices of a VM (the interrupt controller aside: see [`irqchip`]).
pub struct Devices {
    /// The console UART, fed by the console input thread.
    uart: Arc<Mutex<Pl011>>,
    /// The real-time clock and its alarm thread.
    rtc: Rtc,
    boot_timer: Arc<Mutex<BootTimer>>,
    /// The root block device, whose disk snapshots capture.
    blk: VirtioSlot<Block>,
    /// The VM generation ID; absent in a VM restored from a snapshot taken
    /// before Ignition had one (that guest's device tree lacks it, and its
    /// last RAM page is ordinary memory).
    vmgenid: Option<VmGenId>,
    /// The network device (`boot --net`).
    net: Option<VirtioSlot<Net>>,
    /// The vsock device (`boot --vsock-uds`).
    vsock: Option<VirtioSlot<Vsock>>,
}

/// The devices' saved states. The snapshot's machine state flattens it:
/// each field is a top-level key of the state file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DevicesState {
    /// The console UART.
    pub pl011: Pl011State,
    /// The real-time clock (absent in snapshots from before it existed:
    /// such a VM gets a fresh one, reading the host's time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pl031: Option<Pl031State>,
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

/// The network device on `args`' host end, fresh or from `saved`, its
/// receiver thread started.
fn start_net(
    args: NetDeviceArgs,
    saved: Option<&VirtioMmioState<NetState>>,
    ram: Arc<GuestRam>,
    irq: Arc<dyn IrqLine>,
) -> anyhow::Result<VirtioSlot<Net>> {
    let NetDeviceArgs {
        end: OpenedHostEnd { backend, frames },
        mac,
    } = args;
    let dev = match saved {
        None => {
            let mac = mac.context("a fresh network device needs a MAC")?;
            VirtioMmio::new(Net::new(mac, backend), ram, irq)
                .expect("a fresh virtio-net transport is valid")
        }
        Some(saved) => {
            let args = NetArgs { mac, backend };
            VirtioMmio::restore((args, ram, irq), saved).context("cannot restore virtio-net")?
        }
    };
    VirtioSlot::start(dev, |dev| host_end::spawn_receiver(dev, frames))
}

/// The vsock device on `args`' host end, fresh or from `saved`, its host
/// I/O thread started; a restored one tells the guest that its
/// connections are gone (virtio 1.2 §5.10.6.6).
fn start_vsock(
    args: VsockDeviceArgs,
    saved: Option<&VirtioMmioState<VsockState>>,
    ram: Arc<GuestRam>,
    irq: Arc<dyn IrqLine>,
) -> anyhow::Result<VirtioSlot<Vsock>> {
    let dev = match saved {
        None => {
            let cid = args.cid.context("a fresh vsock device needs a CID")?;
            VirtioMmio::new(Vsock::new(cid, args.host), ram, irq)
                .expect("a fresh virtio-vsock transport is valid")
        }
        Some(saved) => {
            let args = VsockArgs {
                cid: args.cid,
                host: args.host,
            };
            VirtioMmio::restore((args, ram, irq), saved).context("cannot restore virtio-vsock")?
        }
    };
    let slot = VirtioSlot::start(dev, vsock::host_end::spawn_host_thread)?;
    if saved.is_some() {
        slot.dev.locked().kick(vsock::EVENT_QUEUE);
    }
    Ok(slot)
}

/// An optional device of a restore: started from its saved state when the
/// snapshot has it and the command line names it (`args`), absent when
/// neither does, and refused when only one does: `missing_args` says what
/// to pass, `missing_saved` what to drop.
fn restore_optional<A, S, T>(
    args: Option<A>,
    saved: Option<&S>,
    start: impl FnOnce(A, &S) -> anyhow::Result<T>,
    missing_args: impl FnOnce(&S) -> String,
    missing_saved: &str,
) -> anyhow::Result<Option<T>> {
    match (args, saved) {
        (None, None) => Ok(None),
        (Some(a), Some(s)) => start(a, s).map(Some),
        (None, Some(s)) => anyhow::bail!("{}", missing_args(s)),
        (Some(_), None) => anyhow::bail!("{missing_saved}"),
    }
}

impl Devices {
    /// The virtio-mmio slots that hold a device, for the device tree (which
    /// is written before the devices exist): the root disk's, and the
    /// network and vsock devices' if there are.
    pub fn virtio_slots(net: bool, vsock: bool) -> Vec<u32> {
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
    pub fn new(args: DeviceArgs) -> anyhow::Result<Self> {
        let p = args.split();
        let (out, irq) = p.uart;
        let (clock, irq_rtc) = p.rtc;
        let rtc = Rtc::start(Pl031::new(clock.clone(), irq_rtc), clock)
            .context("cannot start the RTC's alarm thread")?;
        let (start, report) = p.boot_timer;
        let (disk, ram, irq_blk) = p.blk;
        let disk = Block::with_disk(disk.disk, disk.len, disk.read_only, &disk.serial);
        let net = p
            .net
            .map(|(args, ram, irq)| start_net(args, None, ram, irq))
            .transpose()?;
        let vsock = p
            .vsock
            .map(|(args, ram, irq)| start_vsock(args, None, ram, irq))
            .transpose()?;
        Ok(Devices {
            uart: Arc::new(Mutex::new(Pl011::new(out, irq))),
            rtc,
            boot_timer: Arc::new(Mutex::new(BootTimer::new(start, report))),
            blk: VirtioSlot::without_io(
                VirtioMmio::new(disk, ram, irq_blk).expect("a fresh virtio-blk transport is valid"),
            ),
            vmgenid: Some(VmGenId::new(p.vmgenid)?),
            net,
            vsock,
        })
    }

    /// The devices' MMIO regions, at their places in the layout.
    pub fn regions(&self) -> Vec<BusRegion> {
        let uart: Arc<Mutex<dyn MmioDevice>> = self.uart.clone();
        let timer: Arc<Mutex<dyn MmioDevice>> = self.boot_timer.clone();
        let at = |name, r: MmioRegion, dev| (name, r.base, r.size, dev);
        vec![
            at("pl011", layout::PL011, uart),
            self.rtc
                .region("pl031", layout::PL031.base, layout::PL031.size),
            at("boot-timer", layout::BOOT_TIMER, timer),
            self.blk.region(BLK),
        ]
        .into_iter()
        .chain(self.net.as_ref().map(|n| n.region(NET)))
        .chain(self.vsock.as_ref().map(|v| v.region(VSOCK)))
        .collect()
    }

    /// Hands console input to the UART; returns how many leading bytes it
    /// took (see [`Pl011::enqueue_rx`]).
    pub fn console_input(&self, bytes: &[u8]) -> usize {
        self.uart.locked().enqueue_rx(bytes)
    }

    /// Before a snapshot: waits until no device has a request in flight,
    /// and holds the devices that write guest RAM on their own (their host
    /// ends go on within their bounds); [`Devices::after_save`] ends it.
    pub fn prepare_save(&self) -> anyhow::Result<()> {
        self.blk.prepare_save()?;
        if let Some(n) = &self.net {
            n.prepare_save()?;
        }
        if let Some(v) = &self.vsock {
            v.prepare_save()?;
        }
        Ok(())
    }

    /// Ends what [`Devices::prepare_save`] held: frames and bytes that
    /// arrived meanwhile go to the guest.
    pub fn after_save(&self) {
        self.blk.after_save();
        if let Some(n) = &self.net {
            n.after_save();
        }
        if let Some(v) = &self.vsock {
            v.after_save();
        }
    }

    /// Whether the guest's init has written the boot timer (its userspace
    /// is up).
    pub fn guest_userspace_up(&self) -> bool {
        self.boot_timer.locked().fired()
    }

    /// Whether the guest has handled a restored vsock device's
    /// transport reset ([`Vsock::reset_handled`]; true without a vsock
    /// device or a restore).
    pub fn vsock_reset_handled(&self) -> bool {
        self.vsock.as_ref().is_none_or(|v| {
            let m = v.dev.locked();
            m.device().reset_handled(m.avail_idx(vsock::EVENT_QUEUE))
        })
    }

    /// The VM generation ID the guest sees, if the VM has the device (a VM
    /// restored from a snapshot taken before Ignition had it does not).
    pub fn generation_id(&self) -> Option<[u8; 16]> {
        self.vmgenid.as_ref().map(VmGenId::id)
    }

    /// The guest's vsock CID, if the VM has a vsock device.
    pub fn vsock_cid(&self) -> Option<u64> {
        self.vsock.as_ref().map(|v| v.dev.locked().device().cid())
    }

    /// The network device's MAC address, if the VM has one.
    pub fn net_mac(&self) -> Option<[u8; 6]> {
        self.net.as_ref().map(|n| n.dev.locked().device().mac())
    }

    /// At the VM's end: removes the files the devices made on the host
    /// (the vsock device's socket file), whoever still holds them.
    pub fn remove_host_files(&self) {
        if let Some(v) = &self.vsock {
            v.dev.locked().device_mut().remove_socket_file();
        }
    }

    /// The root block device, whose disk image a snapshot captures.
    pub fn root_disk(&self) -> MutexGuard<'_, VirtioMmio<Block>> {
        self.blk.dev.locked()
    }

    /// Holds every device that writes guest RAM (its DMA: virtqueue
    /// buffers and used rings) until the result is dropped; a vCPU or host
    /// thread that reaches one meanwhile waits.
    pub fn hold_ram_writers(&self) -> RamWritersHeld<'_> {
        // Always in this order (no other path holds two device locks).
        RamWritersHeld {
            _blk: self.blk.dev.locked(),
            _net: self.net.as_ref().map(|n| n.dev.locked()),
            _vsock: self.vsock.as_ref().map(|v| v.dev.locked()),
        }
    }
}

/// The devices that write guest RAM, held ([`Devices::hold_ram_writers`]).
pub struct RamWritersHeld<'a> {
    _blk: MutexGuard<'a, VirtioMmio<Block>>,
    _net: Option<MutexGuard<'a, VirtioMmio<Net>>>,
    _vsock: Option<MutexGuard<'a, VirtioMmio<Vsock>>>,
}

impl Persist for Devices {
    type State = DevicesState;
    type Args = DeviceArgs;
    type Error = anyhow::Error;

    /// The devices' state, for a snapshot (every vCPU parked, devices
    /// prepared).
    fn save(&self) -> DevicesState {
        DevicesState {
            pl011: self.uart.locked().save(),
            pl031: Some(self.rtc.device().locked().save()),
            boot_timer: self.boot_timer.locked().save(),
            virtio_blk: self.blk.dev.locked().save(),
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
        let (clock, irq_rtc) = p.rtc;
        let rtc = match &state.pl031 {
            Some(s) => {
                Pl031::restore((clock.clone(), irq_rtc), s).context("cannot restore the PL031")?
            }
            None => Pl031::new(clock.clone(), irq_rtc),
        };
        let rtc = Rtc::start(rtc, clock).context("cannot start the RTC's alarm thread")?;
        let boot_timer = BootTimer::restore(p.boot_timer, &state.boot_timer)?;
        let blk =
            VirtioMmio::restore(p.blk, &state.virtio_blk).context("cannot restore virtio-blk")?;
        let net = restore_optional(
            p.net,
            state.virtio_net.as_ref(),
            |(args, ram, irq), saved| start_net(args, Some(saved), ram, irq),
            |saved| {
                format!(
                    "the snapshot's VM has a network device (MAC {}) and the command line none: pass --net (stream:PATH or tap:NAME) to restore it",
                    format_mac(&saved.device.mac)
                )
            },
            "the snapshot's VM has no network device: a restore cannot add one (drop --net)",
        )?;
        let vsock = restore_optional(
            p.vsock,
            state.virtio_vsock.as_ref(),
            |(args, ram, irq), saved| start_vsock(args, Some(saved), ram, irq),
            |saved| {
                format!(
                    "the snapshot's VM has a vsock device (CID {}) and the command line none: pass --vsock-uds PATH to restore it",
                    saved.device.cid
                )
            },
            "the snapshot's VM has no vsock device: a restore cannot add one (drop --vsock-uds)",
        )?;
        // Last: it raises its interrupt.
        let vmgenid = state
            .vmgenid
            .as_ref()
            .map(|s| VmGenId::restore(p.vmgenid, s))
            .transpose()?;
        Ok(Devices {
            uart: Arc::new(Mutex::new(uart)),
            rtc,
            boot_timer: Arc::new(Mutex::new(boot_timer)),
            blk: VirtioSlot::without_io(blk),
            vmgenid,
            net,
            vsock,
        })
    }
}

/// Each device's construction arguments ([`Persist::Args`]).
struct Parts {
    uart: <Pl011 as Persist>::Args,
    rtc: <Pl031 as Persist>::Args,
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
            disk: self.disk,
            len: self.disk_len,
            read_only: false,
            serial: ROOT_DISK_SERIAL.into(),
        };
        Parts {
            uart: (self.console, spi(layout::PL011, "PL011 has an interrupt")),
            rtc: (
                Arc::new(HostClock) as Arc<dyn WallClock>,
                spi(layout::PL031, "PL031 has an interrupt"),
            ),
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
            disk: BlockDisk::File(Arc::new(disk)),
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
                ("pl031", layout::PL031.base, layout::PL031.size),
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
        assert_eq!(
            d.console_input(b"x"),
            1,
            "the receiver takes input out of reset (CR.RXE)"
        );
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
