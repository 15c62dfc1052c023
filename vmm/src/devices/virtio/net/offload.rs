//! Checksum offload (virtio 1.2 §5.1.6.2, §5.1.6.4): the Internet checksum
//! (RFC 1071), the transmit header's checks and the checksum it asks the
//! device for, and the check behind `VIRTIO_NET_HDR_F_DATA_VALID` on
//! receive. The device does this work natively, so that the guest does not
//! do it in emulated code.

use super::NET_HDR_LEN;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_HDR_F_DATA_VALID,
    VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_NONE,
};

/// Why a transmitted frame's `virtio_net_hdr` was refused (the frame is
/// dropped and counted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxHeaderError {
    /// `gso_type` is not VIRTIO_NET_HDR_GSO_NONE: the device offers no
    /// segmentation offload (HOST_TSO4/6, HOST_UFO), so no driver may ask
    /// for it (§5.1.6.2.1).
    #[error("GSO type {0:#x} without a segmentation offload negotiated")]
    Gso(u8),
    /// VIRTIO_NET_HDR_F_NEEDS_CSUM without VIRTIO_NET_F_CSUM negotiated.
    #[error("NEEDS_CSUM without VIRTIO_NET_F_CSUM negotiated")]
    CsumNotNegotiated,
    /// The checksum's start or its 2-byte field lies outside the frame.
    #[error("checksum at {start}+{offset} outside a {len}-byte frame")]
    CsumOutOfRange {
        /// `csum_start`, bytes from the frame's start.
        start: u16,
        /// `csum_offset`, bytes from `csum_start`.
        offset: u16,
        /// The frame's length, bytes.
        len: usize,
    },
}

/// The ones' complement sum (RFC 1071) of `data` as big-endian 16-bit
/// words, an odd last byte padded with a zero byte; not folded (it fits
/// 64 bits for `data` under 16 GiB). Sums of even-length pieces add up to
/// the sum of their concatenation.
pub fn ones_sum(data: &[u8]) -> u64 {
    // 32-bit words sum to the same ones' complement value (2^16 ≡ 1 mod
    // 2^16 - 1), in half the additions.
    let mut words = data.chunks_exact(4);
    let sum: u64 = words
        .by_ref()
        .map(|w| u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .sum();
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    sum + u64::from(u32::from_be_bytes(tail))
}

/// `sum` folded to 16 bits with end-around carry: 0 only for a sum of
/// zeros, else in 1..=0xffff.
pub fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The Internet checksum of `data` (RFC 1071): the complement of its
/// folded ones' complement sum, as the big-endian value to store.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(ones_sum(data))
}

/// Checks a transmitted frame's `virtio_net_hdr` (`hdr`, 12 bytes,
/// §5.1.6) against the negotiated `features` and does what it asks of the
/// device, in place on `frame` (the Ethernet frame that followed it).
///
/// - `gso_type` must be VIRTIO_NET_HDR_GSO_NONE; `hdr_len` and `gso_size`
///   are then unused (§5.1.6.2.2: the device must not rely on `hdr_len`).
/// - With VIRTIO_NET_HDR_F_NEEDS_CSUM (only if VIRTIO_NET_F_CSUM was
///   negotiated), the Internet checksum of `frame[csum_start..]` is stored
///   big-endian at `csum_start + csum_offset`, which must lie within the
///   frame. The driver has put the pseudo-header's sum there, so the sum
///   covers it. A result of 0 is stored as 0xffff (the same value in ones'
///   complement; 0 would mean "no checksum" to UDP).
/// - Other flag bits are ignored (§5.1.6.2.2).
///
/// Errors: [`TxHeaderError`]; `frame` is then unchanged.
pub fn finish_tx(
    hdr: &[u8; NET_HDR_LEN],
    frame: &mut [u8],
    features: u64,
) -> Result<(), TxHeaderError> {
    let flags = hdr[0];
    let gso_type = hdr[1];
    if u32::from(gso_type) != VIRTIO_NET_HDR_GSO_NONE {
        return Err(TxHeaderError::Gso(gso_type));
    }
    if u32::from(flags) & VIRTIO_NET_HDR_F_NEEDS_CSUM == 0 {
        return Ok(());
    }
    if features & (1 << VIRTIO_NET_F_CSUM) == 0 {
        return Err(TxHeaderError::CsumNotNegotiated);
    }
    let start = u16::from_le_bytes([hdr[6], hdr[7]]);
    let offset = u16::from_le_bytes([hdr[8], hdr[9]]);
    // Both are u16: no overflow in usize.
    let field = usize::from(start) + usize::from(offset);
    if field + 2 > frame.len() {
        return Err(TxHeaderError::CsumOutOfRange {
            start,
            offset,
            len: frame.len(),
        });
    }
    let sum = match checksum(&frame[usize::from(start)..]) {
        0 => 0xffff,
        s => s,
    };
    frame[field..field + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// The `flags` of the `virtio_net_hdr` the device writes before a received
/// `frame`, given the negotiated `features`: VIRTIO_NET_HDR_F_DATA_VALID
/// when VIRTIO_NET_F_GUEST_CSUM was negotiated and the frame's outermost
/// TCP or UDP checksum is correct ([`l4_checksum_valid`]), else 0.
///
/// §5.1.6.4.1 lets a device set DATA_VALID only once it has validated the
/// checksum, and the device does validate it, natively, rather than trust
/// the host end; the guest then skips the check (Linux: the packet is
/// CHECKSUM_UNNECESSARY). Trusting would be unsound for two of the host
/// ends: passt builds every frame it sends with complete checksums, but a
/// TAP interface or socket_vmnet hands on frames bridged from other hosts,
/// which nobody on this host checked. A frame that fails the check, or
/// that the check does not cover (fragments, IPv6 extension headers, ARP,
/// ICMP, a UDP datagram without a checksum), goes to the guest without the
/// flag, and the guest checks it as before.
pub fn rx_flags(features: u64, frame: &[u8]) -> u8 {
    if features & (1 << VIRTIO_NET_F_GUEST_CSUM) != 0 && l4_checksum_valid(frame) {
        VIRTIO_NET_HDR_F_DATA_VALID as u8
    } else {
        0
    }
}

/// EtherType of IPv4 and IPv6.
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
/// IP protocol numbers of TCP and UDP.
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Whether `frame` (Ethernet, no VLAN tag) carries an unfragmented IPv4
/// packet, or an IPv6 packet without extension headers, whose TCP segment
/// or UDP datagram (with a checksum, and a UDP length that is the IP
/// payload's) has a correct checksum over its pseudo-header (RFC 793,
/// RFC 768, RFC 8200 §8.1). The IP lengths must lie within the frame
/// (Ethernet padding after them is allowed). Anything else: `false`.
pub fn l4_checksum_valid(frame: &[u8]) -> bool {
    if frame.len() < 14 {
        return false;
    }
    let ip = &frame[14..];
    match be16(frame, 12) {
        ETH_P_IP => {
            if ip.len() < 20 || ip[0] >> 4 != 4 {
                return false;
            }
            let ihl = usize::from(ip[0] & 0xf) * 4;
            let total = usize::from(be16(ip, 2));
            // More fragments, or a fragment offset: a part of a packet.
            if ihl < 20 || total < ihl || total > ip.len() || be16(ip, 6) & 0x3fff != 0 {
                return false;
            }
            let proto = ip[9];
            let l4 = &ip[ihl..total];
            let mut pseudo = [0u8; 12];
            pseudo[..8].copy_from_slice(&ip[12..20]);
            pseudo[9] = proto;
            pseudo[10..].copy_from_slice(&(l4.len() as u16).to_be_bytes());
            l4_valid(proto, l4, ones_sum(&pseudo))
        }
        ETH_P_IPV6 => {
            if ip.len() < 40 || ip[0] >> 4 != 6 {
                return false;
            }
            let payload = usize::from(be16(ip, 4));
            if 40 + payload > ip.len() {
                return false;
            }
            let next = ip[6];
            let l4 = &ip[40..40 + payload];
            let mut pseudo = [0u8; 40];
            pseudo[..32].copy_from_slice(&ip[8..40]);
            pseudo[32..36].copy_from_slice(&(payload as u32).to_be_bytes());
            pseudo[39] = next;
            l4_valid(next, l4, ones_sum(&pseudo))
        }
        _ => false,
    }
}

/// Whether `l4`, a TCP segment or UDP datagram whose pseudo-header sums to
/// `pseudo`, is long enough for its header and checksums correctly.
fn l4_valid(proto: u8, l4: &[u8], pseudo: u64) -> bool {
    let checked = match proto {
        IPPROTO_TCP => l4.len() >= 20,
        // A zero checksum is none (IPv4) or invalid (IPv6): the guest
        // decides.
        IPPROTO_UDP => l4.len() >= 8 && usize::from(be16(l4, 4)) == l4.len() && be16(l4, 6) != 0,
        _ => false,
    };
    checked && fold(pseudo + ones_sum(l4)) == 0xffff
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// NEEDS_CSUM with `csum_start` and `csum_offset`.
    pub(crate) fn csum_hdr(start: u16, offset: u16) -> [u8; NET_HDR_LEN] {
        let mut h = [0u8; NET_HDR_LEN];
        h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
        h[6..8].copy_from_slice(&start.to_le_bytes());
        h[8..10].copy_from_slice(&offset.to_le_bytes());
        h
    }

    const CSUM: u64 = 1 << VIRTIO_NET_F_CSUM;
    const GUEST_CSUM: u64 = 1 << VIRTIO_NET_F_GUEST_CSUM;

    /// The checksum, one 16-bit word at a time with end-around carry, as
    /// RFC 1071 §4.1 writes it: the reference the fast sum is held to.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for pair in data.chunks(2) {
            let w = u32::from(pair[0]) << 8 | u32::from(*pair.get(1).unwrap_or(&0));
            sum += w;
            if sum > 0xffff {
                sum = (sum & 0xffff) + 1;
            }
        }
        !(sum as u16)
    }

    #[test]
    fn the_checksum_matches_known_vectors() {
        // RFC 1071 §3's example: words 0001 f203 f4f5 f6f7 sum to ddf2.
        let words = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(ones_sum(&words)), 0xddf2);
        assert_eq!(checksum(&words), !0xddf2);
        // An IPv4 header (Wikipedia's "IPv4 header checksum" example)
        // with its checksum field zeroed: b861.
        let ip = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&ip), 0xb861);
        assert_eq!(checksum(&[]), 0xffff);
        assert_eq!(fold(0), 0);
        assert_eq!(fold(0x1_0000), 1);
        assert_eq!(fold(0xffff_ffff_ffff), 0xffff);
    }

    #[test]
    fn odd_lengths_pad_with_a_zero_byte_and_match_the_reference() {
        assert_eq!(checksum(&[0xab]), !0xab00);
        assert_eq!(checksum(&[0x12, 0x34, 0x56]), !(0x1234 + 0x5600));
        let data: Vec<u8> = (0..70_001u32).map(|i| (i * 131 + 7) as u8).collect();
        for len in [0, 1, 2, 3, 4, 5, 7, 63, 1513, 1514, 65535, 70_001] {
            assert_eq!(checksum(&data[..len]), reference(&data[..len]), "{len}");
        }
        // All ones: large sums fold correctly.
        let ones = vec![0xffu8; 65535];
        assert_eq!(checksum(&ones), reference(&ones));
    }

    /// An Ethernet frame with an IPv4 header from 10.0.2.15 to 10.0.2.2,
    /// protocol `proto`, around `l4` (its checksum field as given).
    pub(crate) fn ipv4_frame(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETH_P_IP.to_be_bytes());
        let total = (20 + l4.len()) as u16;
        let mut ip = [
            0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, proto, 0, 0, 10, 0, 2, 15, 10, 0, 2, 2,
        ];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        let c = checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(l4);
        f
    }

    /// An Ethernet frame with an IPv6 header around `l4`.
    fn ipv6_frame(next: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
        let mut ip = [0u8; 40];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
        ip[6] = next;
        ip[7] = 64;
        ip[8] = 0xfd;
        ip[23] = 1;
        ip[24] = 0xfd;
        ip[39] = 2;
        f.extend_from_slice(&ip);
        f.extend_from_slice(l4);
        f
    }

    /// A TCP segment (20-byte header, checksum at 16) with `payload`.
    pub(crate) fn tcp(payload: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[..4].copy_from_slice(&[0x1f, 0x90, 0xc0, 0x01]);
        t[12] = 5 << 4;
        t.extend_from_slice(payload);
        t
    }

    /// A UDP datagram (checksum at 6) with `payload`.
    fn udp(payload: &[u8]) -> Vec<u8> {
        let mut u = vec![0x00, 0x35, 0xc0, 0x02, 0, 0, 0, 0];
        let len = (8 + payload.len()) as u16;
        u[4..6].copy_from_slice(&len.to_be_bytes());
        u.extend_from_slice(payload);
        u
    }

    /// What Linux does before handing a CHECKSUM_PARTIAL packet to the
    /// device: the pseudo-header's folded sum (not complemented) in the
    /// checksum field, and `csum_start`/`csum_offset` set.
    pub(crate) fn as_partial(frame: &mut [u8], v6: bool, field: usize) -> [u8; NET_HDR_LEN] {
        let (ip_len, pseudo) = if v6 {
            let ip = &frame[14..54];
            let mut p = [0u8; 40];
            p[..32].copy_from_slice(&ip[8..40]);
            p[34..36].copy_from_slice(&ip[4..6]);
            p[39] = ip[6];
            (40, ones_sum(&p))
        } else {
            let ip = &frame[14..34];
            let mut p = [0u8; 12];
            p[..8].copy_from_slice(&ip[12..20]);
            p[9] = ip[9];
            let l4 = (be16(ip, 2) - 20).to_be_bytes();
            p[10..].copy_from_slice(&l4);
            (20, ones_sum(&p))
        };
        let start = 14 + ip_len;
        frame[start + field..start + field + 2].copy_from_slice(&fold(pseudo).to_be_bytes());
        csum_hdr(start as u16, field as u16)
    }

    #[test]
    fn a_checksum_the_device_fills_in_is_the_one_the_receiver_checks() {
        let payloads: [&[u8]; 3] = [b"", b"odd", &[0xa5; 1461]];
        for p in payloads {
            for (mut f, v6, field) in [
                (ipv4_frame(IPPROTO_TCP, &tcp(p)), false, 16),
                (ipv6_frame(IPPROTO_TCP, &tcp(p)), true, 16),
                (ipv4_frame(IPPROTO_UDP, &udp(p)), false, 6),
                (ipv6_frame(IPPROTO_UDP, &udp(p)), true, 6),
            ] {
                assert!(!l4_checksum_valid(&f), "no checksum yet");
                let hdr = as_partial(&mut f, v6, field);
                finish_tx(&hdr, &mut f, CSUM).unwrap();
                assert!(l4_checksum_valid(&f), "{} bytes, v6 {v6}", p.len());
                assert_eq!(rx_flags(GUEST_CSUM, &f), 2);
                assert_eq!(rx_flags(CSUM, &f), 0, "GUEST_CSUM not negotiated");
                // One flipped bit anywhere in the segment: refused.
                let l4_start = if v6 { 54 } else { 34 };
                let mut bad = f.clone();
                bad[l4_start + 1] ^= 0x10;
                assert!(!l4_checksum_valid(&bad));
                assert_eq!(rx_flags(GUEST_CSUM, &bad), 0);
            }
        }
    }

    #[test]
    fn a_zero_checksum_is_sent_as_ffff() {
        // A UDP datagram whose sum (pseudo-header included) is ffff, so
        // its checksum would be 0: the payload makes up the difference.
        let mut f = ipv4_frame(IPPROTO_UDP, &udp(&[0, 0]));
        let hdr = as_partial(&mut f, false, 6);
        let partial = fold(ones_sum(&f[34..]));
        let fill = !partial; // added, the sum becomes ffff
        f[42..44].copy_from_slice(&fill.to_be_bytes());
        finish_tx(&hdr, &mut f, CSUM).unwrap();
        assert_eq!(be16(&f, 40), 0xffff);
        assert!(l4_checksum_valid(&f));
    }

    #[test]
    fn hostile_transmit_headers_are_refused_and_leave_the_frame_alone() {
        let frame = ipv4_frame(IPPROTO_TCP, &tcp(b"data"));
        let len = frame.len();
        let cases: [([u8; NET_HDR_LEN], u64, TxHeaderError); 6] = [
            (
                csum_hdr(len as u16, 0),
                CSUM,
                TxHeaderError::CsumOutOfRange {
                    start: len as u16,
                    offset: 0,
                    len,
                },
            ),
            (
                csum_hdr(u16::MAX, u16::MAX),
                CSUM,
                TxHeaderError::CsumOutOfRange {
                    start: u16::MAX,
                    offset: u16::MAX,
                    len,
                },
            ),
            // The field's second byte one past the end.
            (
                csum_hdr(34, (len - 34 - 1) as u16),
                CSUM,
                TxHeaderError::CsumOutOfRange {
                    start: 34,
                    offset: (len - 35) as u16,
                    len,
                },
            ),
            (csum_hdr(34, 16), 0, TxHeaderError::CsumNotNegotiated),
            (
                {
                    let mut h = [0u8; NET_HDR_LEN];
                    h[1] = 1; // VIRTIO_NET_HDR_GSO_TCPV4
                    h
                },
                CSUM,
                TxHeaderError::Gso(1),
            ),
            (
                {
                    let mut h = csum_hdr(34, 16);
                    h[1] = 0x80; // VIRTIO_NET_HDR_GSO_ECN alone
                    h
                },
                CSUM,
                TxHeaderError::Gso(0x80),
            ),
        ];
        for (hdr, features, want) in cases {
            let mut f = frame.clone();
            assert_eq!(finish_tx(&hdr, &mut f, features), Err(want));
            assert_eq!(f, frame);
        }
        // The last two bytes of the frame: in range.
        let mut f = frame.clone();
        finish_tx(&csum_hdr(34, (len - 36) as u16), &mut f, CSUM).unwrap();
        assert_ne!(f[len - 2..], frame[len - 2..]);
        // No NEEDS_CSUM: the offsets are not looked at; other flags
        // (DATA_VALID, which a driver must not send) are ignored.
        let mut h = csum_hdr(u16::MAX, u16::MAX);
        h[0] = VIRTIO_NET_HDR_F_DATA_VALID as u8;
        let mut f = frame.clone();
        finish_tx(&h, &mut f, 0).unwrap();
        assert_eq!(f, frame);
    }

    #[test]
    fn what_the_receive_check_does_not_cover_goes_unflagged() {
        let mut good = ipv4_frame(IPPROTO_TCP, &tcp(b"payload"));
        let hdr = as_partial(&mut good, false, 16);
        finish_tx(&hdr, &mut good, CSUM).unwrap();
        assert!(l4_checksum_valid(&good));
        // Ethernet padding after the IP packet is allowed.
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 6]);
        assert!(l4_checksum_valid(&padded));
        let mutate = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut g = good.clone();
            f(&mut g);
            l4_checksum_valid(&g)
        };
        // A fragment (MF set; an offset), truncated frames, IP lengths
        // past the frame or shorter than the header, a VLAN tag, ICMP.
        assert!(!mutate(&|g| g[20] |= 0x20));
        assert!(!mutate(&|g| g[21] = 1));
        assert!(!mutate(&|g| g.truncate(40)));
        assert!(!mutate(&|g| g.truncate(20)));
        assert!(!mutate(&|g| g.truncate(10)));
        assert!(!mutate(
            &|g| g[16..18].copy_from_slice(&0xffffu16.to_be_bytes())
        ));
        assert!(!mutate(&|g| g[16..18].copy_from_slice(&10u16.to_be_bytes())));
        assert!(!mutate(&|g| g[14] = 0x44));
        assert!(!mutate(&|g| g[12..14].copy_from_slice(&[0x81, 0x00])));
        assert!(!mutate(&|g| g[23] = 1));
        // UDP without a checksum, or with a length that is not the IP
        // payload's.
        let mut u = ipv4_frame(IPPROTO_UDP, &udp(b"abc"));
        assert!(!l4_checksum_valid(&u), "checksum 0: none");
        let hdr = as_partial(&mut u, false, 6);
        finish_tx(&hdr, &mut u, CSUM).unwrap();
        assert!(l4_checksum_valid(&u));
        u[38..40].copy_from_slice(&10u16.to_be_bytes());
        assert!(!l4_checksum_valid(&u));
        // IPv6 with an extension header (hop-by-hop) first.
        assert!(!l4_checksum_valid(&ipv6_frame(0, &tcp(b"x"))));
        assert!(!l4_checksum_valid(&[0u8; 60]));
    }
}
