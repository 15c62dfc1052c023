//! Architecture support: the machine's memory map, AArch64 syndrome decoding,
//! system-register identifiers, PSCI, the Linux arm64 Image format and the FDT.

pub mod layout;
pub mod sysreg;
