//! The guest agent's readiness: a thread that tells the agent the VM's
//! generation ID (the value the VMM publishes through vmgenid) through the
//! VMM's own vsock socket, and waits for its answer.
//!
//! The agent (`/bin/ignition-agent`, vsock port 1024) answers once it has
//! taken the ID: on a restore, after it has given the clone a new machine
//! ID and network address and published the ID (`/run/ignition/generation`).
//! `Agent-ready-time = N ms` reports when, from the VM's start (the same
//! origin as `Restore-time`, which keeps its meaning: the vCPUs run).
//!
//! When the VM is ready needs no flag ([`Expect`]): a restore of a
//! snapshot whose agent had answered (the machine state records it) is
//! ready once the agent answers with the new generation ID, and fails
//! after the timeout; a fresh boot, and a restore of a snapshot whose
//! agent never answered, are ready when the vCPUs run, and the agent's
//! state is reported apart: `ready` when it answers, `absent` if nothing
//! listened within the timeout (a guest without the agent).

use crate::console;
use crate::machine::config::AgentConfig;
use crate::machine::ops;
use crate::sync::Locked;
use agent_client::{Agent, AgentError, ExecRequest, FrameError, IdentityRequest, AGENT_PORT};
use anyhow::Context;
use base64::Engine;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
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

/// Attempts made [`RETRY`] apart (about 10 s: a guest's agent starts
/// with its userspace); then [`SLOW_RETRY`] apart.
const FAST_RETRIES: u32 = 100;

/// Pause between later attempts.
const SLOW_RETRY: Duration = Duration::from_secs(1);

/// How long the first attempt waits for the guest to take connections
/// ([`Handshake::guest_up`]) if it never says so (a guest booted with
/// `boottimer=off`). Before its userspace is up the guest's vsock driver
/// may not be, and the VMM would time out connections the guest never
/// saw; before a restored guest has handled the transport reset, it may
/// reset a new connection without the host seeing it.
const GUEST_UP_WAIT: Duration = Duration::from_secs(30);

/// What the VMM expects of the guest agent, from the configuration and
/// the restored snapshot's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No agent is asked (no vsock device, or `--no-agent`): the VM is
    /// ready when its vCPUs run, the agent `absent`.
    Nothing,
    /// An agent may answer (a fresh boot; a restore of a snapshot whose
    /// agent had not answered, or that does not record it): the VM is
    /// ready when its vCPUs run; the agent is asked all the same, and its
    /// state reported apart.
    Maybe,
    /// The restored snapshot's agent had answered: the VM is ready once
    /// the agent answers with the new generation ID.
    Required,
}

impl Expect {
    /// What to expect: `asked`, an agent is configured; `answered`, the
    /// restored snapshot records that its agent had answered.
    pub fn new(asked: bool, answered: bool) -> Self {
        match (asked, answered) {
            (false, _) => Expect::Nothing,
            (true, false) => Expect::Maybe,
            (true, true) => Expect::Required,
        }
    }
}

/// Where the agent is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentState {
    /// None asked (no vsock device, or `--no-agent`), or, where none was
    /// required, nothing listened on its port within the timeout.
    Absent,
    /// Asked, not answered yet.
    Waiting,
    /// It answered with the VM's generation ID.
    Ready,
    /// It refused, answered wrongly, or (required, or having taken the
    /// connection) did not answer in time: why.
    Failed(String),
}

impl AgentState {
    /// The state's name for the control socket: `absent`, `waiting`,
    /// `ready`, `failed`.
    pub fn name(&self) -> &'static str {
        match self {
            AgentState::Absent => "absent",
            AgentState::Waiting => "waiting",
            AgentState::Ready => "ready",
            AgentState::Failed(_) => "failed",
        }
    }
}

/// Whether the VM is ready: its vCPUs run, and its agent answered if one
/// is required.
pub struct Readiness {
    expect: Expect,
    vcpus: AtomicBool,
    agent: Mutex<AgentState>,
    /// The agent answered in this VM or before its snapshot was taken
    /// (what snapshots record).
    answered: AtomicBool,
}

impl Readiness {
    /// Not ready; the agent `Waiting`, or `Absent` if nothing is expected.
    /// `answered`: the restored snapshot records that its agent had
    /// answered (and a snapshot of this VM records it too).
    pub fn new(expect: Expect, answered: bool) -> Self {
        Readiness {
            expect,
            vcpus: AtomicBool::new(false),
            agent: Mutex::new(if expect == Expect::Nothing {
                AgentState::Absent
            } else {
                AgentState::Waiting
            }),
            answered: AtomicBool::new(answered),
        }
    }

    /// What is expected of the agent.
    pub fn expect(&self) -> Expect {
        self.expect
    }

    /// The vCPUs run.
    pub fn vcpus_running(&self) {
        self.vcpus.store(true, Ordering::Release);
    }

    /// The agent's state.
    pub fn agent(&self) -> AgentState {
        self.agent.locked().clone()
    }

    /// The guest's agent has answered: in this VM, or before the snapshot
    /// it was restored from was taken.
    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    /// The vCPUs run and, if one is required, the agent answered.
    pub fn ready(&self) -> bool {
        self.vcpus.load(Ordering::Acquire)
            && (self.expect != Expect::Required || *self.agent.locked() == AgentState::Ready)
    }

    fn set(&self, s: AgentState) {
        if s == AgentState::Ready {
            self.answered.store(true, Ordering::Release);
        }
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
/// until `cfg.timeout` has passed. It records the outcome in `readiness`
/// and logs it in one line: `Agent-ready-time = N ms` once the agent
/// answered with the ID; `Agent-failed: WHY` if it refused or answered
/// wrongly, or did not answer in time where one is required or had taken
/// the connection (also if `h` is an error or the thread cannot start);
/// `Agent-absent: WHY` if nothing listened where none is required. The VM
/// runs on either way.
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

/// How the attempts ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The agent answered with the generation ID.
    Ready,
    /// The agent failed: why.
    Failed(String),
    /// No agent listened (none was required): why.
    Absent(String),
}

/// How attempt error `e` ends the attempts, with `expect`; `None`: try
/// again. `heard`: some attempt reached a listener; `late`: the timeout
/// (`secs`) has passed.
fn after(e: &AgentError, expect: Expect, heard: bool, late: bool, secs: u64) -> Option<Outcome> {
    match e {
        // Refused, or not the protocol.
        AgentError::Guest { .. }
        | AgentError::Unexpected(..)
        | AgentError::Encode(_)
        | AgentError::Frame(
            FrameError::Version(_)
            | FrameError::Reserved
            | FrameError::UnknownType(_)
            | FrameError::TooLong(_)
            | FrameError::Malformed(_),
        ) => Some(Outcome::Failed(e.to_string())),
        // Not listening yet, restarting (a respawned agent), a connection
        // lost to the transport reset, or slow: until the timeout.
        _ if !late => None,
        _ if expect == Expect::Required || heard => Some(Outcome::Failed(format!(
            "no answer within {secs} s (last: {e})"
        ))),
        _ => Some(Outcome::Absent(format!(
            "nothing listened on vsock port {AGENT_PORT} within {secs} s; the VM was ready when its vCPUs ran"
        ))),
    }
}

/// The pause before attempt `n` + 1 while nothing answers: [`RETRY`] for
/// the first [`FAST_RETRIES`], then [`SLOW_RETRY`] (a guest without the
/// agent is asked seldom).
fn pause(n: u32) -> Duration {
    if n < FAST_RETRIES {
        RETRY
    } else {
        SLOW_RETRY
    }
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
            let (mut heard, mut attempts) = (false, 0);
            let outcome = loop {
                if (h.ended)() {
                    return;
                }
                let e = match agent.identity(&req, ACK_TIMEOUT) {
                    Ok(info) if info.generation_id == req.generation_id => break Outcome::Ready,
                    Ok(_) => {
                        break Outcome::Failed(
                            "the agent answered with another generation ID".into(),
                        )
                    }
                    Err(e) => e,
                };
                heard |= !matches!(e, AgentError::NoAgent(_) | AgentError::Connect { .. });
                let late = Instant::now() >= deadline;
                match after(&e, readiness.expect(), heard, late, timeout.as_secs()) {
                    None => std::thread::sleep(pause(attempts)),
                    Some(end) => break end,
                }
                attempts += 1;
            };
            if (h.ended)() {
                return;
            }
            match outcome {
                Outcome::Ready => {
                    readiness.set(AgentState::Ready);
                    console::message(&format!(
                        "Agent-ready-time = {} ms",
                        h.t0.elapsed().as_millis()
                    ));
                }
                Outcome::Failed(why) => failed(&readiness, why),
                Outcome::Absent(why) => {
                    console::message(&format!("Agent-absent: {why}"));
                    readiness.set(AgentState::Absent);
                }
            }
        })
}

/// Runs `op` in the guest through the agent behind `uds` (the control
/// socket's `exec`), collecting at most [`ops::MAX_EXEC_OUTPUT`] bytes of
/// each stream; waits at most its timeout and [`EXCHANGE_TIMEOUT`] for
/// the agent, and no longer than the VM runs (`ended`: then an error; the
/// exchange's thread ends with its connection).
pub fn exec(
    uds: &Path,
    op: ops::ExecOp,
    ended: &dyn Fn() -> bool,
) -> Result<ops::Executed, ops::ExecError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let uds = uds.to_path_buf();
    std::thread::Builder::new()
        .name("agent-exec".into())
        .spawn(move || {
            let _ = tx.send(exec_now(&uds, op));
        })
        .map_err(|e| ops::ExecError::Agent(format!("cannot spawn the exec's thread: {e}")))?;
    loop {
        match rx.recv_timeout(RETRY) {
            Ok(r) => return r,
            Err(RecvTimeoutError::Timeout) if !ended() => {}
            Err(RecvTimeoutError::Timeout) => {
                return Err(ops::ExecError::Agent("the VM has ended".into()))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(ops::ExecError::Agent(
                    "the exec's thread ended without an answer".into(),
                ))
            }
        }
    }
}

/// [`exec`]'s exchange.
fn exec_now(uds: &Path, op: ops::ExecOp) -> Result<ops::Executed, ops::ExecError> {
    let req = ExecRequest {
        argv: op.argv,
        stdin: op.stdin.is_some(),
        timeout_ms: op.timeout_ms,
        ..ExecRequest::default()
    };
    let stdin = op.stdin.unwrap_or_default();
    let done = Agent::new(uds)
        .with_timeout(EXCHANGE_TIMEOUT)
        .exec(&req, &stdin, ops::MAX_EXEC_OUTPUT)
        .map_err(|e| ops::ExecError::Agent(e.to_string()))?;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    Ok(ops::Executed {
        exit_code: (!done.exit.signaled).then_some(done.exit.code),
        signal: done.exit.signaled.then_some(done.exit.code),
        timed_out: done.exit.timed_out,
        stdout: b64(&done.stdout),
        stderr: b64(&done.stderr),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_expected_follows_the_configuration_and_the_snapshot() {
        assert_eq!(Expect::new(false, false), Expect::Nothing);
        assert_eq!(Expect::new(false, true), Expect::Nothing);
        assert_eq!(Expect::new(true, false), Expect::Maybe);
        assert_eq!(Expect::new(true, true), Expect::Required);
    }

    #[test]
    fn ready_means_vcpus_running_and_the_agent_answered_if_required() {
        let none = Readiness::new(Expect::Nothing, false);
        assert!(!none.ready(), "not before the vCPUs run");
        none.vcpus_running();
        assert!(none.ready());
        assert_eq!(none.agent().name(), "absent");
        assert!(!none.answered());

        // A fresh boot: ready when the vCPUs run, the agent reported apart.
        let maybe = Readiness::new(Expect::Maybe, false);
        maybe.vcpus_running();
        assert!(maybe.ready());
        assert_eq!(maybe.agent().name(), "waiting");
        maybe.set(AgentState::Ready);
        assert!(maybe.ready() && maybe.answered());
        let gone = Readiness::new(Expect::Maybe, false);
        gone.vcpus_running();
        gone.set(AgentState::Absent);
        assert!(gone.ready() && !gone.answered());

        // A restore of a snapshot whose agent answered.
        let with = Readiness::new(Expect::Required, true);
        with.vcpus_running();
        assert!(!with.ready());
        assert_eq!(with.agent().name(), "waiting");
        assert!(with.answered(), "a snapshot of it records the agent");
        with.set(AgentState::Ready);
        assert!(with.ready());

        let failed = Readiness::new(Expect::Required, true);
        failed.vcpus_running();
        failed.set(AgentState::Failed("no answer".into()));
        assert!(!failed.ready());
        assert_eq!(failed.agent(), AgentState::Failed("no answer".into()));
    }

    #[test]
    fn attempts_end_as_the_expectation_says() {
        let none = AgentError::NoAgent(AGENT_PORT);
        let lost = AgentError::Closed("identity");
        let refused = AgentError::Guest {
            code: 1,
            message: "no".into(),
        };
        let fail = |n: Option<Outcome>| matches!(n, Some(Outcome::Failed(_)));
        for expect in [Expect::Maybe, Expect::Required] {
            // Before the timeout: again, unless refused.
            assert_eq!(after(&none, expect, false, false, 9), None);
            assert_eq!(after(&lost, expect, true, false, 9), None);
            assert!(fail(after(&refused, expect, true, false, 9)));
            // A listener that took the connection and did not answer fails.
            assert!(fail(after(&lost, expect, true, true, 9)));
        }
        // Nothing ever listened: a failure where the agent is required, an
        // absent agent where not.
        assert!(fail(after(&none, Expect::Required, false, true, 9)));
        let Some(Outcome::Absent(why)) = after(&none, Expect::Maybe, false, true, 9) else {
            panic!("not absent");
        };
        assert!(why.contains("within 9 s"), "{why}");
        assert_eq!(pause(0), RETRY);
        assert_eq!(pause(FAST_RETRIES), SLOW_RETRY);
    }
}
