//! The vsock device's host end (`boot --vsock-uds PATH`): the thread that
//! serves its Unix domain sockets ([`spawn_host_thread`]), which are laid
//! out as Firecracker lays them ([`super::muxer::VsockHost`]).

use super::device::{Vsock, EVENT_QUEUE, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::host_io::HostIo;
use crate::devices::virtio::VirtioMmio;
use crate::sync::Locked;
use std::io;
use std::sync::{Arc, Mutex};

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
