//! One save/restore shape for every device.
//!
//! A device's saved state is plain data, a `*State` type that serialises;
//! [`Persist::save`] takes it from a running device and [`Persist::restore`]
//! builds a new device in it. What the state does not hold (host files, the
//! console sink, the interrupt line, guest RAM) is given to the restore as
//! its [`Persist::Args`], as to the device's constructor.
//!
//! A saved state is untrusted: it comes from a file anyone could have
//! written. `restore` checks every field against the device it builds and
//! refuses a state the device could not have reached; a refused state builds
//! nothing. It never panics, whatever the state holds.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// A device whose state a snapshot saves and a restore rebuilds.
pub trait Persist: Sized {
    /// The saved state (`*State`): plain data, serialised into the machine
    /// state.
    type State: Serialize + DeserializeOwned + Clone + Debug + PartialEq;
    /// What a restore needs besides the state: the constructor's arguments.
    type Args;
    /// Why a state was refused.
    type Error;

    /// The device's state. For a snapshot, call it while nothing drives the
    /// device (every vCPU stopped, in-flight requests completed).
    fn save(&self) -> Self::State;

    /// A device made from `args` in the saved `state`, after checking it.
    fn restore(args: Self::Args, state: &Self::State) -> Result<Self, Self::Error>;
}
