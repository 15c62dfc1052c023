//! A Linux TAP interface as the network device's host end
//! (`Documentation/networking/tuntap.rst`): `/dev/net/tun` attached with
//! `TUNSETIFF` (IFF_TAP | IFF_NO_PI), so each read or write is one Ethernet
//! frame with no extra header.

use super::backend::{FrameSource, NetBackend, ReadOutcome};
use super::MAX_FRAME_LEN;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

/// An attached TAP interface.
pub struct Tap {
    file: File,
}

impl Tap {
    /// Attaches to TAP interface `name`, creating it if it does not exist
    /// (creating needs CAP_NET_ADMIN). The descriptor is non-blocking.
    pub fn open(name: &str) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // SAFETY: ifreq is plain old data; all zeroes is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        let bytes = name.as_bytes();
        if bytes.len() >= req.ifr_name.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "interface name too long",
            ));
        }
        for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
            *d = b as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which `req` is, on
        // a descriptor this function owns.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if r < 0 {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (creating or attaching a TAP interface needs CAP_NET_ADMIN, or an interface made with `ip tuntap add NAME mode tap user $USER`)"
            } else {
                ""
            };
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF: {e}{hint}")));
        }
        Ok(Tap { file })
    }

    /// The transmit side, the receive side and the descriptor to poll.
    pub fn split(self) -> io::Result<(TapWriter, TapReader, OwnedFd)> {
        let reader = self.file.try_clone()?;
        let poll = self.file.try_clone()?;
        Ok((
            TapWriter { file: self.file },
            TapReader {
                file: reader,
                buf: vec![0u8; MAX_FRAME_LEN],
            },
            poll.into(),
        ))
    }
}

/// Writes the guest's frames to the interface; a frame the interface's
/// queue cannot take now is dropped, as on a congested link.
pub struct TapWriter {
    file: File,
}

impl NetBackend for TapWriter {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        loop {
            return match self.file.write(frame) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }
}

/// Reads frames for the guest, one per read.
pub struct TapReader {
    file: File,
    buf: Vec<u8>,
}

impl FrameSource for TapReader {
    fn max_frames_per_read(&self) -> usize {
        1
    }

    fn read_frames(&mut self, frame: &mut dyn FnMut(&[u8])) -> io::Result<ReadOutcome> {
        loop {
            return match self.file.read(&mut self.buf) {
                Ok(0) => Ok(ReadOutcome::Closed),
                Ok(n) => {
                    frame(&self.buf[..n]);
                    Ok(ReadOutcome::Data)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(ReadOutcome::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }
}
