//! The virtio-vsock device itself: the [`VirtioDevice`] over the three
//! queues (the guest's packets to the muxer, [`super::muxer`]; the muxer's
//! packets into the receive queue; the transport-reset event), and its
//! saved state.

use super::connection::{HostRead, Key, CONN_BUF_SIZE};
use super::muxer::{Muxer, VsockCounters, VsockHost};
use super::packet::{self, op, Header, HDR_LEN, HOST_CID, SHUTDOWN_SEND, TYPE_STREAM};
use crate::devices::virtio::host_io::{Ready, Wait, Waker};
use crate::devices::virtio::{VirtioDevice, VirtioError};
use crate::devices::Persist;
use crate::memory::GuestMemoryMmap;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{Queue, QueueOwnedT, QueueT, Reader, Writer};

/// Index of the receive queue (device to driver).
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue (driver to device).
pub const TX_QUEUE: usize = 1;
/// Index of the event queue.
pub const EVENT_QUEUE: usize = 2;
/// Size of each queue (QueueNumMax).
pub const QUEUE_SIZE: u16 = 256;
/// Largest payload of one packet, bytes (Linux's
/// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE); a longer one is refused.
pub const MAX_PAYLOAD: usize = 64 << 10;

/// `struct virtio_vsock_config`: le64 guest_cid.
const CONFIG_LEN: usize = 8;

/// A virtio vsock device.
pub struct Vsock {
    cid: u64,
    config: [u8; CONFIG_LEN],
    /// The connections and the host sockets.
    pub(super) mux: Muxer,
    /// The transport-reset event is due (after a restore).
    reset_event: bool,
    /// The event queue's available index when the event was posted.
    reset_unacked: Option<u16>,
    /// The device writes nothing into guest RAM (a snapshot is being taken).
    held: bool,
    /// The transmitq waits for room in the muxer's control queue.
    tx_stalled: bool,
    waker: Option<Waker>,
    payload: Vec<u8>,
}

/// The saved state: the CID and the next host-side port (connections are
/// host state and are not kept). The negotiated features are the
/// transport's; a state from before that, which also holds them as
/// `acked_features`, reads the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// The guest's CID.
    pub cid: u64,
    /// The host-side port the next host-initiated connection gets
    /// ([`super::FIRST_LOCAL_PORT`] to `u32::MAX - 1`). A restored device
    /// goes on from it, so that its connections do not take the ports of
    /// the snapshot's: until a closed connection's socket is gone (its
    /// close timeout), the guest answers a new connection request on the
    /// same ports with a reset. `None` (a state written before it was
    /// kept): from the first.
    #[serde(default)]
    pub next_local_port: Option<u32>,
}

/// What a restored device is given.
pub struct VsockArgs {
    /// The CID the command line asks for; `None` keeps the snapshot's. A
    /// new one reaches the guest with the transport reset.
    pub cid: Option<u64>,
    /// The host end, newly bound.
    pub host: VsockHost,
}

/// Whether `cid` may be a guest's: not 0, 1 (reserved), 2 (the host) nor
/// `u32::MAX` (VMADDR_CID_ANY), and within Linux's 32 bits.
pub fn valid_guest_cid(cid: u64) -> bool {
    (3..u64::from(u32::MAX)).contains(&cid)
}

impl Vsock {
    /// A device for guest CID `cid` (see [`valid_guest_cid`]) whose host
    /// end is `host`.
    pub fn new(cid: u64, host: VsockHost) -> Self {
        Vsock {
            cid,
            config: cid.to_le_bytes(),
            mux: Muxer::new(host),
            reset_event: false,
            reset_unacked: None,
            held: false,
            tx_stalled: false,
            waker: None,
            payload: Vec::new(),
        }
    }

    /// The guest's CID.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// The counters.
    pub fn counters(&self) -> VsockCounters {
        self.mux.counters
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.mux.connections()
    }

    /// Bytes held for host sockets that are not reading, over all
    /// connections (at most [`super::MAX_CONNECTIONS`] ×
    /// [`CONN_BUF_SIZE`], plus the `OK` lines).
    pub fn host_buffered_bytes(&self) -> usize {
        self.mux.host_buffered_bytes()
    }

    /// Packets without payload waiting for receive buffers (at most
    /// [`super::MAX_CONTROL`]).
    pub fn pending_control_packets(&self) -> usize {
        self.mux.pending_control_packets()
    }

    /// Removes the host end's socket file (`--vsock-uds PATH`): at the VM's
    /// end, whoever still holds the device.
    pub fn remove_socket_file(&mut self) {
        self.mux.host.remove_socket_file();
    }

    /// Who to wake when what the host thread should wait for changes.
    pub fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
    }

    /// Whether the guest has taken a restore's transport-reset event and
    /// handled it, given the event queue's available index now (`avail`):
    /// its driver made a new event buffer available since the event was
    /// posted (Linux re-posts the buffer once it has reset its connections;
    /// it need not notify, the device having buffers). Until then a new
    /// connection may be reset in the guest alone, unseen by the host. True
    /// for a device that was not restored.
    pub fn reset_handled(&self, avail: Option<u16>) -> bool {
        !self.reset_event
            && self
                .reset_unacked
                .is_none_or(|at| avail.is_some_and(|now| now != at))
    }

    /// Whether the transport should run queue `queue` for the host's sake
    /// (after host events, or after a snapshot): the receive queue when
    /// packets wait for the guest, the transmitq when it waited for room
    /// that there now is, the event queue when the transport-reset event
    /// is due. Never while the device is held for a snapshot.
    pub fn has_work(&self, queue: usize) -> bool {
        !self.held
            && match queue {
                RX_QUEUE => self.mux.has_rx_work(),
                TX_QUEUE => self.tx_stalled && !self.mux.control_full(),
                EVENT_QUEUE => self.reset_event,
                _ => false,
            }
    }

    /// What the host thread waits for: `<uds>` while there is room for
    /// another connection, each handshake's socket, and each connection's
    /// socket as its credit and buffers allow.
    pub fn wait(&self) -> Wait {
        self.mux.wait()
    }

    /// Handles what the host thread saw: new host programs on `<uds>`,
    /// their `CONNECT` lines, readable and writable connection sockets,
    /// and expired deadlines.
    pub fn host_events(&mut self, events: &[(RawFd, Ready)]) {
        self.mux.host_events(events);
    }

    fn wake(&self) {
        if let Some(w) = &self.waker {
            w.wake();
        }
    }

    /// The header of a packet from the host side of `key`.
    fn header(&mut self, key: Key, op: u16, flags: u32, len: u32) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: self.cid,
            src_port: key.local,
            dst_port: key.peer,
            len,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: CONN_BUF_SIZE,
            fwd_cnt: self.mux.fwd_cnt_to_send(key, op),
        }
    }

    /// Fills receive buffers: control packets first, then data from the
    /// host sockets of ready connections, in turn, each within the guest's
    /// credit. Returns whether a buffer was used.
    fn deliver(&mut self, queue: &mut Queue, mem: &GuestMemoryMmap) -> Result<bool, VirtioError> {
        let mut used = false;
        while !self.held && self.mux.has_rx_work() {
            let start = queue.next_avail();
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let mut w = match Writer::new(mem, chain) {
                Ok(w) if w.available_bytes() >= HDR_LEN => w,
                Ok(_) | Err(_) => {
                    crate::warn_ratelimited!(
                        "virtio-vsock: a receive buffer is malformed or shorter than a header; skipped"
                    );
                    queue.add_used(mem, head, 0)?;
                    used = true;
                    continue;
                }
            };
            let len = if let Some(ctl) = self.mux.next_control() {
                let h = self.header(ctl.key, ctl.op, ctl.flags, 0);
                write_packet(&mut w, &h, &[])
            } else {
                let room = (w.available_bytes() - HDR_LEN).min(MAX_PAYLOAD);
                match self.mux.read_for_guest(room, &mut self.payload) {
                    Some((key, HostRead::Data(n))) => {
                        let h = self.header(key, op::RW, 0, n as u32);
                        write_packet(&mut w, &h, &self.payload[..n])
                    }
                    Some((key, HostRead::Eof)) => {
                        let h = self.header(key, op::SHUTDOWN, SHUTDOWN_SEND, 0);
                        write_packet(&mut w, &h, &[])
                    }
                    Some((_, HostRead::Nothing)) => {
                        queue.set_next_avail(start);
                        continue;
                    }
                    None => {
                        queue.set_next_avail(start);
                        break;
                    }
                }
            };
            match len {
                Ok(n) => queue.add_used(mem, head, n)?,
                Err(e) => {
                    crate::warn_ratelimited!("virtio-vsock: writing a receive buffer: {e}");
                    queue.add_used(mem, head, 0)?;
                }
            }
            used = true;
        }
        if used {
            self.wake();
        }
        Ok(used)
    }

    /// Takes the guest's packets. Stops (leaving the rest in the queue)
    /// while the control queue is full.
    fn transmit(&mut self, queue: &mut Queue, mem: &GuestMemoryMmap) -> Result<bool, VirtioError> {
        let mut used = false;
        if self.held {
            return Ok(false);
        }
        self.tx_stalled = false;
        while let Some(chain) = queue.iter(mem)?.next() {
            if self.mux.control_full() {
                queue.go_to_previous_position();
                self.tx_stalled = true;
                break;
            }
            let head = chain.head_index();
            match read_packet(chain, mem, &mut self.payload) {
                Ok(h) => self.handle(h),
                Err(why) => {
                    crate::warn_ratelimited!("virtio-vsock: transmit: {why}; packet dropped");
                    self.mux.counters.bad_packets += 1;
                }
            }
            queue.add_used(mem, head, 0)?;
            used = true;
        }
        if used {
            self.wake();
        }
        Ok(used)
    }

    /// One packet from the guest, its payload in `self.payload`: to the
    /// muxer if it goes from the guest to the host.
    fn handle(&mut self, h: Header) {
        if h.src_cid != self.cid || h.dst_cid != HOST_CID {
            crate::warn_ratelimited!(
                "virtio-vsock: a packet from CID {} to CID {} (the guest is {}, the host {HOST_CID}); dropped",
                h.src_cid,
                h.dst_cid,
                self.cid
            );
            self.mux.counters.bad_packets += 1;
            return;
        }
        self.mux.guest_packet(h, &self.payload);
    }

    /// Posts the transport-reset event if it is due and the driver has an
    /// event buffer.
    fn send_reset_event(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, VirtioError> {
        if !self.reset_event || self.held {
            return Ok(false);
        }
        let avail = queue.avail_idx(mem, Ordering::Acquire).map(|i| i.0);
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            return Ok(false);
        };
        let head = chain.head_index();
        let written = Writer::new(mem, chain)
            .map_err(|e| e.to_string())
            .and_then(|mut w| {
                w.write_all(&packet::EVENT_TRANSPORT_RESET.to_le_bytes())
                    .map_err(|e| e.to_string())
            });
        let len = match written {
            Ok(()) => {
                self.reset_event = false;
                // A driver whose available index cannot be read is not
                // waited for.
                self.reset_unacked = avail.ok();
                4
            }
            Err(e) => {
                crate::warn_ratelimited!("virtio-vsock: event buffer: {e}");
                0
            }
        };
        queue.add_used(mem, head, len)?;
        Ok(true)
    }
}

/// Writes a header and payload into a receive buffer; returns the bytes
/// written.
fn write_packet(w: &mut impl Write, h: &Header, payload: &[u8]) -> io::Result<u32> {
    w.write_all(&h.to_bytes())?;
    w.write_all(payload)?;
    Ok((HDR_LEN + payload.len()) as u32)
}

/// Reads a transmit chain: its header, and its payload into `buf`.
fn read_packet(
    chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    buf: &mut Vec<u8>,
) -> Result<Header, String> {
    let mut r = Reader::new(mem, chain).map_err(|e| format!("bad descriptor chain: {e}"))?;
    let avail = r.available_bytes();
    if avail < HDR_LEN {
        return Err(format!("{avail} bytes is shorter than a header"));
    }
    let mut hdr = [0u8; HDR_LEN];
    r.read_exact(&mut hdr)
        .map_err(|e| format!("reading the header: {e}"))?;
    let h = Header::parse(&hdr);
    let len = h.len as usize;
    if len > MAX_PAYLOAD || len > avail - HDR_LEN {
        return Err(format!(
            "a {len}-byte payload in a {avail}-byte buffer (at most {MAX_PAYLOAD})"
        ));
    }
    buf.resize(len, 0);
    r.read_exact(buf)
        .map_err(|e| format!("reading the payload: {e}"))?;
    Ok(h)
}

impl VirtioDevice for Vsock {
    const QUEUE_MAX_SIZES: &'static [u16] = &[QUEUE_SIZE; 3];

    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn name(&self) -> &'static str {
        "virtio-vsock"
    }

    fn features(&self) -> u64 {
        0
    }

    fn config_as_bytes(&self) -> &[u8] {
        &self.config
    }

    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        _features: u64,
    ) -> Result<bool, VirtioError> {
        match queue_index {
            RX_QUEUE => self.deliver(queue, mem),
            TX_QUEUE => self.transmit(queue, mem),
            EVENT_QUEUE => self.send_reset_event(queue, mem),
            _ => Ok(false),
        }
    }

    fn reset(&mut self) {
        self.reset_event = false;
        self.reset_unacked = None;
        self.mux.drop_connections();
        self.tx_stalled = false;
    }

    /// Holds the device: it writes nothing into guest RAM (bytes from host
    /// sockets wait in them, within each connection's credit; the
    /// transmitq is left alone). Packets complete inside `process_queue`,
    /// so nothing is in flight.
    fn prepare_save(&mut self) -> io::Result<()> {
        self.held = true;
        Ok(())
    }

    fn after_save(&mut self) {
        self.held = false;
    }
}

impl Persist for Vsock {
    type State = VsockState;
    type Args = VsockArgs;
    type Error = VirtioError;

    fn save(&self) -> VsockState {
        VsockState {
            cid: self.cid,
            next_local_port: Some(self.mux.next_local_port()),
        }
    }

    /// The device with the command line's CID (or the saved one), no
    /// connections, host-side ports from the saved next one, and the
    /// transport-reset event due.
    fn restore(args: VsockArgs, state: &VsockState) -> Result<Self, VirtioError> {
        let cid = args.cid.unwrap_or(state.cid);
        if !valid_guest_cid(cid) {
            return Err(VirtioError::InvalidState(format!(
                "vsock CID {cid} is not a guest CID (3 to {})",
                u32::MAX - 1
            )));
        }
        let mut dev = Vsock::new(cid, args.host);
        if let Some(port) = state.next_local_port {
            if !(super::FIRST_LOCAL_PORT..u32::MAX).contains(&port) {
                return Err(VirtioError::InvalidState(format!(
                    "vsock next host port {port} is not {} to {}",
                    super::FIRST_LOCAL_PORT,
                    u32::MAX - 1
                )));
            }
            dev.mux.set_next_local_port(port);
        }
        dev.reset_event = true;
        Ok(dev)
    }
}
