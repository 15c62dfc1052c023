//! The run state every thread of a running VM shares: wake-ups, vCPU power
//! states, the VM's end, the vCPU threads' start-up, and the pause handshake
//! (pause: every vCPU thread parks and captures its vCPUs, and the guest's
//! clock stops; resume: the clock goes on from where it stopped, and the
//! vCPUs run again).
//!
//! One mutex guards [`State`]; its condition variable wakes waiters on any
//! change. A vCPU running guest code does not wait on it: it is kicked
//! ([`Kick`]) out of [`crate::hv::Vcpu::run`] and sees the change on its way
//! round the loop.

use super::clock::Clock;
use super::state::{VcpuPower, VcpuState};
use crate::devices::gicv3::VcpuSet;
use crate::hv::{self, Kick, VcpuId};
use crate::machine::fork::{ForkJob, Forked};
use crate::sync::{Locked, Waited};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest called PSCI SYSTEM_OFF.
    PowerOff,
    /// The guest called PSCI SYSTEM_RESET (the VMM exits rather than reboots).
    Reset,
    /// A front-end asked (`Ctrl-A x`, the control socket's `quit`).
    Quit,
    /// A vCPU hit something the VMM cannot handle.
    Error(String),
}

/// Why [`RunState::pause`] could not park every vCPU.
#[derive(Debug, thiserror::Error)]
pub enum ParkError {
    /// The VM ended first.
    #[error("the VM is shutting down")]
    ShuttingDown,
    /// A vCPU's state could not be read.
    #[error("cannot capture vCPU {vcpu}: {error}")]
    Capture {
        /// The vCPU.
        vcpu: VcpuId,
        /// The backend's error.
        error: hv::HvError,
    },
    /// A vCPU thread parked without its vCPU's state.
    #[error("vCPU {0} did not stop")]
    NotStopped(VcpuId),
}

/// What [`RunState`]'s mutex guards.
pub struct State {
    /// The wake-up generation: bumped whenever a waiting vCPU may have to
    /// run (an interrupt, CPU_ON, the pause, the end).
    pub generation: u64,
    /// Per vCPU, index order.
    pub power: Vec<VcpuPower>,
    /// Why the VM ended, once it has.
    pub exit: Option<VmExit>,
    /// A snapshot wants every vCPU thread parked.
    pause: bool,
    /// vCPU threads parked for `pause`.
    parked: usize,
    /// Each vCPU's state, captured by its own thread when it parks.
    captured: Vec<Option<hv::Result<VcpuState>>>,
    /// vCPU threads whose vCPUs are created and ready to run.
    ready: usize,
    /// vCPU threads whose vCPUs are created.
    created: usize,
    /// The vCPUs may run (every one exists and a restored in-kernel GIC's
    /// state is loaded), or the VM's start failed.
    released: Option<Result<(), Arc<hv::HvError>>>,
    /// A fork the parked vCPU thread is to make ([`RunState::fork_parked`]).
    fork: Option<ForkJob>,
    /// Its outcome: the child's pid, or why not.
    forked: Forked,
}

impl State {
    /// Whether a pause wants this thread parked.
    pub fn pause_requested(&self) -> bool {
        self.pause
    }
}

/// The turns of one vCPU thread's vCPUs: which one is in
/// [`crate::hv::Vcpu::run`], and which want the next turns. With several
/// vCPUs on a thread ([`crate::hv::Hypervisor::ROUND_ROBIN`]), a vCPU that
/// gets an interrupt, or whose timer fires, while another one runs is given
/// the next turn and the running one is kicked, so that the interrupt waits
/// for a block boundary instead of a time slice.
#[derive(Debug)]
pub struct Turns {
    /// The vCPU in `run`, or `NONE`.
    running: AtomicUsize,
    /// vCPUs (bit `id`) that get the next turns, lowest first.
    urgent: AtomicU64,
    /// The thread runs several vCPUs (else nothing is ever urgent).
    several: bool,
}

impl Turns {
    const NONE: usize = usize::MAX;

    fn new(several: bool) -> Self {
        Turns {
            running: AtomicUsize::new(Self::NONE),
            urgent: AtomicU64::new(0),
            several,
        }
    }

    /// Records the vCPU in `run` (`None` between runs).
    pub fn set_running(&self, vcpu: Option<VcpuId>) {
        self.running
            .store(vcpu.unwrap_or(Self::NONE), Ordering::SeqCst);
    }

    /// The vCPU in `run`, if any.
    pub fn running(&self) -> Option<VcpuId> {
        Some(self.running.load(Ordering::SeqCst)).filter(|&v| v != Self::NONE)
    }

    /// Takes the lowest vCPU of `ids` that wants a turn: its index in `ids`.
    pub fn take_urgent(&self, ids: &[VcpuId]) -> Option<usize> {
        let mut cur = self.urgent.load(Ordering::SeqCst);
        loop {
            let slot = ids.iter().position(|&id| cur & (1 << id) != 0)?;
            let next = cur & !(1 << ids[slot]);
            match self
                .urgent
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(slot),
                Err(now) => cur = now,
            }
        }
    }

    /// Whether a vCPU wants a turn.
    pub fn any_urgent(&self) -> bool {
        self.urgent.load(Ordering::SeqCst) != 0
    }

    /// Marks `vcpu` as wanting a turn; whether it did not already.
    fn want(&self, vcpu: VcpuId) -> bool {
        self.urgent.fetch_or(1 << vcpu, Ordering::SeqCst) & (1 << vcpu) == 0
    }
}

/// The run state of a running VM, shared by all its threads.
pub struct RunState {
    state: Mutex<State>,
    wake: Condvar,
    kicks: Mutex<Vec<Option<Arc<dyn Kick>>>>,
    /// Number of vCPU threads.
    threads: usize,
    /// Per vCPU, the turns of its thread.
    turns: Vec<Arc<Turns>>,
}

impl RunState {
    /// The run state of `power.len()` vCPUs on threads that run `groups` of
    /// them, with their initial power states.
    pub fn new(power: Vec<VcpuPower>, groups: &[Vec<VcpuId>]) -> Self {
        let cpus = power.len();
        assert!(cpus <= 64, "vCPU sets are 64-bit masks");
        let mut turns: Vec<Option<Arc<Turns>>> = vec![None; cpus];
        for group in groups {
            let t = Arc::new(Turns::new(group.len() > 1));
            for &id in group {
                turns[id] = Some(t.clone());
            }
        }
        let turns = turns
            .into_iter()
            .map(|t| t.expect("every vCPU is in a thread group"))
            .collect();
        RunState {
            state: Mutex::new(State {
                generation: 0,
                power,
                exit: None,
                pause: false,
                parked: 0,
                captured: (0..cpus).map(|_| None).collect(),
                ready: 0,
                created: 0,
                released: None,
                fork: None,
                forked: None,
            }),
            wake: Condvar::new(),
            kicks: Mutex::new(vec![None; cpus]),
            threads: groups.len(),
            turns,
        }
    }

    /// The turns of `vcpu`'s thread.
    pub fn turns(&self, vcpu: VcpuId) -> Arc<Turns> {
        self.turns[vcpu].clone()
    }

    /// Locks the run state.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Releases `guard` and waits for a change (or a spurious wake-up).
    pub fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.wake.waited(guard)
    }

    /// As [`RunState::wait`], for at most `timeout`.
    pub fn wait_for<'a>(
        &self,
        guard: MutexGuard<'a, State>,
        timeout: Duration,
    ) -> MutexGuard<'a, State> {
        self.wake.waited_for(guard, timeout)
    }

    /// Wakes every waiter after a change to the run state.
    pub fn notify(&self) {
        self.wake.notify_all();
    }

    /// Waits until `done` holds or the VM has ended; returns the guard.
    fn wait_until(&self, done: impl Fn(&State) -> bool) -> MutexGuard<'_, State> {
        let mut c = self.lock();
        while !done(&c) && c.exit.is_none() {
            c = self.wait(c);
        }
        c
    }

    /// Registers how to kick vCPU `id` out of guest code.
    pub fn set_kicker(&self, id: VcpuId, kick: Arc<dyn Kick>) {
        self.kicks.locked()[id] = Some(kick);
    }

    /// Kicks the vCPUs `which` selects.
    pub fn kick_where(&self, which: impl Fn(VcpuId) -> bool) {
        let kicks = self.kicks.locked();
        for (id, k) in kicks.iter().enumerate() {
            if let (true, Some(k)) = (which(id), k) {
                k.kick();
            }
        }
    }

    /// Ends the VM (the first reason wins) and stops every vCPU.
    pub fn finish(&self, why: VmExit) {
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
    pub fn finished(&self) -> bool {
        self.lock().exit.is_some()
    }

    /// Waits for the VM to end and says why.
    pub fn wait_exit(&self) -> VmExit {
        let c = self.wait_until(|_| false);
        c.exit
            .clone()
            .expect("wait_until returns once the VM has ended")
    }

    /// Called after the GIC's pending state may have changed for other
    /// vCPUs, with the vCPUs that have an interrupt pending now (`pending`,
    /// `None` if the VMM cannot know: an in-kernel GIC). With a known set,
    /// wakes the vCPUs sleeping in WFI and brings the interrupt to each vCPU
    /// that has one pending ([`RunState::run_soon`]); with an in-kernel GIC
    /// (which delivers to running vCPUs itself) wakes the vCPUs sleeping in
    /// WFI, which cannot tell whether it was for them.
    pub fn interrupts_changed(&self, pending: Option<VcpuSet>) {
        match pending {
            Some(pending) if pending.is_empty() => {}
            Some(pending) => {
                self.lock().generation += 1;
                self.notify();
                for v in pending.iter() {
                    self.run_soon(v, true);
                }
            }
            None => {
                self.lock().generation += 1;
                self.notify();
            }
        }
    }

    /// Makes `vcpu` run soon: if it is running, and `irq` says its IRQ line
    /// may have risen, it re-evaluates the line at once
    /// ([`Kick::irq_line_changed`]); if another vCPU of its thread is
    /// running, `vcpu` gets the next turn and the running one is kicked
    /// (once per turn wanted). Called from any thread.
    pub fn run_soon(&self, vcpu: VcpuId, irq: bool) {
        let Some(turns) = self.turns.get(vcpu) else {
            return;
        };
        match turns.running() {
            Some(r) if r == vcpu => {
                if irq {
                    if let Some(k) = &self.kicks.locked()[vcpu] {
                        k.irq_line_changed();
                    }
                }
            }
            Some(r) if turns.several => {
                if turns.want(vcpu) {
                    if let Some(k) = &self.kicks.locked()[r] {
                        k.kick();
                    }
                }
            }
            _ => {
                if turns.several {
                    turns.want(vcpu);
                }
                // A thread about to wait for a deadline sees the request
                // (it checks under the lock), or is waiting and wakes.
                drop(self.lock());
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
    pub fn created_wait_release(&self) -> Result<bool, Arc<hv::HvError>> {
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
    pub fn wait_created(&self) {
        drop(self.wait_until(|c| c.created >= self.threads));
    }

    /// Lets the vCPU threads waiting in [`RunState::created_wait_release`] go
    /// on (`Ok`), or end the VM with the error.
    pub fn release(&self, result: Result<(), Arc<hv::HvError>>) {
        self.lock().released = Some(result);
        self.notify();
    }

    /// A vCPU thread's vCPUs are ready to run.
    pub fn thread_ready(&self) {
        self.lock().ready += 1;
        self.notify();
    }

    /// Waits until every vCPU thread is ready (or the VM has ended).
    pub fn wait_ready(&self) {
        drop(self.wait_until(|c| c.ready >= self.threads));
    }

    // The snapshot handshake.

    /// Parks every vCPU thread, stops `clock` (the guest's time stands still
    /// from the moment all are parked, [`Clock::freeze`]) and returns the
    /// vCPUs' states; call [`RunState::resume`] afterwards whatever the
    /// result.
    pub fn pause(&self, clock: &Clock) -> Result<Vec<VcpuState>, ParkError> {
        {
            let mut c = self.lock();
            if c.exit.is_some() {
                return Err(ParkError::ShuttingDown);
            }
            c.pause = true;
            c.captured.iter_mut().for_each(|s| *s = None);
            c.generation += 1;
        }
        self.notify();
        self.kick_where(|_| true);
        let mut c = self.wait_until(|c| c.parked >= self.threads);
        if c.exit.is_some() {
            return Err(ParkError::ShuttingDown);
        }
        let states = c
            .captured
            .iter_mut()
            .enumerate()
            .map(|(vcpu, s)| match s.take() {
                Some(Ok(st)) => Ok(st),
                Some(Err(error)) => Err(ParkError::Capture { vcpu, error }),
                None => Err(ParkError::NotStopped(vcpu)),
            })
            .collect();
        drop(c);
        clock.freeze();
        states
    }

    /// Restarts `clock` where [`RunState::pause`] stopped it (the paused
    /// interval is added to the VM's counter offset, [`Clock::thaw`]) and
    /// lets the parked vCPU threads run again.
    pub fn resume(&self, clock: &Clock) {
        clock.thaw();
        self.lock().pause = false;
        self.notify();
    }

    /// A vCPU thread's side of [`RunState::pause`]: hands in the states of its
    /// vCPUs (captured on this thread, as HVF requires) and waits until the
    /// snapshot is done, making the forks [`RunState::fork_parked`] asks for
    /// with `fork` meanwhile.
    pub fn park(
        &self,
        states: Vec<(VcpuId, hv::Result<VcpuState>)>,
        mut fork: impl FnMut(ForkJob) -> Result<i32, String>,
    ) {
        let mut c = self.lock();
        for (id, st) in states {
            c.captured[id] = Some(st);
        }
        c.parked += 1;
        self.notify();
        while c.pause && c.exit.is_none() {
            if let Some(job) = c.fork.take() {
                drop(c);
                let r = fork(job);
                c = self.lock();
                c.forked = Some(r);
                self.notify();
                continue;
            }
            c = self.wait(c);
        }
        c.parked -= 1;
    }

    /// With every vCPU parked by [`RunState::pause`] on one thread (a
    /// [`crate::hv::Hypervisor::ROUND_ROBIN`] backend): has that thread fork
    /// the process, and returns the child's pid. The child has that thread
    /// only, and goes on as `job` says ([`ForkJob`]).
    pub fn fork_parked(&self, job: ForkJob) -> Result<i32, String> {
        let mut c = self.lock();
        if self.threads != 1 {
            return Err(format!(
                "the vCPUs run on {} threads; a fork takes them from one",
                self.threads
            ));
        }
        if !c.pause || c.parked < self.threads {
            return Err("the vCPUs are not parked".into());
        }
        c.forked = None;
        c.fork = Some(job);
        self.notify();
        loop {
            if let Some(r) = c.forked.take() {
                return r;
            }
            if c.exit.is_some() {
                // The vCPU thread may have left before it took the job.
                c.fork = None;
                return Err("the VM is shutting down".into());
            }
            c = self.wait(c);
        }
    }
}

/// Ends the VM with an error if dropped while its thread panics.
pub struct EndOnPanic<'a>(pub &'a RunState);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            self.0
                .finish(VmExit::Error(format!("thread {name} panicked (see above)")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts kicks and line re-evaluations.
    #[derive(Default)]
    struct Counting {
        kicks: AtomicUsize,
        lines: AtomicUsize,
    }

    impl Kick for Counting {
        fn kick(&self) {
            self.kicks.fetch_add(1, Ordering::SeqCst);
        }
        fn irq_line_changed(&self) {
            self.lines.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A run state of `groups` with a counting kicker per vCPU.
    fn run_state(groups: &[Vec<VcpuId>]) -> (RunState, Vec<Arc<Counting>>) {
        let cpus = groups.iter().map(Vec::len).sum();
        let c = RunState::new(vec![VcpuPower::On; cpus], groups);
        let kicks: Vec<Arc<Counting>> = (0..cpus).map(|_| Arc::default()).collect();
        for (id, k) in kicks.iter().enumerate() {
            c.set_kicker(id, k.clone());
        }
        (c, kicks)
    }

    fn counts(k: &Counting) -> (usize, usize) {
        (
            k.kicks.load(Ordering::SeqCst),
            k.lines.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn the_running_vcpu_re_evaluates_its_line_without_leaving_run() {
        let (c, k) = run_state(&[vec![0, 1, 2]]);
        c.turns(0).set_running(Some(1));
        c.run_soon(1, true);
        assert_eq!(counts(&k[1]), (0, 1));
        assert!(!c.turns(0).any_urgent());
        // A timer request for the running vCPU: the backend already knows.
        c.run_soon(1, false);
        assert_eq!(counts(&k[1]), (0, 1));
    }

    #[test]
    fn another_vcpu_of_the_thread_gets_the_next_turn_and_the_running_one_is_kicked_once() {
        let (c, k) = run_state(&[vec![0, 1, 2, 3]]);
        let t = c.turns(0);
        t.set_running(Some(0));
        c.run_soon(3, true);
        c.run_soon(3, true);
        c.run_soon(2, false);
        assert_eq!(counts(&k[0]), (2, 0), "one kick per vCPU that wants a turn");
        assert_eq!(counts(&k[3]), (0, 0));
        let ids = [0, 1, 2, 3];
        assert_eq!(t.take_urgent(&ids), Some(2), "lowest first");
        assert_eq!(t.take_urgent(&ids), Some(3));
        assert_eq!(t.take_urgent(&ids), None);
        // Taken: the next interrupt asks again.
        c.run_soon(3, true);
        assert_eq!(counts(&k[0]), (3, 0));
    }

    #[test]
    fn a_thread_between_runs_finds_the_request() {
        let (c, k) = run_state(&[vec![0, 1]]);
        c.run_soon(1, true);
        assert!(c.turns(0).any_urgent());
        assert_eq!(c.turns(0).take_urgent(&[0, 1]), Some(1));
        assert!(k.iter().all(|k| counts(k) == (0, 0)));
    }

    #[test]
    fn threads_of_one_vcpu_never_queue_turns() {
        let (c, k) = run_state(&[vec![0], vec![1]]);
        c.turns(1).set_running(Some(1));
        c.run_soon(0, true);
        c.run_soon(1, true);
        assert!(!c.turns(0).any_urgent() && !c.turns(1).any_urgent());
        assert_eq!(counts(&k[0]), (0, 0));
        assert_eq!(counts(&k[1]), (0, 1));
        assert!(!Arc::ptr_eq(&c.turns(0), &c.turns(1)));
    }

    #[test]
    fn take_urgent_only_takes_the_threads_own_vcpus() {
        let (c, _) = run_state(&[vec![0, 1], vec![2, 3]]);
        c.turns(2).set_running(Some(2));
        c.run_soon(3, true);
        assert_eq!(c.turns(0).take_urgent(&[0, 1]), None);
        assert_eq!(c.turns(2).take_urgent(&[2, 3]), Some(1));
    }

    fn fork_job() -> ForkJob {
        ForkJob {
            ram: Arc::new(crate::memory::GuestRam::new_anonymous(1 << 20).unwrap()),
            child: Box::new(|| panic!("no fork is made")),
        }
    }

    #[test]
    fn a_fork_needs_every_vcpu_parked_on_one_thread() {
        let one = RunState::new(vec![VcpuPower::On; 2], &[vec![0, 1]]);
        let e = one.fork_parked(fork_job()).unwrap_err();
        assert!(e.contains("not parked"), "{e}");
        let two = RunState::new(vec![VcpuPower::On; 2], &[vec![0], vec![1]]);
        let e = two.fork_parked(fork_job()).unwrap_err();
        assert!(e.contains("2 threads"), "{e}");
    }
}
