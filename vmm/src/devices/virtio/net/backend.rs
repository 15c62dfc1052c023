//! What a host end implements: the transmit side the device hands the
//! guest's frames to ([`NetBackend`]) and the receive side the host I/O
//! thread reads frames for the guest from ([`FrameSource`]).

use crate::devices::virtio::host_io::Waker;
use std::io;

/// Where transmitted frames go (the host end).
pub trait NetBackend: Send {
    /// Sends one Ethernet frame (without the virtio header). An error
    /// drops the frame (counted), except `WouldBlock` while
    /// [`NetBackend::pending`]: then the device keeps the frame in the
    /// transmitq until the host end's thread has flushed.
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;

    /// Sends what earlier [`NetBackend::send`]s left buffered.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Whether bytes are buffered, waiting for the host end to take them.
    fn pending(&self) -> bool {
        false
    }

    /// Who to wake when bytes stay buffered (the host end's thread).
    fn set_waker(&mut self, _waker: Waker) {}
}

/// What one read of a host end gave.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Bytes were read (whole frames went to the callback).
    Data,
    /// Nothing to read now.
    WouldBlock,
    /// The host end is gone.
    Closed,
}

/// The receive side of a host end, read by the device's host I/O thread.
pub trait FrameSource: Send + 'static {
    /// Most frames one [`FrameSource::read_frames`] can yield.
    fn max_frames_per_read(&self) -> usize;

    /// Reads once (non-blocking), calling `frame` for each whole frame.
    fn read_frames(&mut self, frame: &mut dyn FnMut(&[u8])) -> io::Result<ReadOutcome>;
}
