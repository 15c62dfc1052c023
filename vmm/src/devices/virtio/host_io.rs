//! The host side of a device whose work arrives from the host (a network
//! socket's frames, a vsock peer's bytes): one thread per device that
//! waits, with `poll(2)`, on the host file descriptor and on a wake-up
//! pipe, and calls the device's handler when either is ready.
//!
//! Locking: the thread holds no lock while it waits. The handler takes the
//! device's lock to move data between the host end and the virtqueues (the
//! same lock the vCPUs' MMIO accesses take), so a snapshot that holds the
//! device lock holds the thread too. The handler returns what to wait for
//! next ([`Interest`]); anything that changes that from another thread
//! (the driver posting receive buffers, a transmit left bytes to flush)
//! calls [`Waker::wake`].

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

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

/// A pipe whose ends are non-blocking and close on exec (pipe2 is not on
/// macOS).
fn wake_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    let (rx, tx) = nix::unistd::pipe()?;
    for end in [&rx, &tx] {
        fcntl(end, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        fcntl(end, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    Ok((rx, tx))
}

/// A device's host I/O thread; stopped and joined on drop.
pub struct HostIo {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl HostIo {
    /// Starts thread `name` waiting on `fd` (which it owns) as `handler`
    /// asks: first with `initial`, then with what each call returns.
    pub fn spawn(
        name: &str,
        fd: OwnedFd,
        initial: Interest,
        mut handler: impl FnMut(Ready) -> Interest + Send + 'static,
    ) -> io::Result<Self> {
        let (rx, tx) = wake_pipe()?;
        let stop = Arc::new(AtomicBool::new(false));
        let waker = Waker { pipe: Arc::new(tx) };
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut want = initial;
                // The descriptor hung up or failed: the handler was told
                // (as readable); from then on only wake-ups are awaited.
                let mut dead = false;
                let mut drain = [0u8; 64];
                while !stopped.load(Ordering::Acquire) {
                    let mut flags = PollFlags::empty();
                    if want.read {
                        flags |= PollFlags::POLLIN;
                    }
                    if want.write {
                        flags |= PollFlags::POLLOUT;
                    }
                    let mut fds = [
                        PollFd::new(rx.as_fd(), PollFlags::POLLIN),
                        PollFd::new(fd.as_fd(), flags),
                    ];
                    let n = if dead { 1 } else { 2 };
                    match poll(&mut fds[..n], PollTimeout::NONE) {
                        Ok(_) => {}
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(e) => {
                            tracing::error!("host I/O thread: poll failed: {e}; stopping");
                            return;
                        }
                    }
                    let got = |i: usize, f: PollFlags| {
                        i < n && fds[i].revents().is_some_and(|r| r.intersects(f))
                    };
                    let hangup = PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL;
                    let failed = got(1, hangup);
                    let ready = Ready {
                        readable: failed || (want.read && got(1, PollFlags::POLLIN)),
                        writable: want.write && got(1, PollFlags::POLLOUT),
                        woken: got(0, PollFlags::POLLIN),
                    };
                    if ready.woken {
                        while matches!(nix::unistd::read(rx.as_fd(), &mut drain), Ok(n) if n > 0) {}
                    }
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    if ready != Ready::default() {
                        want = handler(ready);
                    }
                    dead |= failed;
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
