//! One vsock connection: its host socket, its state (connecting,
//! established, the shutdowns), the bytes it holds for the host socket, and
//! the credit of both sides (virtio 1.2 §5.10.6.3).
//!
//! Towards the host, a connection advertises [`CONN_BUF_SIZE`] and holds at
//! most that while its host socket is full; a guest that sends past its
//! credit is reset. Towards the guest, its host socket is read only while
//! the guest has credit for it.

use super::packet::{op, SHUTDOWN_RCV, SHUTDOWN_SEND};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// The receive buffer each connection advertises (`buf_alloc`), bytes: what
/// the device holds for a host socket that is not reading.
pub const CONN_BUF_SIZE: u32 = 256 << 10;
/// A CREDIT_UPDATE goes out once this many forwarded bytes are unannounced.
const CREDIT_UPDATE_THRESHOLD: u32 = CONN_BUF_SIZE / 4;

/// A connection's two ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Key {
    /// The host side's port.
    pub(super) local: u32,
    /// The guest side's port.
    pub(super) peer: u32,
}

/// A packet without payload for the guest (a response, a reset, a credit
/// update, a request): the header is built when it is delivered, with the
/// connection's credit at that time.
#[derive(Clone, Copy, Debug)]
pub(super) struct ControlPacket {
    pub(super) key: Key,
    pub(super) op: u16,
    pub(super) flags: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Host-initiated: the REQUEST went to the guest; its answer is due by
    /// the deadline.
    Connecting(Instant),
    Established,
}

/// What a read of the host socket for the guest gave.
pub(super) enum HostRead {
    /// `n` bytes are in the buffer.
    Data(usize),
    /// The host program will send no more.
    Eof,
    /// Nothing now (no credit, would block, or the connection is gone).
    Nothing,
}

/// What the device does after bytes left a connection's buffer
/// ([`Conn::after_flush`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterFlush {
    /// The guest shut down both directions and everything went out: remove
    /// the connection and reset it.
    Close,
    /// Tell the guest its new credit (a CREDIT_UPDATE).
    CreditUpdate,
    /// Nothing to tell.
    Nothing,
}

/// One connection: its host socket, and the credit of both sides.
pub(super) struct Conn {
    pub(super) stream: UnixStream,
    pub(super) state: State,
    /// Bytes for the host socket that it has not taken yet: the `OK` line
    /// (its first `ok_len` bytes), then at most [`CONN_BUF_SIZE`] of guest
    /// data.
    pub(super) out: VecDeque<u8>,
    ok_len: usize,
    /// Guest bytes written to the host socket (wrapping).
    fwd_cnt: u32,
    /// The `fwd_cnt` last told to the guest.
    fwd_cnt_sent: u32,
    /// A CREDIT_UPDATE for this connection is queued.
    pub(super) credit_update_queued: bool,
    /// The guest's receive buffer and how much of it it has consumed.
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Bytes sent to the guest (wrapping).
    rx_cnt: u32,
    /// The host socket may have bytes for the guest (in the device's turn
    /// of ready connections).
    pub(super) rx_ready: bool,
    /// The host socket reached end of file (the guest was told).
    host_eof: bool,
    /// The guest will send no more: shut the host socket's write side once
    /// `out` is empty.
    guest_done_sending: bool,
    /// The guest shut down both directions: reset once `out` is empty.
    closing: bool,
}

impl Conn {
    pub(super) fn new(stream: UnixStream, state: State) -> Self {
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

    /// The guest's credit as a packet from it states it (`buf_alloc`,
    /// `fwd_cnt`).
    pub(super) fn set_peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
    }

    /// Bytes the guest can take now (§5.10.6.3).
    fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Whether the host thread should read its socket.
    pub(super) fn wants_read(&self) -> bool {
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

    /// The guest accepted this host-initiated connection: established, with
    /// the `OK <local>` line queued for the host program. `false` if the
    /// connection was not waiting for that answer.
    pub(super) fn accepted(&mut self, local: u32) -> bool {
        if !matches!(self.state, State::Connecting(_)) {
            return false;
        }
        self.state = State::Established;
        let line = format!("OK {local}\n");
        self.ok_len = line.len();
        self.out.extend(line.bytes());
        true
    }

    /// Guest data for the host socket, held until it takes it. An error
    /// (the connection must be reset) if the connection takes no data from
    /// the guest, or the guest sent past its credit.
    pub(super) fn guest_data(&mut self, payload: &[u8]) -> Result<(), GuestDataError> {
        if self.state != State::Established || self.guest_done_sending {
            return Err(GuestDataError::NotOpen);
        }
        // What `out` holds of the guest's, the guest had credit for.
        if self.guest_bytes_held() + payload.len() > CONN_BUF_SIZE as usize {
            return Err(GuestDataError::PastCredit);
        }
        self.out.extend(payload);
        Ok(())
    }

    /// A SHUTDOWN from the guest with `flags`.
    pub(super) fn guest_shutdown(&mut self, flags: u32) {
        if flags & SHUTDOWN_SEND != 0 {
            self.guest_done_sending = true;
        }
        if flags & (SHUTDOWN_SEND | SHUTDOWN_RCV) == SHUTDOWN_SEND | SHUTDOWN_RCV {
            self.closing = true;
        }
    }

    /// Writes what `out` holds to the host socket until it would block,
    /// counting the guest bytes in `fwd_cnt`.
    pub(super) fn flush(&mut self) -> io::Result<()> {
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

    /// After bytes left `out`: the shutdowns that waited for `out` to
    /// empty, and whether the guest is due a CREDIT_UPDATE (then marked
    /// queued).
    pub(super) fn after_flush(&mut self) -> AfterFlush {
        if self.out.is_empty() {
            if self.closing {
                return AfterFlush::Close;
            }
            if self.guest_done_sending {
                let _ = self.stream.shutdown(std::net::Shutdown::Write);
            }
        }
        if !self.credit_update_queued
            && self.fwd_cnt.wrapping_sub(self.fwd_cnt_sent) >= CREDIT_UPDATE_THRESHOLD
        {
            self.credit_update_queued = true;
            return AfterFlush::CreditUpdate;
        }
        AfterFlush::Nothing
    }

    /// The `fwd_cnt` of a packet of operation `op` going to the guest now,
    /// which is then what the guest was told.
    pub(super) fn fwd_cnt_to_send(&mut self, op: u16) -> u32 {
        self.fwd_cnt_sent = self.fwd_cnt;
        if op == op::CREDIT_UPDATE {
            self.credit_update_queued = false;
        }
        self.fwd_cnt
    }

    /// Reads up to `room` bytes, within the guest's credit, from the host
    /// socket into `buf`. An error is the socket's: the connection must be
    /// reset.
    pub(super) fn read_for_guest(
        &mut self,
        room: usize,
        buf: &mut Vec<u8>,
    ) -> io::Result<HostRead> {
        let n = room.min(self.peer_credit() as usize);
        if n == 0 || self.state != State::Established || self.closing || self.host_eof {
            return Ok(HostRead::Nothing);
        }
        buf.resize(n, 0);
        loop {
            return match self.stream.read(&mut buf[..n]) {
                Ok(0) => {
                    self.host_eof = true;
                    self.rx_ready = false;
                    Ok(HostRead::Eof)
                }
                Ok(n) => Ok(HostRead::Data(n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(HostRead::Nothing),
                Err(e) => Err(e),
            };
        }
    }

    /// `n` more bytes went to the guest.
    pub(super) fn sent_to_guest(&mut self, n: usize) {
        self.rx_cnt = self.rx_cnt.wrapping_add(n as u32);
    }
}

/// Why a connection refused guest data ([`Conn::guest_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GuestDataError {
    /// Not established, or the guest said it would send no more.
    NotOpen,
    /// More than the guest had credit for.
    PastCredit,
}
