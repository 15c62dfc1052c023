//! The guest agent's readiness: a thread that tells the agent the VM's
//! generation ID (the value the VMM publishes through vmgenid) through the
//! VMM's own vsock socket, and waits for its answer.
//!
//! The agent (`/bin/ignition-agent`, vsock port 1024) answers once it has
//! taken the ID: on a restore, after it has given the clone a new machine
//! ID and network address and published the ID (`/run/ignition/generation`).
//! Its answer carrying the ID makes the VM ready; `Agent-ready-time = N ms`
//! reports when, from the VM's start (the same origin as `Restore-time`,
//! which keeps its meaning: the vCPUs run). Without an agent configured,
//! the VM is ready when its vCPUs run.

use crate::console;
use crate::machine::config::AgentConfig;
use crate::sync::Locked;
use agent_client::{Agent, AgentError, FrameError, IdentityRequest};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one exchange with the agent may take: the agent's rotation
/// (a DHCP lease included, which udhcpc bounds at about 5 s) on a loaded
/// software CPU.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the agent may take to acknowledge the request (it does at
/// once): a connection made while the restored guest handles the
/// transport reset may be reset in the guest alone, and is then tried
/// again.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause between attempts while nothing listens on the agent's port yet.
const RETRY: Duration = Duration::from_millis(100);

/// How long the first attempt waits for the guest to take connections
/// ([`Handshake::guest_up`]) if it never says so (a guest booted with
/// `boottimer=off`). Before its userspace is up the guest's vsock driver
/// may not be, and the VMM would time out connections the guest never
/// saw; before a restored guest has handled the transport reset, it may
/// reset a new connection without the host seeing it.
const GUEST_UP_WAIT: Duration = Duration::from_secs(30);

/// Where the agent is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentState {
    /// No agent configured (no vsock device, or `--no-agent`).
    Off,
    /// Not answered yet.
    Waiting,
    /// It answered with the VM's generation ID.
    Ready,
    /// It refused, or did not answer in time: why.
    Failed(String),
}

impl AgentState {
    /// The state's name for the control socket: `off`, `waiting`,
    /// `ready`, `failed`.
    pub fn name(&self) -> &'static str {
        match self {
            AgentState::Off => "off",
            AgentState::Waiting => "waiting",
            AgentState::Ready => "ready",
            AgentState::Failed(_) => "failed",
        }
    }
}

/// Whether the VM is ready: its vCPUs run, and its agent (if any) has
/// answered.
pub struct Readiness {
    vcpus: AtomicBool,
    agent: Mutex<AgentState>,
}

impl Readiness {
    /// Not ready; the agent `Waiting`, or `Off` without one.
    pub fn new(agent: bool) -> Self {
        Readiness {
            vcpus: AtomicBool::new(false),
            agent: Mutex::new(if agent {
                AgentState::Waiting
            } else {
                AgentState::Off
            }),
        }
    }

    /// The vCPUs run.
    pub fn vcpus_running(&self) {
        self.vcpus.store(true, Ordering::Release);
    }

    /// The agent's state.
    pub fn agent(&self) -> AgentState {
        self.agent.locked().clone()
    }

    /// The vCPUs run and the agent, if any, answered.
    pub fn ready(&self) -> bool {
        self.vcpus.load(Ordering::Acquire)
            && matches!(*self.agent.locked(), AgentState::Off | AgentState::Ready)
    }

    fn set(&self, s: AgentState) {
        *self.agent.locked() = s;
    }
}

/// What the agent thread needs.
pub struct Handshake {
    /// The VMM's vsock socket (`--vsock-uds`).
    pub uds: PathBuf,
    /// The VM's generation ID.
    pub generation_id: [u8; 16],
    /// The VM was restored from a snapshot (the agent rotates).
    pub restored: bool,
    /// The VM's start, the origin of `Agent-ready-time`.
    pub t0: Instant,
    /// Whether the VM has ended (the thread then stops).
    pub ended: Box<dyn Fn() -> bool + Send>,
    /// Whether the guest takes connections: its userspace is up (it wrote
    /// the boot timer) and it has handled a restore's transport reset.
    pub guest_up: Box<dyn Fn() -> bool + Send>,
}

/// Starts the thread that tells the agent the generation ID, once the
/// guest takes connections, retrying while nothing listens on its port,
/// until `cfg.timeout` has passed. It logs `Agent-ready-time = N ms` once
/// the agent answered with the ID, or one `Agent-failed:` line (also if
/// `h` is an error or the thread cannot start), and records the outcome
/// in `readiness`. The VM runs on either way.
pub fn start(cfg: &AgentConfig, h: anyhow::Result<Handshake>, readiness: Arc<Readiness>) {
    let started =
        h.and_then(|h| spawn(cfg, h, readiness.clone()).context("cannot spawn the agent thread"));
    if let Err(e) = started {
        failed(&readiness, format!("{e:#}"));
    }
}

/// Logs the agent's failure and records it.
fn failed(readiness: &Readiness, why: String) {
    console::message(&format!("Agent-failed: {why}"));
    readiness.set(AgentState::Failed(why));
}

/// The thread of [`start`].
fn spawn(
    cfg: &AgentConfig,
    h: Handshake,
    readiness: Arc<Readiness>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let req = IdentityRequest {
        generation_id: h.generation_id,
        restored: h.restored,
        address: cfg.address.clone().unwrap_or_default(),
    };
    let timeout = cfg.timeout;
    std::thread::Builder::new()
        .name("agent".into())
        .spawn(move || {
            let agent = Agent::new(&h.uds).with_timeout(EXCHANGE_TIMEOUT);
            let start = Instant::now();
            let deadline = start + timeout;
            while !(h.guest_up)() && start.elapsed() < GUEST_UP_WAIT.min(timeout) {
                if (h.ended)() {
                    return;
                }
                std::thread::sleep(RETRY);
            }
            let outcome = loop {
                if (h.ended)() {
                    return;
                }
                match agent.identity(&req, ACK_TIMEOUT) {
                    Ok(info) if info.generation_id == req.generation_id => break Ok(()),
                    Ok(_) => break Err("the agent answered with another generation ID".into()),
                    // Refused, or not the protocol.
                    Err(
                        e @ (AgentError::Guest { .. }
                        | AgentError::Unexpected(..)
                        | AgentError::Encode(_)
                        | AgentError::Frame(
                            FrameError::Version(_)
                            | FrameError::Reserved
                            | FrameError::UnknownType(_)
                            | FrameError::TooLong(_)
                            | FrameError::Malformed(_),
                        )),
                    ) => break Err(e.to_string()),
                    // Not listening yet, restarting (a respawned agent), a
                    // connection lost to the transport reset, or slow.
                    Err(e) if Instant::now() >= deadline => {
                        break Err(format!(
                            "no answer within {} s (last: {e})",
                            timeout.as_secs()
                        ))
                    }
                    Err(_) => std::thread::sleep(RETRY),
                }
            };
            if (h.ended)() {
                return;
            }
            match outcome {
                Ok(()) => {
                    readiness.set(AgentState::Ready);
                    console::message(&format!(
                        "Agent-ready-time = {} ms",
                        h.t0.elapsed().as_millis()
                    ));
                }
                Err(why) => failed(&readiness, why),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_means_vcpus_running_and_the_agent_answered_if_there_is_one() {
        let none = Readiness::new(false);
        assert!(!none.ready(), "not before the vCPUs run");
        none.vcpus_running();
        assert!(none.ready());
        assert_eq!(none.agent().name(), "off");

        let with = Readiness::new(true);
        with.vcpus_running();
        assert!(!with.ready());
        assert_eq!(with.agent().name(), "waiting");
        with.set(AgentState::Ready);
        assert!(with.ready());

        let failed = Readiness::new(true);
        failed.vcpus_running();
        failed.set(AgentState::Failed("no answer".into()));
        assert!(!failed.ready());
        assert_eq!(failed.agent(), AgentState::Failed("no answer".into()));
    }
}
