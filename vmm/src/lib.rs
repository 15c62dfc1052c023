//! Ignition: an aarch64 virtual machine monitor.
//!
//! The crate is one VMM core shared by two hypervisor backends (see [`hv`]):
//! `hvf` (macOS Hypervisor.framework, the product) and `emu` (a portable
//! software vCPU built on unicorn-engine). Devices, exit decoding, boot and the
//! run loop are backend-neutral and tested on any host.

pub mod arch;
pub mod console;
pub mod daemon;
pub mod devices;
pub mod host_socket;
pub mod hv;
pub mod logging;
pub mod machine;
pub mod memory;
pub mod sync;
