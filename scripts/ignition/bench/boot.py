"""Benchmark (not a test): Ignition's boot time against QEMU TCG, in one run.

For each of N runs: spawn `boot` on the built guest and time (wall clock)
spawn -> `login:` on the console, and read the VMM's own `Guest-boot-time`
line (VM start -> the guest init's boot-timer write). Then the same Image and
rootfs under `qemu-system-aarch64 -M virt,gic-version=3 -cpu max` (TCG), so
both are measured on the same machine at the same time. Prints median, min
and max, the emu/QEMU ratio (target: at most 1.5x; both use QEMU's TCG CPU),
and writes bench-results/boot.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ignition import console, host, paths, qemu, timeouts
from ignition.guest import disk_copy
from ignition.paths import DEFAULT_BOOT, RESULTS_DIR
from ignition.stats import sha256, summarize, write_report
from ignition.vm import Vm, VmConfig

RATIO_TARGET = 1.5


def time_ignition(cfg: VmConfig, disk: Path, cpus: int, mem: int, log_path: Path) -> tuple[float, int]:
    """(seconds from spawn to login:, Guest-boot-time in ms) for one boot."""
    with Vm.boot(cfg, disk=disk, cpus=cpus, mem=mem, log_path=log_path) as vm:
        guest_ms = vm.guest_boot_time_ms()
        return vm.wait_login(), guest_ms


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.boot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=5, help="boots per VMM (default: 5)")
    p.add_argument("--boot", type=Path, default=DEFAULT_BOOT, help="the boot binary (default: target/release/boot)")
    p.add_argument("--backend", default="emu", choices=["emu", "hvf"], help="Ignition backend (default: emu)")
    p.add_argument("--gic", choices=["userspace", "hvf"], help="Ignition's GIC (default: boot's, userspace)")
    p.add_argument("--kernel", type=Path, default=paths.KERNEL)
    p.add_argument("--disk", type=Path, default=paths.ROOTFS)
    p.add_argument("--cpus", type=int, default=1)
    p.add_argument("--mem", type=int, default=512, help="MiB (default: 512)")
    p.add_argument("--timeout", type=float, help="seconds per boot (default: the backend's, timeouts.py)")
    p.add_argument("--no-qemu", action="store_true", help="skip the QEMU comparison")
    p.add_argument(
        "--accel",
        choices=qemu.ACCELS,
        default="tcg",
        help="QEMU's accelerator (default: tcg; hvf on a Mac, for the hvf backend's peer)",
    )
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "boot.json")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if not args.boot.is_file():
        print(f"boot_bench: {args.boot} not found: cargo build --release --bin boot", file=sys.stderr)
        return 1
    err = qemu.check_inputs(args.kernel, args.disk)
    if err and not (args.no_qemu and err.startswith(qemu.QEMU)):
        print(f"boot_bench: {err}", file=sys.stderr)
        return 1

    tmo = timeouts.for_backend(args.backend)
    if args.timeout:
        tmo = dataclasses.replace(tmo, boot=args.timeout)
    cfg = VmConfig(boot=args.boot, backend=args.backend, gic=args.gic, kernel=args.kernel, timeouts=tmo)
    qemu_timeout = args.timeout or timeouts.for_backend("qemu").boot
    logs = RESULTS_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    wall, guest = [], []
    for i in range(args.runs):
        with disk_copy(args.disk) as disk:
            try:
                t, g = time_ignition(cfg, disk, args.cpus, args.mem, logs / f"ignition-{i + 1}.log")
            except console.ConsoleError as e:
                print(f"boot_bench: ignition run {i + 1}: {e}", file=sys.stderr)
                return 1
        wall.append(t)
        guest.append(g / 1000)
        print(f"ignition run {i + 1}/{args.runs}: login {t:.3f} s, Guest-boot-time {g} ms")

    result: dict[str, Any] = {
        "benchmark": "boot_to_login",
        "ignition": {
            "backend": args.backend,
            "gic": args.gic or "userspace",
            "login": summarize(wall),
            "guest_boot_time": summarize(guest),
        },
        "config": {
            "cpus": args.cpus,
            "mem_mib": args.mem,
            "runs": args.runs,
            "kernel_sha256": sha256(args.kernel),
            "disk_sha256": sha256(args.disk),
        },
        "host": host.summary(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.no_qemu:
        qemu_times = []
        for i in range(args.runs):
            with disk_copy(args.disk) as disk:
                qargv = qemu.qemu_argv(args.kernel, disk, args.cpus, args.mem, accel=args.accel)
                try:
                    t = console.time_to_login(qargv, timeout=qemu_timeout, log_path=logs / f"qemu-{i + 1}.log")
                except console.ConsoleError as e:
                    print(f"boot_bench: qemu run {i + 1}: {e}", file=sys.stderr)
                    return 1
            qemu_times.append(t)
            print(f"qemu run {i + 1}/{args.runs}: login {t:.3f} s")
        key = f"qemu_{args.accel}"
        result[key] = {"login": summarize(qemu_times)}
        ratio = result["ignition"]["login"]["median_s"] / result[key]["login"]["median_s"]
        result["ratio_ignition_to_qemu"] = round(ratio, 3)
        result["ratio_target"] = RATIO_TARGET

    ig = result["ignition"]
    lines = [
        f"ignition ({args.backend}): login median {ig['login']['median_s']:.3f} s "
        f"(min {ig['login']['min_s']:.3f}, max {ig['login']['max_s']:.3f}); "
        f"Guest-boot-time median {ig['guest_boot_time']['median_s'] * 1000:.0f} ms"
    ]
    if f"qemu_{args.accel}" in result:
        q = result[f"qemu_{args.accel}"]["login"]
        lines.append(
            f"qemu {args.accel}: login median {q['median_s']:.3f} s (min {q['min_s']:.3f}, max {q['max_s']:.3f}); "
            f"ratio {result['ratio_ignition_to_qemu']:.2f}x (target <= {RATIO_TARGET}x)"
        )
    write_report(args.out, result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
