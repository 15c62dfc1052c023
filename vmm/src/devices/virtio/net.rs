//! virtio-net (virtio 1.2 §5.1): the device model, without its host end.
//!
//! Two queues: receiveq (0) and transmitq (1). Offered features:
//! VIRTIO_NET_F_MAC (the configured MAC in config space),
//! VIRTIO_NET_F_STATUS (link up), VIRTIO_NET_F_MRG_RXBUF (§5.1.6.3.1: a
//! received frame may span several receive buffers, so any MTU up to
//! 65521 bytes works with the driver's page-sized buffers), and checksum
//! offload both ways ([`offload`]): VIRTIO_NET_F_CSUM (the device fills in
//! the checksum a transmitted frame's header asks for, so every host end
//! gets complete frames) and VIRTIO_NET_F_GUEST_CSUM (received frames whose
//! TCP or UDP checksum the device has checked are marked DATA_VALID). No
//! segmentation offloads: a header asking for GSO is refused. A driver
//! that does not take mergeable buffers gets one frame per buffer; a frame
//! that does not fit is dropped and counted. What the device does follows
//! the features the driver negotiated (the transport's, restored with a
//! snapshot), not the ones offered now.
//!
//! Transmit runs in the QueueNotify write, handing each frame to the
//! [`NetBackend`]. Receive is pushed by the host end ([`Net::receive`]) into
//! a bounded backlog, delivered whenever the driver has buffers (on its
//! receiveq notification, or when the host end asks the transport to run
//! queue 0). Every header and frame is 12-byte `virtio_net_hdr` (§5.1.6,
//! with `num_buffers`, as VIRTIO_F_VERSION_1 requires) followed by the
//! frame. Guest memory is only written through vm-memory, so received
//! frames are dirty-tracked like every device write.

use super::host_io::{Interest, Waker};
use super::{VirtioDevice, VirtioError};
use crate::devices::Persist;
use crate::memory::GuestMemoryMmap;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT, Reader, Writer};

mod backend;
pub mod host_end;
pub mod offload;
#[cfg(target_os = "linux")]
pub mod passt;
pub mod stream;
#[cfg(target_os = "linux")]
pub mod tap;

pub use backend::{FrameSource, NetBackend, ReadOutcome};

/// Index of the receive queue.
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue.
pub const TX_QUEUE: usize = 1;
/// Size of each queue (QueueNumMax).
pub const QUEUE_SIZE: u16 = 256;
/// Length of `struct virtio_net_hdr` with `num_buffers` (§5.1.6), bytes.
pub const NET_HDR_LEN: usize = 12;
/// Largest frame accepted from the guest or the host end, bytes (the
/// largest the stream framing and Linux's maximum MTU allow).
pub const MAX_FRAME_LEN: usize = 65535;
/// Frames kept for the guest while it has no receive buffer; later ones
/// are dropped (the host end's thread stops reading well before).
pub const RX_BACKLOG_FRAMES: usize = 1024;

/// `struct virtio_net_config` up to `status`: mac (6 bytes), status (le16).
const CONFIG_LEN: usize = 8;
/// Shortest frame passed on: an Ethernet header, bytes.
pub const MIN_FRAME_LEN: usize = 14;

/// Frame counters, for the log and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetCounters {
    /// Frames the guest sent that the host end took.
    pub tx_frames: u64,
    /// Frames the guest sent that were dropped (malformed, oversized, or
    /// refused by the host end).
    pub tx_dropped: u64,
    /// Frames delivered to the guest.
    pub rx_frames: u64,
    /// Frames for the guest that were dropped (backlog full, too large for
    /// the buffer, malformed).
    pub rx_dropped: u64,
}

/// A virtio network device.
pub struct Net {
    mac: [u8; 6],
    backend: Box<dyn NetBackend>,
    backlog: VecDeque<Vec<u8>>,
    counters: NetCounters,
    config: [u8; CONFIG_LEN],
    tx_buf: Vec<u8>,
    /// The host end's thread, woken when receive buffers free backlog.
    waker: Option<Waker>,
    /// The device writes nothing into guest RAM (a snapshot is being
    /// taken): neither received frames nor used-ring entries.
    held: bool,
    /// Transmit waits for the host end to take what it holds.
    tx_blocked: bool,
}

/// The saved state: the MAC (frames in flight are not kept: a link may
/// drop them). The negotiated features are the transport's; a state from
/// before that, which also holds them as `acked_features`, reads the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// The MAC address the guest knows.
    pub mac: [u8; 6],
}

/// What the host end's thread does after a wake-up ([`Net::on_host_ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostTurn {
    /// The transport must run [`RX_QUEUE`]: frames wait for receive
    /// buffers.
    pub run_rx: bool,
    /// The transport must run [`TX_QUEUE`]: the host end took what held
    /// transmit back.
    pub run_tx: bool,
    /// What to wait for next on the host end's descriptor. Running the
    /// queues may change it; the device then wakes the thread (its
    /// [`Waker`]) so that it asks again.
    pub interest: Interest,
}

/// What a restored device is given: the MAC the command line asks for
/// and the host end, newly opened.
pub struct NetArgs {
    /// The MAC asked for explicitly (`boot --restore SPEC --mac MAC`): it
    /// replaces the saved one in the config space, and the guest learns it
    /// when its driver probes again (the guest agent has it do so after a
    /// restore). `None`: the saved MAC.
    pub mac: Option<[u8; 6]>,
    /// The host end.
    pub backend: Box<dyn NetBackend>,
}

impl Net {
    /// A device with MAC `mac` whose frames go to `backend`.
    pub fn new(mac: [u8; 6], backend: Box<dyn NetBackend>) -> Self {
        let mut config = [0u8; CONFIG_LEN];
        config[..6].copy_from_slice(&mac);
        config[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        Net {
            mac,
            backend,
            backlog: VecDeque::new(),
            counters: NetCounters::default(),
            config,
            tx_buf: Vec::new(),
            waker: None,
            held: false,
            tx_blocked: false,
        }
    }

    /// Who to wake when frames leave the backlog or bytes stay buffered.
    pub fn set_waker(&mut self, waker: Waker) {
        self.backend.set_waker(waker.clone());
        self.waker = Some(waker);
    }

    /// Frames waiting for receive buffers.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// The MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The frame counters.
    pub fn counters(&self) -> NetCounters {
        self.counters
    }

    /// A frame from the host end for the guest: kept until the driver has
    /// a buffer (then the transport must run [`RX_QUEUE`]). Returns `false`
    /// if it was dropped: malformed, oversized, or the backlog is full.
    pub fn receive(&mut self, frame: &[u8]) -> bool {
        if !(MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&frame.len())
            || self.backlog.len() >= RX_BACKLOG_FRAMES
        {
            self.counters.rx_dropped += 1;
            return false;
        }
        self.backlog.push_back(frame.to_vec());
        true
    }

    /// Whether the backlog has room for `frames` more frames (the host
    /// end's thread reads only while a read's worth fits).
    pub fn has_room_for(&self, frames: usize) -> bool {
        self.backlog.len() + frames <= RX_BACKLOG_FRAMES
    }

    /// The host end's thread's turn, after it read what it could (device
    /// lock held): flushes what the host end holds of the guest's frames,
    /// and says which queues the transport must run and what to wait for:
    /// readable while the host end is `open` and a read of up to `per_read`
    /// frames fits the backlog, writable while the host end holds bytes.
    /// While the device is held for a snapshot no queue is run.
    pub fn on_host_ready(&mut self, per_read: usize, open: bool) -> HostTurn {
        if let Err(e) = self.backend.flush() {
            crate::warn_ratelimited!("virtio-net: writing the host end: {e}");
        }
        let pending = self.backend.pending();
        HostTurn {
            run_rx: !self.held && !self.backlog.is_empty(),
            run_tx: !self.held && self.tx_blocked && !pending,
            interest: Interest {
                read: open && self.has_room_for(per_read),
                write: pending,
            },
        }
    }

    /// Delivers backlogged frames into the receiveq's buffers. With
    /// VIRTIO_NET_F_MRG_RXBUF (§5.1.6.4) a frame takes as many buffers as it
    /// needs and waits until the driver has posted enough; without it, one
    /// buffer, and a frame that does not fit it is dropped. A frame's
    /// buffers are published together; its header's flags are
    /// [`offload::rx_flags`]. Returns whether a buffer was used.
    fn deliver(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        features: u64,
    ) -> Result<bool, VirtioError> {
        let max_bufs = if features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0 {
            usize::from(queue.size())
        } else {
            1
        };
        let mut used = false;
        while !self.held && !self.backlog.is_empty() {
            let need = NET_HDR_LEN + self.backlog[0].len();
            let start = queue.next_avail();
            // Buffers in the order popped; a malformed chain holds nothing.
            let mut bufs = Vec::new();
            let mut room = 0;
            while room < need && bufs.len() < max_bufs {
                let Some(chain) = queue.pop_descriptor_chain(mem) else {
                    break;
                };
                let head = chain.head_index();
                match Writer::new(mem, chain) {
                    Ok(w) => {
                        room += w.available_bytes();
                        bufs.push((head, Some(w)));
                    }
                    Err(e) => {
                        crate::warn_ratelimited!(
                            "virtio-net: receive buffer: bad descriptor chain: {e}"
                        );
                        bufs.push((head, None));
                    }
                }
            }
            let frame = if room >= need {
                self.backlog.pop_front().expect("checked non-empty")
            } else if bufs.len() < max_bufs {
                // Not enough buffers yet: the driver's next notification
                // (or the host end's next kick) tries again.
                queue.set_next_avail(start);
                break;
            } else {
                crate::warn_ratelimited!(
                    "virtio-net: a {room}-byte receive buffer is too small for a {}-byte frame; frame dropped",
                    need - NET_HDR_LEN
                );
                self.backlog.pop_front();
                self.counters.rx_dropped += 1;
                let entries: Vec<_> = bufs.iter().map(|&(head, _)| (head, 0)).collect();
                super::publish_used(queue, mem, &entries)?;
                used = true;
                continue;
            };
            let mut hdr = [0u8; NET_HDR_LEN];
            hdr[0] = offload::rx_flags(features, &frame);
            // num_buffers (§5.1.6.4); at most the queue size.
            hdr[10..12].copy_from_slice(&(bufs.len() as u16).to_le_bytes());
            // What is left to write: the header, then the frame.
            let mut parts: [&[u8]; 2] = [&hdr, &frame];
            let mut entries = Vec::with_capacity(bufs.len());
            let mut failed = false;
            for (head, w) in bufs {
                let mut n = 0;
                if let (Some(mut w), false) = (w, failed) {
                    for part in &mut parts {
                        let k = w.available_bytes().min(part.len());
                        if let Err(e) = w.write_all(&part[..k]) {
                            crate::warn_ratelimited!(
                                "virtio-net: writing a receive buffer: {e}; frame dropped"
                            );
                            failed = true;
                            break;
                        }
                        *part = &part[k..];
                        n += k;
                    }
                }
                entries.push((head, n as u32));
            }
            if failed {
                self.counters.rx_dropped += 1;
            } else {
                self.counters.rx_frames += 1;
            }
            super::publish_used(queue, mem, &entries)?;
            used = true;
        }
        if used {
            if let Some(w) = &self.waker {
                w.wake();
            }
        }
        Ok(used)
    }

    /// Sends the frames of the transmitq's chains, each once the device
    /// has done what its header asks under the negotiated `features`
    /// ([`offload::finish_tx`]; a header it refuses drops the frame);
    /// returns whether a chain was used. When the host end is full (its
    /// peer reads slower than the guest sends), the chain stays in the
    /// queue and transmit stops until the host end's thread has flushed
    /// ([`Net::on_host_ready`]): the guest's transmit waits, as on a real
    /// NIC, and nothing is dropped.
    fn transmit(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        features: u64,
    ) -> Result<bool, VirtioError> {
        let mut used = false;
        if self.held {
            return Ok(false);
        }
        if self.tx_blocked {
            if let Err(e) = self.backend.flush() {
                crate::warn_ratelimited!("virtio-net: writing the host end: {e}");
            }
            if self.backend.pending() {
                return Ok(false);
            }
            self.tx_blocked = false;
        }
        while let Some(chain) = queue.iter(mem)?.next() {
            let head = chain.head_index();
            let frame = read_frame(chain, mem, &mut self.tx_buf).and_then(|hdr| {
                offload::finish_tx(&hdr, &mut self.tx_buf, features).map_err(|e| e.to_string())
            });
            match frame {
                Ok(()) => match self.backend.send(&self.tx_buf) {
                    Ok(()) => self.counters.tx_frames += 1,
                    // Full, and its thread will flush: retry this chain then.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.backend.pending() => {
                        queue.go_to_previous_position();
                        self.tx_blocked = true;
                        break;
                    }
                    Err(e) => {
                        crate::warn_ratelimited!("virtio-net: host end: {e}; frame dropped");
                        self.counters.tx_dropped += 1;
                    }
                },
                Err(why) => {
                    crate::warn_ratelimited!("virtio-net: transmit: {why}; frame dropped");
                    self.counters.tx_dropped += 1;
                }
            }
            queue.add_used(mem, head, 0)?;
            used = true;
        }
        Ok(used)
    }
}

/// Reads a transmit chain's frame into `buf`; returns its header. Errors:
/// a chain that is malformed, or too short or too long for a header and a
/// frame.
fn read_frame(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    buf: &mut Vec<u8>,
) -> Result<[u8; NET_HDR_LEN], String> {
    let mut reader = Reader::new(mem, chain).map_err(|e| format!("bad descriptor chain: {e}"))?;
    let len = reader.available_bytes();
    if len < NET_HDR_LEN + MIN_FRAME_LEN {
        return Err(format!("{len} bytes is shorter than a header and a frame"));
    }
    if len - NET_HDR_LEN > MAX_FRAME_LEN {
        return Err(format!(
            "{} bytes is more than the largest frame, {MAX_FRAME_LEN}",
            len - NET_HDR_LEN
        ));
    }
    let mut hdr = [0u8; NET_HDR_LEN];
    reader
        .read_exact(&mut hdr)
        .map_err(|e| format!("reading the header: {e}"))?;
    buf.resize(len - NET_HDR_LEN, 0);
    reader
        .read_exact(buf)
        .map_err(|e| format!("reading the frame: {e}"))?;
    Ok(hdr)
}

impl VirtioDevice for Net {
    const QUEUE_MAX_SIZES: &'static [u16] = &[QUEUE_SIZE, QUEUE_SIZE];

    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn name(&self) -> &'static str {
        "virtio-net"
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_NET_F_CSUM)
            | (1 << VIRTIO_NET_F_GUEST_CSUM)
            | (1 << VIRTIO_NET_F_MAC)
            | (1 << VIRTIO_NET_F_STATUS)
            | (1 << VIRTIO_NET_F_MRG_RXBUF)
    }

    fn config_as_bytes(&self) -> &[u8] {
        &self.config
    }

    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        features: u64,
    ) -> Result<bool, VirtioError> {
        match queue_index {
            RX_QUEUE => self.deliver(queue, mem, features),
            TX_QUEUE => self.transmit(queue, mem, features),
            _ => Ok(false),
        }
    }

    /// Transmit waits for the host end to take what it holds, receive for
    /// frames from the host end (with none waiting, the driver's buffers
    /// are enough), and both queues while the device is held for a
    /// snapshot; the host end's thread (or the end of the hold) runs them
    /// again.
    fn waits_for_host(&self, queue_index: usize) -> bool {
        self.held
            || match queue_index {
                RX_QUEUE => self.backlog.is_empty(),
                TX_QUEUE => self.tx_blocked,
                _ => false,
            }
    }

    fn reset(&mut self) {
        self.backlog.clear();
        self.tx_blocked = false;
    }

    /// Holds the device: it writes nothing into guest RAM (frames from the
    /// host end wait in the backlog, within [`RX_BACKLOG_FRAMES`]; the
    /// transmitq, which the host end's thread may run, is left alone).
    /// Transmit completes inside `process_queue`, so nothing is in flight.
    fn prepare_save(&mut self) -> io::Result<()> {
        self.held = true;
        Ok(())
    }

    fn after_save(&mut self) {
        self.held = false;
    }
}

impl Persist for Net {
    type State = NetState;
    type Args = NetArgs;
    type Error = VirtioError;

    fn save(&self) -> NetState {
        NetState { mac: self.mac }
    }

    /// The device with the saved MAC, or the one `args` asks for
    /// explicitly. Errors: a saved MAC that is multicast (no NIC has one:
    /// the state is not a device's).
    fn restore(args: NetArgs, state: &NetState) -> Result<Self, VirtioError> {
        if !is_unicast(&state.mac) {
            return Err(VirtioError::InvalidState(format!(
                "the snapshot's network device has MAC {}, a multicast address",
                format_mac(&state.mac)
            )));
        }
        let mac = match args.mac {
            Some(m) if m != state.mac => {
                tracing::info!(
                    "virtio-net: MAC {} (the snapshot's was {})",
                    format_mac(&m),
                    format_mac(&state.mac)
                );
                m
            }
            _ => state.mac,
        };
        Ok(Net::new(mac, args.backend))
    }
}

/// The MAC a VM named `seed` gets without `--mac` (a fresh boot: its
/// `--name`, else its disk's path; a branch's child: its name):
/// `52:54:00` (a locally administered, unicast prefix, the one QEMU uses)
/// and three bytes of SHA-256 of `seed`, so that it is the same on every
/// start.
pub fn default_mac(seed: &str) -> [u8; 6] {
    let h = snapshot_store::sha256(seed.as_bytes());
    [0x52, 0x54, 0x00, h[0], h[1], h[2]]
}

/// The MACs of VMs named `names` that share a link with a VM whose MAC is
/// `taken`: each [`default_mac`] of its name, and where that is `taken`'s
/// or an earlier name's, the next free one (its last three bytes counted
/// up, wrapping within the `52:54:00` prefix).
pub fn derived_macs(names: &[String], taken: [u8; 6]) -> Vec<[u8; 6]> {
    let mut used = vec![taken];
    for n in names {
        let mut mac = default_mac(n);
        while used.contains(&mac) {
            mac = next_mac(mac);
        }
        used.push(mac);
    }
    used.split_off(1)
}

/// The MAC after `mac` within its first three bytes (the last three
/// counted up as one 24-bit number, wrapping).
fn next_mac(mac: [u8; 6]) -> [u8; 6] {
    let low = (u32::from_be_bytes([0, mac[3], mac[4], mac[5]]) + 1) & 0xff_ffff;
    let b = low.to_be_bytes();
    [mac[0], mac[1], mac[2], b[1], b[2], b[3]]
}

/// Whether `mac` is a unicast address (the low bit of its first byte
/// clear), as a NIC's must be.
pub fn is_unicast(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 0
}

/// Parses `52:54:00:12:34:56` (six hex bytes); refuses a multicast
/// address (the low bit of the first byte), which no NIC may have.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let bad = || format!("'{s}' is not a MAC address (six hex bytes, e.g. 52:54:00:12:34:56)");
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next().ok_or_else(bad)?;
        if p.len() != 2 {
            return Err(bad());
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    if !is_unicast(&mac) {
        return Err(format!(
            "{s} is a multicast address; a NIC's MAC must be unicast (first byte even)"
        ));
    }
    Ok(mac)
}

/// `52:54:00:12:34:56`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests;
