//! The virtio-mmio transport, version 2 (virtio 1.2 §4.2.2), over one
//! [`VirtioDevice`].
//!
//! - Control registers (0x000..0x100) take only aligned 32-bit accesses
//!   (§4.2.2.2); others are [`AccessError::Size`]/[`AccessError::Alignment`].
//!   Configuration space (0x100..) takes naturally aligned 1/2/4/8-byte
//!   accesses.
//! - Device status follows §3.1.1 (ACKNOWLEDGE → DRIVER → FEATURES_OK →
//!   DRIVER_OK; FAILED at any time; 0 resets). Writes that break the order
//!   or clear bits are ignored with a warning. FEATURES_OK is refused unless
//!   VIRTIO_F_VERSION_1 is negotiated and every driver feature was offered.
//!   Queue set-up registers are accepted only between FEATURES_OK and
//!   DRIVER_OK, and only while the selected queue is not ready (§4.2.2.3).
//! - A QueueNotify write processes the queue synchronously on the writing
//!   vCPU, so a request completes before the guest's store retires.
//! - InterruptStatus bit 0 (used buffer) / bit 1 (configuration change);
//!   the level-triggered line is high while InterruptStatus != 0.
//! - If the device fails (broken ring, failed activation) the transport sets
//!   DEVICE_NEEDS_RESET and raises a configuration-change interrupt (§2.1.2).

use super::{VirtioDevice, VirtioError, TRANSPORT_FEATURES};
use crate::devices::{le_value, set_le_value, AccessError, IrqLine, MmioDevice, Persist};
use crate::memory::GuestRam;
use notify::run_queue;
use regs::*;
use std::sync::Arc;
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestAddress;

mod notify;
mod regs;
mod state;

pub use regs::{CONFIG_OFFSET, INT_CONFIG, INT_VRING, MAGIC_VALUE, MMIO_VERSION, VENDOR_ID};
pub use state::{VirtioMmioState, VirtqueueState};

/// A virtio-mmio transport slot holding device `D`.
pub struct VirtioMmio<D: VirtioDevice> {
    device: D,
    ram: Arc<GuestRam>,
    irq: Arc<dyn IrqLine>,
    irq_level: bool,
    queues: Vec<Queue>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    interrupt_status: u32,
    config_generation: u32,
}

impl<D: VirtioDevice> VirtioMmio<D> {
    /// Wraps `device`. Guest memory is reached through `ram` (vm-memory, so
    /// device writes are dirty-tracked); `irq` is the slot's SPI. Fails if
    /// the device reports an invalid queue size.
    pub fn new(device: D, ram: Arc<GuestRam>, irq: Arc<dyn IrqLine>) -> Result<Self, VirtioError> {
        let queues = D::QUEUE_MAX_SIZES
            .iter()
            .map(|&max| Queue::new(max))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VirtioMmio {
            device,
            ram,
            irq,
            irq_level: false,
            queues,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            interrupt_status: 0,
            config_generation: 0,
        })
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, mutably.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The available index the driver has published for queue `index`, if
    /// the queue is ready and its ring readable.
    pub fn avail_idx(&self, index: usize) -> Option<u16> {
        let q = self.queues.get(index).filter(|q| q.ready())?;
        q.avail_idx(self.ram.memory(), std::sync::atomic::Ordering::Acquire)
            .ok()
            .map(|i| i.0)
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Tells the driver the configuration space changed: bumps
    /// ConfigGeneration and raises InterruptStatus bit 1.
    pub fn signal_config_change(&mut self) {
        self.config_generation = self.config_generation.wrapping_add(1);
        self.raise(INT_CONFIG);
    }

    /// Before a snapshot: the device writes nothing into guest RAM until
    /// [`VirtioMmio::after_save`] ([`VirtioDevice::prepare_save`]).
    pub fn prepare_save(&mut self) -> std::io::Result<()> {
        self.device.prepare_save()
    }

    /// After a snapshot: ends the device's hold and runs every ready queue,
    /// as a notification would, so that what the host end buffered
    /// meanwhile reaches the guest (if the driver is running).
    pub fn after_save(&mut self) {
        self.device.after_save();
        for index in 0..self.queues.len() {
            if self.queues[index].ready() {
                self.kick(index);
            }
        }
    }

    fn offered_features(&self) -> u64 {
        self.device.features() | TRANSPORT_FEATURES
    }

    fn raise(&mut self, bits: u32) {
        self.interrupt_status |= bits;
        self.update_irq();
    }

    fn update_irq(&mut self) {
        let level = self.interrupt_status != 0;
        if level != self.irq_level {
            self.irq_level = level;
            self.irq.set_level(level);
        }
    }

    /// Marks the device broken (§2.1.2): DEVICE_NEEDS_RESET, and a
    /// configuration-change notification once the driver is running.
    fn set_needs_reset(&mut self) {
        self.status |= NEEDS_RESET;
        if self.status & DRIVER_OK != 0 {
            self.raise(INT_CONFIG);
        }
    }

    fn reset(&mut self) {
        self.device.reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.status = 0;
        self.driver_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.interrupt_status = 0;
        self.update_irq();
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // DEVICE_NEEDS_RESET belongs to the device: keep ours, ignore theirs.
        let new = (value & !NEEDS_RESET) | (self.status & NEEDS_RESET);
        if value & !STATUS_BITS != 0 || new & self.status != self.status || !status_order_ok(new) {
            crate::warn_ratelimited!(
                "virtio-mmio: status write {value:#x} over {:#x} breaks the init sequence; ignored",
                self.status
            );
            return;
        }
        let added = new & !self.status;
        let mut accepted = new;
        if added & FEATURES_OK != 0 {
            let offered = self.offered_features();
            let f = self.driver_features;
            if f & VERSION_1 == 0 || f & !offered != 0 {
                crate::warn_ratelimited!(
                    "virtio-mmio: refusing FEATURES_OK for driver features {f:#x} (offered {offered:#x}, VERSION_1 required)"
                );
                accepted &= !(FEATURES_OK | DRIVER_OK);
            }
        }
        self.status = accepted;
        if added & accepted & DRIVER_OK != 0 {
            self.activate();
        }
    }

    fn activate(&mut self) {
        let event_idx = self.driver_features & EVENT_IDX != 0;
        for q in &mut self.queues {
            q.set_event_idx(event_idx);
        }
        let mem = self.ram.memory();
        if let Some(i) = self
            .queues
            .iter()
            .position(|q| q.ready() && !q.is_valid(mem))
        {
            crate::warn_ratelimited!(
                "virtio-mmio: queue {i} rings lie outside guest RAM; device needs reset"
            );
            self.set_needs_reset();
            return;
        }
        if let Err(e) = self.device.activate(self.driver_features) {
            crate::warn_ratelimited!("virtio-mmio: device activation failed: {e}");
            self.set_needs_reset();
        }
    }

    fn write_driver_features(&mut self, value: u32) {
        if self.status & (DRIVER | FEATURES_OK | FAILED) != DRIVER {
            crate::warn_ratelimited!(
                "virtio-mmio: DriverFeatures write in status {:#x}; ignored",
                self.status
            );
            return;
        }
        let v = u64::from(value);
        match self.driver_features_sel {
            0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v,
            1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (v << 32),
            // No features above bit 63: only zero is a valid acceptance.
            sel if value != 0 => crate::warn_ratelimited!(
                "virtio-mmio: driver accepted unoffered features {value:#x} in word {sel}; ignored"
            ),
            _ => {}
        }
    }

    /// The selected queue if its configuration may be written now.
    fn queue_for_setup(&mut self, reg: &str) -> Option<&mut Queue> {
        let status = self.status;
        let sel = self.queue_sel;
        if status & (FEATURES_OK | DRIVER_OK | FAILED) != FEATURES_OK {
            crate::warn_ratelimited!(
                "virtio-mmio: {reg} write outside queue set-up (status {status:#x}); ignored"
            );
            return None;
        }
        match self.queues.get_mut(sel as usize) {
            None => {
                crate::warn_ratelimited!(
                    "virtio-mmio: {reg} write for absent queue {sel}; ignored"
                );
                None
            }
            Some(q) if q.ready() => {
                crate::warn_ratelimited!(
                    "virtio-mmio: {reg} write while queue {sel} is ready; ignored"
                );
                None
            }
            Some(q) => Some(q),
        }
    }

    fn write_queue_address(&mut self, reg: u64, value: u32) {
        let name = match reg {
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH => "QueueDesc",
            QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH => "QueueDriver",
            _ => "QueueDevice",
        };
        let Some(q) = self.queue_for_setup(name) else {
            return;
        };
        let old = match reg {
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH => q.desc_table(),
            QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH => q.avail_ring(),
            _ => q.used_ring(),
        };
        let v = u64::from(value);
        let addr = GuestAddress(if reg & 4 == 0 {
            (old & !0xffff_ffff) | v
        } else {
            (old & 0xffff_ffff) | (v << 32)
        });
        let result = match reg {
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH => q.try_set_desc_table_address(addr),
            QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH => q.try_set_avail_ring_address(addr),
            _ => q.try_set_used_ring_address(addr),
        };
        if let Err(e) = result {
            crate::warn_ratelimited!("virtio-mmio: {name} {:#x}: {e}; ignored", addr.0);
        }
    }

    fn write_queue_num(&mut self, value: u32) {
        let Some(q) = self.queue_for_setup("QueueNum") else {
            return;
        };
        let max = q.max_size();
        match u16::try_from(value) {
            Ok(n) if q.try_set_size(n).is_ok() => {}
            _ => crate::warn_ratelimited!(
                "virtio-mmio: QueueNum {value} is not a power of two in 1..={max}; ignored"
            ),
        }
    }

    fn write_queue_ready(&mut self, value: u32) {
        if value == 0 {
            // Stopping a queue is allowed at any time.
            if let Some(q) = self.queues.get_mut(self.queue_sel as usize) {
                q.set_ready(false);
            }
            return;
        }
        if let Some(q) = self.queue_for_setup("QueueReady") {
            q.set_ready(true);
        }
    }

    fn notify(&mut self, value: u32) {
        if self.status & (DRIVER_OK | NEEDS_RESET | FAILED) != DRIVER_OK {
            crate::warn_ratelimited!(
                "virtio-mmio: QueueNotify in status {:#x}; ignored",
                self.status
            );
            return;
        }
        self.run_queue(value as usize);
    }

    /// The host end has work for queue `index` (frames for the receiveq,
    /// say): runs it as a notification would, if the driver is running;
    /// otherwise does nothing (the work waits for the driver).
    pub fn kick(&mut self, index: usize) {
        if self.status & (DRIVER_OK | NEEDS_RESET | FAILED) == DRIVER_OK {
            self.run_queue(index);
        }
    }

    fn run_queue(&mut self, index: usize) {
        let mem = self.ram.memory();
        let Some(queue) = self.queues.get_mut(index).filter(|q| q.ready()) else {
            crate::warn_ratelimited!("virtio-mmio: absent or stopped queue {index}; not run");
            return;
        };
        match run_queue(&mut self.device, index, queue, mem, self.driver_features) {
            Ok(true) => self.raise(INT_VRING),
            Ok(false) => {}
            Err(e) => {
                crate::warn_ratelimited!(
                    "virtio-mmio: queue {index} failed: {e}; device needs reset"
                );
                self.set_needs_reset();
            }
        }
    }

    fn read_reg(&self, reg: u64) -> Result<u32, AccessError> {
        let queue = self.queues.get(self.queue_sel as usize);
        Ok(match reg {
            MAGIC => MAGIC_VALUE,
            VERSION => MMIO_VERSION,
            DEVICE_ID => self.device.device_type(),
            VENDOR => VENDOR_ID,
            DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered_features() as u32,
                1 => (self.offered_features() >> 32) as u32,
                _ => 0,
            },
            QUEUE_NUM_MAX => queue.map_or(0, |q| u32::from(q.max_size())),
            QUEUE_READY => queue.map_or(0, |q| u32::from(q.ready())),
            INTERRUPT_STATUS => self.interrupt_status,
            STATUS => self.status,
            // No shared memory regions: every length reads as -1 (§4.2.2).
            SHM_LEN_LOW..=SHM_BASE_HIGH => u32::MAX,
            CONFIG_GENERATION => self.config_generation,
            DEVICE_FEATURES_SEL | DRIVER_FEATURES | DRIVER_FEATURES_SEL | QUEUE_SEL | QUEUE_NUM
            | QUEUE_NOTIFY | INTERRUPT_ACK | QUEUE_DESC_LOW | QUEUE_DESC_HIGH
            | QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH | QUEUE_DEVICE_LOW | QUEUE_DEVICE_HIGH
            | SHM_SEL => return Err(AccessError::WriteOnly),
            _ => return Err(AccessError::NoRegister),
        })
    }

    fn write_reg(&mut self, reg: u64, value: u32) -> Result<(), AccessError> {
        match reg {
            DEVICE_FEATURES_SEL => self.device_features_sel = value,
            DRIVER_FEATURES => self.write_driver_features(value),
            DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            QUEUE_SEL => self.queue_sel = value,
            QUEUE_NUM => self.write_queue_num(value),
            QUEUE_READY => self.write_queue_ready(value),
            QUEUE_NOTIFY => self.notify(value),
            INTERRUPT_ACK => {
                self.interrupt_status &= !value;
                self.update_irq();
            }
            STATUS => self.write_status(value),
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH | QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH
            | QUEUE_DEVICE_LOW | QUEUE_DEVICE_HIGH => self.write_queue_address(reg, value),
            // There are no shared memory regions to select.
            SHM_SEL => {}
            MAGIC
            | VERSION
            | DEVICE_ID
            | VENDOR
            | DEVICE_FEATURES
            | QUEUE_NUM_MAX
            | INTERRUPT_STATUS
            | SHM_LEN_LOW..=SHM_BASE_HIGH
            | CONFIG_GENERATION => return Err(AccessError::ReadOnly),
            _ => return Err(AccessError::NoRegister),
        }
        Ok(())
    }
}

impl<D: VirtioDevice> Persist for VirtioMmio<D> {
    type State = VirtioMmioState<D::State>;
    /// The device's own restore arguments, guest RAM and the slot's
    /// interrupt line (as for [`VirtioMmio::new`]).
    type Args = (D::Args, Arc<GuestRam>, Arc<dyn IrqLine>);
    type Error = VirtioError;

    /// The current state, for a snapshot (call [`VirtioMmio::prepare_save`]
    /// first).
    fn save(&self) -> Self::State {
        VirtioMmioState {
            status: self.status,
            driver_features: self.driver_features,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status,
            config_generation: self.config_generation,
            queues: self.queues.iter().map(|q| q.state().into()).collect(),
            device: self.device.save(),
        }
    }

    /// Restores the device, then checks the transport state against it and
    /// the guest memory (status order, features offered, queue sizes and
    /// rings), and drives the interrupt line to the restored level.
    fn restore((args, ram, irq): Self::Args, state: &Self::State) -> Result<Self, VirtioError> {
        let device = D::restore(args, &state.device)?;
        let mut t = VirtioMmio::new(device, ram, irq)?;
        let bad = |m: String| Err(VirtioError::InvalidState(m));
        let s = state.status;
        if s & !STATUS_BITS != 0 || !status_order_ok(s) {
            return bad(format!("device status {s:#x}"));
        }
        if state.driver_features & !t.offered_features() != 0 {
            return bad(format!(
                "driver features {:#x} not offered",
                state.driver_features
            ));
        }
        if s & FEATURES_OK != 0 && state.driver_features & VERSION_1 == 0 {
            return bad("FEATURES_OK without VIRTIO_F_VERSION_1".into());
        }
        if state.interrupt_status & !(INT_VRING | INT_CONFIG) != 0 {
            return bad(format!("interrupt status {:#x}", state.interrupt_status));
        }
        let max_sizes = D::QUEUE_MAX_SIZES;
        if state.queues.len() != max_sizes.len() {
            return bad(format!(
                "{} queues, device has {}",
                state.queues.len(),
                max_sizes.len()
            ));
        }
        let event_idx = s & DRIVER_OK != 0 && state.driver_features & EVENT_IDX != 0;
        let running = s & (DRIVER_OK | NEEDS_RESET | FAILED) == DRIVER_OK;
        let mut queues = Vec::with_capacity(max_sizes.len());
        for (i, (snap, &max)) in state.queues.iter().zip(max_sizes).enumerate() {
            if snap.max_size != max {
                return bad(format!("queue {i} max size {} != {max}", snap.max_size));
            }
            if snap.event_idx_enabled != event_idx {
                return bad(format!("queue {i} event-idx flag disagrees with features"));
            }
            let q = Queue::try_from(QueueState::from(*snap))
                .map_err(|e| VirtioError::InvalidState(format!("queue {i}: {e}")))?;
            if running && q.ready() && !q.is_valid(t.ram.memory()) {
                return bad(format!("queue {i} rings lie outside guest RAM"));
            }
            queues.push(q);
        }
        t.queues = queues;
        t.status = s;
        t.driver_features = state.driver_features;
        t.device_features_sel = state.device_features_sel;
        t.driver_features_sel = state.driver_features_sel;
        t.queue_sel = state.queue_sel;
        t.interrupt_status = state.interrupt_status;
        t.config_generation = state.config_generation;
        t.irq_level = t.interrupt_status != 0;
        t.irq.set_level(t.irq_level);
        Ok(t)
    }
}

fn check_config_access(offset: u64, len: usize) -> Result<u64, AccessError> {
    if offset % len as u64 != 0 {
        return Err(AccessError::Alignment);
    }
    Ok(offset - CONFIG_OFFSET)
}

impl<D: VirtioDevice> MmioDevice for VirtioMmio<D> {
    fn read(&mut self, _vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        if offset >= CONFIG_OFFSET {
            let off = check_config_access(offset, data.len())?;
            self.device.read_config(off, data);
            return Ok(());
        }
        if data.len() != 4 {
            return Err(AccessError::Size);
        }
        if offset % 4 != 0 {
            return Err(AccessError::Alignment);
        }
        let value = self.read_reg(offset)?;
        set_le_value(data, u64::from(value));
        Ok(())
    }

    fn write(&mut self, _vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        if offset >= CONFIG_OFFSET {
            let off = check_config_access(offset, data.len())?;
            self.device.write_config(off, data);
            return Ok(());
        }
        if data.len() != 4 {
            return Err(AccessError::Size);
        }
        if offset % 4 != 0 {
            return Err(AccessError::Alignment);
        }
        self.write_reg(offset, le_value(data) as u32)
    }
}

#[cfg(test)]
pub(crate) mod tests;
