//! The real-time clock (PL031) on the bus, with the thread that raises its
//! alarm on time: the model evaluates its match register only when asked
//! ([`Pl031::update`]), so this thread asks at [`Pl031::next_match`], and a
//! guest write (which may set a new alarm) wakes it to look again.

use crate::devices::bus::BusRegion;
use crate::devices::pl031::{Pl031, WallClock};
use crate::devices::{AccessError, MmioDevice};
use crate::sync::{Locked, Waited};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the RTC's bus entry and its alarm thread share.
struct Alarm {
    /// The thread must end.
    stop: Mutex<bool>,
    /// Wakes the thread: a guest write, or the end.
    wake: Condvar,
}

/// The RTC's bus entry: the model, waking the alarm thread after each
/// guest write.
struct RtcMmio {
    dev: Arc<Mutex<Pl031>>,
    alarm: Arc<Alarm>,
}

impl MmioDevice for RtcMmio {
    fn read(&mut self, vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        self.dev.locked().read(vcpu, offset, data)
    }

    fn write(&mut self, vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        let r = self.dev.locked().write(vcpu, offset, data);
        // Under the alarm's lock: the thread cannot be between reading the
        // next match and waiting.
        let _stop = self.alarm.stop.locked();
        self.alarm.wake.notify_all();
        r
    }
}

/// The RTC and its alarm thread (stopped when dropped).
pub struct Rtc {
    dev: Arc<Mutex<Pl031>>,
    alarm: Arc<Alarm>,
    thread: Option<JoinHandle<()>>,
}

impl Rtc {
    /// Starts the alarm thread of `dev`, whose clock is `clock`.
    pub fn start(dev: Pl031, clock: Arc<dyn WallClock>) -> std::io::Result<Self> {
        let dev = Arc::new(Mutex::new(dev));
        let alarm = Arc::new(Alarm {
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread = {
            let (dev, alarm) = (dev.clone(), alarm.clone());
            std::thread::Builder::new()
                .name("rtc-alarm".into())
                .spawn(move || run(&dev, &alarm, &*clock))?
        };
        Ok(Rtc {
            dev,
            alarm,
            thread: Some(thread),
        })
    }

    /// The model.
    pub fn device(&self) -> &Arc<Mutex<Pl031>> {
        &self.dev
    }

    /// Its bus entry at `base`, `size` bytes.
    pub fn region(&self, name: &'static str, base: u64, size: u64) -> BusRegion {
        let mmio: Arc<Mutex<dyn MmioDevice>> = Arc::new(Mutex::new(RtcMmio {
            dev: self.dev.clone(),
            alarm: self.alarm.clone(),
        }));
        (name, base, size, mmio)
    }
}

impl Drop for Rtc {
    fn drop(&mut self) {
        *self.alarm.stop.locked() = true;
        self.alarm.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The alarm thread: sleeps until the next match the model reports (on
/// `clock`, the model's), updates the model then, and looks again after
/// every guest write.
fn run(dev: &Mutex<Pl031>, alarm: &Alarm, clock: &dyn WallClock) {
    let mut stop = alarm.stop.locked();
    while !*stop {
        let next = dev.locked().next_match();
        stop = match next.map(|at| at.saturating_sub(clock.since_epoch())) {
            Some(Duration::ZERO) => {
                dev.locked().update();
                continue;
            }
            Some(wait) => alarm.wake.waited_for(stop, wait),
            None => alarm.wake.waited(stop),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::pl031::HostClock;
    use crate::devices::{IrqLine, Persist};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    #[derive(Default)]
    struct Line(AtomicBool);
    impl IrqLine for Line {
        fn set_level(&self, level: bool) {
            self.0.store(level, Ordering::SeqCst);
        }
    }

    fn w32(m: &mut RtcMmio, off: u64, v: u32) {
        m.write(0, off, &v.to_le_bytes()).unwrap();
    }

    fn r32(m: &mut RtcMmio, off: u64) -> u32 {
        let mut d = [0; 4];
        m.read(0, off, &mut d).unwrap();
        u32::from_le_bytes(d)
    }

    /// An alarm set for the next second raises the interrupt with no guest
    /// access after the write that armed it.
    #[test]
    fn the_alarm_fires_without_a_guest_access() {
        let clock: Arc<dyn WallClock> = Arc::new(HostClock);
        let line = Arc::new(Line::default());
        let rtc = Rtc::start(Pl031::new(clock.clone(), line.clone()), clock).unwrap();
        let mut mmio = RtcMmio {
            dev: rtc.dev.clone(),
            alarm: rtc.alarm.clone(),
        };
        let now = r32(&mut mmio, 0x000);
        w32(&mut mmio, 0x010, 1); // RTCIMSC: unmasked
        w32(&mut mmio, 0x004, now.wrapping_add(2)); // RTCMR: in two seconds at most
        let deadline = Instant::now() + Duration::from_secs(120);
        while !line.0.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the alarm never fired");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(rtc.dev.locked().save().ris, 1);
    }
}
