//! Ignition: an aarch64 virtual machine monitor.
//!
//! The crate is one VMM core shared by two hypervisor backends (see [`hv`]):
//! `hvf` (macOS Hypervisor.framework, the product) and `emu` (a portable
//! software vCPU built on unicorn-engine). Devices, exit decoding, boot and the
//! run loop are backend-neutral and tested on any host.

// The `emu-on-linux` default's name for unicorn-engine (the same crate as
// the `emu` feature's): the backend's code says `unicorn_engine` either way.
#[cfg(all(emu, not(feature = "emu")))]
extern crate unicorn_linux as unicorn_engine;

pub mod arch;
pub mod console;
pub mod daemon;
pub mod devices;
pub mod host_socket;
pub mod hv;
pub mod logging;
pub mod machine;
pub mod memory;
pub mod pipe;
pub mod sync;
