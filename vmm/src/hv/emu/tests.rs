//! End-to-end tests of the `emu` backend: tiny hand-encoded guest programs
//! run in an [`EmuVm`] against a recording [`VcpuIo`].
//!
//! The A64 words were produced with `aarch64-linux-gnu-as` and are listed
//! with their assembly (the offset is from the program's start). Layout:
//! guest RAM at `RAM_BASE`; a vector table at `VBAR` whose 16 entries are
//! `HVC #0x100+n` (so a taken exception shows up as `Hvc { imm: 0x100+n }`:
//! 0x104 = sync from current EL with SP_EL1, 0x105 = IRQ, 0x108 = sync from
//! EL0); programs at `CODE`.

use super::*;
use crate::arch::layout::{GICD_BASE, PAGE_SIZE, RAM_BASE, VIRTIO_MMIO_BASE};
use crate::arch::sysreg::{self as sr, SysReg};
use crate::hv::{GicMode, Hypervisor, MmioFault, Prot, Reg, Vcpu, VcpuExit, VcpuId, VcpuIo, Vm};
use crate::memory::GuestRam;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress};

const RAM_SIZE: u64 = 4 << 20;
const VBAR: u64 = RAM_BASE + 0x800;
const CODE: u64 = RAM_BASE + 0x1000;
/// Vector `HVC` immediates.
const SYNC_EL1H: u16 = 0x104;
const IRQ_EL1H: u16 = 0x105;
const SYNC_EL0: u16 = 0x108;

/// `mmio_sizes`
const MMIO_SIZES: &[u32] = &[
    0x3900_0022, // 0x00: strb w2, [x1]
    0x7900_0422, // 0x04: strh w2, [x1, #2]
    0xb900_0422, // 0x08: str w2, [x1, #4]
    0xf900_0422, // 0x0c: str x2, [x1, #8]
    0x3940_4023, // 0x10: ldrb w3, [x1, #0x10]
    0x7940_2424, // 0x14: ldrh w4, [x1, #0x12]
    0xb940_1425, // 0x18: ldr w5, [x1, #0x14]
    0xf940_0c26, // 0x1c: ldr x6, [x1, #0x18]
    0x3980_8027, // 0x20: ldrsb x7, [x1, #0x20]
    0x79c0_4428, // 0x24: ldrsh w8, [x1, #0x22]
    0xd400_0022, // 0x28: hvc #1
];
/// `mmio_addressing`
const MMIO_ADDRESSING: &[u32] = &[
    0xb840_4c29, // 0x00: ldr w9, [x1, #4]!
    0xb800_8422, // 0x04: str w2, [x1], #8
    0x2944_2c2a, // 0x08: ldp w10, w11, [x1, #0x20]
    0xf82c_683f, // 0x0c: str xzr, [x1, x12]
    0xd400_0042, // 0x10: hvc #2
];
/// `hvc_smc`
const HVC_SMC: &[u32] = &[
    0xd400_00a2, // 0x00: hvc #5
    0xd400_0ee3, // 0x04: smc #0x77
    0xd400_00c2, // 0x08: hvc #6
];
/// `wfi`
const WFI: &[u32] = &[
    0xd503_207f, // 0x00: wfi
    0xd400_0042, // 0x04: hvc #2
];
/// `icc`
const ICC: &[u32] = &[
    0xd518_4601, // 0x00: msr icc_pmr_el1, x1
    0xd538_cc02, // 0x04: mrs x2, icc_iar1_el1
    0xd518_cc22, // 0x08: msr icc_eoir1_el1, x2
    0xd400_0002, // 0x0c: hvc #0
];
/// `undef_sysreg`
const UNDEF_SYSREG: &[u32] = &[
    0xd53a_ffe0, // 0x00: mrs x0, s3_2_c15_c15_7
    0xd400_0122, // 0x04: hvc #9
];
/// `icc_refused`
const ICC_REFUSED: &[u32] = &[
    0xd538_cc43, // 0x00: mrs x3, icc_hppir1_el1
    0xd400_0122, // 0x04: hvc #9
];
/// `spin`
const SPIN: &[u32] = &[
    0xd503_201f, // 0x00: nop
    0x17ff_ffff, // 0x04: b .-4
];
/// `mmu16k`
const MMU16K: &[u32] = &[
    0xd518_a202, // 0x00: msr mair_el1, x2
    0xd518_2041, // 0x04: msr tcr_el1, x1
    0xd518_2000, // 0x08: msr ttbr0_el1, x0
    0xd503_3fdf, // 0x0c: isb
    0xd518_1003, // 0x10: msr sctlr_el1, x3
    0xd503_3fdf, // 0x14: isb
    0xf940_0086, // 0x18: ldr x6, [x4]
    0xd508_7804, // 0x1c: at s1e1r, x4
    0xd538_7408, // 0x20: mrs x8, par_el1
    0xd508_7805, // 0x24: at s1e1r, x5
    0xd538_7409, // 0x28: mrs x9, par_el1
    0xf940_00a7, // 0x2c: ldr x7, [x5]
    0xd400_0122, // 0x30: hvc #9
];
/// `tlbi`
const TLBI: &[u32] = &[
    0xf940_0086, // 0x00: ldr x6, [x4]
    0xf900_0041, // 0x04: str x1, [x2]
    0xd503_3a9f, // 0x08: dsb ishst
    0xd508_8323, // 0x0c: tlbi vae1is, x3
    0xd503_3b9f, // 0x10: dsb ish
    0xd503_3fdf, // 0x14: isb
    0xf940_0087, // 0x18: ldr x7, [x4]
    0xd400_0062, // 0x1c: hvc #3
];
/// `dirty`
const DIRTY: &[u32] = &[
    0xf940_0023, // 0x00: ldr x3, [x1]
    0xf940_0044, // 0x04: ldr x4, [x2]
    0x9100_0484, // 0x08: add x4, x4, #1
    0xf800_8444, // 0x0c: str x4, [x2], #8
    0xf900_0044, // 0x10: str x4, [x2]
    0xd400_0002, // 0x14: hvc #0
];
/// `read_only`
const READ_ONLY: &[u32] = &[
    0xf940_0045, // 0x00: ldr x5, [x2]
    0xd400_0022, // 0x04: hvc #1
];
/// `vtimer`
const VTIMER: &[u32] = &[
    0xd53b_e040, // 0x00: mrs x0, cntvct_el0
    0x8b01_0000, // 0x04: add x0, x0, x1
    0xd51b_e340, // 0x08: msr cntv_cval_el0, x0
    0xd280_0022, // 0x0c: mov x2, #1
    0xd51b_e322, // 0x10: msr cntv_ctl_el0, x2
    0xd503_42ff, // 0x14: msr daifclr, #2
    0x1400_0000, // 0x18: b .
];
/// `el0_svc`
const EL0_SVC: &[u32] = &[
    0xd518_4020, // 0x00: msr elr_el1, x0
    0xd518_401f, // 0x04: msr spsr_el1, xzr
    0xd69f_03e0, // 0x08: eret
    0xd400_00e1, // 0x0c: svc #7
];
/// `brk`
const BRK: &[u32] = &[
    0xd421_0000, // 0x00: brk #0x800
];
/// `load_x1`
const LOAD_X1: &[u32] = &[
    0xf940_0020, // 0x00: ldr x0, [x1]
    0xd400_0122, // 0x04: hvc #9
];
/// `mov1`
const MOV1: &[u32] = &[
    0xd280_0020, // 0x00: mov x0, #1
    0xd400_0002, // 0x04: hvc #0
];
/// `patch`
const PATCH: &[u32] = &[
    0xb900_0041, // 0x00: str w1, [x2]
    0xd50b_7b22, // 0x04: dc cvau, x2
    0xd503_3b9f, // 0x08: dsb ish
    0xd50b_7522, // 0x0c: ic ivau, x2
    0xd503_3b9f, // 0x10: dsb ish
    0xd503_3fdf, // 0x14: isb
    0xd400_0022, // 0x18: hvc #1
];
/// `count`
const COUNT: &[u32] = &[
    0xf100_0400, // 0x00: subs x0, x0, #1
    0x8b00_0021, // 0x04: add x1, x1, x0
    0xca01_0042, // 0x08: eor x2, x2, x1
    0x54ff_ffa1, // 0x0c: b.ne .-12
    0xd400_0002, // 0x10: hvc #0
];
/// `counters`
const COUNTERS: &[u32] = &[
    0xd53b_e000, // 0x00: mrs x0, cntfrq_el0
    0xd53b_e041, // 0x04: mrs x1, cntvct_el0
    0xd538_00a2, // 0x08: mrs x2, mpidr_el1
    0xd538_0703, // 0x0c: mrs x3, id_aa64mmfr0_el1
    0xd400_0002, // 0x10: hvc #0
];
/// `id_regs`: the advertised ID registers, and the absent PMU's RAZ/WI.
const ID_REGS: &[u32] = &[
    0xd538_0400, // 0x00: mrs x0, id_aa64pfr0_el1
    0xd538_0421, // 0x04: mrs x1, id_aa64pfr1_el1
    0xd538_0502, // 0x08: mrs x2, id_aa64dfr0_el1
    0xd538_0523, // 0x0c: mrs x3, id_aa64dfr1_el1
    0xd538_0604, // 0x10: mrs x4, id_aa64isar0_el1
    0xd538_0625, // 0x14: mrs x5, id_aa64isar1_el1
    0xd538_0706, // 0x18: mrs x6, id_aa64mmfr0_el1
    0xd538_0727, // 0x1c: mrs x7, id_aa64mmfr1_el1
    0xd538_0748, // 0x20: mrs x8, id_aa64mmfr2_el1
    0xd51b_9c09, // 0x24: msr pmcr_el0, x9
    0xd51b_9c29, // 0x28: msr pmcntenset_el0, x9
    0xd51b_9c89, // 0x2c: msr pmswinc_el0, x9
    0xd53b_9c0a, // 0x30: mrs x10, pmcr_el0
    0xd53b_9ccb, // 0x34: mrs x11, pmceid0_el0
    0xd53b_9d0c, // 0x38: mrs x12, pmccntr_el0
    0xd53b_e80d, // 0x3c: mrs x13, pmevcntr0_el0
    0xd400_0002, // 0x40: hvc #0
];
/// `counts`
const COUNTS: &[u32] = &[
    0xd53b_e040, // 0x00: mrs x0, cntvct_el0
    0xd53b_e021, // 0x04: mrs x1, cntpct_el0
    0xd53b_e042, // 0x08: mrs x2, cntvct_el0
    0xd400_0002, // 0x0c: hvc #0
];
/// `ptimer`
const PTIMER: &[u32] = &[
    0xd53b_e221, // 0x00: mrs x1, cntp_ctl_el0
    0xd51b_e242, // 0x04: msr cntp_cval_el0, x2
    0xd51b_e203, // 0x08: msr cntp_tval_el0, x3
    0xd51b_e224, // 0x0c: msr cntp_ctl_el0, x4
    0xd53b_e205, // 0x10: mrs x5, cntp_tval_el0
    0xd53b_e246, // 0x14: mrs x6, cntp_cval_el0
    0xd400_0002, // 0x18: hvc #0
];
/// `self_modify`
const SELF_MODIFY: &[u32] = &[
    0xd63f_0080, // 0x00: blr x4
    0xaa00_03e5, // 0x04: mov x5, x0
    0xb900_0081, // 0x08: str w1, [x4]
    0xd50b_7b24, // 0x0c: dc cvau, x4
    0xd503_3b9f, // 0x10: dsb ish
    0xd50b_7524, // 0x14: ic ivau, x4
    0xd503_3b9f, // 0x18: dsb ish
    0xd503_3fdf, // 0x1c: isb
    0xd63f_0080, // 0x20: blr x4
    0xaa00_03e6, // 0x24: mov x6, x0
    0xd400_0082, // 0x28: hvc #4
];
/// `callee`
const CALLEE: &[u32] = &[
    0xd280_0020, // 0x00: mov x0, #1
    0xd65f_03c0, // 0x04: ret
];
/// `el0_load`
const EL0_LOAD: &[u32] = &[
    0xd518_4020, // 0x00: msr elr_el1, x0
    0xd518_401f, // 0x04: msr spsr_el1, xzr
    0xd69f_03e0, // 0x08: eret
    0xf940_0086, // 0x0c: ldr x6, [x4]
];
/// `wfe_spin`
const WFE_SPIN: &[u32] = &[
    0xd503_205f, // 0x00: wfe
    0x17ff_ffff, // 0x04: b .-4
];

/// What the recording I/O handler saw.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ev {
    Read(u64, usize),
    Write(u64, Vec<u8>),
    SysRead(SysReg),
    SysWrite(SysReg, u64),
    Timer(bool),
}

/// A `VcpuIo` that records calls. Device reads return byte `i` of an access
/// at `gpa` as `0x80 | (gpa + i) & 0x7f` (top bit set to test sign
/// extension).
#[derive(Default)]
struct FakeIo {
    events: Vec<Ev>,
    irq: bool,
    irq_follows_vtimer: bool,
    icc_value: Option<u64>,
    fail_gpa: Option<u64>,
}

impl FakeIo {
    fn mmio(&self) -> Vec<Ev> {
        self.events
            .iter()
            .filter(|e| matches!(e, Ev::Read(..) | Ev::Write(..)))
            .cloned()
            .collect()
    }
}

fn fault(gpa: u64, len: usize) -> MmioFault {
    MmioFault {
        gpa,
        len,
        reason: "test",
    }
}

impl VcpuIo for FakeIo {
    fn mmio_read(
        &mut self,
        _vcpu: VcpuId,
        gpa: u64,
        data: &mut [u8],
    ) -> std::result::Result<(), MmioFault> {
        self.events.push(Ev::Read(gpa, data.len()));
        if self.fail_gpa == Some(gpa) {
            return Err(fault(gpa, data.len()));
        }
        for (i, b) in data.iter_mut().enumerate() {
            *b = 0x80 | (gpa as u8).wrapping_add(i as u8) & 0x7f;
        }
        Ok(())
    }

    fn mmio_write(
        &mut self,
        _vcpu: VcpuId,
        gpa: u64,
        data: &[u8],
    ) -> std::result::Result<(), MmioFault> {
        self.events.push(Ev::Write(gpa, data.to_vec()));
        if self.fail_gpa == Some(gpa) {
            return Err(fault(gpa, data.len()));
        }
        Ok(())
    }

    fn sysreg_read(&mut self, _vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        self.events.push(Ev::SysRead(reg));
        self.icc_value
    }

    fn sysreg_write(&mut self, _vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        self.events.push(Ev::SysWrite(reg, value));
        self.icc_value.is_some()
    }

    fn irq_line(&mut self, _vcpu: VcpuId) -> bool {
        self.irq
    }

    fn vtimer_level(&mut self, _vcpu: VcpuId, level: bool) {
        self.events.push(Ev::Timer(level));
        if self.irq_follows_vtimer {
            self.irq = level;
        }
    }
}

/// A one-vCPU VM with the vector table installed and `code` at `CODE`.
struct Guest {
    ram: Arc<GuestRam>,
    vm: EmuVm,
    cpu: EmuVcpu,
    io: FakeIo,
}

fn hvc(imm: u16) -> u32 {
    0xd400_0002 | (u32::from(imm) << 5)
}

fn write_words(ram: &GuestRam, gpa: u64, words: &[u32]) {
    for (i, w) in words.iter().enumerate() {
        ram.memory()
            .write_obj(*w, GuestAddress(gpa + 4 * i as u64))
            .unwrap();
    }
}

impl Guest {
    fn new(code: &[u32]) -> Self {
        Self::with_vcpus(code, 2)
    }

    fn with_vcpus(code: &[u32], vcpus: usize) -> Self {
        let ram = Arc::new(GuestRam::new_anonymous(RAM_SIZE).unwrap());
        let vectors: Vec<u32> = (0..16u16)
            .flat_map(|n| {
                let mut e = vec![0xd503_201f; 32]; // NOPs
                e[0] = hvc(0x100 + n);
                e
            })
            .collect();
        write_words(&ram, VBAR, &vectors);
        write_words(&ram, CODE, code);
        let vm = EmuHypervisor::new()
            .create_vm(ram.clone(), vcpus, GicMode::Userspace)
            .unwrap();
        let cpu = new_cpu(&vm, 0);
        Guest {
            ram,
            vm,
            cpu,
            io: FakeIo::default(),
        }
    }

    fn run(&mut self) -> VcpuExit {
        self.cpu.run(&mut self.io).unwrap()
    }

    fn x(&mut self, n: u8) -> u64 {
        self.cpu.reg(Reg::X(n)).unwrap()
    }

    fn set_x(&mut self, n: u8, v: u64) {
        self.cpu.set_reg(Reg::X(n), v).unwrap();
    }

    fn pc(&mut self) -> u64 {
        self.cpu.reg(Reg::Pc).unwrap()
    }

    fn sys(&mut self, r: SysReg) -> u64 {
        self.cpu.sysreg(r).unwrap()
    }

    fn read_u64(&self, gpa: u64) -> u64 {
        self.ram.memory().read_obj(GuestAddress(gpa)).unwrap()
    }

    fn write_u64(&self, gpa: u64, v: u64) {
        self.ram.memory().write_obj(v, GuestAddress(gpa)).unwrap();
    }
}

fn new_cpu(vm: &EmuVm, id: usize) -> EmuVcpu {
    let mut cpu = vm.create_vcpu(id, id as u64).unwrap();
    cpu.set_reg(Reg::Pc, CODE).unwrap();
    cpu.set_sysreg(sr::VBAR_EL1, VBAR).unwrap();
    cpu
}

#[test]
fn vm_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<EmuVm>();
    check::<EmuHypervisor>();
}

#[test]
fn the_translation_buffer_has_the_vmms_size() {
    let mut g = Guest::new(COUNTERS);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    let mut size = 0u32;
    // SAFETY: the engine is live and on this thread; the read control
    // writes one uint32_t through the pointer.
    let e = unsafe {
        unicorn_engine::uc_ctl(
            g.cpu.engine.get_handle(),
            unicorn_engine::ControlType(
                unicorn_engine::ControlType::TCG_BUFFER_SIZE.0
                    | unicorn_engine::ControlType::IO_READ.0,
            ),
            &raw mut size,
        )
    };
    assert_eq!(e, unicorn_engine::uc_error::OK);
    assert_eq!(size, super::vcpu::TCG_BUFFER_BYTES, "not unicorn's 1 GiB");
}

#[test]
fn entry_state_is_el1h_masked_with_mmu_off() {
    let mut g = Guest::new(COUNTERS);
    assert_eq!(g.cpu.reg(Reg::Pstate).unwrap(), 0x3c5);
    assert_eq!(g.sys(sr::SCTLR_EL1) & 1, 0);
    g.vm.set_counter_offset(1000);
    let before = g.vm.physical_count();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    let after = g.vm.physical_count();
    assert_eq!(g.x(0), 24_000_000);
    assert_eq!(g.vm.counter_frequency(), 24_000_000);
    let vcnt = g.x(1);
    assert!(
        vcnt >= before - 1000 && vcnt <= after - 1000,
        "{before} {vcnt} {after}"
    );
    assert_eq!(g.x(2), 0x8000_0000, "MPIDR_EL1 with RES1 bit 31");
    assert_eq!((g.x(3) >> 20) & 0xf, 1, "TGran16 advertised");
    assert_eq!(g.sys(sr::MPIDR_EL1), 0x8000_0000);
}

#[test]
fn id_registers_are_the_shared_table_and_the_pmu_is_absent() {
    let mut g = Guest::new(ID_REGS);
    g.set_x(9, u64::MAX);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    for (n, (reg, value)) in crate::arch::idregs::ADVERTISED.iter().enumerate() {
        assert_eq!(g.x(n as u8), *value, "{reg:?} as the guest reads it");
        assert_eq!(g.sys(*reg), *value, "{reg:?} as the VMM reads it");
    }
    // PMCR_EL0, PMCEID0_EL0, PMCCNTR_EL0, PMEVCNTR0_EL0: RAZ/WI.
    for n in 10..=13 {
        assert_eq!(g.x(n), 0, "x{n}");
    }
}

#[test]
fn mmio_fast_path_sizes_and_sign_extension() {
    let mut g = Guest::new(MMIO_SIZES);
    let b = VIRTIO_MMIO_BASE;
    g.set_x(1, b);
    g.set_x(2, 0x1122_3344_5566_7788);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 1 });
    // Unicorn's MMIO regions split 8-byte accesses into two 4-byte ones.
    assert_eq!(
        g.io.mmio(),
        vec![
            Ev::Write(b, vec![0x88]),
            Ev::Write(b + 2, vec![0x88, 0x77]),
            Ev::Write(b + 4, vec![0x88, 0x77, 0x66, 0x55]),
            Ev::Write(b + 8, vec![0x88, 0x77, 0x66, 0x55]),
            Ev::Write(b + 12, vec![0x44, 0x33, 0x22, 0x11]),
            Ev::Read(b + 0x10, 1),
            Ev::Read(b + 0x12, 2),
            Ev::Read(b + 0x14, 4),
            Ev::Read(b + 0x18, 4),
            Ev::Read(b + 0x1c, 4),
            Ev::Read(b + 0x20, 1),
            Ev::Read(b + 0x22, 2),
        ]
    );
    assert_eq!(g.x(3), 0x90);
    assert_eq!(g.x(4), 0x9392);
    assert_eq!(g.x(5), 0x9796_9594);
    assert_eq!(g.x(6), 0x9f9e_9d9c_9b9a_9998);
    assert_eq!(g.x(7), 0xffff_ffff_ffff_ffa0, "LDRSB X sign-extends");
    assert_eq!(
        g.x(8),
        0x0000_0000_ffff_a3a2,
        "LDRSH W sign-extends to 32 bits"
    );
    assert_eq!(g.pc(), CODE + 0x2c);
}

#[test]
fn mmio_trapped_gic_region_has_exact_sizes() {
    let mut g = Guest::new(MMIO_SIZES);
    let b = GICD_BASE;
    g.set_x(1, b);
    g.set_x(2, 0x1122_3344_5566_7788);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 1 });
    assert_eq!(
        g.io.mmio(),
        vec![
            Ev::Write(b, vec![0x88]),
            Ev::Write(b + 2, vec![0x88, 0x77]),
            Ev::Write(b + 4, vec![0x88, 0x77, 0x66, 0x55]),
            Ev::Write(b + 8, 0x1122_3344_5566_7788u64.to_le_bytes().to_vec()),
            Ev::Read(b + 0x10, 1),
            Ev::Read(b + 0x12, 2),
            Ev::Read(b + 0x14, 4),
            Ev::Read(b + 0x18, 8),
            Ev::Read(b + 0x20, 1),
            Ev::Read(b + 0x22, 2),
        ]
    );
    assert_eq!(g.x(3), 0x90);
    assert_eq!(g.x(4), 0x9392);
    assert_eq!(g.x(5), 0x9796_9594);
    assert_eq!(g.x(6), 0x9f9e_9d9c_9b9a_9998);
    assert_eq!(g.x(7), 0xffff_ffff_ffff_ffa0);
    assert_eq!(g.x(8), 0x0000_0000_ffff_a3a2);
}

#[test]
fn mmio_trapped_addressing_modes_complete_the_instruction() {
    let mut g = Guest::new(MMIO_ADDRESSING);
    let b = GICD_BASE + 0x100;
    g.set_x(1, b);
    g.set_x(2, 0xdead_beef);
    g.set_x(12, 0x40);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 2 });
    assert_eq!(
        g.io.mmio(),
        vec![
            Ev::Read(b + 4, 4),
            Ev::Write(b + 4, vec![0xef, 0xbe, 0xad, 0xde]),
            Ev::Read(b + 0x2c, 4),
            Ev::Read(b + 0x30, 4),
            Ev::Write(b + 0x4c, vec![0; 8]),
        ]
    );
    assert_eq!(g.x(9), 0x8786_8584);
    assert_eq!(g.x(10), 0xafae_adac);
    assert_eq!(g.x(11), 0xb3b2_b1b0);
    assert_eq!(g.x(1), b + 0xc, "pre- and post-index write-back");
}

#[test]
fn mmio_errors_abort_when_trapped_and_read_as_zero_otherwise() {
    // Trapped region: synchronous external abort at the exact address.
    let mut g = Guest::new(LOAD_X1);
    g.io.fail_gpa = Some(GICD_BASE + 0x40);
    g.set_x(1, GICD_BASE + 0x40);
    g.set_x(0, 0x55);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.sys(sr::ESR_EL1), 0x9600_0010);
    assert_eq!(g.sys(sr::FAR_EL1), GICD_BASE + 0x40);
    assert_eq!(g.sys(sr::ELR_EL1), CODE);
    assert_eq!(g.x(0), 0x55, "the load did not complete");
    // Fast-path region: read as zero.
    let mut g = Guest::new(LOAD_X1);
    g.io.fail_gpa = Some(VIRTIO_MMIO_BASE + 0x40);
    g.set_x(1, VIRTIO_MMIO_BASE + 0x40);
    g.set_x(0, 0x55);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 9 });
    // The 8-byte load reached the device as two 4-byte reads; the failing
    // one read as zero.
    assert_eq!(g.x(0), 0xc7c6_c5c4_0000_0000);
}

#[test]
fn access_to_unbacked_physical_address_is_a_data_abort() {
    let mut g = Guest::new(LOAD_X1);
    g.set_x(1, 0x1000_0013);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    // EC 0x25, IL, DFSC 0x10 (synchronous external abort), precise FAR.
    assert_eq!(g.sys(sr::ESR_EL1), 0x9600_0010);
    assert_eq!(g.sys(sr::FAR_EL1), 0x1000_0013);
    assert_eq!(g.sys(sr::ELR_EL1), CODE);
    assert_eq!(g.sys(sr::SPSR_EL1), 0x3c5);
    assert_eq!(g.cpu.reg(Reg::Pstate).unwrap(), 0x3c5);
}

#[test]
fn hvc_and_smc_exit_with_pc_past_the_instruction() {
    let mut g = Guest::new(HVC_SMC);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 5 });
    assert_eq!(g.pc(), CODE + 4);
    assert_eq!(g.run(), VcpuExit::Smc { imm: 0x77 });
    assert_eq!(g.pc(), CODE + 8);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 6 });
    assert_eq!(g.pc(), CODE + 12);
}

#[test]
fn wfi_exits_and_resumes_after_it() {
    let mut g = Guest::new(WFI);
    assert_eq!(g.run(), VcpuExit::Wfi);
    assert_eq!(g.pc(), CODE + 4);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 2 });
}

#[test]
fn a_wfe_loop_returns_wfe() {
    let mut g = Guest::new(WFE_SPIN);
    // Fail rather than hang if the loop is not detected.
    let k = g.cpu.kicker();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(5));
        k.kick();
    });
    assert_eq!(g.run(), VcpuExit::Wfe);
    let pc = g.pc();
    assert!(pc == CODE || pc == CODE + 4, "{pc:#x}");
}

#[test]
fn icc_registers_reach_the_io() {
    let mut g = Guest::new(ICC);
    g.io.icc_value = Some(27);
    g.set_x(1, 0xf0);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    let sys: Vec<_> =
        g.io.events
            .iter()
            .filter(|e| matches!(e, Ev::SysRead(_) | Ev::SysWrite(..)))
            .cloned()
            .collect();
    assert_eq!(
        sys,
        vec![
            Ev::SysWrite(sr::ICC_PMR_EL1, 0xf0),
            Ev::SysRead(sr::ICC_IAR1_EL1),
            Ev::SysWrite(sr::ICC_EOIR1_EL1, 27),
        ]
    );
    assert_eq!(g.x(2), 27);
}

#[test]
fn unknown_and_refused_system_registers_are_undefined() {
    let mut g = Guest::new(UNDEF_SYSREG);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.sys(sr::ESR_EL1), 0x0200_0000);
    assert_eq!(g.sys(sr::ELR_EL1), CODE);
    let mut g = Guest::new(ICC_REFUSED);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.sys(sr::ESR_EL1), 0x0200_0000);
    assert_eq!(g.sys(sr::ELR_EL1), CODE);
    assert!(g.io.events.contains(&Ev::SysRead(sr::ICC_HPPIR1_EL1)));
}

#[test]
fn kick_from_another_thread_stops_a_spinning_guest() {
    let mut g = Guest::new(SPIN);
    let k = g.cpu.kicker();
    k.kick();
    assert_eq!(
        g.run(),
        VcpuExit::Kicked,
        "a kick before run returns at once"
    );
    assert_eq!(g.pc(), CODE);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        k.kick();
    });
    let start = Instant::now();
    assert_eq!(g.run(), VcpuExit::Kicked);
    assert!(start.elapsed() >= Duration::from_millis(40));
    t.join().unwrap();
    let pc = g.pc();
    assert!(
        pc == CODE || pc == CODE + 4,
        "stopped at a block boundary: {pc:#x}"
    );
}

/// Page tables for a 16 KiB granule, T0SZ = 28 (36-bit VA, walk starts at
/// level 2): RAM identity-mapped by a 32 MiB level-2 block; VA 0x1_0000_0000
/// -> PA 0x4020_0000 through a level-3 table; VA 0x1_0000_4000 unmapped.
struct Tables {
    ttbr0: u64,
    tcr: u64,
    l3: u64,
}

const AF: u64 = 1 << 10;
const SH_INNER: u64 = 3 << 8;
const DATA_PA: u64 = RAM_BASE + 0x20_0000;
const DATA_VA: u64 = 0x1_0000_0000;

fn build_tables(g: &Guest) -> Tables {
    let l2 = RAM_BASE + 0x10_0000;
    let l3 = RAM_BASE + 0x10_4000;
    g.write_u64(l2 + 8 * (RAM_BASE >> 25), RAM_BASE | AF | SH_INNER | 1);
    g.write_u64(l2 + 8 * ((DATA_VA >> 25) & 0x7ff), l3 | 3);
    g.write_u64(l3, DATA_PA | AF | SH_INNER | 3);
    let tcr = 28 | (1 << 8) | (1 << 10) | (3 << 12) | (2 << 14) | (1 << 23) | (1 << 30) | (2 << 32);
    Tables { ttbr0: l2, tcr, l3 }
}

#[test]
fn mmu_16k_translation_and_data_abort() {
    let mut g = Guest::new(MMU16K);
    let t = build_tables(&g);
    g.write_u64(DATA_PA + 8, 0x1122_3344_5566_7788);
    let sctlr = g.sys(sr::SCTLR_EL1);
    g.set_x(0, t.ttbr0);
    g.set_x(1, t.tcr);
    g.set_x(2, 0xff);
    g.set_x(3, sctlr | 1);
    g.set_x(4, DATA_VA + 8);
    g.set_x(5, DATA_VA + 0x4010);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.x(6), 0x1122_3344_5566_7788);
    // AT S1E1R: attributes 0xff, PA, bit 11, NS, inner shareable.
    assert_eq!(g.x(8), 0xff00_0000_4020_0b80);
    // AT fault: F, translation fault level 3.
    assert_eq!(g.x(9), 0x80f);
    // Data abort, same EL, translation fault level 3, read.
    assert_eq!(g.sys(sr::ESR_EL1), 0x9600_0007);
    assert_eq!(g.sys(sr::FAR_EL1), DATA_VA + 0x4010);
    assert_eq!(g.sys(sr::ELR_EL1), CODE + 0x2c);
}

/// Turns the MMU on with `t` from the host side.
fn enable_mmu(g: &mut Guest, t: &Tables) {
    g.cpu.set_sysreg(sr::MAIR_EL1, 0xff).unwrap();
    g.cpu.set_sysreg(sr::TCR_EL1, t.tcr).unwrap();
    g.cpu.set_sysreg(sr::TTBR0_EL1, t.ttbr0).unwrap();
    let sctlr = g.sys(sr::SCTLR_EL1);
    g.cpu.set_sysreg(sr::SCTLR_EL1, sctlr | 1).unwrap();
}

#[test]
fn el0_permission_fault_goes_to_the_lower_el_vector() {
    let mut g = Guest::new(EL0_LOAD);
    let t = build_tables(&g);
    enable_mmu(&mut g, &t);
    // EL0 runs from the identity block (AP = 00 is still EL0-executable)
    // and loads from an EL1-only page.
    g.set_x(0, CODE + 0xc);
    g.set_x(4, DATA_VA + 0x18);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL0 });
    // EC 0x24 (lower EL), permission fault level 3.
    assert_eq!(g.sys(sr::ESR_EL1), 0x9200_000f);
    assert_eq!(g.sys(sr::FAR_EL1), DATA_VA + 0x18);
    assert_eq!(g.sys(sr::ELR_EL1), CODE + 0xc);
}

#[test]
fn access_flag_fault_is_delivered() {
    let mut g = Guest::new(LOAD_X1);
    let t = build_tables(&g);
    g.write_u64(t.l3 + 8, (DATA_PA + 0x4000) | SH_INNER | 3); // AF = 0
    enable_mmu(&mut g, &t);
    g.set_x(1, DATA_VA + 0x4000);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.sys(sr::ESR_EL1), 0x9600_000b);
    assert_eq!(g.sys(sr::FAR_EL1), DATA_VA + 0x4000);
}

#[test]
fn tlbi_of_a_16k_page_flushes_all_its_4k_subpages() {
    let mut g = Guest::new(TLBI);
    let t = build_tables(&g);
    g.write_u64(DATA_PA + 0x3008, 0xaaaa);
    g.write_u64(DATA_PA + 0x7008, 0xbbbb);
    enable_mmu(&mut g, &t);
    // Remap the 16 KiB page to the next one and invalidate by its base VA
    // while the TLB holds its last 4 KiB sub-page.
    g.set_x(1, (DATA_PA + 0x4000) | AF | SH_INNER | 3);
    g.set_x(2, t.l3);
    g.set_x(3, DATA_VA >> 12);
    g.set_x(4, DATA_VA + 0x3008);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 3 });
    assert_eq!(g.x(6), 0xaaaa);
    assert_eq!(g.x(7), 0xbbbb);
}

#[test]
fn a_kick_ends_a_stores_wait_for_a_page_a_background_snapshot_is_saving() {
    use crate::memory::{HeldWriter, PageSave, Slots};
    use std::os::unix::fs::FileExt;
    use std::sync::{mpsc, Mutex};
    let mut g = Guest::new(DIRTY);
    let a = RAM_BASE + 5 * PAGE_SIZE;
    let b = RAM_BASE + 7 * PAGE_SIZE + 0x100;
    g.write_u64(b, 41);
    g.vm.rearm_dirty_tracking().unwrap();
    let file = tempfile::tempfile().unwrap();
    file.set_len(RAM_SIZE).unwrap();
    let ram = g.ram.clone();
    let save = PageSave::start(&ram, vec![7], file.try_clone().unwrap(), Slots::Image).unwrap();
    save.protect();
    // The writer is held inside its write of page 7 until released; the
    // vCPU is kicked once it waits for that write.
    let HeldWriter { writing, release } = save.hold_writer_at(0);
    let (waits, waiting) = mpsc::channel::<()>();
    let waits = Mutex::new(Some(waits));
    save.hooks
        .guest_waits
        .set(Box::new(move |_| {
            if let Some(t) = waits.lock().unwrap().take() {
                let _ = t.send(());
            }
        }))
        .ok()
        .unwrap();
    g.set_x(1, a);
    g.set_x(2, b);
    let kick = g.cpu.kicker();
    std::thread::scope(|s| {
        let writer = s.spawn(|| save.run());
        writing.recv().unwrap();
        let (ran, run_returned) = mpsc::channel::<()>();
        let watchdog = release.clone();
        s.spawn(move || {
            waiting.recv().unwrap();
            kick.kick();
            // Were the wait not ended by the kick, `run` would return only
            // once the writer is released: release it after a while so the
            // test then fails instead of hanging.
            if run_returned.recv_timeout(Duration::from_secs(60)).is_err() {
                let _ = watchdog.send(());
            }
        });
        let exit = g.run();
        let _ = ran.send(());
        assert_eq!(exit, VcpuExit::Kicked);
        assert_eq!(g.read_u64(b), 41, "the store did not happen");
        assert!(g.vm.dirty_pages().unwrap().is_empty());
        release.send(()).unwrap();
        writer.join().unwrap().unwrap();
    });
    // The store runs again, once, on the saved page.
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(g.read_u64(b), 42);
    assert_eq!(g.read_u64(b + 8), 42);
    assert_eq!(g.x(2), b + 8);
    assert_eq!(g.vm.dirty_pages().unwrap(), vec![7]);
    let mut saved = [0u8; 8];
    file.read_exact_at(&mut saved, 7 * PAGE_SIZE + 0x100)
        .unwrap();
    assert_eq!(
        u64::from_le_bytes(saved),
        41,
        "the page was saved as it was before"
    );
}

#[test]
fn write_protection_marks_exactly_the_written_page() {
    let mut g = Guest::new(DIRTY);
    let a = RAM_BASE + 5 * PAGE_SIZE;
    let b = RAM_BASE + 7 * PAGE_SIZE + 0x100;
    g.write_u64(b, 41);
    g.vm.rearm_dirty_tracking().unwrap();
    assert!(g.vm.dirty_pages().unwrap().is_empty());
    g.set_x(1, a);
    g.set_x(2, b);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(g.vm.dirty_pages().unwrap(), vec![7]);
    // Peeking does not clear (a failed snapshot loses nothing).
    assert_eq!(g.vm.dirty_pages().unwrap(), vec![7]);
    assert_eq!(g.read_u64(b), 42);
    assert_eq!(g.read_u64(b + 8), 42);
    assert_eq!(g.x(2), b + 8, "the faulting post-index store ran once");
    // Re-armed: a read of the page does not dirty it.
    g.vm.rearm_dirty_tracking().unwrap();
    write_words(&g.ram, CODE + 0x100, READ_ONLY);
    g.cpu.set_reg(Reg::Pc, CODE + 0x100).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 1 });
    assert_eq!(g.x(5), 42);
    assert!(g.vm.dirty_pages().unwrap().is_empty());
    // Unprotected: stores are not tracked.
    g.vm.protect(RAM_BASE, RAM_SIZE, Prot::ReadWriteExec)
        .unwrap();
    g.set_x(2, b);
    g.cpu.set_reg(Reg::Pc, CODE).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(g.read_u64(b), 43);
    assert!(g.vm.dirty_pages().unwrap().is_empty());
    // Bad ranges are refused.
    assert!(g
        .vm
        .protect(RAM_BASE + 4096, PAGE_SIZE, Prot::ReadExec)
        .is_err());
    assert!(g
        .vm
        .protect(RAM_BASE, RAM_SIZE + PAGE_SIZE, Prot::ReadExec)
        .is_err());
}

fn vtimer_fires(delay_ticks: u64) -> Duration {
    vtimer_fires_at(delay_ticks, 0)
}

/// Runs `VTIMER` with the VM's counter offset `offset`; a watchdog kicks
/// the vCPU after 60 s, so a timer that never fires fails the test rather
/// than hanging it.
fn vtimer_fires_at(delay_ticks: u64, offset: u64) -> Duration {
    let mut g = Guest::new(VTIMER);
    g.vm.set_counter_offset(offset);
    g.io.irq_follows_vtimer = true;
    g.set_x(1, delay_ticks);
    let kick = g.cpu.kicker();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        kick.kick();
    });
    let start = Instant::now();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: IRQ_EL1H });
    let elapsed = start.elapsed();
    assert!(g.io.events.contains(&Ev::Timer(true)));
    assert_eq!(g.sys(sr::CNTV_CTL_EL0), 0b101, "ENABLE | ISTATUS");
    let cval = g.sys(sr::CNTV_CVAL_EL0);
    assert!(g.sys(sr::CNTVCT_EL0) >= cval);
    elapsed
}

#[test]
fn vtimer_in_the_past_raises_the_line_at_once() {
    vtimer_fires(0);
}

#[test]
fn vtimer_in_the_future_wakes_the_running_guest() {
    // 5 ms at 24 MHz.
    let elapsed = vtimer_fires(120_000);
    assert!(elapsed >= Duration::from_millis(5), "{elapsed:?}");
}

#[test]
fn vtimer_fires_with_a_restored_offset() {
    // A restored VM's count is ahead of the new VM's physical count, so its
    // offset wraps: the deadline must still be armed (it was not, when it
    // was computed as CVAL + offset without wrapping).
    let elapsed = vtimer_fires_at(120_000, 0u64.wrapping_sub(50_000_000_000));
    assert!(elapsed >= Duration::from_millis(5), "{elapsed:?}");
}

#[test]
fn the_physical_count_is_the_virtual_count() {
    let mut g = Guest::new(COUNTS);
    // A restored VM's offset: the count is far ahead of the physical count.
    let ahead = 5_000_000_000;
    g.vm.set_counter_offset(g.vm.physical_count().wrapping_sub(ahead));
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    let (v0, p, v1) = (g.x(0), g.x(1), g.x(2));
    assert!(v0 >= ahead && v0 <= p && p <= v1, "{v0} {p} {v1}");
    let v = g.sys(sr::CNTVCT_EL0);
    assert!(g.sys(sr::CNTPCT_EL0) >= v);
    assert_eq!(g.sys(sr::CNTVOFF_EL2), g.vm.counter_offset());
    assert!(
        g.cpu.set_sysreg(sr::CNTVOFF_EL2, 0).is_err(),
        "the VM's, not a vCPU's"
    );
}

#[test]
fn physical_timer_registers_go_to_the_vmm() {
    let mut g = Guest::new(PTIMER);
    g.io.icc_value = Some(0x55);
    g.set_x(2, 0x1234);
    g.set_x(3, 0xfff);
    g.set_x(4, 1);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    use sr::{CNTP_CTL_EL0, CNTP_CVAL_EL0, CNTP_TVAL_EL0};
    let accesses: Vec<Ev> =
        g.io.events
            .iter()
            .filter(|e| matches!(e, Ev::SysRead(_) | Ev::SysWrite(..)))
            .cloned()
            .collect();
    assert_eq!(
        accesses,
        [
            Ev::SysRead(CNTP_CTL_EL0),
            Ev::SysWrite(CNTP_CVAL_EL0, 0x1234),
            Ev::SysWrite(CNTP_TVAL_EL0, 0xfff),
            Ev::SysWrite(CNTP_CTL_EL0, 1),
            Ev::SysRead(CNTP_TVAL_EL0),
            Ev::SysRead(CNTP_CVAL_EL0),
        ]
    );
    assert_eq!((g.x(1), g.x(5), g.x(6)), (0x55, 0x55, 0x55));
    assert_eq!(g.pc(), CODE + 0x1c);
    // They are not the backend's registers.
    assert!(g.cpu.sysreg(CNTP_CTL_EL0).is_err());
    assert!(g.cpu.set_sysreg(CNTP_CVAL_EL0, 0).is_err());
}

#[test]
fn svc_from_el0_banks_the_stack_pointers() {
    let mut g = Guest::new(EL0_SVC);
    g.cpu.set_sysreg(sr::SP_EL0, RAM_BASE + 0x2_0000).unwrap();
    g.cpu.set_sysreg(sr::SP_EL1, RAM_BASE + 0x3_0000).unwrap();
    g.set_x(0, CODE + 0xc);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL0 });
    assert_eq!(g.sys(sr::ESR_EL1), 0x5600_0007);
    assert_eq!(g.sys(sr::ELR_EL1), CODE + 0x10);
    assert_eq!(g.sys(sr::SPSR_EL1), 0);
    assert_eq!(g.cpu.reg(Reg::Pstate).unwrap() & 0xf, 0b0101);
    assert_eq!(g.sys(sr::SP_EL0), RAM_BASE + 0x2_0000);
    assert_eq!(g.sys(sr::SP_EL1), RAM_BASE + 0x3_0000);
}

#[test]
fn brk_is_delivered_with_its_immediate() {
    let mut g = Guest::new(BRK);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.sys(sr::ESR_EL1), 0xf200_0800);
    assert_eq!(g.sys(sr::ELR_EL1), CODE);
}

#[test]
fn code_patched_by_another_vcpu_is_retranslated() {
    let mut g = Guest::new(PATCH);
    let f = RAM_BASE + 0x8000;
    write_words(&g.ram, f, MOV1);
    let mut other = new_cpu(&g.vm, 1);
    other.set_reg(Reg::Pc, f).unwrap();
    assert_eq!(other.run(&mut g.io).unwrap(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(other.reg(Reg::X(0)).unwrap(), 1);
    // vCPU 0 rewrites `mov x0, #1` into `mov x0, #2` and does IC IVAU.
    g.set_x(1, 0xd280_0040);
    g.set_x(2, f);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 1 });
    other.set_reg(Reg::Pc, f).unwrap();
    assert_eq!(other.run(&mut g.io).unwrap(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(other.reg(Reg::X(0)).unwrap(), 2);
}

#[test]
fn code_patched_through_its_own_mapping_is_retranslated_after_ic_ivau() {
    // The code runs at a virtual address outside RAM's physical window,
    // where unicorn's own self-modifying-code detection is off (see setup).
    let mut g = Guest::new(SELF_MODIFY);
    let t = build_tables(&g);
    write_words(&g.ram, DATA_PA, CALLEE);
    enable_mmu(&mut g, &t);
    g.set_x(1, 0xd280_0040); // mov x0, #2
    g.set_x(4, DATA_VA);
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 4 });
    assert_eq!(g.x(5), 1);
    assert_eq!(g.x(6), 2);
}

#[test]
fn vcpu_ids_and_mpidrs() {
    let g = Guest::new(SPIN);
    assert!(g.vm.create_vcpu(0, 0).is_err(), "vCPU 0 exists");
    assert!(g.vm.create_vcpu(2, 2).is_err(), "only 2 vCPUs");
    let mut c1 = g.vm.create_vcpu(1, 0x101).unwrap();
    assert_eq!(c1.id(), 1);
    assert_eq!(c1.sysreg(sr::MPIDR_EL1).unwrap(), 0x8000_0101);
    drop(c1);
    assert!(g.vm.create_vcpu(1, 1).is_ok(), "re-created after drop");
}

#[test]
fn system_registers_round_trip() {
    let mut g = Guest::new(SPIN);
    let regs = [
        (sr::SCTLR_EL1, 0x30d0_0800),
        (sr::TCR_EL1, 0x0000_0002_b5b5_b511),
        (sr::TTBR0_EL1, 0x0001_0000_4010_0000),
        (sr::TTBR1_EL1, 0x4011_0000),
        (sr::MAIR_EL1, 0x0400_ff44),
        (sr::AMAIR_EL1, 0),
        (sr::VBAR_EL1, 0xffff_8000_1001_0800),
        (sr::ESR_EL1, 0x9600_0047),
        (sr::FAR_EL1, 0x1234_5678),
        (sr::ELR_EL1, 0xffff_8000_1000_1234),
        (sr::SPSR_EL1, 0x6000_03c5),
        (sr::SP_EL0, 0x4000_8000),
        (sr::SP_EL1, 0x4000_9000),
        (sr::TPIDR_EL0, 0x11),
        (sr::TPIDR_EL1, 0x22),
        (sr::TPIDRRO_EL0, 0x33),
        (sr::CONTEXTIDR_EL1, 0x44),
        (sr::CPACR_EL1, 0x30_0000),
        (sr::CNTKCTL_EL1, 0x2),
        (sr::PAR_EL1, 0x800),
        (sr::AFSR0_EL1, 0),
        (sr::AFSR1_EL1, 0),
        (sr::MDSCR_EL1, 0x1000),
        (sr::CSSELR_EL1, 2),
        (sr::FPCR, 0x0300_0000),
        (sr::FPSR, 0x0800_0000),
        (sr::CNTV_CTL_EL0, 0b11),
        (sr::CNTV_CVAL_EL0, 0x1234_5678_9abc),
    ];
    for (r, v) in regs {
        g.cpu.set_sysreg(r, v).unwrap();
    }
    for (r, v) in regs {
        assert_eq!(g.sys(r), v, "{r:?}");
    }
    g.cpu
        .set_vreg(31, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210)
        .unwrap();
    assert_eq!(
        g.cpu.vreg(31).unwrap(),
        0x0123_4567_89ab_cdef_fedc_ba98_7654_3210
    );
    assert!(g.cpu.vreg(32).is_err());
    assert!(g.cpu.reg(Reg::X(31)).is_err());
    assert!(g.cpu.sysreg(sr::ICC_PMR_EL1).is_err());
    assert!(g.cpu.sysreg(SysReg::new(3, 2, 15, 15, 7)).is_err());
    assert_eq!(g.vm.counter_offset(), 0);
    g.vm.set_counter_offset(77);
    assert_eq!(g.vm.counter_offset(), 77);
    assert_eq!(g.sys(sr::CNTVOFF_EL2), 77);
}

#[test]
fn pstate_writes_bank_the_stack_pointer() {
    let mut g = Guest::new(SPIN);
    g.cpu.set_sysreg(sr::SP_EL0, 0x100).unwrap();
    g.cpu.set_sysreg(sr::SP_EL1, 0x200).unwrap();
    g.cpu.set_reg(Reg::Pstate, 0x3c4).unwrap(); // EL1t
    assert_eq!(g.sys(sr::SP_EL0), 0x100);
    assert_eq!(g.sys(sr::SP_EL1), 0x200);
    g.cpu.set_reg(Reg::Pstate, 0x3c5).unwrap();
    assert_eq!(g.sys(sr::SP_EL0), 0x100);
    assert_eq!(g.sys(sr::SP_EL1), 0x200);
}

/// Guest speed on a compute loop (`cargo test --release -- --ignored`).
#[test]
#[ignore]
fn bench_compute_loop_mips() {
    let mut g = Guest::with_vcpus(COUNT, 1);
    let iters = 50_000_000u64;
    g.set_x(0, iters);
    let start = Instant::now();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    let s = start.elapsed().as_secs_f64();
    eprintln!(
        "{} instructions in {s:.3} s: {:.0} MIPS",
        4 * iters,
        4.0 * iters as f64 / s / 1e6
    );
}

/// A hand-made snapshot can hold any register values, and a guest can
/// execute anything: vCPUs with random system registers (the snapshot set),
/// PSTATE at EL0 or EL1, PC anywhere, over RAM full of random instructions,
/// must only ever exit (or be kicked), never crash or hang the host.
#[test]
fn random_register_state_and_code_never_crash_the_host() {
    let mut seed = 0x0123_4567_89ab_cdefu64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let g = Guest::new(SPIN);
    let words: Vec<u32> = (0..RAM_SIZE / 4).map(|_| next() as u32).collect();
    write_words(&g.ram, RAM_BASE, &words);
    for _ in 0..40 {
        // vCPU 1 (the guest's own is 0), created afresh each round.
        let mut cpu = g.vm.create_vcpu(1, 1).unwrap();
        for &r in cpu.state_sysregs() {
            let v = match next() % 4 {
                0 => 0,
                1 => next() & 0xffff_ffff,
                _ => next(),
            };
            let _ = cpu.set_sysreg(r, v);
        }
        for n in 0..31 {
            cpu.set_reg(Reg::X(n), next()).unwrap();
        }
        // EL0t, EL1t or EL1h, any NZCV and DAIF.
        let mode = [0b0000u64, 0b0100, 0b0101][(next() % 3) as usize];
        cpu.set_reg(Reg::Pstate, (next() & 0xf000_03c0) | mode)
            .unwrap();
        let pc = if next() % 4 == 0 {
            next()
        } else {
            RAM_BASE + ((next() % RAM_SIZE) & !3)
        };
        cpu.set_reg(Reg::Pc, pc).unwrap();
        let mut io = FakeIo::default();
        let k = cpu.kicker();
        let stop = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            k.kick();
        });
        for _ in 0..50 {
            match cpu.run(&mut io) {
                Ok(VcpuExit::Kicked) | Ok(VcpuExit::Unhandled { .. }) | Err(_) => break,
                Ok(_) => {}
            }
        }
        stop.join().unwrap();
        // The engine is still consistent: its state reads back.
        cpu.reg(Reg::Pc).unwrap();
        cpu.reg(Reg::Pstate).unwrap();
    }
}

/// `breakpoint`
const BREAKPOINT: &[u32] = &[
    0xd503_201f, // 0x00: nop
    0xd503_201f, // 0x04: nop (the breakpoint)
    0xd400_0002, // 0x08: hvc #0
];

/// The VMM writes the breakpoint registers (as a restore does): they must
/// reach unicorn's breakpoint list (quirk 16), and a hit must arrive as a
/// Breakpoint exception, not an instruction abort.
#[test]
fn breakpoints_the_vmm_writes_fire_as_breakpoint_exceptions() {
    use crate::arch::debug::{MDSCR_KDE, MDSCR_MDE};
    let mut g = Guest::new(BREAKPOINT);
    g.cpu.set_sysreg(sr::OSLSR_EL1, 0b1000).unwrap();
    g.cpu
        .set_sysreg(sr::MDSCR_EL1, MDSCR_MDE | MDSCR_KDE)
        .unwrap();
    g.cpu.set_sysreg(sr::DBGBVR0_EL1, CODE + 4).unwrap();
    g.cpu
        .set_sysreg(sr::DBGBCR0_EL1, 1 | 0b11 << 1 | 0xf << 5)
        .unwrap();
    assert_eq!(g.sys(sr::DBGBVR0_EL1), CODE + 4);
    assert_eq!(g.pc(), CODE, "the write put PC back");
    // EL1h, PSTATE.D clear (A, I, F masked).
    g.cpu.set_reg(Reg::Pstate, 0x1c5).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(
        g.sys(sr::ESR_EL1) >> 26,
        0x31,
        "ESR {:#x}",
        g.sys(sr::ESR_EL1)
    );
    assert_eq!(g.sys(sr::ELR_EL1), CODE + 4);
    // Disabled again: the program runs to its end.
    g.cpu.set_sysreg(sr::DBGBCR0_EL1, 0).unwrap();
    g.cpu.set_reg(Reg::Pc, CODE).unwrap();
    g.cpu.set_reg(Reg::Pstate, 0x1c5).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(g.pc(), CODE + 12);
}

/// `watchpoint`
const WATCHPOINT: &[u32] = &[
    0xf900_0422, // 0x00: str x2, [x1, #8] (the watched page, not the watched bytes)
    0xf900_0022, // 0x04: str x2, [x1] (the watched doubleword)
    0xd400_0002, // 0x08: hvc #0
];

/// Watchpoints (quirk 16): a store to the watched bytes is a Watchpoint
/// exception before it is made, a store elsewhere on the page is made.
#[test]
fn watchpoints_fire_on_the_watched_bytes_only() {
    use crate::arch::debug::{MDSCR_KDE, MDSCR_MDE};
    let mut g = Guest::new(WATCHPOINT);
    let watched = RAM_BASE + 0x20_0000;
    g.write_u64(watched, 7);
    g.set_x(1, watched);
    g.set_x(2, 0x5a);
    g.cpu.set_sysreg(sr::OSLSR_EL1, 0b1000).unwrap();
    g.cpu
        .set_sysreg(sr::MDSCR_EL1, MDSCR_MDE | MDSCR_KDE)
        .unwrap();
    g.cpu.set_sysreg(sr::DBGWVR0_EL1, watched).unwrap();
    // E, PAC = EL0 and EL1, LSC = stores, BAS = 8 bytes.
    g.cpu
        .set_sysreg(sr::DBGWCR0_EL1, 1 | 0b11 << 1 | 0b10 << 3 | 0xff << 5)
        .unwrap();
    g.cpu.set_reg(Reg::Pstate, 0x1c5).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    let esr = g.sys(sr::ESR_EL1);
    assert_eq!(esr >> 26, 0x35, "ESR {esr:#x}");
    assert_eq!(esr & (1 << 6), 1 << 6, "WnR");
    assert_eq!(g.sys(sr::FAR_EL1), watched);
    assert_eq!(g.sys(sr::ELR_EL1), CODE + 4);
    assert_eq!(
        g.read_u64(watched + 8),
        0x5a,
        "the store next to it was made"
    );
    assert_eq!(g.read_u64(watched), 7, "the watched store was not");
}

/// kvm-unit-tests' `debug ss`: MDSCR_EL1.SS and KDE set with debug
/// exceptions masked and PSTATE.SS clear, then `msr daifclr, #8`: the step
/// is active-pending, so a Software Step exception (no instruction stepped,
/// ISV 0) is due before the next instruction (quirk 17).
#[test]
fn unmasking_debug_exceptions_takes_a_pending_software_step() {
    use crate::arch::debug::{MDSCR_KDE, MDSCR_SS};
    let mut g = Guest::new(&[
        0xd503_48ff, // 0x00: msr daifclr, #8
        0xd503_201f, // 0x04: nop
        0xd503_201f, // 0x08: nop
        0xd400_0002, // 0x0c: hvc #0
    ]);
    g.cpu.set_sysreg(sr::OSLSR_EL1, 0b1000).unwrap();
    g.cpu
        .set_sysreg(sr::MDSCR_EL1, MDSCR_SS | MDSCR_KDE)
        .unwrap();
    // EL1h, D, A, I, F masked, PSTATE.SS clear.
    g.cpu.set_reg(Reg::Pstate, 0x3c5).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: SYNC_EL1H });
    assert_eq!(g.sys(sr::ESR_EL1), 0xce00_0022, "EC 0x33, IL, ISV 0, debug");
    assert_eq!(g.sys(sr::ELR_EL1), CODE + 4);
}

/// Stepping `msr daifset, #8` masks debug exceptions: no Software Step
/// exception follows it (QEMU raises one anyway, quirk 17), execution goes
/// on, and the step stays pending (PSTATE.SS clear).
#[test]
fn a_stepped_instruction_that_masks_debug_exceptions_is_not_followed_by_a_step() {
    use crate::arch::debug::{MDSCR_KDE, MDSCR_SS, PSTATE_SS};
    let mut g = Guest::new(&[
        0xd503_48df, // 0x00: msr daifset, #8
        0xd503_201f, // 0x04: nop
        0xd400_0002, // 0x08: hvc #0
    ]);
    g.cpu.set_sysreg(sr::OSLSR_EL1, 0b1000).unwrap();
    g.cpu
        .set_sysreg(sr::MDSCR_EL1, MDSCR_SS | MDSCR_KDE)
        .unwrap();
    // EL1h, D clear, PSTATE.SS set: the first instruction is stepped.
    g.cpu.set_reg(Reg::Pstate, 0x1c5 | PSTATE_SS).unwrap();
    assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(g.pc(), CODE + 12);
    assert_eq!(
        g.cpu.reg(Reg::Pstate).unwrap() & PSTATE_SS,
        0,
        "still pending"
    );
}

/// Spins on CNTV_CTL_EL0 until ISTATUS, then reads ISR_EL1 (IRQs masked).
const VTIMER_SPIN: &[u32] = &[
    0xd53b_e320, // 0x00: mrs x0, cntv_ctl_el0
    0x3617_ffe0, // 0x04: tbz w0, #2, 0x00
    0xd538_c101, // 0x08: mrs x1, isr_el1
    0xd400_0002, // 0x0c: hvc #0
];

/// The virtual timer's output is ISTATUS: the read that first shows the
/// condition raises the PPI (the IRQ is pending at the next instruction),
/// not the timer thread when it next wakes (kvm-unit-tests' timer test
/// checks for the interrupt right after its busy loop sees ISTATUS).
#[test]
fn a_read_showing_istatus_raises_the_vtimer_ppi_at_once() {
    for _ in 0..5 {
        let mut g = Guest::new(VTIMER_SPIN);
        // 2 ms ahead, enabled, IRQs masked (PSTATE as at entry).
        let cval = g.sys(sr::CNTVCT_EL0) + super::timer::COUNTER_HZ / 500;
        g.cpu.set_sysreg(sr::CNTV_CVAL_EL0, cval).unwrap();
        g.cpu.set_sysreg(sr::CNTV_CTL_EL0, 1).unwrap();
        g.io.irq_follows_vtimer = true; // the GIC's answer once the PPI is raised
        assert_eq!(g.run(), VcpuExit::Hvc { imm: 0 });
        assert_eq!(g.x(0) & 0b101, 0b101, "ENABLE, ISTATUS");
        assert_eq!(g.x(1) & (1 << 7), 1 << 7, "ISR_EL1.I: the IRQ is pending");
        assert!(g.io.events.contains(&Ev::Timer(true)), "the PPI was raised");
    }
}

#[test]
fn a_vcpu_taken_over_by_a_vm_on_the_same_ram_goes_on_where_it_stopped() {
    let Guest {
        ram,
        vm,
        cpu,
        mut io,
        ..
    } = Guest::new(HVC_SMC);
    let mut cpu = cpu;
    assert_eq!(cpu.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 5 });
    // A second VM of the same RAM, as a forked child builds (`machine::fork`).
    let vm2 = EmuHypervisor::new()
        .create_vm(ram.clone(), 2, GicMode::Userspace)
        .unwrap();
    let mut cpu = vm2.adopt_vcpu(cpu).unwrap();
    assert_eq!(cpu.run(&mut io).unwrap(), VcpuExit::Smc { imm: 0x77 });
    assert_eq!(cpu.reg(Reg::Pc).unwrap(), CODE + 8);
    // It is the new VM's vCPU 0: taken, and kicked through the new VM.
    assert!(vm2.create_vcpu(0, 0).is_err());
    cpu.kicker().kick();
    assert_eq!(cpu.run(&mut io).unwrap(), VcpuExit::Kicked);
    assert_eq!(cpu.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 6 });
    drop(vm);
}

#[test]
fn a_vcpu_is_not_taken_over_by_a_vm_on_other_ram() {
    let g = Guest::new(HVC_SMC);
    let other = Arc::new(GuestRam::new_anonymous(RAM_SIZE).unwrap());
    let vm2 = EmuHypervisor::new()
        .create_vm(other, 2, GicMode::Userspace)
        .unwrap();
    let Err(e) = vm2.adopt_vcpu(g.cpu) else {
        panic!("taken over by a VM on other RAM");
    };
    assert!(e.to_string().contains("maps"), "{e}");
    // The id stays free.
    assert!(vm2.create_vcpu(0, 0).is_ok());
}
