//! Snapshots: writing a layer of a running VM, restoring a chain, and the
//! machine state's encoding.

pub mod restore;
pub mod save;
pub mod state;
mod writer;
