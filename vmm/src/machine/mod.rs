//! Building a VM from a configuration, running it, and serving its verbs.
//!
//! The parts, one module or wing each, lower ones first (each uses only
//! those before it):
//!
//! - [`config`]: what to run, from the command line; [`ops`]: the verbs a
//!   front-end may ask of a running VM, their results and errors.
//! - `device_manager/`: the device set, the interrupt controller, the root
//!   disk; `vcpu/`: the vCPU threads and their run loop, the run state
//!   every thread shares, the guest's clock, a vCPU's state.
//! - `console_input`, `console_socket` (with `console_host`, the console's
//!   host end), [`control_socket`] and [`signals`]: the front-ends, each
//!   turning its input into verbs; [`branch`]: a branch's children, started
//!   and waited for.
//! - `plan`: what gets built (a fresh boot's plan).
//! - `vm`: the running VM ([`vm::Vmm`]): built from a plan, it owns RAM,
//!   the bus, the interrupt controller, the devices, the run state and the
//!   clock, and pauses and resumes the vCPUs.
//! - `snapshot/`: writing a layer (calling the VM's stop, capture and
//!   restart), restoring a chain (a restore's plan), the machine state's
//!   encoding.
//! - here: [`run`], and the VM's [`ops::Verbs`].
//!
//! Threads: one per vCPU, or one for all vCPUs round-robin when the backend
//! asks for it ([`Hypervisor::ROUND_ROBIN`]); one console input thread (a
//! socket console: an accepting thread, and two for the attached client); the
//! signal thread; a thread per control-socket client (at most
//! [`control_socket::MAX_CLIENTS`]); the clock's physical timer thread; a
//! background snapshot's writer; the guest agent's thread (with a vsock
//! device); a branch's child's guard thread (`--branch-guard`); and the
//! caller's thread, which waits for the VM to end. Lock order: a device lock (the clock's counts as one),
//! then the GIC lock (interrupt lines), then the run state's; never the
//! reverse. No lock is held across [`crate::hv::Vcpu::run`].

use crate::hv::{Hypervisor, Vm};
use anyhow::Context;
use console_host::HostConsole;
use snapshot::restore::Stages;
use snapshot::save::Snapshots;
use std::sync::Arc;
use std::time::Instant;
use vm::Vmm;

mod agent;
pub mod branch;
pub mod config;
mod console_host;
mod console_input;
pub mod console_socket;
pub mod control_socket;
mod device_manager;
pub mod fork;
pub mod ops;
mod plan;
pub mod signals;
mod snapshot;
mod vcpu;
mod vm;

pub use config::{
    AgentConfig, BootSource, BranchConfig, ConsoleConfig, FreshBoot, MachineConfig, NetConfig,
    SnapshotMode, SnapshotOptions, VsockConfig, DEFAULT_BRANCH_LIMIT, DEFAULT_BRANCH_TIMEOUT,
    DEFAULT_GUEST_CID,
};
pub use snapshot::state::MACHINE_STATE_VERSION;
pub use vcpu::run_state::VmExit;

/// Why a VM could not be started. Each message is the failing step's, with
/// its causes.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The options are refused before anything runs (a snapshot name
    /// taken, an interrupt controller this backend lacks, ...).
    #[error("{0:#}")]
    Options(anyhow::Error),
    /// A fresh boot's kernel, disk or guest RAM cannot be set up.
    #[error("{0:#}")]
    Boot(anyhow::Error),
    /// The snapshot chain cannot be restored.
    #[error("{0:#}")]
    Restore(anyhow::Error),
    /// The VM, its interrupt controller or its devices cannot be built.
    #[error("{0:#}")]
    Build(anyhow::Error),
    /// The console, the control socket or the vCPU threads cannot start.
    #[error("{0:#}")]
    Start(anyhow::Error),
}

/// A running VM and what its front-ends ask of it.
struct Machine<V: Vm> {
    vmm: Vmm<V>,
    snapshots: Snapshots,
    backend: &'static str,
    started: Instant,
    restored_from: Option<String>,
    readiness: Arc<agent::Readiness>,
    /// How `branch` starts children.
    branch: branch::Source,
    /// The VMM's vsock socket, where the VMM asks the guest agent (`None`:
    /// no vsock device, or `--no-agent`).
    agent_uds: Option<std::path::PathBuf>,
}

impl<V: Vm + 'static> ops::Verbs for Machine<V> {
    fn execute(&self, op: ops::Op) -> Result<ops::Reply, ops::OpError> {
        use ops::{Op, Reply, SnapshotWait};
        match op {
            Op::Snapshot { name, wait } => {
                let wait = wait == SnapshotWait::Committed;
                Ok(match self.snapshots.take(&self.vmm, name, wait)? {
                    Some(w) => Reply::Snapshot(w),
                    None => Reply::Done {},
                })
            }
            Op::Pause => {
                self.vmm.pause()?;
                Ok(Reply::Done {})
            }
            Op::Resume => {
                self.vmm.resume()?;
                Ok(Reply::Done {})
            }
            Op::Status => Ok(Reply::Status(self.status())),
            Op::Quit => {
                self.snapshots.quit(&self.vmm);
                Ok(Reply::Done {})
            }
            Op::Branch {
                name,
                count,
                net,
                start,
            } => Ok(Reply::Branch(self.branch(
                name,
                count,
                net.as_deref(),
                start,
            )?)),
            Op::Exec(e) => {
                let uds = self.agent_uds.as_ref().ok_or(ops::ExecError::NoAgent)?;
                let ended = || self.vmm.finished();
                Ok(Reply::Exec(agent::exec(uds, e, &ended)?))
            }
        }
    }
}

impl<V: Vm + 'static> Machine<V> {
    /// [`ops::Op::Branch`]: the source's devices as they are now, the layer
    /// written as `snapshot` writes it.
    fn branch(
        &self,
        name: Option<String>,
        count: usize,
        net: Option<&str>,
        start: Option<ops::BranchStart>,
    ) -> Result<ops::Branched, ops::BranchError> {
        let name = name
            .or_else(|| self.snapshots.next_name())
            .ok_or(ops::SnapshotError::NoName)?;
        let devices = self.vmm.devices();
        let src = branch::Source {
            mac: devices.net_mac(),
            cid: devices.vsock_cid(),
            ..self.branch.clone()
        };
        branch::branch(&src, &name, count, net, start, |name, work| {
            let job = work.map(|child| fork::ForkJob {
                ram: self.vmm.ram().clone(),
                child,
            });
            let (written, forked) =
                self.snapshots
                    .take_forking(&self.vmm, Some(name.clone()), true, job);
            let written = written.map_err(ops::BranchError::from).and_then(|w| {
                w.ok_or_else(|| {
                    ops::SnapshotError::Failed {
                        name: name.clone(),
                        reason: anyhow::anyhow!("the layer was not committed"),
                    }
                    .into()
                })
            });
            if written
                .as_ref()
                .is_ok_and(|w| branch::wait_for_cache(count, w.pages))
            {
                self.snapshots.wait_cache_record(&name);
            }
            (written, forked)
        })
    }

    fn status(&self) -> ops::Status {
        let agent = self.readiness.agent();
        ops::Status {
            ready: self.readiness.ready(),
            agent: agent.name(),
            agent_error: match agent {
                agent::AgentState::Failed(why) => Some(why),
                _ => None,
            },
            generation_id: self.vmm.devices().generation_id().map(|id| hex(&id)),
            state: if self.vmm.paused() {
                "paused"
            } else {
                "running"
            },
            vcpus: self.vmm.vcpus(),
            backend: self.backend,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            restored_from: self.restored_from.clone(),
            parent: self.snapshots.parent_name(),
            dirty_pages: self.snapshots.dirty_pages_pending(&self.vmm),
            snapshot_in_progress: self.snapshots.writing(),
        }
    }
}

/// Lower-case hex digits of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl<V: Vm + 'static> console_input::Uart for Machine<V> {
    fn input(&self, bytes: &[u8]) -> usize {
        self.vmm.console_input(bytes)
    }

    fn ended(&self) -> bool {
        self.vmm.finished()
    }
}

/// Boots or restores `cfg` on hypervisor `hv` and runs it until it ends:
/// the guest powers off or resets, a vCPU fails, or a front-end quits
/// (`Ctrl-A x`, the control socket's `quit`, `SIGTERM`, `SIGINT`,
/// `SIGHUP`). Before it returns, a snapshot being taken is committed or
/// cleanly failed, every control-socket request has its answer, and the
/// files the VM made on the host (the control socket, the console socket,
/// the vsock socket, a restored VM's working directory) are removed.
pub fn run<H: Hypervisor>(hv: H, cfg: &MachineConfig) -> Result<VmExit, StartError>
where
    H::Vm: 'static,
{
    run_notify(hv, cfg, Box::new(|| {}))
}

/// [`run`], calling `running` once the VM runs (its vCPUs started, its
/// front-ends listening): `boot --daemonize` detaches then.
pub fn run_notify<H: Hypervisor>(
    hv: H,
    cfg: &MachineConfig,
    running: Box<dyn FnOnce()>,
) -> Result<VmExit, StartError>
where
    H::Vm: 'static,
{
    let t0 = Instant::now();
    let mut stages = Stages::default();
    // First: a signal during a restore's verification waits for the VM.
    let signals = signals::install()
        .context("cannot handle SIGTERM, SIGINT and SIGHUP")
        .map_err(StartError::Start)?;
    let restoring = matches!(cfg.source, BootSource::Restore { .. });
    cfg.snapshots
        .check(restoring)
        .map_err(StartError::Options)?;
    let mut console = HostConsole::open(&cfg.console).map_err(StartError::Start)?;
    let plan = match &cfg.source {
        BootSource::Fresh(f) => {
            let gic = cfg.gic.unwrap_or_default();
            hv.check_gic_mode(gic)
                .map_err(|e| StartError::Options(e.into()))?;
            let name = cfg.snapshots.name.as_deref();
            plan::fresh(f, gic, name, cfg.net.clone(), cfg.vsock.clone())
                .map_err(StartError::Boot)?
        }
        BootSource::Restore { spec } => {
            let devices = (cfg.net.clone(), cfg.vsock.clone());
            let store = &cfg.snapshots.store;
            snapshot::restore::plan(&hv, spec, cfg.gic, store, devices, &mut stages)
                .map_err(StartError::Restore)?
        }
    };
    let output = console.output().map_err(StartError::Start)?;
    let (vmm, mut launch) = Vmm::build(&hv, plan, output).map_err(StartError::Build)?;
    stages.vm_create = launch.times.vm_create;
    stages.gic = launch.times.gic;
    stages.devices = launch.times.devices;
    // What the agent's answer means for readiness: the restored snapshot
    // records whether its agent had answered (no flag is needed).
    let expect = agent::Expect::new(cfg.agent.is_some(), launch.agent_answered);
    let readiness = Arc::new(agent::Readiness::new(expect, launch.agent_answered));
    let parent = launch.parent.take();
    let answered = readiness.clone();
    let snapshots = Snapshots::new(
        &cfg.snapshots,
        parent,
        H::NAME,
        Box::new(move || answered.answered()),
    );
    snapshots.start_tracking(&vmm).map_err(StartError::Build)?;
    let _raw = console.raw_terminal().map_err(StartError::Start)?;
    let machine = Arc::new(Machine {
        vmm,
        snapshots,
        backend: H::NAME,
        started: t0,
        restored_from: match &cfg.source {
            BootSource::Restore { spec } => Some(spec.clone()),
            BootSource::Fresh(_) => None,
        },
        readiness,
        agent_uds: cfg
            .vsock
            .as_ref()
            .filter(|_| cfg.agent.is_some())
            .map(|v| v.uds.clone()),
        branch: branch::Source {
            branch: cfg.branch.clone(),
            store: std::path::absolute(&cfg.snapshots.store)
                .context("--store")
                .map_err(StartError::Options)?,
            track_dirty: cfg.snapshots.track_dirty,
            mode: cfg.snapshots.mode,
            backend: H::NAME,
            control: cfg.control.clone(),
            net: cfg.net.as_ref().map(|n| n.host.clone()),
            // Read from the devices at each request.
            mac: None,
            cid: None,
            agent_timeout: cfg.agent.as_ref().map(|a| a.timeout),
            can_fork: H::FORKS_VCPUS && cfg!(target_os = "linux"),
        },
    });
    let front = Front {
        signals: &signals,
        console: &mut console,
        running,
    };
    let ran = serve(&machine, cfg, front, launch, stages, t0);
    // However it ended: the front-ends may still hold the VM (an idle
    // control client, the console thread waiting for input), but nothing
    // it made on the host outlives it.
    machine.vmm.remove_host_files();
    ran
}

/// The front-ends `serve` starts, and what it calls once the VM runs.
struct Front<'a> {
    signals: &'a signals::Signals,
    console: &'a mut HostConsole,
    running: Box<dyn FnOnce()>,
}

/// Starts the front-ends and the vCPUs of `machine`, and waits for the VM
/// to end and wind down.
fn serve<V: Vm + 'static>(
    machine: &Arc<Machine<V>>,
    cfg: &MachineConfig,
    front: Front<'_>,
    launch: vm::Launch,
    mut stages: Stages,
    t0: Instant,
) -> Result<VmExit, StartError> {
    let verbs: Arc<dyn ops::Verbs> = machine.clone();
    let socket = cfg
        .control
        .as_deref()
        .map(|path| control_socket::listen(path, verbs.clone()))
        .transpose()
        .map_err(StartError::Start)?;
    front
        .console
        .start(verbs.clone(), machine.clone())
        .map_err(StartError::Start)?;
    front.signals.serve(verbs.clone());
    if let Some(g) = &cfg.branch_guard {
        let guard = g
            .try_clone()
            .context("--branch-guard")
            .map_err(StartError::Start)?;
        branch::watch_guard(
            guard,
            Box::new(move || {
                let _ = verbs.execute(ops::Op::Quit);
            }),
        )
        .context("cannot start the branch guard's thread")
        .map_err(StartError::Start)?;
    }

    let t = Instant::now();
    let (threads, gic_load) = machine
        .vmm
        .start_vcpus(&launch.start, launch.kernel_gic_state)
        .map_err(StartError::Start)?;
    if let Some(d) = gic_load {
        stages.gic += d;
    }
    let restored = matches!(cfg.source, BootSource::Restore { .. });
    if restored {
        machine.vmm.wait_ready();
        stages.vcpus = t.elapsed();
        stages.report(t0.elapsed());
    }
    machine.readiness.vcpus_running();
    if let (Some(a), Some(v)) = (&cfg.agent, &cfg.vsock) {
        let (m, up) = (machine.clone(), machine.clone());
        // A VM restored from a snapshot older than the device has no
        // published ID: the agent gets a fresh one all the same.
        let id = machine
            .vmm
            .devices()
            .generation_id()
            .map_or_else(plan::host_random, Ok);
        let handshake = id.map(|generation_id| agent::Handshake {
            uds: v.uds.clone(),
            generation_id,
            restored,
            t0,
            ended: Box::new(move || m.vmm.finished()),
            guest_up: Box::new(move || {
                let d = up.vmm.devices();
                d.guest_userspace_up() && d.vsock_reset_handled()
            }),
        });
        agent::start(a, handshake, machine.readiness.clone());
    }
    (front.running)();
    let why = machine.vmm.wait_exit();
    // Winding down: the vCPU threads end, a snapshot being taken or written
    // completes, and the control socket's clients get their answers.
    for t in threads {
        let _ = t.join();
    }
    machine.snapshots.finish();
    if let Some(s) = &socket {
        s.drain();
    }
    front.console.finish();
    Ok(why)
}
