//! The VM generation ID: a 128-bit identifier in guest memory that changes
//! whenever the VM is restored from a snapshot, announced by an
//! edge-triggered interrupt. It follows Microsoft's "Virtual Machine
//! Generation ID" specification as Linux reads it from the device tree
//! (`microsoft,vmgenid`, `drivers/virt/vmgenid.c`): on the interrupt the
//! driver compares the identifier with the one it saw last and, when it
//! differs, mixes it into the RNG and reseeds it (`add_vmfork_randomness`),
//! so that VMs restored from one snapshot stop sharing random state.
//!
//! The identifier lives at [`layout::vmgenid_gpa`] (the last RAM page, kept
//! from the kernel by the device tree); the device writes it through
//! [`GuestRam::memory`], so the page is in the next diff snapshot.

use crate::arch::layout::{self, VMGENID_SIZE};
use crate::devices::{IrqLine, Persist};
use crate::memory::GuestRam;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

/// Bytes of the identifier.
const ID_BYTES: usize = VMGENID_SIZE as usize;

/// Errors of the VM generation ID.
#[derive(Debug, thiserror::Error)]
pub enum VmGenIdError {
    /// A saved state failed validation.
    #[error("invalid VM generation ID state: {0}")]
    InvalidState(String),
    /// The identifier could not be written into guest RAM.
    #[error("cannot write the VM generation ID at {gpa:#x}: {source}")]
    Write {
        /// Guest-physical address of the identifier.
        gpa: u64,
        /// vm-memory's error.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
}

/// What the device is made from.
pub struct VmGenIdArgs {
    /// Guest RAM, which holds the identifier.
    pub ram: Arc<GuestRam>,
    /// The notification's edge-triggered SPI ([`layout::VMGENID_INTID`]).
    pub irq: Arc<dyn IrqLine>,
    /// The identifier to publish: fresh host randomness.
    pub id: [u8; ID_BYTES],
}

/// The device's saved state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmGenIdState {
    /// Guest-physical address of the identifier.
    pub gpa: u64,
    /// The identifier the snapshotted guest saw.
    pub id: [u8; ID_BYTES],
}

/// The VM generation ID device.
pub struct VmGenId {
    gpa: u64,
    id: [u8; ID_BYTES],
}

impl VmGenId {
    /// A fresh boot's device: writes `args.id` before the guest runs (its
    /// driver reads it at probe time; no interrupt).
    pub fn new(args: VmGenIdArgs) -> Result<Self, VmGenIdError> {
        let gpa = layout::vmgenid_gpa(args.ram.range());
        write_id(&args.ram, gpa, &args.id)?;
        Ok(VmGenId { gpa, id: args.id })
    }

    /// The identifier the guest sees now.
    pub fn id(&self) -> [u8; ID_BYTES] {
        self.id
    }
}

/// Writes `id` at `gpa`, marking the page dirty.
fn write_id(ram: &GuestRam, gpa: u64, id: &[u8; ID_BYTES]) -> Result<(), VmGenIdError> {
    ram.memory()
        .write_slice(id, GuestAddress(gpa))
        .map_err(|source| VmGenIdError::Write { gpa, source })
}

impl Persist for VmGenId {
    type State = VmGenIdState;
    type Args = VmGenIdArgs;
    type Error = VmGenIdError;

    fn save(&self) -> VmGenIdState {
        VmGenIdState {
            gpa: self.gpa,
            id: self.id,
        }
    }

    /// A restored VM's device: publishes `args.id`, which must differ from
    /// the snapshot's, and raises the interrupt (a rising edge, pending in
    /// the GIC until the guest takes it). The state must name this RAM's
    /// identifier address.
    fn restore(args: VmGenIdArgs, state: &VmGenIdState) -> Result<Self, VmGenIdError> {
        let gpa = layout::vmgenid_gpa(args.ram.range());
        if state.gpa != gpa {
            return Err(VmGenIdError::InvalidState(format!(
                "identifier at {:#x}, but this RAM keeps it at {gpa:#x}",
                state.gpa
            )));
        }
        if args.id == state.id {
            return Err(VmGenIdError::InvalidState(
                "the new identifier equals the snapshot's".into(),
            ));
        }
        write_id(&args.ram, gpa, &args.id)?;
        args.irq.set_level(true);
        args.irq.set_level(false);
        Ok(VmGenId { gpa, id: args.id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::PAGE_SIZE;
    use std::sync::Mutex;

    /// Records every level driven.
    #[derive(Default)]
    struct Levels(Mutex<Vec<bool>>);
    impl IrqLine for Levels {
        fn set_level(&self, level: bool) {
            self.0.lock().unwrap().push(level);
        }
    }

    fn args(ram: &Arc<GuestRam>, irq: &Arc<Levels>, id: u8) -> VmGenIdArgs {
        VmGenIdArgs {
            ram: ram.clone(),
            irq: irq.clone(),
            id: [id; ID_BYTES],
        }
    }

    fn read_id(ram: &GuestRam) -> [u8; ID_BYTES] {
        let mut id = [0; ID_BYTES];
        ram.memory()
            .read_slice(&mut id, GuestAddress(layout::vmgenid_gpa(ram.range())))
            .unwrap();
        id
    }

    #[test]
    fn boot_publishes_the_id_in_the_last_page_without_an_interrupt() {
        let ram = Arc::new(GuestRam::new_anonymous(8 * PAGE_SIZE).unwrap());
        let irq = Arc::new(Levels::default());
        let d = VmGenId::new(args(&ram, &irq, 7)).unwrap();
        assert_eq!(read_id(&ram), [7; ID_BYTES]);
        assert_eq!(d.id(), [7; ID_BYTES]);
        assert!(irq.0.lock().unwrap().is_empty());
        // The write is the VMM's: the page goes into the next diff.
        assert_eq!(ram.vmm_dirty_pages(), [7]);
    }

    #[test]
    fn restore_publishes_a_new_id_and_raises_an_edge() {
        let ram = Arc::new(GuestRam::new_anonymous(8 * PAGE_SIZE).unwrap());
        let irq = Arc::new(Levels::default());
        let state = VmGenId::new(args(&ram, &irq, 1)).unwrap().save();
        let d = VmGenId::restore(args(&ram, &irq, 2), &state).unwrap();
        assert_eq!(read_id(&ram), [2; ID_BYTES]);
        assert_eq!(d.save().id, [2; ID_BYTES]);
        assert_eq!(*irq.0.lock().unwrap(), [true, false]);
    }

    #[test]
    fn restore_refuses_a_bad_state_and_an_unchanged_id() {
        let ram = Arc::new(GuestRam::new_anonymous(8 * PAGE_SIZE).unwrap());
        let irq = Arc::new(Levels::default());
        let state = VmGenId::new(args(&ram, &irq, 1)).unwrap().save();
        let same = VmGenId::restore(args(&ram, &irq, 1), &state).err().unwrap();
        assert!(same.to_string().contains("equals"), "{same}");
        let moved = VmGenIdState {
            gpa: state.gpa - PAGE_SIZE,
            ..state
        };
        let e = VmGenId::restore(args(&ram, &irq, 2), &moved).err().unwrap();
        assert!(e.to_string().contains("this RAM keeps it"), "{e}");
        assert!(irq.0.lock().unwrap().is_empty(), "no interrupt on failure");
    }
}
