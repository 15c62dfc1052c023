"""Benchmark (not a test): guest CPU work on Ignition against QEMU TCG, in one run.

Both VMMs boot the built guest (1 vCPU, 512 MiB) and stay up side by side;
each stage of a fixed in-guest workload then runs on one VM after the other,
round after round, so that a change in the machine's load falls on both
alike. The stages (the guest has busybox and no compiler):

  sha256  `dd if=/dev/zero bs=1M count=64 | sha256sum` (the digest is checked)
  gzip    `gzip -6` of a 4-fold copy of the guest's /bin/busybox (7.4 MB of
          machine code; the compressed size is checked against the other VMM's)
  shell   a 20,000-iteration `while` loop of busybox ash arithmetic

Each stage is timed inside the guest from /proc/uptime (10 ms steps; both
guests' clocks follow the host's), so the console's round trips are not in the
figures; beside that wall time, the host CPU time the VMM's process spent in
the stage (all its threads, from /proc), which a busy host distorts less. A
first round warms the translation caches and is not counted; the medians over
--runs rounds (default 5) are printed with the Ignition/QEMU ratio per stage and
for a round's total, and written to bench-results/cpu.json (`cpu` holds the CPU
time figures in the same shapes).
--baseline BOOT adds a second `boot` binary (an earlier build, say) to the
same rounds; --short runs a quarter of the work for a quick check.

--floor also measures the unicorn floor: a fixed loop (a load, a store and
arithmetic per iteration, one translated block; `vmm/examples/unicorn_floor.rs`)
in stock unicorn with no per-block hook (`vtlb`: the virtual TLB only, whose
fill hook does not run once the TLB is warm), with the backend's kind of block
hook (`block-vtlb`), and under qemu-system-aarch64 (the same code as a raw
image, timed as the difference of two loop counts so that QEMU's start-up
cancels); nanoseconds per iteration, medians of the same rounds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ignition import console, host, paths, qemu, timeouts
from ignition.guest import disk_copy
from ignition.paths import DEFAULT_BOOT, RESULTS_DIR
from ignition.stats import sha256, stats, summarize, write_report
from ignition.vm import Vm, VmConfig

ZERO_SHA256 = {
    64: "3b6a07d0d404fab4e23b6d34bc6696a6a312dd92821332385e5af7c01c421351",
    16: "080acf35a507ac9849cfcba47dc2ad83e01b75663a516279c8b9d243b719643e",
}
"""sha256 of N MiB of zeros."""

GZIP_INPUT = "/dev/shm/cpu.in"

FLOOR_BIN = paths.REPO_ROOT / "target" / "release" / "examples" / "unicorn_floor"
FLOOR_MODES = ("vtlb", "block-vtlb")
FLOOR_INNER = 128
"""Inner iterations per outer one (the example's INNER)."""
FLOOR_LOAD_ADDR = "0x40200000"
FLOOR_SPREAD = 8
"""QEMU's loop time is that of a run of FLOOR_SPREAD times the loop count less that of one
run, so that its start-up cancels; a spread of 8 keeps a start-up that varies by some 0.2 s
below a tenth of the difference."""
"""Where QEMU loads the image (the example's BASE)."""


@dataclass(frozen=True)
class Work:
    """The workload's sizes."""

    sha_mib: int
    gzip_copies: int
    loop: int

    def stages(self) -> dict[str, str]:
        """Stage name -> guest shell command (its output is checked)."""
        return {
            "sha256": f"dd if=/dev/zero bs=1M count={self.sha_mib} 2>/dev/null | sha256sum",
            "gzip": f"gzip -6 -c {GZIP_INPUT} | wc -c",
            "shell": f"i=0; while [ $i -lt {self.loop} ]; do i=$((i+1)); done; echo $i",
        }

    def prepare(self) -> str:
        """The command that writes the gzip stage's input."""
        copies = " ".join(["/bin/busybox"] * self.gzip_copies)
        return f"cat {copies} > {GZIP_INPUT}; wc -c < {GZIP_INPUT}"


FULL = Work(sha_mib=64, gzip_copies=4, loop=20_000)
SHORT = Work(sha_mib=16, gzip_copies=1, loop=5_000)

Run = Callable[[str, float], str]
"""Runs a guest shell command with a timeout; returns its output."""


def vm_runner(vm: Vm) -> Run:
    """Run for an Ignition VM's shell."""
    return lambda c, t: vm.sh(c, timeout=t)


def cpu_s_of(pid: int) -> float:
    """User + system CPU seconds of the VMM process `pid` so far (all threads)."""
    ms = host.process_cpu_ms(pid)
    assert ms is not None, f"process {pid} is gone"
    return ms / 1000


def timed(run: Run, cmd: str) -> tuple[float, str]:
    """(seconds by the guest's /proc/uptime, output) of `cmd` in the guest."""
    out = run(
        f"read t0 _ < /proc/uptime; {{ {cmd}; }} > /dev/shm/cpu.out; read t1 _ < /proc/uptime; "
        "echo $t0 $t1; cat /dev/shm/cpu.out",
        900,
    )
    first, _, rest = out.partition("\n")
    t0, t1 = (float(x) for x in first.split())
    return t1 - t0, rest.strip()


def check(stage: str, work: Work, out: str, seen: dict[str, str]) -> None:
    """Raises RuntimeError if a stage's output is wrong (or differs between the VMMs)."""
    if stage == "sha256":
        ok = out.split()[:1] == [ZERO_SHA256[work.sha_mib]]
    elif stage == "shell":
        ok = out == str(work.loop)
    else:
        ok = seen.setdefault(stage, out) == out
    if not ok:
        raise RuntimeError(f"stage {stage}: unexpected output {out!r}")


def floor(outer: int, runs: int, tmp: Path) -> dict[str, Any]:
    """ns per loop iteration in unicorn (each of FLOOR_MODES) and under QEMU, `runs` rounds."""
    ns: dict[str, list[float]] = {m: [] for m in [*FLOOR_MODES, "qemu_tcg"]}
    images = {}
    for k in (1, FLOOR_SPREAD):
        images[k] = tmp / f"floor-{k}.bin"
        subprocess.run([str(FLOOR_BIN), str(outer * k), "image", str(images[k])], check=True)

    def qemu_secs(image: Path) -> float:
        argv = [qemu.QEMU, "-M", "virt", "-cpu", "cortex-a72", "-m", "64", "-nographic", "-semihosting"]
        argv += ["-device", f"loader,file={image},addr={FLOOR_LOAD_ADDR},cpu-num=0", "-monitor", "none"]
        t = time.perf_counter()
        subprocess.run([*argv, "-serial", "none"], check=True, timeout=600)
        return time.perf_counter() - t

    for r in range(runs):
        for m in FLOOR_MODES:
            out = subprocess.run([str(FLOOR_BIN), str(outer), m], capture_output=True, text=True, check=True).stdout
            ns[m].append(float(out.split(":")[-1].split()[0]))
        spread = qemu_secs(images[FLOOR_SPREAD]) - qemu_secs(images[1])
        ns["qemu_tcg"].append(spread * 1e9 / ((FLOOR_SPREAD - 1) * outer * FLOOR_INNER))
        print(f"floor round {r + 1}/{runs}: " + ", ".join(f"{m} {v[-1]:.2f} ns" for m, v in ns.items()), flush=True)
    result: dict[str, Any] = {"outer": outer, "inner": FLOOR_INNER, "ns_per_iteration": {}}
    for m, v in ns.items():
        result["ns_per_iteration"][m] = stats(v, 2)
    q = result["ns_per_iteration"]["qemu_tcg"]["median"]
    result["ratio_to_qemu"] = {m: round(result["ns_per_iteration"][m]["median"] / q, 3) for m in FLOOR_MODES}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.cpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=5, help="counted rounds (default: 5)")
    p.add_argument("--short", action="store_true", help="a quarter of the work per stage")
    p.add_argument("--boot", type=Path, default=DEFAULT_BOOT, help="the boot binary (default: target/release/boot)")
    p.add_argument("--baseline", type=Path, help="a second boot binary measured in the same rounds")
    p.add_argument("--backend", default="emu", choices=["emu", "hvf"], help="Ignition backend (default: emu)")
    p.add_argument("--kernel", type=Path, default=paths.KERNEL)
    p.add_argument("--disk", type=Path, default=paths.ROOTFS)
    p.add_argument("--mem", type=int, default=512, help="MiB (default: 512)")
    p.add_argument("--no-qemu", action="store_true", help="skip the QEMU comparison")
    p.add_argument("--floor", action="store_true", help="also measure the unicorn floor (see above)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "cpu.json")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    for b in (args.boot, args.baseline):
        if b is not None and not b.is_file():
            print(f"cpu_bench: {b} not found: cargo build --release --bin boot", file=sys.stderr)
            return 1
    err = qemu.check_inputs(args.kernel, args.disk)
    if err and not (args.no_qemu and err.startswith(qemu.QEMU)):
        print(f"cpu_bench: {err}", file=sys.stderr)
        return 1
    if args.floor and (args.no_qemu or not FLOOR_BIN.is_file()):
        print(
            f"cpu_bench: --floor needs QEMU and {FLOOR_BIN}: cargo build --release -p ignition-vmm "
            "--no-default-features --features emu --example unicorn_floor",
            file=sys.stderr,
        )
        return 1
    work = SHORT if args.short else FULL
    stages = work.stages()
    logs = RESULTS_DIR / "logs" / "cpu"
    logs.mkdir(parents=True, exist_ok=True)

    times: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    seen: dict[str, str] = {}
    with ExitStack() as stack:
        vms: dict[str, tuple[Run, int]] = {}
        boots = [("ignition", args.boot)] + ([("baseline", args.baseline)] if args.baseline else [])
        for name, boot in boots:
            disk = stack.enter_context(disk_copy(args.disk))
            cfg = VmConfig(boot=boot, backend=args.backend, kernel=args.kernel)
            vm = stack.enter_context(Vm.boot(cfg, disk=disk, mem=args.mem, log_path=logs / f"{name}.log"))
            vm.login()
            vms[name] = vm_runner(vm), vm.pid
        if not args.no_qemu:
            disk = stack.enter_context(disk_copy(args.disk))
            child = console.spawn(qemu.qemu_argv(args.kernel, disk, mem_mib=args.mem), log_path=logs / "qemu.log")
            stack.callback(console.terminate, child)
            console.login(child, timeouts.for_backend("qemu").boot)
            assert child.pid is not None, "spawned"
            vms["qemu_tcg"] = (lambda c, t: console.run(child, c, t)), child.pid
        for name, (run, _) in vms.items():
            size = run(work.prepare(), 300)
            check("gzip_input", work, size, seen)
            times[name] = {s: [] for s in stages}
            cpu[name] = {s: [] for s in stages}
        for r in range(args.runs + 1):
            label = "warm-up" if r == 0 else f"round {r}/{args.runs}"
            for stage, cmd in stages.items():
                line = []
                for name, (run, pid) in vms.items():
                    c0 = cpu_s_of(pid)
                    secs, out = timed(run, cmd)
                    used = cpu_s_of(pid) - c0
                    check(stage, work, out, seen)
                    if r > 0:
                        times[name][stage].append(secs)
                        cpu[name][stage].append(used)
                    line.append(f"{name} {secs:.2f} s (CPU {used:.2f} s)")
                print(f"{label}: {stage}: " + ", ".join(line), flush=True)

    result: dict[str, Any] = {
        "benchmark": "guest_cpu_work",
        "stages": stages,
        "config": {
            "runs": args.runs,
            "short": args.short,
            "mem_mib": args.mem,
            "cpus": 1,
            "boot": str(args.boot),
            "baseline": str(args.baseline) if args.baseline else None,
            "kernel_sha256": sha256(args.kernel),
            "disk_sha256": sha256(args.disk),
        },
        "host": host.summary(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.no_qemu:
        result["config"]["qemu"] = subprocess.run(
            [qemu.QEMU, "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
    lines = []
    keys = [*stages, "total"]
    result["cpu"] = {}
    for name in times:
        dest: dict[str, Any]
        for dest, samples, unit in ((result, times[name], "s"), (result["cpu"], cpu[name], "s CPU")):
            totals = [sum(v) for v in zip(*samples.values())]
            dest[name] = {**{s: summarize(v) for s, v in samples.items()}, "total": summarize(totals)}
            med = {s: dest[name][s]["median_s"] for s in keys}
            lines.append(f"{name}: " + ", ".join(f"{s} {v:.2f} {unit}" for s, v in med.items()))
    if "qemu_tcg" in result:
        for dest, label in ((result, "wall"), (result["cpu"], "CPU")):
            q = dest["qemu_tcg"]
            dest["ratio_to_qemu"] = {
                name: {s: round(dest[name][s]["median_s"] / q[s]["median_s"], 3) for s in keys}
                for name in times
                if name != "qemu_tcg"
            }
            for name, ratios in dest["ratio_to_qemu"].items():
                lines.append(f"{name}/qemu ({label}): " + ", ".join(f"{s} {v:.2f}x" for s, v in ratios.items()))
    if args.floor:
        with tempfile.TemporaryDirectory(prefix="ignition-floor-") as tmp:
            fl = floor(250_000 if args.short else 1_000_000, args.runs, Path(tmp))
        result["floor"] = fl
        n = fl["ns_per_iteration"]
        lines.append(
            "floor (ns per loop iteration): "
            + ", ".join(f"{m} {n[m]['median']:.2f}" for m in n)
            + "; /qemu: "
            + ", ".join(f"{m} {v:.2f}x" for m, v in fl["ratio_to_qemu"].items())
        )
    write_report(args.out, result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
