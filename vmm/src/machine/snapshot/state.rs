//! Machine state for snapshots: what is captured at Ctrl-A s and applied at
//! restore, besides guest RAM and the disk (which the snapshot store keeps).
//!
//! The state is serialised as JSON inside the store's `state.bin` envelope
//! (which bounds and checksums it). Everything read back is untrusted:
//! [`MachineState::decode`] checks the format version and the shape, and each
//! device's restore ([`crate::devices::Persist`]) validates its own fields.

use crate::arch::exception::{current_el, PSTATE_NRW};
use crate::arch::sysreg::{DEBUG_SYSREGS, OSLSR_EL1};
use crate::hv::gic::check_icc_state;
use crate::hv::GicMode;
use crate::machine::device_manager::irqchip::IrqchipState;
use crate::machine::device_manager::DevicesState;
use crate::machine::vcpu::clock::{ClockState, TimerState};
use crate::machine::vcpu::state::{VcpuPower, VcpuState};
use serde::{Deserialize, Serialize};

/// Version of the machine-state encoding; bump on incompatible changes.
/// Older versions are still read: [`MachineState::decode`] upgrades them.
///
/// - 5: whether the guest agent had answered ([`MachineState::agent_answered`]);
///   the vsock device's next host port (optional, so version 4 states
///   read without it).
/// - 4: each vCPU's debug registers ([`DEBUG_SYSREGS`]: the OS lock,
///   breakpoints and watchpoints).
/// - 3: the guest's clock once for the VM ([`ClockState`]: one count, and
///   each vCPU's EL1 physical timer) instead of a count per vCPU.
/// - 2: the GIC by mode ([`IrqchipState`]) and each vCPU's in-kernel GIC
///   CPU-interface registers ([`VcpuState::gic_cpu`]).
/// - 1: the userspace GIC only.
pub const MACHINE_STATE_VERSION: u32 = 5;

/// Everything but RAM and the disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineState {
    /// [`MACHINE_STATE_VERSION`].
    pub version: u32,
    /// Backend that wrote it (`emu`, `hvf`).
    pub backend: String,
    /// Guest RAM size in bytes.
    pub ram_size: u64,
    /// Kernel command line the guest booted with (informational).
    pub cmdline: String,
    /// Per vCPU, index order.
    pub vcpus: Vec<VcpuState>,
    /// Per vCPU, index order.
    pub power: Vec<VcpuPower>,
    /// The guest's clock.
    pub clock: ClockState,
    /// The interrupt controller, by mode.
    pub gic: IrqchipState,
    /// Whether the guest agent had answered the VMM with a generation ID
    /// before the snapshot was taken (in this VM, or in one it was
    /// restored from): a restore of a snapshot whose agent answered is
    /// ready only once the agent answers again. `None`: not recorded (a
    /// state written before version 5).
    pub agent_answered: Option<bool>,
    /// The devices (each a top-level key: `pl011`, `boot_timer`, ...).
    #[serde(flatten)]
    pub devices: DevicesState,
}

/// Errors decoding a machine state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Not valid JSON of the expected shape.
    #[error("machine state is malformed: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Written by an incompatible version.
    #[error("machine state version {found} is not supported (this build reads versions 1 to {MACHINE_STATE_VERSION})")]
    Version {
        /// The version found.
        found: u32,
    },
    /// Inconsistent contents.
    #[error("machine state is inconsistent: {0}")]
    Inconsistent(String),
}

impl MachineState {
    /// Serialises the state.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("machine state serialises")
    }

    /// The interrupt controller mode this state was taken with.
    pub fn gic_mode(&self) -> GicMode {
        self.gic.mode()
    }

    /// Checks the state against what its layer's manifest says of the
    /// machine, which the restore has checked against itself: the backend
    /// that wrote it (the one restoring it), the GIC mode, the vCPUs and
    /// the RAM. Error: [`StateError::Inconsistent`], naming both values.
    pub fn check_manifest(
        &self,
        backend: &str,
        gic: GicMode,
        vcpus: u32,
        ram_size: u64,
    ) -> Result<(), StateError> {
        let bad = |m: String| Err(StateError::Inconsistent(m));
        if self.backend != backend {
            return bad(format!(
                "written by the {} backend, but the manifest says {backend} (the backend restoring it)",
                self.backend
            ));
        }
        if self.gic_mode() != gic {
            return bad(format!(
                "the GIC state is for mode '{}', but the manifest says '{gic}'",
                self.gic_mode()
            ));
        }
        if u32::try_from(self.vcpus.len()).ok() != Some(vcpus) || self.ram_size != ram_size {
            return bad(format!(
                "{} vCPUs and {} bytes of RAM, but the manifest says {vcpus} and {ram_size}",
                self.vcpus.len(),
                self.ram_size
            ));
        }
        Ok(())
    }

    /// Parses and checks the shape of an untrusted state. Versions 1 to 4
    /// are upgraded to the current encoding (a version 2 state's clock is
    /// its vCPUs' largest count; a version 3 state's debug registers are 0;
    /// a version 4 state's agent is not recorded).
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        let mut v: serde_json::Value = serde_json::from_slice(bytes)?;
        match v.get("version").and_then(serde_json::Value::as_u64) {
            Some(1) => {
                upgrade_v1(&mut v);
                upgrade_v2(&mut v)?;
                upgrade_v3(&mut v);
                upgrade_v4(&mut v);
            }
            Some(2) => {
                upgrade_v2(&mut v)?;
                upgrade_v3(&mut v);
                upgrade_v4(&mut v);
            }
            Some(3) => {
                upgrade_v3(&mut v);
                upgrade_v4(&mut v);
            }
            Some(4) => upgrade_v4(&mut v),
            Some(found) if found != u64::from(MACHINE_STATE_VERSION) => {
                return Err(StateError::Version {
                    found: u32::try_from(found).unwrap_or(u32::MAX),
                });
            }
            _ => {}
        }
        let s: MachineState = serde_json::from_value(v)?;
        let n = s.vcpus.len();
        if n == 0 || n > crate::arch::layout::MAX_VCPUS || s.power.len() != n {
            return Err(StateError::Inconsistent(format!(
                "{} vCPU states and {} power states",
                n,
                s.power.len()
            )));
        }
        if s.clock.ptimers.len() != n {
            return Err(StateError::Inconsistent(format!(
                "{} vCPU states and {} physical timers",
                n,
                s.clock.ptimers.len()
            )));
        }
        for (id, vcpu) in s.vcpus.iter().enumerate() {
            // A guest runs at EL0 or EL1 in AArch64 state; anything else in
            // a state file is damage or a hand-made store.
            if vcpu.pstate & PSTATE_NRW != 0 || current_el(vcpu.pstate) > 1 {
                return Err(StateError::Inconsistent(format!(
                    "vCPU {id} has PSTATE {:#x}: not AArch64 EL0 or EL1",
                    vcpu.pstate
                )));
            }
            match &s.gic {
                IrqchipState::Userspace(_) if !vcpu.gic_cpu.is_empty() => {
                    return Err(StateError::Inconsistent(format!(
                        "vCPU {id} has in-kernel GIC registers but the GIC is the userspace one"
                    )));
                }
                IrqchipState::Userspace(_) => {}
                IrqchipState::Hvf(_) => check_icc_state(&vcpu.gic_cpu)
                    .map_err(|e| StateError::Inconsistent(format!("vCPU {id}: {e}")))?,
            }
        }
        if let IrqchipState::Hvf(blob) = &s.gic {
            if blob.is_empty() {
                return Err(StateError::Inconsistent(
                    "the in-kernel GIC state is empty".into(),
                ));
            }
        }
        Ok(s)
    }
}

/// Version 1 to 2: the userspace GIC's state becomes `{"userspace": GIC}`.
fn upgrade_v1(v: &mut serde_json::Value) {
    if let Some(obj) = v.as_object_mut() {
        if let Some(gic) = obj.remove("gic") {
            obj.insert("gic".into(), serde_json::json!({ "userspace": gic }));
        }
        obj.insert("version".into(), 2.into());
    }
}

/// Version 2 to 3: each vCPU's `virtual_count` goes, and the VM's clock
/// takes the largest of them as its count, so no vCPU's clock steps back
/// (each vCPU was captured when it parked; the others moved on by at most
/// the time until the last one parked). The physical timers are disabled:
/// before version 3 their registers were UNDEFINED, so no guest used them.
fn upgrade_v2(v: &mut serde_json::Value) -> Result<(), StateError> {
    let counts = v
        .get_mut("vcpus")
        .and_then(serde_json::Value::as_array_mut)
        .map(|vcpus| {
            vcpus
                .iter_mut()
                .map(|vcpu| {
                    vcpu.as_object_mut()
                        .and_then(|o| o.remove("virtual_count"))
                        .and_then(|c| c.as_u64())
                })
                .collect::<Option<Vec<u64>>>()
        });
    let Some(Some(counts)) = counts else {
        return Err(StateError::Inconsistent(
            "a version 2 state needs every vCPU's virtual_count".into(),
        ));
    };
    let clock = ClockState {
        virtual_count: counts.iter().copied().max().unwrap_or(0),
        ptimers: vec![TimerState { ctl: 0, cval: 0 }; counts.len()],
    };
    if let Some(obj) = v.as_object_mut() {
        obj.insert("clock".into(), serde_json::to_value(clock)?);
        obj.insert("version".into(), 3.into());
    }
    Ok(())
}

/// OSLSR_EL1 with the OS lock implemented (OSLM = 0b10) and clear.
const OSLSR_UNLOCKED: u64 = 0b1000;

/// Version 3 to 4: every vCPU gains [`DEBUG_SYSREGS`]: the OS lock clear
/// (as Linux leaves it once booted) and the breakpoint and watchpoint
/// registers 0. Before version 4 they were not saved (breakpoints did not
/// work on `emu`), so no restored guest relied on them.
fn upgrade_v3(v: &mut serde_json::Value) {
    if let Some(vcpus) = v.get_mut("vcpus").and_then(serde_json::Value::as_array_mut) {
        for vcpu in vcpus {
            if let Some(regs) = vcpu
                .get_mut("sysregs")
                .and_then(serde_json::Value::as_array_mut)
            {
                regs.extend(DEBUG_SYSREGS.iter().map(|&r| {
                    let value = if r == OSLSR_EL1 { OSLSR_UNLOCKED } else { 0 };
                    serde_json::json!([r.0, value])
                }));
            }
        }
    }
    if let Some(obj) = v.as_object_mut() {
        obj.insert("version".into(), 4.into());
    }
}

/// Version 4 to 5: whether the guest agent had answered is not known
/// (`agent_answered` null).
fn upgrade_v4(v: &mut serde_json::Value) {
    if let Some(obj) = v.as_object_mut() {
        obj.insert("agent_answered".into(), serde_json::Value::Null);
        obj.insert("version".into(), MACHINE_STATE_VERSION.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::sysreg::{SysReg, ICC_CTLR_EL1, SCTLR_EL1};
    use crate::devices::boot_timer::BootTimer;
    use crate::devices::gicv3::Gicv3;
    use crate::devices::pl011::Pl011;
    use crate::devices::pl031::{HostClock, Pl031};
    use crate::devices::virtio::block::{Block, BlockArgs, BlockDisk};
    use crate::devices::virtio::mmio::VirtioMmio;
    use crate::devices::virtio::net::{Net, NetArgs, NetBackend};
    use crate::devices::virtio::vsock::{Vsock, VsockArgs, VsockHost};
    use crate::devices::vmgenid::VmGenIdState;
    use crate::devices::{IrqLine, Persist};
    use crate::hv::gic::ICC_STATE_REGS;
    use crate::machine::device_manager::{DeviceArgs, Devices};
    use crate::memory::GuestRam;
    use std::sync::Arc;
    use std::time::Instant;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 1, 2, 3];

    /// A network host end that drops every frame.
    struct Discard;
    impl NetBackend for Discard {
        fn send(&mut self, _frame: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct NoIrq;
    impl IrqLine for NoIrq {
        fn set_level(&self, _level: bool) {}
    }

    fn vcpu(gic_cpu: Vec<(SysReg, u64)>) -> VcpuState {
        VcpuState {
            x: (0..31).collect(),
            pc: 0xffff_8000_1000_0000,
            pstate: 0x3c5,
            v: (0..32).map(|n| (n, !n)).collect(),
            sysregs: std::iter::once((SCTLR_EL1, 0x30d0_1805))
                .chain(
                    DEBUG_SYSREGS
                        .iter()
                        .map(|&r| (r, if r == OSLSR_EL1 { OSLSR_UNLOCKED } else { 0 })),
                )
                .collect(),
            cntv_ctl: 1,
            cntv_cval: 123_456,
            gic_cpu,
        }
    }

    /// The in-kernel GIC's registers of one vCPU.
    fn icc() -> Vec<(SysReg, u64)> {
        let ctlr = 4 << 8;
        ICC_STATE_REGS
            .into_iter()
            .map(|r| (r, if r == ICC_CTLR_EL1 { ctlr } else { 0xf0 }))
            .collect()
    }

    fn state(gic: IrqchipState, gic_cpu: Vec<(SysReg, u64)>) -> MachineState {
        let ram = Arc::new(GuestRam::new_anonymous(64 << 20).unwrap());
        let disk = tempfile::tempfile().unwrap();
        disk.set_len(1 << 20).unwrap();
        let blk = VirtioMmio::new(
            Block::new(disk, false, "test").unwrap(),
            ram.clone(),
            Arc::new(NoIrq),
        )
        .unwrap();
        let net = VirtioMmio::new(
            Net::new(MAC, Box::new(Discard)),
            ram.clone(),
            Arc::new(NoIrq),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let host = VsockHost::bind(&dir.path().join("v.sock")).unwrap();
        let vsock = VirtioMmio::new(Vsock::new(3, host), ram, Arc::new(NoIrq)).unwrap();
        MachineState {
            version: MACHINE_STATE_VERSION,
            backend: "hvf".into(),
            ram_size: 64 << 20,
            cmdline: "console=ttyAMA0".into(),
            vcpus: vec![vcpu(gic_cpu.clone()), vcpu(gic_cpu)],
            power: vec![VcpuPower::On, VcpuPower::Off],
            clock: ClockState {
                virtual_count: 100_000,
                ptimers: vec![
                    TimerState {
                        ctl: 1,
                        cval: 100_500,
                    },
                    TimerState { ctl: 0, cval: 0 },
                ],
            },
            gic,
            agent_answered: Some(true),
            devices: DevicesState {
                pl011: Pl011::new(Box::new(std::io::sink()), Arc::new(NoIrq)).save(),
                pl031: Some(Pl031::new(Arc::new(HostClock), Arc::new(NoIrq)).save()),
                boot_timer: BootTimer::new(std::time::Instant::now(), Box::new(|_| {})).save(),
                virtio_blk: blk.save(),
                vmgenid: Some(VmGenIdState {
                    gpa: 0x4fff_c000,
                    id: [0x5a; 16],
                }),
                virtio_net: Some(net.save()),
                virtio_vsock: Some(vsock.save()),
            },
        }
    }

    fn userspace() -> MachineState {
        state(IrqchipState::Userspace(Gicv3::new(2).save()), Vec::new())
    }

    fn hvf() -> MachineState {
        state(IrqchipState::Hvf(vec![0, 1, 0xab, 0xff, 0x10]), icc())
    }

    #[test]
    fn a_state_that_disagrees_with_its_manifest_is_refused_naming_both() {
        let s = userspace();
        let (gic, n, ram) = (GicMode::Userspace, 2, 64 << 20);
        s.check_manifest("hvf", gic, n, ram).unwrap();
        // Written by hvf, restored by emu (whose manifest says emu).
        let e = s
            .check_manifest("emu", gic, n, ram)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("written by the hvf backend, but the manifest says emu"),
            "{e}"
        );
        let e = s.check_manifest("hvf", GicMode::Hvf, n, ram).unwrap_err();
        assert!(
            e.to_string()
                .contains("'userspace', but the manifest says 'hvf'"),
            "{e}"
        );
        let e = s.check_manifest("hvf", gic, 4, ram).unwrap_err();
        assert!(e.to_string().contains("2 vCPUs"), "{e}");
        assert!(s.check_manifest("hvf", gic, n, ram + 1).is_err());
    }

    #[test]
    fn userspace_gic_state_round_trips() {
        let s = userspace();
        let back = MachineState::decode(&s.encode()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.gic_mode(), GicMode::Userspace);
        let json = String::from_utf8(s.encode()).unwrap();
        assert!(json.contains("\"gic\":{\"userspace\":"), "{json}");
    }

    #[test]
    fn in_kernel_gic_state_round_trips() {
        let s = hvf();
        let back = MachineState::decode(&s.encode()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.gic_mode(), GicMode::Hvf);
        assert_eq!(back.vcpus[1].gic_cpu, icc());
        // The blob is a hex string, not a JSON array.
        let json = String::from_utf8(s.encode()).unwrap();
        assert!(json.contains("\"gic\":{\"hvf\":\"0001abff10\"}"), "{json}");
    }

    #[test]
    fn devices_are_top_level_keys_and_unknown_keys_are_refused() {
        let json = String::from_utf8(userspace().encode()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut expected = [
            "version",
            "backend",
            "ram_size",
            "cmdline",
            "vcpus",
            "power",
            "clock",
            "gic",
            "agent_answered",
            "pl011",
            "pl031",
            "boot_timer",
            "virtio_blk",
            "vmgenid",
            "virtio_net",
            "virtio_vsock",
        ];
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        expected.sort_unstable();
        assert_eq!(sorted, expected);
        // Serialised in declaration order, devices last.
        let at = |k: &str| json.find(&format!("\"{k}\":")).unwrap();
        assert!(at("gic") < at("agent_answered") && at("agent_answered") < at("pl011"));
        assert!(at("pl011") < at("pl031"));
        assert!(at("pl031") < at("boot_timer"));
        assert!(at("boot_timer") < at("virtio_blk") && at("virtio_blk") < at("vmgenid"));
        assert!(at("vmgenid") < at("virtio_net") && at("virtio_net") < at("virtio_vsock"));
        let extra = json.replacen('{', "{\"extra\":1,", 1);
        assert!(matches!(
            MachineState::decode(extra.as_bytes()),
            Err(StateError::Malformed(_))
        ));
    }

    /// `s` as version 4 wrote it: no `agent_answered`.
    fn as_version_4(s: &MachineState) -> serde_json::Value {
        let mut v = serde_json::to_value(s).unwrap();
        v["version"] = 4.into();
        v.as_object_mut().unwrap().remove("agent_answered");
        v
    }

    /// `s` as an upgrade from before version 5 makes it: the agent not
    /// recorded.
    fn unrecorded(mut s: MachineState) -> MachineState {
        s.agent_answered = None;
        s
    }

    #[test]
    fn version_4_states_do_not_know_the_agent() {
        for s in [userspace(), hvf()] {
            let back =
                MachineState::decode(&serde_json::to_vec(&as_version_4(&s)).unwrap()).unwrap();
            assert_eq!(back, unrecorded(s.clone()));
            assert_eq!(back.version, MACHINE_STATE_VERSION);
        }
        for answered in [Some(false), Some(true), None] {
            let s = MachineState {
                agent_answered: answered,
                ..userspace()
            };
            assert_eq!(MachineState::decode(&s.encode()).unwrap(), s);
        }
    }

    /// `s` as version 3 wrote it: no breakpoint and watchpoint registers
    /// (the fixture's are 0, as the upgrade makes them).
    fn as_version_3(s: &MachineState) -> serde_json::Value {
        let mut v = as_version_4(s);
        v["version"] = 3.into();
        for vcpu in v["vcpus"].as_array_mut().unwrap() {
            let regs = vcpu["sysregs"].as_array_mut().unwrap();
            regs.retain(|r| !DEBUG_SYSREGS.iter().any(|d| r[0] == d.0));
            assert_eq!(regs.len(), 1);
        }
        v
    }

    #[test]
    fn version_3_states_get_the_debug_registers_at_0() {
        for s in [userspace(), hvf()] {
            let back =
                MachineState::decode(&serde_json::to_vec(&as_version_3(&s)).unwrap()).unwrap();
            assert_eq!(back, unrecorded(s));
        }
    }

    /// `s` as version 2 wrote it: a count per vCPU (`counts`), no clock.
    fn as_version_2(s: &MachineState, counts: &[u64]) -> serde_json::Value {
        let mut v = as_version_3(s);
        let obj = v.as_object_mut().unwrap();
        obj.remove("clock");
        obj.insert("version".into(), 2.into());
        for (vcpu, &c) in obj["vcpus"].as_array_mut().unwrap().iter_mut().zip(counts) {
            vcpu.as_object_mut()
                .unwrap()
                .insert("virtual_count".into(), c.into());
        }
        v
    }

    /// `s` as the upgrade makes it: the largest count, timers disabled,
    /// the agent not recorded.
    fn upgraded(s: MachineState, count: u64) -> MachineState {
        let mut s = unrecorded(s);
        s.clock.virtual_count = count;
        for t in &mut s.clock.ptimers {
            *t = TimerState { ctl: 0, cval: 0 };
        }
        s
    }

    #[test]
    fn version_2_states_get_one_clock() {
        for s in [userspace(), hvf()] {
            // vCPU 1 parked 250 ticks after vCPU 0.
            let v = as_version_2(&s, &[100_000, 100_250]);
            let back = MachineState::decode(&serde_json::to_vec(&v).unwrap()).unwrap();
            assert_eq!(back, upgraded(s.clone(), 100_250));
            assert_eq!(back.version, MACHINE_STATE_VERSION);
            let v = as_version_2(&s, &[7, 3]);
            let back = MachineState::decode(&serde_json::to_vec(&v).unwrap()).unwrap();
            assert_eq!(back.clock.virtual_count, 7, "the largest count");
        }
        // A version 2 state without a vCPU's count is refused, naming it.
        let mut v = as_version_2(&userspace(), &[1, 2]);
        v["vcpus"][1]
            .as_object_mut()
            .unwrap()
            .remove("virtual_count");
        let e = MachineState::decode(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(e.to_string().contains("virtual_count"), "{e}");
        // A version 5 state with a per-vCPU count is malformed.
        let mut v = as_version_2(&userspace(), &[1, 2]);
        v["version"] = 5.into();
        v["agent_answered"] = true.into();
        v["clock"] = serde_json::to_value(&userspace().clock).unwrap();
        assert!(matches!(
            MachineState::decode(&serde_json::to_vec(&v).unwrap()),
            Err(StateError::Malformed(_))
        ));
    }

    #[test]
    fn version_1_states_are_upgraded() {
        let s = userspace();
        let mut v = as_version_2(&s, &[5_000, 4_000]);
        let obj = v.as_object_mut().unwrap();
        let IrqchipState::Userspace(g) = &s.gic else {
            unreachable!()
        };
        obj.insert("gic".into(), serde_json::to_value(g).unwrap());
        obj.insert("version".into(), 1.into());
        for vcpu in obj["vcpus"].as_array_mut().unwrap() {
            vcpu.as_object_mut().unwrap().remove("gic_cpu");
        }
        let back = MachineState::decode(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(back, upgraded(s, 5_000));
        // Other versions are refused.
        for found in [0, 6, u64::from(u32::MAX) + 1] {
            v["version"] = found.into();
            let r = MachineState::decode(&serde_json::to_vec(&v).unwrap());
            assert!(
                matches!(r, Err(StateError::Version { found: f }) if u64::from(f) == found.min(u64::from(u32::MAX))),
                "{found}: {r:?}"
            );
        }
    }

    #[test]
    fn the_clock_has_a_timer_per_vcpu() {
        let mut s = userspace();
        s.clock.ptimers.pop();
        assert!(matches!(
            MachineState::decode(&s.encode()),
            Err(StateError::Inconsistent(_))
        ));
        let json = String::from_utf8(userspace().encode()).unwrap();
        assert!(
            json.contains(r#""clock":{"virtual_count":100000,"ptimers":[{"ctl":1,"cval":100500},{"ctl":0,"cval":0}]}"#),
            "{json}"
        );
    }

    #[test]
    fn gic_registers_must_match_the_mode() {
        // In-kernel registers with the userspace GIC.
        let mut s = userspace();
        s.vcpus[0].gic_cpu = icc();
        assert!(matches!(
            MachineState::decode(&s.encode()),
            Err(StateError::Inconsistent(_))
        ));
        // Missing or malformed registers with the in-kernel GIC.
        let mut s = hvf();
        s.vcpus[1].gic_cpu.clear();
        assert!(matches!(
            MachineState::decode(&s.encode()),
            Err(StateError::Inconsistent(_))
        ));
        let mut s = hvf();
        s.vcpus[0].gic_cpu.swap(0, 1);
        assert!(MachineState::decode(&s.encode()).is_err());
        // An empty blob.
        let mut s = hvf();
        s.gic = IrqchipState::Hvf(Vec::new());
        assert!(MachineState::decode(&s.encode()).is_err());
        // Bad hex.
        let json = String::from_utf8(hvf().encode())
            .unwrap()
            .replace("0001abff10", "0001abff1");
        assert!(MachineState::decode(json.as_bytes()).is_err());
        let json = String::from_utf8(hvf().encode())
            .unwrap()
            .replace("0001abff10", "0001abff1g");
        assert!(MachineState::decode(json.as_bytes()).is_err());
        // An unknown GIC mode.
        let json = String::from_utf8(hvf().encode())
            .unwrap()
            .replace("{\"hvf\":", "{\"vgic\":");
        assert!(MachineState::decode(json.as_bytes()).is_err());
    }

    fn xorshift(rng: &mut u64) -> u64 {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    }

    /// JSON pointers to every number, string and array in `v`.
    fn targets(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Array(a) => {
                out.push(at.clone());
                for (i, x) in a.iter().enumerate() {
                    targets(x, format!("{at}/{i}"), out);
                }
            }
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    targets(x, format!("{at}/{k}"), out);
                }
            }
            serde_json::Value::Number(_) | serde_json::Value::String(_) => out.push(at),
            _ => {}
        }
    }

    /// Changes one number, string or array of `v`: a number to a small,
    /// large or extreme value, a string to another mode name or junk, an
    /// array truncated or grown with copies of its first element.
    fn mutate(v: &mut serde_json::Value, paths: &[String], rng: &mut u64) {
        let path = &paths[(xorshift(rng) % paths.len() as u64) as usize];
        let r = xorshift(rng);
        let Some(x) = v.pointer_mut(path) else {
            return;
        };
        match x {
            serde_json::Value::Number(_) => {
                *x = match r % 5 {
                    0 => 0.into(),
                    1 => (r >> 3 & 0xff).into(),
                    2 => (r >> 3 & 0xffff_ffff).into(),
                    3 => u64::MAX.into(),
                    _ => (r >> 3).into(),
                }
            }
            serde_json::Value::String(_) => {
                *x = ["", "hvf", "userspace", "zz", "0"][(r % 5) as usize].into();
            }
            serde_json::Value::Array(a) => {
                if r % 2 == 0 {
                    a.truncate((r >> 1) as usize % (a.len() + 1));
                } else if let Some(first) = a.first().cloned() {
                    for _ in 0..(r >> 1) % 40 {
                        a.push(first.clone());
                    }
                }
            }
            _ => {}
        }
    }

    #[test]
    fn vcpus_must_be_at_el0_or_el1_in_aarch64() {
        for (pstate, ok) in [
            (0x3c5, true),
            (0x3c4, true),
            (0, true),
            (0x3c9, false),
            (0x3cd, false),
            (0x10, false),
        ] {
            let mut s = userspace();
            s.vcpus[1].pstate = pstate;
            let r = MachineState::decode(&s.encode());
            assert_eq!(r.is_ok(), ok, "PSTATE {pstate:#x}: {r:?}");
        }
    }

    /// A state file is untrusted (a store can be hand-made): whatever a
    /// decodable state says, restoring the devices from it errors or works,
    /// and never panics.
    #[test]
    fn hostile_states_never_panic_device_restore() {
        let good = serde_json::to_value(userspace()).unwrap();
        let mut paths = Vec::new();
        targets(&good, String::new(), &mut paths);
        let ram = Arc::new(GuestRam::new_anonymous(64 << 20).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let mut rng = 0x5eed_1234_abcd_ef01u64;
        let mut decoded = 0;
        for _ in 0..3000 {
            let mut v = good.clone();
            for _ in 0..1 + xorshift(&mut rng) % 3 {
                mutate(&mut v, &paths, &mut rng);
            }
            let Ok(st) = MachineState::decode(&serde_json::to_vec(&v).unwrap()) else {
                continue;
            };
            decoded += 1;
            if let IrqchipState::Userspace(g) = &st.gic {
                let _ = Gicv3::restore(st.vcpus.len(), g);
            }
            let devices = &st.devices;
            let _ = Pl011::restore((Box::new(std::io::sink()), Arc::new(NoIrq)), &devices.pl011);
            if let Some(rtc) = &devices.pl031 {
                let _ = Pl031::restore((Arc::new(HostClock), Arc::new(NoIrq)), rtc);
            }
            let _ = BootTimer::restore((Instant::now(), Box::new(|_| {})), &devices.boot_timer);
            let disk = tempfile::tempfile().unwrap();
            disk.set_len(1 << 20).unwrap();
            let args = BlockArgs {
                disk: BlockDisk::File(Arc::new(disk.try_clone().unwrap())),
                len: 1 << 20,
                read_only: false,
                serial: "test".into(),
            };
            let irq = Arc::new(NoIrq);
            let _ = VirtioMmio::<Block>::restore((args, ram.clone(), irq), &devices.virtio_blk);
            if let Some(net) = &devices.virtio_net {
                let args = NetArgs {
                    mac: Some(MAC),
                    backend: Box::new(Discard),
                };
                let _ = VirtioMmio::<Net>::restore((args, ram.clone(), Arc::new(NoIrq)), net);
            }
            if let Some(vsock) = &devices.virtio_vsock {
                let args = VsockArgs {
                    cid: None,
                    host: VsockHost::bind(&dir.path().join("v.sock")).unwrap(),
                };
                let _ = VirtioMmio::<Vsock>::restore((args, ram.clone(), Arc::new(NoIrq)), vsock);
            }
            // The whole set too (it stops at the first device it refuses).
            let args = DeviceArgs {
                ram: ram.clone(),
                irq: Box::new(|_| Arc::new(NoIrq)),
                console: Box::new(std::io::sink()),
                start: Instant::now(),
                disk: BlockDisk::File(Arc::new(disk)),
                disk_len: 1 << 20,
                generation_id: [9; 16],
                net: None,
                vsock: None,
            };
            let _ = Devices::restore(args, devices);
        }
        // The mutations leave many states decodable, so restore really ran.
        assert!(decoded > 300, "only {decoded} mutated states decoded");
    }
}
