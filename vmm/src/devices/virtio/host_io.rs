//! The host side of a device whose work arrives from the host (a network
//! socket's frames, a vsock peer's bytes): one thread per device that
//! waits, with `poll(2)`, on the host file descriptors and on a wake-up
//! pipe, and calls the device's handler when one is ready.
//!
//! Locking: the thread holds no lock while it waits. The handler takes the
//! device's lock to move data between the host end and the virtqueues (the
//! same lock the vCPUs' MMIO accesses take), so a snapshot that holds the
//! device lock holds the thread too. The handler returns what to wait for
//! next ([`Interest`]); anything that changes that from another thread
//! (the driver posting receive buffers, a transmit left bytes to flush)
//! calls [`Waker::wake`].

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// What the handler wants to wait for next on the host descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interest {
    /// Wait until it is readable (false: the device cannot take more yet).
    pub read: bool,
    /// Wait until it is writable (bytes are waiting to be sent).
    pub write: bool,
}

/// What woke the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ready {
    /// The host descriptor is readable (or at end of file, or failed).
    pub readable: bool,
    /// The host descriptor is writable.
    pub writable: bool,
    /// [`Waker::wake`] was called.
    pub woken: bool,
    /// The descriptor hung up or failed.
    pub hung_up: bool,
}

/// Wakes a [`HostIo`] thread so that its handler runs again.
#[derive(Clone)]
pub struct Waker {
    pipe: Arc<OwnedFd>,
}

impl Waker {
    /// Makes the thread call its handler (with [`Ready::woken`]) soon.
    /// Never blocks: a wake-up already pending is enough.
    pub fn wake(&self) {
        // A full pipe already holds a wake-up; any other error leaves the
        // thread to its next event.
        let _ = nix::unistd::write(self.pipe.as_fd(), &[1u8]);
    }
}

/// A pipe whose ends are non-blocking and close on exec.
fn wake_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (rx, tx) = crate::pipe::cloexec_pipe()?;
    for end in [&rx, &tx] {
        fcntl(end, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    }
    Ok((rx, tx))
}

/// One host descriptor a [`HostIo`] thread waits on, and for what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    /// The descriptor. The handler that names it keeps it open until its
    /// next call (a closed one only reads as hung up).
    pub fd: RawFd,
    /// What to wait for.
    pub interest: Interest,
}

/// What a handler wants to wait for next: descriptors, and a time at which
/// to be called even if none is ready (with an empty event list).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wait {
    /// The descriptors; one that hung up must not be named again (it would
    /// be ready at once, for ever).
    pub watches: Vec<Watch>,
    /// When to call the handler anyway.
    pub deadline: Option<Instant>,
}

/// A device's host I/O thread; stopped and joined on drop.
pub struct HostIo {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl HostIo {
    /// Starts thread `name` waiting on `fd` (which it owns) as `handler`
    /// asks: first with `initial`, then with what each call returns. Once
    /// `fd` hangs up or fails (reported as readable), only wake-ups are
    /// awaited.
    pub fn spawn(
        name: &str,
        fd: OwnedFd,
        initial: Interest,
        mut handler: impl FnMut(Ready) -> Interest + Send + 'static,
    ) -> io::Result<Self> {
        let raw = fd.as_raw_fd();
        let mut dead = false;
        let wait = move |want: Interest, dead: bool| Wait {
            watches: if dead {
                Vec::new()
            } else {
                vec![Watch {
                    fd: raw,
                    interest: want,
                }]
            },
            deadline: None,
        };
        let first = wait(initial, false);
        HostIo::spawn_set(name, first, move |events, woken| {
            let _owned = &fd;
            let mut ready = Ready {
                woken,
                ..Ready::default()
            };
            for &(_, r) in events {
                ready.readable |= r.readable;
                ready.writable |= r.writable;
                dead |= r.hung_up;
            }
            let want = handler(ready);
            wait(want, dead)
        })
    }

    /// Starts thread `name` waiting on a set of descriptors: first those of
    /// `initial`, then those each call of `handler` returns. The handler
    /// gets the descriptors that are ready (with [`Ready::hung_up`] where
    /// one hung up or failed, then also readable) and whether
    /// [`Waker::wake`] was called; it runs when either happened or the
    /// deadline passed.
    pub fn spawn_set(
        name: &str,
        initial: Wait,
        mut handler: impl FnMut(&[(RawFd, Ready)], bool) -> Wait + Send + 'static,
    ) -> io::Result<Self> {
        let (rx, tx) = wake_pipe()?;
        let stop = Arc::new(AtomicBool::new(false));
        let waker = Waker { pipe: Arc::new(tx) };
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut want = initial;
                let mut drain = [0u8; 64];
                let mut fds: Vec<libc::pollfd> = Vec::new();
                let mut events = Vec::new();
                while !stopped.load(Ordering::Acquire) {
                    fds.clear();
                    fds.push(pollfd(rx.as_raw_fd(), libc::POLLIN));
                    for w in &want.watches {
                        let mut flags = 0;
                        if w.interest.read {
                            flags |= libc::POLLIN;
                        }
                        if w.interest.write {
                            flags |= libc::POLLOUT;
                        }
                        fds.push(pollfd(w.fd, flags));
                    }
                    let timeout = want.deadline.map_or(-1, |d| {
                        let left = d.saturating_duration_since(Instant::now());
                        // Rounded up, so that the deadline has passed.
                        i32::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
                    });
                    // SAFETY: `fds` is a live, initialised array of
                    // `fds.len()` pollfd structures that poll may write.
                    // A descriptor closed meanwhile is reported POLLNVAL,
                    // not touched.
                    let n =
                        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
                    if n < 0 {
                        let e = io::Error::last_os_error();
                        if e.kind() == io::ErrorKind::Interrupted {
                            continue;
                        }
                        tracing::error!("host I/O thread: poll failed: {e}; stopping");
                        return;
                    }
                    let woken = fds[0].revents & libc::POLLIN != 0;
                    if woken {
                        while matches!(nix::unistd::read(rx.as_fd(), &mut drain), Ok(n) if n > 0) {}
                    }
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    events.clear();
                    for p in &fds[1..] {
                        let hung_up =
                            p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
                        let r = Ready {
                            readable: hung_up
                                || (p.events & libc::POLLIN != 0 && p.revents & libc::POLLIN != 0),
                            writable: p.events & libc::POLLOUT != 0
                                && p.revents & libc::POLLOUT != 0,
                            woken: false,
                            hung_up,
                        };
                        if r.readable || r.writable {
                            events.push((p.fd, r));
                        }
                    }
                    let due = want.deadline.is_some_and(|d| Instant::now() >= d);
                    if woken || due || !events.is_empty() {
                        want = handler(&events, woken);
                    }
                }
            })?;
        Ok(HostIo {
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// A waker for this thread.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

impl Drop for HostIo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn the_handler_runs_on_readable_and_on_wake() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut reader = b.try_clone().unwrap();
        reader.set_nonblocking(true).unwrap();
        let (tx, rx) = mpsc::channel();
        let io = HostIo::spawn(
            "test-io",
            b.into(),
            Interest {
                read: true,
                write: false,
            },
            move |r| {
                let mut buf = [0u8; 16];
                let n = if r.readable {
                    reader.read(&mut buf).unwrap_or(0)
                } else {
                    0
                };
                tx.send((r, buf[..n].to_vec())).unwrap();
                Interest {
                    read: true,
                    write: false,
                }
            },
        )
        .unwrap();
        a.write_all(b"hello").unwrap();
        let (r, got) = rx.recv_timeout(T).unwrap();
        assert!(r.readable && got == b"hello");
        io.waker().wake();
        let (r, got) = rx.recv_timeout(T).unwrap();
        assert!(r.woken && !r.readable && got.is_empty());
        drop(io);
        // Stopped and joined: the handler (and its end) is gone.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert!(a.write_all(b"more").is_err(), "the thread's end was closed");
    }

    #[test]
    fn no_read_interest_leaves_data_waiting_until_woken() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (tx, rx) = mpsc::channel();
        let want_read = Arc::new(AtomicBool::new(false));
        let w = want_read.clone();
        let io = HostIo::spawn("test-io", b.into(), Interest::default(), move |r| {
            tx.send(r).unwrap();
            Interest {
                read: w.load(Ordering::Acquire),
                write: false,
            }
        })
        .unwrap();
        a.write_all(b"x").unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "not waiting to read"
        );
        want_read.store(true, Ordering::Release);
        io.waker().wake();
        assert!(rx.recv_timeout(T).unwrap().woken);
        // Now it waits to read, and the byte is there.
        assert!(rx.recv_timeout(T).unwrap().readable);
    }
}
