//! A misbehaving guest against every device model: long pseudo-random
//! sequences of MMIO accesses (any offset in and just past each region, any
//! size, any alignment, any value), GIC system-register accesses with any
//! encoding, and virtqueues set up at random guest addresses over RAM full of
//! random bytes. The host must never panic; whatever the guest gets back (an
//! error, a fault, zeros) is allowed. Deterministic (fixed seeds), so a
//! failure reproduces.

use crate::arch::layout::{self, RAM_BASE};
use crate::arch::sysreg::SysReg;
use crate::devices::boot_timer::BootTimer;
use crate::devices::bus::MmioBus;
use crate::devices::gicv3::{GicDistMmio, GicRedistMmio, Gicv3};
use crate::devices::pl011::tests::TestIrq;
use crate::devices::pl011::Pl011;
use crate::devices::pl031::{HostClock, Pl031};
use crate::devices::virtio::block::Block;
use crate::devices::virtio::net::{Net, NetBackend, MAX_FRAME_LEN, RX_BACKLOG_FRAMES};
use crate::devices::virtio::vsock::{self, Vsock, VsockHost};
use crate::devices::virtio::{VirtioDevice, VirtioMmio};
use crate::devices::{MmioDevice, Persist};
use crate::memory::GuestRam;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vm_memory::{Bytes, GuestAddress};

const VCPUS: usize = 2;
/// Guest RAM of the test machine: 1 MiB.
const RAM_SIZE: u64 = 1 << 20;

/// xorshift64*: deterministic and good enough to spread accesses.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A network host end that counts what it is sent and refuses some.
struct CountingEnd(u64);

impl NetBackend for CountingEnd {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        assert!(frame.len() <= MAX_FRAME_LEN);
        self.0 += 1;
        if self.0 % 7 == 0 {
            return Err(std::io::Error::other("refused"));
        }
        Ok(())
    }
}

/// The machine's devices on a bus at the layout's addresses, over `ram`.
struct Machine {
    bus: MmioBus,
    blk: Arc<Mutex<VirtioMmio<Block>>>,
    net: Arc<Mutex<VirtioMmio<Net>>>,
    vsock: Arc<Mutex<VirtioMmio<Vsock>>>,
    /// (base, size) of every region, for choosing addresses.
    regions: Vec<(u64, u64)>,
    _disk: tempfile::NamedTempFile,
    /// The vsock host end's directory: `v.sock`, and a host program's
    /// `v.sock_5000` that never accepts.
    vsock_dir: tempfile::TempDir,
    _vsock_listener: std::os::unix::net::UnixListener,
}

fn machine(ram: &Arc<GuestRam>) -> Machine {
    let gic = Arc::new(Mutex::new(Gicv3::new(VCPUS)));
    let mut bus = MmioBus::new();
    let mut regions = Vec::new();
    let mut add = |name, base, size, dev: Arc<Mutex<dyn MmioDevice>>| {
        bus.insert(name, base, size, dev).unwrap();
        regions.push((base, size));
    };
    add(
        "gicd",
        layout::GICD_BASE,
        layout::GICD_SIZE,
        Arc::new(Mutex::new(GicDistMmio(gic.clone()))),
    );
    add(
        "gicr",
        layout::GICR_BASE,
        layout::GICR_STRIDE * VCPUS as u64,
        Arc::new(Mutex::new(GicRedistMmio(gic.clone()))),
    );
    add(
        "pl011",
        layout::PL011.base,
        layout::PL011.size,
        Arc::new(Mutex::new(Pl011::new(
            Box::new(std::io::sink()),
            Arc::new(TestIrq::default()),
        ))),
    );
    add(
        "pl031",
        layout::PL031.base,
        layout::PL031.size,
        Arc::new(Mutex::new(Pl031::new(
            Arc::new(HostClock),
            Arc::new(TestIrq::default()),
        ))),
    );
    add(
        "boot-timer",
        layout::BOOT_TIMER.base,
        layout::BOOT_TIMER.size,
        Arc::new(Mutex::new(BootTimer::new(Instant::now(), Box::new(|_| {})))),
    );
    let disk = tempfile::NamedTempFile::new().unwrap();
    disk.as_file().set_len(64 * 1024).unwrap();
    let block = Block::new(disk.reopen().unwrap(), false, "hostile").unwrap();
    let blk = Arc::new(Mutex::new(
        VirtioMmio::new(block, ram.clone(), Arc::new(TestIrq::default())).unwrap(),
    ));
    let region = layout::virtio_mmio(layout::VIRTIO_BLK_SLOT);
    add("virtio-blk", region.base, region.size, blk.clone());
    let net = Net::new([0x52, 0x54, 0, 0, 0, 1], Box::new(CountingEnd(0)));
    let net = Arc::new(Mutex::new(
        VirtioMmio::new(net, ram.clone(), Arc::new(TestIrq::default())).unwrap(),
    ));
    let region = layout::virtio_mmio(layout::VIRTIO_NET_SLOT);
    add("virtio-net", region.base, region.size, net.clone());
    let vsock_dir = tempfile::tempdir().unwrap();
    let host = VsockHost::bind(&vsock_dir.path().join("v.sock")).unwrap();
    let listener =
        std::os::unix::net::UnixListener::bind(vsock_dir.path().join("v.sock_5000")).unwrap();
    let vsock = Arc::new(Mutex::new(
        VirtioMmio::new(
            Vsock::new(3, host),
            ram.clone(),
            Arc::new(TestIrq::default()),
        )
        .unwrap(),
    ));
    let region = layout::virtio_mmio(layout::VIRTIO_VSOCK_SLOT);
    add("virtio-vsock", region.base, region.size, vsock.clone());
    Machine {
        bus,
        blk,
        net,
        vsock,
        regions,
        _disk: disk,
        vsock_dir,
        _vsock_listener: listener,
    }
}

/// One access of a random size (including invalid ones) at a random offset
/// in, or just past, a random region.
fn random_access(m: &Machine, rng: &mut Rng) {
    let (base, size) = m.regions[rng.below(m.regions.len() as u64) as usize];
    let offset = rng.below(size + 0x100);
    let len = [1, 2, 4, 8, 3, 16, 0][rng.below(7) as usize];
    let vcpu = rng.below(VCPUS as u64 + 1) as usize;
    let mut data = vec![0u8; len];
    if rng.below(2) == 0 {
        let _ = m.bus.read(vcpu, base + offset, &mut data);
    } else {
        for b in &mut data {
            *b = rng.next() as u8;
        }
        let _ = m.bus.write(vcpu, base + offset, &data);
    }
}

fn fill_ram(ram: &GuestRam, rng: &mut Rng) {
    let mut page = vec![0u8; 4096];
    for at in (0..RAM_SIZE).step_by(page.len()) {
        for b in &mut page {
            *b = rng.next() as u8;
        }
        ram.memory()
            .write_slice(&page, GuestAddress(RAM_BASE + at))
            .unwrap();
    }
}

/// A random guest address: mostly inside RAM, sometimes anywhere.
fn guest_addr(rng: &mut Rng) -> u64 {
    if rng.below(8) == 0 {
        rng.next()
    } else {
        RAM_BASE + rng.below(RAM_SIZE + 0x1000)
    }
}

#[test]
fn random_mmio_never_panics_the_host() {
    let ram = Arc::new(GuestRam::new_anonymous(RAM_SIZE).unwrap());
    let m = machine(&ram);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for _ in 0..200_000 {
        random_access(&m, &mut rng);
    }
}

#[test]
fn random_gic_system_registers_never_panic_the_host() {
    let mut gic = Gicv3::new(VCPUS);
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for i in 0..200_000u64 {
        // Mostly the ICC space (op0 3, op1 0 or 6, CRn 12), sometimes any.
        let reg = if rng.below(4) == 0 {
            SysReg::new(
                rng.below(4) as u8,
                rng.below(8) as u8,
                rng.below(16) as u8,
                rng.below(16) as u8,
                rng.below(8) as u8,
            )
        } else {
            SysReg::new(
                3,
                [0, 6][rng.below(2) as usize],
                12,
                rng.below(16) as u8,
                rng.below(8) as u8,
            )
        };
        let vcpu = rng.below(VCPUS as u64) as usize;
        if rng.below(2) == 0 {
            let _ = gic.sysreg_read(vcpu, reg);
        } else {
            let _ = gic.sysreg_write(vcpu, reg, rng.next());
        }
        if i % 16 == 0 {
            gic.set_spi_level(rng.below(1100) as u32, rng.below(2) == 0);
            gic.set_ppi_level(vcpu, rng.below(40) as u32, rng.below(2) == 0);
        }
        let _ = gic.irq_pending(vcpu);
    }
    // The state of a GIC driven like that still saves and restores.
    let state = gic.save();
    Gicv3::restore(VCPUS, &state).unwrap();
}

/// Saved PL031 states with any field values: the restore refuses or
/// accepts them without panicking, and an accepted RTC then survives any
/// access, its next alarm and updates.
#[test]
fn random_pl031_states_never_panic_the_host() {
    use crate::devices::pl031::Pl031State;
    let mut rng = Rng(0x0bad_c0de_0031_f00d);
    let edge = [0, 1, -1, i64::MAX, i64::MIN, 1 << 40, -(1 << 40), 1 << 41];
    for _ in 0..20_000 {
        let pick = |rng: &mut Rng| {
            if rng.below(2) == 0 {
                edge[rng.below(edge.len() as u64) as usize]
            } else {
                rng.next() as i64 >> rng.below(64)
            }
        };
        let state = Pl031State {
            offset_s: pick(&mut rng),
            seen: pick(&mut rng),
            mr: rng.next() as u32,
            lr: rng.next() as u32,
            imsc: rng.below(4) as u32,
            ris: rng.below(4) as u32,
        };
        let irq = Arc::new(TestIrq::default());
        let Ok(mut rtc) = Pl031::restore((Arc::new(HostClock), irq), &state) else {
            continue;
        };
        for _ in 0..4 {
            let offset = rng.below(0x1100);
            let mut data = vec![0u8; [1, 2, 4, 8, 3][rng.below(5) as usize]];
            if rng.below(2) == 0 {
                let _ = rtc.read(0, offset, &mut data);
            } else {
                data.iter_mut().for_each(|b| *b = rng.next() as u8);
                let _ = rtc.write(0, offset, &data);
            }
        }
        let _ = rtc.next_match();
        rtc.update();
    }
}

/// A virtio-blk request header: type IN, OUT, FLUSH, GET_ID or junk; sector.
fn blk_header(rng: &mut Rng) -> Vec<u8> {
    let kind = [0u32, 1, 4, 8, rng.next() as u32][rng.below(5) as usize];
    let mut h = vec![0u8; 16];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[8..].copy_from_slice(&rng.below(200).to_le_bytes());
    h
}

/// A `virtio_net_hdr` (virtio 1.2 §5.1.6) that mostly asks for a checksum
/// (NEEDS_CSUM), with offsets in, at the edge of, or far past a frame,
/// and sometimes a GSO type.
fn net_header(rng: &mut Rng) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[0] = [1, 1, 1, 0, rng.next() as u8][rng.below(5) as usize];
    h[1] = if rng.below(4) == 0 {
        rng.next() as u8
    } else {
        0
    };
    let off =
        |rng: &mut Rng| [0u16, 14, 34, 54, 60, 4095, rng.next() as u16][rng.below(7) as usize];
    let (start, offset) = (
        off(rng),
        off(rng) % [1, 20, u16::MAX][rng.below(3) as usize],
    );
    h[6..8].copy_from_slice(&start.to_le_bytes());
    h[8..10].copy_from_slice(&offset.to_le_bytes());
    h
}

/// A vsock packet header (virtio 1.2 §5.10.6) that is mostly plausible:
/// the guest's and host's CIDs, a few ports (5000 has a host listener),
/// any operation, length, flags and credit.
fn vsock_header(rng: &mut Rng) -> Vec<u8> {
    use vsock::packet::{Header, HOST_CID};
    let pick = |rng: &mut Rng, usual: u64| if rng.below(8) == 0 { rng.next() } else { usual };
    let h = Header {
        src_cid: pick(rng, 3),
        dst_cid: pick(rng, HOST_CID),
        src_port: 1000 + rng.below(8) as u32,
        dst_port: [5000, 5001, rng.next() as u32][rng.below(3) as usize],
        len: [0, 0, 0, 5, 4096, 65537, rng.next() as u32][rng.below(7) as usize],
        kind: pick(rng, 1) as u16,
        // Mostly REQUEST and RW, so that connections are made and used.
        op: [1, 1, 5, 5, rng.below(9)][rng.below(5) as usize] as u16,
        flags: rng.below(4) as u32,
        buf_alloc: pick(rng, 256 << 10) as u32,
        fwd_cnt: rng.next() as u32,
    };
    h.to_bytes().to_vec()
}

/// Writes a plausible but hostile request at `desc`/`avail` (both in RAM):
/// a chain of up to 4 descriptors with random lengths, flags, addresses and
/// (from `header`) request header, published as avail entry 0.
fn plant_request(
    ram: &GuestRam,
    rng: &mut Rng,
    desc: u64,
    avail: u64,
    qsize: u16,
    header: fn(&mut Rng) -> Vec<u8>,
) {
    let mem = ram.memory();
    let n = 1 + rng.below(4) as u16;
    for i in 0..n {
        let addr = if rng.below(4) == 0 {
            guest_addr(rng)
        } else {
            RAM_BASE + rng.below(RAM_SIZE)
        };
        // Half the chains start with a plausible header; half of those in a
        // descriptor that holds it (and some payload), device-readable.
        let planted = (i == 0 && rng.below(2) == 0).then(|| header(rng));
        let fits = planted.is_some() && rng.below(2) == 0;
        let len = match &planted {
            Some(h) if fits => h.len() as u32 + rng.below(4097) as u32,
            _ => [16u32, 1, 512, 4096, 0, rng.next() as u32][rng.below(6) as usize],
        };
        let mut flags: u16 = if !fits && rng.below(3) == 0 { 2 } else { 0 }; // WRITE
        let mut next = i + 1;
        if i + 1 < n {
            flags |= 1; // NEXT
        }
        if rng.below(16) == 0 {
            next = rng.next() as u16; // out of range or a loop
            flags |= 1;
        }
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        let _ = mem.write_slice(&d, GuestAddress(desc + 16 * u64::from(i)));
        if let Some(h) = planted {
            let _ = mem.write_slice(&h, GuestAddress(addr));
        }
    }
    // avail: flags, idx = 1, ring[0] = 0 (sometimes a bad head).
    let head = if rng.below(8) == 0 {
        rng.next() as u16
    } else {
        0
    };
    let _ = mem.write_obj(0u16, GuestAddress(avail));
    let _ = mem.write_obj(
        1u16 + rng.below(u64::from(qsize)) as u16,
        GuestAddress(avail + 2),
    );
    let _ = mem.write_obj(head, GuestAddress(avail + 4));
}

/// Sets up queue `queue` of `dev` at random guest addresses (aligned as
/// virtio 1.2 §2.7 requires, except sometimes) with a random size, over
/// random RAM with a planted hostile request, as a driver that follows the
/// status protocol would; returns the used ring's address if it is in RAM.
fn hostile_queue<D: VirtioDevice>(
    ram: &GuestRam,
    rng: &mut Rng,
    dev: &Mutex<VirtioMmio<D>>,
    queue: u32,
    header: fn(&mut Rng) -> Vec<u8>,
) -> Option<u64> {
    use crate::devices::virtio::mmio::tests::w;
    fill_ram(ram, rng);
    let qsize = 1u16 << rng.below(9);
    let [desc, avail, used] = [16u64, 2, 4].map(|align| {
        let a = guest_addr(rng);
        if rng.below(8) == 0 {
            a
        } else {
            a & !(align - 1)
        }
    });
    let used_in_ram = (RAM_BASE..RAM_BASE + RAM_SIZE - 4).contains(&used);
    if (RAM_BASE..RAM_BASE + RAM_SIZE - 64).contains(&desc)
        && (RAM_BASE..RAM_BASE + RAM_SIZE - 8).contains(&avail)
    {
        plant_request(ram, rng, desc, avail, qsize, header);
    }
    if used_in_ram {
        ram.memory()
            .write_obj(0u16, GuestAddress(used + 2))
            .unwrap();
    }
    let mut d = dev.lock().unwrap();
    w(&mut *d, 0x070, 0); // reset
    for status in [1u32, 3] {
        w(&mut *d, 0x070, status);
    }
    // Any subset of the device's own features (mergeable receive buffers,
    // say), and VERSION_1 (bit 32).
    w(&mut *d, 0x024, 0); // DriverFeaturesSel
    let accepted = d.device().features() as u32 & rng.next() as u32;
    w(&mut *d, 0x020, accepted);
    w(&mut *d, 0x024, 1);
    w(&mut *d, 0x020, 1);
    w(&mut *d, 0x070, 11); // FEATURES_OK
    w(&mut *d, 0x030, queue); // QueueSel
    w(&mut *d, 0x038, u32::from(qsize)); // QueueNum
    for (reg, a) in [(0x080u64, desc), (0x090, avail), (0x0a0, used)] {
        w(&mut *d, reg, a as u32);
        w(&mut *d, reg + 4, (a >> 32) as u32);
    }
    w(&mut *d, 0x044, 1); // QueueReady
    w(&mut *d, 0x070, 15); // DRIVER_OK
    used_in_ram.then_some(used)
}

/// Notifies queue `queue` of the device in `slot` 8 times, with random
/// register noise in between; returns whether the used index moved.
fn notify_with_noise(
    m: &Machine,
    rng: &mut Rng,
    slot: u32,
    queue: u32,
    used: Option<u64>,
    ram: &GuestRam,
) -> bool {
    for _ in 0..8 {
        let _ = m.bus.write(
            0,
            layout::virtio_mmio(slot).base + 0x050,
            &queue.to_le_bytes(),
        );
        random_access(m, rng);
    }
    used.is_some_and(|u| ram.memory().read_obj::<u16>(GuestAddress(u + 2)).unwrap() != 0)
}

#[test]
fn virtqueues_at_random_addresses_over_random_memory_never_panic_the_host() {
    let ram = Arc::new(GuestRam::new_anonymous(RAM_SIZE).unwrap());
    let m = machine(&ram);
    let mut rng = Rng(0x0bad_5eed_0bad_5eed);
    // Requests the device completed (the used index it published moved).
    let mut completed = 0u32;
    for _ in 0..300 {
        let used = hostile_queue(&ram, &mut rng, &m.blk, 0, blk_header);
        completed += u32::from(notify_with_noise(
            &m,
            &mut rng,
            layout::VIRTIO_BLK_SLOT,
            0,
            used,
            &ram,
        ));
    }
    // The hostile requests reached the request path, not just the checks in
    // front of it.
    assert!(
        completed > 10,
        "only {completed} rounds completed a request"
    );
}

#[test]
fn a_hostile_network_driver_and_host_end_never_panic_or_grow_the_host() {
    let ram = Arc::new(GuestRam::new_anonymous(RAM_SIZE).unwrap());
    let m = machine(&ram);
    let mut rng = Rng(0x5eed_0fee_7000_0001);
    let mut completed = [0u32; 2];
    for round in 0..400 {
        let queue = round % 2;
        let header = [blk_header, net_header][queue as usize];
        let used = hostile_queue(&ram, &mut rng, &m.net, queue, header);
        // The host end floods the device with frames of any size, far more
        // than the backlog holds; some claim to be IPv4 or IPv6, with
        // random headers, for the receive checksum check.
        {
            let mut n = m.net.lock().unwrap();
            for _ in 0..rng.below(3000) {
                let len = [0, 13, 14, 60, 1514, 1600, 65535, 65536, 100_000][rng.below(9) as usize];
                let mut f = vec![0xa5; len];
                if len >= 54 && rng.below(2) == 0 {
                    for b in &mut f[14..54] {
                        *b = rng.next() as u8;
                    }
                    let (ethertype, version) =
                        [([8, 0], 0x45), ([0x86, 0xdd], 0x60)][rng.below(2) as usize];
                    f[12..14].copy_from_slice(&ethertype);
                    f[14] = version;
                }
                let _ = n.device_mut().receive(&f);
            }
            assert!(n.device().backlog_len() <= RX_BACKLOG_FRAMES);
        }
        completed[queue as usize] += u32::from(notify_with_noise(
            &m,
            &mut rng,
            layout::VIRTIO_NET_SLOT,
            queue,
            used,
            &ram,
        ));
    }
    // Both the receive and the transmit path were reached.
    assert!(
        completed.iter().all(|&c| c > 10),
        "rounds that used a buffer: {completed:?}"
    );
    let c = m.net.lock().unwrap().device().counters();
    assert!(
        c.rx_frames > 0 && c.rx_dropped > 0 && c.tx_dropped > 0,
        "{c:?}"
    );
}

#[test]
fn a_hostile_vsock_driver_and_host_programs_never_panic_or_grow_the_host() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let ram = Arc::new(GuestRam::new_anonymous(RAM_SIZE).unwrap());
    let m = machine(&ram);
    let mut rng = Rng(0x7650_c4ee_0000_0019);
    let uds = m.vsock_dir.path().join("v.sock");
    let mut programs = Vec::new();
    let mut completed = [0u32; 3];
    for round in 0..1200 {
        let queue = round % 3;
        let used = hostile_queue(&ram, &mut rng, &m.vsock, queue, vsock_header);
        // Host programs: good and bad CONNECT lines, then floods of data
        // (each receive-queue round has a request for the guest).
        if (queue == 0 || rng.below(4) == 0) && programs.len() < 2 * vsock::MAX_CONNECTIONS {
            if let Ok(mut s) = UnixStream::connect(&uds) {
                let line: &[u8] = match if queue == 0 { 0 } else { rng.below(4) } {
                    0 => b"CONNECT 1000\n",
                    1 => b"CONNECT x\n",
                    2 => &[b'7'; 64],
                    _ => b"CONNECT 1001\nand data at once",
                };
                let _ = s.set_nonblocking(true);
                let _ = s.write(line);
                let _ = s.write(&vec![0x5a; rng.below(1 << 18) as usize]);
                programs.push(s);
            }
        }
        {
            let mut d = m.vsock.lock().unwrap();
            // Accept, read the lines, move data.
            for _ in 0..3 {
                vsock::tests::pump_for(d.device_mut(), 0);
            }
            let v = d.device();
            assert!(v.connections() <= vsock::MAX_CONNECTIONS);
            assert!(
                v.host_buffered_bytes()
                    <= vsock::MAX_CONNECTIONS * (vsock::CONN_BUF_SIZE as usize + 32),
                "{} bytes buffered",
                v.host_buffered_bytes()
            );
            assert!(v.pending_control_packets() <= vsock::MAX_CONTROL);
        }
        completed[queue as usize] += u32::from(notify_with_noise(
            &m,
            &mut rng,
            layout::VIRTIO_VSOCK_SLOT,
            queue,
            used,
            &ram,
        ));
    }
    assert!(
        completed[..2].iter().all(|&c| c > 10),
        "rounds that used a buffer: {completed:?}"
    );
    let c = m.vsock.lock().unwrap().device().counters();
    assert!(
        c.connections > 0 && c.bad_packets > 0 && c.resets > 0,
        "{c:?}"
    );
}
