//! The network device's host ends (`boot --net`): what each is, how it is
//! opened, and the thread that takes its frames into the device.

use super::backend::{FrameSource, NetBackend, ReadOutcome};
use super::stream::{StreamEnd, StreamSource};
use super::{Net, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::host_io::{HostIo, Interest};
use crate::devices::virtio::VirtioMmio;
use crate::sync::Locked;
use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// Reads per wake-up, so that one busy peer cannot hold the device lock.
const READS_PER_WAKE: usize = 16;

/// A host end, as `boot --net` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetHost {
    /// `stream:PATH`: a Unix stream socket speaking QEMU's stream framing
    /// (`passt`, `socket_vmnet`).
    Stream(PathBuf),
    /// `tap:NAME`: a Linux TAP interface (created if absent; needs
    /// CAP_NET_ADMIN unless it exists and belongs to this user).
    Tap(String),
    /// `passt`: a passt of the VM's own, started and stopped with it
    /// (Linux; [`super::passt`]).
    Passt,
}

impl FromStr for NetHost {
    type Err = String;

    /// Parses `stream:PATH`, `tap:NAME` or `passt`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            _ if s == "passt" => Ok(NetHost::Passt),
            Some(("stream", path)) if !path.is_empty() => Ok(NetHost::Stream(path.into())),
            Some(("tap", name)) if !name.is_empty() => {
                // IFNAMSIZ is 16 with the terminating NUL.
                if name.len() > 15 || name.contains(['/', ' ', '\0']) {
                    return Err(format!("'{name}' is not a network interface name (at most 15 bytes, no '/' or spaces)"));
                }
                Ok(NetHost::Tap(name.into()))
            }
            _ => Err(format!(
                "'{s}' is not a host end: use passt, stream:PATH (passt, socket_vmnet), tap:NAME or none"
            )),
        }
    }
}

impl fmt::Display for NetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetHost::Stream(p) => write!(f, "stream:{}", p.display()),
            NetHost::Tap(n) => write!(f, "tap:{n}"),
            NetHost::Passt => write!(f, "passt"),
        }
    }
}

/// An opened host end: the transmit side for the device, and the receive
/// side for [`spawn_receiver`].
pub struct OpenedHostEnd {
    /// Where the guest's frames go.
    pub backend: Box<dyn NetBackend>,
    /// Where the guest's frames come from.
    pub frames: OpenedFrames,
}

/// The receive side of an opened host end.
pub struct OpenedFrames {
    /// Reads the frames.
    pub source: Box<dyn FrameSource>,
    /// The descriptor the receiver thread polls.
    pub fd: OwnedFd,
}

/// Opens `host`. Errors name the host end and what failed.
pub fn open(host: &NetHost) -> io::Result<OpenedHostEnd> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("--net {host}: {e}"));
    match host {
        NetHost::Stream(path) => {
            let (end, rx) = StreamEnd::connect(path).map_err(|e| {
                named(io::Error::new(
                    e.kind(),
                    format!("cannot connect ({e}; is passt or socket_vmnet listening there?)"),
                ))
            })?;
            let source = StreamSource::new(rx.try_clone().map_err(named)?);
            Ok(OpenedHostEnd {
                backend: Box::new(end),
                frames: OpenedFrames {
                    source: Box::new(source),
                    fd: rx.into(),
                },
            })
        }
        #[cfg(target_os = "linux")]
        NetHost::Tap(name) => {
            let tap = super::tap::Tap::open(name).map_err(named)?;
            let (backend, source, fd) = tap.split().map_err(named)?;
            Ok(OpenedHostEnd {
                backend: Box::new(backend),
                frames: OpenedFrames {
                    source: Box::new(source),
                    fd,
                },
            })
        }
        #[cfg(target_os = "linux")]
        NetHost::Passt => {
            let (end, rx) = super::passt::PasstEnd::start().map_err(named)?;
            let source = StreamSource::new(rx.try_clone().map_err(named)?);
            Ok(OpenedHostEnd {
                backend: Box::new(end),
                frames: OpenedFrames {
                    source: Box::new(source),
                    fd: rx.into(),
                },
            })
        }
        #[cfg(not(target_os = "linux"))]
        NetHost::Passt => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("--net {host}: passt is Linux only; on macOS use stream:PATH with socket_vmnet"),
        )),
        #[cfg(not(target_os = "linux"))]
        NetHost::Tap(_) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("--net {host}: TAP interfaces are Linux only; on macOS use stream:PATH with socket_vmnet"),
        )),
    }
}

/// Starts the thread that takes `frames` into `dev`, and flushes what the
/// device's transmit side kept. It reads only while a read's worth of
/// frames fits the device's backlog; a closed host end is a link down,
/// logged once.
pub fn spawn_receiver(
    dev: Arc<Mutex<VirtioMmio<Net>>>,
    frames: OpenedFrames,
) -> io::Result<HostIo> {
    let OpenedFrames { mut source, fd } = frames;
    let per_read = source.max_frames_per_read();
    let mut closed = false;
    let d = dev.clone();
    let io = HostIo::spawn(
        "virtio-net-rx",
        fd,
        Interest {
            read: true,
            write: false,
        },
        move |ready| {
            let mut m = d.locked();
            if ready.readable && !closed {
                for _ in 0..READS_PER_WAKE {
                    if !m.device().has_room_for(per_read) {
                        break;
                    }
                    match source.read_frames(&mut |f| {
                        m.device_mut().receive(f);
                    }) {
                        Ok(ReadOutcome::Data) => {}
                        Ok(ReadOutcome::WouldBlock) => break,
                        Ok(ReadOutcome::Closed) => {
                            tracing::warn!("virtio-net: the host end closed: link down");
                            closed = true;
                            break;
                        }
                        Err(e) => {
                            tracing::warn!("virtio-net: reading the host end: {e}: link down");
                            closed = true;
                            break;
                        }
                    }
                }
            }
            let turn = m.device_mut().on_host_ready(per_read, !closed);
            if turn.run_rx {
                m.kick(RX_QUEUE);
            }
            if turn.run_tx {
                m.kick(TX_QUEUE);
            }
            turn.interest
        },
    )?;
    dev.locked().device_mut().set_waker(io.waker());
    Ok(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ends_parse_and_print_as_given() {
        for s in ["stream:/tmp/passt.sock", "tap:tap0", "passt"] {
            assert_eq!(s.parse::<NetHost>().unwrap().to_string(), s);
        }
        for bad in [
            "",
            "none",
            "passt:",
            "stream:",
            "tap:",
            "udp:1.2.3.4",
            "tap:a/b",
            "tap:0123456789abcdef",
        ] {
            assert!(bad.parse::<NetHost>().is_err(), "{bad}");
        }
    }
}
