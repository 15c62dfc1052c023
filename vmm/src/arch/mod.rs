//! Architecture support: the machine's memory map, AArch64 syndrome decoding,
//! exception entry, system-register identifiers, the ID register values
//! both backends advertise, the virtual timer, PSCI,
//! the Linux arm64 Image format and the FDT.

pub mod debug;
pub mod esr;
#[cfg(test)]
pub(crate) mod esr_vectors;
pub mod exception;
pub mod fdt;
pub mod idregs;
pub mod image;
pub mod layout;
pub mod psci;
pub mod sysreg;
pub mod timer;
