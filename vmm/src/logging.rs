//! Logging helpers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Per-call-site state of [`crate::warn_ratelimited`]: at most one warning per
/// second per site, with a count of the ones suppressed in between.
pub struct RateLimit {
    last_sec: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    /// A fresh limiter.
    pub const fn new() -> Self {
        RateLimit {
            last_sec: AtomicU64::new(u64::MAX),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` if a message may be logged now (`n` were suppressed since
    /// the last one), `None` if this one is suppressed.
    pub fn check(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_sec.load(Ordering::Relaxed);
        if last != now
            && self
                .last_sec
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// `tracing::warn!` limited to one message per second per call site; use it
/// for anything a guest can trigger.
#[macro_export]
macro_rules! warn_ratelimited {
    ($($arg:tt)*) => {{
        static LIMIT: $crate::logging::RateLimit = $crate::logging::RateLimit::new();
        if let Some(suppressed) = LIMIT.check() {
            if suppressed > 0 {
                tracing::warn!(suppressed, $($arg)*);
            } else {
                tracing::warn!($($arg)*);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_message_in_the_same_second_is_suppressed() {
        let l = RateLimit::new();
        assert_eq!(l.check(), Some(0));
        // Unless the second boundary passes between the calls, the next is suppressed.
        let second = l.check();
        assert!(second.is_none() || second == Some(0));
    }
}
