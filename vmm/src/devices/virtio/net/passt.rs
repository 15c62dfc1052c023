//! `boot --net passt`: a passt process of the VM's own, started with the
//! VM and stopped with it, as libvirt and podman run one per guest. The VMM
//! makes a Unix stream socket pair, keeps one end (QEMU's stream framing,
//! [`super::stream`]) and hands passt the other (`passt --fd`), so there is
//! no socket file and no wait for one. passt quits when its end closes, so
//! it outlives its VMM by no more than the VMM's process.

use super::backend::NetBackend;
use super::stream::StreamEnd;
use crate::devices::virtio::host_io::Waker;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The program started: `passt` on `PATH`.
pub const PASST: &str = "passt";

/// How long passt has to end after `SIGTERM` before it gets `SIGKILL`.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// passt's arguments for the socket `fd`: in the foreground (a child of
/// the VMM, which stops it), its end of the socket pair, only warnings and
/// errors, on stderr (the VMM's log). (Started as root, passt runs as
/// `nobody`: it needs no file.)
pub fn args(fd: i32) -> Vec<String> {
    ["--foreground", "--quiet", "--stderr", "--fd"]
        .iter()
        .map(|s| s.to_string())
        .chain([fd.to_string()])
        .collect()
}

/// A running passt: stopped (`SIGTERM`, then `SIGKILL`) and reaped when
/// dropped.
pub struct Passt {
    child: Child,
}

impl Passt {
    /// Starts passt on one end of a new socket pair; returns it and the
    /// other end. Errors: the socket pair, or passt could not be started
    /// (not installed: the error says so).
    pub fn start() -> io::Result<(Passt, UnixStream)> {
        let (ours, theirs) = UnixStream::pair()?;
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(PASST);
        cmd.args(args(fd))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Not in the VMM's process group: a terminal's Ctrl-C reaches
            // the VMM, which stops passt after the VM.
            .process_group(0);
        // SAFETY: runs in the forked child before exec, where only
        // async-signal-safe calls are allowed: fcntl is one. It clears
        // FD_CLOEXEC on passt's end of the pair, which this process owns
        // and keeps open until passt is spawned.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    e.kind(),
                    format!("{PASST} is not installed (not on PATH; e.g. apt install passt)"),
                )
            } else {
                io::Error::new(e.kind(), format!("cannot start {PASST}: {e}"))
            }
        })?;
        drop(theirs);
        Ok((Passt { child }, ours))
    }

    /// passt's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Passt {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The transmit side of a passt host end: the stream end, and the passt
/// it talks to, stopped when the device lets go of it.
pub struct PasstEnd {
    end: StreamEnd,
    _passt: Passt,
}

impl PasstEnd {
    /// Starts passt; returns the transmit side and a second handle of the
    /// socket, for the thread that receives.
    pub fn start() -> io::Result<(Self, UnixStream)> {
        let (passt, sock) = Passt::start()?;
        let (end, rx) = StreamEnd::new(sock)?;
        tracing::info!("virtio-net: passt started (pid {})", passt.pid());
        Ok((PasstEnd { end, _passt: passt }, rx))
    }
}

impl NetBackend for PasstEnd {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.end.send(frame)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.end.flush()
    }

    fn pending(&self) -> bool {
        self.end.pending()
    }

    fn set_waker(&mut self, waker: Waker) {
        self.end.set_waker(waker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passt_gets_its_end_and_runs_in_the_foreground() {
        assert_eq!(args(7).join(" "), "--foreground --quiet --stderr --fd 7");
    }
}
