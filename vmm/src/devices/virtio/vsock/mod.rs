//! virtio-vsock (virtio 1.2 §5.10): stream sockets between the guest and
//! host programs, carried over Unix domain sockets on the host.
//!
//! Three queues: rx (0, device to driver), tx (1) and event (2). The
//! configuration space is the guest's CID (le64). No features beyond the
//! transport's: stream sockets only.
//!
//! The host end follows Firecracker's convention ([`host_end`]):
//! - a guest connection to host port P connects to the Unix socket
//!   `<uds>_P`;
//! - a host program connects to `<uds>`, writes `CONNECT P\n`, and once the
//!   guest has accepted on port P reads `OK <local port>\n`; after that the
//!   socket carries the stream.
//!
//! Flow control is the spec's credit scheme (§5.10.6.3). Towards the host,
//! each connection advertises [`CONN_BUF_SIZE`] and buffers at most that
//! while its host socket is full; a guest that sends past its credit is
//! reset. Towards the guest, a connection's host socket is read only while
//! the guest has credit for it and the driver has a receive buffer. So a
//! slow reader on either side stalls its own connection only.
//!
//! Guest memory is written only through vm-memory (dirty-tracked). The
//! connections are host state: a snapshot does not keep them, and a
//! restored device sends the transport-reset event (§5.10.6.6), after
//! which the guest drops its connections and re-reads its CID.

use super::host_io::{Interest, Ready, Wait, Waker, Watch};
use super::{VirtioDevice, VirtioError};
use crate::devices::Persist;
use crate::memory::GuestMemoryMmap;
use packet::{op, Header, HDR_LEN, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{Queue, QueueOwnedT, QueueT, Reader, Writer};

pub mod host_end;
pub mod packet;

pub use host_end::VsockHost;

/// Index of the receive queue (device to driver).
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue (driver to device).
pub const TX_QUEUE: usize = 1;
/// Index of the event queue.
pub const EVENT_QUEUE: usize = 2;
/// Size of each queue (QueueNumMax).
pub const QUEUE_SIZE: u16 = 256;
/// The receive buffer each connection advertises (`buf_alloc`), bytes: what
/// the device holds for a host socket that is not reading.
pub const CONN_BUF_SIZE: u32 = 256 << 10;
/// Most connections at once (guest- and host-initiated); more are refused.
/// With [`CONN_BUF_SIZE`] this bounds the buffered bytes at 64 MiB.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest payload of one packet, bytes (Linux's
/// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE); a longer one is refused.
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Host programs that connected to `<uds>` but have not finished their
/// `CONNECT` line, at most.
pub const MAX_HANDSHAKES: usize = 64;
/// How long a host program has to send its `CONNECT` line, and the guest
/// to accept the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Lowest host-side port given to host-initiated connections (the guest
/// sees it as the peer's port); ports below are left to host services.
pub const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// Packets without payload (responses, resets, credit updates) queued for
/// the guest, at most; while full, the device takes no more transmit
/// packets (a driver that posts no receive buffers stalls only itself).
pub const MAX_CONTROL: usize = 2 * MAX_CONNECTIONS + 64;
/// A CREDIT_UPDATE goes out once this many forwarded bytes are unannounced.
const CREDIT_UPDATE_THRESHOLD: u32 = CONN_BUF_SIZE / 4;

/// `struct virtio_vsock_config`: le64 guest_cid.
const CONFIG_LEN: usize = 8;

/// A connection's two ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    /// The host side's port.
    local: u32,
    /// The guest side's port.
    peer: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Host-initiated: the REQUEST went to the guest; its answer is due by
    /// the deadline.
    Connecting(Instant),
    Established,
}

/// One connection: its host socket, and the credit of both sides.
struct Conn {
    stream: UnixStream,
    state: State,
    /// Bytes for the host socket that it has not taken yet: the `OK` line
    /// (its first `ok_len` bytes), then at most [`CONN_BUF_SIZE`] of guest
    /// data.
    out: VecDeque<u8>,
    ok_len: usize,
    /// Guest bytes written to the host socket (wrapping).
    fwd_cnt: u32,
    /// The `fwd_cnt` last told to the guest.
    fwd_cnt_sent: u32,
    /// A CREDIT_UPDATE for this connection is queued.
    credit_update_queued: bool,
    /// The guest's receive buffer and how much of it it has consumed.
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Bytes sent to the guest (wrapping).
    rx_cnt: u32,
    /// The host socket may have bytes for the guest (in `rx_ready`).
    rx_ready: bool,
    /// The host socket reached end of file (the guest was told).
    host_eof: bool,
    /// The guest will send no more: shut the host socket's write side once
    /// `out` is empty.
    guest_done_sending: bool,
    /// The guest shut down both directions: reset once `out` is empty.
    closing: bool,
}

impl Conn {
    fn new(stream: UnixStream, state: State) -> Self {
        Conn {
            stream,
            state,
            out: VecDeque::new(),
            ok_len: 0,
            fwd_cnt: 0,
            fwd_cnt_sent: 0,
            credit_update_queued: false,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            rx_cnt: 0,
            rx_ready: false,
            host_eof: false,
            guest_done_sending: false,
            closing: false,
        }
    }

    /// Bytes the guest can take now (§5.10.6.3).
    fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Whether the host thread should read its socket.
    fn wants_read(&self) -> bool {
        self.state == State::Established
            && !self.rx_ready
            && !self.host_eof
            && !self.closing
            && self.peer_credit() > 0
    }

    /// Guest bytes waiting for the host socket.
    fn guest_bytes_held(&self) -> usize {
        self.out.len() - self.ok_len
    }

    /// Writes what `out` holds to the host socket until it would block,
    /// counting the guest bytes in `fwd_cnt`.
    fn flush(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            let (a, _) = self.out.as_slices();
            match self.stream.write(a) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.out.drain(..n);
                    let ok = n.min(self.ok_len);
                    self.ok_len -= ok;
                    self.fwd_cnt = self.fwd_cnt.wrapping_add((n - ok) as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A host program that connected to `<uds>` and is sending its `CONNECT`
/// line.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

/// The longest `CONNECT <port>\n` line, bytes.
const CONNECT_LINE_MAX: usize = 32;

/// A packet without payload for the guest: the header is built when it
/// is delivered (with the connection's credit at that time).
#[derive(Clone, Copy, Debug)]
struct Control {
    key: Key,
    op: u16,
    flags: u32,
}

/// Counters, for the log and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VsockCounters {
    /// Connections made (either side).
    pub connections: u64,
    /// Connections refused or reset by the device.
    pub resets: u64,
    /// Packets from the guest that were malformed (dropped or answered
    /// with a reset).
    pub bad_packets: u64,
}

/// A virtio vsock device.
pub struct Vsock {
    cid: u64,
    config: [u8; CONFIG_LEN],
    host: VsockHost,
    conns: BTreeMap<Key, Conn>,
    handshakes: Vec<Handshake>,
    control: VecDeque<Control>,
    /// Connections whose host socket may have bytes for the guest, in turn.
    rx_ready: VecDeque<Key>,
    next_local_port: u32,
    /// The transport-reset event is due (after a restore).
    reset_event: bool,
    /// The device writes nothing into guest RAM (a snapshot is being taken).
    held: bool,
    /// The transmitq waits for room in `control`.
    tx_stalled: bool,
    waker: Option<Waker>,
    counters: VsockCounters,
    payload: Vec<u8>,
}

/// The saved state: the CID (connections are host state and are not
/// kept). The negotiated features are the transport's; a state from before
/// that, which also holds them as `acked_features`, reads the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// The guest's CID.
    pub cid: u64,
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
            host,
            conns: BTreeMap::new(),
            handshakes: Vec::new(),
            control: VecDeque::new(),
            rx_ready: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            reset_event: false,
            held: false,
            tx_stalled: false,
            waker: None,
            counters: VsockCounters::default(),
            payload: Vec::new(),
        }
    }

    /// The guest's CID.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// The counters.
    pub fn counters(&self) -> VsockCounters {
        self.counters
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Bytes held for host sockets that are not reading, over all
    /// connections (at most [`MAX_CONNECTIONS`] × [`CONN_BUF_SIZE`], plus
    /// the `OK` lines).
    pub fn host_buffered_bytes(&self) -> usize {
        self.conns.values().map(|c| c.out.len()).sum()
    }

    /// Packets without payload waiting for receive buffers (at most
    /// [`MAX_CONTROL`]).
    pub fn pending_control_packets(&self) -> usize {
        self.control.len()
    }

    /// Who to wake when what the host thread should wait for changes.
    pub fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
    }

    /// Whether the transport should run queue `queue` for the host's sake
    /// (after host events, or after a snapshot): the receive queue when
    /// packets wait for the guest, the transmitq when it waited for room
    /// that there now is, the event queue when the transport-reset event
    /// is due. Never while the device is held for a snapshot.
    pub fn has_work(&self, queue: usize) -> bool {
        !self.held
            && match queue {
                RX_QUEUE => self.has_rx_work(),
                TX_QUEUE => self.tx_stalled && self.control.len() < MAX_CONTROL,
                EVENT_QUEUE => self.reset_event,
                _ => false,
            }
    }

    /// Whether the receive queue has something to deliver.
    fn has_rx_work(&self) -> bool {
        !self.control.is_empty() || !self.rx_ready.is_empty()
    }

    fn wake(&self) {
        if let Some(w) = &self.waker {
            w.wake();
        }
    }

    /// Queues a packet without payload for the guest. While the driver
    /// posts no receive buffers the queue stops at [`MAX_CONTROL`] and
    /// later packets are dropped: the transmitq stops before it fills, so
    /// only the host side's are (a host connection's request then times
    /// out; a credit update goes out with the next one).
    fn queue_control(&mut self, key: Key, op: u16, flags: u32) {
        if self.control.len() >= MAX_CONTROL {
            crate::warn_ratelimited!(
                "virtio-vsock: the driver takes no packets; operation {op} for port {} dropped",
                key.peer
            );
            if let Some(c) = self.conns.get_mut(&key) {
                c.credit_update_queued = false;
            }
            return;
        }
        self.control.push_back(Control { key, op, flags });
    }

    /// Resets connection `key` (if open) and tells the guest.
    fn reset_conn(&mut self, key: Key) {
        self.conns.remove(&key);
        self.counters.resets += 1;
        self.queue_control(key, op::RST, 0);
    }

    /// What the host thread waits for: `<uds>` while there is room for
    /// another connection, each handshake's socket, and each connection's
    /// socket as its credit and buffers allow.
    pub fn wait(&self) -> Wait {
        let mut watches = Vec::with_capacity(1 + self.handshakes.len() + self.conns.len());
        if self.conns.len() + self.handshakes.len() < MAX_CONNECTIONS
            && self.handshakes.len() < MAX_HANDSHAKES
        {
            watches.push(Watch {
                fd: self.host.listener_fd(),
                interest: Interest {
                    read: true,
                    write: false,
                },
            });
        }
        let mut deadline: Option<Instant> = None;
        let mut earliest = |d: Instant| {
            deadline = Some(deadline.map_or(d, |e: Instant| e.min(d)));
        };
        for h in &self.handshakes {
            earliest(h.deadline);
            watches.push(Watch {
                fd: h.stream.as_raw_fd(),
                interest: Interest {
                    read: true,
                    write: false,
                },
            });
        }
        for c in self.conns.values() {
            if let State::Connecting(d) = c.state {
                earliest(d);
            }
            let interest = Interest {
                read: c.wants_read(),
                write: !c.out.is_empty(),
            };
            if interest != Interest::default() {
                watches.push(Watch {
                    fd: c.stream.as_raw_fd(),
                    interest,
                });
            }
        }
        Wait { watches, deadline }
    }

    /// Handles what the host thread saw: new host programs on `<uds>`,
    /// their `CONNECT` lines, readable and writable connection sockets,
    /// and expired deadlines.
    pub fn host_events(&mut self, events: &[(RawFd, Ready)]) {
        let now = Instant::now();
        for &(fd, ready) in events {
            if fd == self.host.listener_fd() {
                self.accept();
            } else if let Some(i) = self
                .handshakes
                .iter()
                .position(|h| h.stream.as_raw_fd() == fd)
            {
                self.read_connect_line(i);
            } else if let Some((&key, _)) =
                self.conns.iter().find(|(_, c)| c.stream.as_raw_fd() == fd)
            {
                self.conn_ready(key, ready);
            }
        }
        // Expired handshakes and unanswered requests.
        self.handshakes.retain(|h| {
            let live = h.deadline > now;
            if !live {
                crate::warn_ratelimited!(
                    "virtio-vsock: a host program sent no CONNECT line in time; closed"
                );
            }
            live
        });
        let expired: Vec<Key> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.state, State::Connecting(d) if d <= now))
            .map(|(&k, _)| k)
            .collect();
        for key in expired {
            crate::warn_ratelimited!(
                "virtio-vsock: the guest did not answer a connection to port {} in time; closed",
                key.peer
            );
            self.reset_conn(key);
        }
    }

    fn accept(&mut self) {
        while self.handshakes.len() < MAX_HANDSHAKES
            && self.conns.len() + self.handshakes.len() < MAX_CONNECTIONS
        {
            match self.host.accept() {
                Ok(Some(stream)) => self.handshakes.push(Handshake {
                    stream,
                    line: Vec::new(),
                    deadline: Instant::now() + CONNECT_TIMEOUT,
                }),
                Ok(None) => break,
                Err(e) => {
                    crate::warn_ratelimited!("virtio-vsock: accepting on the host socket: {e}");
                    break;
                }
            }
        }
    }

    /// Reads handshake `i`'s line a byte at a time (what follows it belongs
    /// to the connection).
    fn read_connect_line(&mut self, i: usize) {
        let h = &mut self.handshakes[i];
        let mut byte = [0u8; 1];
        loop {
            match h.stream.read(&mut byte) {
                Ok(0) => {
                    self.handshakes.swap_remove(i);
                    return;
                }
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) if h.line.len() < CONNECT_LINE_MAX => h.line.push(byte[0]),
                Ok(_) => {
                    crate::warn_ratelimited!(
                        "virtio-vsock: a host program's CONNECT line is too long; closed"
                    );
                    self.handshakes.swap_remove(i);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.handshakes.swap_remove(i);
                    return;
                }
            }
        }
        let h = self.handshakes.swap_remove(i);
        let Some(port) = parse_connect_line(&h.line) else {
            crate::warn_ratelimited!(
                "virtio-vsock: a host program sent {:?}, not `CONNECT <port>`; closed",
                String::from_utf8_lossy(&h.line)
            );
            return;
        };
        if self.conns.len() >= MAX_CONNECTIONS {
            crate::warn_ratelimited!(
                "virtio-vsock: {MAX_CONNECTIONS} connections are open; a host connection to port {port} refused"
            );
            return;
        }
        let Some(local) = self.free_local_port(port) else {
            return;
        };
        let key = Key { local, peer: port };
        self.conns.insert(
            key,
            Conn::new(
                h.stream,
                State::Connecting(Instant::now() + CONNECT_TIMEOUT),
            ),
        );
        self.queue_control(key, op::REQUEST, 0);
    }

    /// A host-side port no connection to guest port `peer` uses.
    fn free_local_port(&mut self, peer: u32) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS {
            let p = self.next_local_port;
            self.next_local_port = if p == u32::MAX - 1 {
                FIRST_LOCAL_PORT
            } else {
                p + 1
            };
            if !self.conns.contains_key(&Key { local: p, peer }) {
                return Some(p);
            }
        }
        None
    }

    fn conn_ready(&mut self, key: Key, ready: Ready) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if ready.writable || (ready.hung_up && !c.out.is_empty()) {
            if let Err(e) = c.flush() {
                tracing::debug!("virtio-vsock: port {}: host socket: {e}", key.local);
                self.reset_conn(key);
                return;
            }
            self.after_flush(key);
        }
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if ready.readable && c.wants_read() {
            c.rx_ready = true;
            self.rx_ready.push_back(key);
        }
    }

    /// After bytes left `out`: credit for the guest, and the shutdowns
    /// that waited for `out` to empty.
    fn after_flush(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if c.out.is_empty() {
            if c.closing {
                self.conns.remove(&key);
                self.queue_control(key, op::RST, 0);
                return;
            }
            if c.guest_done_sending {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
        }
        if !c.credit_update_queued
            && c.fwd_cnt.wrapping_sub(c.fwd_cnt_sent) >= CREDIT_UPDATE_THRESHOLD
        {
            c.credit_update_queued = true;
            self.queue_control(key, op::CREDIT_UPDATE, 0);
        }
    }

    /// The header of a packet from the host side of `key`.
    fn header(&mut self, key: Key, op: u16, flags: u32, len: u32) -> Header {
        let fwd_cnt = match self.conns.get_mut(&key) {
            Some(c) => {
                c.fwd_cnt_sent = c.fwd_cnt;
                if op == op::CREDIT_UPDATE {
                    c.credit_update_queued = false;
                }
                c.fwd_cnt
            }
            None => 0,
        };
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
            fwd_cnt,
        }
    }

    /// Fills receive buffers: control packets first, then data from the
    /// host sockets of ready connections, in turn, each within the guest's
    /// credit. Returns whether a buffer was used.
    fn deliver(&mut self, queue: &mut Queue, mem: &GuestMemoryMmap) -> Result<bool, VirtioError> {
        let mut used = false;
        while !self.held && self.has_rx_work() {
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
            let len = if let Some(ctl) = self.control.pop_front() {
                let h = self.header(ctl.key, ctl.op, ctl.flags, 0);
                write_packet(&mut w, &h, &[])
            } else {
                let key = self.rx_ready[0];
                let room = (w.available_bytes() - HDR_LEN).min(MAX_PAYLOAD);
                match self.read_host(key, room) {
                    HostRead::Data(n) => {
                        // In turn: the next ready connection goes next.
                        self.rx_ready.rotate_left(1);
                        let h = self.header(key, op::RW, 0, n as u32);
                        if let Some(c) = self.conns.get_mut(&key) {
                            c.rx_cnt = c.rx_cnt.wrapping_add(n as u32);
                        }
                        let payload = std::mem::take(&mut self.payload);
                        let r = write_packet(&mut w, &h, &payload[..n]);
                        self.payload = payload;
                        r
                    }
                    HostRead::Eof => {
                        self.rx_ready.pop_front();
                        let h = self.header(key, op::SHUTDOWN, SHUTDOWN_SEND, 0);
                        write_packet(&mut w, &h, &[])
                    }
                    HostRead::Nothing => {
                        self.rx_ready.pop_front();
                        if let Some(c) = self.conns.get_mut(&key) {
                            c.rx_ready = false;
                        }
                        queue.set_next_avail(start);
                        continue;
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

    /// Reads up to `room` bytes (within the guest's credit) from the host
    /// socket of `key` into `self.payload`.
    fn read_host(&mut self, key: Key, room: usize) -> HostRead {
        let Some(c) = self.conns.get_mut(&key) else {
            return HostRead::Nothing;
        };
        let n = room.min(c.peer_credit() as usize);
        if n == 0 || c.state != State::Established || c.closing || c.host_eof {
            return HostRead::Nothing;
        }
        self.payload.resize(n, 0);
        loop {
            return match c.stream.read(&mut self.payload[..n]) {
                Ok(0) => {
                    c.host_eof = true;
                    c.rx_ready = false;
                    HostRead::Eof
                }
                Ok(n) => HostRead::Data(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => HostRead::Nothing,
                Err(e) => {
                    // (The caller takes `key` out of its turn.)
                    tracing::debug!("virtio-vsock: port {}: host socket: {e}", key.local);
                    self.reset_conn(key);
                    HostRead::Nothing
                }
            };
        }
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
            if self.control.len() >= MAX_CONTROL {
                queue.go_to_previous_position();
                self.tx_stalled = true;
                break;
            }
            let head = chain.head_index();
            match read_packet(chain, mem, &mut self.payload) {
                Ok(h) => {
                    let payload = std::mem::take(&mut self.payload);
                    self.handle(h, &payload);
                    self.payload = payload;
                }
                Err(why) => {
                    crate::warn_ratelimited!("virtio-vsock: transmit: {why}; packet dropped");
                    self.counters.bad_packets += 1;
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

    /// One packet from the guest (virtio 1.2 §5.10.6.4).
    fn handle(&mut self, h: Header, payload: &[u8]) {
        let key = Key {
            local: h.dst_port,
            peer: h.src_port,
        };
        if h.src_cid != self.cid || h.dst_cid != HOST_CID {
            crate::warn_ratelimited!(
                "virtio-vsock: a packet from CID {} to CID {} (the guest is {}, the host {HOST_CID}); dropped",
                h.src_cid,
                h.dst_cid,
                self.cid
            );
            self.counters.bad_packets += 1;
            return;
        }
        if h.kind != TYPE_STREAM {
            self.counters.bad_packets += 1;
            if h.op != op::RST {
                self.reset_conn(key);
            }
            return;
        }
        if let Some(c) = self.conns.get_mut(&key) {
            c.peer_buf_alloc = h.buf_alloc;
            c.peer_fwd_cnt = h.fwd_cnt;
        }
        match h.op {
            op::REQUEST => self.guest_connect(key, &h),
            op::RESPONSE => match self.conns.get_mut(&key) {
                Some(c) if matches!(c.state, State::Connecting(_)) => {
                    c.state = State::Established;
                    let line = format!("OK {}\n", key.local);
                    c.ok_len = line.len();
                    c.out.extend(line.bytes());
                    self.counters.connections += 1;
                    self.flush_now(key);
                }
                _ => self.reset_conn(key),
            },
            op::RW => self.guest_data(key, payload),
            op::CREDIT_UPDATE => {}
            op::CREDIT_REQUEST => {
                if let Some(c) = self.conns.get_mut(&key) {
                    if !c.credit_update_queued {
                        c.credit_update_queued = true;
                        self.queue_control(key, op::CREDIT_UPDATE, 0);
                    }
                } else {
                    self.reset_conn(key);
                }
            }
            op::SHUTDOWN => {
                let Some(c) = self.conns.get_mut(&key) else {
                    self.reset_conn(key);
                    return;
                };
                if h.flags & SHUTDOWN_SEND != 0 {
                    c.guest_done_sending = true;
                }
                if h.flags & (SHUTDOWN_SEND | SHUTDOWN_RCV) == SHUTDOWN_SEND | SHUTDOWN_RCV {
                    c.closing = true;
                }
                self.after_flush(key);
            }
            op::RST => {
                self.conns.remove(&key);
            }
            other => {
                crate::warn_ratelimited!(
                    "virtio-vsock: unknown operation {other}; connection reset"
                );
                self.counters.bad_packets += 1;
                self.reset_conn(key);
            }
        }
    }

    /// The guest connects to host port `key.local`: to `<uds>_<port>`.
    fn guest_connect(&mut self, key: Key, h: &Header) {
        if self.conns.contains_key(&key) {
            crate::warn_ratelimited!(
                "virtio-vsock: a second request for guest port {} to host port {}; reset",
                key.peer,
                key.local
            );
            self.reset_conn(key);
            return;
        }
        if self.conns.len() + self.handshakes.len() >= MAX_CONNECTIONS {
            crate::warn_ratelimited!(
                "virtio-vsock: {MAX_CONNECTIONS} connections are open; a guest connection to port {} refused",
                key.local
            );
            self.reset_conn(key);
            return;
        }
        match self.host.connect(key.local) {
            Ok(stream) => {
                let mut c = Conn::new(stream, State::Established);
                c.peer_buf_alloc = h.buf_alloc;
                c.peer_fwd_cnt = h.fwd_cnt;
                self.conns.insert(key, c);
                self.counters.connections += 1;
                self.queue_control(key, op::RESPONSE, 0);
            }
            Err(e) => {
                tracing::debug!("virtio-vsock: guest connection to port {}: {e}", key.local);
                self.reset_conn(key);
            }
        }
    }

    /// Guest data for connection `key`.
    fn guest_data(&mut self, key: Key, payload: &[u8]) {
        let Some(c) = self.conns.get_mut(&key) else {
            self.reset_conn(key);
            return;
        };
        if c.state != State::Established || c.guest_done_sending {
            self.reset_conn(key);
            return;
        }
        // What `out` holds of the guest's, the guest had credit for.
        if c.guest_bytes_held() + payload.len() > CONN_BUF_SIZE as usize {
            crate::warn_ratelimited!(
                "virtio-vsock: the guest sent past its credit on port {}; connection reset",
                key.local
            );
            self.counters.bad_packets += 1;
            self.reset_conn(key);
            return;
        }
        c.out.extend(payload);
        self.flush_now(key);
    }

    /// Writes what connection `key` holds for its host socket now; what
    /// does not fit waits for the host thread (woken after the queue runs).
    fn flush_now(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if let Err(e) = c.flush() {
            tracing::debug!("virtio-vsock: port {}: host socket: {e}", key.local);
            self.reset_conn(key);
            return;
        }
        self.after_flush(key);
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

    /// Drops every connection and handshake (their host sockets close).
    fn drop_connections(&mut self) {
        self.conns.clear();
        self.handshakes.clear();
        self.control.clear();
        self.rx_ready.clear();
        self.tx_stalled = false;
    }
}

enum HostRead {
    /// `n` bytes are in `payload`.
    Data(usize),
    /// The host program will send no more.
    Eof,
    /// Nothing now (no credit, would block, or the connection is gone).
    Nothing,
}

/// `CONNECT <port>` (decimal) → the port.
fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let port = s.strip_prefix("CONNECT ")?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
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
        self.drop_connections();
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
        VsockState { cid: self.cid }
    }

    /// The device with the command line's CID (or the saved one), no
    /// connections, and the transport-reset event due.
    fn restore(args: VsockArgs, state: &VsockState) -> Result<Self, VirtioError> {
        let cid = args.cid.unwrap_or(state.cid);
        if !valid_guest_cid(cid) {
            return Err(VirtioError::InvalidState(format!(
                "vsock CID {cid} is not a guest CID (3 to {})",
                u32::MAX - 1
            )));
        }
        let mut dev = Vsock::new(cid, args.host);
        dev.reset_event = true;
        Ok(dev)
    }
}

#[cfg(test)]
pub(crate) mod tests;
