//! The guest's generic counter and EL1 virtual timer, emulated (unicorn
//! compiles its timer out, quirk 7).
//!
//! The physical count runs from VM creation at [`COUNTER_HZ`]; every vCPU's
//! virtual count is the physical count minus the VM's counter offset. Each
//! vCPU's virtual timer is a [`crate::arch::timer::GenericTimer`] in its hook
//! state; a per-VM thread wakes vCPUs whose timer deadline passes while they
//! run.

use crate::arch::timer::ticks_to_ns;
use crate::hv::RunRequest;
use crate::sync::{Locked, Waited};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::attn::{VcpuShared, ATTN_TIMER};

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

struct TimerState {
    deadlines: Vec<Option<Instant>>,
    shutdown: bool,
}

/// Wakes vCPUs at their timer deadlines by setting their attention flag
/// (the block hook then stops the engine, quirk 9) and asking for the vCPU
/// to be scheduled ([`crate::hv::Vm::set_run_request`]).
pub(crate) struct TimerThread {
    state: Arc<(Mutex<TimerState>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl TimerThread {
    /// Starts the thread for `vcpus`; `request` is the run request, once
    /// the VMM has registered one.
    pub(crate) fn start(
        vcpus: Vec<Arc<VcpuShared>>,
        request: Arc<OnceLock<RunRequest>>,
    ) -> std::io::Result<Self> {
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
            .spawn(move || run(&s, &vcpus, &request))?;
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

fn run(
    state: &(Mutex<TimerState>, Condvar),
    vcpus: &[Arc<VcpuShared>],
    request: &OnceLock<RunRequest>,
) {
    crate::sync::punctual_wakeups();
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
                    if let Some(r) = request.get() {
                        r(i);
                    }
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
}
