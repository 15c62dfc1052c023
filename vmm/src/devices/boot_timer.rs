//! The boot-timer: a 4 KiB MMIO region the guest's init writes once when
//! userspace is up. The first write (any offset, any size) reports the time
//! since VM start; later writes and all reads do nothing (reads return 0).

use super::{AccessError, MmioDevice, Persist};
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::time::{Duration, Instant};

/// The boot-timer device.
pub struct BootTimer {
    start: Instant,
    report: Box<dyn FnMut(Duration) + Send>,
    fired: bool,
}

/// Saved boot-timer state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootTimerState {
    /// Whether the guest already wrote (so a restored VM does not report again).
    pub fired: bool,
}

impl BootTimer {
    /// A boot-timer measuring from `start` (the host monotonic clock at VM
    /// start). `report` is called once, on the guest's first write, with the
    /// time elapsed since `start`; print it with [`BootTimer::message`].
    pub fn new(start: Instant, report: Box<dyn FnMut(Duration) + Send>) -> Self {
        BootTimer {
            start,
            report,
            fired: false,
        }
    }

    /// The line the VMM prints: `Guest-boot-time = N ms`, N being whole
    /// milliseconds (truncated).
    pub fn message(elapsed: Duration) -> String {
        format!("Guest-boot-time = {} ms", elapsed.as_millis())
    }

    /// Whether the guest has written already.
    pub fn fired(&self) -> bool {
        self.fired
    }
}

impl Persist for BootTimer {
    type State = BootTimerState;
    /// The start and the report, as for [`BootTimer::new`].
    type Args = (Instant, Box<dyn FnMut(Duration) + Send>);
    /// Every state is valid.
    type Error = Infallible;

    fn save(&self) -> BootTimerState {
        BootTimerState { fired: self.fired }
    }

    fn restore((start, report): Self::Args, state: &BootTimerState) -> Result<Self, Infallible> {
        Ok(BootTimer {
            start,
            report,
            fired: state.fired,
        })
    }
}

impl MmioDevice for BootTimer {
    fn read(&mut self, _vcpu: usize, _offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        data.fill(0);
        Ok(())
    }

    fn write(&mut self, _vcpu: usize, _offset: u64, _data: &[u8]) -> Result<(), AccessError> {
        if !self.fired {
            self.fired = true;
            let elapsed = self.start.elapsed();
            tracing::info!("{}", Self::message(elapsed));
            (self.report)(elapsed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn timer(start: Instant) -> (BootTimer, Arc<Mutex<Vec<Duration>>>) {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let r = reports.clone();
        let t = BootTimer::new(start, Box::new(move |d| r.lock().unwrap().push(d)));
        (t, reports)
    }

    #[test]
    fn fires_once_with_elapsed_time() {
        let start = Instant::now() - Duration::from_millis(40);
        let (mut t, reports) = timer(start);
        let mut d = [0xffu8; 4];
        t.read(0, 0, &mut d).unwrap();
        assert_eq!(d, [0; 4]);
        assert!(reports.lock().unwrap().is_empty(), "reads do not fire");
        t.write(0, 0x7, &[1]).unwrap();
        t.write(0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let got = reports.lock().unwrap().clone();
        assert_eq!(got.len(), 1);
        assert!(got[0] >= Duration::from_millis(40));
        assert!(got[0] <= start.elapsed());
        assert!(t.fired());
    }

    #[test]
    fn message_uses_whole_milliseconds() {
        assert_eq!(
            BootTimer::message(Duration::from_micros(123_999)),
            "Guest-boot-time = 123 ms"
        );
    }

    #[test]
    fn restored_fired_timer_stays_quiet() {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let r = reports.clone();
        let report = Box::new(move |d| r.lock().unwrap().push(d));
        let mut t =
            BootTimer::restore((Instant::now(), report), &BootTimerState { fired: true }).unwrap();
        t.write(0, 0, &[1]).unwrap();
        assert!(reports.lock().unwrap().is_empty());
        let json = serde_json::to_string(&t.save()).unwrap();
        let back: BootTimerState = serde_json::from_str(&json).unwrap();
        assert!(back.fired);
    }
}
