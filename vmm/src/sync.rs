//! Locking shared VMM state.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`] that recovers the data of a poisoned lock. Every critical
/// section in the VMM leaves its state consistent at each step, and a panic
/// on one thread (reported as a VM error) must not become a second panic on
/// every other thread that touches the same device.
pub trait Locked<T: ?Sized> {
    /// Locks, recovering a poisoned lock.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
