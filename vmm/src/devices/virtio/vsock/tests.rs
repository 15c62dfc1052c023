use super::connection::Key;
use super::muxer::parse_connect_line;
use super::packet::{op, Header, HDR_LEN, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use super::*;
use crate::arch::layout::RAM_BASE;
use crate::devices::virtio::host_io::Ready;
use crate::devices::virtio::mmio::tests::ram;
use crate::devices::virtio::VirtioDevice;
use crate::devices::Persist;
use crate::memory::GuestMemoryMmap;
use crate::memory::GuestRam;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

const CID: u64 = 3;
/// Each queue's descriptor table, rings and buffers live in their own
/// 64 KiB of the test's 1 MiB of RAM.
const QUEUE_AREA: u64 = 0x1_0000;
/// Receive buffers: 8 KiB each.
const RX_BUF: u32 = 8 << 10;
const ENTRIES: u16 = 16;

/// One mock driver queue and the device's view of it.
struct Q<'a> {
    vq: MockSplitQueue<'a, GuestMemoryMmap>,
    q: Queue,
    /// Where descriptor `i`'s buffer is.
    bufs: u64,
    posted: u16,
    seen: u16,
}

impl<'a> Q<'a> {
    fn new(ram: &'a GuestRam, n: u64) -> Self {
        let base = RAM_BASE + n * 4 * QUEUE_AREA;
        let vq = MockSplitQueue::create(ram.memory(), GuestAddress(base), ENTRIES);
        let q: Queue = vq.create_queue().unwrap();
        Q {
            vq,
            q,
            bufs: base + QUEUE_AREA,
            posted: 0,
            seen: 0,
        }
    }

    fn buf(&self, i: u16) -> u64 {
        self.bufs + u64::from(i % ENTRIES) * u64::from(RX_BUF)
    }

    /// Posts a buffer of `len` bytes (device-writable or not) holding
    /// `data`, as descriptor `posted % ENTRIES` (the mock's own ring
    /// helpers do not wrap).
    fn post(&mut self, ram: &GuestRam, data: &[u8], len: u32, writable: bool) {
        let i = self.posted % ENTRIES;
        let mem = ram.memory();
        mem.write_slice(data, GuestAddress(self.buf(i))).unwrap();
        let flags = if writable {
            VRING_DESC_F_WRITE as u16
        } else {
            0
        };
        let desc = RawDescriptor::from(SplitDescriptor::new(self.buf(i), len, flags, 0));
        self.vq.desc_table().store(i, desc).unwrap();
        let avail = self.vq.avail_addr().0;
        let idx: u16 = mem.read_obj(GuestAddress(avail + 2)).unwrap();
        mem.write_obj(i, GuestAddress(avail + 4 + 2 * u64::from(idx % ENTRIES)))
            .unwrap();
        mem.write_obj(idx.wrapping_add(1), GuestAddress(avail + 2))
            .unwrap();
        self.posted = self.posted.wrapping_add(1);
    }

    /// The used entries since the last call: (descriptor, length, bytes).
    fn used(&mut self, ram: &GuestRam) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let ring = self.q.used_ring();
        while self.seen != self.q.next_used() {
            let at = ring + 4 + 8 * u64::from(self.seen % ENTRIES);
            let id: u32 = ram.memory().read_obj(GuestAddress(at)).unwrap();
            let len: u32 = ram.memory().read_obj(GuestAddress(at + 4)).unwrap();
            let mut b = vec![0u8; len as usize];
            ram.memory()
                .read_slice(&mut b, GuestAddress(self.buf(id as u16)))
                .unwrap();
            out.push(b);
            self.seen = self.seen.wrapping_add(1);
        }
        out
    }
}

/// The device, its host socket directory and the three queues' RAM.
struct Rig {
    dir: tempfile::TempDir,
    dev: Vsock,
    ram: Arc<GuestRam>,
}

impl Rig {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let host = VsockHost::bind(&dir.path().join("v.sock")).unwrap();
        Rig {
            dir,
            dev: Vsock::new(CID, host),
            ram: ram(),
        }
    }

    fn uds(&self) -> PathBuf {
        self.dir.path().join("v.sock")
    }

    /// A host program listening for guest connections to `port`.
    fn listen(&self, port: u32) -> UnixListener {
        UnixListener::bind(self.dir.path().join(format!("v.sock_{port}"))).unwrap()
    }
}

fn hdr(op: u16, src_port: u32, dst_port: u32, len: u32) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len,
        kind: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 64 << 10,
        fwd_cnt: 0,
    }
}

/// Sends a packet from the guest.
fn send(rig: &mut Rig, tx: &mut Q<'_>, h: Header, payload: &[u8]) {
    let mut b = h.to_bytes().to_vec();
    b.extend_from_slice(payload);
    tx.post(&rig.ram, &b, b.len() as u32, false);
    let mem = rig.ram.memory();
    assert!(rig.dev.process_queue(TX_QUEUE, &mut tx.q, mem, 0).unwrap());
}

/// Posts `n` receive buffers, runs the receive queue, returns the packets.
fn receive(rig: &mut Rig, rx: &mut Q<'_>, n: usize) -> Vec<(Header, Vec<u8>)> {
    for _ in 0..n {
        rx.post(&rig.ram, &[], RX_BUF, true);
    }
    let mem = rig.ram.memory();
    rig.dev.process_queue(RX_QUEUE, &mut rx.q, mem, 0).unwrap();
    rx.used(&rig.ram)
        .into_iter()
        .map(|b| {
            let h = Header::parse(b[..HDR_LEN].try_into().unwrap());
            assert_eq!(h.len as usize, b.len() - HDR_LEN, "{h:?}");
            (h, b[HDR_LEN..].to_vec())
        })
        .collect()
}

/// Waits (up to 10 s) for one of the device's host sockets to be ready and
/// hands what is ready to the device, as its host thread does.
fn pump(dev: &mut Vsock) {
    assert!(pump_for(dev, 10_000), "no host socket became ready");
}

/// [`pump`], waiting at most `ms`; returns whether a socket was ready.
pub(crate) fn pump_for(dev: &mut Vsock, ms: i32) -> bool {
    let wait = dev.wait();
    let mut fds: Vec<libc::pollfd> = wait
        .watches
        .iter()
        .map(|w| libc::pollfd {
            fd: w.fd,
            events: if w.interest.read { libc::POLLIN } else { 0 }
                | if w.interest.write { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    // SAFETY: `fds` is a live array of `fds.len()` pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return false;
    }
    let events: Vec<_> = fds
        .iter()
        .filter(|p| p.revents != 0)
        .map(|p| {
            let hung_up = p.revents & (libc::POLLHUP | libc::POLLERR) != 0;
            (
                p.fd,
                Ready {
                    readable: hung_up || p.revents & libc::POLLIN != 0,
                    writable: p.revents & libc::POLLOUT != 0,
                    woken: false,
                    hung_up,
                },
            )
        })
        .collect();
    dev.host_events(&events);
    true
}

#[test]
fn config_space_features_and_queues() {
    let rig = Rig::new();
    let mut cfg = [0xffu8; 12];
    rig.dev.read_config(0, &mut cfg);
    assert_eq!(cfg[..8], CID.to_le_bytes());
    assert_eq!(cfg[8..], [0; 4], "past the end");
    assert_eq!(rig.dev.device_type(), 19);
    assert_eq!(rig.dev.features(), 0);
    assert_eq!(Vsock::QUEUE_MAX_SIZES, [256; 3]);
    assert!(valid_guest_cid(3) && valid_guest_cid(u64::from(u32::MAX) - 1));
    for bad in [0, 1, 2, u64::from(u32::MAX), 1 << 40] {
        assert!(!valid_guest_cid(bad), "{bad}");
    }
}

#[test]
fn connect_line_parsing() {
    assert_eq!(parse_connect_line(b"CONNECT 5000"), Some(5000));
    assert_eq!(parse_connect_line(b"CONNECT 52\r"), Some(52));
    for bad in [
        &b"CONNECT"[..],
        b"CONNECT ",
        b"connect 1",
        b"CONNECT -1",
        b"CONNECT 4294967296",
        b"CONNECT 1 2",
    ] {
        assert_eq!(
            parse_connect_line(bad),
            None,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn a_guest_connection_reaches_the_host_socket_and_back() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    let listener = rig.listen(5000);
    send(&mut rig, &mut tx, hdr(op::REQUEST, 1024, 5000, 0), &[]);
    let (mut host, _) = listener.accept().unwrap();
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!(got.len(), 1);
    let (h, _) = &got[0];
    assert_eq!(
        (h.op, h.src_cid, h.dst_cid, h.src_port, h.dst_port),
        (op::RESPONSE, HOST_CID, CID, 5000, 1024)
    );
    assert_eq!(h.buf_alloc, CONN_BUF_SIZE);
    // Guest to host.
    send(&mut rig, &mut tx, hdr(op::RW, 1024, 5000, 5), b"hello");
    let mut b = [0u8; 5];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    // Host to guest, once the host thread saw the socket readable.
    host.write_all(b"world!").unwrap();
    pump(&mut rig.dev);
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!(got.len(), 1);
    let (h, payload) = &got[0];
    assert_eq!((h.op, h.len, h.fwd_cnt), (op::RW, 6, 5));
    assert_eq!(payload, b"world!");
    // The host closes: the guest is told the host sends no more (the
    // connection is still in turn for reading: no poll needed).
    drop(host);
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!((got[0].0.op, got[0].0.flags), (op::SHUTDOWN, SHUTDOWN_SEND));
    // The guest closes: the device resets the connection.
    let mut h = hdr(op::SHUTDOWN, 1024, 5000, 0);
    h.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    send(&mut rig, &mut tx, h, &[]);
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!(got[0].0.op, op::RST);
    assert_eq!(rig.dev.connections(), 0);
}

#[test]
fn a_guest_connection_to_a_port_nobody_listens_on_is_reset() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    send(&mut rig, &mut tx, hdr(op::REQUEST, 1024, 7000, 0), &[]);
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!(
        (got[0].0.op, got[0].0.src_port, got[0].0.dst_port),
        (op::RST, 7000, 1024)
    );
    // Data for no connection: reset too.
    send(&mut rig, &mut tx, hdr(op::RW, 1024, 7000, 3), b"abc");
    assert_eq!(receive(&mut rig, &mut rx, 1)[0].0.op, op::RST);
    assert_eq!(rig.dev.connections(), 0);
}

#[test]
fn a_host_program_connects_with_a_connect_line() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    let mut host = UnixStream::connect(rig.uds()).unwrap();
    host.write_all(b"CONNECT 1234\n").unwrap();
    pump(&mut rig.dev); // accept
    pump(&mut rig.dev); // the line
    let got = receive(&mut rig, &mut rx, 1);
    let (h, _) = &got[0];
    assert_eq!(
        (h.op, h.dst_port, h.src_port),
        (op::REQUEST, 1234, FIRST_LOCAL_PORT)
    );
    // The guest accepts.
    let mut resp = hdr(op::RESPONSE, 1234, FIRST_LOCAL_PORT, 0);
    resp.buf_alloc = 16;
    send(&mut rig, &mut tx, resp, &[]);
    let mut line = [0u8; 14];
    host.read_exact(&mut line).unwrap();
    assert_eq!(&line, format!("OK {FIRST_LOCAL_PORT}\n").as_bytes());
    // The guest's credit (16 bytes) bounds what it is sent.
    host.write_all(&[7u8; 100]).unwrap();
    pump(&mut rig.dev);
    let got = receive(&mut rig, &mut rx, 4);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, [7u8; 16]);
    assert!(
        rig.dev
            .wait()
            .watches
            .iter()
            .all(|w| !w.interest.read || w.fd == rig.dev.mux.host.listener_fd()),
        "no credit: the host socket is not read"
    );
    // The guest frees its buffer: 16 more.
    let mut credit = hdr(op::CREDIT_UPDATE, 1234, FIRST_LOCAL_PORT, 0);
    credit.buf_alloc = 16;
    credit.fwd_cnt = 16;
    send(&mut rig, &mut tx, credit, &[]);
    pump(&mut rig.dev);
    let got = receive(&mut rig, &mut rx, 4);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.len(), 16);
}

#[test]
fn a_bad_connect_line_or_a_refusal_closes_the_host_program() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    let mut bad = UnixStream::connect(rig.uds()).unwrap();
    bad.write_all(b"HELLO\n").unwrap();
    let mut long = UnixStream::connect(rig.uds()).unwrap();
    long.write_all(&[b'9'; 100]).unwrap();
    pump(&mut rig.dev); // accept both
    pump(&mut rig.dev); // their lines
    let mut b = Vec::new();
    assert_eq!(bad.read_to_end(&mut b).unwrap(), 0);
    // Closed with its bytes unread: a reset.
    let r = long.read_to_end(&mut b);
    assert!(
        matches!(&r, Ok(0)) || matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    assert!(receive(&mut rig, &mut rx, 1).is_empty());
    // The guest refuses: the host program is closed without an OK line.
    let mut host = UnixStream::connect(rig.uds()).unwrap();
    host.write_all(b"CONNECT 99\n").unwrap();
    pump(&mut rig.dev);
    pump(&mut rig.dev);
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!(got[0].0.op, op::REQUEST);
    send(
        &mut rig,
        &mut tx,
        hdr(op::RST, 99, got[0].0.src_port, 0),
        &[],
    );
    assert_eq!(host.read_to_end(&mut b).unwrap(), 0);
    assert!(b.is_empty());
}

#[test]
fn a_guest_past_its_credit_is_reset_and_a_slow_host_gets_credit_updates() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    let listener = rig.listen(5000);
    send(&mut rig, &mut tx, hdr(op::REQUEST, 1024, 5000, 0), &[]);
    let (host, _) = listener.accept().unwrap();
    assert_eq!(receive(&mut rig, &mut rx, 1)[0].0.op, op::RESPONSE);
    // The host does not read: the device buffers up to its credit.
    let chunk = vec![0x5au8; 4096];
    let mut sent = 0usize;
    let mut reset = false;
    while sent < 16 << 20 {
        send(
            &mut rig,
            &mut tx,
            hdr(op::RW, 1024, 5000, chunk.len() as u32),
            &chunk,
        );
        sent += chunk.len();
        if rig.dev.connections() == 0 {
            reset = true;
            break;
        }
    }
    assert!(reset, "a guest past its credit is reset");
    // The socket buffer plus the device's buffer, no more.
    assert!(sent > CONN_BUF_SIZE as usize, "{sent}");
    let got = receive(&mut rig, &mut rx, 4);
    assert!(got.iter().any(|(h, _)| h.op == op::RST), "{got:?}");
    assert_eq!(rig.dev.counters().bad_packets, 1);
    drop(host.set_nonblocking(true));

    // Within its credit, a guest is told when the host frees room.
    let listener = rig.listen(5001);
    send(&mut rig, &mut tx, hdr(op::REQUEST, 1025, 5001, 0), &[]);
    let (mut host, _) = listener.accept().unwrap();
    assert_eq!(receive(&mut rig, &mut rx, 1)[0].0.op, op::RESPONSE);
    let mut fwd_seen = 0u32;
    let mut in_flight = 0u64;
    let total = 4u64 << 20;
    let mut sent = 0u64;
    let mut got_back = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    host.set_nonblocking(true).unwrap();
    while got_back < total {
        // Send what the device's credit allows.
        while sent < total && in_flight + 4096 <= u64::from(CONN_BUF_SIZE) {
            send(&mut rig, &mut tx, hdr(op::RW, 1025, 5001, 4096), &chunk);
            sent += 4096;
            in_flight += 4096;
        }
        // The slow host reads some.
        match host.read(&mut buf[..64 << 10]) {
            Ok(n) => got_back += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        pump_for(&mut rig.dev, 0);
        for (h, _) in receive(&mut rig, &mut rx, 2) {
            assert_eq!(h.op, op::CREDIT_UPDATE);
            assert!(h.fwd_cnt.wrapping_sub(fwd_seen) > 0, "credit grows");
            fwd_seen = h.fwd_cnt;
            in_flight = sent - u64::from(fwd_seen);
        }
        assert_eq!(rig.dev.connections(), 1, "never past its credit");
    }
    assert_eq!(got_back, total);
}

#[test]
fn a_restored_device_sends_the_transport_reset_and_may_change_cid() {
    let rig = Rig::new();
    let state = rig.dev.save();
    assert_eq!(
        state,
        VsockState {
            cid: CID,
            next_local_port: Some(FIRST_LOCAL_PORT)
        }
    );
    let dir = tempfile::tempdir().unwrap();
    let host = VsockHost::bind(&dir.path().join("r.sock")).unwrap();
    let mut dev = Vsock::restore(
        VsockArgs {
            cid: Some(42),
            host,
        },
        &state,
    )
    .unwrap();
    assert_eq!(dev.cid(), 42);
    let mut cfg = [0u8; 8];
    dev.read_config(0, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg), 42);
    assert!(
        dev.has_work(EVENT_QUEUE),
        "the transport-reset event is due"
    );
    let ram = rig.ram.clone();
    let mut ev = Q::new(&ram, 2);
    ev.post(&ram, &[0xff; 4], 4, true);
    assert!(dev
        .process_queue(EVENT_QUEUE, &mut ev.q, ram.memory(), 0)
        .unwrap());
    assert_eq!(
        ev.used(&ram),
        [vec![0u8; 4]],
        "VIRTIO_VSOCK_EVENT_TRANSPORT_RESET"
    );
    assert!(!dev.has_work(EVENT_QUEUE));
    // Handled once the driver notifies the event queue again (Linux does,
    // re-posting the buffer after resetting its connections).
    let avail = |q: &Q| Some(q.q.avail_idx(ram.memory(), Ordering::Acquire).unwrap().0);
    assert!(!dev.reset_handled(avail(&ev)), "posted, not handled yet");
    assert!(!dev.reset_handled(None), "an unreadable ring: not handled");
    ev.post(&ram, &[0xff; 4], 4, true);
    assert!(dev.reset_handled(avail(&ev)), "a new buffer made available");
    assert!(rig.dev.reset_handled(None), "a device not restored");
    // Bad states.
    let host = || VsockHost::bind(&dir.path().join("s.sock")).unwrap();
    assert!(Vsock::restore(
        VsockArgs {
            cid: Some(2),
            host: host()
        },
        &state
    )
    .is_err());
    // Features the device did not offer (the transport keeps them).
    use crate::devices::pl011::tests::TestIrq;
    use crate::devices::virtio::VirtioMmio;
    let irq = Arc::new(TestIrq::default());
    let t = VirtioMmio::new(dev, ram.clone(), irq.clone()).unwrap();
    let mut bad = t.save();
    bad.driver_features = 1 << 5;
    let args = VsockArgs {
        cid: None,
        host: host(),
    };
    assert!(VirtioMmio::<Vsock>::restore((args, ram, irq), &bad).is_err());
    // A state from before the transport kept the negotiated features.
    let old: VsockState = serde_json::from_str(r#"{"cid":3,"acked_features":4294967296}"#).unwrap();
    assert_eq!(
        old,
        VsockState {
            cid: CID,
            next_local_port: None
        }
    );
    // A host port out of the host-initiated range.
    for port in [FIRST_LOCAL_PORT - 1, u32::MAX] {
        let bad = VsockState {
            cid: CID,
            next_local_port: Some(port),
        };
        let args = VsockArgs {
            cid: None,
            host: host(),
        };
        assert!(Vsock::restore(args, &bad).is_err(), "{port}");
    }
}

#[test]
fn a_restored_device_does_not_reuse_the_snapshots_host_ports() {
    // A host program's connection takes the first host-side port.
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let mut rx = Q::new(&ram, 0);
    let mut host = UnixStream::connect(rig.uds()).unwrap();
    host.write_all(b"CONNECT 1024\n").unwrap();
    pump(&mut rig.dev);
    pump(&mut rig.dev);
    let got = receive(&mut rig, &mut rx, 1);
    assert_eq!(
        (got[0].0.op, got[0].0.src_port),
        (op::REQUEST, FIRST_LOCAL_PORT)
    );
    let state = rig.dev.save();
    assert_eq!(state.next_local_port, Some(FIRST_LOCAL_PORT + 1));
    // The restored device's first connection takes the next one, which the
    // guest (which may still hold the snapshot's socket) has not seen.
    let mut restored = Rig::new();
    restored.dev = Vsock::restore(
        VsockArgs {
            cid: None,
            host: VsockHost::bind(&restored.dir.path().join("w.sock")).unwrap(),
        },
        &state,
    )
    .unwrap();
    let ram = restored.ram.clone();
    let mut rx = Q::new(&ram, 0);
    let mut host = UnixStream::connect(restored.dir.path().join("w.sock")).unwrap();
    host.write_all(b"CONNECT 1024\n").unwrap();
    pump(&mut restored.dev);
    pump(&mut restored.dev);
    let got = receive(&mut restored, &mut rx, 1);
    assert_eq!(
        (got[0].0.op, got[0].0.src_port),
        (op::REQUEST, FIRST_LOCAL_PORT + 1)
    );
}

#[test]
fn the_host_socket_path_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v.sock");
    let a = VsockHost::bind(&p).unwrap();
    let e = VsockHost::bind(&p).err().unwrap();
    assert!(
        e.to_string().contains("another process is listening"),
        "{e}"
    );
    // A socket left by a VMM that is gone is replaced.
    std::mem::forget(a);
    drop(UnixListener::bind(dir.path().join("x")));
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    VsockHost::bind(&stale).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let e = VsockHost::bind(&file).err().unwrap();
    assert!(e.to_string().contains("not a socket"), "{e}");
    // Removed on drop.
    let p2 = dir.path().join("gone.sock");
    drop(VsockHost::bind(&p2).unwrap());
    assert!(!p2.exists());
}

#[test]
fn the_connection_count_is_bounded() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    let listener = rig.listen(5000);
    listener.set_nonblocking(true).unwrap();
    let mut accepted = Vec::new();
    for port in 0..MAX_CONNECTIONS as u32 + 1 {
        send(
            &mut rig,
            &mut tx,
            hdr(op::REQUEST, 2000 + port, 5000, 0),
            &[],
        );
        while let Ok((s, _)) = listener.accept() {
            accepted.push(s);
        }
        let got = receive(&mut rig, &mut rx, 1);
        let want = if (port as usize) < MAX_CONNECTIONS {
            op::RESPONSE
        } else {
            op::RST
        };
        assert_eq!(got[0].0.op, want, "connection {port}");
    }
    assert_eq!(rig.dev.connections(), MAX_CONNECTIONS);
    // A second request on an open connection resets it.
    send(&mut rig, &mut tx, hdr(op::REQUEST, 2000, 5000, 0), &[]);
    assert_eq!(receive(&mut rig, &mut rx, 1)[0].0.op, op::RST);
    assert_eq!(rig.dev.connections(), MAX_CONNECTIONS - 1);
    // A device reset drops them all.
    VirtioDevice::reset(&mut rig.dev);
    assert_eq!(rig.dev.connections(), 0);
}

#[test]
fn a_stalled_connection_does_not_stall_another() {
    let mut rig = Rig::new();
    let ram = rig.ram.clone();
    let (mut rx, mut tx) = (Q::new(&ram, 0), Q::new(&ram, 1));
    let listener = rig.listen(5000);
    // A: its host program never reads, and the guest gives it no credit.
    let mut req = hdr(op::REQUEST, 1024, 5000, 0);
    req.buf_alloc = 0;
    send(&mut rig, &mut tx, req, &[]);
    let (mut host_a, _) = listener.accept().unwrap();
    // B: a guest that reads and a host program that reads.
    send(&mut rig, &mut tx, hdr(op::REQUEST, 1025, 5000, 0), &[]);
    let (mut host_b, _) = listener.accept().unwrap();
    host_b.set_nonblocking(true).unwrap();
    assert_eq!(receive(&mut rig, &mut rx, 2).len(), 2, "two responses");
    // The guest fills A's buffer on the host side (the socket, then the
    // device's 256 KiB); A's host program writes, but A has no credit.
    let chunk = vec![0xa1u8; 4096];
    let mut a_sent = 0;
    while rig.dev.mux.conns[&Key {
        local: 5000,
        peer: 1024,
    }]
        .out
        .len()
        + 4096
        <= CONN_BUF_SIZE as usize
    {
        let mut h = hdr(op::RW, 1024, 5000, 4096);
        h.buf_alloc = 0;
        send(&mut rig, &mut tx, h, &chunk);
        a_sent += 4096;
    }
    assert!(a_sent >= CONN_BUF_SIZE as usize);
    host_a.write_all(&[0xa2; 1000]).unwrap();
    // B still goes both ways.
    for round in 0..8u8 {
        send(
            &mut rig,
            &mut tx,
            hdr(op::RW, 1025, 5000, 100),
            &[round; 100],
        );
        let mut b = [0u8; 100];
        let mut got = 0;
        while got < 100 {
            match host_b.read(&mut b[got..]) {
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(b, [round; 100]);
        host_b.write_all(&[round; 50]).unwrap();
        // (B may still be in turn for reading from the round before.)
        pump_for(&mut rig.dev, 100);
        let got = receive(&mut rig, &mut rx, 2);
        let data: Vec<_> = got.iter().filter(|(h, _)| h.op == op::RW).collect();
        assert_eq!(data.len(), 1, "{got:?}");
        assert_eq!(
            (data[0].0.dst_port, data[0].1.as_slice()),
            (1025, &[round; 50][..])
        );
    }
    assert_eq!(rig.dev.connections(), 2, "A stalled, not reset");
    drop(host_a);
}
