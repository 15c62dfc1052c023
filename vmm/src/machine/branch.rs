//! The `branch` verb: a layer of the running VM, then N children restored
//! from it, each its own `boot` process.
//!
//! `branch {name: B, count: N}` writes the layer `B` as a snapshot of the
//! source (paused as for `snapshot`; the source runs on), then starts the
//! children `B-1 .. B-N`: each is this executable again
//! ([`std::env::current_exe`]) with `--restore B --daemonize`, in a session
//! of its own (a daemon: killing the source does not touch it), with its
//! own control socket, console socket, vsock socket, log file and pid file
//! in the branch directory `<dir>/B/`, where `<dir>` is the source's
//! `--branch-dir`, else the directory of its control socket. A child's
//! identity is its own: a fresh VM generation ID (every restore has one), a
//! vsock CID derived from its name ([`child_cids`]), a MAC derived from its
//! name ([`derived_macs`]) and a network end of its own (a source on `--net
//! passt` has children on `--net passt`, each starting its own passt; the
//! request may name the children's ends with a template, `tap:vm{i}`; an
//! end two VMs would share is refused, see [`child_nets`]), and its snapshots are named after it (`B-1`, `B-1.2`,
//! ...), diffs on `B`. Its disk is an overlay on the layer's disk image:
//! nothing is copied.
//!
//! The answer comes once every child's control socket reports it `ready`;
//! if one fails to start, or is not ready within the timeout, every child
//! of the request is stopped (`SIGTERM`, then `SIGKILL`) and the answer
//! names the child and why. The layer `B` stays in the store either way
//! (the source's next snapshot is a diff on it), and so does the branch
//! directory with the children's log files.
//!
//! A branch whose source dies before its answer leaves no child: each
//! child holds the read end of a pipe from the source (`boot
//! --branch-guard FD`), and quits if the pipe ends before the source has
//! written [`GUARD_COMMIT`] to it, which it does once every child is
//! ready ([`watch_guard`]).

use crate::devices::virtio::net::host_end::NetHost;
use crate::devices::virtio::net::{derived_macs, format_mac};
use crate::machine::config::{BranchConfig, SnapshotMode};
use crate::machine::fork::Forked;
use crate::machine::ops::{BranchError, BranchStart, Branched, Child, Written};
use crate::pipe::{cloexec_pipe, set_cloexec};
use crate::sync::Locked;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a child stopped with `SIGTERM` (a failed request's) has to end
/// before it gets `SIGKILL`.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Test hook: with `IGNITION_TEST_BRANCH_FAIL_CHILD=NAME` in the source's
/// environment, the child `NAME` is started on a layer that is not in the
/// store, so that its restore fails as any child's start may, whatever
/// this machine's speed (`scripts/tests/test_branch_e2e.py`).
pub const TEST_FAIL_CHILD_ENV: &str = "IGNITION_TEST_BRANCH_FAIL_CHILD";

/// A branch lets its children start only once its layer's verified-file
/// cache is recorded ([`crate::machine::snapshot::Snapshots::wait_cache_record`],
/// at most about 50 ms after the commit) when they would otherwise hash at
/// least this many bytes of the layer's memory between them (count x the
/// layer's memory): 128 MiB, about 100 ms of one core's SHA-256 on the
/// machines measured. Below it, hashing costs them less than the wait.
pub const WAIT_FOR_CACHE_BYTES: u64 = 128 << 20;

/// Whether `count` children of a layer of `pages` 16 KiB pages of memory
/// should wait for its verified-file cache ([`WAIT_FOR_CACHE_BYTES`]).
pub fn wait_for_cache(count: usize, pages: u64) -> bool {
    (count as u64)
        .saturating_mul(pages)
        .saturating_mul(crate::arch::layout::PAGE_SIZE)
        >= WAIT_FOR_CACHE_BYTES
}

/// The byte the source writes on a child's guard pipe once every child of
/// the request is ready: the child is the branch's for good.
pub const GUARD_COMMIT: u8 = b'C';

/// Longest path a Unix socket can have (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What the children inherit of the source: how to start them. The
/// devices' facts (`net`, `cid`) are read when a request comes.
#[derive(Debug, Clone)]
pub struct Source {
    /// The branch settings (passed on: a child can branch too).
    pub branch: BranchConfig,
    /// `--store`, absolute.
    pub store: PathBuf,
    /// `--track-dirty`.
    pub track_dirty: bool,
    /// `--snapshot-mode`.
    pub mode: SnapshotMode,
    /// `--backend`'s name.
    pub backend: &'static str,
    /// `--control`, if any.
    pub control: Option<PathBuf>,
    /// The source's network host end (`--net`), if it has a network
    /// device.
    pub net: Option<NetHost>,
    /// The source's MAC, if it has a network device.
    pub mac: Option<[u8; 6]>,
    /// The source's vsock CID, if it has a vsock device.
    pub cid: Option<u64>,
    /// The guest agent's timeout, if the source waits for one.
    pub agent_timeout: Option<Duration>,
    /// Whether the source can fork its children
    /// ([`crate::hv::Hypervisor::FORKS_VCPUS`], on Linux; a
    /// [`set_child_main`] is needed too), [`BranchStart::Fork`].
    pub can_fork: bool,
}

/// A forked child's `boot`: given the child's arguments (as a started child
/// gets them, [`child_args`]) and the pipe its daemon's word goes to
/// ([`crate::daemon::Detach::forked`]), runs the VM and returns the exit
/// status. Set by the binary ([`set_child_main`]).
pub type ChildMain = fn(Vec<std::ffi::OsString>, OwnedFd) -> i32;

static CHILD_MAIN: OnceLock<ChildMain> = OnceLock::new();

/// Registers the binary's [`ChildMain`]; without one, children are started
/// anew.
pub fn set_child_main(main: ChildMain) {
    let _ = CHILD_MAIN.set(main);
}

/// What the source's fork runs, [`crate::machine::fork`]'s child work.
pub type ForkWork = Box<dyn FnOnce() -> i32 + Send>;

/// What the branch's snapshot gives back: the layer, and, if it was asked
/// to fork, the fork's outcome (the child's pid or why not; `None`: not
/// tried).
pub type Snapshotted = (Result<Written, BranchError>, Forked);

/// The children's names: `B-1 .. B-N`.
pub fn child_names(name: &str, count: usize) -> Vec<String> {
    (1..=count).map(|i| format!("{name}-{i}")).collect()
}

/// Refuses a request before anything is done: a count of 0 or above
/// `limit`, a source without dirty tracking, or a layer or child name that
/// is invalid or taken (`taken` says whether the store has a name).
pub fn check(
    name: &str,
    count: usize,
    limit: usize,
    track_dirty: bool,
    taken: impl Fn(&str) -> bool,
) -> Result<Vec<String>, BranchError> {
    if count == 0 || count > limit {
        return Err(BranchError::Count { count, limit });
    }
    if !track_dirty {
        return Err(BranchError::NoTrackDirty);
    }
    let names = child_names(name, count);
    for n in std::iter::once(name).chain(names.iter().map(String::as_str)) {
        snapshot_store::validate_name(n).map_err(|e| BranchError::BadName(format!("{e}")))?;
        if taken(n) {
            return Err(BranchError::Exists(n.to_string()));
        }
    }
    Ok(names)
}

/// The guests' vsock CIDs for `names`: each derived from its name (SHA-256,
/// within the valid guest CIDs), the same on every branch of that name,
/// and distinct from `source`'s and from each other's (a collision takes
/// the next CID).
pub fn child_cids(names: &[String], source: u64) -> Vec<u64> {
    // Guest CIDs: 3 ..= u32::MAX - 1.
    const FIRST: u64 = 3;
    const SPAN: u64 = u32::MAX as u64 - 1 - FIRST + 1;
    let mut used = vec![source];
    for n in names {
        let h = snapshot_store::sha256(n.as_bytes());
        let mut cid = FIRST + u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]])) % SPAN;
        while used.contains(&cid) {
            cid = FIRST + (cid - FIRST + 1) % SPAN;
        }
        used.push(cid);
    }
    used.split_off(1)
}

/// A child's network device: its host end and MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildNet {
    /// Its host end (`boot --net`).
    pub host: NetHost,
    /// Its MAC (`boot --mac`).
    pub mac: [u8; 6],
}

/// What becomes each child's number in a network template.
pub const CHILD_NUMBER: &str = "{i}";

/// The network ends and MACs of the children `names` of `src`: none
/// without a network device; else each a MAC derived from its name,
/// distinct from the source's and each other's, and the host end
/// `template` names, [`CHILD_NUMBER`] replaced with the child's number
/// (`tap:vm{i}`: `tap:vm1`, `tap:vm2`, ...), else the source's if it can
/// be one per child (`passt`: each child starts its own). Errors: a
/// template without a network device, or that is not a host end; a host
/// end two of the VMs would share (a passt or socket_vmnet socket serves
/// one guest, a TAP interface one VM), the message naming the ways
/// forward.
pub fn child_nets(
    src: &Source,
    names: &[String],
    template: Option<&str>,
) -> Result<Vec<Option<ChildNet>>, BranchError> {
    let (host, mac) = match (&src.net, src.mac, template) {
        (Some(h), Some(m), _) => (h, m),
        (_, _, Some(t)) => {
            return Err(BranchError::Network(format!(
                "net {t:?}: the source has no network device"
            )))
        }
        _ => return Ok(vec![None; names.len()]),
    };
    let hosts: Vec<NetHost> = match template {
        Some(t) => (1..=names.len())
            .map(|i| {
                t.replace(CHILD_NUMBER, &i.to_string())
                    .parse()
                    .map_err(|e| BranchError::Network(format!("net {t:?}: {e}")))
            })
            .collect::<Result<_, _>>()?,
        None => vec![host.clone(); names.len()],
    };
    let mut seen = vec![host];
    for h in &hosts {
        if *h != NetHost::Passt && seen.contains(&h) {
            let (what, serves) = match h {
                NetHost::Tap(_) => ("TAP interface", "one VM"),
                _ => ("passt or socket_vmnet socket", "one guest"),
            };
            let whose = if h == host {
                "the source's network end"
            } else {
                "a child's network end"
            };
            return Err(BranchError::Network(format!(
                "{whose}, --net {h}, cannot be shared: a {what} serves {serves}; start the source with --net passt (each child starts a passt of its own), or give the children ends of their own with a template (\"net\": \"tap:vm{CHILD_NUMBER}\", boot branch --net tap:vm{CHILD_NUMBER})"
            )));
        }
        seen.push(h);
    }
    Ok(hosts
        .into_iter()
        .zip(derived_macs(names, mac))
        .map(|(host, mac)| Some(ChildNet { host, mac }))
        .collect())
}

/// One child's files in the branch directory `dir`.
fn child_files(dir: &Path, name: &str, vsock: bool) -> Child {
    let f = |ext: &str| dir.join(format!("{name}.{ext}"));
    Child {
        name: name.to_string(),
        pid: 0,
        control: f("control"),
        console: f("console"),
        vsock: vsock.then(|| f("vsock")),
        cid: None,
        mac: None,
        net: None,
        log: f("log"),
        pid_file: f("pid"),
        generation_id: None,
    }
}

/// The branch directory of layer `name`.
fn branch_dir(src: &Source, name: &str) -> Result<PathBuf, BranchError> {
    let base = match (&src.branch.dir, &src.control) {
        (Some(d), _) => d.clone(),
        // A bare file name's parent is "": the working directory.
        (None, Some(c)) => match c.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
        (None, None) => return Err(BranchError::NoDir),
    };
    let base = std::path::absolute(&base)
        .map_err(|e| BranchError::Failed(format!("{}: {e}", base.display())))?;
    Ok(base.join(name))
}

/// `boot`'s arguments for `child`, restored from layer `layer`, on the
/// network end `net` (its host end and MAC).
fn child_args(
    src: &Source,
    layer: &str,
    child: &Child,
    net: Option<&ChildNet>,
    guard: RawFd,
) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = Vec::new();
    let mut arg = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
        a.push(k.into());
        a.push(v.as_ref().to_os_string());
    };
    arg("--restore", &layer);
    arg("--store", &src.store);
    arg("--name", &child.name);
    arg("--backend", &src.backend);
    arg("--control", &child.control);
    let mut console = std::ffi::OsString::from("socket:");
    console.push(&child.console);
    arg("--console", &console);
    arg("--pid-file", &child.pid_file);
    arg("--log-file", &child.log);
    arg(
        "--snapshot-mode",
        &match src.mode {
            SnapshotMode::Background => "background",
            SnapshotMode::Stop => "stop",
        },
    );
    arg("--branch-limit", &src.branch.limit.to_string());
    arg(
        "--branch-timeout",
        &src.branch.timeout.as_secs().to_string(),
    );
    if let Some(d) = &src.branch.dir {
        arg("--branch-dir", d);
    }
    if let Some(n) = net {
        arg("--net", &n.host.to_string());
        arg("--mac", &format_mac(&n.mac));
    }
    if let (Some(v), Some(cid)) = (&child.vsock, child.cid) {
        arg("--vsock-uds", v);
        arg("--vsock-cid", &cid.to_string());
        if let Some(t) = src.agent_timeout {
            arg("--agent-timeout", &t.as_secs().max(1).to_string());
        }
    }
    arg("--branch-guard", &guard.to_string());
    let flags = [
        (
            child.vsock.is_some() && src.agent_timeout.is_none(),
            "--no-agent",
        ),
        (src.track_dirty, "--track-dirty"),
        (true, "--daemonize"),
    ];
    a.extend(flags.iter().filter(|f| f.0).map(|f| f.1.into()));
    a
}

/// Checks `name`, `count` and the network template `net` against the
/// source, writes the layer with `snapshot` and starts the children (see
/// the module's doc).
pub fn branch(
    src: &Source,
    name: &str,
    count: usize,
    net: Option<&str>,
    start: Option<BranchStart>,
    snapshot: impl FnOnce(String, Option<ForkWork>) -> Snapshotted,
) -> Result<Branched, BranchError> {
    let t0 = Instant::now();
    let store = snapshot_store::Store::open(&src.store).ok();
    let names = check(name, count, src.branch.limit, src.track_dirty, |n| {
        store.as_ref().is_some_and(|s| s.contains(n))
    })?;
    let dir = branch_dir(src, name)?;
    if dir.exists() {
        return Err(BranchError::Exists(dir.display().to_string()));
    }
    let cids = src.cid.map(|c| child_cids(&names, c)).unwrap_or_default();
    let nets = child_nets(src, &names, net)?;
    let mut children: Vec<Child> = names
        .iter()
        .zip(&nets)
        .enumerate()
        .map(|(i, (n, net))| {
            let mut c = child_files(&dir, n, src.cid.is_some());
            c.cid = cids.get(i).copied();
            c.net = net.as_ref().map(|n| n.host.to_string());
            c.mac = net.as_ref().map(|n| format_mac(&n.mac));
            c
        })
        .collect();
    // The vsock device also listens on `<vsock>_PORT` (up to 11 more bytes).
    let longest = children.iter().map(|c| {
        let vsock = c.vsock.as_ref().map_or(0, |v| v.as_os_str().len() + 11);
        vsock
            .max(c.control.as_os_str().len())
            .max(c.console.as_os_str().len())
    });
    if longest.max().unwrap_or(0) > MAX_SOCKET_PATH {
        return Err(BranchError::PathTooLong(dir.display().to_string()));
    }
    let exe = std::env::current_exe()
        .map_err(|e| BranchError::Failed(format!("cannot find this executable: {e}")))?;

    let make_dir = || {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| BranchError::Failed(format!("{}: {e}", dir.display())))
    };
    let can_fork = src.can_fork && CHILD_MAIN.get().is_some();
    let start = match start {
        Some(BranchStart::Fork) if !can_fork => return Err(BranchError::NoFork(src.backend)),
        Some(s) => s,
        None if can_fork => BranchStart::Fork,
        None => BranchStart::Exec,
    };
    let (layer, started) = if start == BranchStart::Fork {
        let (start, work) = fork_pipes(&exe, src, name, &children, &nets)
            .map_err(|e| BranchError::Failed(format!("cannot make the children's pipes: {e}")))?;
        let (layer, forked) = snapshot(name.to_string(), Some(work));
        // Without a go, the fork's child ends (and is reaped here).
        let layer = match layer.and_then(|l| make_dir().map(|()| l)) {
            Ok(l) => l,
            Err(e) => {
                start.abandon(&forked);
                return Err(e);
            }
        };
        let deadline = Instant::now() + src.branch.timeout;
        (layer, start.go(forked, &mut children, deadline))
    } else {
        let layer = snapshot(name.to_string(), None).0?;
        make_dir()?;
        let deadline = Instant::now() + src.branch.timeout;
        let started = start_all(&exe, src, name, &mut children, &nets, deadline);
        (layer, started)
    };
    match started {
        Ok(()) => Ok(Branched {
            layer,
            start,
            dir,
            children,
            total_ms: t0.elapsed().as_millis() as u64,
        }),
        Err((child, why)) => {
            stop_all(&children);
            Err(BranchError::Child {
                layer: name.to_string(),
                child,
                reason: why,
            })
        }
    }
}

/// Held while a request makes a guard pipe and spawns its child, so that
/// no other request's child inherits the pipe's read end, which is open
/// across exec for that time.
static SPAWNING: Mutex<()> = Mutex::new(());

/// A guard pipe: the write end close-on-exec, the read end not (the child
/// spawned next inherits it; the caller closes it once that child is
/// spawned). Called with [`SPAWNING`] held. With no `pre_exec` hook the
/// standard library spawns with `posix_spawn`, which does not copy the
/// source's page tables as a `fork` would (a few ms per child for a booted
/// 512 MiB guest, one child after the other).
fn guard_pipe() -> nix::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = nix::unistd::pipe()?;
    set_cloexec(&write)?;
    Ok((read, write))
}

/// Starts every child, then waits for each to be ready. Errors: the first
/// child that failed, and why.
fn start_all(
    exe: &Path,
    src: &Source,
    layer: &str,
    children: &mut [Child],
    nets: &[Option<ChildNet>],
    deadline: Instant,
) -> Result<(), (String, String)> {
    let fail = std::env::var(TEST_FAIL_CHILD_ENV).ok();
    // All at once: each waits for its own restore.
    let mut spawned = Vec::new();
    let mut guards = Vec::new();
    for (c, net) in children.iter().zip(nets) {
        // No other request's child may inherit this child's read end.
        let spawning = SPAWNING.locked();
        let (read, write) = guard_pipe()
            .map_err(|e| (c.name.clone(), format!("cannot make its guard pipe: {e}")))?;
        let fd = read.as_raw_fd();
        let missing;
        let layer = if fail.as_deref() == Some(c.name.as_str()) {
            missing = format!("{layer}-test-missing");
            &missing
        } else {
            layer
        };
        let mut cmd = Command::new(exe);
        cmd.args(child_args(src, layer, c, net.as_ref(), fd))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Not in the source's process group: a signal to the source's
            // group (a terminal's Ctrl-C) does not reach the child.
            .process_group(0);
        let p = cmd.spawn().map_err(|e| {
            (
                c.name.clone(),
                format!("cannot start {}: {e}", exe.display()),
            )
        })?;
        drop(read);
        drop(spawning);
        guards.push(std::fs::File::from(write));
        spawned.push(p);
    }
    let mut first_error = None;
    for (c, p) in children.iter_mut().zip(spawned) {
        // `--daemonize`: the process exits once the VM runs, or with the
        // error that stopped it.
        let out = p.wait_with_output();
        let failed = match out {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .trim_start_matches("boot: ")
                    .to_string(),
            ),
            Err(e) => Some(format!("cannot wait for its boot: {e}")),
        };
        match failed {
            None => match read_pid(&c.pid_file) {
                Ok(pid) => c.pid = pid,
                Err(e) => {
                    first_error.get_or_insert((c.name.clone(), e));
                }
            },
            Some(why) => {
                first_error.get_or_insert((c.name.clone(), why));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    ready_and_commit(children, guards, deadline)
}

/// Waits until every running child is ready, then commits each one's
/// guard pipe. Errors: the first child that failed, and why.
fn ready_and_commit(
    children: &mut [Child],
    guards: Vec<std::fs::File>,
    deadline: Instant,
) -> Result<(), (String, String)> {
    for c in children.iter_mut() {
        c.generation_id = wait_ready(c, deadline).map_err(|why| (c.name.clone(), why))?;
    }
    for (c, mut g) in children.iter().zip(guards) {
        g.write_all(&[GUARD_COMMIT])
            .map_err(|e| (c.name.clone(), format!("its guard pipe: {e}")))?;
    }
    Ok(())
}

/// The byte that lets a forked branch's fork start the children: the layer
/// is in the store.
const GO: u8 = b'G';

/// The source's side of a forked branch: the go pipe's write end, and per
/// child its guard pipe's write end and its daemon-word pipe's read end.
struct ForkStart {
    go: std::fs::File,
    guards: Vec<std::fs::File>,
    words: Vec<std::fs::File>,
}

/// One child's side of a forked branch, carried through the source's fork.
struct ForkChild {
    args: Vec<std::ffi::OsString>,
    guard: OwnedFd,
    word: OwnedFd,
}

/// The pipes of a forked branch, made before the snapshot's pause, and what
/// the source's fork runs ([`fork_work`]); `exe` is this executable.
fn fork_pipes(
    exe: &Path,
    src: &Source,
    layer: &str,
    children: &[Child],
    nets: &[Option<ChildNet>],
) -> nix::Result<(ForkStart, ForkWork)> {
    let fail = std::env::var(TEST_FAIL_CHILD_ENV).ok();
    let (go_read, go) = cloexec_pipe()?;
    let (mut guards, mut words, mut kids) = (Vec::new(), Vec::new(), Vec::new());
    for (c, net) in children.iter().zip(nets) {
        let (guard, guard_write) = cloexec_pipe()?;
        let (word_read, word) = cloexec_pipe()?;
        let missing = format!("{layer}-test-missing");
        let layer = if fail.as_deref() == Some(c.name.as_str()) {
            &missing
        } else {
            layer
        };
        kids.push(ForkChild {
            args: child_args(src, layer, c, net.as_ref(), guard.as_raw_fd()),
            guard,
            word,
        });
        guards.push(std::fs::File::from(guard_write));
        words.push(std::fs::File::from(word_read));
    }
    let start = ForkStart {
        go: std::fs::File::from(go),
        guards,
        words,
    };
    // A forked child's main thread is named as exec names a started child's
    // (its executable's file name: `pgrep -x boot` finds both), not after
    // the thread that forked it (`vcpu0`).
    let comm = exe
        .file_name()
        .and_then(|n| std::ffi::CString::new(n.as_bytes()).ok())
        .unwrap_or_else(|| c"boot".into());
    let (store, layer) = (src.store.clone(), layer.to_string());
    Ok((
        start,
        Box::new(move || fork_work(go_read, kids, comm, &store, &layer)),
    ))
}

/// In the source's fork (single-threaded, [`crate::machine::fork`]), named
/// `branch-fork`: keeps only the children's descriptors, waits for [`GO`]
/// (the layer is in the store), maps the memory of `layer` (in `store`)
/// where the source's RAM was, then forks each child, named `comm`, which
/// runs the binary's [`ChildMain`] on the inherited VM. Ends once every
/// child is forked (1 without a go, or if the memory cannot be mapped: each
/// child's daemon word then says why).
fn fork_work(
    go: OwnedFd,
    kids: Vec<ForkChild>,
    comm: std::ffi::CString,
    store: &Path,
    layer: &str,
) -> i32 {
    crate::machine::fork::name_thread(c"branch-fork");
    let mut keep: Vec<RawFd> = vec![go.as_raw_fd()];
    keep.extend(
        kids.iter()
            .flat_map(|k| [k.guard.as_raw_fd(), k.word.as_raw_fd()]),
    );
    close_fds_except(&keep);
    if let Ok(null) = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for to in 0..3 {
            // SAFETY: dup2 onto a standard descriptor; touches no memory.
            unsafe { libc::dup2(null.as_raw_fd(), to) };
        }
    }
    let mut go = std::fs::File::from(go);
    let mut byte = [0u8];
    let went = loop {
        match go.read(&mut byte) {
            Ok(1) => break byte[0] == GO,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => break false,
        }
    };
    let Some(main) = CHILD_MAIN.get().copied() else {
        return 1;
    };
    if !went {
        return 1;
    }
    if let Err(e) = crate::machine::fork::map_layer_ram(store, layer) {
        for kid in kids {
            let _ = std::fs::File::from(kid.word).write_all(format!("E{e:#}").as_bytes());
        }
        return 1;
    }
    for kid in kids {
        // SAFETY: this process has one thread; the child runs the binary's
        // main on it and ends with `_exit`.
        match unsafe { libc::fork() } {
            0 => {
                crate::machine::fork::name_thread(&comm);
                close_fds_except(&[kid.guard.as_raw_fd(), kid.word.as_raw_fd(), 0, 1, 2]);
                // Seen as what it is (`ps`, a supervisor): `boot --restore ...`.
                #[cfg(target_os = "linux")]
                {
                    let exe = std::env::args_os().next().unwrap_or_else(|| "boot".into());
                    let argv: Vec<_> = std::iter::once(exe)
                        .chain(kid.args.iter().cloned())
                        .collect();
                    if let Err(e) = crate::machine::fork::set_cmdline(&argv) {
                        tracing::warn!("cannot set the child's command line: {e}");
                    }
                }
                let code = main(kid.args, kid.word);
                // SAFETY: ends the child; nothing of the fork's is dropped.
                unsafe { libc::_exit(code) }
            }
            -1 => {
                let e = std::io::Error::last_os_error();
                let _ = std::fs::File::from(kid.word)
                    .write_all(format!("Ecannot fork: {e}").as_bytes());
            }
            _ => {}
        }
    }
    0
}

/// Closes every descriptor of this process above 2 but `keep`.
fn close_fds_except(keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd > 2).collect();
    keep.sort_unstable();
    let mut from: RawFd = 3;
    for &k in keep.iter().chain(std::iter::once(&RawFd::MAX)) {
        if k > from {
            close_range(from, k - 1);
        }
        from = k.saturating_add(1);
    }
}

/// Closes descriptors `from..=to`.
#[cfg(target_os = "linux")]
fn close_range(from: RawFd, to: RawFd) {
    // SAFETY: close_range(2) only closes descriptors.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            from as libc::c_uint,
            to as libc::c_uint,
            0 as libc::c_uint,
        )
    };
}

/// Closes descriptors `from..=to` (up to the process's limit).
#[cfg(not(target_os = "linux"))]
fn close_range(from: RawFd, to: RawFd) {
    // SAFETY: sysconf reads a limit.
    let max =
        unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(0, RawFd::MAX as libc::c_long) as RawFd;
    for fd in from..=to.min(max) {
        // SAFETY: close only closes a descriptor.
        unsafe { libc::close(fd) };
    }
}

impl ForkStart {
    /// The branch stops before its children start: the fork's child, if
    /// there is one, gets no go and ends; it is reaped.
    fn abandon(self, forked: &Forked) {
        drop(self);
        if let Some(Ok(pid)) = forked {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(*pid), None);
        }
    }

    /// The layer is in the store: lets the fork start the children, waits
    /// for each one's daemon's word (running, or its error), then until each
    /// is ready, then commits them. Errors: the first child that failed, and
    /// why.
    fn go(
        mut self,
        forked: Forked,
        children: &mut [Child],
        deadline: Instant,
    ) -> Result<(), (String, String)> {
        let first = children.first().map(|c| c.name.clone()).unwrap_or_default();
        let pid = match forked {
            Some(Ok(pid)) => pid,
            Some(Err(e)) => return Err((first, format!("the source could not fork: {e}"))),
            None => return Err((first, "the source did not fork".into())),
        };
        let went = self.go.write_all(&[GO]);
        drop(self.go);
        // It ends once it has forked every child.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        went.map_err(|e| (first, format!("the source's fork is gone: {e}")))?;
        let mut first_error = None;
        for (c, mut word) in children.iter_mut().zip(self.words) {
            let mut w = Vec::new();
            let _ = word.read_to_end(&mut w);
            let failed = match w.split_first() {
                Some((b'R', _)) => match read_pid(&c.pid_file) {
                    Ok(pid) => {
                        c.pid = pid;
                        None
                    }
                    Err(e) => Some(e),
                },
                Some((b'E', msg)) => Some(String::from_utf8_lossy(msg).trim().to_string()),
                _ => Some(format!(
                    "its boot ended before the VM ran; see {}",
                    c.log.display()
                )),
            };
            if let Some(why) = failed {
                first_error.get_or_insert((c.name.clone(), why));
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        ready_and_commit(children, self.guards, deadline)
    }
}

/// In a child (`boot --branch-guard FD`): reads the guard pipe `guard` on a
/// thread of its own and calls `quit` if it ends before [`GUARD_COMMIT`]
/// (the source died, or stops the children of a failed request), else
/// closes it and returns.
pub fn watch_guard(guard: OwnedFd, quit: Box<dyn FnOnce() + Send>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("branch-guard".into())
        .spawn(move || {
            let mut byte = [0u8];
            let mut f = std::fs::File::from(guard);
            let committed = loop {
                match f.read(&mut byte) {
                    Ok(1) => break byte[0] == GUARD_COMMIT,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    _ => break false,
                }
            };
            if !committed {
                crate::console::message(
                    "[branch] the branch's source ended or stopped the branch before it completed: quitting",
                );
                quit();
            }
        })?;
    Ok(())
}

/// The pid in a pid file (`PID\n`).
fn read_pid(path: &Path) -> Result<u32, String> {
    let s = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.trim()
        .parse()
        .map_err(|_| format!("{}: not a pid: {s:?}", path.display()))
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Asks `c`'s control socket for its status until it is ready (returns its
/// generation ID), its agent failed, its process ended, or `deadline`.
fn wait_ready(c: &Child, deadline: Instant) -> Result<Option<String>, String> {
    loop {
        if !alive(c.pid) {
            return Err(format!(
                "its boot (pid {}) ended before it was ready; see {}",
                c.pid,
                c.log.display()
            ));
        }
        let status = request(
            &c.control,
            &serde_json::json!({"command": "status"}),
            Some(Duration::from_secs(10)),
        );
        if let Ok(s) = &status {
            if s["ready"] == true {
                return Ok(s["generation_id"].as_str().map(str::to_string));
            }
            if s["agent"] == "failed" {
                return Err(format!(
                    "its guest agent failed: {}",
                    s["agent_error"].as_str().unwrap_or("no reason given")
                ));
            }
        }
        if Instant::now() >= deadline {
            return Err(match status {
                Ok(s) => format!(
                    "not ready in time (agent: {})",
                    s["agent"].as_str().unwrap_or("?")
                ),
                Err(e) => format!("not ready in time: {e}"),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `req` to the control socket at `path` and returns the answer's
/// `result`; errors: the connection's, or the VM's error as `CODE:
/// MESSAGE`. `timeout` bounds each read and write (`None`: none, as a
/// `branch` may take long).
pub fn request(
    path: &Path,
    req: &serde_json::Value,
    timeout: Option<Duration>,
) -> Result<serde_json::Value, String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.set_read_timeout(timeout).map_err(|e| e.to_string())?;
    s.set_write_timeout(timeout).map_err(|e| e.to_string())?;
    writeln!(s, "{req}").map_err(|e| format!("{}: {e}", path.display()))?;
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut v: serde_json::Value = serde_json::from_str(&answer)
        .map_err(|e| format!("{}: bad answer {answer:?}: {e}", path.display()))?;
    if v["ok"] != true {
        let e = &v["error"];
        return Err(format!(
            "{}: {}",
            e["code"].as_str().unwrap_or("?"),
            e["message"].as_str().unwrap_or("?")
        ));
    }
    Ok(v["result"].take())
}

/// Stops the children of a failed request: `SIGTERM` (they quit as
/// `Ctrl-A x` does), then `SIGKILL` for one still there after
/// [`STOP_GRACE`].
fn stop_all(children: &[Child]) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pids: Vec<Pid> = children
        .iter()
        .filter(|c| c.pid != 0)
        .filter_map(|c| i32::try_from(c.pid).ok().map(Pid::from_raw))
        .collect();
    for &p in &pids {
        let _ = kill(p, Signal::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline && pids.iter().any(|&p| kill(p, None).is_ok()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in &pids {
        let _ = kill(p, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_wait_for_the_cache_when_they_would_hash_128_mib_between_them() {
        let mib = |m: u64| m * 1024 * 1024 / crate::arch::layout::PAGE_SIZE;
        assert!(!wait_for_cache(1, mib(127)));
        assert!(wait_for_cache(1, mib(128)));
        assert!(!wait_for_cache(3, mib(20)));
        assert!(wait_for_cache(8, mib(20)));
        assert!(!wait_for_cache(64, 4));
        assert!(wait_for_cache(usize::MAX, u64::MAX));
    }

    #[test]
    fn children_are_named_after_the_layer() {
        assert_eq!(child_names("b", 3), ["b-1", "b-2", "b-3"]);
        assert!(child_names("b", 0).is_empty());
    }

    #[test]
    fn requests_are_checked_before_anything_is_done() {
        let none = |_: &str| false;
        assert!(matches!(
            check("b", 0, 64, true, none),
            Err(BranchError::Count {
                count: 0,
                limit: 64
            })
        ));
        assert!(matches!(
            check("b", 65, 64, true, none),
            Err(BranchError::Count { count: 65, .. })
        ));
        assert_eq!(check("b", 64, 64, true, none).unwrap().len(), 64);
        assert!(matches!(
            check("b", 2, 64, false, none),
            Err(BranchError::NoTrackDirty)
        ));
        assert!(matches!(
            check("b", 2, 64, true, |n| n == "b"),
            Err(BranchError::Exists(n)) if n == "b"
        ));
        // A child's name taken (say, by an earlier branch of `b`) too.
        assert!(matches!(
            check("b", 2, 64, true, |n| n == "b-2"),
            Err(BranchError::Exists(n)) if n == "b-2"
        ));
        assert!(matches!(
            check("../b", 2, 64, true, none),
            Err(BranchError::BadName(_))
        ));
    }

    #[test]
    fn cids_are_stable_distinct_and_not_the_sources() {
        let names = child_names("golden", 32);
        let a = child_cids(&names, 3);
        assert_eq!(a, child_cids(&names, 3));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 32);
        assert!(a
            .iter()
            .all(|&c| (3..u32::MAX as u64).contains(&c) && c != 3));
        // A source whose CID is a child's own pushes that child to the next.
        let b = child_cids(&names[..1], a[0]);
        assert_eq!(b, [a[0] + 1]);
    }

    #[test]
    fn children_get_a_passt_and_a_mac_of_their_own_or_are_refused() {
        let names = child_names("b", 3);
        let mut src = Source {
            branch: BranchConfig::default(),
            store: "/s".into(),
            track_dirty: true,
            mode: SnapshotMode::Background,
            backend: "emu",
            control: None,
            net: None,
            mac: None,
            cid: None,
            agent_timeout: None,
            can_fork: true,
        };
        assert_eq!(child_nets(&src, &names, None).unwrap(), vec![None; 3]);
        assert!(child_nets(&src, &names, Some("tap:vm{i}"))
            .unwrap_err()
            .to_string()
            .contains("no network device"));
        let mac = crate::devices::virtio::net::default_mac("source");
        src.net = Some(NetHost::Passt);
        src.mac = Some(mac);
        let nets = child_nets(&src, &names, None).unwrap();
        let macs: Vec<[u8; 6]> = nets
            .iter()
            .map(|n| {
                let n = n.clone().unwrap();
                assert_eq!(n.host, NetHost::Passt);
                n.mac
            })
            .collect();
        assert_eq!(macs, derived_macs(&names, mac));
        assert_eq!(macs[0], crate::devices::virtio::net::default_mac("b-1"));
        for (host, way) in [
            ("stream:/run/passt.sock", "passt or socket_vmnet socket"),
            ("tap:tap0", "TAP interface"),
        ] {
            src.net = Some(host.parse().unwrap());
            let e = child_nets(&src, &names, None).unwrap_err().to_string();
            assert!(
                e.contains(host) && e.contains(way) && e.contains("--net passt"),
                "{e}"
            );
            assert!(e.contains("tap:vm{i}"), "{e}");
        }
        // A template: each child its own end, whatever the source's.
        let nets = child_nets(&src, &names, Some("tap:vm{i}")).unwrap();
        let hosts: Vec<String> = nets
            .iter()
            .map(|n| n.as_ref().unwrap().host.to_string())
            .collect();
        assert_eq!(hosts, ["tap:vm1", "tap:vm2", "tap:vm3"]);
        assert_eq!(nets[0].as_ref().unwrap().mac, macs[0]);
        let passt = child_nets(&src, &names, Some("passt")).unwrap();
        assert!(passt
            .iter()
            .all(|n| n.as_ref().unwrap().host == NetHost::Passt));
        // Shared by two children, or with the source; not a host end.
        for (t, says) in [
            ("tap:vm", "a child's network end, --net tap:vm,"),
            ("tap:tap0", "the source's network end, --net tap:tap0,"),
            ("udp:{i}", "not a host end"),
        ] {
            let e = child_nets(&src, &names, Some(t)).unwrap_err().to_string();
            assert!(e.contains(says), "{t}: {e}");
        }
        // Sockets of their own (a passt each, started by someone else).
        assert!(child_nets(&src, &names, Some("stream:/p{i}.sock")).is_ok());
    }

    #[test]
    fn a_childs_arguments_name_its_own_files() {
        let src = Source {
            branch: BranchConfig::default(),
            store: "/s".into(),
            track_dirty: true,
            mode: SnapshotMode::Background,
            backend: "emu",
            control: Some("/run/vm/control".into()),
            net: Some(NetHost::Passt),
            mac: Some([0x52, 0x54, 0, 1, 2, 3]),
            cid: Some(3),
            agent_timeout: Some(Duration::from_secs(300)),
            can_fork: false,
        };
        let dir = branch_dir(&src, "b").unwrap();
        assert_eq!(dir, Path::new("/run/vm/b"));
        let mut c = child_files(&dir, "b-1", true);
        c.cid = Some(77);
        let net = ChildNet {
            host: NetHost::Passt,
            mac: [0x52, 0x54, 0, 0xa, 0xb, 0xc],
        };
        let a: Vec<String> = child_args(&src, "b", &c, Some(&net), 9)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let joined = a.join(" ");
        for want in [
            "--restore b --store /s --name b-1 --backend emu",
            "--control /run/vm/b/b-1.control --console socket:/run/vm/b/b-1.console",
            "--pid-file /run/vm/b/b-1.pid --log-file /run/vm/b/b-1.log",
            "--net passt --mac 52:54:00:0a:0b:0c",
            "--vsock-uds /run/vm/b/b-1.vsock --vsock-cid 77",
            "--agent-timeout 300 --branch-guard 9 --track-dirty --daemonize",
        ] {
            assert!(joined.contains(want), "{joined} lacks {want}");
        }
        // Without a network device: no --net, no --mac.
        let a: Vec<String> = child_args(&src, "b", &c, None, 9)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(!a.iter().any(|a| a == "--net" || a == "--mac"), "{a:?}");
        // A control socket named relative to the working directory.
        let bare = Source {
            control: Some("control".into()),
            ..src.clone()
        };
        let here = std::env::current_dir().unwrap();
        assert_eq!(branch_dir(&bare, "b").unwrap(), here.join("b"));
        let no_control = Source {
            control: None,
            ..src
        };
        assert!(matches!(
            branch_dir(&no_control, "b"),
            Err(BranchError::NoDir)
        ));
    }

    #[test]
    fn a_fork_is_refused_where_the_source_cannot_fork() {
        let dir = tempfile::tempdir().unwrap();
        let src = Source {
            branch: BranchConfig {
                dir: Some(dir.path().to_path_buf()),
                ..BranchConfig::default()
            },
            store: dir.path().join("store"),
            track_dirty: true,
            mode: SnapshotMode::Background,
            backend: "hvf",
            control: None,
            net: None,
            mac: None,
            cid: None,
            agent_timeout: None,
            can_fork: false,
        };
        let r = branch(&src, "b", 2, None, Some(BranchStart::Fork), |_, _| {
            panic!("refused before the snapshot")
        });
        let e = r.unwrap_err();
        assert!(matches!(e, BranchError::NoFork("hvf")), "{e}");
        assert!(e.to_string().contains("use start \"exec\""), "{e}");
        assert!(!dir.path().join("b").exists());
    }
}
