//! The virtio-vsock packet header (virtio 1.2 §5.10.6) and its constants.

/// Length of `struct virtio_vsock_hdr`, bytes (packed, little-endian).
pub const HDR_LEN: usize = 44;

/// The host's CID (virtio 1.2 §5.10.4: 2 is the host).
pub const HOST_CID: u64 = 2;

/// `type`: a stream socket (the only type offered: no
/// VIRTIO_VSOCK_F_SEQPACKET).
pub const TYPE_STREAM: u16 = 1;

/// Operations (`op`), virtio 1.2 §5.10.6.
pub mod op {
    /// Connection request.
    pub const REQUEST: u16 = 1;
    /// Connection accepted.
    pub const RESPONSE: u16 = 2;
    /// Connection refused or reset.
    pub const RST: u16 = 3;
    /// The sender will receive (RCV) and/or send (SEND) no more.
    pub const SHUTDOWN: u16 = 4;
    /// Data.
    pub const RW: u16 = 5;
    /// The sender's `buf_alloc`/`fwd_cnt`, unasked.
    pub const CREDIT_UPDATE: u16 = 6;
    /// Asks the peer for a CREDIT_UPDATE.
    pub const CREDIT_REQUEST: u16 = 7;
}

/// SHUTDOWN flag: the sender will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// SHUTDOWN flag: the sender will send no more.
pub const SHUTDOWN_SEND: u32 = 2;

/// `struct virtio_vsock_event` id: the transport was reset (§5.10.6.6).
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// A packet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload bytes that follow the header.
    pub len: u32,
    /// Socket type ([`TYPE_STREAM`]).
    pub kind: u16,
    /// Operation ([`op`]).
    pub op: u16,
    /// SHUTDOWN flags.
    pub flags: u32,
    /// The sender's receive buffer for this connection, bytes.
    pub buf_alloc: u32,
    /// Bytes the sender has taken from that buffer so far (wrapping).
    pub fwd_cnt: u32,
}

impl Header {
    /// Decodes a header.
    pub fn parse(b: &[u8; HDR_LEN]) -> Self {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().expect("2 bytes"));
        Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            kind: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_at_the_spec_offsets() {
        let h = Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 0x1122_3344,
            dst_port: 5000,
            len: 7,
            kind: TYPE_STREAM,
            op: op::RW,
            flags: SHUTDOWN_SEND,
            buf_alloc: 256 << 10,
            fwd_cnt: u32::MAX,
        };
        let b = h.to_bytes();
        assert_eq!(Header::parse(&b), h);
        assert_eq!(b[0], 3);
        assert_eq!(b[8], 2);
        assert_eq!(&b[16..20], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[28..32], &[1, 0, 5, 0]);
        assert_eq!(&b[40..44], &[0xff; 4]);
    }
}
