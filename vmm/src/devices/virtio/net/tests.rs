use super::*;
use crate::arch::layout::RAM_BASE;
use crate::devices::virtio::mmio::tests::{add_chain, queue, ram, used_elem};
use std::sync::{Arc, Mutex};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const BUF: u64 = RAM_BASE + 0x10000;

/// A host end that records what it is sent, or refuses.
#[derive(Clone, Default)]
struct Sink {
    frames: Arc<Mutex<Vec<Vec<u8>>>>,
    refuse: bool,
}

impl NetBackend for Sink {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if self.refuse {
            return Err(io::Error::other("host end gone"));
        }
        self.frames.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
}

fn net() -> (Net, Sink) {
    let sink = Sink::default();
    (Net::new(MAC, Box::new(sink.clone())), sink)
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[test]
fn config_space_and_features() {
    let (n, _) = net();
    let mut cfg = [0xffu8; 10];
    n.read_config(0, &mut cfg);
    assert_eq!(cfg[..6], MAC);
    assert_eq!(u16::from_le_bytes([cfg[6], cfg[7]]), 1, "link up");
    assert_eq!(cfg[8..], [0, 0], "past the end");
    assert_eq!(n.device_type(), 1);
    // CSUM, GUEST_CSUM, MAC, MRG_RXBUF, STATUS.
    assert_eq!(n.features(), 1 | 2 | (1 << 5) | (1 << 15) | (1 << 16));
    assert_eq!(Net::QUEUE_MAX_SIZES, [256, 256]);
    assert_eq!(format_mac(&MAC), "52:54:00:12:34:56");
}

#[test]
fn transmit_hands_each_frame_to_the_host_end() {
    let ram = ram();
    let (mut n, sink) = net();
    let (vq, mut q) = queue(&ram);
    let f = frame(100, 1);
    // Header and frame split across two descriptors, as Linux may.
    ram.memory()
        .write_slice(&[0u8; 12], GuestAddress(BUF))
        .unwrap();
    ram.memory()
        .write_slice(&f, GuestAddress(BUF + 0x1000))
        .unwrap();
    add_chain(&vq, 0, &[(BUF, 12, false), (BUF + 0x1000, 100, false)]);
    assert!(n.process_queue(TX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(*sink.frames.lock().unwrap(), [f]);
    assert_eq!(used_elem(&ram, 0), (0, 0));
    assert_eq!(n.counters().tx_frames, 1);
}

#[test]
fn malformed_or_refused_transmits_are_dropped_and_counted() {
    let ram = ram();
    let (mut n, sink) = net();
    let (vq, mut q) = queue(&ram);
    // Too short, a writable buffer, too long, then a good one.
    add_chain(&vq, 0, &[(BUF, 20, false)]);
    add_chain(&vq, 1, &[(BUF, 200, true)]);
    add_chain(&vq, 2, &[(BUF, 12 + MAX_FRAME_LEN as u32 + 1, false)]);
    add_chain(&vq, 3, &[(BUF, 12 + 60, false)]);
    assert!(n.process_queue(TX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(sink.frames.lock().unwrap().len(), 1);
    assert_eq!((n.counters().tx_frames, n.counters().tx_dropped), (1, 3));
    // A host end that refuses: dropped, the queue goes on.
    let sink2 = Sink {
        refuse: true,
        ..Default::default()
    };
    let mut n2 = Net::new(MAC, Box::new(sink2));
    let (vq2, mut q2) = queue(&ram);
    add_chain(&vq2, 0, &[(BUF, 12 + 60, false)]);
    assert!(n2
        .process_queue(TX_QUEUE, &mut q2, ram.memory(), 0)
        .unwrap());
    assert_eq!(n2.counters().tx_dropped, 1);
}

#[test]
fn receive_waits_for_buffers_and_marks_pages_dirty() {
    let ram = ram();
    let (mut n, _) = net();
    let (vq, mut q) = queue(&ram);
    let f = frame(1514, 9);
    assert!(n.receive(&f));
    // No buffer yet: nothing used, the frame waits.
    assert!(!n.process_queue(RX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert!(n.backlog_len() > 0);
    add_chain(&vq, 0, &[(BUF, 12 + 1518, true)]);
    ram.vmm_dirty().clear_all();
    assert!(n.process_queue(RX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(used_elem(&ram, 0), (0, 12 + 1514));
    let mut hdr = [0u8; 12];
    ram.memory()
        .read_slice(&mut hdr, GuestAddress(BUF))
        .unwrap();
    assert_eq!(hdr, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0], "num_buffers 1");
    let mut back = vec![0u8; 1514];
    ram.memory()
        .read_slice(&mut back, GuestAddress(BUF + 12))
        .unwrap();
    assert_eq!(back, f);
    let page = ((BUF - RAM_BASE) / crate::arch::layout::PAGE_SIZE) as usize;
    assert!(ram.vmm_dirty().is_set(page), "received into a dirty page");
    assert_eq!(n.backlog_len(), 0);
}

#[test]
fn receive_drops_what_cannot_fit_and_bounds_the_backlog() {
    let ram = ram();
    let (mut n, _) = net();
    let (vq, mut q) = queue(&ram);
    assert!(!n.receive(&[0u8; 10]), "shorter than an Ethernet header");
    assert!(!n.receive(&vec![0u8; MAX_FRAME_LEN + 1]));
    for i in 0..RX_BACKLOG_FRAMES {
        assert!(n.receive(&frame(64, i as u8)));
    }
    assert!(!n.has_room_for(1), "backlog full");
    assert!(!n.receive(&frame(64, 0)), "backlog full");
    assert_eq!(n.counters().rx_dropped, 3);
    // A buffer too small for the frame: the frame is dropped, the buffer
    // returned empty; the next frame takes the next buffer.
    add_chain(&vq, 0, &[(BUF, 40, true)]);
    add_chain(&vq, 1, &[(BUF + 0x1000, 12 + 64, true)]);
    assert!(n.process_queue(RX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(used_elem(&ram, 0), (0, 0));
    assert_eq!(used_elem(&ram, 1), (1, 12 + 64));
    assert_eq!((n.counters().rx_frames, n.counters().rx_dropped), (1, 4));
    // A readable (driver-to-device) buffer on the receiveq: not written.
    add_chain(&vq, 2, &[(BUF + 0x2000, 12 + 64, false)]);
    assert!(n.process_queue(RX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(used_elem(&ram, 2), (2, 0));
}

#[test]
fn restore_keeps_the_mac_unless_another_is_asked_for() {
    let (n, _) = net();
    let state = n.save();
    let restore = |mac, state: &NetState| {
        Net::restore(
            NetArgs {
                mac,
                backend: Box::new(Sink::default()),
            },
            state,
        )
    };
    let back = restore(None, &state).unwrap();
    assert_eq!(back.save(), state);
    assert_eq!(back.config_as_bytes()[..6], MAC);
    assert_eq!(restore(Some(MAC), &state).unwrap().save(), state);
    // Asked for explicitly: the config space reports the new MAC, and the
    // device's next snapshot records it.
    let other = [0x52, 0x54, 0, 0, 0, 1];
    let moved = restore(Some(other), &state).unwrap();
    assert_eq!(moved.mac(), other);
    assert_eq!(moved.config_as_bytes()[..6], other);
    assert_eq!(moved.save(), NetState { mac: other });
    // A saved MAC no NIC can have: the state is refused.
    let e = restore(
        None,
        &NetState {
            mac: [1, 0, 0x5e, 0, 0, 1],
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("01:00:5e:00:00:01") && e.contains("multicast"),
        "{e}"
    );
    // Features the device did not offer (the transport keeps them).
    use crate::devices::pl011::tests::TestIrq;
    use crate::devices::virtio::VirtioMmio;
    let ram = ram();
    let irq = Arc::new(TestIrq::default());
    let t = VirtioMmio::new(n, ram.clone(), irq.clone()).unwrap();
    let mut bad = t.save();
    bad.driver_features = 1 << 63;
    let args = NetArgs {
        mac: None,
        backend: Box::new(Sink::default()),
    };
    assert!(VirtioMmio::<Net>::restore((args, ram, irq), &bad).is_err());
    // A state from before the transport kept the negotiated features.
    let old: NetState =
        serde_json::from_str(r#"{"mac":[82,84,0,18,52,86],"acked_features":4294967328}"#).unwrap();
    assert_eq!(old, NetState { mac: MAC });
}

#[test]
fn the_stream_receiver_delivers_frames_and_survives_a_closed_peer() {
    use crate::devices::pl011::tests::TestIrq;
    use crate::devices::virtio::mmio::tests::{negotiate, setup_queue, used_idx, w, RUNNING};
    use crate::devices::virtio::VirtioMmio;
    use crate::sync::Locked;
    use std::io::Write;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("passt.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let host = host_end::open(&host_end::NetHost::Stream(path.clone())).unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    let ram = ram();
    let irq = Arc::new(TestIrq::default());
    let dev = Arc::new(Mutex::new(
        VirtioMmio::new(Net::new(MAC, host.backend), ram.clone(), irq.clone()).unwrap(),
    ));
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 64);
    {
        let mut d = dev.locked();
        negotiate(&mut d, (1 << 32) | (1 << 5));
        setup_queue(&mut d, &vq, 64);
        w(&mut d, 0x070, RUNNING);
    }
    for i in 0..4u16 {
        add_chain(&vq, i, &[(BUF + u64::from(i) * 0x1000, 12 + 1518, true)]);
    }
    let _io = host_end::spawn_receiver(dev.clone(), host.frames).unwrap();
    let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(60 + 500 * i, i as u8)).collect();
    let mut wire = Vec::new();
    for f in &frames {
        stream::encode_into(&mut wire, f);
    }
    peer.write_all(&wire).unwrap();
    // Bounded wait: only to tell a lost frame from a late one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while used_idx(&ram) < 3 {
        assert!(Instant::now() < deadline, "frames not delivered");
        std::thread::sleep(Duration::from_millis(1));
    }
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(used_elem(&ram, i as u16), (i as u32, (12 + f.len()) as u32));
        let mut back = vec![0u8; f.len()];
        ram.memory()
            .read_slice(&mut back, GuestAddress(BUF + i as u64 * 0x1000 + 12))
            .unwrap();
        assert_eq!(&back, f);
    }
    assert!(irq.level(), "used-buffer interrupt");
    // The peer goes away: the link is down, the device stays usable.
    drop(peer);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(dev.locked().device().counters().rx_frames, 3);
}

#[test]
fn macs_parse_print_and_default_stably() {
    let m = parse_mac("52:54:00:ab:CD:0f").unwrap();
    assert_eq!(format_mac(&m), "52:54:00:ab:cd:0f");
    for bad in [
        "",
        "52:54:00:ab:cd",
        "52:54:00:ab:cd:0f:00",
        "52:54:00:ab:cd:g0",
        "5:54:00:ab:cd:0f0",
    ] {
        assert!(parse_mac(bad).is_err(), "{bad}");
    }
    assert!(parse_mac("01:00:5e:00:00:01")
        .unwrap_err()
        .contains("multicast"));
    let a = default_mac("golden");
    assert_eq!(a, default_mac("golden"));
    assert_ne!(a, default_mac("golden.2"));
    assert_eq!(a[..3], [0x52, 0x54, 0x00]);
    parse_mac(&format_mac(&a)).unwrap();
}

#[test]
fn derived_macs_are_the_names_distinct_and_not_the_taken_one() {
    let names: Vec<String> = (1..=64).map(|i| format!("golden-{i}")).collect();
    let taken = default_mac("golden");
    let macs = derived_macs(&names, taken);
    assert_eq!(macs, derived_macs(&names, taken));
    for (n, m) in names.iter().zip(&macs) {
        // No collision here: each is its name's default MAC.
        assert_eq!(*m, default_mac(n));
        assert!(is_unicast(m) && m[0] & 2 != 0, "locally administered");
    }
    let mut sorted = macs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 64);
    assert!(!macs.contains(&taken));
    // A name whose MAC is taken gets the next one; so does a repeat, and
    // the count wraps within the prefix.
    let one = vec!["golden-1".to_string()];
    assert_eq!(derived_macs(&one, macs[0]), [next_mac(macs[0])]);
    let twice = vec!["x".to_string(), "x".to_string()];
    let x = derived_macs(&twice, taken);
    assert_eq!(x, [default_mac("x"), next_mac(default_mac("x"))]);
    assert_eq!(
        next_mac([0x52, 0x54, 0, 0x12, 0x34, 0xff]),
        [0x52, 0x54, 0, 0x12, 0x35, 0]
    );
    assert_eq!(
        next_mac([0x52, 0x54, 0, 0xff, 0xff, 0xff]),
        [0x52, 0x54, 0, 0, 0, 0]
    );
}

#[test]
fn a_held_device_writes_nothing_until_released() {
    let ram = ram();
    let (vq, mut q) = queue(&ram);
    let (mut n, _) = net();
    add_chain(&vq, 0, &[(BUF, 12 + 1518, true)]);
    n.prepare_save().unwrap();
    assert!(n.receive(&frame(100, 3)));
    assert!(!n.process_queue(RX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(n.backlog_len(), 1);
    n.after_save();
    assert!(n.process_queue(RX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(n.counters().rx_frames, 1);

    // Nor does transmit complete a chain (the used ring is guest RAM).
    let ram = self::ram();
    let (vq, mut q) = queue(&ram);
    let (mut n, sink) = net();
    add_chain(&vq, 0, &[(BUF, 12 + 60, false)]);
    n.prepare_save().unwrap();
    assert!(!n.process_queue(TX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(q.next_used(), 0);
    n.after_save();
    assert!(n.process_queue(TX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert_eq!(sink.frames.lock().unwrap().len(), 1);
}

#[test]
fn a_full_host_end_holds_transmit_back_and_loses_nothing() {
    let ram = ram();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let full = Valve {
        sent: sent.clone(),
        held: Vec::new(),
        room: 2,
        open: Arc::new(std::sync::atomic::AtomicBool::new(true)),
    };
    let mut n = Net::new(MAC, Box::new(full));
    let (vq, mut q) = queue(&ram);
    let frames: Vec<Vec<u8>> = (0..5).map(|i| frame(60 + i, i as u8)).collect();
    for (i, f) in frames.iter().enumerate() {
        let at = BUF + i as u64 * 0x1000;
        let mut hdr_and_frame = vec![0u8; NET_HDR_LEN];
        hdr_and_frame.extend_from_slice(f);
        ram.memory()
            .write_slice(&hdr_and_frame, GuestAddress(at))
            .unwrap();
        add_chain(&vq, i as u16, &[(at, hdr_and_frame.len() as u32, false)]);
    }
    // Two fit; the third waits in the queue, unused.
    assert!(n.process_queue(TX_QUEUE, &mut q, ram.memory(), 0).unwrap());
    assert!(n.tx_blocked);
    assert_eq!(q.next_used(), 2);
    // Still full: nothing moves.
    n.backend.send(&[0; 14]).unwrap_err();
    // The host end's thread flushes and runs the queue again, twice more.
    for used in [4, 5] {
        n.backend.flush().unwrap();
        assert!(n.process_queue(TX_QUEUE, &mut q, ram.memory(), 0).unwrap());
        assert_eq!(q.next_used(), used);
    }
    n.backend.flush().unwrap();
    assert_eq!(*sent.lock().unwrap(), frames);
    assert_eq!((n.counters().tx_frames, n.counters().tx_dropped), (5, 0));
}

#[test]
fn a_mergeable_frame_spans_buffers_published_together() {
    let ram = ram();
    let (vq, mut q) = queue(&ram);
    let (mut n, _) = net();
    let features = (1 << 32) | (1 << 15);
    let f = frame(2500, 9);
    assert!(n.receive(&f));
    // One 1000-byte buffer is not enough: nothing is used or consumed.
    add_chain(&vq, 0, &[(BUF, 1000, true)]);
    assert!(!n
        .process_queue(RX_QUEUE, &mut q, ram.memory(), features)
        .unwrap());
    assert_eq!((q.next_avail(), q.next_used()), (0, 0));
    // Two more: the frame (12 + 2500 bytes) takes all three, at once.
    add_chain(&vq, 1, &[(BUF + 0x1000, 1000, true)]);
    add_chain(&vq, 2, &[(BUF + 0x2000, 1000, true)]);
    assert!(n
        .process_queue(RX_QUEUE, &mut q, ram.memory(), features)
        .unwrap());
    assert_eq!(q.next_used(), 3);
    let lens: Vec<(u32, u32)> = (0..3).map(|i| used_elem(&ram, i)).collect();
    assert_eq!(lens, [(0, 1000), (1, 1000), (2, 512)]);
    let mut got = Vec::new();
    for (i, &(_, len)) in lens.iter().enumerate() {
        let mut b = vec![0u8; len as usize];
        ram.memory()
            .read_slice(&mut b, GuestAddress(BUF + i as u64 * 0x1000))
            .unwrap();
        got.extend(b);
    }
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 3, "num_buffers");
    assert_eq!(&got[NET_HDR_LEN..], &f[..]);
    assert_eq!(n.counters().rx_frames, 1);
}

#[test]
fn the_transport_holds_a_snapshot_and_after_save_delivers_what_waited() {
    use crate::devices::pl011::tests::TestIrq;
    use crate::devices::virtio::mmio::tests::{negotiate, setup_queue, used_idx, w, RUNNING};
    use crate::devices::virtio::VirtioMmio;

    let ram = ram();
    let irq = Arc::new(TestIrq::default());
    let net = Net::new(MAC, Box::new(Sink::default()));
    let mut d = VirtioMmio::new(net, ram.clone(), irq.clone()).unwrap();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 64);
    negotiate(&mut d, (1 << 32) | (1 << 5));
    setup_queue(&mut d, &vq, 64);
    w(&mut d, 0x070, RUNNING);
    add_chain(&vq, 0, &[(BUF, 12 + 1518, true)]);
    d.prepare_save().unwrap();
    assert!(d.device_mut().receive(&frame(100, 3)));
    let turn = d.device_mut().on_host_ready(1, true);
    assert!(!turn.run_rx, "held: the host thread runs no queue");
    assert_eq!(used_idx(&ram), 0);
    assert!(!irq.level());
    d.after_save();
    assert_eq!(used_idx(&ram), 1, "the frame that waited went to the guest");
    assert_eq!(used_elem(&ram, 0), (0, 12 + 100));
    assert!(irq.level());
}

#[test]
fn the_host_thread_reads_only_while_a_read_fits_the_backlog() {
    let (mut n, _) = net();
    let turn = n.on_host_ready(16, true);
    assert_eq!(
        (
            turn.run_rx,
            turn.run_tx,
            turn.interest.read,
            turn.interest.write
        ),
        (false, false, true, false)
    );
    for i in 0..RX_BACKLOG_FRAMES - 15 {
        assert!(n.receive(&frame(64, i as u8)));
    }
    let turn = n.on_host_ready(16, true);
    assert!(turn.run_rx, "frames wait for the guest");
    assert!(!turn.interest.read, "16 more would not fit");
    assert!(n.on_host_ready(15, true).interest.read);
    assert!(!n.on_host_ready(15, false).interest.read, "closed");
}

/// The transport over a device with `backend`, `features` negotiated and
/// running, its receiveq set up at [`RAM_BASE`] (used ring at
/// [`USED_RING`]) and its transmitq at [`TX_RING`] (used ring at
/// [`TX_USED`]); 16 entries each.
fn running(
    ram: &Arc<crate::memory::GuestRam>,
    backend: Box<dyn NetBackend>,
    features: u64,
) -> (
    crate::devices::virtio::VirtioMmio<Net>,
    Arc<crate::devices::pl011::tests::TestIrq>,
) {
    use crate::devices::pl011::tests::TestIrq;
    use crate::devices::virtio::mmio::tests::{negotiate, setup_queue_at, w, RUNNING, USED_RING};
    let irq = Arc::new(TestIrq::default());
    let mut d =
        crate::devices::virtio::VirtioMmio::new(Net::new(MAC, backend), ram.clone(), irq.clone())
            .unwrap();
    negotiate(&mut d, features);
    let rx = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    let tx = MockSplitQueue::create(ram.memory(), GuestAddress(TX_RING), 16);
    setup_queue_at(&mut d, 0, &rx, 16, USED_RING);
    setup_queue_at(&mut d, 1, &tx, 16, TX_USED);
    w(&mut d, STATUS, RUNNING);
    (d, irq)
}

/// Where [`running`] puts the transmitq's driver rings, and its used ring.
const TX_RING: u64 = RAM_BASE + 0x2000;
const TX_USED: u64 = RAM_BASE + 0x2800;
/// The transport's Status and QueueNotify registers (virtio 1.2 §4.2.2).
const STATUS: u64 = 0x070;
const QUEUE_NOTIFY: u64 = 0x050;
/// VIRTIO_F_VERSION_1 and VIRTIO_F_RING_EVENT_IDX.
const V1_EVENT_IDX: u64 = (1 << 32) | (1 << 29);

#[test]
fn receive_buffers_short_of_a_frame_leave_the_driver_notifying() {
    use crate::devices::virtio::mmio::tests::{driver_notifies, used_idx, w, USED_RING};
    let ram = ram();
    let (mut d, irq) = running(
        &ram,
        Box::new(Sink::default()),
        V1_EVENT_IDX | (1 << VIRTIO_NET_F_MRG_RXBUF),
    );
    // The driver's view of the receiveq (the rings `running` set up).
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    add_chain(&vq, 0, &[(BUF, 1000, true)]);
    w(&mut d, QUEUE_NOTIFY, RX_QUEUE as u32);
    // No frame waits: the host end's thread runs the queue when one comes.
    assert!(!driver_notifies(&ram, USED_RING, 16, 1, 2));
    // A 2500-byte frame needs three of the driver's 1000-byte buffers.
    assert!(d.device_mut().receive(&frame(2500, 1)));
    d.kick(RX_QUEUE);
    assert_eq!(used_idx(&ram), 0);
    // Each buffer the driver adds now must be notified: the device waits
    // for it, and nothing else would run the queue.
    assert!(driver_notifies(&ram, USED_RING, 16, 1, 2));
    add_chain(&vq, 1, &[(BUF + 0x1000, 1000, true)]);
    w(&mut d, QUEUE_NOTIFY, RX_QUEUE as u32);
    assert_eq!(used_idx(&ram), 0, "two buffers are not enough either");
    assert!(driver_notifies(&ram, USED_RING, 16, 2, 3));
    add_chain(&vq, 2, &[(BUF + 0x2000, 1000, true)]);
    w(&mut d, QUEUE_NOTIFY, RX_QUEUE as u32);
    assert_eq!(used_idx(&ram), 3, "the frame took all three");
    assert!(irq.level());
    assert_eq!(d.device().counters().rx_frames, 1);
}

/// A host end that takes `room` frames until flushed, and hands them on
/// (a flush) only while `open` is set.
struct Valve {
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
    held: Vec<Vec<u8>>,
    room: usize,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl NetBackend for Valve {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if self.held.len() == self.room {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.held.push(frame.to_vec());
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        if self.open.load(std::sync::atomic::Ordering::Relaxed) {
            self.sent.lock().unwrap().append(&mut self.held);
        }
        Ok(())
    }
    fn pending(&self) -> bool {
        !self.held.is_empty()
    }
}

#[test]
fn transmit_held_back_by_the_host_end_resumes_from_the_host_thread() {
    use crate::devices::virtio::mmio::tests::{driver_notifies, w};
    let ram = ram();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let valve = Valve {
        sent: sent.clone(),
        held: Vec::new(),
        room: 1,
        open: open.clone(),
    };
    let (mut d, irq) = running(&ram, Box::new(valve), V1_EVENT_IDX);
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(TX_RING), 16);
    let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(60 + i, i as u8)).collect();
    for (i, f) in frames.iter().enumerate() {
        let at = BUF + i as u64 * 0x1000;
        let mut hdr_and_frame = vec![0u8; NET_HDR_LEN];
        hdr_and_frame.extend_from_slice(f);
        ram.memory()
            .write_slice(&hdr_and_frame, GuestAddress(at))
            .unwrap();
        add_chain(&vq, i as u16, &[(at, hdr_and_frame.len() as u32, false)]);
    }
    w(&mut d, QUEUE_NOTIFY, TX_QUEUE as u32);
    let tx_used = || {
        ram.memory()
            .read_obj::<u16>(GuestAddress(TX_USED + 2))
            .unwrap()
    };
    assert_eq!(tx_used(), 1, "one frame fits the host end");
    // The rest waits for the host end: a notification would find it full.
    assert!(!driver_notifies(&ram, TX_USED, 16, 3, 4));
    assert!(!d.device_mut().on_host_ready(1, true).run_tx, "still full");
    // The host end's thread finds it drained and runs the queue.
    open.store(true, std::sync::atomic::Ordering::Relaxed);
    let turn = d.device_mut().on_host_ready(1, true);
    assert!(turn.run_tx);
    d.kick(TX_QUEUE);
    assert_eq!(tx_used(), 3);
    assert!(irq.level());
    d.device_mut().on_host_ready(1, true);
    assert_eq!(*sent.lock().unwrap(), frames);
    // Everything taken: the driver's next frame is notified.
    assert!(driver_notifies(&ram, TX_USED, 16, 3, 4));
}

/// VIRTIO_NET_F_CSUM and VIRTIO_NET_F_GUEST_CSUM.
const CSUM_BOTH: u64 = (1 << VIRTIO_NET_F_CSUM) | (1 << VIRTIO_NET_F_GUEST_CSUM);

/// A TCP/IPv4 frame as Linux hands it to the driver with its checksum
/// left to the device, and its header asking for it.
fn partial_tcp_frame(payload_len: usize) -> (Vec<u8>, [u8; NET_HDR_LEN]) {
    use super::offload::tests::{as_partial, ipv4_frame, tcp};
    let mut f = ipv4_frame(6, &tcp(&frame(payload_len, 3)));
    let hdr = as_partial(&mut f, false, 16);
    (f, hdr)
}

/// Writes `bytes` across descriptors of the given `lens` (each at its own
/// page, starting at an odd address) and adds them as chain `first`.
fn add_split(
    ram: &crate::memory::GuestRam,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    first: u16,
    base: u64,
    bytes: &[u8],
    lens: &[usize],
) {
    assert_eq!(lens.iter().sum::<usize>(), bytes.len());
    let mut parts = Vec::new();
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        let addr = base + i as u64 * 0x1000 + 1;
        ram.memory()
            .write_slice(&bytes[at..at + len], GuestAddress(addr))
            .unwrap();
        parts.push((addr, len as u32, false));
        at += len;
    }
    add_chain(vq, first, &parts);
}

#[test]
fn transmit_fills_in_the_checksum_across_a_chain_split_at_odd_offsets() {
    use super::offload::l4_checksum_valid;
    let ram = ram();
    let (mut n, sink) = net();
    let (vq, mut q) = queue(&ram);
    // 1501 bytes of payload: an odd length; the header split too.
    let (f, hdr) = partial_tcp_frame(1501);
    let mut bytes = hdr.to_vec();
    bytes.extend_from_slice(&f);
    let lens = [5, 7 + 33, 3, 1001, bytes.len() - 5 - 40 - 3 - 1001];
    add_split(&ram, &vq, 0, BUF, &bytes, &lens);
    assert!(n
        .process_queue(TX_QUEUE, &mut q, ram.memory(), CSUM_BOTH)
        .unwrap());
    let sent = sink.frames.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert!(
        l4_checksum_valid(&sent[0]),
        "the host end gets a valid frame"
    );
    // Only the checksum field changed.
    assert_eq!(sent[0][..50], f[..50]);
    assert_eq!(sent[0][52..], f[52..]);
    assert_eq!(n.counters().tx_frames, 1);
}

#[test]
fn hostile_transmit_headers_drop_their_frame_only() {
    use super::offload::tests::csum_hdr;
    let ram = ram();
    let (mut n, sink) = net();
    let (vq, mut q) = queue(&ram);
    let (f, good) = partial_tcp_frame(100);
    let len = f.len() as u16;
    let mut gso = [0u8; NET_HDR_LEN];
    gso[1] = 3; // VIRTIO_NET_HDR_GSO_UDP
    let headers = [
        csum_hdr(len, 0),           // csum_start past the frame
        csum_hdr(34, len - 34 - 1), // csum_offset + 2 past it
        csum_hdr(u16::MAX, u16::MAX),
        gso,
        good,
    ];
    for (i, h) in headers.iter().enumerate() {
        let mut bytes = h.to_vec();
        bytes.extend_from_slice(&f);
        add_split(
            &ram,
            &vq,
            2 * i as u16,
            BUF + i as u64 * 0x2000,
            &bytes,
            &[12, f.len()],
        );
    }
    assert!(n
        .process_queue(TX_QUEUE, &mut q, ram.memory(), CSUM_BOTH)
        .unwrap());
    assert_eq!(q.next_used(), 5, "every chain is returned");
    assert_eq!((n.counters().tx_frames, n.counters().tx_dropped), (1, 4));
    assert_eq!(sink.frames.lock().unwrap().len(), 1);
    // NEEDS_CSUM from a driver that did not negotiate VIRTIO_NET_F_CSUM.
    let (vq, mut q) = queue(&ram);
    let mut bytes = good.to_vec();
    bytes.extend_from_slice(&f);
    add_split(&ram, &vq, 0, BUF, &bytes, &[bytes.len()]);
    let no_csum = 1 << VIRTIO_NET_F_GUEST_CSUM;
    assert!(n
        .process_queue(TX_QUEUE, &mut q, ram.memory(), no_csum)
        .unwrap());
    assert_eq!((n.counters().tx_frames, n.counters().tx_dropped), (1, 5));
}

/// The `flags` byte of the header the device wrote into a receive buffer
/// at [`BUF`], after delivering `f` under `features`.
fn rx_flags_written(f: &[u8], features: u64) -> u8 {
    let ram = ram();
    let (mut n, _) = net();
    let (vq, mut q) = queue(&ram);
    ram.memory()
        .write_slice(&[0xffu8; 12], GuestAddress(BUF))
        .unwrap();
    add_chain(&vq, 0, &[(BUF, (12 + f.len()) as u32, true)]);
    assert!(n.receive(f));
    assert!(n
        .process_queue(RX_QUEUE, &mut q, ram.memory(), features)
        .unwrap());
    let mut hdr = [0u8; 12];
    ram.memory()
        .read_slice(&mut hdr, GuestAddress(BUF))
        .unwrap();
    assert_eq!(hdr[1..10], [0; 9], "no GSO, no checksum fields");
    hdr[0]
}

#[test]
fn data_valid_marks_checked_frames_only_when_guest_csum_was_negotiated() {
    let (mut f, hdr) = partial_tcp_frame(777);
    super::offload::finish_tx(&hdr, &mut f, CSUM_BOTH).unwrap();
    assert_eq!(rx_flags_written(&f, CSUM_BOTH), 2, "DATA_VALID");
    assert_eq!(rx_flags_written(&f, 1 << VIRTIO_NET_F_CSUM), 0);
    assert_eq!(rx_flags_written(&f, 0), 0);
    // A corrupted checksum: the guest is left to find it.
    f[50] ^= 1;
    assert_eq!(rx_flags_written(&f, CSUM_BOTH), 0);
    // Not TCP or UDP.
    assert_eq!(rx_flags_written(&frame(200, 1), CSUM_BOTH), 0);
}

#[test]
fn a_driver_restored_from_before_checksum_offload_keeps_its_features() {
    use crate::devices::virtio::mmio::tests::{used_idx, w};
    use crate::devices::virtio::VirtioMmio;
    // What a driver negotiated when the device offered no offloads.
    let old = V1_EVENT_IDX
        | (1 << VIRTIO_NET_F_MAC)
        | (1 << VIRTIO_NET_F_STATUS)
        | (1 << VIRTIO_NET_F_MRG_RXBUF);
    let ram = ram();
    let (d, irq) = running(&ram, Box::new(Sink::default()), old);
    let state = d.save();
    drop(d);
    // The layer's JSON as the old build wrote it reads the same.
    let json = serde_json::to_string(&state).unwrap();
    let state: crate::devices::virtio::VirtioMmioState<NetState> =
        serde_json::from_str(&json).unwrap();
    let sink = Sink::default();
    let args = NetArgs {
        mac: None,
        backend: Box::new(sink.clone()),
    };
    let mut d = VirtioMmio::<Net>::restore((args, ram.clone(), irq), &state).unwrap();
    // Receive: no DATA_VALID for a driver that did not ask for it.
    let (mut f, hdr) = partial_tcp_frame(300);
    super::offload::finish_tx(&hdr, &mut f, CSUM_BOTH).unwrap();
    let rx = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    add_chain(&rx, 0, &[(BUF, 4096, true)]);
    assert!(d.device_mut().receive(&f));
    w(&mut d, QUEUE_NOTIFY, RX_QUEUE as u32);
    assert_eq!(used_idx(&ram), 1);
    let mut flags = [0xffu8];
    ram.memory()
        .read_slice(&mut flags, GuestAddress(BUF))
        .unwrap();
    assert_eq!(flags, [0]);
    // Transmit: a header asking for a checksum it did not negotiate is
    // refused; a plain one goes through.
    let (p, needs) = partial_tcp_frame(300);
    let tx = MockSplitQueue::create(ram.memory(), GuestAddress(TX_RING), 16);
    for (i, h) in [needs, [0u8; NET_HDR_LEN]].iter().enumerate() {
        let mut bytes = h.to_vec();
        bytes.extend_from_slice(&p);
        add_split(
            &ram,
            &tx,
            i as u16,
            BUF + 0x4000 + i as u64 * 0x1000,
            &bytes,
            &[bytes.len()],
        );
    }
    w(&mut d, QUEUE_NOTIFY, TX_QUEUE as u32);
    assert_eq!(*sink.frames.lock().unwrap(), [p]);
    let c = d.device().counters();
    assert_eq!((c.tx_frames, c.tx_dropped), (1, 1));
}
