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

use super::{
    decode_word_access as decode, le_value, merge_bits as merge, set_le_value, AccessError,
    IrqLine, MmioDevice, Persist,
};
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
pub(crate) mod tests;
