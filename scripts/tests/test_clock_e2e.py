"""End-to-end: the guest's clock across snapshots (the book's hvf chapter, "Fixed by the
backend review": one guest clock per VM, and guest time standing still while paused).

* One counter per VM: after a full snapshot is restored, and after a diff of
  that restore is restored, a 2-vCPU guest's CPUs still read the same
  counter. A tiny static program (built here, below) pins itself to CPU 0,
  CPU 1 and CPU 0 again, reading CNTVCT_EL0 after each move; with one counter
  the three reads never decrease, with a counter per vCPU that disagrees by
  more than a migration takes they do.
* Guest time stands still while the VM is paused for a snapshot: with the
  test hook IGNITION_TEST_SNAPSHOT_DELAY_MS (`boot` sleeps that long inside
  the pause, after the layer is written), the guest's uptime across Ctrl-A s
  grows by less than the host's time minus the delay.

Both checks are exact inequalities on the guest's own counter and the host's
monotonic clock, so machine speed and load do not decide them.

Uses from the ignition package: Vm (boot, restore, the guest agent's
write_file and run, snapshot, quit) and the cfg fixture (conftest.py).
"""

from __future__ import annotations

import shutil
import struct
import time

import pytest

from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 256
DELAY_MS = 6000
DELAY_ENV = "IGNITION_TEST_SNAPSHOT_DELAY_MS"

# `cntpp`: 64 times, pin to CPU 0, read CNTVCT_EL0, pin to CPU 1, read, pin to
# CPU 0, read, and write the three counts (24 bytes, little-endian) to stdout;
# exit 0, or 1 if a call fails. Position-independent; the words were produced
# with aarch64-linux-gnu-as from this source, offsets from the first word.
CNTPP = [
    0xD2800813,  # 0x00: mov x19, #64
    0x100004A2,  # 0x04: loop: adr x2, mask0
    0x9400001A,  # 0x08: bl pin
    0xD5033FDF,  # 0x0c: isb
    0xD53BE055,  # 0x10: mrs x21, cntvct_el0
    0x10000462,  # 0x14: adr x2, mask1
    0x94000016,  # 0x18: bl pin
    0xD5033FDF,  # 0x1c: isb
    0xD53BE056,  # 0x20: mrs x22, cntvct_el0
    0x100003A2,  # 0x24: adr x2, mask0
    0x94000012,  # 0x28: bl pin
    0xD5033FDF,  # 0x2c: isb
    0xD53BE057,  # 0x30: mrs x23, cntvct_el0
    0xA9BE5BF5,  # 0x34: stp x21, x22, [sp, #-32]!
    0xF9000BF7,  # 0x38: str x23, [sp, #16]
    0xD2800020,  # 0x3c: mov x0, #1
    0x910003E1,  # 0x40: mov x1, sp
    0xD2800302,  # 0x44: mov x2, #24
    0xD2800808,  # 0x48: mov x8, #64              (write)
    0xD4000001,  # 0x4c: svc #0
    0x910083FF,  # 0x50: add sp, sp, #32
    0xF100601F,  # 0x54: cmp x0, #24
    0x54000181,  # 0x58: b.ne fail
    0xF1000673,  # 0x5c: subs x19, x19, #1
    0x54FFFD21,  # 0x60: b.ne loop
    0xD2800000,  # 0x64: mov x0, #0
    0xD2800BA8,  # 0x68: mov x8, #93              (exit)
    0xD4000001,  # 0x6c: svc #0
    0xD2800000,  # 0x70: pin: mov x0, #0          (this thread)
    0xD2800101,  # 0x74: mov x1, #8               (mask size)
    0xD2800F48,  # 0x78: mov x8, #122             (sched_setaffinity)
    0xD4000001,  # 0x7c: svc #0
    0xB5000040,  # 0x80: cbnz x0, fail
    0xD65F03C0,  # 0x84: ret
    0xD2800020,  # 0x88: fail: mov x0, #1
    0xD2800BA8,  # 0x8c: mov x8, #93
    0xD4000001,  # 0x90: svc #0
    0xD503201F,  # 0x94: nop
    0x00000001,
    0x00000000,  # 0x98: mask0: .quad 1 (CPU 0)
    0x00000002,
    0x00000000,  # 0xa0: mask1: .quad 2 (CPU 1)
]
SAMPLES = 64  # the loop count in the first word


def elf(words: list[int]) -> bytes:
    """A static AArch64 ELF executable of one read+execute segment: the ELF
    header, one program header, then the code (entry at its first word)."""
    base, code_off = 0x400000, 64 + 56
    code = struct.pack(f"<{len(words)}I", *words)
    size = code_off + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, LE, v1, SysV
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 183, 1, base + code_off, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x10000)  # PT_LOAD, R+X
    return header + phdr + code


def counts_across_cpus(vm) -> list[tuple[int, int, int]]:
    """Runs cntpp in the guest; returns its (CPU 0, CPU 1, CPU 0) counts."""
    out = vm.run("/root/cntpp | od -A n -t u8 -v")
    values = [int(v) for v in out.split()]
    assert len(values) == 3 * SAMPLES, out
    return [(values[i], values[i + 1], values[i + 2]) for i in range(0, len(values), 3)]


def assert_one_counter(vm, when: str) -> None:
    samples = counts_across_cpus(vm)
    back = [(a, b, c) for a, b, c in samples if not a <= b <= c]
    # With a counter per vCPU these show the skew: CPU 1's count minus CPU
    # 0's plus the time a migration takes, and minus it.
    steps = min(b - a for a, b, _ in samples), min(c - b for _, b, c in samples)
    assert not back, (
        f"{when}: the counter went backwards on a migration {len(back)} of {SAMPLES} "
        f"times (smallest step CPU 0->1 {steps[0]}, CPU 1->0 {steps[1]} ticks): {back[:4]}"
    )


def uptime(vm) -> float:
    return float(vm.run("cut -d ' ' -f 1 /proc/uptime"))


def test_clock_across_snapshots(guest_out, cfg, tmp_path, monkeypatch):
    store = tmp_path / "store"
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    monkeypatch.setenv(DELAY_ENV, str(DELAY_MS))
    # --snapshot-mode stop: the hook lengthens the pause itself (in the
    # background mode it delays the writer, with the guest running).
    with Vm.boot(
        cfg,
        disk=disk,
        mem=MEM,
        cpus=2,
        store=store,
        name="clk",
        track_dirty=True,
        log_path=tmp_path / "clk.log",
        extra=["--snapshot-mode", "stop"],
        agent=True,
    ) as vm:
        vm.wait_ready()
        vm.write_file("/root/cntpp", elf(CNTPP), mode=0o755)
        assert_one_counter(vm, "fresh boot")

        # Guest time across a snapshot that pauses the VM for DELAY_MS more.
        t0 = time.monotonic()
        u0 = uptime(vm)
        t1 = time.monotonic()
        vm.snapshot("clk", "full")
        t2 = time.monotonic()
        u1 = uptime(vm)
        t3 = time.monotonic()
        delay = DELAY_MS / 1000
        assert t2 - t1 >= delay, f"the snapshot took {t2 - t1:.2f} s: the {DELAY_ENV} hook did not work"
        # Both uptime reads happened within [t0, t3]: with the guest's clock
        # stopped for the delay, it advanced by at most t3 - t0 - delay (plus
        # /proc/uptime's rounding to 10 ms, twice). Without, by about t2 - t1.
        guest, host = u1 - u0, t3 - t0
        assert guest <= host - delay + 0.02, (
            f"guest time advanced {guest:.2f} s over {host:.2f} s of host time including a {delay:.0f} s pause"
        )
        assert vm.quit() == 0
    monkeypatch.delenv(DELAY_ENV)

    with Vm.restore(
        cfg, "clk", store=store, name="clk-d1", track_dirty=True, agent=True, log_path=tmp_path / "r1.log"
    ) as vm:
        assert_one_counter(vm, "restored full snapshot")
        vm.run("echo diff > /dev/shm/d1")
        vm.snapshot("clk-d1", "diff")
        assert vm.quit() == 0

    with Vm.restore(cfg, "clk+1", store=store, agent=True, log_path=tmp_path / "r2.log") as vm:
        assert_one_counter(vm, "restored diff")
        assert vm.run("cat /dev/shm/d1") == "diff"
        assert vm.quit() == 0
