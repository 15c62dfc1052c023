//! `boot --restore SPEC`: resolving and verifying a chain, mapping its
//! memory, decoding its machine state, and opening its disk under the
//! restored VM's overlay: the restore's [`Plan`]. The build
//! ([`crate::machine::vm::Vmm::build`]) turns the state back into the
//! interrupt controller, the clock and the devices, the vCPU threads into
//! vCPUs.

use super::state::MachineState;
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::console;
use crate::hv::{GicMode, Hypervisor};
use crate::machine::config::{NetConfig, VsockConfig};
use crate::machine::device_manager::root_disk::{OverlayDisk, RootDisk};
use crate::machine::fork;
use crate::machine::plan::{Plan, Saved};
use crate::machine::vcpu::Start;
use crate::memory::GuestRam;
use anyhow::{bail, Context};
use snapshot_store::{map_base_memory, overlay_diffs_mapped, verify_chain_cached, Chain, Store};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time spent in each restore stage, for the `Restore-time` breakdown.
#[derive(Debug, Default)]
pub struct Stages {
    /// Opening the store, resolving the spec, the checks before mapping,
    /// and opening the chain's disk under the VM's overlay.
    pub resolve: Duration,
    /// Verification, on its own thread alongside map base, overlay and state.
    pub verify: Duration,
    /// How long the main thread then waited for verification.
    pub verify_wait: Duration,
    /// Mapping the base layer's memory copy-on-write.
    pub map_base: Duration,
    /// Overlaying the diffs' pages.
    pub overlay: Duration,
    /// Reading and decoding the machine state.
    pub state: Duration,
    /// Creating the hypervisor's VM.
    pub vm_create: Duration,
    /// The interrupt controller.
    pub gic: Duration,
    /// The devices, the bus and the clock.
    pub devices: Duration,
    /// Creating the vCPUs and starting them from their states.
    pub vcpus: Duration,
}

impl Stages {
    /// Prints `Restore-time = N ms` and the breakdown (µs) by stage on the
    /// critical path. Verification runs on its own thread alongside map
    /// base, overlay and state: its own time is shown in parentheses and only
    /// the wait for it is a stage. Opening the disk is part of resolve, and
    /// reports itself too (`Restore-disk`).
    pub fn report(&self, total: Duration) {
        console::message(&format!("Restore-time = {} ms", total.as_millis()));
        let us = |d: Duration| d.as_micros();
        console::message(&format!(
            "Restore-stages: total {} us, resolve {} us, verify wait {} us (verify {} us), map base {} us, overlay {} us, state {} us, VM create {} us, GIC {} us, devices {} us, vCPUs {} us",
            us(total),
            us(self.resolve),
            us(self.verify_wait),
            us(self.verify),
            us(self.map_base),
            us(self.overlay),
            us(self.state),
            us(self.vm_create),
            us(self.gic),
            us(self.devices),
            us(self.vcpus)
        ));
    }
}

/// The GIC mode to restore snapshot `name` with: the mode its manifest
/// records (`manifest_mode`), which must be one this build knows and, if
/// `boot --gic` was given (`requested`), the same. The GIC's state does not
/// move between modes.
pub fn restore_gic_mode(
    name: &str,
    manifest_mode: &str,
    requested: Option<GicMode>,
) -> anyhow::Result<GicMode> {
    let mode: GicMode = manifest_mode
        .parse()
        .with_context(|| format!("snapshot '{name}' cannot be restored"))?;
    match requested {
        Some(r) if r != mode => bail!(
            "snapshot '{name}' was taken with --gic {mode} and cannot be restored with --gic {r} \
             (GIC state does not move between modes); omit --gic or pass --gic {mode}"
        ),
        _ => Ok(mode),
    }
}

/// Resolves `spec`, verifies the chain, maps its memory and decodes its state.
/// The snapshot's backend and GIC mode are checked against `hv` and
/// `requested` (`boot --gic`) before anything is mapped or created.
pub fn plan<H: Hypervisor>(
    hv: &H,
    spec: &str,
    requested: Option<GicMode>,
    store: &Path,
    devices: (Option<NetConfig>, Option<VsockConfig>),
    stages: &mut Stages,
) -> anyhow::Result<Plan> {
    let t = Instant::now();
    let store = Store::open(store).context("cannot open the snapshot store")?;
    let chain = store.resolve(spec)?;
    let top = chain.top();
    let m = &top.manifest;
    if m.backend != H::NAME {
        bail!(
            "snapshot '{}' was written by the {} backend; restore it with --backend {}",
            top.name,
            m.backend,
            m.backend
        );
    }
    let gic = restore_gic_mode(&top.name, &m.gic_mode, requested)?;
    hv.check_gic_mode(gic)
        .with_context(|| format!("snapshot '{}' cannot be restored here", top.name))?;
    if m.page_size != PAGE_SIZE || m.ram_base_gpa != RAM_BASE {
        bail!(
            "snapshot '{}' has page size {} and RAM at {:#x}; this VMM uses {PAGE_SIZE} and {RAM_BASE:#x}",
            top.name,
            m.page_size,
            m.ram_base_gpa
        );
    }
    let disk = OverlayDisk::create(&store, &chain)?;
    stages.resolve = t.elapsed();

    // Verification (hashes, from the cache when files are unchanged) runs
    // alongside mapping memory and decoding state; nothing of the chain is
    // used before it has passed, and its error wins over later ones, which
    // unverified files may cause.
    // A branch's forked child has the chain's memory mapped by its fork
    // (`fork::map_layer_ram`): it is verified as any restore's.
    let inherited_ram = fork::take_ram()?;
    let (verified, work) = std::thread::scope(|s| {
        let verify = std::thread::Builder::new()
            .name("restore-verify".into())
            .spawn_scoped(s, || {
                let t = Instant::now();
                let r = verify_chain_cached(&chain);
                (r, t.elapsed())
            });
        let work = map_and_decode(&chain, gic, inherited_ram, stages);
        let t = Instant::now();
        let verified = match verify {
            Ok(h) => h
                .join()
                .map_err(|_| anyhow::anyhow!("the verification thread panicked")),
            Err(e) => Err(anyhow::Error::new(e).context("cannot spawn the verification thread")),
        };
        stages.verify_wait = t.elapsed();
        (verified, work)
    });
    let (report, took) = verified?;
    stages.verify = took;
    report?;
    let (ram, state) = work?;
    let cpus = state.vcpus.len();
    let (net, vsock) = devices;
    Ok(Plan {
        ram,
        cpus,
        disk: RootDisk::Overlay(disk),
        cmdline: state.cmdline,
        gic,
        // The vCPU states go to the vCPU threads; the rest to the build.
        start: Start::Restore {
            states: Arc::new(state.vcpus),
        },
        power: state.power,
        saved: Some(Saved {
            gic: state.gic,
            clock: state.clock,
            devices: state.devices,
            agent_answered: state.agent_answered,
        }),
        parent: Some(chain.top().clone()),
        // The command line names the host ends (they may be new ones).
        net,
        vsock,
    })
}

/// Maps `chain`'s memory (base copy-on-write, diffs overlaid; or takes
/// `inherited_ram`, a forked child's, of the same size) and decodes
/// its top layer's machine state, checking it against the manifest and the
/// GIC mode `gic`. Runs while the chain is being verified.
fn map_and_decode(
    chain: &Chain,
    gic: GicMode,
    inherited_ram: Option<Arc<GuestRam>>,
    stages: &mut Stages,
) -> anyhow::Result<(Arc<GuestRam>, MachineState)> {
    let top = chain.top();
    let m = &top.manifest;
    let ram = match inherited_ram {
        // A branch's child forked from its source: the layer's memory,
        // mapped where the source's RAM was.
        Some(ram) if ram.size() == m.ram_size => {
            console::message(
                "Restore-source = fork of the branch's source (its vCPUs with their translated code, RAM mapped from the layer)",
            );
            ram
        }
        Some(ram) => bail!(
            "snapshot '{}' has {} bytes of RAM; the VM this process was forked from has {}",
            top.name,
            m.ram_size,
            ram.size()
        ),
        None => {
            let t = Instant::now();
            let mut mem = map_base_memory(chain.base())?;
            stages.map_base = t.elapsed();
            let t = Instant::now();
            overlay_diffs_mapped(&mut mem, &chain.layers()[1..])?;
            stages.overlay = t.elapsed();
            Arc::new(GuestRam::from_mmap(mem)?)
        }
    };

    let t = Instant::now();
    let state_path = top.state_path();
    let state = MachineState::decode(&top.read_state()?)
        .with_context(|| format!("{}", state_path.display()))?;
    state
        .check_manifest(&m.backend, gic, m.vcpus, m.ram_size)
        .with_context(|| format!("{}", state_path.display()))?;
    stages.state = t.elapsed();
    Ok((ram, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gic_mode_comes_from_the_snapshot() {
        assert_eq!(
            restore_gic_mode("s", "userspace", None).unwrap(),
            GicMode::Userspace
        );
        assert_eq!(restore_gic_mode("s", "hvf", None).unwrap(), GicMode::Hvf);
        assert_eq!(
            restore_gic_mode("s", "hvf", Some(GicMode::Hvf)).unwrap(),
            GicMode::Hvf
        );
    }

    #[test]
    fn a_differing_gic_mode_is_refused_naming_both() {
        let e = restore_gic_mode("golden", "userspace", Some(GicMode::Hvf)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("snapshot 'golden' was taken with --gic userspace"),
            "{msg}"
        );
        assert!(msg.contains("cannot be restored with --gic hvf"), "{msg}");
        let e = restore_gic_mode("g", "hvf", Some(GicMode::Userspace)).unwrap_err();
        assert!(format!("{e:#}").contains("--gic hvf and cannot be restored with --gic userspace"));
    }

    #[test]
    fn an_unknown_gic_mode_is_refused() {
        let e = restore_gic_mode("s", "vgic4", None).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("snapshot 's' cannot be restored"), "{msg}");
        assert!(msg.contains("unknown GIC mode 'vgic4'"), "{msg}");
        assert!(restore_gic_mode("s", "", Some(GicMode::Userspace)).is_err());
    }

    #[cfg(emu)]
    #[test]
    fn the_emu_backend_refuses_the_in_kernel_gic() {
        use crate::hv::emu::EmuHypervisor;
        use crate::hv::gic::NO_KERNEL_GIC_ON_EMU;
        let hv = EmuHypervisor::new();
        assert!(hv.check_gic_mode(GicMode::Userspace).is_ok());
        let e = hv.check_gic_mode(GicMode::Hvf).unwrap_err();
        assert_eq!(e.to_string(), NO_KERNEL_GIC_ON_EMU);
    }
}
