//! The guest's clock: one counter for the whole VM, standing still while the
//! VM is paused for a snapshot, and each vCPU's EL1 physical timer.
//!
//! # One counter
//! Arm64 Linux assumes one system counter. Every vCPU's count is the
//! backend's physical count minus the VM's one counter offset
//! ([`Vm::counter_offset`]); a snapshot records the VM's count once, with
//! every vCPU parked ([`Clock::freeze`], [`Clock::save`]), and a restore sets
//! the offset once, so the count continues from there on every vCPU
//! ([`Clock::new`]).
//!
//! # Paused time
//! While the VM is paused for a snapshot its count stands still, as QEMU's
//! does across `vm_stop`: [`Clock::freeze`] notes the count when every vCPU
//! has parked, and [`Clock::thaw`] moves the offset on by the paused
//! interval before they run again, so a slow snapshot is no jump in guest
//! time. The backends only provide the offset; this is the one place that
//! changes it.
//!
//! # The physical timer
//! The guest sees CNTVOFF_EL2 = 0 (CNTPCT_EL0 reads the VM's count, see
//! [`crate::arch::timer`]). Its EL1 physical timer (CNTP_CTL_EL0,
//! CNTP_CVAL_EL0, CNTP_TVAL_EL0) is emulated here for both backends, with
//! the virtual timer's arithmetic ([`GenericTimer`]): HVF traps these
//! registers to the VMM (EL2 is not enabled) and unicorn's timer is compiled
//! out (quirk 7), so both reach [`Clock::sysreg_read`] and
//! [`Clock::sysreg_write`] through [`crate::hv::VcpuIo`]. Each timer
//! compares with the VM's count; its output drives the vCPU's physical timer
//! PPI ([`crate::arch::layout::PTIMER_INTID`]) through a [`TimerLine`] (the
//! interrupt controller, as the virtual timer's level does), set by the
//! register write that changes it or by this module's thread at the
//! deadline. A vCPU in WFI wakes at the deadline because the interrupt
//! wakes it. The in-kernel GIC of HVF has no call to drive a PPI, so there
//! the registers work but the interrupt is not delivered (Linux uses the
//! virtual timer).

use crate::arch::sysreg::{SysReg, CNTP_CTL_EL0, CNTP_CVAL_EL0, CNTP_TVAL_EL0};
use crate::arch::timer::{ticks_to_ns, GenericTimer};
use crate::hv::{VcpuId, Vm};
use crate::sync::{Locked, Waited};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The guest's clock as a snapshot holds it: one count for the VM and each
/// vCPU's EL1 physical timer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockState {
    /// The VM's count (CNTVCT_EL0, and CNTPCT_EL0, of every vCPU; guest
    /// ticks) with every vCPU parked. Restore sets the VM's counter offset
    /// so the count continues from here.
    pub virtual_count: u64,
    /// Per vCPU, index order: the EL1 physical timer.
    pub ptimers: Vec<TimerState>,
}

/// An EL1 timer's registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerState {
    /// CTL's ENABLE (bit 0) and IMASK (bit 1); other bits are ignored.
    pub ctl: u64,
    /// CVAL, in guest ticks.
    pub cval: u64,
}

/// The VM's counter as the clock uses it; every [`Vm`] is one.
pub trait Counter: Send + Sync {
    /// [`Vm::physical_count`].
    fn physical(&self) -> u64;
    /// [`Vm::counter_offset`].
    fn offset(&self) -> u64;
    /// [`Vm::set_counter_offset`].
    fn set_offset(&self, offset: u64);
    /// [`Vm::counter_frequency`], in Hz.
    fn frequency(&self) -> u64;
}

impl<V: Vm> Counter for V {
    fn physical(&self) -> u64 {
        self.physical_count()
    }
    fn offset(&self) -> u64 {
        self.counter_offset()
    }
    fn set_offset(&self, offset: u64) {
        self.set_counter_offset(offset);
    }
    fn frequency(&self) -> u64 {
        self.counter_frequency()
    }
}

/// Sets vCPU `id`'s physical timer PPI to `level` (and wakes whoever the
/// interrupt is for).
pub type TimerLine = Box<dyn Fn(VcpuId, bool) + Send + Sync>;

/// The VM's guest clock: its count, its pauses, and the vCPUs' physical
/// timers. Dropping it stops its thread.
pub struct Clock {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

/// What the clock and its thread share.
struct Inner {
    counter: Arc<dyn Counter>,
    line: TimerLine,
    state: Mutex<State>,
    /// Wakes the thread after any change (a register write, a pause, the
    /// end).
    wake: Condvar,
}

struct State {
    /// The VM's count while it is paused.
    frozen: Option<u64>,
    /// Per vCPU.
    ptimers: Vec<GenericTimer>,
    /// The output last given to the line, per vCPU (`None`: not yet).
    levels: Vec<Option<bool>>,
    stop: bool,
}

impl Clock {
    /// The clock of `cpus` vCPUs counting on `counter`, their physical
    /// timers' outputs going to `line`. A restore passes the snapshot's
    /// clock (`saved`, of `cpus` timers): the VM's offset is set so its count
    /// continues from the saved one on every vCPU (call before any vCPU
    /// runs), and the timers are restored.
    pub fn new(
        counter: Arc<dyn Counter>,
        cpus: usize,
        saved: Option<&ClockState>,
        line: TimerLine,
    ) -> std::io::Result<Self> {
        let ptimers = match saved {
            Some(s) => {
                counter.set_offset(counter.physical().wrapping_sub(s.virtual_count));
                s.ptimers
                    .iter()
                    .map(|t| GenericTimer::new(t.ctl, t.cval))
                    .collect()
            }
            None => vec![GenericTimer::default(); cpus],
        };
        let inner = Arc::new(Inner {
            counter,
            line,
            state: Mutex::new(State {
                frozen: None,
                levels: vec![None; ptimers.len()],
                ptimers,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("ptimer".into())
                .spawn(move || {
                    crate::sync::punctual_wakeups();
                    inner.run()
                })?
        };
        Ok(Clock {
            inner,
            thread: Some(thread),
        })
    }

    /// The VM's count now (frozen while paused).
    #[cfg(test)]
    fn now(&self) -> u64 {
        self.inner.now(&self.inner.state.locked())
    }

    /// Stops the VM's count: call once every vCPU is parked. Until
    /// [`Clock::thaw`], [`Clock::now`] is the count at this call and no
    /// physical timer fires.
    pub fn freeze(&self) {
        let mut st = self.inner.state.locked();
        if st.frozen.is_none() {
            st.frozen = Some(self.inner.live());
        }
    }

    /// Restarts the count where [`Clock::freeze`] stopped it, by moving the
    /// VM's offset on by the paused interval; call before the vCPUs run
    /// again. Does nothing if the clock is not frozen.
    pub fn thaw(&self) {
        let mut st = self.inner.state.locked();
        if let Some(count) = st.frozen.take() {
            let counter = &self.inner.counter;
            counter.set_offset(counter.physical().wrapping_sub(count));
            self.inner.wake.notify_all();
        }
    }

    /// The clock's state for a snapshot (taken while frozen).
    pub fn save(&self) -> ClockState {
        let st = self.inner.state.locked();
        ClockState {
            virtual_count: self.inner.now(&st),
            ptimers: st
                .ptimers
                .iter()
                .map(|t| TimerState {
                    ctl: t.ctl,
                    cval: t.cval,
                })
                .collect(),
        }
    }

    /// A guest read of `reg` on vCPU `vcpu`, if it is a physical timer
    /// register (else `None`).
    /// A read that shows the timer condition also raises the output at
    /// once, so that a guest that sees ISTATUS and waits for the interrupt
    /// does not depend on when this module's thread wakes.
    pub fn sysreg_read(&self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        let mut st = self.inner.state.locked();
        let t = st.ptimers.get(vcpu)?;
        let count = self.inner.now(&st);
        let value = match reg {
            CNTP_CTL_EL0 => t.read_ctl(count),
            CNTP_CVAL_EL0 => t.cval,
            CNTP_TVAL_EL0 => t.read_tval(count),
            _ => return None,
        };
        self.inner.report(&mut st, vcpu, count);
        Some(value)
    }

    /// A guest write of `reg` on vCPU `vcpu`: `true` if it is a physical
    /// timer register (the write is done, the output updated).
    pub fn sysreg_write(&self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        let mut st = self.inner.state.locked();
        let count = self.inner.now(&st);
        let Some(t) = st.ptimers.get_mut(vcpu) else {
            return false;
        };
        match reg {
            CNTP_CTL_EL0 => t.write_ctl(value),
            CNTP_CVAL_EL0 => t.cval = value,
            CNTP_TVAL_EL0 => t.write_tval(count, value),
            _ => return false,
        }
        self.inner.report(&mut st, vcpu, count);
        self.inner.wake.notify_all();
        true
    }

    /// Puts vCPU `vcpu`'s physical timer in its power-on state (a new
    /// VM's: disabled, compare value 0), as the core's reset does (PSCI
    /// CPU_ON), and lowers its output.
    pub fn reset_timer(&self, vcpu: VcpuId) {
        let mut st = self.inner.state.locked();
        let count = self.inner.now(&st);
        if let Some(t) = st.ptimers.get_mut(vcpu) {
            *t = GenericTimer::default();
            self.inner.report(&mut st, vcpu, count);
            self.inner.wake.notify_all();
        }
    }
}

impl Drop for Clock {
    fn drop(&mut self) {
        self.inner.state.locked().stop = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    /// The VM's running count.
    fn live(&self) -> u64 {
        self.counter.physical().wrapping_sub(self.counter.offset())
    }

    /// The VM's count, frozen or running.
    fn now(&self, st: &State) -> u64 {
        st.frozen.unwrap_or_else(|| self.live())
    }

    /// Gives vCPU `id`'s timer output at `count` to the line if it changed.
    fn report(&self, st: &mut State, id: VcpuId, count: u64) {
        let level = st.ptimers[id].level(count);
        if st.levels[id] != Some(level) {
            st.levels[id] = Some(level);
            (self.line)(id, level);
        }
    }

    /// The timers' thread: reports every output (all of them once at the
    /// start, so the interrupt controller agrees with restored timers), then
    /// sleeps until the next deadline or a change.
    fn run(&self) {
        let mut st = self.state.locked();
        while !st.stop {
            let count = self.now(&st);
            for id in 0..st.ptimers.len() {
                self.report(&mut st, id, count);
            }
            let next = match st.frozen {
                Some(_) => None,
                None => st
                    .ptimers
                    .iter()
                    .filter_map(|t| t.ticks_until_rise(count))
                    .min(),
            };
            st = self.sleep(st, next);
        }
    }

    /// Waits for a change, or at most until `ticks` have passed.
    fn sleep<'a>(&self, st: MutexGuard<'a, State>, ticks: Option<u64>) -> MutexGuard<'a, State> {
        match ticks {
            None => self.wake.waited(st),
            Some(t) => {
                let ns = ticks_to_ns(t, self.counter.frequency());
                self.wake.waited_for(st, Duration::from_nanos(ns))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::timer::{CTL_ENABLE, CTL_IMASK, CTL_ISTATUS};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;
    use std::time::Instant;

    /// A counter whose physical count the test sets, or that follows the
    /// host clock at 1 GHz when `real`.
    struct FakeCounter {
        physical: AtomicU64,
        offset: AtomicU64,
        real: Option<Instant>,
    }

    impl FakeCounter {
        fn manual(physical: u64, offset: u64) -> Arc<Self> {
            Arc::new(FakeCounter {
                physical: AtomicU64::new(physical),
                offset: AtomicU64::new(offset),
                real: None,
            })
        }
        fn advance(&self, ticks: u64) {
            self.physical.fetch_add(ticks, Ordering::SeqCst);
        }
    }

    impl Counter for FakeCounter {
        fn physical(&self) -> u64 {
            match self.real {
                Some(t) => t.elapsed().as_nanos() as u64,
                None => self.physical.load(Ordering::SeqCst),
            }
        }
        fn offset(&self) -> u64 {
            self.offset.load(Ordering::SeqCst)
        }
        fn set_offset(&self, offset: u64) {
            self.offset.store(offset, Ordering::SeqCst);
        }
        fn frequency(&self) -> u64 {
            1_000_000_000
        }
    }

    /// A line that sends every level change.
    fn line() -> (TimerLine, mpsc::Receiver<(VcpuId, bool)>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        (
            Box::new(move |id, level| {
                let _ = tx.locked().send((id, level));
            }),
            rx,
        )
    }

    /// The levels the line has seen so far.
    fn seen(rx: &mpsc::Receiver<(VcpuId, bool)>) -> Vec<(VcpuId, bool)> {
        rx.try_iter().collect()
    }

    /// Waits (up to a minute) for the line's next level.
    fn next(rx: &mpsc::Receiver<(VcpuId, bool)>) -> (VcpuId, bool) {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the timer thread reports")
    }

    #[test]
    fn paused_time_does_not_count() {
        let c = FakeCounter::manual(10_000, 1_000);
        let (l, _rx) = line();
        let clock = Clock::new(c.clone(), 2, None, l).unwrap();
        assert_eq!(clock.now(), 9_000);
        c.advance(500);
        clock.freeze();
        assert_eq!(clock.now(), 9_500);
        // A slow snapshot: the host counter runs on, the guest's does not.
        c.advance(7_000_000);
        assert_eq!(clock.now(), 9_500);
        assert_eq!(clock.save().virtual_count, 9_500);
        clock.freeze(); // a second freeze keeps the first count
        clock.thaw();
        assert_eq!(clock.now(), 9_500, "the count goes on from the pause");
        assert_eq!(c.offset(), 1_000 + 7_000_000, "by the paused interval");
        c.advance(20);
        assert_eq!(clock.now(), 9_520);
        clock.thaw(); // not frozen: nothing
        assert_eq!(c.offset(), 7_001_000);
    }

    #[test]
    fn restore_continues_the_saved_count_on_one_offset() {
        let saved = ClockState {
            virtual_count: 5_000_000_000,
            ptimers: vec![
                TimerState {
                    ctl: CTL_ENABLE | CTL_ISTATUS,
                    cval: 5_000_000_100,
                },
                TimerState { ctl: 0, cval: 0 },
            ],
        };
        // A new VM's physical count is small: the offset wraps.
        let c = FakeCounter::manual(42, 0);
        let (l, rx) = line();
        let clock = Clock::new(c.clone(), 2, Some(&saved), l).unwrap();
        assert_eq!(clock.now(), 5_000_000_000);
        assert_eq!(c.offset(), 42u64.wrapping_sub(5_000_000_000));
        // Both outputs are given once, low (CVAL is 100 ticks away).
        let mut first = vec![next(&rx), next(&rx)];
        first.sort_unstable();
        assert_eq!(first, [(0, false), (1, false)]);
        // ISTATUS is not stored, nothing else changed.
        clock.freeze();
        let again = clock.save();
        assert_eq!(again.virtual_count, 5_000_000_000);
        assert_eq!(
            again.ptimers[0],
            TimerState {
                ctl: 1,
                cval: 5_000_000_100
            }
        );
        assert_eq!(again.ptimers[1], saved.ptimers[1]);
    }

    #[test]
    fn registers_follow_the_vm_count() {
        let c = FakeCounter::manual(1_000_000, 0);
        let (l, rx) = line();
        let clock = Clock::new(c.clone(), 2, None, l).unwrap();
        let mut first = vec![next(&rx), next(&rx)];
        first.sort_unstable();
        assert_eq!(first, [(0, false), (1, false)]);
        // TVAL sets CVAL from the count, and reads back signed 32-bit.
        assert!(clock.sysreg_write(1, CNTP_TVAL_EL0, 300));
        assert_eq!(clock.sysreg_read(1, CNTP_CVAL_EL0), Some(1_000_300));
        assert_eq!(clock.sysreg_read(1, CNTP_TVAL_EL0), Some(300));
        assert!(clock.sysreg_write(1, CNTP_CTL_EL0, CTL_ENABLE | CTL_ISTATUS));
        assert_eq!(clock.sysreg_read(1, CNTP_CTL_EL0), Some(CTL_ENABLE));
        assert_eq!(clock.sysreg_read(0, CNTP_CTL_EL0), Some(0), "per vCPU");
        // The count passes CVAL: ISTATUS, a negative TVAL.
        c.advance(400);
        assert_eq!(
            clock.sysreg_read(1, CNTP_CTL_EL0),
            Some(CTL_ENABLE | CTL_ISTATUS)
        );
        assert_eq!(
            clock.sysreg_read(1, CNTP_TVAL_EL0),
            Some(u64::from(-100i32 as u32))
        );
        // A write reports the output at once; masking lowers it.
        assert!(clock.sysreg_write(1, CNTP_CVAL_EL0, 1_000_300));
        assert_eq!(seen(&rx), [(1, true)]);
        assert!(clock.sysreg_write(1, CNTP_CTL_EL0, CTL_ENABLE | CTL_IMASK));
        assert_eq!(seen(&rx), [(1, false)]);
        // Other registers, and vCPUs that do not exist, are not the clock's.
        assert_eq!(clock.sysreg_read(0, SysReg::new(3, 3, 14, 3, 1)), None);
        assert!(!clock.sysreg_write(0, SysReg::new(3, 3, 14, 3, 1), 1));
        assert_eq!(clock.sysreg_read(2, CNTP_CTL_EL0), None);
        assert!(!clock.sysreg_write(2, CNTP_CTL_EL0, 1));
    }

    /// The timer condition a read shows is on the line when the read
    /// returns, not when the thread next wakes (here, not for 1000 s).
    #[test]
    fn a_read_showing_istatus_raises_the_line_at_once() {
        let c = FakeCounter::manual(0, 0);
        let (l, rx) = line();
        let clock = Clock::new(c.clone(), 1, None, l).unwrap();
        assert_eq!(next(&rx), (0, false));
        let far = 1_000_000_000_000; // 1000 s of the fake counter's 1 GHz
        assert!(clock.sysreg_write(0, CNTP_CVAL_EL0, far));
        assert!(clock.sysreg_write(0, CNTP_CTL_EL0, CTL_ENABLE));
        c.advance(far + 1);
        assert_eq!(
            clock.sysreg_read(0, CNTP_CTL_EL0),
            Some(CTL_ENABLE | CTL_ISTATUS)
        );
        assert_eq!(seen(&rx), [(0, true)]);
    }

    #[test]
    fn a_reset_timer_is_as_at_power_on() {
        let c = FakeCounter::manual(1_000, 0);
        let (l, rx) = line();
        let clock = Clock::new(c.clone(), 2, None, l).unwrap();
        let mut first = vec![next(&rx), next(&rx)];
        first.sort_unstable();
        assert_eq!(first, [(0, false), (1, false)]);
        assert!(clock.sysreg_write(1, CNTP_CVAL_EL0, 900));
        assert!(clock.sysreg_write(1, CNTP_CTL_EL0, CTL_ENABLE));
        assert_eq!(seen(&rx), [(1, true)]);
        clock.reset_timer(1);
        assert_eq!(seen(&rx), [(1, false)], "the output drops at once");
        assert_eq!(clock.sysreg_read(1, CNTP_CTL_EL0), Some(0));
        assert_eq!(clock.sysreg_read(1, CNTP_CVAL_EL0), Some(0));
        clock.reset_timer(7); // no such vCPU: nothing
        clock.freeze();
        assert_eq!(clock.save().ptimers[1], TimerState { ctl: 0, cval: 0 });
    }

    #[test]
    fn a_frozen_clock_fires_nothing() {
        let c = FakeCounter::manual(1_000, 0);
        let (l, rx) = line();
        let clock = Clock::new(c.clone(), 1, None, l).unwrap();
        assert_eq!(next(&rx), (0, false));
        assert!(clock.sysreg_write(0, CNTP_CVAL_EL0, 1_010));
        clock.freeze();
        assert!(clock.sysreg_write(0, CNTP_CTL_EL0, CTL_ENABLE));
        c.advance(1_000_000);
        // Any write wakes the thread; the frozen count has not reached CVAL.
        assert!(clock.sysreg_write(0, CNTP_CVAL_EL0, 1_010));
        assert_eq!(clock.sysreg_read(0, CNTP_CTL_EL0), Some(CTL_ENABLE));
        assert!(seen(&rx).is_empty());
        clock.thaw();
        c.advance(10);
        assert!(clock.sysreg_write(0, CNTP_CVAL_EL0, 1_010));
        assert_eq!(seen(&rx), [(0, true)]);
    }

    #[test]
    fn the_thread_raises_the_line_at_the_deadline() {
        let c = Arc::new(FakeCounter {
            physical: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            real: Some(Instant::now()),
        });
        let (l, rx) = line();
        let clock = Clock::new(c, 2, None, l).unwrap();
        let mut first = vec![next(&rx), next(&rx)];
        first.sort_unstable();
        assert_eq!(first, [(0, false), (1, false)]);
        // 2 ms ahead on vCPU 1, at 1 GHz.
        let t = Instant::now();
        assert!(clock.sysreg_write(1, CNTP_TVAL_EL0, 2_000_000));
        assert!(clock.sysreg_write(1, CNTP_CTL_EL0, CTL_ENABLE));
        assert_eq!(next(&rx), (1, true));
        assert!(
            t.elapsed() >= Duration::from_millis(2),
            "not before the deadline"
        );
        assert!(clock.sysreg_read(1, CNTP_CTL_EL0).unwrap() & CTL_ISTATUS != 0);
    }
}
