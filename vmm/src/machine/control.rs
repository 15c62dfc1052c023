//! The control block every thread of a running VM shares: wake-ups, vCPU
//! power states, the VM's end, the vCPU threads' start-up, and the snapshot
//! handshake (pause: every vCPU thread parks and captures its vCPUs, and the
//! guest's clock stops; resume: the clock goes on from where it stopped, and
//! the vCPUs run again).
//!
//! One mutex guards [`RunState`]; its condition variable wakes waiters on
//! any change. A vCPU running guest code does not wait on it: it is kicked
//! ([`Kick`]) out of [`crate::hv::Vcpu::run`] and sees the change on its way
//! round the loop.

use super::clock::Clock;
use super::irqchip::Irqchip;
use super::state::{VcpuPower, VcpuState};
use super::VmExit;
use crate::hv::{Kick, VcpuId};
use crate::sync::{Locked, Waited};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What [`Control`]'s mutex guards.
pub(super) struct RunState {
    /// The wake-up generation: bumped whenever a waiting vCPU may have to
    /// run (an interrupt, CPU_ON, the pause, the end).
    pub(super) generation: u64,
    /// Per vCPU, index order.
    pub(super) power: Vec<VcpuPower>,
    /// Why the VM ended, once it has.
    pub(super) exit: Option<VmExit>,
    /// A snapshot wants every vCPU thread parked.
    pause: bool,
    /// vCPU threads parked for `pause`.
    parked: usize,
    /// Each vCPU's state, captured by its own thread when it parks.
    captured: Vec<Option<Result<VcpuState, String>>>,
    /// vCPU threads whose vCPUs are created and ready to run.
    ready: usize,
    /// vCPU threads whose vCPUs are created.
    created: usize,
    /// The vCPUs may run (every one exists and a restored in-kernel GIC's
    /// state is loaded), or the VM's start failed.
    released: Option<Result<(), String>>,
}

impl RunState {
    /// Whether a snapshot wants this thread parked.
    pub(super) fn pause_requested(&self) -> bool {
        self.pause
    }
}

/// The shared control block of a running VM.
pub(super) struct Control {
    state: Mutex<RunState>,
    wake: Condvar,
    kicks: Mutex<Vec<Option<Arc<dyn Kick>>>>,
    /// Which vCPUs an interrupt is for ([`Control::interrupts_changed`]).
    irqchip: Irqchip,
    /// Number of vCPU threads.
    threads: usize,
}

impl Control {
    /// The control block of `power.len()` vCPUs on `threads` threads, with
    /// their initial power states.
    pub(super) fn new(irqchip: Irqchip, power: Vec<VcpuPower>, threads: usize) -> Self {
        let cpus = power.len();
        Control {
            state: Mutex::new(RunState {
                generation: 0,
                power,
                exit: None,
                pause: false,
                parked: 0,
                captured: vec![None; cpus],
                ready: 0,
                created: 0,
                released: None,
            }),
            wake: Condvar::new(),
            kicks: Mutex::new(vec![None; cpus]),
            irqchip,
            threads,
        }
    }

    /// Locks the run state.
    pub(super) fn lock(&self) -> MutexGuard<'_, RunState> {
        self.state.locked()
    }

    /// Releases `guard` and waits for a change (or a spurious wake-up).
    pub(super) fn wait<'a>(&self, guard: MutexGuard<'a, RunState>) -> MutexGuard<'a, RunState> {
        self.wake.waited(guard)
    }

    /// As [`Control::wait`], for at most `timeout`.
    pub(super) fn wait_for<'a>(
        &self,
        guard: MutexGuard<'a, RunState>,
        timeout: Duration,
    ) -> MutexGuard<'a, RunState> {
        self.wake.waited_for(guard, timeout)
    }

    /// Wakes every waiter after a change to the run state.
    pub(super) fn notify(&self) {
        self.wake.notify_all();
    }

    /// Waits until `done` holds or the VM has ended; returns the guard.
    fn wait_until(&self, done: impl Fn(&RunState) -> bool) -> MutexGuard<'_, RunState> {
        let mut c = self.lock();
        while !done(&c) && c.exit.is_none() {
            c = self.wait(c);
        }
        c
    }

    /// Registers how to kick vCPU `id` out of guest code.
    pub(super) fn set_kicker(&self, id: VcpuId, kick: Arc<dyn Kick>) {
        self.kicks.locked()[id] = Some(kick);
    }

    /// Kicks the vCPUs `which` selects.
    pub(super) fn kick_where(&self, which: impl Fn(VcpuId) -> bool) {
        let kicks = self.kicks.locked();
        for (id, k) in kicks.iter().enumerate() {
            if let (true, Some(k)) = (which(id), k) {
                k.kick();
            }
        }
    }

    /// Bumps the wake-up generation, wakes the waiters and kicks the vCPUs
    /// `which` selects.
    pub(super) fn wake_where(&self, which: impl Fn(VcpuId) -> bool) {
        self.lock().generation += 1;
        self.notify();
        self.kick_where(which);
    }

    /// Ends the VM (the first reason wins) and stops every vCPU.
    pub(super) fn finish(&self, why: VmExit) {
        {
            let mut c = self.lock();
            if c.exit.is_none() {
                c.exit = Some(why);
            }
            c.generation += 1;
        }
        self.notify();
        self.kick_where(|_| true);
    }

    /// Whether the VM has ended.
    pub(super) fn finished(&self) -> bool {
        self.lock().exit.is_some()
    }

    /// Waits for the VM to end and says why.
    pub(super) fn wait_exit(&self) -> VmExit {
        let c = self.wait_until(|_| false);
        c.exit
            .clone()
            .expect("wait_until returns once the VM has ended")
    }

    /// Called after the GIC's pending state may have changed for other
    /// vCPUs. With the userspace GIC, wakes and kicks the vCPUs that now
    /// have an interrupt pending; with an in-kernel GIC (which delivers to
    /// running vCPUs itself) wakes the vCPUs sleeping in WFI, which cannot
    /// tell whether it was for them.
    pub(super) fn interrupts_changed(&self) {
        match self.irqchip.pending_vcpus() {
            Some(pending) if pending.is_empty() => {}
            Some(pending) => self.wake_where(|v| pending.contains(v)),
            None => {
                self.lock().generation += 1;
                self.notify();
            }
        }
    }

    // Start-up of the vCPU threads: every vCPU is created before any runs,
    // on a fresh boot as on a restore (an in-kernel GIC's topology is final
    // once vCPUs run, and a restored one's state goes in once all exist).
    // Each vCPU thread creates its vCPUs and waits in `created_wait_release`;
    // the VM's thread waits for all of them (`wait_created`), loads what must
    // come in between, and lets them run (`release`).

    /// A vCPU thread has created its vCPUs. Waits until the VM's thread
    /// releases them: `Ok(true)` to run, `Ok(false)` if the VM ended first,
    /// the error if the start failed.
    pub(super) fn created_wait_release(&self) -> Result<bool, String> {
        let mut c = self.lock();
        c.created += 1;
        self.notify();
        while c.released.is_none() && c.exit.is_none() {
            c = self.wait(c);
        }
        match &c.released {
            _ if c.exit.is_some() => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e.clone()),
            None => Ok(false),
        }
    }

    /// Waits until every vCPU thread has created its vCPUs (or the VM has
    /// ended).
    pub(super) fn wait_created(&self) {
        drop(self.wait_until(|c| c.created >= self.threads));
    }

    /// Lets the vCPU threads waiting in [`Control::created_wait_release`] go
    /// on (`Ok`), or end the VM with the error.
    pub(super) fn release(&self, result: Result<(), String>) {
        self.lock().released = Some(result);
        self.notify();
    }

    /// A vCPU thread's vCPUs are ready to run.
    pub(super) fn thread_ready(&self) {
        self.lock().ready += 1;
        self.notify();
    }

    /// Waits until every vCPU thread is ready (or the VM has ended).
    pub(super) fn wait_ready(&self) {
        drop(self.wait_until(|c| c.ready >= self.threads));
    }

    // The snapshot handshake.

    /// Parks every vCPU thread, stops `clock` (the guest's time stands still
    /// from the moment all are parked, [`Clock::freeze`]) and returns the
    /// vCPUs' states; call [`Control::resume`] afterwards whatever the
    /// result.
    pub(super) fn pause(&self, clock: &Clock) -> anyhow::Result<Vec<VcpuState>> {
        {
            let mut c = self.lock();
            if c.exit.is_some() {
                anyhow::bail!("the VM is shutting down");
            }
            c.pause = true;
            c.captured.iter_mut().for_each(|s| *s = None);
            c.generation += 1;
        }
        self.notify();
        self.kick_where(|_| true);
        let mut c = self.wait_until(|c| c.parked >= self.threads);
        if c.exit.is_some() {
            anyhow::bail!("the VM is shutting down");
        }
        let states = c
            .captured
            .iter_mut()
            .enumerate()
            .map(|(id, s)| match s.take() {
                Some(Ok(st)) => Ok(st),
                Some(Err(e)) => Err(anyhow::anyhow!("cannot capture {e}")),
                None => Err(anyhow::anyhow!("vCPU {id} did not stop")),
            })
            .collect();
        drop(c);
        clock.freeze();
        states
    }

    /// Restarts `clock` where [`Control::pause`] stopped it (the paused
    /// interval is added to the VM's counter offset, [`Clock::thaw`]) and
    /// lets the parked vCPU threads run again.
    pub(super) fn resume(&self, clock: &Clock) {
        clock.thaw();
        self.lock().pause = false;
        self.notify();
    }

    /// A vCPU thread's side of [`Control::pause`]: hands in the states of its
    /// vCPUs (captured on this thread, as HVF requires) and waits until the
    /// snapshot is done.
    pub(super) fn park(&self, states: Vec<(VcpuId, Result<VcpuState, String>)>) {
        let mut c = self.lock();
        for (id, st) in states {
            c.captured[id] = Some(st);
        }
        c.parked += 1;
        self.notify();
        while c.pause && c.exit.is_none() {
            c = self.wait(c);
        }
        c.parked -= 1;
    }
}

/// Ends the VM with an error if dropped while its thread panics.
pub(super) struct EndOnPanic<'a>(pub(super) &'a Control);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            self.0
                .finish(VmExit::Error(format!("thread {name} panicked (see above)")));
        }
    }
}
