use super::*;
use std::sync::Mutex;

const CR_UARTEN: u32 = 1 << 0;
const CR_TXE: u32 = 1 << 8;

/// An [`IrqLine`] that records every level it is driven to.
#[derive(Default)]
pub(crate) struct TestIrq {
    pub(crate) history: Mutex<Vec<bool>>,
}

impl TestIrq {
    pub(crate) fn level(&self) -> bool {
        self.history
            .lock()
            .unwrap()
            .last()
            .copied()
            .unwrap_or(false)
    }
    pub(crate) fn changes(&self) -> Vec<bool> {
        self.history.lock().unwrap().clone()
    }
}

impl IrqLine for TestIrq {
    fn set_level(&self, level: bool) {
        self.history.lock().unwrap().push(level);
    }
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);
impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn uart() -> (Pl011, Sink, Arc<TestIrq>) {
    let sink = Sink::default();
    let irq = Arc::new(TestIrq::default());
    (Pl011::new(Box::new(sink.clone()), irq.clone()), sink, irq)
}

fn r32(u: &mut Pl011, off: u64) -> u32 {
    let mut d = [0u8; 4];
    u.read(0, off, &mut d).unwrap();
    u32::from_le_bytes(d)
}

fn w32(u: &mut Pl011, off: u64, v: u32) {
    u.write(0, off, &v.to_le_bytes()).unwrap();
}

/// UART enabled with RX and TX, FIFOs on, RX trigger at 1/2 (8 bytes).
fn enabled_uart() -> (Pl011, Sink, Arc<TestIrq>) {
    let (mut u, s, i) = uart();
    w32(&mut u, LCR_H, LCR_H_FEN | 0x60);
    w32(&mut u, CR, CR_UARTEN | CR_TXE | CR_RXE);
    (u, s, i)
}

#[test]
fn id_registers_and_reset_values() {
    let (mut u, _, irq) = uart();
    let ids: Vec<u8> = (0..8).map(|i| r32(&mut u, 0xFE0 + 4 * i) as u8).collect();
    assert_eq!(ids, [0x11, 0x10, 0x34, 0x00, 0x0D, 0xF0, 0x05, 0xB1]);
    assert_eq!(
        u.write(0, 0xFE0, &[0; 4]),
        Err(AccessError::ReadOnly),
        "ID registers are read-only"
    );
    assert_eq!(r32(&mut u, FR), FR_TXFE | FR_RXFE);
    assert_eq!(r32(&mut u, CR), 0x300);
    assert_eq!(r32(&mut u, IFLS), 0x12);
    assert_eq!(r32(&mut u, RIS), 0);
    assert!(irq.changes().is_empty());
}

#[test]
fn access_widths_and_alignment() {
    let (mut u, sink, _) = enabled_uart();
    assert_eq!(u.read(0, FR, &mut [0u8; 8]), Err(AccessError::Size));
    assert_eq!(
        u.read(0, FR + 2, &mut [0u8; 4]),
        Err(AccessError::Alignment)
    );
    assert_eq!(
        u.read(0, 0x050, &mut [0u8; 4]),
        Err(AccessError::NoRegister)
    );
    assert_eq!(u.read(0, ICR, &mut [0u8; 4]), Err(AccessError::WriteOnly));
    assert_eq!(u.write(0, FR, &[0; 4]), Err(AccessError::ReadOnly));
    // Byte and halfword accesses.
    u.write(0, DR, b"A").unwrap();
    u.write(0, DR, &[b'B', 0]).unwrap();
    u.write(0, DR + 1, b"C").unwrap(); // not data bits: ignored
    assert_eq!(sink.0.lock().unwrap().as_slice(), b"AB");
    let mut fr = [0u8; 2];
    u.read(0, FR, &mut fr).unwrap();
    assert_eq!(u16::from_le_bytes(fr), 0x90);
    // A byte write into the upper half of CR keeps the lower half.
    u.write(0, CR + 1, &[0x02]).unwrap();
    assert_eq!(r32(&mut u, CR), 0x201);
    let mut b = [0u8; 1];
    u.read(0, CR + 1, &mut b).unwrap();
    assert_eq!(b[0], 0x02);
}

#[test]
fn rx_fifo_fill_drain_and_overflow() {
    let (mut u, _, _) = enabled_uart();
    assert_eq!(u.rx_space(), 16);
    let input: Vec<u8> = (0..20).collect();
    assert_eq!(u.enqueue_rx(&input), 16);
    assert_eq!(u.rx_space(), 0);
    assert_eq!(u.enqueue_rx(&input[16..]), 0);
    assert_eq!(r32(&mut u, FR) & (FR_RXFF | FR_RXFE), FR_RXFF);
    for expected in 0..16u32 {
        assert_eq!(r32(&mut u, DR), expected);
        assert_eq!(r32(&mut u, FR) & FR_RXFF, 0);
    }
    assert_eq!(r32(&mut u, FR) & FR_RXFE, FR_RXFE);
    assert_eq!(r32(&mut u, DR), 0, "empty FIFO reads as 0");
    assert_eq!(u.enqueue_rx(&input[16..]), 4);
    assert_eq!(r32(&mut u, DR), 16);
}

#[test]
fn rx_without_fifo_and_while_disabled() {
    let (mut u, _, _) = uart();
    w32(&mut u, CR, CR_UARTEN | CR_TXE);
    assert_eq!(u.rx_space(), 0, "RXE clear");
    assert_eq!(u.enqueue_rx(b"x"), 0);
    w32(&mut u, CR, CR_UARTEN | CR_RXE);
    assert_eq!(u.enqueue_rx(b"ab"), 1, "1-byte holding register");
    assert_eq!(r32(&mut u, FR) & (FR_RXFF | FR_RXFE), FR_RXFF);
    // Enabling the FIFO keeps the byte; disabling keeps only the oldest.
    w32(&mut u, LCR_H, LCR_H_FEN);
    assert_eq!(u.enqueue_rx(b"bcd"), 3);
    w32(&mut u, LCR_H, 0);
    assert_eq!(r32(&mut u, DR), u32::from(b'a'));
    assert_eq!(r32(&mut u, FR) & FR_RXFE, FR_RXFE);
    w32(&mut u, CR, CR_UARTEN);
    assert_eq!(u.rx_space(), 0, "RXE clear");
}

/// A guest that never enables the UART (UARTEN clear, CR at its reset
/// value) and polls it with byte reads, as kvm-unit-tests' `getchar`
/// does, gets its input.
#[test]
fn rx_reaches_a_polling_guest_that_never_enabled_the_uart() {
    let (mut u, _, _) = uart();
    assert_eq!(r32(&mut u, CR) & CR_UARTEN, 0);
    assert_eq!(u.enqueue_rx(b"k"), 1);
    let mut b = [0u8; 1];
    u.read(0, FR, &mut b).unwrap();
    assert_eq!(u32::from(b[0]) & FR_RXFE, 0, "RX FIFO not empty");
    u.read(0, DR, &mut b).unwrap();
    assert_eq!(b[0], b'k');
    u.read(0, FR, &mut b).unwrap();
    assert_eq!(u32::from(b[0]) & FR_RXFE, FR_RXFE);
}

#[test]
fn rx_interrupt_follows_trigger_level() {
    let (mut u, _, irq) = enabled_uart();
    w32(&mut u, IMSC, INT_RX);
    assert_eq!(u.enqueue_rx(&[0; 7]), 7);
    assert_eq!(r32(&mut u, RIS) & INT_RX, 0);
    assert!(!irq.level());
    u.enqueue_rx(&[0]);
    assert_eq!(r32(&mut u, MIS), INT_RX);
    assert!(irq.level());
    r32(&mut u, DR); // 7 left: below 8
    assert_eq!(r32(&mut u, RIS) & INT_RX, 0);
    assert!(!irq.level());
    // Lowering the trigger level to 1/8 (2 bytes) raises it again.
    w32(&mut u, IFLS, 0);
    assert!(irq.level());
    // ICR clears it even with data waiting.
    w32(&mut u, ICR, INT_RX);
    assert!(!irq.level());
    assert_eq!(irq.changes(), [true, false, true, false]);
}

#[test]
fn rx_timeout_interrupt_below_trigger_level() {
    let (mut u, _, irq) = enabled_uart();
    w32(&mut u, IMSC, INT_RT | INT_RX);
    u.enqueue_rx(b"hi");
    assert_eq!(r32(&mut u, RIS) & (INT_RX | INT_RT), INT_RT);
    assert!(irq.level());
    w32(&mut u, ICR, INT_RT);
    assert!(!irq.level());
    // Reading with data still waiting re-arms the timeout at once.
    assert_eq!(r32(&mut u, DR), u32::from(b'h'));
    assert!(irq.level());
    assert_eq!(r32(&mut u, DR), u32::from(b'i'));
    assert_eq!(r32(&mut u, RIS), 0);
    assert!(!irq.level());
    // Masked: raw status set, line low.
    w32(&mut u, IMSC, 0);
    u.enqueue_rx(b"x");
    assert_eq!(r32(&mut u, RIS), INT_RT);
    assert_eq!(r32(&mut u, MIS), 0);
    assert!(!irq.level());
}

#[test]
fn tx_interrupt_reraised_by_each_write() {
    let (mut u, sink, irq) = enabled_uart();
    assert_eq!(
        r32(&mut u, RIS) & INT_TX,
        0,
        "empty FIFO alone does not raise TXIS"
    );
    w32(&mut u, IMSC, INT_TX);
    assert!(!irq.level());
    w32(&mut u, DR, u32::from(b'o'));
    assert_eq!(r32(&mut u, MIS), INT_TX);
    assert!(irq.level());
    w32(&mut u, ICR, INT_TX);
    assert!(!irq.level());
    w32(&mut u, DR, u32::from(b'k'));
    assert!(irq.level());
    w32(&mut u, IMSC, 0);
    assert!(!irq.level());
    assert_eq!(r32(&mut u, RIS), INT_TX);
    assert_eq!(sink.0.lock().unwrap().as_slice(), b"ok");
    assert_eq!(irq.changes(), [true, false, true, false]);
    // FR never reports a full or busy transmitter.
    assert_eq!(r32(&mut u, FR) & ((1 << 5) | (1 << 3)), 0);
}

#[test]
fn tx_works_before_the_driver_enables_the_uart() {
    let (mut u, sink, _) = uart();
    w32(&mut u, DR, u32::from(b'E'));
    assert_eq!(sink.0.lock().unwrap().as_slice(), b"E");
}

#[test]
fn save_restore_round_trip_and_validation() {
    let (mut u, _, _) = enabled_uart();
    w32(&mut u, IMSC, INT_RT);
    w32(&mut u, IBRD, 13);
    u.enqueue_rx(b"abc");
    let state = u.save();
    assert_eq!(state.rx_fifo, b"abc");

    let irq = Arc::new(TestIrq::default());
    let mut v = Pl011::restore((Box::new(Sink::default()), irq.clone()), &state).unwrap();
    assert!(irq.level(), "restore drives the line");
    assert_eq!(v.save(), state);
    assert_eq!(r32(&mut v, DR), u32::from(b'a'));

    let restore = |s: &Pl011State| {
        let irq = Arc::new(TestIrq::default());
        Pl011::restore((Box::new(Sink::default()), irq), s).map(|_| ())
    };
    let mut bad = state.clone();
    bad.rx_fifo = vec![0; 17];
    assert!(matches!(
        restore(&bad),
        Err(Pl011StateError::RxOverflow { len: 17, depth: 16 })
    ));
    let mut bad = state.clone();
    bad.lcr_h = 0;
    assert!(restore(&bad).is_err(), "3 bytes without a FIFO");
    let mut bad = state;
    bad.imsc = 0x800;
    assert!(matches!(
        restore(&bad),
        Err(Pl011StateError::BadRegister { name: "IMSC", .. })
    ));
    // A failed restore changed nothing.
    assert_eq!(r32(&mut v, DR), u32::from(b'b'));
}

#[test]
fn state_serializes() {
    let (mut u, _, _) = enabled_uart();
    u.enqueue_rx(b"z");
    let json = serde_json::to_string(&u.save()).unwrap();
    let back: Pl011State = serde_json::from_str(&json).unwrap();
    assert_eq!(back, u.save());
}
