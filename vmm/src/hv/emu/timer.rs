//! The guest's generic counter and EL1 virtual timer, emulated (unicorn
//! compiles its timer out, quirk 7).
//!
//! The physical count runs from VM creation at [`COUNTER_HZ`]; a vCPU's
//! virtual count is the physical count minus its vtimer offset. A per-VM
//! thread wakes vCPUs whose timer deadline passes while they run.

use crate::arch::timer::{
    ticks_to_ns, vtimer_asserted, CNTV_CTL_ENABLE, CNTV_CTL_IMASK, CNTV_CTL_ISTATUS,
};
use crate::sync::{Locked, Waited};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::vm::{VcpuShared, ATTN_TIMER};

/// Frequency of the guest counter in Hz (CNTFRQ_EL0): 24 MHz, the fixed
/// counter frequency of Apple Silicon, so counter values mean the same on
/// both backends.
pub const COUNTER_HZ: u64 = 24_000_000;

const NS_PER_SEC: u128 = 1_000_000_000;

/// Guest ticks in `d` (truncated).
pub fn ticks(d: Duration) -> u64 {
    (d.as_nanos() * u128::from(COUNTER_HZ) / NS_PER_SEC) as u64
}

/// The time after which at least `ticks` ticks have elapsed.
pub fn duration_of(ticks: u64) -> Duration {
    Duration::from_nanos(ticks_to_ns(ticks, COUNTER_HZ))
}

/// The EL1 virtual timer of one vCPU (Arm ARM D11.2.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VTimer {
    /// ENABLE and IMASK (ISTATUS is computed).
    pub ctl: u64,
    /// CNTV_CVAL_EL0 in guest ticks.
    pub cval: u64,
}

impl VTimer {
    /// Timer condition met: enabled and the virtual count reached CVAL.
    pub fn istatus(&self, vcount: u64) -> bool {
        self.ctl & CNTV_CTL_ENABLE != 0 && vcount >= self.cval
    }

    /// The output line: ENABLE && !IMASK && ISTATUS.
    pub fn level(&self, vcount: u64) -> bool {
        vtimer_asserted(self.read_ctl(vcount))
    }

    /// CNTV_CTL_EL0 as the guest reads it.
    pub fn read_ctl(&self, vcount: u64) -> u64 {
        self.ctl
            | if self.istatus(vcount) {
                CNTV_CTL_ISTATUS
            } else {
                0
            }
    }

    /// A guest write of CNTV_CTL_EL0 (ISTATUS is read-only).
    pub fn write_ctl(&mut self, v: u64) {
        self.ctl = v & (CNTV_CTL_ENABLE | CNTV_CTL_IMASK);
    }

    /// CNTV_TVAL_EL0: CVAL - count, as a signed 32-bit value.
    pub fn read_tval(&self, vcount: u64) -> u64 {
        u64::from(self.cval.wrapping_sub(vcount) as u32)
    }

    /// A write of CNTV_TVAL_EL0: CVAL = count + sign-extended value.
    pub fn write_tval(&mut self, vcount: u64, v: u64) {
        self.cval = vcount.wrapping_add(v as u32 as i32 as i64 as u64);
    }

    /// The physical count at which the output rises, if it is low now and
    /// can rise without a register write.
    pub fn deadline(&self, vcount: u64, offset: u64) -> Option<u64> {
        if self.ctl & (CNTV_CTL_ENABLE | CNTV_CTL_IMASK) != CNTV_CTL_ENABLE || self.istatus(vcount)
        {
            return None;
        }
        self.cval.checked_add(offset)
    }
}

struct TimerState {
    deadlines: Vec<Option<Instant>>,
    shutdown: bool,
}

/// Wakes vCPUs at their timer deadlines by setting their attention flag
/// (the block hook then stops the engine, quirk 9).
pub(crate) struct TimerThread {
    state: Arc<(Mutex<TimerState>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl TimerThread {
    /// Starts the thread for `vcpus`.
    pub(crate) fn start(vcpus: Vec<Arc<VcpuShared>>) -> std::io::Result<Self> {
        let state = Arc::new((
            Mutex::new(TimerState {
                deadlines: vec![None; vcpus.len()],
                shutdown: false,
            }),
            Condvar::new(),
        ));
        let s = state.clone();
        let handle = std::thread::Builder::new()
            .name("emu-vtimer".into())
            .spawn(move || run(&s, &vcpus))?;
        Ok(TimerThread {
            state,
            handle: Some(handle),
        })
    }

    /// Sets (or clears) vCPU `id`'s wake-up time.
    pub(crate) fn arm(&self, id: usize, at: Option<Instant>) {
        let (lock, cv) = &*self.state;
        let mut g = lock.locked();
        if let Some(d) = g.deadlines.get_mut(id) {
            if *d != at {
                *d = at;
                cv.notify_one();
            }
        }
    }
}

impl Drop for TimerThread {
    fn drop(&mut self) {
        let (lock, cv) = &*self.state;
        lock.locked().shutdown = true;
        cv.notify_one();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(state: &(Mutex<TimerState>, Condvar), vcpus: &[Arc<VcpuShared>]) {
    let (lock, cv) = state;
    let mut g = lock.locked();
    loop {
        if g.shutdown {
            return;
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for (i, d) in g.deadlines.iter_mut().enumerate() {
            if let Some(t) = *d {
                if t <= now {
                    *d = None;
                    vcpus[i].request(ATTN_TIMER);
                } else {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
        }
        g = match next {
            None => cv.waited(g),
            Some(t) => cv.waited_for(g, t - now),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_conversions_round_trip() {
        assert_eq!(ticks(Duration::from_secs(1)), COUNTER_HZ);
        assert_eq!(ticks(Duration::from_nanos(125)), 3);
        // 1 tick = 41.67 ns: the deadline is never early.
        assert_eq!(duration_of(1), Duration::from_nanos(42));
        assert_eq!(duration_of(24), Duration::from_nanos(1000));
        assert!(ticks(duration_of(12345)) >= 12345);
    }

    #[test]
    fn timer_condition_and_level() {
        let mut t = VTimer {
            cval: 100,
            ..VTimer::default()
        };
        assert!(!t.istatus(200)); // disabled
        t.write_ctl(CNTV_CTL_ENABLE | CNTV_CTL_ISTATUS);
        assert_eq!(t.ctl, CNTV_CTL_ENABLE);
        assert!(!t.level(99));
        assert!(t.level(100));
        assert_eq!(t.read_ctl(150), CNTV_CTL_ENABLE | CNTV_CTL_ISTATUS);
        t.write_ctl(CNTV_CTL_ENABLE | CNTV_CTL_IMASK);
        assert!(t.istatus(150) && !t.level(150));
        assert_eq!(
            t.read_ctl(150),
            CNTV_CTL_ENABLE | CNTV_CTL_IMASK | CNTV_CTL_ISTATUS
        );
    }

    #[test]
    fn tval_is_signed_32_bit() {
        let mut t = VTimer::default();
        t.write_tval(1000, (-10i32) as u32 as u64);
        assert_eq!(t.cval, 990);
        assert_eq!(t.read_tval(1000), (-10i32) as u32 as u64);
        t.write_tval(1000, 0xffff_ffff_0000_0010);
        assert_eq!(t.cval, 1016);
    }

    #[test]
    fn deadline_only_when_the_output_can_rise() {
        let mut t = VTimer {
            ctl: CNTV_CTL_ENABLE,
            cval: 500,
        };
        assert_eq!(t.deadline(100, 7), Some(507));
        assert_eq!(t.deadline(600, 7), None); // already fired
        t.ctl |= CNTV_CTL_IMASK;
        assert_eq!(t.deadline(100, 7), None);
        t.ctl = 0;
        assert_eq!(t.deadline(100, 7), None);
        let t = VTimer {
            ctl: CNTV_CTL_ENABLE,
            cval: u64::MAX,
        };
        assert_eq!(t.deadline(0, 1), None);
    }
}
