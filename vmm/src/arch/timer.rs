//! The EL1 generic timers' arithmetic (Arm ARM DDI 0487, D11.2: the
//! counters, D11.2.4 the timers): the control bits, the interrupt output,
//! TVAL and the time until a timer fires, in exact integer arithmetic.
//! Shared by both backends (the `emu` backend's virtual timer), the
//! machine's physical timer and the run loop's WFI wait.
//!
//! The virtual timer (CNTV_CTL/CVAL/TVAL_EL0) and the physical timer
//! (CNTP_CTL/CVAL/TVAL_EL0) have the same registers and behaviour: each
//! compares its CVAL with a count (CNTVCT_EL0 and CNTPCT_EL0), and their
//! CTL registers have the same bits.
//!
//! # The guest's count
//! A VM has one counter: every vCPU's virtual count is the backend's
//! physical count minus one VM-wide offset (CNTVOFF_EL2,
//! `hv::Vm::counter_offset`). The guest sees CNTVOFF_EL2 = 0: CNTPCT_EL0
//! reads the same as CNTVCT_EL0 on both backends (HVF traps CNTPCT_EL0; the
//! `emu` backend emulates it), so both timers compare with that one count.

/// CTL.ENABLE (CNTV_CTL_EL0 and CNTP_CTL_EL0).
pub const CTL_ENABLE: u64 = 1 << 0;
/// CTL.IMASK: the output is masked.
pub const CTL_IMASK: u64 = 1 << 1;
/// CTL.ISTATUS (read-only): the timer condition is met.
pub const CTL_ISTATUS: u64 = 1 << 2;

/// A timer's interrupt output from its CTL value: ENABLE && !IMASK &&
/// ISTATUS.
pub const fn timer_asserted(ctl: u64) -> bool {
    ctl & (CTL_ENABLE | CTL_IMASK | CTL_ISTATUS) == CTL_ENABLE | CTL_ISTATUS
}

/// Ticks from `count` until a timer with control `ctl` and compare value
/// `cval` asserts its output, if it can without a register write: `None`
/// when ENABLE is clear or IMASK set, `Some(0)` when the condition
/// `count >= cval` (unsigned) is met already, otherwise `cval - count`.
pub const fn ticks_until_asserted(ctl: u64, cval: u64, count: u64) -> Option<u64> {
    if ctl & CTL_ENABLE == 0 || ctl & CTL_IMASK != 0 {
        return None;
    }
    Some(cval.saturating_sub(count))
}

/// `ticks` of a `freq_hz` counter in nanoseconds, rounded up so a sleep of
/// that length never ends before the counter has advanced by `ticks`. Exact
/// (128-bit intermediate), saturating at `u64::MAX`; `freq_hz == 0` gives
/// `u64::MAX`.
pub const fn ticks_to_ns(ticks: u64, freq_hz: u64) -> u64 {
    if freq_hz == 0 {
        return u64::MAX;
    }
    let ns = (ticks as u128 * 1_000_000_000).div_ceil(freq_hz as u128);
    if ns > u64::MAX as u128 {
        u64::MAX
    } else {
        ns as u64
    }
}

/// How long a vCPU in WFI may sleep before a timer with control `ctl` and
/// compare value `cval` fires, in nanoseconds from the moment its count was
/// `count`: `None` when it cannot fire (sleep until an interrupt), `Some(0)`
/// when it is due, otherwise the remaining ticks ([`ticks_to_ns`], rounded
/// up).
pub const fn deadline_ns(ctl: u64, cval: u64, count: u64, freq_hz: u64) -> Option<u64> {
    match ticks_until_asserted(ctl, cval, count) {
        Some(ticks) => Some(ticks_to_ns(ticks, freq_hz)),
        None => None,
    }
}

/// One EL1 timer as software keeps it: CTL's ENABLE and IMASK (ISTATUS is
/// computed from the count) and CVAL, in guest ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenericTimer {
    /// ENABLE and IMASK.
    pub ctl: u64,
    /// The compare value (CVAL).
    pub cval: u64,
}

impl GenericTimer {
    /// A timer with the given CTL (its ISTATUS and any RES0 bits dropped)
    /// and CVAL.
    pub const fn new(ctl: u64, cval: u64) -> Self {
        GenericTimer {
            ctl: ctl & (CTL_ENABLE | CTL_IMASK),
            cval,
        }
    }

    /// The timer condition: enabled and `count` has reached CVAL.
    pub const fn istatus(&self, count: u64) -> bool {
        self.ctl & CTL_ENABLE != 0 && count >= self.cval
    }

    /// The output at `count`: ENABLE && !IMASK && ISTATUS.
    pub const fn level(&self, count: u64) -> bool {
        timer_asserted(self.read_ctl(count))
    }

    /// CTL as the guest reads it at `count`.
    pub const fn read_ctl(&self, count: u64) -> u64 {
        if self.istatus(count) {
            self.ctl | CTL_ISTATUS
        } else {
            self.ctl
        }
    }

    /// A guest write of CTL (ISTATUS is read-only).
    pub fn write_ctl(&mut self, value: u64) {
        *self = GenericTimer::new(value, self.cval);
    }

    /// TVAL at `count`: CVAL - count, as a signed 32-bit value.
    pub const fn read_tval(&self, count: u64) -> u64 {
        self.cval.wrapping_sub(count) as u32 as u64
    }

    /// A guest write of TVAL at `count`: CVAL = count + the sign-extended
    /// low 32 bits of `value`.
    pub fn write_tval(&mut self, count: u64, value: u64) {
        self.cval = count.wrapping_add(value as u32 as i32 as i64 as u64);
    }

    /// Ticks from `count` until the output rises, if it is low now and can
    /// rise without a register write ([`ticks_until_asserted`], never 0).
    pub const fn ticks_until_rise(&self, count: u64) -> Option<u64> {
        match ticks_until_asserted(self.ctl, self.cval, count) {
            Some(0) | None => None,
            Some(t) => Some(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_output() {
        assert!(timer_asserted(CTL_ENABLE | CTL_ISTATUS));
        assert!(!timer_asserted(CTL_ENABLE | CTL_ISTATUS | CTL_IMASK));
        assert!(!timer_asserted(CTL_ISTATUS));
        assert!(!timer_asserted(CTL_ENABLE));
    }

    #[test]
    fn wfi_deadline_is_exact() {
        const HZ: u64 = 24_000_000;
        let on = CTL_ENABLE;
        // 24 ticks at 24 MHz is exactly 1 µs; 1 tick is 41.67 ns, rounded up.
        assert_eq!(deadline_ns(on, 1024, 1000, HZ), Some(1000));
        assert_eq!(deadline_ns(on, 1001, 1000, HZ), Some(42));
        // 24M ticks is one second; libkrun's 41 ns/tick would give 0.984 s.
        assert_eq!(deadline_ns(on, 24_000_000, 0, HZ), Some(1_000_000_000));
        // Due already.
        assert_eq!(deadline_ns(on, 1024, 2000, HZ), Some(0));
        assert_eq!(deadline_ns(on, 0, 1000, HZ), Some(0));
        assert_eq!(deadline_ns(0, 1 << 40, 0, HZ), None, "disabled");
        assert_eq!(deadline_ns(on | CTL_IMASK, 1 << 40, 0, HZ), None, "masked");
        // Far deadlines saturate rather than overflow.
        assert_eq!(deadline_ns(on, u64::MAX, 0, 1), Some(u64::MAX));
        assert_eq!(ticks_to_ns(5, 0), u64::MAX);
        assert_eq!(ticks_to_ns(u64::MAX, HZ), u64::MAX);
        // 2^64 - 1 ticks at 2^40 Hz: 16 777 215.99... s, rounded up to the ns.
        assert_eq!(ticks_to_ns(u64::MAX, 1 << 40), 16_777_216_000_000_000);
    }

    #[test]
    fn timer_condition_and_level() {
        let mut t = GenericTimer {
            cval: 100,
            ..GenericTimer::default()
        };
        assert!(!t.istatus(200), "disabled");
        t.write_ctl(CTL_ENABLE | CTL_ISTATUS | 0xf0);
        assert_eq!(t.ctl, CTL_ENABLE, "ISTATUS and RES0 bits are not stored");
        assert!(!t.level(99));
        assert!(t.level(100));
        assert_eq!(t.read_ctl(150), CTL_ENABLE | CTL_ISTATUS);
        t.write_ctl(CTL_ENABLE | CTL_IMASK);
        assert!(t.istatus(150) && !t.level(150));
        assert_eq!(t.read_ctl(150), CTL_ENABLE | CTL_IMASK | CTL_ISTATUS);
        assert_eq!(GenericTimer::new(0xff, 7), GenericTimer { ctl: 3, cval: 7 });
    }

    #[test]
    fn tval_is_signed_32_bit() {
        let mut t = GenericTimer::default();
        t.write_tval(1000, (-10i32) as u32 as u64);
        assert_eq!(t.cval, 990);
        assert_eq!(t.read_tval(1000), (-10i32) as u32 as u64);
        t.write_tval(1000, 0xffff_ffff_0000_0010);
        assert_eq!(t.cval, 1016);
        assert_eq!(t.read_tval(1000), 16);
        // Across the 64-bit wrap of the count.
        t.write_tval(u64::MAX - 1, 4);
        assert_eq!(t.cval, 2);
        assert_eq!(t.read_tval(u64::MAX), 3);
    }

    #[test]
    fn rise_only_when_the_output_can_rise() {
        let mut t = GenericTimer::new(CTL_ENABLE, 500);
        assert_eq!(t.ticks_until_rise(100), Some(400));
        assert_eq!(t.ticks_until_rise(499), Some(1));
        assert_eq!(t.ticks_until_rise(500), None, "already fired");
        assert_eq!(t.ticks_until_rise(600), None);
        t.ctl |= CTL_IMASK;
        assert_eq!(t.ticks_until_rise(100), None);
        t.ctl = 0;
        assert_eq!(t.ticks_until_rise(100), None);
        let t = GenericTimer::new(CTL_ENABLE, u64::MAX);
        assert_eq!(t.ticks_until_rise(0), Some(u64::MAX));
    }
}
