//! The host's side of the Ignition guest agent (`guest/tools/ignition-agent.c`,
//! `/bin/ignition-agent` in the guest): its wire protocol ([`frame`]) and a
//! blocking client ([`client::Agent`]) that reaches it through the VMM's
//! vsock Unix socket (`boot --vsock-uds PATH`, `CONNECT <port>`).
//!
//! ```no_run
//! use agent_client::{Agent, ExecRequest};
//! let agent = Agent::new("/tmp/vm.vsock");
//! let req = ExecRequest { argv: vec!["uname".into(), "-m".into()], ..Default::default() };
//! let done = agent.exec(&req, b"", 1 << 20)?;
//! assert_eq!(done.stdout, b"aarch64\n");
//! # Ok::<(), agent_client::AgentError>(())
//! ```
//!
//! The protocol is documented byte for byte in the book's chapter "The
//! guest agent"; the Python client (`ignition.agent`) speaks the same.

pub mod client;
pub mod frame;

pub use client::{Agent, AgentError, Completed, Stream};
pub use frame::{
    Entry, ExecRequest, Exit, FrameError, FrameType, IdentityRequest, Info, Stat, AGENT_PORT,
};
