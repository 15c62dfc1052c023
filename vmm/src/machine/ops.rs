//! The verbs a front-end may ask of a running VM, their results and their
//! errors. The console's escape keys and the control socket are two
//! front-ends over this one list: each turns its input into an [`Op`] and
//! hands it to the VM's [`Verbs`].
//!
//! [`Verbs::execute`] may be called from several threads at once: a verb
//! that takes long (a snapshot's write in the stop mode) holds back only
//! verbs that must wait for it (another snapshot), never `status`, `pause`
//! or `quit`.

use serde::Serialize;
use std::path::PathBuf;

/// A verb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Writes a snapshot layer (`name`, default: the next of `--name`'s
    /// NAME, NAME.2, ...). A paused VM stays paused.
    Snapshot {
        /// The layer's name.
        name: Option<String>,
        /// When to answer.
        wait: SnapshotWait,
    },
    /// Parks every vCPU and stops the guest's clock until [`Op::Resume`].
    Pause,
    /// Lets a VM paused by [`Op::Pause`] run again.
    Resume,
    /// The VM's [`Status`].
    Status,
    /// Ends the VM, as the guest's power-off would (a snapshot being
    /// written is finished first).
    Quit,
    /// Writes layer `name` (default: as [`Op::Snapshot`]'s) and starts
    /// `count` children restored from it, each its own `boot` process
    /// ([`crate::machine::branch`]); answers once every child is ready.
    Branch {
        /// The layer's name; the children are `NAME-1 .. NAME-count`.
        name: Option<String>,
        /// How many children.
        count: usize,
        /// The children's network host ends: a template `{i}` in which
        /// becomes each child's number (`tap:vm{i}`: `tap:vm1`, ...);
        /// `None`: the source's, if it can be one per child (`passt`).
        net: Option<String>,
        /// How the children start; `None`: [`BranchStart::Fork`] where the
        /// backend can, else [`BranchStart::Exec`].
        start: Option<BranchStart>,
    },
    /// Runs a command in the guest through its agent and waits for it to
    /// end (at most its timeout).
    Exec(ExecOp),
}

/// Longest [`ExecOp::timeout_ms`]: an hour.
pub const MAX_EXEC_TIMEOUT_MS: u32 = 3_600_000;

/// Most bytes of each of stdout and stderr [`Op::Exec`] collects; more is
/// an error (the command is killed).
pub const MAX_EXEC_OUTPUT: u64 = 1 << 20;

/// [`Op::Exec`]'s command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOp {
    /// The command and its arguments (1 to 4096; `argv[0]` looked up in the
    /// agent's `PATH`).
    pub argv: Vec<String>,
    /// Its stdin; `None`: `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Milliseconds until the agent kills it (1 to [`MAX_EXEC_TIMEOUT_MS`]).
    pub timeout_ms: u32,
}

/// When [`Op::Snapshot`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotWait {
    /// Once the layer is in the store, with [`Reply::Snapshot`].
    Committed,
    /// Once the guest runs again (a background layer is still being
    /// written; the console reports how it ends), with [`Reply::Done`].
    Resumed,
}

/// A verb's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// [`Op::Snapshot`]: the layer written.
    Snapshot(Written),
    /// [`Op::Status`].
    Status(Status),
    /// [`Op::Branch`]: the layer and the children, all ready.
    Branch(Branched),
    /// [`Op::Exec`].
    Exec(Executed),
    /// [`Op::Pause`], [`Op::Resume`], [`Op::Quit`], and a snapshot
    /// answered once the guest runs again: done.
    Done {},
}

/// A layer written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Written {
    /// The layer's name.
    pub name: String,
    /// `full` or `diff`.
    pub kind: &'static str,
    /// 16 KiB pages of memory it holds.
    pub pages: u64,
    /// vCPUs stopped to running again, in µs (0 if the VM was paused
    /// already).
    pub pause_us: u64,
    /// `Snapshot-write-time`, in ms.
    pub write_ms: u64,
}

/// A running child, as the answer lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Child {
    /// Its name (`B-i`): its snapshots' too.
    pub name: String,
    /// Its `boot` process.
    pub pid: u32,
    /// Its control socket.
    pub control: PathBuf,
    /// Its console socket.
    pub console: PathBuf,
    /// Its vsock socket (`None`: the source has no vsock device).
    pub vsock: Option<PathBuf>,
    /// Its vsock CID.
    pub cid: Option<u64>,
    /// Its network device's MAC (`52:54:00:12:34:56`; `None`: the source
    /// has no network device).
    pub mac: Option<String>,
    /// Its network device's host end (`passt`).
    pub net: Option<String>,
    /// Its log file.
    pub log: PathBuf,
    /// Its pid file.
    pub pid_file: PathBuf,
    /// The VM generation ID it reports (32 hex digits).
    pub generation_id: Option<String>,
}

/// How a branch's children start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BranchStart {
    /// Each child is a fork of the source, made while the source is paused
    /// for the layer: it shares the source's RAM copy-on-write and, on
    /// `emu`, the guest code the source translated
    /// ([`crate::hv::Hypervisor::FORKS_VCPUS`]; Linux only).
    Fork,
    /// Each child is this executable started anew with `--restore`: it
    /// maps the layer's memory and translates the guest's code itself.
    Exec,
}

/// [`Op::Branch`]'s result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Branched {
    /// The layer written.
    pub layer: Written,
    /// How the children started.
    pub start: BranchStart,
    /// The branch directory.
    pub dir: PathBuf,
    /// The children, `B-1` first, all ready.
    pub children: Vec<Child>,
    /// From the request to the last child ready, in ms.
    pub total_ms: u64,
}

/// How [`Op::Exec`]'s command ended, and its output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Executed {
    /// Its exit status (0 to 255), or `None` if a signal ended it.
    pub exit_code: Option<u32>,
    /// The signal that ended it, if one did.
    pub signal: Option<u32>,
    /// The timeout ended it (with `SIGKILL`).
    pub timed_out: bool,
    /// Its stdout, base64 (RFC 4648 with padding), at most
    /// [`MAX_EXEC_OUTPUT`] bytes before encoding.
    pub stdout: String,
    /// Its stderr, the same way.
    pub stderr: String,
}

/// What [`Op::Status`] reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    /// `running` or `paused`.
    pub state: &'static str,
    /// The vCPUs run and, in a VM restored from a snapshot whose guest
    /// agent had answered, the agent answered with the VM's new generation
    /// ID.
    pub ready: bool,
    /// The guest agent: `absent` (none asked: no vsock device, or
    /// `--no-agent`; or, where none was required, nothing listened within
    /// the agent timeout), `waiting`, `ready`, `failed`.
    pub agent: &'static str,
    /// Why the agent failed (`agent` is `failed`), else `None`.
    pub agent_error: Option<String>,
    /// The VM generation ID (32 lower-case hex digits) the guest sees, or
    /// `None` in a VM restored from a snapshot without the device.
    pub generation_id: Option<String>,
    /// Number of vCPUs.
    pub vcpus: usize,
    /// The backend's name (`emu`, `hvf`).
    pub backend: &'static str,
    /// Since `boot` started the VM, in ms.
    pub uptime_ms: u64,
    /// The `--restore` spec, if the VM was restored.
    pub restored_from: Option<String>,
    /// The layer the next snapshot is a diff against (`None`: it is a full
    /// one).
    pub parent: Option<String>,
    /// 16 KiB pages a diff written now would hold.
    pub dirty_pages: usize,
    /// A snapshot is being taken, or a background layer written.
    pub snapshot_in_progress: bool,
}

/// Why a verb was refused or failed. The VM is as it was before the verb.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// [`Op::Pause`] or [`Op::Resume`] refused.
    #[error(transparent)]
    Pause(#[from] PauseError),
    /// A snapshot was not written; nothing of it is in the store (the
    /// pages and disk chunks it would have held go into the next one).
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A branch was refused, or failed (no child of it runs).
    #[error(transparent)]
    Branch(#[from] BranchError),
    /// [`Op::Exec`] failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// Why a branch was refused or failed. A refusal comes before anything is
/// done; once the layer is written it stays in the store, and a failure
/// stops every child of the request.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    /// A count of 0 or above the limit (`boot --branch-limit`).
    #[error("count {count} is out of range: 1 to {limit} children (boot --branch-limit)")]
    Count {
        /// The count asked for.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The source does not track dirty pages.
    #[error("branching needs a source started with --track-dirty (the layer is written in the background, and the children's snapshots are diffs)")]
    NoTrackDirty,
    /// The layer's or a child's name is taken in the store, or the branch
    /// directory exists.
    #[error("'{0}' exists already; choose another name")]
    Exists(String),
    /// The layer's name, or a child's, is not a valid snapshot name.
    #[error("{0}")]
    BadName(String),
    /// The source's network host end cannot be one per child (the
    /// message says which, and the way forward).
    #[error("{0}")]
    Network(String),
    /// `start: fork` from a source whose backend cannot fork its vCPUs.
    #[error("this source cannot fork its children (the {0} backend's vCPUs do not survive a fork, or this host is not Linux); use start \"exec\"")]
    NoFork(&'static str),
    /// Neither `--branch-dir` nor `--control` says where the children's
    /// files go.
    #[error("no branch directory: start boot with --branch-dir or --control")]
    NoDir,
    /// The branch directory's path is too long for the children's sockets.
    #[error("{0}: too long for the children's Unix sockets (at most 107 bytes); use a shorter --branch-dir")]
    PathTooLong(String),
    /// The layer was not written; no child was started.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A child did not start or was not ready in time: every child of the
    /// request has been stopped; the layer stays in the store.
    #[error(
        "'{layer}' written, but child '{child}' failed, and every child was stopped: {reason}"
    )]
    Child {
        /// The layer's name.
        layer: String,
        /// The first child that failed.
        child: String,
        /// Why.
        reason: String,
    },
    /// Anything else before a child was started (the directory, ...).
    #[error("{0}")]
    Failed(String),
}

/// Why [`Op::Exec`] has no result.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The VMM asks no agent: no vsock device, or `--no-agent`.
    #[error("the VM has no guest agent to ask (no vsock device, or --no-agent)")]
    NoAgent,
    /// The agent did not run it (nothing listens, the command does not
    /// exist, ...), the connection failed, or the output exceeded
    /// [`MAX_EXEC_OUTPUT`]: the agent client's error.
    #[error("{0}")]
    Agent(String),
}

/// Why the VM could not be paused or resumed.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// Pause while paused.
    #[error("the VM is paused already")]
    AlreadyPaused,
    /// Resume while running.
    #[error("the VM is not paused")]
    NotPaused,
    /// The VM is ending.
    #[error("the VM is shutting down")]
    ShuttingDown,
    /// A vCPU did not stop or its state could not be read; the VM runs on.
    #[error("{0:#}")]
    Capture(anyhow::Error),
}

/// Why a snapshot was not written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Neither the request nor `boot --name` names the layer.
    #[error("no snapshot name (start boot with --name NAME)")]
    NoName,
    /// The VM is ending.
    #[error("'{name}' failed: the VM is shutting down")]
    ShuttingDown {
        /// The layer's name.
        name: String,
    },
    /// Capturing or writing the layer failed (the store's error, a vCPU's
    /// state, the disk's copy, ...).
    #[error("'{name}' failed, nothing was written: {reason:#}")]
    Failed {
        /// The layer's name.
        name: String,
        /// What failed, with its causes.
        reason: anyhow::Error,
    },
}

/// A running VM's verbs, for its front-ends.
pub trait Verbs: Send + Sync {
    /// Does `op` and returns its result, or why not. Callable from any
    /// thread, several at once (see the module's doc).
    fn execute(&self, op: Op) -> Result<Reply, OpError>;
}
