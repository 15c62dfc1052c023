//! ARM PrimeCell Real Time Clock (PL031), after the PL031 TRM (ARM DDI 0224):
//! the registers Linux's `rtc-pl031` driver uses, at [`crate::arch::layout::PL031`].
//!
//! Model choices:
//! - The counter (RTCDR) is the host's wall clock in seconds since the Unix
//!   epoch plus an offset the guest sets by writing RTCLR; it advances when
//!   the host's second does. The offset, not the counter, is what a snapshot
//!   saves ([`Pl031State::offset_s`]), so a restored guest reads the host's
//!   current time (plus its own offset), never the time of the snapshot.
//! - The RTC is running out of reset, as firmware leaves it: RTCCR.RTCStart
//!   reads 1 and, as the TRM says of a started RTC, writes to it do nothing.
//! - RTCRIS latches when the counter equals RTCMR (TRM 2.2: a comparator on
//!   the counter), including when RTCMR or RTCLR is written to make them
//!   equal. There is no thread: the device evaluates the counter whenever
//!   the guest accesses it and when the VMM calls [`Pl031::update`], which it
//!   does at [`Pl031::next_match`] so that an unmasked match raises the
//!   interrupt on time. A match the counter passed while nothing looked
//!   (including while the VM was stored in a snapshot) latches at the next
//!   evaluation.
//! - RTCINTR (the SPI) is RTCRIS AND RTCIMSC, level.
//! - Registers are 32 bits; 8- and 16-bit aligned accesses read and write
//!   the bytes they cover (Linux and kvm-unit-tests use 32-bit ones).

use super::{
    decode_word_access as decode, le_value, merge_bits as merge, set_le_value, AccessError,
    IrqLine, MmioDevice, Persist,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// Register offsets (TRM 3.2, table 3-1).
const DR: u64 = 0x000;
const MR: u64 = 0x004;
const LR: u64 = 0x008;
const CR: u64 = 0x00C;
const IMSC: u64 = 0x010;
const RIS: u64 = 0x014;
const MIS: u64 = 0x018;
const ICR: u64 = 0x01C;
/// RTCPeriphID0..3 then RTCPCellID0..3, one byte per 32-bit register.
const ID_BASE: u64 = 0xFE0;
/// Part number 0x031, designer 0x41 (Arm), revision 1; the PrimeCell ID.
const ID_BYTES: [u8; 8] = [0x31, 0x10, 0x14, 0x00, 0x0D, 0xF0, 0x05, 0xB1];

/// RTCCR.RTCStart, RTCIMSC, RTCRIS and RTCICR: bit 0 is the only bit.
const BIT0: u32 = 1;

/// Counter values wrap at 2^32 seconds.
const COUNTER_PERIOD: i64 = 1 << 32;

/// The host's wall clock the RTC counts from.
pub trait WallClock: Send + Sync {
    /// Time since the Unix epoch (before the epoch: zero).
    fn since_epoch(&self) -> Duration;
}

/// [`WallClock`] from the host's `SystemTime`.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostClock;

impl WallClock for HostClock {
    fn since_epoch(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// The saved state of a [`Pl031`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pl031State {
    /// The guest's counter minus the host's wall clock, in seconds (what
    /// RTCLR writes set). A restore adds it to the host's clock at that time.
    pub offset_s: i64,
    /// The counter value, unwrapped, at the last evaluation: matches between
    /// it and the counter at restore latch RTCRIS then.
    pub seen: i64,
    /// RTCMR.
    pub mr: u32,
    /// RTCLR: the last value loaded.
    pub lr: u32,
    /// RTCIMSC (bit 0).
    pub imsc: u32,
    /// RTCRIS (bit 0).
    pub ris: u32,
}

/// Why a saved [`Pl031State`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Pl031StateError {
    /// A register has bits set that do not exist.
    #[error("register {name} value {value:#x} has bits outside {BIT0:#x}")]
    BadRegister {
        /// Register name.
        name: &'static str,
        /// Saved value.
        value: u32,
    },
    /// The offset would put the counter out of reach of the host's clock.
    #[error("RTC offset {0} s is out of range")]
    Offset(i64),
}

/// Largest |offset| accepted from a saved state: far beyond any counter
/// value, small enough that no sum with the host's clock overflows.
const MAX_OFFSET: i64 = 1 << 40;

/// The PL031 model.
pub struct Pl031 {
    clock: Arc<dyn WallClock>,
    irq: Arc<dyn IrqLine>,
    irq_level: bool,
    offset_s: i64,
    seen: i64,
    mr: u32,
    lr: u32,
    imsc: u32,
    ris: u32,
}

impl Pl031 {
    /// An RTC reading `clock` (the host's: [`HostClock`]) and driving `irq`,
    /// in its reset state: the counter equal to the clock's seconds,
    /// interrupt masked, no match latched.
    pub fn new(clock: Arc<dyn WallClock>, irq: Arc<dyn IrqLine>) -> Self {
        let mut rtc = Pl031 {
            clock,
            irq,
            irq_level: false,
            offset_s: 0,
            seen: 0,
            mr: 0,
            lr: 0,
            imsc: 0,
            ris: 0,
        };
        rtc.seen = rtc.counter();
        rtc
    }

    /// The host's seconds since the epoch.
    fn host_secs(&self) -> i64 {
        i64::try_from(self.clock.since_epoch().as_secs()).unwrap_or(i64::MAX / 2)
    }

    /// The counter now, unwrapped (RTCDR is its low 32 bits).
    fn counter(&self) -> i64 {
        self.host_secs() + self.offset_s
    }

    /// The first unwrapped counter value after `from` whose low 32 bits
    /// equal RTCMR.
    fn next_match_after(&self, from: i64) -> i64 {
        let next = from + 1;
        next + (i64::from(self.mr) - next).rem_euclid(COUNTER_PERIOD)
    }

    /// Brings the device up to the clock: latches RTCRIS if the counter
    /// reached RTCMR since the last evaluation, and drives the interrupt line.
    /// The VMM calls it at [`Pl031::next_match`]; accesses call it too.
    pub fn update(&mut self) {
        let now = self.counter();
        if now > self.seen && self.next_match_after(self.seen) <= now {
            self.ris = BIT0;
        }
        // A clock that went back (host clock stepped) latches nothing.
        self.seen = now;
        self.update_irq();
    }

    /// When (as time since the Unix epoch on the device's clock) the next
    /// [`Pl031::update`] would raise the interrupt: the counter's next match
    /// with RTCMR while RTCIMSC is set and RTCRIS clear. `None` when no
    /// match could change the line.
    pub fn next_match(&self) -> Option<Duration> {
        if self.imsc == 0 || self.ris != 0 {
            return None;
        }
        let host = self.next_match_after(self.seen) - self.offset_s;
        u64::try_from(host).ok().map(Duration::from_secs)
    }

    /// A match now, when a write made the counter and RTCMR equal.
    fn check_equal(&mut self) {
        if self.counter() as u32 == self.mr {
            self.ris = BIT0;
        }
    }

    fn update_irq(&mut self) {
        let level = self.ris & self.imsc != 0;
        if level != self.irq_level {
            self.irq_level = level;
            self.irq.set_level(level);
        }
    }

    fn read_reg(&self, reg: u64) -> Result<u32, AccessError> {
        Ok(match reg {
            DR => self.counter() as u32,
            MR => self.mr,
            LR => self.lr,
            CR => BIT0,
            IMSC => self.imsc,
            RIS => self.ris,
            MIS => self.ris & self.imsc,
            ICR => return Err(AccessError::WriteOnly),
            ID_BASE..=0xFFC => u32::from(ID_BYTES[((reg - ID_BASE) / 4) as usize]),
            _ => return Err(AccessError::NoRegister),
        })
    }

    fn write_reg(&mut self, reg: u64, value: u32, mask: u32) -> Result<(), AccessError> {
        match reg {
            MR => {
                self.mr = merge(self.mr, value, mask);
                self.check_equal();
            }
            LR => {
                self.lr = merge(self.lr, value, mask);
                self.offset_s = i64::from(self.lr) - self.host_secs();
                self.seen = self.counter();
                self.check_equal();
            }
            // RTCStart is set; writes have no effect until a reset (TRM 3.3.4).
            CR => {}
            IMSC => self.imsc = merge(self.imsc, value, mask) & BIT0,
            ICR => {
                if value & mask & BIT0 != 0 {
                    self.ris = 0;
                }
            }
            DR | RIS | MIS | ID_BASE..=0xFFC => return Err(AccessError::ReadOnly),
            _ => return Err(AccessError::NoRegister),
        }
        Ok(())
    }
}

impl MmioDevice for Pl031 {
    fn read(&mut self, _vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        let (reg, shift) = decode(offset, data.len())?;
        self.update();
        let value = self.read_reg(reg)?;
        set_le_value(data, u64::from(value >> shift));
        Ok(())
    }

    fn write(&mut self, _vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        let (reg, shift) = decode(offset, data.len())?;
        self.update();
        let width_mask = if data.len() == 4 {
            u32::MAX
        } else {
            (1u32 << (8 * data.len())) - 1
        };
        let result = self.write_reg(reg, (le_value(data) as u32) << shift, width_mask << shift);
        self.update_irq();
        result
    }
}

impl Persist for Pl031 {
    type State = Pl031State;
    /// The clock and the interrupt line, as for [`Pl031::new`].
    type Args = (Arc<dyn WallClock>, Arc<dyn IrqLine>);
    type Error = Pl031StateError;

    fn save(&self) -> Pl031State {
        Pl031State {
            offset_s: self.offset_s,
            seen: self.seen,
            mr: self.mr,
            lr: self.lr,
            imsc: self.imsc,
            ris: self.ris,
        }
    }

    /// Checks `state`, builds the RTC in it on `clock` (so its counter is
    /// the clock now plus the saved offset), latches a match the counter
    /// passed since the save, and drives the interrupt line.
    fn restore((clock, irq): Self::Args, state: &Pl031State) -> Result<Self, Pl031StateError> {
        for (name, value) in [("RTCIMSC", state.imsc), ("RTCRIS", state.ris)] {
            if value & !BIT0 != 0 {
                return Err(Pl031StateError::BadRegister { name, value });
            }
        }
        let in_range = |v: Option<i64>| v.is_some_and(|v| (-MAX_OFFSET..=MAX_OFFSET).contains(&v));
        // `seen` is a counter value: the host's seconds at the save plus the offset.
        if !in_range(Some(state.offset_s)) || !in_range(state.seen.checked_sub(state.offset_s)) {
            return Err(Pl031StateError::Offset(state.offset_s));
        }
        let mut rtc = Pl031::new(clock, irq);
        rtc.offset_s = state.offset_s;
        rtc.seen = state.seen;
        rtc.mr = state.mr;
        rtc.lr = state.lr;
        rtc.imsc = state.imsc;
        rtc.ris = state.ris;
        rtc.update();
        Ok(rtc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::pl011::tests::TestIrq;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A settable clock, in milliseconds since the epoch.
    #[derive(Default)]
    struct FakeClock(AtomicU64);

    impl FakeClock {
        fn at(ms: u64) -> Arc<Self> {
            Arc::new(FakeClock(AtomicU64::new(ms)))
        }
        fn advance_ms(&self, ms: u64) {
            self.0.fetch_add(ms, Ordering::SeqCst);
        }
        fn set_ms(&self, ms: u64) {
            self.0.store(ms, Ordering::SeqCst);
        }
    }

    impl WallClock for FakeClock {
        fn since_epoch(&self) -> Duration {
            Duration::from_millis(self.0.load(Ordering::SeqCst))
        }
    }

    const T0_MS: u64 = 1_700_000_000_500;
    const T0: u32 = 1_700_000_000;

    fn rtc() -> (Pl031, Arc<FakeClock>, Arc<TestIrq>) {
        let clock = FakeClock::at(T0_MS);
        let irq = Arc::new(TestIrq::default());
        (Pl031::new(clock.clone(), irq.clone()), clock, irq)
    }

    fn r32(d: &mut Pl031, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read(0, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn w32(d: &mut Pl031, off: u64, v: u32) {
        d.write(0, off, &v.to_le_bytes()).unwrap();
    }

    #[test]
    fn id_registers_and_reset_values() {
        let (mut d, _, irq) = rtc();
        let ids: Vec<u8> = (0..8).map(|i| r32(&mut d, ID_BASE + 4 * i) as u8).collect();
        assert_eq!(ids, [0x31, 0x10, 0x14, 0x00, 0x0D, 0xF0, 0x05, 0xB1]);
        assert_eq!(r32(&mut d, DR), T0, "the counter is the host's clock");
        assert_eq!(r32(&mut d, CR), 1, "running out of reset");
        for reg in [MR, LR, IMSC, RIS, MIS] {
            assert_eq!(r32(&mut d, reg), 0, "{reg:#x}");
        }
        assert!(irq.changes().is_empty());
    }

    #[test]
    fn read_only_registers_keep_their_value_at_every_width() {
        let (mut d, _, _) = rtc();
        for reg in [DR, RIS, MIS, ID_BASE, ID_BASE + 0x18] {
            let before = r32(&mut d, reg);
            assert_eq!(d.write(0, reg, &[0xEF]), Err(AccessError::ReadOnly));
            assert_eq!(d.write(0, reg, &[0xEF, 0xBE]), Err(AccessError::ReadOnly));
            assert_eq!(
                d.write(0, reg, &0xDEAD_BEEF_u32.to_le_bytes()),
                Err(AccessError::ReadOnly)
            );
            assert_eq!(r32(&mut d, reg), before, "{reg:#x}");
            let mut b = [0u8; 1];
            d.read(0, reg, &mut b).unwrap();
            assert_eq!(b[0], before as u8);
            let mut h = [0u8; 2];
            d.read(0, reg, &mut h).unwrap();
            assert_eq!(u16::from_le_bytes(h), before as u16);
        }
        w32(&mut d, CR, 0);
        assert_eq!(r32(&mut d, CR), 1, "a started RTC ignores RTCCR writes");
    }

    #[test]
    fn access_widths_alignment_and_holes() {
        let (mut d, _, _) = rtc();
        assert_eq!(d.read(0, DR, &mut [0u8; 8]), Err(AccessError::Size));
        assert_eq!(
            d.read(0, MR + 2, &mut [0u8; 4]),
            Err(AccessError::Alignment)
        );
        assert_eq!(
            d.read(0, 0x020, &mut [0u8; 4]),
            Err(AccessError::NoRegister)
        );
        assert_eq!(d.read(0, ICR, &mut [0u8; 4]), Err(AccessError::WriteOnly));
        // A byte write to the second byte of RTCMR keeps the others.
        w32(&mut d, MR, 0x1122_3344);
        d.write(0, MR + 1, &[0xAA]).unwrap();
        assert_eq!(r32(&mut d, MR), 0x1122_AA44);
        let mut h = [0u8; 2];
        d.read(0, MR + 2, &mut h).unwrap();
        assert_eq!(u16::from_le_bytes(h), 0x1122);
    }

    #[test]
    fn the_counter_ticks_with_the_clock_and_loads_from_lr() {
        let (mut d, clock, _) = rtc();
        clock.advance_ms(499);
        assert_eq!(r32(&mut d, DR), T0, "still the same second");
        clock.advance_ms(1);
        assert_eq!(r32(&mut d, DR), T0 + 1);
        w32(&mut d, LR, 1000);
        assert_eq!(r32(&mut d, LR), 1000);
        assert_eq!(r32(&mut d, DR), 1000);
        clock.advance_ms(2000);
        assert_eq!(r32(&mut d, DR), 1002);
        // The counter wraps at 2^32.
        w32(&mut d, LR, u32::MAX);
        clock.advance_ms(1000);
        assert_eq!(r32(&mut d, DR), 0);
    }

    #[test]
    fn a_match_latches_ris_and_interrupts_only_when_unmasked() {
        let (mut d, clock, irq) = rtc();
        w32(&mut d, MR, T0 + 1);
        assert_eq!(d.next_match(), None, "masked: no deadline");
        // The match passes while nothing reads the device, masked.
        clock.advance_ms(2000);
        d.update();
        assert_eq!(r32(&mut d, RIS), 1);
        assert_eq!(r32(&mut d, MIS), 0);
        assert!(!irq.level(), "masked");
        w32(&mut d, IMSC, 1);
        assert!(irq.level(), "unmasking a latched match raises the line");
        assert_eq!(r32(&mut d, MIS), 1);
        w32(&mut d, ICR, 1);
        assert_eq!((r32(&mut d, RIS), r32(&mut d, MIS)), (0, 0));
        assert!(!irq.level());
        assert_eq!(irq.changes(), [true, false]);
    }

    #[test]
    fn next_match_is_when_the_counter_reaches_mr() {
        let (mut d, clock, irq) = rtc();
        w32(&mut d, IMSC, 1);
        w32(&mut d, MR, T0 + 3);
        assert_eq!(d.next_match(), Some(Duration::from_secs(u64::from(T0) + 3)));
        clock.set_ms(u64::from(T0 + 3) * 1000 - 1);
        d.update();
        assert!(!irq.level(), "a millisecond early");
        clock.set_ms(u64::from(T0 + 3) * 1000);
        d.update();
        assert!(irq.level(), "on time");
        assert_eq!(d.next_match(), None, "latched: nothing more to raise");
        // With an offset (the guest set its clock), the deadline is on the host's clock.
        w32(&mut d, ICR, 1);
        w32(&mut d, LR, 100);
        w32(&mut d, MR, 110);
        assert_eq!(
            d.next_match(),
            Some(Duration::from_secs(u64::from(T0) + 3 + 10))
        );
    }

    #[test]
    fn writes_that_make_counter_and_mr_equal_match() {
        let (mut d, _, irq) = rtc();
        w32(&mut d, IMSC, 1);
        w32(&mut d, MR, T0);
        assert!(irq.level(), "RTCMR written with the counter's value");
        w32(&mut d, ICR, 1);
        w32(&mut d, MR, 50);
        assert!(!irq.level());
        w32(&mut d, LR, 50);
        assert!(irq.level(), "the counter loaded with RTCMR's value");
    }

    #[test]
    fn a_clock_going_back_latches_nothing() {
        let (mut d, clock, _) = rtc();
        w32(&mut d, MR, T0 - 5);
        clock.set_ms(u64::from(T0 - 10) * 1000);
        d.update();
        clock.set_ms(u64::from(T0 - 6) * 1000);
        d.update();
        assert_eq!(r32(&mut d, RIS), 0);
        clock.set_ms(u64::from(T0 - 5) * 1000);
        assert_eq!(r32(&mut d, RIS), 1, "forward again through MR");
    }

    #[test]
    fn a_restore_reads_the_hosts_time_not_the_snapshots() {
        let (mut d, _, _) = rtc();
        w32(&mut d, LR, 1000);
        w32(&mut d, IMSC, 1);
        w32(&mut d, MR, 1100);
        let saved = d.save();
        assert_eq!(saved.offset_s, 1000 - i64::from(T0));
        // Restored an hour later: the guest's clock moved on with the host's.
        let later = FakeClock::at(T0_MS + 3_600_000);
        let irq = Arc::new(TestIrq::default());
        let mut r = Pl031::restore((later.clone(), irq.clone()), &saved).unwrap();
        assert_eq!(r32(&mut r, DR), 1000 + 3600);
        assert_eq!(
            (r32(&mut r, MR), r32(&mut r, LR), r32(&mut r, IMSC)),
            (1100, 1000, 1)
        );
        // The match came due while the VM was stored: it latches at restore.
        assert_eq!(r32(&mut r, RIS), 1);
        assert!(irq.level());
        assert_eq!(r.save().offset_s, saved.offset_s);
    }

    #[test]
    fn restore_refuses_impossible_states() {
        let (d, clock, irq) = rtc();
        let good = d.save();
        let args = || {
            (
                clock.clone() as Arc<dyn WallClock>,
                irq.clone() as Arc<dyn IrqLine>,
            )
        };
        for bad in [
            Pl031State { imsc: 2, ..good },
            Pl031State {
                ris: 0x8000_0001,
                ..good
            },
            Pl031State {
                offset_s: i64::MIN,
                ..good
            },
            Pl031State {
                seen: i64::MAX,
                ..good
            },
        ] {
            assert!(Pl031::restore(args(), &bad).is_err(), "{bad:?}");
        }
        assert!(Pl031::restore(args(), &good).is_ok());
    }
}
