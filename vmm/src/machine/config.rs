//! What to run: the configuration from the command line.

use crate::devices::virtio::net::host_end::NetHost;
use crate::hv::GicMode;
use anyhow::bail;
use std::path::PathBuf;

/// A fresh boot of a kernel.
#[derive(Debug, Clone)]
pub struct FreshBoot {
    /// Linux arm64 `Image`, or `Image.gz`.
    pub kernel: PathBuf,
    /// The initrd (a cpio archive, compressed as the kernel accepts),
    /// loaded into guest RAM as is; `None`: no initrd.
    pub initrd: Option<PathBuf>,
    /// Raw disk image for `/dev/vda`, opened read-write.
    pub disk: PathBuf,
    /// Guest RAM in bytes.
    pub mem_bytes: u64,
    /// Number of vCPUs (1..=[`layout::MAX_VCPUS`]).
    pub cpus: usize,
    /// Kernel command line.
    pub cmdline: String,
}

/// Where the VM comes from.
#[derive(Debug, Clone)]
pub enum BootSource {
    /// Boot a kernel.
    Fresh(FreshBoot),
    /// Restore a snapshot chain: `NAME` or `NAME+N` (see
    /// `snapshot_store::Spec`).
    Restore {
        /// The chain to restore.
        spec: String,
    },
}

/// Snapshot options.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// The snapshot store directory.
    pub store: PathBuf,
    /// Name of the first snapshot taken with Ctrl-A s; later ones in the same
    /// run get `.2`, `.3`, ... appended. `None`: Ctrl-A s is refused.
    pub name: Option<String>,
    /// Track dirty pages (write-protect RAM), so snapshots after the first
    /// (or after a restore) are diffs.
    pub track_dirty: bool,
    /// How Ctrl-A s writes a layer.
    pub mode: SnapshotMode,
}

/// How a snapshot is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// The vCPUs stop only while the machine's state is captured and the
    /// layer's pages are write-protected; the pages are written while the
    /// guest runs, each saved before anything changes it. Needs
    /// [`SnapshotOptions::track_dirty`] (the backends' write protection).
    Background,
    /// The vCPUs stay stopped until the layer is on disk.
    Stop,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    /// A kernel or a snapshot.
    pub source: BootSource,
    /// The interrupt controller asked for (`boot --gic`). `None`: the
    /// userspace GIC for a fresh boot, the snapshot's mode for a restore. A
    /// restore refuses a mode that differs from the snapshot's.
    pub gic: Option<GicMode>,
    /// Snapshot settings.
    pub snapshots: SnapshotOptions,
    /// Where to listen for control requests (`boot --control`; see
    /// the control socket).
    pub control: Option<PathBuf>,
    /// The network device (`boot --net`); `None`: no network device.
    pub net: Option<NetConfig>,
    /// The vsock device (`boot --vsock-uds`); `None`: no vsock device.
    pub vsock: Option<VsockConfig>,
    /// The guest agent the VMM tells the generation ID (needs a vsock
    /// device); whether the VM's readiness waits for it is the restored
    /// snapshot's to say. `None`: no agent is asked, and the VM is ready
    /// when its vCPUs run.
    pub agent: Option<AgentConfig>,
    /// Where the guest's console goes (`boot --console`).
    pub console: ConsoleConfig,
    /// How the `branch` verb starts children.
    pub branch: BranchConfig,
    /// A branch's child: the read end of its guard pipe (`boot
    /// --branch-guard FD`), which it quits on if it ends before the
    /// source completes the branch.
    pub branch_guard: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// Children one `branch` request may start without `--branch-limit`.
pub const DEFAULT_BRANCH_LIMIT: usize = 64;

/// How long, without `--branch-timeout`, a `branch` request waits for its
/// children to be ready, from the layer's commit.
pub const DEFAULT_BRANCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The branch settings of a VM (`boot --branch-limit`, `--branch-timeout`,
/// `--branch-dir`).
#[derive(Debug, Clone)]
pub struct BranchConfig {
    /// Most children per request.
    pub limit: usize,
    /// How long a request waits for its children to be ready.
    pub timeout: std::time::Duration,
    /// Where the branch directories go; `None`: the control socket's
    /// directory.
    pub dir: Option<PathBuf>,
}

impl Default for BranchConfig {
    fn default() -> Self {
        BranchConfig {
            limit: DEFAULT_BRANCH_LIMIT,
            timeout: DEFAULT_BRANCH_TIMEOUT,
            dir: None,
        }
    }
}

/// The guest agent (`boot --vsock-uds`, unless `--no-agent`).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// How long to ask for the agent's answer, from the vCPUs' start (a
    /// fresh boot's guest boots first); then it failed, or is absent if
    /// nothing listened and no answer was required.
    pub timeout: std::time::Duration,
    /// eth0's address for a restored clone (`ADDR/PREFIX[,GATEWAY]`,
    /// `boot --agent-address`); `None`: a new DHCP lease.
    pub address: Option<String>,
}

/// Where the guest's console goes (`boot --console`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConsoleConfig {
    /// This process's stdin and stdout, the escapes on stdin (a terminal
    /// in raw mode, or pipes).
    #[default]
    Stdio,
    /// The guest's output appended to a file (created mode 0600); no input.
    File(PathBuf),
    /// A Unix socket (mode 0600) one client at a time attaches to, with the
    /// escapes; the output is kept in a ring while no one is attached
    /// ([`crate::machine::console_socket`]).
    Socket(PathBuf),
}

impl std::str::FromStr for ConsoleConfig {
    type Err = String;

    /// `stdio`, `file:PATH` or `socket:PATH`.
    fn from_str(s: &str) -> Result<Self, String> {
        let path = |p: &str, what: &str| {
            if p.is_empty() {
                Err(format!("{what}: needs a path ({what}PATH)"))
            } else {
                Ok(PathBuf::from(p))
            }
        };
        match s.split_once(':') {
            _ if s == "stdio" => Ok(ConsoleConfig::Stdio),
            Some(("file", p)) => path(p, "file:").map(ConsoleConfig::File),
            Some(("socket", p)) => path(p, "socket:").map(ConsoleConfig::Socket),
            _ => Err(format!(
                "'{s}' is not a console: stdio, file:PATH or socket:PATH"
            )),
        }
    }
}

/// The vsock device (`boot --vsock-uds`, `--vsock-cid`).
#[derive(Debug, Clone)]
pub struct VsockConfig {
    /// The Unix socket host programs connect to; a guest connection to host
    /// port P goes to `<uds>_P`.
    pub uds: PathBuf,
    /// The guest's CID. `None`: [`DEFAULT_GUEST_CID`] for a fresh boot, the
    /// snapshot's for a restore (a different one reaches the guest with the
    /// transport reset).
    pub cid: Option<u64>,
}

/// The guest CID without `--vsock-cid`: 3, the first one not reserved.
pub const DEFAULT_GUEST_CID: u64 = 3;

/// The network device (`boot --net`, `--mac`).
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Its host end.
    pub host: NetHost,
    /// Its MAC address. `None`: a fresh boot derives one from the VM name
    /// (`--name`, else the disk image's path), the same on every start; a
    /// restore keeps the snapshot's. A restore given one replaces the
    /// snapshot's with it (the guest agent has the guest read it again).
    pub mac: Option<[u8; 6]>,
}

impl SnapshotOptions {
    /// Refuses, before anything runs, a background mode without dirty
    /// tracking, a snapshot name (`--name`) that is invalid or already
    /// taken in the store, and, with a name or for a restore (`restoring`),
    /// a store path that is there but not a directory.
    pub fn check(&self, restoring: bool) -> anyhow::Result<()> {
        let opts = self;
        if opts.mode == SnapshotMode::Background && !opts.track_dirty {
            bail!("background snapshots need --track-dirty (its write protection saves each page before the guest changes it); use --snapshot-mode stop without it");
        }
        if opts.name.is_some() || restoring {
            match std::fs::metadata(&opts.store) {
                Ok(m) if !m.is_dir() => bail!(
                    "--store {} is not a directory (it is {}); name the snapshot store's directory",
                    opts.store.display(),
                    snapshot_store::file_kind(m.file_type())
                ),
                _ => {}
            }
        }
        if let Some(name) = &opts.name {
            snapshot_store::validate_name(name)?;
            let store = &opts.store;
            if snapshot_store::Store::open(store).is_ok_and(|s| s.contains(name)) {
                bail!(
                    "snapshot '{name}' already exists in {}; choose another --name",
                    store.display()
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(store: PathBuf, name: Option<&str>) -> SnapshotOptions {
        SnapshotOptions {
            store,
            name: name.map(str::to_string),
            track_dirty: false,
            mode: SnapshotMode::Stop,
        }
    }

    #[test]
    fn consoles_parse() {
        assert_eq!("stdio".parse(), Ok(ConsoleConfig::Stdio));
        assert_eq!(
            "file:/tmp/c.log".parse(),
            Ok(ConsoleConfig::File("/tmp/c.log".into()))
        );
        assert_eq!(
            "socket:rel/c.sock".parse(),
            Ok(ConsoleConfig::Socket("rel/c.sock".into()))
        );
        for bad in ["", "tty", "file:", "socket:", "file", "pty:/dev/x"] {
            assert!(bad.parse::<ConsoleConfig>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_store_that_is_not_a_directory_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("store");
        std::fs::write(&file, b"").unwrap();
        for (name, restoring) in [(Some("a"), false), (None, true)] {
            let e = opts(file.clone(), name).check(restoring).unwrap_err();
            assert!(
                e.to_string()
                    .contains("store is not a directory (it is a regular file)"),
                "{e}"
            );
        }
        // Not used: not checked.
        opts(file, None).check(false).unwrap();
        // Not there yet: the first snapshot creates it.
        opts(dir.path().join("new"), Some("a"))
            .check(false)
            .unwrap();
    }
}
