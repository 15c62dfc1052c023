//! Architecture support: the machine's memory map, AArch64 syndrome decoding,
//! system-register identifiers, PSCI, the Linux arm64 Image format and the FDT.

pub mod esr;
pub mod fdt;
pub mod image;
pub mod layout;
pub mod psci;
pub mod sysreg;
