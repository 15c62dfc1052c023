//! The host side of the vsock device: Unix domain sockets, as Firecracker
//! lays them out ([`VsockHost`]: the VMM listens on `PATH` for host
//! programs, which then send `CONNECT <port>\n`, and a guest connection to
//! host port P connects to `PATH_P`). The muxer owns the connections and
//! the host programs still sending their `CONNECT` line; it tells the host
//! I/O thread what to wait for ([`Muxer::wait`]), decides which connection
//! a host event is for ([`Muxer::host_events`]), and takes the guest's
//! packets for the connections ([`Muxer::guest_packet`]). What it has for
//! the guest waits in a bounded queue of control packets and a turn of
//! connections whose host socket is readable, which the device drains into
//! the receive queue.

use super::connection::{AfterFlush, Conn, ControlPacket, GuestDataError, HostRead, Key, State};
use super::packet::{op, Header, TYPE_STREAM};
use crate::devices::virtio::host_io::{Interest, Ready, Wait, Watch};
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most connections at once (guest- and host-initiated); more are refused.
/// With [`super::CONN_BUF_SIZE`] this bounds the buffered bytes at 64 MiB.
pub const MAX_CONNECTIONS: usize = 256;
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
/// The longest `CONNECT <port>\n` line, bytes.
const CONNECT_LINE_MAX: usize = 32;

/// A host program that connected to `<uds>` and is sending its `CONNECT`
/// line.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

/// The listening socket at `PATH` and the prefix of the guest's
/// destinations (`PATH_P`). The socket file is removed by
/// [`VsockHost::remove_socket_file`] or on drop.
pub struct VsockHost {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file was removed.
    removed: bool,
}

impl VsockHost {
    /// Listens on `path`, mode 0600 ([`crate::host_socket::listen`]): a
    /// socket file left by a VMM that is gone (no one accepts on it) is
    /// replaced; one in use, or a file that is not a socket, is an error
    /// naming it.
    pub fn bind(path: &Path) -> io::Result<Self> {
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("--vsock-uds {}: {e}", path.display()));
        let listener = crate::host_socket::listen(path).map_err(named)?;
        listener.set_nonblocking(true).map_err(named)?;
        Ok(VsockHost {
            listener,
            path: path.to_path_buf(),
            removed: false,
        })
    }

    /// Removes the socket file (once): no host program can connect any
    /// more. The VM's end calls it; dropping does it too.
    pub fn remove_socket_file(&mut self) {
        if !std::mem::replace(&mut self.removed, true) {
            let _ = std::fs::remove_file(&self.path);
        }
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
        self.remove_socket_file();
    }
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

/// The connections, the host programs still handshaking, and what waits for
/// the guest.
pub(super) struct Muxer {
    pub(super) host: VsockHost,
    pub(super) conns: BTreeMap<Key, Conn>,
    handshakes: Vec<Handshake>,
    control: VecDeque<ControlPacket>,
    /// Connections whose host socket may have bytes for the guest, in turn.
    rx_ready: VecDeque<Key>,
    next_local_port: u32,
    pub(super) counters: VsockCounters,
}

impl Muxer {
    /// No connections yet; host programs connect to `host`.
    pub(super) fn new(host: VsockHost) -> Self {
        Muxer {
            host,
            conns: BTreeMap::new(),
            handshakes: Vec::new(),
            control: VecDeque::new(),
            rx_ready: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            counters: VsockCounters::default(),
        }
    }

    /// Open connections.
    pub(super) fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Bytes held for host sockets that are not reading, over all
    /// connections.
    pub(super) fn host_buffered_bytes(&self) -> usize {
        self.conns.values().map(|c| c.out.len()).sum()
    }

    /// Packets without payload waiting for receive buffers.
    pub(super) fn pending_control_packets(&self) -> usize {
        self.control.len()
    }

    /// Whether packets wait for the guest: control packets, or bytes of a
    /// connection whose host socket was readable.
    pub(super) fn has_rx_work(&self) -> bool {
        !self.control.is_empty() || !self.rx_ready.is_empty()
    }

    /// Whether the control queue is full ([`MAX_CONTROL`]): the device then
    /// takes no more transmit packets.
    pub(super) fn control_full(&self) -> bool {
        self.control.len() >= MAX_CONTROL
    }

    /// The next control packet for the guest.
    pub(super) fn next_control(&mut self) -> Option<ControlPacket> {
        self.control.pop_front()
    }

    /// Reads up to `room` bytes for the guest into `buf` from the next
    /// connection whose host socket was readable, in turn: after data the
    /// connection goes to the back of the turn; at end of file, or with
    /// nothing to read, it leaves the turn (the host thread puts it back
    /// once its socket is readable again). `None` if no connection is in
    /// turn.
    pub(super) fn read_for_guest(
        &mut self,
        room: usize,
        buf: &mut Vec<u8>,
    ) -> Option<(Key, HostRead)> {
        let key = *self.rx_ready.front()?;
        let read = match self.conns.get_mut(&key) {
            None => HostRead::Nothing,
            Some(c) => match c.read_for_guest(room, buf) {
                Ok(read) => read,
                Err(e) => {
                    // (Out of its turn below.)
                    tracing::debug!("virtio-vsock: port {}: host socket: {e}", key.local);
                    self.reset_conn(key);
                    HostRead::Nothing
                }
            },
        };
        match read {
            HostRead::Data(n) => {
                // In turn: the next ready connection goes next.
                self.rx_ready.rotate_left(1);
                if let Some(c) = self.conns.get_mut(&key) {
                    c.sent_to_guest(n);
                }
            }
            HostRead::Eof => {
                self.rx_ready.pop_front();
            }
            HostRead::Nothing => {
                self.rx_ready.pop_front();
                if let Some(c) = self.conns.get_mut(&key) {
                    c.rx_ready = false;
                }
            }
        }
        Some((key, read))
    }

    /// The `fwd_cnt` of a packet of operation `op` for connection `key`
    /// going to the guest now (0 for a connection that is gone).
    pub(super) fn fwd_cnt_to_send(&mut self, key: Key, op: u16) -> u32 {
        self.conns
            .get_mut(&key)
            .map_or(0, |c| c.fwd_cnt_to_send(op))
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
        self.control.push_back(ControlPacket { key, op, flags });
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
    pub(super) fn wait(&self) -> Wait {
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
    pub(super) fn host_events(&mut self, events: &[(RawFd, Ready)]) {
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

    /// The host-side port the next host-initiated connection gets (or the
    /// first free one after it).
    pub(super) fn next_local_port(&self) -> u32 {
        self.next_local_port
    }

    /// Goes on from host-side port `port` ([`FIRST_LOCAL_PORT`] to
    /// `u32::MAX - 1`, which the caller checks).
    pub(super) fn set_next_local_port(&mut self, port: u32) {
        self.next_local_port = port;
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

    /// After bytes left connection `key`'s buffer: credit for the guest,
    /// and the shutdowns that waited for the buffer to empty.
    fn after_flush(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        match c.after_flush() {
            AfterFlush::Close => {
                self.conns.remove(&key);
                self.queue_control(key, op::RST, 0);
            }
            AfterFlush::CreditUpdate => self.queue_control(key, op::CREDIT_UPDATE, 0),
            AfterFlush::Nothing => {}
        }
    }

    /// One packet from the guest (virtio 1.2 §5.10.6.4), whose CIDs the
    /// device checked.
    pub(super) fn guest_packet(&mut self, h: Header, payload: &[u8]) {
        let key = Key {
            local: h.dst_port,
            peer: h.src_port,
        };
        if h.kind != TYPE_STREAM {
            self.counters.bad_packets += 1;
            if h.op != op::RST {
                self.reset_conn(key);
            }
            return;
        }
        if let Some(c) = self.conns.get_mut(&key) {
            c.set_peer_credit(h.buf_alloc, h.fwd_cnt);
        }
        match h.op {
            op::REQUEST => self.guest_connect(key, &h),
            op::RESPONSE => {
                if self
                    .conns
                    .get_mut(&key)
                    .is_some_and(|c| c.accepted(key.local))
                {
                    self.counters.connections += 1;
                    self.flush_now(key);
                } else {
                    self.reset_conn(key);
                }
            }
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
                c.guest_shutdown(h.flags);
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
                c.set_peer_credit(h.buf_alloc, h.fwd_cnt);
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
        match c.guest_data(payload) {
            Ok(()) => self.flush_now(key),
            Err(GuestDataError::NotOpen) => self.reset_conn(key),
            Err(GuestDataError::PastCredit) => {
                crate::warn_ratelimited!(
                    "virtio-vsock: the guest sent past its credit on port {}; connection reset",
                    key.local
                );
                self.counters.bad_packets += 1;
                self.reset_conn(key);
            }
        }
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

    /// Drops every connection and handshake (their host sockets close).
    pub(super) fn drop_connections(&mut self) {
        self.conns.clear();
        self.handshakes.clear();
        self.control.clear();
        self.rx_ready.clear();
    }
}

/// A host program's handshake line, `CONNECT <port>` (decimal digits, a
/// `\r` allowed at the end; the `\n` already taken off; untrusted, at most
/// 32 bytes as read) → the port; `None` for anything else.
pub fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let port = s.strip_prefix("CONNECT ")?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}
