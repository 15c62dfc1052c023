//! The state every vCPU thread shares with the others and with the caller:
//! wake-ups, power states, the VM's end and the snapshot pause.

use super::state::{VcpuPower, VcpuState};
use super::{Shared, VmExit};
use crate::hv::VcpuId;
use crate::sync::Locked;

/// State guarded by one mutex and its condition variable: the wake-up
/// generation counter, vCPU power states and the VM's end.
pub(super) struct Control {
    pub(super) generation: u64,
    pub(super) power: Vec<VcpuPower>,
    pub(super) exit: Option<VmExit>,
    /// A snapshot wants every vCPU thread parked.
    pub(super) pause: bool,
    /// vCPU threads parked for `pause`.
    pub(super) parked: usize,
    /// Each vCPU's state, captured by its own thread when it parks.
    pub(super) captured: Vec<Option<Result<VcpuState, String>>>,
    /// vCPU threads whose vCPUs are created and ready to run.
    pub(super) ready: usize,
    /// vCPU threads whose vCPUs are created (restore with an in-kernel GIC:
    /// its state is loaded once all are, before any runs).
    pub(super) created: usize,
    /// The in-kernel GIC's state has been loaded (or failed to load).
    pub(super) gic_loaded: Option<Result<(), String>>,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.locked()
    }

    pub(super) fn kick_where(&self, which: impl Fn(VcpuId) -> bool) {
        let kicks = self.kicks.locked();
        for (id, k) in kicks.iter().enumerate() {
            if let (true, Some(k)) = (which(id), k) {
                k.kick();
            }
        }
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
        self.wake.notify_all();
        self.kick_where(|_| true);
    }

    pub(super) fn finished(&self) -> bool {
        self.lock().exit.is_some()
    }

    /// Called after the GIC's pending state may have changed for other
    /// vCPUs. With the userspace GIC, wakes and kicks the vCPUs that now
    /// have an interrupt pending; with an in-kernel GIC (which delivers to
    /// running vCPUs itself) wakes the vCPUs sleeping in WFI, which cannot
    /// tell whether it was for them.
    pub(super) fn interrupts_changed(&self) {
        match self.irqchip.pending_vcpus() {
            Some(pending) if pending.is_empty() => {}
            Some(pending) => {
                self.lock().generation += 1;
                self.wake.notify_all();
                self.kick_where(|v| pending.contains(v));
            }
            None => {
                self.lock().generation += 1;
                self.wake.notify_all();
            }
        }
    }
}

/// Ends the VM with an error if dropped while its thread panics.
pub(super) struct EndOnPanic<'a>(pub(super) &'a Shared);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            self.0
                .finish(VmExit::Error(format!("thread {name} panicked (see above)")));
        }
    }
}
