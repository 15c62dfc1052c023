//! The FFI layer's calls checked against C: built for
//! `aarch64-unknown-linux-gnu` in release mode with the `hvf-abi-probe`
//! feature and run under `qemu-aarch64`, every declaration the backend uses
//! (`ffi.rs`'s extern block and its `hv_vcpu_set_simd_fp_reg` assembly,
//! `gic.rs`'s and `ffi.rs`'s looked-up function types, applevisor-sys's VM
//! and stage-2 calls) calls a C stand-in compiled from Apple's prototype
//! (the `hvf-abi-probe` crate), which records where each argument arrived.
//! AArch64 Linux and macOS place all of these arguments alike; release mode
//! because a wrong declaration can happen to work unoptimised.

use super::abi::{SmeState, VcpuExit, HV_UNSUPPORTED};
use super::ffi::{vcpus_exit, RawVcpu};
use super::{regs, HvfHypervisor};
use crate::arch::layout::{GICD_BASE, GICR_BASE, PAGE_SIZE, RAM_BASE};
use crate::arch::sysreg::SysReg;
use crate::hv::gic::ICC_STATE_REGS;
use crate::hv::{GicMode, Hypervisor, Prot, Reg, Vcpu, Vm};
use crate::memory::GuestRam;
use applevisor::error::HypervisorError;
use applevisor_sys::{hv_reg_t, hv_sys_reg_t};
use hvf_abi_probe::{self as probe, Call, VCPU};
use std::hint::black_box;
use std::sync::{Arc, Mutex, MutexGuard};

/// `HV_BAD_ARGUMENT`.
const HV_BAD_ARGUMENT: i32 = 0xfae9_4003_u32 as i32;

/// The stand-ins' state is global: one test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The arguments of every call to `name` in `calls`.
fn args_of(calls: &[Call], name: &str) -> Vec<Vec<u64>> {
    calls
        .iter()
        .filter(|c| c.name() == name)
        .map(|c| c.args().to_vec())
        .collect()
}

/// The arguments of the one call to `name`.
fn one(calls: &[Call], name: &str) -> Vec<u64> {
    let mut all = args_of(calls, name);
    assert_eq!(all.len(), 1, "calls to {name}: {calls:?}");
    all.remove(0)
}

/// A distinct 128-bit value per register, every byte different.
fn pattern(n: u8) -> u128 {
    u128::from_le_bytes(std::array::from_fn(|i| {
        (i as u8).wrapping_mul(17) ^ n.wrapping_mul(29)
    }))
}

#[test]
fn every_v_register_set_through_the_assembly_arrives_in_q0_and_reads_back() {
    let _one = serial();
    let v = RawVcpu::create().unwrap();
    probe::take();
    // Values live across the calls: the stand-in leaves every caller-saved
    // register holding garbage, so a clobber the assembly did not declare
    // would corrupt them.
    let mut floats = [0f64; 8];
    let mut ints = [0u64; 8];
    for n in 0..32u8 {
        let value = black_box(pattern(n));
        let reg = regs::hv_simd_reg(n).unwrap();
        v.set_simd_fp_reg(reg, value).unwrap();
        for i in 0..8 {
            floats[i] += black_box(f64::from(n) * (i as f64 + 0.5));
            ints[i] = ints[i]
                .wrapping_mul(31)
                .wrapping_add(u64::from(n) ^ i as u64);
        }
        let calls = probe::take();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].name(), "hv_vcpu_set_simd_fp_reg");
        assert_eq!(calls[0].args()[..2], [VCPU, u64::from(n)]);
        assert_eq!(
            u128::from_le_bytes(calls[0].vec),
            value,
            "V{n}: the value the C function received (q0)"
        );
        assert_eq!(v.get_simd_fp_reg(reg).unwrap(), value, "V{n} reads back");
        assert_eq!(
            one(&probe::take(), "hv_vcpu_get_simd_fp_reg")[..2],
            [VCPU, u64::from(n)]
        );
    }
    let mut want_floats = [0f64; 8];
    let mut want_ints = [0u64; 8];
    for n in 0..32u8 {
        for i in 0..8 {
            want_floats[i] += f64::from(n) * (i as f64 + 0.5);
            want_ints[i] = want_ints[i]
                .wrapping_mul(31)
                .wrapping_add(u64::from(n) ^ i as u64);
        }
    }
    assert_eq!((floats, ints), (want_floats, want_ints));
    // The result is w0 only (the stand-in leaves garbage in x0's upper
    // half), and an error code comes through.
    probe::fail_next(HV_BAD_ARGUMENT);
    let e = v.set_simd_fp_reg(regs::hv_simd_reg(3).unwrap(), 1);
    assert!(matches!(e, Err(HypervisorError::BadArgument)), "{e:?}");
}

#[test]
fn vcpu_calls_place_every_argument_as_the_c_prototypes_do() {
    let _one = serial();
    probe::take();
    let v = RawVcpu::create().unwrap();
    assert_eq!(v.id(), VCPU);
    let c = probe::take();
    let create = one(&c, "hv_vcpu_create");
    assert!(
        create[0] != 0 && create[1] != 0 && create[2] == 0,
        "{create:x?}"
    );

    let x5 = regs::hv_reg(Reg::X(5)).unwrap();
    v.set_reg(x5, 0x0123_4567_89ab_cdef).unwrap();
    assert_eq!(v.get_reg(x5).unwrap(), 0x0123_4567_89ab_cdef);
    v.set_reg(hv_reg_t::CPSR, 0x3c5).unwrap();
    let mpidr = regs::hv_sys_reg(crate::arch::sysreg::MPIDR_EL1).unwrap();
    v.set_sys_reg(mpidr, 0x8000_0000_0000_0102).unwrap();
    assert_eq!(v.get_sys_reg(mpidr).unwrap(), 0x8000_0000_0000_0102);
    v.set_sys_reg(hv_sys_reg_t::CNTV_CVAL_EL0, u64::MAX - 1)
        .unwrap();
    v.set_pending_irq(true).unwrap();
    v.set_pending_irq(false).unwrap();
    v.set_trap_debug_exceptions(false).unwrap();
    v.set_trap_debug_reg_accesses(true).unwrap();
    v.set_vtimer_mask(true).unwrap();
    v.set_vtimer_offset(0xfedc_ba98_7654_3210).unwrap();
    let c = probe::take();
    let sets = args_of(&c, "hv_vcpu_set_reg");
    assert_eq!(
        sets,
        [vec![VCPU, 5, 0x0123_4567_89ab_cdef], vec![VCPU, 34, 0x3c5]]
    );
    assert_eq!(one(&c, "hv_vcpu_get_reg")[..2], [VCPU, 5]);
    assert_eq!(
        args_of(&c, "hv_vcpu_set_sys_reg"),
        [
            vec![VCPU, 0xc005, 0x8000_0000_0000_0102],
            vec![VCPU, 0xdf1a, u64::MAX - 1]
        ]
    );
    assert_eq!(one(&c, "hv_vcpu_get_sys_reg")[..2], [VCPU, 0xc005]);
    assert_eq!(
        args_of(&c, "hv_vcpu_set_pending_interrupt"),
        [vec![VCPU, 0, 1], vec![VCPU, 0, 0]],
        "Apple's HV_INTERRUPT_TYPE_IRQ is 0"
    );
    assert_eq!(one(&c, "hv_vcpu_set_trap_debug_exceptions"), [VCPU, 0]);
    assert_eq!(one(&c, "hv_vcpu_set_trap_debug_reg_accesses"), [VCPU, 1]);
    assert_eq!(one(&c, "hv_vcpu_set_vtimer_mask"), [VCPU, 1]);
    assert_eq!(
        one(&c, "hv_vcpu_set_vtimer_offset"),
        [VCPU, 0xfedc_ba98_7654_3210]
    );

    // The exit record as C lays out hv_vcpu_exit_t.
    probe::set_exit(1, 0x9381_004f, 0xffff_8000_1234_5678, 0x4000_c008);
    v.run().unwrap();
    assert_eq!(
        v.exit(),
        VcpuExit {
            reason: 1,
            syndrome: 0x9381_004f,
            virtual_address: 0xffff_8000_1234_5678,
            physical_address: 0x4000_c008,
        }
    );
    // SAFETY: the vCPU lives until the end of the test.
    unsafe { vcpus_exit(VCPU) }.unwrap();
    // hv_vcpu_get_sme_state, looked up with dlsym: two C bools.
    probe::set_sme(0, true, false);
    let sme = v.sme_state();
    probe::set_sme(HV_UNSUPPORTED, false, false);
    let c = probe::take();
    assert_eq!(one(&c, "hv_vcpu_run"), [VCPU]);
    let exit = one(&c, "hv_vcpus_exit");
    assert_eq!((exit[1], exit[2]), (1, VCPU), "one id, by pointer");
    assert_eq!(one(&c, "hv_vcpu_get_sme_state")[0], VCPU);
    assert_eq!(
        sme,
        Some((
            0,
            SmeState {
                streaming_sve_mode_enabled: 1,
                za_storage_enabled: 0
            }
        ))
    );
    probe::fail_next(HV_BAD_ARGUMENT);
    assert!(matches!(
        v.set_reg(x5, 0),
        Err(HypervisorError::BadArgument)
    ));
    drop(v);
    assert_eq!(one(&probe::take(), "hv_vcpu_destroy"), [VCPU]);
}

#[test]
fn vm_gic_and_host_calls_place_every_argument_as_the_c_prototypes_do() {
    let _one = serial();
    probe::take();
    let hv = HvfHypervisor::new().unwrap();
    let c = probe::take();
    let names: Vec<String> = c
        .iter()
        .filter(|c| c.name() == "sysctlbyname")
        .map(|c| {
            String::from_utf8_lossy(&c.vec)
                .trim_end_matches('\0')
                .to_string()
        })
        .collect();
    assert_eq!(names, ["kern.hv_support", "hw.tbfrequency"]);

    let ram = Arc::new(GuestRam::new_anonymous(4 * PAGE_SIZE).unwrap());
    let vm = hv.create_vm(ram.clone(), 2, GicMode::Hvf).unwrap();
    assert_eq!(vm.counter_frequency(), 24_000_000, "hw.tbfrequency");
    let c = probe::take();
    assert_eq!(one(&c, "hv_vm_create"), [0]);
    assert_ne!(one(&c, "hv_vm_get_max_vcpu_count"), [0]);
    assert_eq!(
        one(&c, "hv_vm_map"),
        [ram.host_ptr() as u64, RAM_BASE, 4 * PAGE_SIZE, 7]
    );
    let config = one(&c, "hv_gic_config_set_distributor_base");
    assert_eq!(config[1], GICD_BASE);
    assert_eq!(
        one(&c, "hv_gic_config_set_redistributor_base"),
        [config[0], GICR_BASE]
    );
    assert_eq!(one(&c, "hv_gic_create"), [config[0]]);
    assert_eq!(one(&c, "os_release"), [config[0]]);
    for getter in [
        "hv_gic_get_distributor_size",
        "hv_gic_get_distributor_base_alignment",
        "hv_gic_get_redistributor_region_size",
        "hv_gic_get_redistributor_size",
        "hv_gic_get_redistributor_base_alignment",
    ] {
        assert_ne!(one(&c, getter), [0], "{getter}");
    }
    let range = one(&c, "hv_gic_get_spi_interrupt_range");
    assert!(range[0] != 0 && range[1] != 0 && range[0] != range[1]);

    vm.protect(RAM_BASE + PAGE_SIZE, PAGE_SIZE, Prot::ReadExec)
        .unwrap();
    assert_eq!(vm.physical_count(), probe::TIME);
    let gic = vm.kernel_gic().unwrap();
    gic.set_spi(33, true).unwrap();
    let blob = gic.save().unwrap();
    let want: Vec<u8> = (0..probe::GIC_STATE_SIZE as u8)
        .map(|i| i * 7 + 1)
        .collect();
    assert_eq!(blob, want);
    gic.restore(&blob).unwrap();
    let c = probe::take();
    assert_eq!(
        one(&c, "hv_vm_protect"),
        [RAM_BASE + PAGE_SIZE, PAGE_SIZE, 5]
    );
    assert_eq!(one(&c, "hv_gic_set_spi"), [33, 1]);
    let state = one(&c, "hv_gic_state_get_size")[0];
    assert_eq!(one(&c, "hv_gic_state_get_data")[0], state);
    assert_eq!(one(&c, "os_release"), [state]);
    let set = c.iter().find(|c| c.name() == "hv_gic_set_state").unwrap();
    assert_eq!(set.args()[1], probe::GIC_STATE_SIZE as u64);
    assert_eq!(set.vec, want[..16]);

    // The CPU interface, on a vCPU of this thread.
    let mut vcpu = vm.create_vcpu(0, 0x8000_0000).unwrap();
    probe::take();
    let saved: Vec<(SysReg, u64)> = ICC_STATE_REGS
        .iter()
        .zip(1u64..)
        .map(|(&r, v)| (r, v << 56 | v))
        .collect();
    vcpu.set_gic_cpu_state(&saved).unwrap();
    assert_eq!(vcpu.gic_cpu_state().unwrap(), saved);
    let c = probe::take();
    let sets = args_of(&c, "hv_gic_set_icc_reg");
    let want: Vec<Vec<u64>> = saved
        .iter()
        .map(|&(r, v)| vec![VCPU, u64::from(r.0), v])
        .collect();
    assert_eq!(sets, want);
    for (get, &(r, _)) in args_of(&c, "hv_gic_get_icc_reg").iter().zip(&saved) {
        assert_eq!(get[..2], [VCPU, u64::from(r.0)]);
    }
    drop(vcpu);
    drop(gic);
    drop(vm);
    let c = probe::take();
    assert_eq!(one(&c, "hv_vm_unmap"), [RAM_BASE, 4 * PAGE_SIZE]);
    assert_eq!(one(&c, "hv_vm_destroy"), Vec::<u64>::new());
}
