//! The EL1 virtual timer's arithmetic (Arm ARM DDI 0487, D11.2.4
//! CNTV_CTL_EL0, D11.2.2 the counters): the control bits, the interrupt
//! output and the WFI wake-up deadline, in exact integer arithmetic. Shared
//! by both backends and the run loop.

/// CNTV_CTL_EL0.ENABLE.
pub const CNTV_CTL_ENABLE: u64 = 1 << 0;
/// CNTV_CTL_EL0.IMASK.
pub const CNTV_CTL_IMASK: u64 = 1 << 1;
/// CNTV_CTL_EL0.ISTATUS.
pub const CNTV_CTL_ISTATUS: u64 = 1 << 2;

/// The virtual timer's interrupt output: ENABLE && !IMASK && ISTATUS.
pub const fn vtimer_asserted(cntv_ctl: u64) -> bool {
    cntv_ctl & (CNTV_CTL_ENABLE | CNTV_CTL_IMASK | CNTV_CTL_ISTATUS)
        == CNTV_CTL_ENABLE | CNTV_CTL_ISTATUS
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

/// How long a vCPU in WFI may sleep before its virtual timer fires, in
/// nanoseconds from the moment `physical_count` was read.
///
/// The guest's virtual count is `physical_count - vtimer_offset` (CNTVOFF);
/// the timer condition is `CNTVCT >= CNTV_CVAL` (unsigned). Returns `None`
/// when the timer cannot fire (ENABLE clear or IMASK set: sleep until an
/// interrupt), `Some(0)` when it is already due, otherwise the remaining
/// ticks in nanoseconds ([`ticks_to_ns`], rounded up).
pub const fn vtimer_deadline_ns(
    cntv_ctl: u64,
    cntv_cval: u64,
    vtimer_offset: u64,
    physical_count: u64,
    freq_hz: u64,
) -> Option<u64> {
    if cntv_ctl & CNTV_CTL_ENABLE == 0 || cntv_ctl & CNTV_CTL_IMASK != 0 {
        return None;
    }
    let now = physical_count.wrapping_sub(vtimer_offset);
    if cntv_cval <= now {
        return Some(0);
    }
    Some(ticks_to_ns(cntv_cval - now, freq_hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vtimer_output() {
        assert!(vtimer_asserted(CNTV_CTL_ENABLE | CNTV_CTL_ISTATUS));
        assert!(!vtimer_asserted(
            CNTV_CTL_ENABLE | CNTV_CTL_ISTATUS | CNTV_CTL_IMASK
        ));
        assert!(!vtimer_asserted(CNTV_CTL_ISTATUS));
        assert!(!vtimer_asserted(CNTV_CTL_ENABLE));
    }

    #[test]
    fn wfi_deadline_is_exact_and_applies_the_offset() {
        const HZ: u64 = 24_000_000;
        let on = CNTV_CTL_ENABLE;
        // 24 ticks at 24 MHz is exactly 1 µs; 1 tick is 41.67 ns, rounded up.
        assert_eq!(vtimer_deadline_ns(on, 1024, 1000, 2000, HZ), Some(1000));
        assert_eq!(vtimer_deadline_ns(on, 1001, 1000, 2000, HZ), Some(42));
        // 24M ticks is one second; libkrun's 41 ns/tick would give 0.984 s.
        assert_eq!(
            vtimer_deadline_ns(on, 24_000_000, 0, 0, HZ),
            Some(1_000_000_000)
        );
        // The offset matters: without it the same CVAL is already due, with
        // a larger one it is 1024 ticks (42 666.67 ns) away.
        assert_eq!(vtimer_deadline_ns(on, 1024, 0, 2000, HZ), Some(0));
        assert_eq!(vtimer_deadline_ns(on, 1024, 2000, 2000, HZ), Some(42_667));
        assert_eq!(vtimer_deadline_ns(on, 0, 1000, 2000, HZ), Some(0));
        // A restored offset larger than the host count wraps like CNTVOFF.
        assert_eq!(vtimer_deadline_ns(on, 48, u64::MAX - 23, 0, HZ), Some(1000));
        assert_eq!(vtimer_deadline_ns(0, 1 << 40, 0, 0, HZ), None, "disabled");
        assert_eq!(
            vtimer_deadline_ns(on | CNTV_CTL_IMASK, 1 << 40, 0, 0, HZ),
            None,
            "masked"
        );
        // Far deadlines saturate rather than overflow.
        assert_eq!(vtimer_deadline_ns(on, u64::MAX, 0, 0, 1), Some(u64::MAX));
        assert_eq!(ticks_to_ns(5, 0), u64::MAX);
        assert_eq!(ticks_to_ns(u64::MAX, HZ), u64::MAX);
        // 2^64 - 1 ticks at 2^40 Hz: 16 777 215.99... s, rounded up to the ns.
        assert_eq!(ticks_to_ns(u64::MAX, 1 << 40), 16_777_216_000_000_000);
    }
}
