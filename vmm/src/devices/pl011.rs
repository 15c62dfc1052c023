//! ARM PrimeCell UART (PL011), after the PL011 TRM r1p5 (ARM DDI 0183G): the
//! registers Linux's `amba-pl011` driver uses.
//!
//! Model choices (there is no bit clock, so everything happens at once):
//! - TX: a byte written to DR goes straight to the output sink, so the TX
//!   FIFO is always empty (FR.TXFE=1, TXFF=0, BUSY=0). Bytes are sent even
//!   while CR.UARTEN/TXE are clear (as QEMU does), so early console output
//!   works before the driver enables the UART.
//! - TXIS: the TX FIFO level drops to the trigger level right after each DR
//!   write, so every DR write leaves TXIS set (TRM 2.8.2: set when the level
//!   falls to the trigger level, cleared by writing data or by ICR). An
//!   empty FIFO alone does not raise it, so unmasking TXIM on a quiet UART
//!   raises no interrupt until the next write.
//! - RX: 16-byte FIFO when LCR_H.FEN is set, else a 1-byte holding register.
//!   Input is accepted while CR.RXE is set (it is out of reset), whatever
//!   CR.UARTEN says: like TX, so that a guest without firmware that polls
//!   the UART without enabling it (kvm-unit-tests' `getchar`) reads its
//!   input, as on QEMU. With RXE clear (Linux clears it when the tty
//!   closes) [`Pl011::rx_space`] is 0 and the console layer keeps the
//!   bytes. Input is flow-controlled by the caller, so there are no
//!   overruns or errors.
//! - RXIS: set when the FIFO level reaches the IFLS trigger level, cleared
//!   when reads take it below the level (TRM 2.8.2).
//! - RTIS (receive timeout): with no bit clock the 32-bit-period timeout is
//!   taken to expire at once, so RTIS is set whenever data arrives or is
//!   read and the FIFO is still non-empty, and cleared when it empties. A
//!   guest that clears it through ICR sees it again at the next RX event if
//!   data is still waiting.
//! - Loopback (CR.LBE), IrDA, modem lines and DMA are not modelled; their
//!   register bits are stored and read back.

use super::{le_value, set_le_value, AccessError, IrqLine, MmioDevice, Persist};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

/// Depth of the RX FIFO in bytes (TRM 2.4.3) when LCR_H.FEN is set.
pub const FIFO_DEPTH: usize = 16;

// Register offsets (TRM 3.2, table 3-1).
const DR: u64 = 0x000;
const RSR_ECR: u64 = 0x004;
const FR: u64 = 0x018;
const ILPR: u64 = 0x020;
const IBRD: u64 = 0x024;
const FBRD: u64 = 0x028;
const LCR_H: u64 = 0x02C;
const CR: u64 = 0x030;
const IFLS: u64 = 0x034;
const IMSC: u64 = 0x038;
const RIS: u64 = 0x03C;
const MIS: u64 = 0x040;
const ICR: u64 = 0x044;
const DMACR: u64 = 0x048;
/// UARTPeriphID0..3 then UARTPCellID0..3, one byte per 32-bit register.
const ID_BASE: u64 = 0xFE0;
const ID_BYTES: [u8; 8] = [0x11, 0x10, 0x34, 0x00, 0x0D, 0xF0, 0x05, 0xB1];

// Register widths (bits that exist), TRM 3.3.
const ILPR_MASK: u32 = 0xFF;
const IBRD_MASK: u32 = 0xFFFF;
const FBRD_MASK: u32 = 0x3F;
const LCR_H_MASK: u32 = 0xFF;
const CR_MASK: u32 = 0xFF87;
const IFLS_MASK: u32 = 0x3F;
const DMACR_MASK: u32 = 0x7;

// Reset values, TRM 3.3.
const CR_RESET: u32 = 0x0300;
const IFLS_RESET: u32 = 0x12;

// FR bits.
const FR_RXFE: u32 = 1 << 4;
const FR_RXFF: u32 = 1 << 6;
const FR_TXFE: u32 = 1 << 7;

const LCR_H_FEN: u32 = 1 << 4;
const CR_RXE: u32 = 1 << 9;

/// Receive interrupt bit in RIS/MIS/IMSC/ICR.
pub const INT_RX: u32 = 1 << 4;
/// Transmit interrupt bit.
pub const INT_TX: u32 = 1 << 5;
/// Receive timeout interrupt bit.
pub const INT_RT: u32 = 1 << 6;
/// All eleven interrupt bits (RIMIS..OEMIS).
const INT_MASK: u32 = 0x7FF;

/// A PL011 UART. Output bytes go to `out`; the interrupt output is
/// `(RIS & IMSC) != 0`, driven on `irq` whenever it changes.
pub struct Pl011 {
    out: Box<dyn Write + Send>,
    irq: Arc<dyn IrqLine>,
    irq_level: bool,
    rx: VecDeque<u8>,
    ilpr: u32,
    ibrd: u32,
    fbrd: u32,
    lcr_h: u32,
    cr: u32,
    ifls: u32,
    imsc: u32,
    ris: u32,
    dmacr: u32,
}

/// Saved PL011 state. Untrusted: [`Pl011`]'s [`Persist::restore`] validates
/// it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pl011State {
    /// Bytes waiting in the RX FIFO, oldest first.
    pub rx_fifo: Vec<u8>,
    /// UARTILPR.
    pub ilpr: u32,
    /// UARTIBRD.
    pub ibrd: u32,
    /// UARTFBRD.
    pub fbrd: u32,
    /// UARTLCR_H.
    pub lcr_h: u32,
    /// UARTCR.
    pub cr: u32,
    /// UARTIFLS.
    pub ifls: u32,
    /// UARTIMSC.
    pub imsc: u32,
    /// UARTRIS (raw interrupt status).
    pub ris: u32,
    /// UARTDMACR.
    pub dmacr: u32,
}

/// Why a saved [`Pl011State`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Pl011StateError {
    /// The RX FIFO holds more than the configured depth.
    #[error("RX FIFO holds {len} bytes but its depth is {depth}")]
    RxOverflow {
        /// Saved FIFO length.
        len: usize,
        /// Depth implied by the saved LCR_H.FEN.
        depth: usize,
    },
    /// A register has bits set that do not exist.
    #[error("register {name} value {value:#x} has bits outside {mask:#x}")]
    BadRegister {
        /// Register name.
        name: &'static str,
        /// Saved value.
        value: u32,
        /// Implemented bits.
        mask: u32,
    },
}

impl Pl011 {
    /// A UART in its reset state, writing transmitted bytes to `out` and
    /// driving `irq`. Each byte is written and flushed on its own, so `out`
    /// may be buffered.
    pub fn new(out: Box<dyn Write + Send>, irq: Arc<dyn IrqLine>) -> Self {
        Pl011 {
            out,
            irq,
            irq_level: false,
            rx: VecDeque::with_capacity(FIFO_DEPTH),
            ilpr: 0,
            ibrd: 0,
            fbrd: 0,
            lcr_h: 0,
            cr: CR_RESET,
            ifls: IFLS_RESET,
            imsc: 0,
            ris: 0,
            dmacr: 0,
        }
    }

    /// Queues host input for the guest. Returns how many leading bytes of
    /// `bytes` were accepted (at most [`Pl011::rx_space`]); the caller keeps
    /// the rest and retries later (e.g. when the guest has read some).
    pub fn enqueue_rx(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.rx_space());
        if n == 0 {
            return 0;
        }
        self.rx.extend(&bytes[..n]);
        if self.rx.len() >= self.rx_trigger() {
            self.ris |= INT_RX;
        }
        self.ris |= INT_RT;
        self.update_irq();
        n
    }

    /// Bytes [`Pl011::enqueue_rx`] would accept now: free FIFO space, or 0
    /// while the receiver is disabled (CR.RXE clear).
    pub fn rx_space(&self) -> usize {
        if self.cr & CR_RXE == 0 {
            return 0;
        }
        self.rx_depth().saturating_sub(self.rx.len())
    }

    fn rx_depth(&self) -> usize {
        if self.lcr_h & LCR_H_FEN != 0 {
            FIFO_DEPTH
        } else {
            1
        }
    }

    /// RX trigger level in bytes (IFLS.RXIFLSEL, TRM 3.3.12); 1 without FIFO.
    fn rx_trigger(&self) -> usize {
        if self.lcr_h & LCR_H_FEN == 0 {
            return 1;
        }
        match (self.ifls >> 3) & 0x7 {
            0 => 2,
            1 => 4,
            2 => 8,
            3 => 12,
            // 0b100 is 7/8; 0b101..0b111 are reserved: treat them as 7/8.
            _ => 14,
        }
    }

    fn read_dr(&mut self) -> u32 {
        let Some(byte) = self.rx.pop_front() else {
            return 0;
        };
        if self.rx.len() < self.rx_trigger() {
            self.ris &= !INT_RX;
        }
        if self.rx.is_empty() {
            self.ris &= !INT_RT;
        } else {
            self.ris |= INT_RT;
        }
        u32::from(byte)
    }

    fn write_dr(&mut self, byte: u8) {
        if let Err(e) = self.out.write_all(&[byte]).and_then(|()| self.out.flush()) {
            tracing::warn!("pl011: console output failed, byte dropped: {e}");
        }
        // The byte leaves at once: the TX FIFO level falls to 0, at or below
        // any trigger level.
        self.ris |= INT_TX;
    }

    fn flags(&self) -> u32 {
        let mut fr = FR_TXFE;
        if self.rx.is_empty() {
            fr |= FR_RXFE;
        }
        if self.rx.len() >= self.rx_depth() {
            fr |= FR_RXFF;
        }
        fr
    }

    /// Re-evaluates RXIS after the trigger level or FIFO mode changed.
    fn recheck_rx_level(&mut self) {
        if self.rx.len() >= self.rx_trigger() {
            self.ris |= INT_RX;
        } else {
            self.ris &= !INT_RX;
        }
    }

    fn write_lcr_h(&mut self, value: u32) {
        let was_fen = self.lcr_h & LCR_H_FEN != 0;
        self.lcr_h = value & LCR_H_MASK;
        if was_fen && self.lcr_h & LCR_H_FEN == 0 {
            // Down to the 1-byte holding register: keep the oldest byte.
            self.rx.truncate(1);
        }
        self.recheck_rx_level();
    }

    fn update_irq(&mut self) {
        let level = self.ris & self.imsc != 0;
        if level != self.irq_level {
            self.irq_level = level;
            self.irq.set_level(level);
        }
    }

    fn read_reg(&mut self, reg: u64) -> Result<u32, AccessError> {
        Ok(match reg {
            DR => self.read_dr(),
            RSR_ECR => 0,
            FR => self.flags(),
            ILPR => self.ilpr,
            IBRD => self.ibrd,
            FBRD => self.fbrd,
            LCR_H => self.lcr_h,
            CR => self.cr,
            IFLS => self.ifls,
            IMSC => self.imsc,
            RIS => self.ris,
            MIS => self.ris & self.imsc,
            ICR => return Err(AccessError::WriteOnly),
            DMACR => self.dmacr,
            ID_BASE..=0xFFC => u32::from(ID_BYTES[((reg - ID_BASE) / 4) as usize]),
            _ => return Err(AccessError::NoRegister),
        })
    }
}

impl Persist for Pl011 {
    type State = Pl011State;
    /// The output sink and the interrupt line, as for [`Pl011::new`].
    type Args = (Box<dyn Write + Send>, Arc<dyn IrqLine>);
    type Error = Pl011StateError;

    fn save(&self) -> Pl011State {
        Pl011State {
            rx_fifo: self.rx.iter().copied().collect(),
            ilpr: self.ilpr,
            ibrd: self.ibrd,
            fbrd: self.fbrd,
            lcr_h: self.lcr_h,
            cr: self.cr,
            ifls: self.ifls,
            imsc: self.imsc,
            ris: self.ris,
            dmacr: self.dmacr,
        }
    }

    /// Checks `state` (no register bits that do not exist, no more RX bytes
    /// than the FIFO holds), builds the UART in it, and drives the
    /// interrupt line to the restored level.
    fn restore((out, irq): Self::Args, state: &Pl011State) -> Result<Self, Pl011StateError> {
        for (name, value, mask) in [
            ("ILPR", state.ilpr, ILPR_MASK),
            ("IBRD", state.ibrd, IBRD_MASK),
            ("FBRD", state.fbrd, FBRD_MASK),
            ("LCR_H", state.lcr_h, LCR_H_MASK),
            ("CR", state.cr, CR_MASK),
            ("IFLS", state.ifls, IFLS_MASK),
            ("IMSC", state.imsc, INT_MASK),
            ("RIS", state.ris, INT_MASK),
            ("DMACR", state.dmacr, DMACR_MASK),
        ] {
            if value & !mask != 0 {
                return Err(Pl011StateError::BadRegister { name, value, mask });
            }
        }
        let depth = if state.lcr_h & LCR_H_FEN != 0 {
            FIFO_DEPTH
        } else {
            1
        };
        if state.rx_fifo.len() > depth {
            return Err(Pl011StateError::RxOverflow {
                len: state.rx_fifo.len(),
                depth,
            });
        }
        let mut u = Pl011::new(out, irq);
        u.rx = state.rx_fifo.iter().copied().collect();
        u.ilpr = state.ilpr;
        u.ibrd = state.ibrd;
        u.fbrd = state.fbrd;
        u.lcr_h = state.lcr_h;
        u.cr = state.cr;
        u.ifls = state.ifls;
        u.imsc = state.imsc;
        u.ris = state.ris;
        u.dmacr = state.dmacr;
        u.irq_level = u.ris & u.imsc != 0;
        u.irq.set_level(u.irq_level);
        Ok(u)
    }
}

/// Checks width (8/16/32 bits) and natural alignment; returns the aligned
/// register offset and the bit shift of the access within it.
fn decode(offset: u64, len: usize) -> Result<(u64, u32), AccessError> {
    if !matches!(len, 1 | 2 | 4) {
        return Err(AccessError::Size);
    }
    if offset % len as u64 != 0 {
        return Err(AccessError::Alignment);
    }
    Ok((offset & !3, ((offset & 3) * 8) as u32))
}

/// `old` with the bits under `mask` replaced by `value`.
fn merge(old: u32, value: u32, mask: u32) -> u32 {
    (old & !mask) | (value & mask)
}

impl MmioDevice for Pl011 {
    fn read(&mut self, _vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        let (reg, shift) = decode(offset, data.len())?;
        let value = self.read_reg(reg)?;
        set_le_value(data, u64::from(value >> shift));
        // A DR read may have changed RX interrupts.
        self.update_irq();
        Ok(())
    }

    fn write(&mut self, _vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        let (reg, shift) = decode(offset, data.len())?;
        let width_mask = if data.len() == 4 {
            u32::MAX
        } else {
            (1u32 << (8 * data.len())) - 1
        };
        let value = (le_value(data) as u32) << shift;
        let mask = width_mask << shift;
        match reg {
            // Only bits 7:0 carry data; narrower writes above them do nothing.
            DR if shift == 0 => self.write_dr(value as u8),
            DR => {}
            // Clears the error flags; this model never sets any.
            RSR_ECR => {}
            FR | RIS | MIS | ID_BASE..=0xFFC => return Err(AccessError::ReadOnly),
            ILPR => self.ilpr = merge(self.ilpr, value, mask) & ILPR_MASK,
            IBRD => self.ibrd = merge(self.ibrd, value, mask) & IBRD_MASK,
            FBRD => self.fbrd = merge(self.fbrd, value, mask) & FBRD_MASK,
            LCR_H => self.write_lcr_h(merge(self.lcr_h, value, mask)),
            CR => self.cr = merge(self.cr, value, mask) & CR_MASK,
            IFLS => {
                self.ifls = merge(self.ifls, value, mask) & IFLS_MASK;
                self.recheck_rx_level();
            }
            IMSC => self.imsc = merge(self.imsc, value, mask) & INT_MASK,
            ICR => self.ris &= !(value & mask & INT_MASK),
            DMACR => self.dmacr = merge(self.dmacr, value, mask) & DMACR_MASK,
            _ => return Err(AccessError::NoRegister),
        }
        self.update_irq();
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
}
