//! `boot`: runs an aarch64 Linux guest on Ignition.

use anyhow::Context;
use clap::{Parser, ValueEnum};
use ignition_vmm::arch::layout;
use ignition_vmm::daemon::Detach;
use ignition_vmm::devices::virtio::net::{host_end::NetHost, parse_mac};
use ignition_vmm::hv::GicMode;
use ignition_vmm::machine::branch;
use ignition_vmm::machine::{
    AgentConfig, BootSource, BranchConfig, ConsoleConfig, FreshBoot, MachineConfig, NetConfig,
    SnapshotMode, SnapshotOptions, VmExit, VsockConfig, DEFAULT_BRANCH_LIMIT,
    DEFAULT_BRANCH_TIMEOUT,
};
use std::path::PathBuf;
use std::process::ExitCode;

/// Hypervisor backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// macOS Hypervisor.framework (Apple Silicon only).
    Hvf,
    /// Portable software vCPU (unicorn-engine), any host.
    Emu,
}

/// Snapshot modes (`--snapshot-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Pause only to capture the state and protect the pages; write them while the guest runs (needs --track-dirty).
    Background,
    /// Keep the guest stopped until the layer is on disk.
    Stop,
}

/// Interrupt controllers (`--gic`); names are [`GicMode::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Gic {
    /// The VMM's GICv3 model (any backend; on hvf, macOS 13 and later).
    Userspace,
    /// Hypervisor.framework's in-kernel GICv3 (hvf backend, macOS 15 and later).
    Hvf,
}

impl From<Gic> for GicMode {
    fn from(g: Gic) -> GicMode {
        match g {
            Gic::Userspace => GicMode::Userspace,
            Gic::Hvf => GicMode::Hvf,
        }
    }
}

const DEFAULT_BACKEND: Backend = if cfg!(all(target_os = "macos", target_arch = "aarch64")) {
    Backend::Hvf
} else {
    Backend::Emu
};

fn default_cmdline() -> String {
    format!(
        "console=ttyAMA0 earlycon=pl011,mmio32,{:#x} root=/dev/vda rw rootwait boottimer={:#x}",
        layout::PL011.base,
        layout::BOOT_TIMER.base
    )
}

/// Boot an aarch64 Linux guest (Image + raw ext4 root disk) to its console,
/// or restore a snapshot.
///
/// The console is this terminal (raw mode), or with --console a file or a
/// Unix socket. Escapes: Ctrl-A x quits, Ctrl-A s writes a snapshot, Ctrl-A
/// h lists the escapes, Ctrl-A a sends a literal Ctrl-A, Ctrl-A d detaches
/// from a socket console. `poweroff` in the guest ends `boot` with exit
/// status 0.
///
/// --console socket:PATH: one client at a time attaches (python3 -m
/// ignition.console PATH); a second one is refused while it is attached;
/// the output written while no one is attached is kept (the last 64 KiB)
/// and replayed on attach. --console file:PATH appends the guest's output
/// to PATH (no input).
///
/// --daemonize: boot forks; the parent exits 0 once the VM runs (its
/// sockets listening), or 1 with the error that stopped it, and the VM runs
/// on in the background, detached from the terminal (needs --console
/// file: or socket:). --pid-file PATH: the VM's boot writes its pid there
/// (the daemon's, with --daemonize), removed at exit. --log-file PATH: the
/// log lines (stderr) are appended there (with --daemonize and without it,
/// they are discarded).
///
/// SIGTERM, SIGINT and SIGHUP quit as Ctrl-A x and the control socket's
/// `quit` do. Whatever ends the VM, a snapshot being taken or written is
/// committed (or cleanly fails) first, and the control socket, the vsock
/// socket and a restored VM's working directory are removed. Exit status:
/// 0 for a quit, a power-off or a reset; 1 if the VM could not start or a
/// vCPU failed; 2 for bad arguments; 128+N if a second signal N came while
/// the VM was winding down (it ends `boot` at once: a layer being written
/// is not committed, and `vmstore gc` removes what it left).
///
/// Snapshots (Ctrl-A s) go to the store (--store) under --name; a second
/// Ctrl-A s in the same run writes NAME.2, then NAME.3, ... A fresh boot's
/// first snapshot is a full layer; with --track-dirty, later ones (and the
/// first after a restore) are diffs holding only the pages dirtied since
/// their parent. Without --track-dirty every snapshot is full.
///
/// --restore SPEC: SPEC is NAME (that snapshot, with its ancestry) or NAME+N
/// (the descendant N layers below NAME along a single-child chain). The
/// restored VM runs on a private copy of the snapshot's disk, discarded at
/// exit unless a snapshot is taken.
///
/// --net HOST: the network device's host end. `passt` (Linux): boot starts
/// a passt of the VM's own (`passt` on PATH) on a socket pair and stops it
/// when the VM ends. `stream:PATH` connects to a Unix stream socket
/// speaking QEMU's stream framing: `passt` on Linux (e.g. `passt -f -1 -s
/// /tmp/passt.sock`), `socket_vmnet` on macOS. `tap:NAME` attaches to a
/// Linux TAP interface. `none` (default): no network device. A restored VM
/// must name a host end again (it may be a new one) exactly when its
/// snapshot has a network device. --mac with --restore gives the restored
/// VM another MAC than the snapshot's (a branch's children get theirs so);
/// the guest agent has the guest's driver read it again before it asks
/// for a new address.
///
/// --gic MODE: `userspace` (default) is the VMM's GICv3 model, on every
/// backend. `hvf` is Hypervisor.framework's in-kernel GICv3: hvf backend
/// only, macOS 15 or later. A snapshot records its mode; --restore uses it
/// and refuses a different --gic.
///
/// Timing lines on stderr: `Guest-boot-time = N ms` (VM start to the guest's
/// first boot-timer write), `Snapshot-write-time = N ms`, `Restore-time = N
/// ms` (with a `Restore-stages:` breakdown, and `Restore-disk`: the chain's
/// disk opened under the VM's overlay, nothing copied; a branch's forked
/// child also prints `Restore-source = fork of the branch's source ...`,
/// and its source `Branch-fork-time = N us`, the fork within its pause),
/// `Agent-ready-time = N ms` (VM start to the guest agent's answer with the
/// VM's generation ID), or `Agent-failed: WHY`, or `Agent-absent: WHY`.
/// Logs: set RUST_LOG (e.g. RUST_LOG=debug).
///
/// --vsock-uds PATH also talks to the guest agent (`/bin/ignition-agent`,
/// vsock port 1024) if the guest has one: once it listens, and after every
/// restore, the VMM sends it the VM generation ID; on a restore the agent
/// gives the clone a new machine ID and network address first. A restore
/// of a snapshot whose agent had answered is ready (the control socket's
/// `status`) when the agent answers again; a fresh boot, and a guest
/// without the agent, are ready when the vCPUs run (`status` reports the
/// agent apart). --no-agent: the VMM does not contact port 1024.
///
/// `boot branch --control PATH --count N [--name B]` asks the VM listening
/// on PATH to branch: write the layer B and start N children restored from
/// it (B-1 .. B-N), each a headless boot of its own, and prints them once
/// all are ready. Each child has a MAC derived from its name; a VM on
/// --net passt branches into children on --net passt (each its own
/// passt); --net TEMPLATE gives the children other host ends, {i} in it
/// each child's number (tap:vm{i}); a host end two VMs would share is
/// refused.
#[derive(Parser, Debug)]
#[command(
    name = "boot",
    version,
    verbatim_doc_comment,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Linux arm64 Image to boot, or Image.gz (gzip, decompressed by boot)
    #[arg(long, default_value = "guest/out/Image")]
    kernel: PathBuf,
    /// Initramfs to load into guest RAM for the kernel (a cpio archive, compressed as the kernel accepts)
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// Raw disk image for the root device /dev/vda (opened read-write).
    #[arg(long, default_value = "guest/out/rootfs.ext4")]
    disk: PathBuf,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(64..=65536))]
    mem: u64,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=layout::MAX_VCPUS as u64))]
    cpus: u64,
    /// Kernel command line [default: console=ttyAMA0 earlycon=pl011,mmio32,0x9000000 root=/dev/vda rw rootwait boottimer=0x9100000]
    #[arg(long)]
    cmdline: Option<String>,
    /// Restore a snapshot chain: NAME or NAME+N (instead of booting a kernel).
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["kernel", "initrd", "disk", "mem", "cpus", "cmdline"])]
    restore: Option<String>,
    /// Name of the snapshot Ctrl-A s writes (then NAME.2, NAME.3, ...).
    #[arg(long)]
    name: Option<String>,
    /// Track dirty guest pages so snapshots can be diffs.
    #[arg(long)]
    track_dirty: bool,
    /// How Ctrl-A s writes a snapshot [default: background with --track-dirty, else stop]
    #[arg(long, value_enum, value_name = "MODE")]
    snapshot_mode: Option<Mode>,
    /// Snapshot store directory.
    #[arg(long, default_value = "vmstore")]
    store: PathBuf,
    /// Listen for control requests (newline-delimited JSON: snapshot, pause, resume, status, quit, branch, exec) on this Unix socket, mode 0600
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Hypervisor backend [default: hvf on macOS/aarch64, emu elsewhere]
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// Interrupt controller [default: userspace; with --restore, the snapshot's]
    #[arg(long, value_enum)]
    gic: Option<Gic>,
    /// Network device's host end: none, passt (a passt of this VM's own), stream:PATH or tap:NAME
    #[arg(long, value_name = "HOST", default_value = "none", value_parser = parse_net)]
    net: Net,
    /// Network device's MAC address [default: derived from --name (else the disk path), stable across starts; with --restore, the snapshot's, which this replaces]
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    mac: Option<[u8; 6]>,
    /// Add a vsock device: host programs connect to this Unix socket and send "CONNECT <port>\n"; a guest connection to host port P goes to PATH_P
    #[arg(long, value_name = "PATH")]
    vsock_uds: Option<PathBuf>,
    /// The guest's vsock CID [default: 3; with --restore, the snapshot's]
    #[arg(long, value_name = "CID", value_parser = parse_cid, requires = "vsock_uds")]
    vsock_cid: Option<u64>,
    /// Do not contact the guest agent on vsock port 1024 (the guest has another service there): the VM is ready when its vCPUs run
    #[arg(long, requires = "vsock_uds")]
    no_agent: bool,
    /// Seconds to wait for the guest agent's answer, from the vCPUs' start (a fresh boot's guest boots first): then Agent-failed, or Agent-absent if nothing listened and no answer was required
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    agent_timeout: u64,
    /// A restored clone's eth0 address, set by the guest agent instead of a new DHCP lease: ADDR/PREFIX[,GATEWAY]
    #[arg(long, value_name = "ADDR", value_parser = parse_agent_address, requires = "restore", conflicts_with = "no_agent")]
    agent_address: Option<String>,
    /// The guest's console: stdio (this terminal), file:PATH (its output appended, no input) or socket:PATH (a Unix socket, mode 0600, one client at a time attaches)
    #[arg(long, value_name = "CONSOLE", default_value = "stdio", value_parser = parse_console)]
    console: ConsoleConfig,
    /// Run in the background once the VM runs: the parent exits 0, or 1 with the error (needs --console file: or socket:)
    #[arg(long)]
    daemonize: bool,
    /// Write boot's pid (the daemon's) to this file, removed at exit
    #[arg(long, value_name = "PATH")]
    pid_file: Option<PathBuf>,
    /// Append the log lines (stderr) to this file
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// Most children one branch request may start
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BRANCH_LIMIT as u64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    branch_limit: u64,
    /// Seconds a branch request waits for its children to be ready
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_BRANCH_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    branch_timeout: u64,
    /// A branch's child (set by the source): quit unless the source completes the branch on this pipe's read end
    #[arg(long, value_name = "FD", hide = true)]
    branch_guard: Option<i32>,
    /// Where a branch's children's files go (a directory per branch, named after its layer) [default: the --control socket's directory]
    #[arg(long, value_name = "DIR")]
    branch_dir: Option<PathBuf>,
}

/// Subcommands: clients of a running VM.
#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Branch a running VM: write a layer and start children restored from it, each its own headless boot; print them once all are ready
    Branch(BranchArgs),
}

/// `boot branch`.
#[derive(clap::Args, Debug)]
struct BranchArgs {
    /// The running VM's control socket
    #[arg(long, value_name = "PATH")]
    control: PathBuf,
    /// How many children
    #[arg(long, value_name = "N")]
    count: u64,
    /// The layer's name; the children are NAME-1 .. NAME-N [default: the VM's next snapshot name]
    #[arg(long)]
    name: Option<String>,
    /// The children's network host ends: a template in which {i} becomes each child's number (tap:vm{i}: tap:vm1, tap:vm2, ...) [default: the VM's, if each child can have its own: passt]
    #[arg(long, value_name = "TEMPLATE")]
    net: Option<String>,
    /// How the children start: fork (forks of the VM, sharing its memory and, on emu, its translated code; emu on Linux) or exec (each a new boot --restore) [default: fork where the VM can]
    #[arg(long, value_parser = ["fork", "exec"])]
    start: Option<String>,
    /// Print the VM's answer as JSON instead of a table
    #[arg(long)]
    json: bool,
}

/// `ADDR/PREFIX[,GATEWAY]` with an IPv4 or IPv6 address and gateway.
fn parse_agent_address(s: &str) -> Result<String, String> {
    let bad = || format!("'{s}' is not ADDR/PREFIX[,GATEWAY]");
    let (cidr, gw) = match s.split_once(',') {
        Some((c, g)) => (c, Some(g)),
        None => (s, None),
    };
    let (addr, prefix) = cidr.split_once('/').ok_or_else(bad)?;
    let addr: std::net::IpAddr = addr.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    if prefix > if addr.is_ipv4() { 32 } else { 128 } {
        return Err(bad());
    }
    if let Some(g) = gw {
        g.parse::<std::net::IpAddr>().map_err(|_| bad())?;
    }
    Ok(s.to_string())
}

fn parse_console(s: &str) -> Result<ConsoleConfig, String> {
    s.parse()
}

fn parse_cid(s: &str) -> Result<u64, String> {
    let cid: u64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !ignition_vmm::devices::virtio::vsock::valid_guest_cid(cid) {
        return Err(format!(
            "{cid} is not a guest CID: 0-2 are reserved (2 is the host), and Linux's CIDs are 32-bit (at most {})",
            u32::MAX - 1
        ));
    }
    Ok(cid)
}

/// `--net`: no network device, or its host end.
#[derive(Clone, Debug)]
struct Net(Option<NetHost>);

fn parse_net(s: &str) -> Result<Net, String> {
    if s == "none" {
        return Ok(Net(None));
    }
    s.parse().map(|h| Net(Some(h)))
}

/// Before the standard library's runtime: see
/// [`ignition_vmm::machine::fork::keep_std_fault_handler_out`] (a branch's
/// source forks while its threads run).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static KEEP_STD_FAULT_HANDLER_OUT: extern "C" fn() =
    ignition_vmm::machine::fork::keep_std_fault_handler_out;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not in logs and pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    ignition_vmm::machine::branch::set_child_main(branch_child);
    let args = Args::parse();
    if let Some(Command::Branch(b)) = &args.command {
        return branch_client(b);
    }
    if args.daemonize && args.console == ConsoleConfig::Stdio {
        eprintln!(
            "boot: --daemonize needs --console file:PATH or socket:PATH (a daemon has no terminal)"
        );
        return ExitCode::from(2);
    }
    // Before any thread: a daemon forks here.
    let detach = match Detach::start(
        args.daemonize,
        args.log_file.as_deref(),
        args.pid_file.as_deref(),
    ) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("boot: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let running = detach.on_running();
    ExitCode::from(ended(run(args, running), &detach))
}

/// The exit status of a VM that ran (or failed to start) with `detach`.
fn ended(result: anyhow::Result<VmExit>, detach: &Detach) -> u8 {
    match result {
        Ok(VmExit::PowerOff) | Ok(VmExit::Reset) | Ok(VmExit::Quit) => 0,
        Ok(VmExit::Error(e)) => {
            ignition_vmm::console::restore_terminal();
            eprintln!("boot: the VM stopped: {e}");
            detach.failed(&format!("the VM stopped: {e}"));
            1
        }
        Err(e) => {
            ignition_vmm::console::restore_terminal();
            eprintln!("boot: {e:#}");
            detach.failed(&format!("{e:#}"));
            1
        }
    }
}

/// A forked child of a branch (the source's fork, `branch`): `argv` as a
/// started child gets them, its daemon's word to `word`.
fn branch_child(argv: Vec<std::ffi::OsString>, word: std::os::fd::OwnedFd) -> i32 {
    let args = match Args::try_parse_from(std::iter::once("boot".into()).chain(argv)) {
        Ok(a) => a,
        Err(e) => {
            use std::io::Write;
            let _ = std::fs::File::from(word).write_all(format!("E{e}").as_bytes());
            return 2;
        }
    };
    let detach = match Detach::forked(word, args.log_file.as_deref(), args.pid_file.as_deref()) {
        Ok(d) => d,
        Err(_) => return 1,
    };
    let running = detach.on_running();
    i32::from(ended(run(args, running), &detach))
}

/// Runs the VM `args` describe; `running` is called once it runs.
fn run(args: Args, running: Box<dyn FnOnce()>) -> anyhow::Result<VmExit> {
    let source = match args.restore {
        Some(spec) => BootSource::Restore { spec },
        None => BootSource::Fresh(FreshBoot {
            kernel: args.kernel,
            initrd: args.initrd,
            disk: args.disk,
            mem_bytes: args.mem * 1024 * 1024,
            cpus: usize::try_from(args.cpus).context("--cpus")?,
            cmdline: args.cmdline.unwrap_or_else(default_cmdline),
        }),
    };
    let backend = args.backend.unwrap_or(DEFAULT_BACKEND);
    let gic = args.gic.map(GicMode::from);
    if backend == Backend::Emu && gic == Some(GicMode::Hvf) {
        anyhow::bail!("{}", ignition_vmm::hv::gic::NO_KERNEL_GIC_ON_EMU);
    }
    let cfg = MachineConfig {
        source,
        gic,
        snapshots: SnapshotOptions {
            store: args.store,
            name: args.name,
            track_dirty: args.track_dirty,
            mode: match args.snapshot_mode {
                Some(Mode::Background) => SnapshotMode::Background,
                Some(Mode::Stop) => SnapshotMode::Stop,
                None if args.track_dirty => SnapshotMode::Background,
                None => SnapshotMode::Stop,
            },
        },
        control: args.control,
        net: match (args.net.0, args.mac) {
            (None, Some(_)) => {
                anyhow::bail!("--mac needs a network device (--net passt, stream:PATH or tap:NAME)")
            }
            (None, None) => None,
            (Some(host), mac) => Some(NetConfig { host, mac }),
        },
        agent: (args.vsock_uds.is_some() && !args.no_agent).then(|| AgentConfig {
            timeout: std::time::Duration::from_secs(args.agent_timeout),
            address: args.agent_address,
        }),
        vsock: args.vsock_uds.map(|uds| VsockConfig {
            uds,
            cid: args.vsock_cid,
        }),
        console: args.console,
        branch_guard: args.branch_guard.map(guard_fd).transpose()?,
        branch: BranchConfig {
            limit: usize::try_from(args.branch_limit).context("--branch-limit")?,
            timeout: std::time::Duration::from_secs(args.branch_timeout),
            dir: args.branch_dir,
        },
    };
    match backend {
        Backend::Emu => run_emu(&cfg, running),
        Backend::Hvf => run_hvf(&cfg, running),
    }
}

/// `--branch-guard FD`: the descriptor the source left open for this
/// process, owned from now on and closed on exec (a child of this VM's own
/// branches does not inherit it).
fn guard_fd(fd: i32) -> anyhow::Result<std::sync::Arc<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl on a number only reads the descriptor table.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        anyhow::bail!("--branch-guard {fd}: not an open descriptor of this process");
    }
    // SAFETY: the descriptor is open (checked above) and nothing else in
    // this process owns it: the source passed it for this option only.
    Ok(std::sync::Arc::new(unsafe {
        std::os::fd::OwnedFd::from_raw_fd(fd)
    }))
}

/// `boot branch`: sends the request, prints the answer; exit status 0, or
/// 1 with the VM's error (`boot: CODE: MESSAGE`).
fn branch_client(b: &BranchArgs) -> ExitCode {
    let mut req = serde_json::json!({"command": "branch", "count": b.count});
    if let Some(n) = &b.name {
        req["name"] = n.clone().into();
    }
    if let Some(t) = &b.net {
        req["net"] = t.clone().into();
    }
    if let Some(s) = &b.start {
        req["start"] = s.clone().into();
    }
    let answer = match branch::request(&b.control, &req, None) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("boot: {e}");
            return ExitCode::FAILURE;
        }
    };
    if b.json {
        println!("{answer}");
        return ExitCode::SUCCESS;
    }
    let layer = &answer["layer"];
    println!(
        "layer {} ({}, {} pages, paused {} us); children ({}) ready in {} ms; their files in {}",
        layer["name"].as_str().unwrap_or("?"),
        layer["kind"].as_str().unwrap_or("?"),
        layer["pages"],
        layer["pause_us"],
        answer["start"].as_str().unwrap_or("?"),
        answer["total_ms"],
        answer["dir"].as_str().unwrap_or("?"),
    );
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        v => v.to_string(),
    };
    println!("NAME\tPID\tCID\tMAC\tCONTROL\tCONSOLE\tVSOCK\tLOG");
    for c in answer["children"].as_array().into_iter().flatten() {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            s(&c["name"]),
            s(&c["pid"]),
            s(&c["cid"]),
            s(&c["mac"]),
            s(&c["control"]),
            s(&c["console"]),
            s(&c["vsock"]),
            s(&c["log"]),
        );
    }
    ExitCode::SUCCESS
}

#[cfg(emu)]
fn run_emu(cfg: &MachineConfig, running: Box<dyn FnOnce()>) -> anyhow::Result<VmExit> {
    Ok(ignition_vmm::machine::run_notify(
        ignition_vmm::hv::emu::EmuHypervisor::new(),
        cfg,
        running,
    )?)
}

#[cfg(not(emu))]
fn run_emu(_: &MachineConfig, _: Box<dyn FnOnce()>) -> anyhow::Result<VmExit> {
    anyhow::bail!("{}", NO_EMU)
}

/// Why `--backend emu` cannot run: a default build for macOS leaves the
/// backend out, as does `--no-default-features` on Linux.
#[cfg(not(emu))]
const NO_EMU: &str = if cfg!(target_os = "macos") {
    "this boot has no emu backend (a default build for macOS has only hvf): \
     build it with `cargo build --release --features ignition-vmm/emu` (needs cmake: brew install cmake)"
} else {
    "this boot has no emu backend (built with --no-default-features): \
     build it with `cargo build --release`"
};

#[cfg(all(target_os = "macos", target_arch = "aarch64"))]
fn run_hvf(cfg: &MachineConfig, running: Box<dyn FnOnce()>) -> anyhow::Result<VmExit> {
    Ok(ignition_vmm::machine::run_notify(
        ignition_vmm::hv::hvf::HvfHypervisor::new()?,
        cfg,
        running,
    )?)
}

#[cfg(not(all(target_os = "macos", target_arch = "aarch64")))]
fn run_hvf(_: &MachineConfig, _: Box<dyn FnOnce()>) -> anyhow::Result<VmExit> {
    if cfg!(emu) {
        anyhow::bail!(
            "the hvf backend needs macOS on Apple Silicon; use --backend emu on this host"
        )
    }
    anyhow::bail!("the hvf backend needs macOS on Apple Silicon, and this boot has no emu backend")
}
