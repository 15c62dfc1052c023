"""Benchmark (not a test): QEMU start -> `login:` wall time for the guest in guest/out.

Runs N boots (default 5), prints median/min/max and writes
bench-results/qemu_boot.json. Each run gets a fresh copy of the disk; the copy
is made before the clock starts.

The clock is ignition.console.time_to_login (any argv whose stdio is the
guest console), so other benchmarks time their own VMM the same way.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ignition import console, host, paths, qemu, timeouts
from ignition.guest import disk_copy
from ignition.paths import RESULTS_DIR
from ignition.stats import sha256, summarize, write_report

TIMEOUT = timeouts.for_backend("qemu").boot


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.qemu_boot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=5, help="number of boots (default: 5)")
    p.add_argument("--kernel", type=Path, default=paths.KERNEL)
    p.add_argument("--disk", type=Path, default=paths.ROOTFS)
    p.add_argument("--cpus", type=int, default=1, help="vCPUs (default: 1)")
    p.add_argument("--mem", type=int, default=512, help="memory in MiB (default: 512)")
    p.add_argument("--timeout", type=float, default=TIMEOUT, help=f"seconds allowed per boot (default: {TIMEOUT:g})")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / "qemu_boot.json",
        help="JSON results file (default: bench-results/qemu_boot.json)",
    )
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")

    err = qemu.check_inputs(args.kernel, args.disk)
    if err:
        print(f"qemu_boot_bench: {err}", file=sys.stderr)
        return 1

    samples = []
    for i in range(args.runs):
        with disk_copy(args.disk) as disk:
            qargv = qemu.qemu_argv(args.kernel, disk, args.cpus, args.mem)
            try:
                t = console.time_to_login(qargv, timeout=args.timeout)
            except console.ConsoleError as e:
                print(f"qemu_boot_bench: run {i + 1}: {e}", file=sys.stderr)
                return 1
        samples.append(t)
        print(f"run {i + 1}/{args.runs}: {t:.3f} s")

    qemu_version = subprocess.run(
        [qemu.QEMU, "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]
    result = {
        "benchmark": "qemu_boot_to_login",
        "description": "wall time from spawning qemu-system-aarch64 to 'login:' on the console",
        **summarize(samples),
        "runs": args.runs,
        "config": {
            "qemu": qemu_version,
            "argv": qemu.qemu_argv(args.kernel, "<copy of disk>", args.cpus, args.mem),
            "cpus": args.cpus,
            "mem_mib": args.mem,
            "kernel_sha256": sha256(args.kernel),
            "disk_sha256": sha256(args.disk),
        },
        "host": host.summary(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    line = (
        f"boot to login: median {result['median_s']:.3f} s, min {result['min_s']:.3f} s, "
        f"max {result['max_s']:.3f} s (n={args.runs})"
    )
    write_report(args.out, result, [line])
    return 0


if __name__ == "__main__":
    sys.exit(main())
