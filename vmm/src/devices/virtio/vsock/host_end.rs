//! The vsock device's host end (`boot --vsock-uds PATH`): Unix domain
//! sockets, as Firecracker lays them out. The VMM listens on `PATH` for
//! host programs (which then send `CONNECT <port>\n`), and a guest
//! connection to host port P connects to `PATH_P`. The thread that serves
//! them is [`spawn_host_thread`].

use super::{Vsock, EVENT_QUEUE, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::host_io::HostIo;
use crate::devices::virtio::VirtioMmio;
use crate::sync::Locked;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The listening socket at `PATH` and the prefix of the guest's
/// destinations (`PATH_P`). The socket file is removed on drop.
pub struct VsockHost {
    listener: UnixListener,
    path: PathBuf,
}

impl VsockHost {
    /// Listens on `path`. A socket file left by a VMM that is gone (no one
    /// accepts on it) is replaced; one in use, or a file that is not a
    /// socket, is an error naming it.
    pub fn bind(path: &Path) -> io::Result<Self> {
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("--vsock-uds {}: {e}", path.display()));
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
                Ok(_) => {
                    return Err(named(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another process is listening on it",
                    )))
                }
                Err(_) => std::fs::remove_file(path).map_err(named)?,
            },
            Ok(_) => {
                return Err(named(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the path exists and is not a socket",
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(named(e)),
        }
        let listener = UnixListener::bind(path).map_err(named)?;
        listener.set_nonblocking(true).map_err(named)?;
        Ok(VsockHost {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// The listening socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listening socket, for poll.
    pub(super) fn listener_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// A host program that connected, if one is waiting (non-blocking).
    pub(super) fn accept(&self) -> io::Result<Option<UnixStream>> {
        match self.listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(true)?;
                Ok(Some(s))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The path a guest connection to host port `port` goes to.
    pub fn port_path(&self, port: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!("_{port}"));
        p.into()
    }

    /// Connects to `PATH_<port>` without blocking: a listener whose backlog
    /// is full refuses (the guest sees a reset) rather than stalling the
    /// vCPU.
    pub(super) fn connect(&self, port: u32) -> io::Result<UnixStream> {
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        let addr = UnixAddr::new(&self.port_path(port))?;
        let fd: OwnedFd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )?;
        set_nonblocking_cloexec(&fd)?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(nix::errno::Errno::EINPROGRESS) | Err(nix::errno::Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the listener's backlog is full",
                ))
            }
            Err(e) => return Err(e.into()),
        }
        // SAFETY: `fd` is an open, connected stream socket we own; the
        // UnixStream takes over that ownership.
        Ok(unsafe { UnixStream::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) })
    }
}

fn set_nonblocking_cloexec(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

impl Drop for VsockHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts the thread that serves `dev`'s host sockets: it accepts host
/// programs, moves bytes between the sockets and the device's buffers,
/// and runs the queues that then have work.
pub fn spawn_host_thread(dev: Arc<Mutex<VirtioMmio<Vsock>>>) -> io::Result<HostIo> {
    let d = dev.clone();
    let initial = dev.locked().device().wait();
    let io = HostIo::spawn_set("virtio-vsock", initial, move |events, _woken| {
        let mut m = d.locked();
        m.device_mut().host_events(events);
        for q in [RX_QUEUE, TX_QUEUE, EVENT_QUEUE] {
            if m.device().has_work(q) {
                m.kick(q);
            }
        }
        m.device().wait()
    })?;
    dev.locked().device_mut().set_waker(io.waker());
    Ok(io)
}
