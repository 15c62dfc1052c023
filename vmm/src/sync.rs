//! Locking and waiting on shared VMM state.
//!
//! Threads that sleep until a guest deadline (timers, WFI) call
//! [`punctual_wakeups`] first.
//!
//! Every critical section in the VMM leaves its state consistent at each step,
//! and a panic on one thread (reported as a VM error) must not become a second
//! panic on every other thread that touches the same device. So locks and
//! condition-variable waits here recover a poisoned lock's data instead of
//! propagating the poison.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// [`Mutex::lock`] that recovers the data of a poisoned lock.
pub trait Locked<T: ?Sized> {
    /// Locks, recovering a poisoned lock.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Condvar`] waits that recover the guard of a poisoned lock.
pub trait Waited {
    /// [`Condvar::wait`], recovering a poisoned lock.
    fn waited<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    /// [`Condvar::wait_timeout`] for at most `timeout`, recovering a poisoned
    /// lock. Whether it timed out is not reported: callers re-check their
    /// condition and their deadline.
    fn waited_for<'a, T>(&self, guard: MutexGuard<'a, T>, timeout: Duration) -> MutexGuard<'a, T>;
}

impl Waited for Condvar {
    fn waited<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn waited_for<'a, T>(&self, guard: MutexGuard<'a, T>, timeout: Duration) -> MutexGuard<'a, T> {
        self.wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// Makes the calling thread's timed waits end as close to their deadline as
/// the host allows: on Linux, a timer slack of 1 ns instead of the default
/// 50 us (`PR_SET_TIMERSLACK`), which would otherwise delay every guest timer
/// interrupt by about that much. Nothing elsewhere.
pub fn punctual_wakeups() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only the
    // calling thread's slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_recover_a_poisoned_lock() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison the lock");
        })
        .join();
        assert!(m.is_poisoned());
        let cv = Condvar::new();
        let g = cv.waited_for(m.locked(), Duration::from_millis(1));
        assert_eq!(*g, 1);
    }
}
