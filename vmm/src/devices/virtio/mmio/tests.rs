use super::*;
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::devices::pl011::tests::TestIrq;
use crate::memory::GuestMemoryMmap;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::QueueOwnedT;
use vm_memory::Bytes;

/// A device with one 16-entry queue that uses every buffer with length 0.
#[derive(Default)]
struct Sink {
    activated: Option<u64>,
    resets: usize,
    used: usize,
    config: [u8; 8],
}

impl Persist for Sink {
    type State = (Option<u64>, usize);
    type Args = ();
    type Error = VirtioError;
    fn save(&self) -> Self::State {
        (self.activated, self.used)
    }
    fn restore((): (), state: &Self::State) -> Result<Self, VirtioError> {
        let (activated, used) = *state;
        Ok(Sink {
            activated,
            used,
            ..Sink::default()
        })
    }
}

impl VirtioDevice for Sink {
    const QUEUE_MAX_SIZES: &'static [u16] = &[16];

    fn device_type(&self) -> u32 {
        42
    }

    fn name(&self) -> &'static str {
        "sink"
    }
    fn features(&self) -> u64 {
        1 << 3
    }
    fn config_as_bytes(&self) -> &[u8] {
        &self.config
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.config[offset as usize..][..data.len()].copy_from_slice(data);
    }
    fn activate(&mut self, features: u64) -> Result<(), VirtioError> {
        self.activated = Some(features);
        Ok(())
    }
    fn process_queue(
        &mut self,
        _index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        _features: u64,
    ) -> Result<bool, VirtioError> {
        let mut any = false;
        loop {
            let chain = queue.iter(mem)?.next();
            let Some(chain) = chain else { break };
            queue.add_used(mem, chain.head_index(), 0)?;
            self.used += 1;
            any = true;
        }
        Ok(any)
    }
    fn reset(&mut self) {
        self.activated = None;
        self.resets += 1;
    }
}

pub(crate) fn ram() -> Arc<GuestRam> {
    Arc::new(GuestRam::new_anonymous(64 * PAGE_SIZE).unwrap())
}

fn sink() -> (VirtioMmio<Sink>, Arc<GuestRam>, Arc<TestIrq>) {
    let ram = ram();
    let irq = Arc::new(TestIrq::default());
    let dev = VirtioMmio::new(Sink::default(), ram.clone(), irq.clone()).unwrap();
    (dev, ram, irq)
}

pub(crate) fn r<D: VirtioDevice>(d: &mut VirtioMmio<D>, off: u64) -> u32 {
    let mut b = [0u8; 4];
    d.read(0, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

pub(crate) fn w<D: VirtioDevice>(d: &mut VirtioMmio<D>, off: u64, v: u32) {
    d.write(0, off, &v.to_le_bytes()).unwrap();
}

/// ACKNOWLEDGE, DRIVER, write `features`, FEATURES_OK.
pub(crate) fn negotiate<D: VirtioDevice>(d: &mut VirtioMmio<D>, features: u64) {
    w(d, STATUS, ACKNOWLEDGE);
    w(d, STATUS, ACKNOWLEDGE | DRIVER);
    w(d, DRIVER_FEATURES_SEL, 0);
    w(d, DRIVER_FEATURES, features as u32);
    w(d, DRIVER_FEATURES_SEL, 1);
    w(d, DRIVER_FEATURES, (features >> 32) as u32);
    w(d, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
}

/// Where tests put the used ring. (MockSplitQueue's own used ring
/// overlaps the end of its available ring, so it is not used.)
pub(crate) const USED_RING: u64 = RAM_BASE + 0x800;

/// The used ring's index field.
pub(crate) fn used_idx(ram: &GuestRam) -> u16 {
    ram.memory().read_obj(GuestAddress(USED_RING + 2)).unwrap()
}

/// Used-ring entry `i`: (descriptor head, length).
pub(crate) fn used_elem(ram: &GuestRam, i: u16) -> (u32, u32) {
    let at = USED_RING + 4 + 8 * u64::from(i);
    let id: u32 = ram.memory().read_obj(GuestAddress(at)).unwrap();
    let len: u32 = ram.memory().read_obj(GuestAddress(at + 4)).unwrap();
    (id, len)
}

/// Programs queue 0 from a mock driver queue (size at most 64, used
/// ring at [`USED_RING`]) and marks it ready.
pub(crate) fn setup_queue<D: VirtioDevice>(
    d: &mut VirtioMmio<D>,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    size: u16,
) {
    setup_queue_at(d, 0, vq, size, USED_RING);
}

/// Programs queue `index` from a mock driver queue of `size` entries,
/// with its used ring at `used_ring`, and marks it ready.
pub(crate) fn setup_queue_at<D: VirtioDevice>(
    d: &mut VirtioMmio<D>,
    index: u32,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    size: u16,
    used_ring: u64,
) {
    w(d, QUEUE_SEL, index);
    w(d, QUEUE_NUM, u32::from(size));
    for (lo, addr) in [
        (QUEUE_DESC_LOW, vq.desc_table_addr().0),
        (QUEUE_DRIVER_LOW, vq.avail_addr().0),
        (QUEUE_DEVICE_LOW, used_ring),
    ] {
        w(d, lo, addr as u32);
        w(d, lo + 4, (addr >> 32) as u32);
    }
    w(d, QUEUE_READY, 1);
}

pub(crate) const RUNNING: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK;

/// Whether a driver that moves the available index of a queue of `size`
/// entries with its used ring at `used_ring` from `old` to `new` must
/// notify, by the queue's `avail_event` (virtio 1.2 §2.7.10, with
/// VIRTIO_F_RING_EVENT_IDX).
pub(crate) fn driver_notifies(
    ram: &GuestRam,
    used_ring: u64,
    size: u16,
    old: u16,
    new: u16,
) -> bool {
    let at = GuestAddress(used_ring + 4 + 8 * u64::from(size));
    let event: u16 = ram.memory().read_obj(at).unwrap();
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Adds a one-descriptor chain at descriptor `index`.
fn add_buffer(vq: &MockSplitQueue<'_, GuestMemoryMmap>, index: u16) {
    let desc = RawDescriptor::from(SplitDescriptor::new(RAM_BASE + 0x8000, 16, 0, 0));
    vq.add_desc_chains(&[desc], index).unwrap();
}

#[test]
fn identification_registers() {
    let (mut d, _, _) = sink();
    assert_eq!(r(&mut d, MAGIC), 0x7472_6976);
    assert_eq!(r(&mut d, VERSION), 2);
    assert_eq!(r(&mut d, DEVICE_ID), 42);
    assert_eq!(r(&mut d, VENDOR), u32::from_le_bytes(*b"IGNT"));
    assert_eq!(r(&mut d, QUEUE_NUM_MAX), 16);
    assert_eq!(r(&mut d, CONFIG_GENERATION), 0);
    assert_eq!(r(&mut d, SHM_LEN_LOW), u32::MAX);
    w(&mut d, QUEUE_SEL, 1);
    assert_eq!(r(&mut d, QUEUE_NUM_MAX), 0, "absent queue");
    // Access rules.
    assert_eq!(d.read(0, MAGIC, &mut [0u8; 2]), Err(AccessError::Size));
    assert_eq!(d.read(0, MAGIC, &mut [0u8; 8]), Err(AccessError::Size));
    assert_eq!(d.read(0, 0x002, &mut [0u8; 4]), Err(AccessError::Alignment));
    assert_eq!(d.write(0, MAGIC, &[0; 4]), Err(AccessError::ReadOnly));
    assert_eq!(
        d.read(0, QUEUE_SEL, &mut [0u8; 4]),
        Err(AccessError::WriteOnly)
    );
    assert_eq!(
        d.read(0, 0x028, &mut [0u8; 4]),
        Err(AccessError::NoRegister)
    );
    assert_eq!(
        d.read(0, 0x040, &mut [0u8; 4]),
        Err(AccessError::NoRegister)
    );
}

#[test]
fn config_space_is_byte_addressable() {
    let (mut d, _, _) = sink();
    d.write(0, 0x104, &[0xaa, 0xbb]).unwrap();
    let mut b = [0u8; 1];
    d.read(0, 0x105, &mut b).unwrap();
    assert_eq!(b[0], 0xbb);
    let mut q = [0u8; 8];
    d.read(0, 0x100, &mut q).unwrap();
    assert_eq!(q, [0, 0, 0, 0, 0xaa, 0xbb, 0, 0]);
    assert_eq!(d.read(0, 0x102, &mut [0u8; 4]), Err(AccessError::Alignment));
}

#[test]
fn features_require_version_1() {
    let (mut d, _, _) = sink();
    w(&mut d, DEVICE_FEATURES_SEL, 0);
    assert_eq!(r(&mut d, DEVICE_FEATURES), (1 << 3) | (1 << 28) | (1 << 29));
    w(&mut d, DEVICE_FEATURES_SEL, 1);
    assert_eq!(r(&mut d, DEVICE_FEATURES), 1, "VERSION_1 is bit 32");
    w(&mut d, DEVICE_FEATURES_SEL, 2);
    assert_eq!(r(&mut d, DEVICE_FEATURES), 0);

    // Without VERSION_1 FEATURES_OK does not stick.
    negotiate(&mut d, 1 << 3);
    assert_eq!(r(&mut d, STATUS), ACKNOWLEDGE | DRIVER);
    // A feature that was not offered is refused too.
    negotiate(&mut d, VERSION_1 | (1 << 4));
    assert_eq!(r(&mut d, STATUS), ACKNOWLEDGE | DRIVER);
    w(&mut d, STATUS, 0);
    negotiate(&mut d, VERSION_1 | (1 << 3));
    assert_eq!(r(&mut d, STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
    // Features are frozen after FEATURES_OK.
    w(&mut d, DRIVER_FEATURES_SEL, 0);
    w(&mut d, DRIVER_FEATURES, 0);
    w(&mut d, STATUS, RUNNING);
    assert_eq!(d.device().activated, Some(VERSION_1 | (1 << 3)));
}

#[test]
fn status_state_machine_and_reset() {
    let (mut d, ram, irq) = sink();
    w(&mut d, STATUS, DRIVER);
    assert_eq!(r(&mut d, STATUS), 0, "DRIVER before ACKNOWLEDGE");
    w(&mut d, STATUS, ACKNOWLEDGE | DRIVER);
    w(&mut d, STATUS, ACKNOWLEDGE | DRIVER | DRIVER_OK);
    assert_eq!(
        r(&mut d, STATUS),
        ACKNOWLEDGE | DRIVER,
        "DRIVER_OK before FEATURES_OK"
    );
    w(&mut d, STATUS, ACKNOWLEDGE);
    assert_eq!(
        r(&mut d, STATUS),
        ACKNOWLEDGE | DRIVER,
        "bits cannot be cleared"
    );
    w(&mut d, STATUS, ACKNOWLEDGE | DRIVER | 0x10);
    assert_eq!(r(&mut d, STATUS), ACKNOWLEDGE | DRIVER, "reserved bit");
    w(&mut d, STATUS, 0);
    negotiate(&mut d, VERSION_1);
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    setup_queue(&mut d, &vq, 16);
    w(&mut d, STATUS, RUNNING);
    assert_eq!(r(&mut d, STATUS), RUNNING);
    add_buffer(&vq, 0);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert!(irq.level());
    w(&mut d, STATUS, RUNNING | FAILED);
    assert_eq!(r(&mut d, STATUS), RUNNING | FAILED, "FAILED any time");

    w(&mut d, STATUS, 0);
    assert_eq!(r(&mut d, STATUS), 0);
    assert_eq!(r(&mut d, QUEUE_READY), 0);
    assert_eq!(r(&mut d, INTERRUPT_STATUS), 0);
    assert!(!irq.level());
    assert_eq!(d.device().resets, 2);
    assert_eq!(d.device().activated, None);
    assert_eq!(d.queues[0].next_avail(), 0);
}

#[test]
fn queue_setup_rules() {
    let (mut d, ram, _) = sink();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 8);
    // Before FEATURES_OK nothing sticks.
    w(&mut d, STATUS, ACKNOWLEDGE | DRIVER);
    w(&mut d, QUEUE_NUM, 8);
    w(&mut d, QUEUE_READY, 1);
    assert_eq!(r(&mut d, QUEUE_READY), 0);
    assert_eq!(d.queues[0].size(), 16);
    w(&mut d, STATUS, 0);

    negotiate(&mut d, VERSION_1);
    w(&mut d, QUEUE_NUM, 12);
    assert_eq!(d.queues[0].size(), 16, "not a power of two");
    w(&mut d, QUEUE_NUM, 32);
    assert_eq!(d.queues[0].size(), 16, "above QueueNumMax");
    w(&mut d, QUEUE_NUM, 1 << 16);
    assert_eq!(d.queues[0].size(), 16);
    w(&mut d, QUEUE_DESC_LOW, 0x1008);
    assert_eq!(d.queues[0].desc_table(), 0, "misaligned descriptor table");
    setup_queue(&mut d, &vq, 8);
    assert_eq!(r(&mut d, QUEUE_READY), 1);
    let q = &d.queues[0];
    assert_eq!(
        (q.size(), q.desc_table(), q.avail_ring(), q.used_ring()),
        (8, vq.desc_table_addr().0, vq.avail_addr().0, USED_RING)
    );
    // No changes while ready.
    w(&mut d, QUEUE_NUM, 4);
    w(&mut d, QUEUE_DESC_HIGH, 1);
    assert_eq!(d.queues[0].size(), 8);
    assert_eq!(d.queues[0].desc_table(), vq.desc_table_addr().0);
    // Stopping and changing again is fine.
    w(&mut d, QUEUE_READY, 0);
    w(&mut d, QUEUE_NUM, 4);
    assert_eq!(d.queues[0].size(), 4);
    // An absent queue ignores set-up.
    w(&mut d, QUEUE_SEL, 3);
    w(&mut d, QUEUE_READY, 1);
    assert_eq!(r(&mut d, QUEUE_READY), 0);
}

#[test]
fn used_buffer_interrupt_and_ack() {
    let (mut d, ram, irq) = sink();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    negotiate(&mut d, VERSION_1);
    setup_queue(&mut d, &vq, 16);
    add_buffer(&vq, 0);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert_eq!(d.device().used, 0, "no processing before DRIVER_OK");
    w(&mut d, STATUS, RUNNING);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert_eq!(d.device().used, 1);
    assert_eq!(used_idx(&ram), 1);
    assert_eq!(r(&mut d, INTERRUPT_STATUS), INT_VRING);
    assert!(irq.level());
    w(&mut d, INTERRUPT_ACK, INT_VRING);
    assert_eq!(r(&mut d, INTERRUPT_STATUS), 0);
    assert!(!irq.level());
    // Nothing new: no interrupt.
    w(&mut d, QUEUE_NOTIFY, 0);
    assert!(!irq.level());
    // Config change: bit 1 and a new generation.
    d.signal_config_change();
    assert_eq!(r(&mut d, INTERRUPT_STATUS), INT_CONFIG);
    assert_eq!(r(&mut d, CONFIG_GENERATION), 1);
    add_buffer(&vq, 1);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert_eq!(r(&mut d, INTERRUPT_STATUS), INT_VRING | INT_CONFIG);
    w(&mut d, INTERRUPT_ACK, INT_CONFIG);
    assert!(irq.level(), "still high while bit 0 is set");
    w(&mut d, INTERRUPT_ACK, INT_VRING);
    assert!(!irq.level());
    assert_eq!(irq.changes(), [true, false, true, false]);
    // Without EVENT_IDX the device re-enabled notifications.
    assert_eq!(
        ram.memory()
            .read_obj::<u16>(GuestAddress(USED_RING))
            .unwrap(),
        0
    );
}

#[test]
fn event_idx_suppresses_interrupts() {
    let (mut d, ram, irq) = sink();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    negotiate(&mut d, VERSION_1 | EVENT_IDX);
    setup_queue(&mut d, &vq, 16);
    w(&mut d, STATUS, RUNNING);
    // used_event (after the 16 avail entries) = 1: interrupt once the
    // used index passes 1, i.e. at the second buffer.
    let used_event = GuestAddress(vq.avail_addr().0 + 4 + 2 * 16);
    ram.memory().write_obj(1u16, used_event).unwrap();
    add_buffer(&vq, 0);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert_eq!(d.device().used, 1);
    assert!(!irq.level(), "used_event not reached");
    add_buffer(&vq, 1);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert!(irq.level());
    // avail_event (after the 16 used entries) tells the driver where to kick.
    let avail_event = GuestAddress(USED_RING + 4 + 8 * 16);
    assert_eq!(ram.memory().read_obj::<u16>(avail_event).unwrap(), 2);
}

#[test]
fn broken_rings_need_reset() {
    let (mut d, ram, irq) = sink();
    negotiate(&mut d, VERSION_1);
    // Rings beyond the end of RAM.
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    setup_queue(&mut d, &vq, 16);
    w(&mut d, QUEUE_READY, 0);
    w(&mut d, QUEUE_DEVICE_LOW, 0);
    w(&mut d, QUEUE_DEVICE_HIGH, 0x10);
    w(&mut d, QUEUE_READY, 1);
    w(&mut d, STATUS, RUNNING);
    assert_eq!(r(&mut d, STATUS), RUNNING | NEEDS_RESET);
    assert_eq!(r(&mut d, INTERRUPT_STATUS), INT_CONFIG);
    assert!(irq.level());
    assert_eq!(d.device().activated, None);
    // The driver's write-back of NEEDS_RESET is harmless; notify is ignored.
    w(&mut d, STATUS, RUNNING | NEEDS_RESET | FAILED);
    add_buffer(&vq, 0);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert_eq!(d.device().used, 0);
    w(&mut d, STATUS, 0);
    assert_eq!(r(&mut d, STATUS), 0);

    // An available index running more than a queue ahead breaks the ring.
    let (mut d, ram, _) = sink();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    negotiate(&mut d, VERSION_1);
    setup_queue(&mut d, &vq, 16);
    w(&mut d, STATUS, RUNNING);
    vq.avail().idx().store(100);
    w(&mut d, QUEUE_NOTIFY, 0);
    assert_eq!(r(&mut d, STATUS), RUNNING | NEEDS_RESET);
}

#[test]
fn save_restore_round_trip() {
    let (mut d, ram, _) = sink();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    negotiate(&mut d, VERSION_1 | EVENT_IDX);
    setup_queue(&mut d, &vq, 16);
    w(&mut d, STATUS, RUNNING);
    add_buffer(&vq, 0);
    w(&mut d, QUEUE_NOTIFY, 0);
    let state = d.save();
    let json = serde_json::to_string(&state).unwrap();
    let state: VirtioMmioState<(Option<u64>, usize)> = serde_json::from_str(&json).unwrap();

    let irq = Arc::new(TestIrq::default());
    let mut e = VirtioMmio::<Sink>::restore(((), ram.clone(), irq.clone()), &state).unwrap();
    assert_eq!(e.save(), state);
    assert!(irq.level(), "pending interrupt restored");
    assert_eq!(e.queues[0].next_avail(), 1);
    add_buffer(&vq, 1);
    w(&mut e, QUEUE_NOTIFY, 0);
    assert_eq!(used_idx(&ram), 2);
    assert_eq!(e.device().used, 2);
}

#[test]
fn restore_rejects_bad_state() {
    let (mut d, ram, _) = sink();
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    negotiate(&mut d, VERSION_1);
    setup_queue(&mut d, &vq, 16);
    w(&mut d, STATUS, RUNNING);
    let good = d.save();
    let (e, eram, _) = sink();
    let restore = |s: &St| {
        let irq = Arc::new(TestIrq::default());
        VirtioMmio::<Sink>::restore(((), eram.clone(), irq), s)
    };
    type St = VirtioMmioState<(Option<u64>, usize)>;
    type Breaker = Box<dyn Fn(&mut St)>;
    let cases: Vec<(&str, Breaker)> = vec![
        ("queue size", Box::new(|s: &mut St| s.queues[0].size = 12)),
        ("max size", Box::new(|s: &mut St| s.queues[0].max_size = 32)),
        ("queue count", Box::new(|s: &mut St| s.queues.clear())),
        (
            "alignment",
            Box::new(|s: &mut St| s.queues[0].used_ring += 2),
        ),
        (
            "outside RAM",
            Box::new(|s: &mut St| s.queues[0].desc_table = 0),
        ),
        (
            "event idx",
            Box::new(|s: &mut St| s.queues[0].event_idx_enabled = true),
        ),
        ("no VERSION_1", Box::new(|s: &mut St| s.driver_features = 0)),
        (
            "unoffered",
            Box::new(|s: &mut St| s.driver_features |= 1 << 40),
        ),
        ("status order", Box::new(|s: &mut St| s.status = DRIVER_OK)),
        ("status bits", Box::new(|s: &mut St| s.status |= 0x20)),
        ("interrupt", Box::new(|s: &mut St| s.interrupt_status = 4)),
    ];
    for (what, break_it) in cases {
        let mut s = good.clone();
        break_it(&mut s);
        assert!(restore(&s).is_err(), "{what} accepted");
    }
    assert_eq!(e.status(), 0, "failed restores change nothing");
    let e = restore(&good).unwrap();
    assert_eq!(e.status(), RUNNING);
}

/// Adds a chain of `(address, length, device-writable)` buffers whose
/// descriptors start at index `first`.
pub(crate) fn add_chain(
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    first: u16,
    parts: &[(u64, u32, bool)],
) {
    let descs: Vec<RawDescriptor> = parts
        .iter()
        .enumerate()
        .map(|(i, &(addr, len, writable))| {
            let mut flags = if writable { VRING_DESC_F_WRITE } else { 0 };
            if i + 1 < parts.len() {
                flags |= VRING_DESC_F_NEXT;
            }
            let next = first + i as u16 + 1;
            RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
        })
        .collect();
    vq.add_desc_chains(&descs, first).unwrap();
}

/// A mock driver queue of 16 entries with its used ring at [`USED_RING`],
/// and the device's view of it.
pub(crate) fn queue(ram: &GuestRam) -> (MockSplitQueue<'_, GuestMemoryMmap>, Queue) {
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
    let mut q: Queue = vq.create_queue().unwrap();
    q.try_set_used_ring_address(GuestAddress(USED_RING))
        .unwrap();
    (vq, q)
}
