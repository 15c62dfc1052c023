"""Benchmark (not a test): the guest agent against the pty console it replaces, in one VM.

One fresh boot with the guest agent (a vsock device) whose console is also logged in.
Measured, each through the agent and through the pty (typing a command and reading its
echo and prompt, as `Vm.sh` does):

- round trip: `true` run N times (default 1000 each); median and p99 in ms;
- stdout throughput: a file of random bytes `cat` to the host (the pty path: its base64,
  the console carrying text only), MB/s of the file's bytes;
- file write and read: the agent's write_file and read_file of a random file; the pty
  path: `base64 -d > f` typed at the guest's pace, and `base64 f` read back.

MB/s = 10^6 bytes per second. The pty sizes are smaller (`--pty-kib`): the console is
slow and its typed input is paced. Writes bench-results/agent.json.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ignition import host, paths
from ignition.guest import disk_copy
from ignition.paths import DEFAULT_BOOT, RESULTS_DIR
from ignition.stats import sha256, stats, write_report
from ignition.vm import Vm, VmConfig


def latency(samples_s: Sequence[float]) -> dict[str, Any]:
    """Median and p99 (nearest rank) in ms, with min and max."""
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[max(0, math.ceil(0.99 * len(ms)) - 1)]
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 3),
        "p99_ms": round(p99, 3),
        "min_ms": round(ms[0], 3),
        "max_ms": round(ms[-1], 3),
    }


def timed(f: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


def mb_s(size: int, secs: Sequence[float]) -> dict[str, Any]:
    return stats([size / s / 1e6 for s in secs], 4)


def measure_agent(vm: Vm, runs: int, mib: int, reps: int) -> dict[str, Any]:
    def true() -> None:
        assert vm.exec(["true"]).exit_code == 0

    size = mib << 20
    data = os.urandom(size)
    digest = hashlib.sha256(data).hexdigest()
    writes, reads, outs = [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        vm.write_file("/tmp/bench", data)
        writes.append(time.perf_counter() - t)
        t = time.perf_counter()
        got = vm.read_file("/tmp/bench")
        reads.append(time.perf_counter() - t)
        assert hashlib.sha256(got).hexdigest() == digest
        t = time.perf_counter()
        r = vm.exec(["cat", "/tmp/bench"], timeout=900)
        outs.append(time.perf_counter() - t)
        assert r.exit_code == 0 and hashlib.sha256(r.stdout).hexdigest() == digest
    vm.exec(["rm", "/tmp/bench"]).check()
    return {
        "exec_true": latency(timed(true, runs)),
        "stdout_mb_s": mb_s(size, outs),
        "write_file_mb_s": mb_s(size, writes),
        "read_file_mb_s": mb_s(size, reads),
        "mib": mib,
    }


def measure_pty(vm: Vm, runs: int, kib: int, reps: int) -> dict[str, Any]:
    def true() -> None:
        vm.sh("true")

    size = kib << 10
    data = os.urandom(size)
    b64 = base64.b64encode(data).decode()
    digest = hashlib.sha256(data).hexdigest()
    outs, writes, reads = [], [], []
    vm.sh(f"head -c {size} /dev/urandom > /tmp/bench")
    want = vm.sh("sha256sum < /tmp/bench").split()[0]
    for _ in range(reps):
        t = time.perf_counter()
        text = vm.sh("base64 /tmp/bench", timeout=900)
        outs.append(time.perf_counter() - t)
        assert hashlib.sha256(base64.b64decode(text)).hexdigest() == want
        # Typed input, 76-character lines (the console's line discipline takes at most
        # 4095 bytes a line), ended by Ctrl-D; without the terminal's echo, which
        # nothing reads while typing (the pty would fill and stall the VMM's console).
        vm.sh("stty -echo")
        t = time.perf_counter()
        vm.type("base64 -d > /tmp/up\n")
        for i in range(0, len(b64), 76):
            vm.type(b64[i : i + 76] + "\n")
        vm.send("\x04")
        vm.sh("stty echo", timeout=900)
        writes.append(time.perf_counter() - t)
        assert vm.sh("sha256sum < /tmp/up").split()[0] == digest
        t = time.perf_counter()
        text = vm.sh("base64 /tmp/up", timeout=900)
        reads.append(time.perf_counter() - t)
        assert base64.b64decode(text) == data
    vm.sh("rm /tmp/bench /tmp/up")
    return {
        "sh_true": latency(timed(true, runs)),
        "stdout_mb_s": mb_s(size, outs),
        "write_file_mb_s": mb_s(size, writes),
        "read_file_mb_s": mb_s(size, reads),
        "kib": kib,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=1000, help="round trips per path (default: 1000)")
    p.add_argument("--mib", type=int, default=64, help="MiB per agent transfer (default: 64)")
    p.add_argument("--pty-kib", type=int, default=16, help="KiB per pty transfer (default: 16)")
    p.add_argument("--reps", type=int, default=3, help="transfers of each kind per path (default: 3)")
    p.add_argument("--boot", type=Path, default=DEFAULT_BOOT)
    p.add_argument("--backend", default="emu", choices=["emu", "hvf"])
    p.add_argument("--kernel", type=Path, default=paths.KERNEL)
    p.add_argument("--disk", type=Path, default=paths.ROOTFS)
    p.add_argument("--mem", type=int, default=512, help="MiB (default: 512)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "agent.json")
    args = p.parse_args(argv)
    if min(args.runs, args.mib, args.pty_kib, args.reps) < 1:
        p.error("--runs, --mib, --pty-kib and --reps must be >= 1")
    logs = RESULTS_DIR / "logs" / "agent"
    logs.mkdir(parents=True, exist_ok=True)
    cfg = VmConfig(boot=args.boot, backend=args.backend, kernel=args.kernel)
    result: dict[str, Any] = {
        "benchmark": "agent_vs_pty",
        "config": {
            "runs": args.runs,
            "mib": args.mib,
            "pty_kib": args.pty_kib,
            "reps": args.reps,
            "mem_mib": args.mem,
            "backend": args.backend,
            "kernel_sha256": sha256(args.kernel),
            "disk_sha256": sha256(args.disk),
        },
        "host": host.summary(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with (
        disk_copy(args.disk) as disk,
        Vm.boot(cfg, disk=disk, mem=args.mem, agent=True, log_path=logs / "ignition.log") as vm,
    ):
        vm.wait_ready()
        vm.login()
        result["agent"] = measure_agent(vm, args.runs, args.mib, args.reps)
        result["pty"] = measure_pty(vm, args.runs, args.pty_kib, args.reps)
        vm.quit()
    a, t = result["agent"], result["pty"]
    lines = [
        f"round trip (true, n={args.runs}): agent median {a['exec_true']['median_ms']} ms, "
        f"p99 {a['exec_true']['p99_ms']} ms; pty median {t['sh_true']['median_ms']} ms, "
        f"p99 {t['sh_true']['p99_ms']} ms",
        f"stdout: agent {a['stdout_mb_s']['median']} MB/s ({args.mib} MiB), "
        f"pty {t['stdout_mb_s']['median']} MB/s ({args.pty_kib} KiB as base64)",
        f"file write: agent {a['write_file_mb_s']['median']} MB/s, pty {t['write_file_mb_s']['median']} MB/s",
        f"file read: agent {a['read_file_mb_s']['median']} MB/s, pty {t['read_file_mb_s']['median']} MB/s",
    ]
    write_report(args.out, result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
