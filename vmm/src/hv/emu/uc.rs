//! A thin handle over a raw unicorn engine, usable both from the vCPU and
//! from inside hooks (where only the raw `uc_engine` pointer is available).

use crate::arch::sysreg::SysReg;
use crate::hv::HvError;
use std::ffi::c_void;
use unicorn_engine::{
    uc_ctl, uc_emu_stop, uc_engine, uc_error, uc_reg_read, uc_reg_write, ControlType,
    RegisterARM64, RegisterARM64CP,
};

/// A live unicorn engine. Copyable so hooks can use it; it never outlives the
/// engine because it is only created from the vCPU's own engine or from the
/// pointer unicorn passes to a hook of that engine.
#[derive(Clone, Copy)]
pub(crate) struct Uc(*mut uc_engine);

impl Uc {
    /// Wraps `uc`.
    ///
    /// # Safety
    /// `uc` must be a live engine for as long as the returned value is used,
    /// and it must only be used on the thread running that engine.
    pub(crate) unsafe fn new(uc: *mut uc_engine) -> Self {
        Uc(uc)
    }

    /// Reads a register of at most 64 bits (unicorn's 32-bit registers such
    /// as PSTATE fill the low half).
    pub(crate) fn read(self, reg: RegisterARM64) -> Result<u64, uc_error> {
        let mut v = 0u64;
        // SAFETY: `self.0` is live (constructor contract); `v` is a valid
        // 8-byte buffer, enough for every register this is used with.
        let e = unsafe { uc_reg_read(self.0, reg as i32, (&raw mut v).cast::<c_void>()) };
        e.and(Ok(v))
    }

    /// Writes a register of at most 64 bits.
    pub(crate) fn write(self, reg: RegisterARM64, v: u64) -> Result<(), uc_error> {
        // SAFETY: as in `read`; unicorn reads at most 8 bytes from `v`.
        let e = unsafe { uc_reg_write(self.0, reg as i32, (&raw const v).cast::<c_void>()) };
        e.into()
    }

    /// Reads a 128-bit SIMD register `V<n>`.
    pub(crate) fn read_v(self, n: u8) -> Result<u128, uc_error> {
        let mut v = [0u8; 16];
        let reg = RegisterARM64::V0 as i32 + i32::from(n & 31);
        // SAFETY: `v` is a 16-byte buffer, the size of a V register.
        let e = unsafe { uc_reg_read(self.0, reg, v.as_mut_ptr().cast::<c_void>()) };
        e.and(Ok(u128::from_le_bytes(v)))
    }

    /// Writes a 128-bit SIMD register `V<n>`.
    pub(crate) fn write_v(self, n: u8, value: u128) -> Result<(), uc_error> {
        let v = value.to_le_bytes();
        let reg = RegisterARM64::V0 as i32 + i32::from(n & 31);
        // SAFETY: `v` is a 16-byte buffer, the size of a V register.
        let e = unsafe { uc_reg_write(self.0, reg, v.as_ptr().cast::<c_void>()) };
        e.into()
    }

    /// The unicorn register id of `X<n>` (`n <= 30`).
    pub(crate) fn xreg(n: u8) -> RegisterARM64 {
        use RegisterARM64 as R;
        const X: [RegisterARM64; 31] = [
            R::X0,
            R::X1,
            R::X2,
            R::X3,
            R::X4,
            R::X5,
            R::X6,
            R::X7,
            R::X8,
            R::X9,
            R::X10,
            R::X11,
            R::X12,
            R::X13,
            R::X14,
            R::X15,
            R::X16,
            R::X17,
            R::X18,
            R::X19,
            R::X20,
            R::X21,
            R::X22,
            R::X23,
            R::X24,
            R::X25,
            R::X26,
            R::X27,
            R::X28,
            R::X29,
            R::X30,
        ];
        X[usize::from(n.min(30))]
    }

    /// Reads `X<n>`, with `n == 31` meaning SP.
    pub(crate) fn x_or_sp(self, n: u8) -> u64 {
        let reg = if n >= 31 {
            RegisterARM64::SP
        } else {
            Self::xreg(n)
        };
        self.read(reg).unwrap_or(0)
    }

    /// Writes `X<n>`; `n == 31` (XZR) discards the value.
    pub(crate) fn set_x(self, n: u8, v: u64) -> Result<(), uc_error> {
        if n >= 31 {
            return Ok(());
        }
        self.write(Self::xreg(n), v)
    }

    fn cp(reg: SysReg, val: u64) -> RegisterARM64CP {
        let (op0, op1, crn, crm, op2) = reg.fields();
        RegisterARM64CP {
            crn: crn.into(),
            crm: crm.into(),
            op0: op0.into(),
            op1: op1.into(),
            op2: op2.into(),
            val,
        }
    }

    fn cp_read_raw(self, reg: SysReg, sentinel: u64) -> Result<u64, uc_error> {
        let mut cp = Self::cp(reg, sentinel);
        // SAFETY: `cp` is a valid `uc_arm64_cp_reg` that unicorn fills in.
        let e = unsafe {
            uc_reg_read(
                self.0,
                RegisterARM64::CP_REG as i32,
                (&raw mut cp).cast::<c_void>(),
            )
        };
        e.and(Ok(cp.val))
    }

    /// Reads a system register unicorn implements (raw read, no side
    /// effects); `Err(ARG)` if unicorn does not know it. Unicorn 2.1 reports
    /// success (and prints a deprecation warning) for unknown registers, so
    /// an untouched value, checked with two different sentinels, means
    /// "unknown".
    pub(crate) fn cp_read(self, reg: SysReg) -> Result<u64, uc_error> {
        const A: u64 = 0x5a5a_c3c3_0f0f_9669;
        const B: u64 = !A;
        let v = self.cp_read_raw(reg, A)?;
        if v != A || self.cp_read_raw(reg, B)? != B {
            return Ok(v);
        }
        Err(uc_error::ARG)
    }

    /// Writes a system register unicorn implements (callers check that it
    /// does with [`Uc::cp_read`]: unknown ones are silently ignored). Unicorn
    /// rebuilds its cached CPU flags after this (quirk 4).
    pub(crate) fn cp_write(self, reg: SysReg, v: u64) -> Result<(), uc_error> {
        let cp = Self::cp(reg, v);
        // SAFETY: `cp` is a valid `uc_arm64_cp_reg` that unicorn reads.
        let e = unsafe {
            uc_reg_write(
                self.0,
                RegisterARM64::CP_REG as i32,
                (&raw const cp).cast::<c_void>(),
            )
        };
        e.into()
    }

    /// Requests that `emu_start` return. Only called synchronously from a
    /// hook on the engine's own thread (quirk 9).
    pub(crate) fn stop(self) {
        // SAFETY: `self.0` is live; stopping from a hook is supported.
        unsafe {
            uc_emu_stop(self.0);
        }
    }

    fn ctl(self, ctl: ControlType) -> Result<(), uc_error> {
        // SAFETY: the write controls used here take no further arguments.
        let e = unsafe { uc_ctl(self.0, ControlType(ctl.0 | ControlType::IO_WRITE.0)) };
        e.into()
    }

    /// Flushes the software TLB (safe inside a hook: QEMU's own TLBI helpers
    /// flush synchronously too).
    pub(crate) fn flush_tlb(self) -> Result<(), uc_error> {
        self.ctl(ControlType::TLB_FLUSH)
    }

    /// Drops all translated blocks. Never called while `emu_start` runs.
    pub(crate) fn flush_tb(self) -> Result<(), uc_error> {
        self.ctl(ControlType::TB_FLUSH)
    }

    /// Drops the translated blocks of `[start, end)`, an address translated
    /// through the current TLB (see the identity mode of the TLB hook).
    pub(crate) fn remove_cache(self, start: u64, end: u64) -> Result<(), uc_error> {
        // SAFETY: TB_REMOVE_CACHE takes two u64 arguments.
        let e = unsafe {
            uc_ctl(
                self.0,
                ControlType(ControlType::TB_REMOVE_CACHE.0 | ControlType::IO_WRITE.0),
                start,
                end,
            )
        };
        e.into()
    }
}

/// Maps a unicorn error of `call` to [`HvError::Call`].
pub(super) fn uc_err(call: &'static str) -> impl Fn(uc_error) -> HvError {
    move |e| HvError::Call {
        call,
        detail: format!("{e:?}"),
    }
}
