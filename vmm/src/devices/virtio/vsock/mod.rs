//! virtio-vsock (virtio 1.2 §5.10): stream sockets between the guest and
//! host programs, carried over Unix domain sockets on the host.
//!
//! Three queues: rx (0, device to driver), tx (1) and event (2). The
//! configuration space is the guest's CID (le64). No features beyond the
//! transport's: stream sockets only.
//!
//! The host end follows Firecracker's convention ([`VsockHost`]):
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

//! Modules: [`device`] (the virtio device: queues and saved state),
//! [`muxer`] (the host side: the listener, `CONNECT` handshakes, the
//! connections' host sockets), [`connection`] (one connection's state,
//! credit and buffer), [`host_end`] (the host I/O thread) and [`packet`]
//! (the packet header).

pub mod connection;
pub mod device;
pub mod host_end;
pub mod muxer;
pub mod packet;

pub use connection::CONN_BUF_SIZE;
pub use device::{
    valid_guest_cid, Vsock, VsockArgs, VsockState, EVENT_QUEUE, MAX_PAYLOAD, QUEUE_SIZE, RX_QUEUE,
    TX_QUEUE,
};
pub use muxer::{
    VsockCounters, VsockHost, CONNECT_TIMEOUT, FIRST_LOCAL_PORT, MAX_CONNECTIONS, MAX_CONTROL,
    MAX_HANDSHAKES,
};

#[cfg(test)]
pub(crate) mod tests;
